"""Strategy ``mesh`` executed for real: the zoo's Llama on a DeviceMesh of data x context x tensor parallel
ranks (tensor parallelism innermost, as the simulator's `Mesh` lays the GPUs out), with PyTorch's own
parallel APIs, on gloo CPU ranks and NCCL GPUs alike:

- tensor parallelism (``tp``): DTensor's ``parallelize_module``, Megatron's plan: the fused ``qkv_proj`` and
  ``gate_up_proj`` column-parallel (their features laid out so that a contiguous split keeps whole key/value
  groups and gate/up pairs, `zoo.LlamaAttention`, `zoo.SwiGLU`), ``o_proj`` and ``down_proj`` row-parallel,
  the embedding row-parallel over the vocabulary, the LM head column-parallel over the vocabulary with the
  cross-entropy computed on the vocabulary shards (DTensor's ``loss_parallel``, Megatron's vocabulary-parallel
  cross-entropy: only per-token statistics cross the group, not the logits);
- sequence parallelism (``sequence_parallel``): the norms ``SequenceParallel`` (split by tokens), the
  residual stream sharded by tokens, all-gathered into each column-parallel linear and reduce-scattered out
  of each row-parallel one, instead of the all-reduce;
- FSDP (``zero: 3``): FSDP2's ``fully_shard`` over the data-parallel ranks (and the context-parallel ones,
  whose gradients are averaged with them), one unit per simulator block: the embedding, every transformer
  block, the final norm with the LM head, then the root; ``reshard_after_forward`` as FSDP2 takes it;
- context parallelism (``cp``, CUDA only): ``context_parallel`` shards the tokens, targets and RoPE tables
  by sequence (load-balanced for the causal mask) and runs SDPA as ring attention; PyTorch has no rule for
  the CPU flash kernel, so CPU ranks skip it (`config.mesh_infeasible`);
- recomputation (``recompute``): ``checkpoint_wrapper`` (non-reentrant) on every block (``full``: a block
  keeps its input and runs its forward again in backward) or on every attention core (``selective``);
- micro-batches: ``batch / (dp x micro_batch)`` per iteration, gradients accumulated, synchronised by FSDP
  at the last one only (as the simulator has it).

The ranks of one tensor/context-parallel group load the same samples (their data-parallel replica's share).
Phases on the clock: ``forward``, ``backward`` (with FSDP's overlapped collectives), ``optimizer``.

Peak memory on CPU ranks (`AllocatorPeak`): the bytes of the rank's persistent tensors at the start of one
iteration (its parameters as held, shards under FSDP, and optimizer state; gradients are freed between
iterations) plus the peak of the bytes torch's CPU allocator handed out during that iteration and had not
freed (the running sum of torch.profiler's memory events: activations, gathered parameters, gradients,
communication buffers, temporaries). The iteration measured is the last warm-up one (profiling costs time).
Memory freed during it that was allocated before it (the previous batch) is not subtracted, so it can read a
little high; memory outside torch's allocator (gloo's own buffers, the interpreter) is not counted.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile

import torch

from trainsim.calibrate.execute.strategies import Clock, Strategy
from trainsim.calibrate.zoo import Rotary, SdpaCore


def _storages(tensors) -> int:
    """Bytes of the distinct storages behind ``tensors`` (a DTensor counts its local shard)."""
    seen, total = set(), 0
    for t in tensors:
        if t is None:
            continue
        local = t.to_local() if hasattr(t, "to_local") else t
        storage = local.untyped_storage()
        key = storage.data_ptr()
        if key in seen or storage.nbytes() == 0:
            continue
        seen.add(key)
        total += storage.nbytes()
    return total


def persistent_bytes(model, optimizer) -> int:
    """Parameters as this rank holds them, their gradients where present, and the optimizer's state."""
    params = list(model.parameters())
    state = [v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    return _storages(params + [p.grad for p in params] + state)


class AllocatorPeak:
    """The peak of a CPU rank's torch allocations over one iteration (see the module docstring): start()
    before it, stop(persistent) after; ``peak`` is then persistent + the in-iteration peak."""

    def __init__(self):
        self.profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                               profile_memory=True, record_shapes=False)
        self.peak: int | None = None

    def start(self) -> None:
        self.profiler.start()

    def stop(self, persistent: int, trace_path: str | None = None) -> None:
        self.profiler.stop()
        fd, path = tempfile.mkstemp(suffix=".json")
        os.close(fd)
        try:
            self.profiler.export_chrome_trace(path)
            with open(path) as fh:
                events = json.load(fh)["traceEvents"]
            if trace_path:  # the same profile is the variant's torch trace
                os.replace(path, trace_path)
        finally:
            if os.path.exists(path):
                os.remove(path)
        # the running sum of the iteration's allocations and frees (the allocator's own Total Allocated also
        # keeps memory allocated in an earlier profile and freed outside it, so it is no baseline)
        deltas = sorted((e["ts"], e["args"].get("Bytes", 0)) for e in events if e.get("name") == "[memory]")
        live = peak = 0
        for _, nbytes in deltas:
            live += nbytes
            peak = max(peak, live)
        self.peak = persistent + int(peak)


class Mesh(Strategy):
    """One rank of strategy mesh (see the module docstring)."""

    name = "mesh"

    def __init__(self, ctx, cfg, model, device):
        from torch.distributed.device_mesh import init_device_mesh

        super().__init__(ctx, cfg, model, device)
        m = cfg.mesh
        self.tp, self.cp, self.dp = m.tp, m.cp, m.dp(ctx.world_size)
        self.mesh = init_device_mesh(device.type, (self.dp, self.cp, self.tp),
                                     mesh_dim_names=("dp", "cp", "tp"))
        self.dp_rank = self.mesh.get_local_rank("dp")
        self.micro_batches = cfg.local_batch // m.micro_batch
        if self.tp > 1:
            self._tensor_parallel(m.sequence_parallel)
        if m.recompute != "none":  # after TP and before FSDP, as torchtitan orders them
            self._recompute(m.recompute)
        self.fsdp = m.zero == 3
        if self.fsdp:
            self._fully_shard(m.reshard_after_forward)
        if self.cp > 1:
            for core in model.modules():  # CP's ring shards the plain flash/efficient kernels
                if isinstance(core, SdpaCore):
                    core.repeat_kv = True
        self.optimizer = self.new_optimizer(model.parameters())
        self.notes.append(self._describe())
        # parameters this rank holds at rest (its shards): the proof that the model is sharded
        self.extra["local_params"] = sum((p.to_local() if hasattr(p, "to_local") else p).numel()
                                         for p in model.parameters())

    def _describe(self) -> str:
        m = self.cfg.mesh
        parts = [f"dp {self.dp} x cp {self.cp} x tp {self.tp}"]
        if self.tp > 1:
            parts.append("TP with sequence parallelism" if m.sequence_parallel else "TP (all-reduce)")
        if self.fsdp:
            parts.append(f"FSDP2 fully_shard per block (reshard_after_forward {m.reshard_after_forward})")
        if self.cp > 1:
            parts.append("context_parallel (ring attention)")
        if m.recompute != "none":
            parts.append(f"recompute {m.recompute} (checkpoint_wrapper)")
        if self.micro_batches > 1:
            parts.append(f"{self.micro_batches} micro-batches of {m.micro_batch}")
        return "mesh: " + ", ".join(parts)

    # ---- sharding ---------------------------------------------------------------------------------------
    def _tensor_parallel(self, sp: bool) -> None:
        from torch.distributed.tensor import Replicate, Shard
        from torch.distributed.tensor.parallel import (
            ColwiseParallel,
            RowwiseParallel,
            SequenceParallel,
            parallelize_module,
        )

        tp_mesh = self.mesh["tp"]
        seq = Shard(1) if sp else Replicate()  # the residual stream: split by tokens, or whole
        plan = {
            "model.embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=seq),
            "lm_head": ColwiseParallel(input_layouts=seq, output_layouts=Shard(-1), use_local_output=False),
        }
        if sp:
            plan["model.norm"] = SequenceParallel()
        for i in range(len(self.model.model.layers)):
            p = f"model.layers.{i}"
            plan.update({
                f"{p}.self_attn.qkv_proj": ColwiseParallel(input_layouts=seq),
                f"{p}.self_attn.o_proj": RowwiseParallel(output_layouts=seq),
                f"{p}.mlp.gate_up_proj": ColwiseParallel(input_layouts=seq),
                f"{p}.mlp.down_proj": RowwiseParallel(output_layouts=seq),
            })
            if sp:
                plan[f"{p}.input_layernorm"] = SequenceParallel()
                plan[f"{p}.post_attention_layernorm"] = SequenceParallel()
        parallelize_module(self.model, tp_mesh, plan)

    def _recompute(self, mode: str) -> None:
        """Activation checkpointing (non-reentrant): ``full`` wraps every block (it keeps its input and runs
        its forward again in backward), ``selective`` every attention core."""
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

        for i, block in enumerate(self.model.model.layers):
            if mode == "full":
                self.model.model.layers[i] = checkpoint_wrapper(block)
            else:
                block.self_attn.core = checkpoint_wrapper(block.self_attn.core)

    def _fully_shard(self, reshard: bool) -> None:
        from torch.distributed.fsdp import fully_shard

        shard_mesh = self.mesh["dp", "cp"]._flatten("dp_cp") if self.cp > 1 else self.mesh["dp"]
        body = self.model.model
        fully_shard(body.embed_tokens, mesh=shard_mesh, reshard_after_forward=reshard)
        for block in body.layers:
            fully_shard(block, mesh=shard_mesh, reshard_after_forward=reshard)
        fully_shard([body.norm, self.model.lm_head], mesh=shard_mesh, reshard_after_forward=reshard)
        fully_shard(self.model, mesh=shard_mesh, reshard_after_forward=reshard)

    # ---- the step ---------------------------------------------------------------------------------------
    def broadcast_initial(self) -> None:
        """Nothing to send: every rank built the same model from the same seed before sharding it."""

    def positions(self) -> range:
        b = self.cfg.local_batch
        return range(self.dp_rank * b, (self.dp_rank + 1) * b)

    def _context(self, inputs, targets):
        if self.cp == 1:
            return contextlib.nullcontext()
        from torch.distributed.tensor.experimental import context_parallel

        rotaries = [m for m in self.model.modules() if isinstance(m, Rotary)]
        tables = [t for rotary in rotaries for t in (rotary.cos, rotary.sin)]
        return context_parallel(self.mesh["cp"], buffers=[inputs, targets, *tables],
                                buffer_seq_dims=[1, 1] + [0] * len(tables),
                                no_restore_buffers={inputs, targets})

    def _loss_parallel(self):
        """The cross-entropy on the head's vocabulary shards (tensor parallelism), forward and backward."""
        if self.tp == 1:
            return contextlib.nullcontext()
        from torch.distributed.tensor.parallel import loss_parallel

        return loss_parallel()

    def loss(self, output, targets):
        if self.tp == 1:
            return super().loss(output, targets)
        return torch.nn.functional.cross_entropy(output.flatten(0, 1).float(), targets.reshape(-1))

    def step(self, batch, clock: Clock) -> torch.Tensor:
        inputs, targets = batch
        size = self.cfg.mesh.micro_batch
        total = torch.zeros((), device=self.device)
        for k in range(self.micro_batches):
            x, y = inputs[k * size:(k + 1) * size], targets[k * size:(k + 1) * size]
            if self.fsdp:  # FSDP reduce-scatters the gradients after the last micro-batch only
                self.model.set_requires_gradient_sync(k == self.micro_batches - 1)
            if self.cp > 1:
                x, y = x.clone(), y.clone()  # context_parallel resizes its buffers in place: not views
            with self._context(x, y), self._loss_parallel():
                with self.precision.autocast():
                    output = self.model(x)
                loss = self.loss(output, y) / self.micro_batches
                clock.lap("forward")
                self.precision.backward(loss)
                clock.lap("backward")
            value = loss.detach()
            total += value.full_tensor() if hasattr(value, "full_tensor") else value  # a replicated DTensor
        self.precision.step(self.optimizer)
        self.optimizer.zero_grad(set_to_none=True)
        clock.lap("optimizer")
        return total

    def final_params(self) -> torch.Tensor:
        """The whole model's parameters (DTensors gathered), flat, in the module's order."""
        flat = []
        for p in self.model.parameters():
            full = p.full_tensor() if hasattr(p, "full_tensor") else p
            flat.append(full.detach().reshape(-1).float().cpu())
        return torch.cat(flat)


def allocator_peak_wanted(cfg, cuda: bool) -> bool:
    """The CPU peak-memory measure (`AllocatorPeak`) is taken for strategy mesh on CPU ranks with warm-up."""
    return cfg.strategy == "mesh" and not cuda and cfg.warmup > 0
