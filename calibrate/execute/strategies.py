"""The parallel strategies the executor runs, each one training step on one rank, written with
``torch.distributed`` so the same code runs on gloo CPU ranks and NCCL GPUs.

- `Single`: one rank.
- `DDP`: ``DistributedDataParallel`` (``bucket_cap_mb``; comm hooks fp16 / bf16 / PowerSGD).
- `DPGpu0`: what ``nn.DataParallel`` does, written out: rank 0 loads the whole batch and scatters shards,
  broadcasts its parameters, gathers the outputs and computes the loss, scatters the output gradients back,
  receives the gradients reduced onto it and alone steps the optimizer. With ``cpu_batch_split`` each rank
  loads its own shard (ScaleDNN's CPU-centric batch splitting); the rest is unchanged.
- `ParameterServer`: each rank computes on its own shard; gradients are reduced onto rank 0 where a
  host-side (CPU) optimizer owns the master parameters; the updated parameters are broadcast back.
- `Easgd`: each rank steps on its own shard; every ``tau`` steps it meets the centre (You et al. SC17):
  ``sync`` all-reduces the flat weights (every rank keeps the centre), ``original`` serves the ranks
  round-robin in rank order from a centre hosted on rank 0's host memory, with send/recv of one flat buffer.
- ``pipeline``: in `exec_pipeline` (stages exchanging activations and gradients with isend/irecv);
  ``spatial``: in `exec_spatial` (rows of every sample split over the ranks, halo exchange).

Every strategy times its phases on a `Clock`: ``forward``, ``backward``, ``comm`` (explicit collectives)
and ``optimizer``; DDP's all-reduce overlaps backward inside DDP and is counted in ``backward``.

It stays one module: the data-parallel strategies share their base class's flat parameters and
clock.
"""

from __future__ import annotations

import contextlib
import time

import torch
import torch.distributed as dist
from torch import nn

from trainsim.calibrate import zoo
from trainsim.calibrate.execute.config import ExecConfig
from trainsim.calibrate.execute.offload import PrefetchOffload, offload_context
from trainsim.calibrate.launch import RankContext


class Clock:
    """Phase times of one iteration: host timers on the CPU, CUDA events on the compute stream on GPUs."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.marks: list[tuple[str, object]] = []

    def _now(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def start(self) -> None:
        self.marks = [("", self._now())]

    def lap(self, phase: str) -> None:
        """The time since the previous mark belongs to ``phase``."""
        self.marks.append((phase, self._now()))

    def phases(self) -> dict[str, float]:
        """Seconds per phase (call after the iteration is synchronised)."""
        out: dict[str, float] = {}
        for (_, a), (phase, b) in zip(self.marks, self.marks[1:], strict=False):
            dt = a.elapsed_time(b) / 1e3 if self.cuda else b - a
            out[phase] = out.get(phase, 0.0) + dt
        return out


class FlatParams:
    """The parameters of a model as one flat buffer (one message instead of one per layer)."""

    def __init__(self, params: list[nn.Parameter]):
        self.params = params
        self.numel = sum(p.numel() for p in params)

    def new_buffer(self, device) -> torch.Tensor:
        return torch.empty(self.numel, dtype=self.params[0].dtype, device=device)

    def read_params(self, out: torch.Tensor) -> torch.Tensor:
        torch.cat([p.detach().reshape(-1) for p in self.params], out=out)
        return out

    def write_params(self, flat: torch.Tensor) -> None:
        offset = 0
        with torch.no_grad():
            for p in self.params:
                p.copy_(flat[offset:offset + p.numel()].view_as(p))
                offset += p.numel()

    def read_grads(self, out: torch.Tensor) -> torch.Tensor:
        grads = [p.grad.reshape(-1) if p.grad is not None else torch.zeros(p.numel(), device=p.device)
                 for p in self.params]
        torch.cat(grads, out=out)
        return out

    def write_grads(self, flat: torch.Tensor) -> None:
        offset = 0
        for p in self.params:
            chunk = flat[offset:offset + p.numel()].view_as(p)
            if p.grad is None:
                p.grad = chunk.clone()
            else:
                p.grad.copy_(chunk)
            offset += p.numel()


def make_optimizer(name: str, params, lr: float, *, offload: bool = False, device=None,
                   chunk_bytes: float = 64 * 2**20):
    """sgd, momentum (0.9) or adam; ``offload``: its state in host memory, streamed through ``device`` in
    chunks of ``chunk_bytes`` at every step (StreamedOptimizer)."""

    def build(ps):
        if name == "adam":
            return torch.optim.Adam(ps, lr=lr)
        return torch.optim.SGD(ps, lr=lr, momentum=0.9 if name == "momentum" else 0.0)

    if offload:
        from trainsim.calibrate.execute.offload_optimizer import StreamedOptimizer

        return StreamedOptimizer(build, name, params, device, chunk_bytes)
    return build(params)


class Precision:
    """Autocast for fp16/bf16 (fp16 with a GradScaler); fp32 does nothing."""

    def __init__(self, precision: str, device: torch.device):
        self.dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(precision)
        self.device_type = device.type
        self.scaler = torch.amp.GradScaler(device.type) if precision == "fp16" else None

    def autocast(self):
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler else loss).backward()

    def step(self, optimizer) -> None:
        if self.scaler:
            self.scaler.step(optimizer)
            self.scaler.update()
        else:
            optimizer.step()


class Strategy:
    """One rank's part of a training step. ``loads(rank)`` says which global-batch positions it loads."""

    name = "single"

    def __init__(self, ctx: RankContext, cfg: ExecConfig, model: nn.Module, device: torch.device):
        self.ctx, self.cfg, self.model, self.device = ctx, cfg, model, device
        self.rank, self.world = ctx.rank, ctx.world_size
        self.precision = Precision(cfg.precision, device)
        self.offload_mode = cfg.optimizations.offload_activations
        self.offloader = (PrefetchOffload(model, device, cfg.optimizations.prefetch_distance)
                          if self.offload_mode == "prefetch" else None)
        self.notes: list[str] = []
        self.extra: dict = {}

    def new_optimizer(self, params):
        """The configured optimizer; with offload_optimizer_state, its state lives in host memory."""
        offload = self.cfg.optimizations.offload_optimizer_state
        chunk_mb = self.cfg.optimizations.offload_chunk_mb
        if offload and "optimizer state in host memory" not in " ".join(self.notes):
            self.notes.append(f"optimizer state in host memory, streamed through the device in "
                              f"{chunk_mb:g} MiB chunks at every step")
        return make_optimizer(self.cfg.optimizer, params, self.cfg.lr, offload=offload, device=self.device,
                              chunk_bytes=chunk_mb * 2**20)

    # which samples this rank loads (global positions in the batch), or None: nothing
    def positions(self) -> range | None:
        b = self.cfg.local_batch
        return range(self.rank * b, (self.rank + 1) * b)

    def host_batch(self, source, it: int, pin: bool):
        """This rank's batch of iteration ``it`` in host memory (None: it loads nothing)."""
        positions = self.positions()
        if positions is None:
            return None
        return source.batch(it, positions, self.cfg.batch_size, pin=pin)

    def loss(self, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return zoo.loss_fn(self.cfg.model, output.float(), targets)

    def forward_backward(self, net: nn.Module, inputs, targets, clock: Clock) -> torch.Tensor:
        """Forward (with the offload hooks), loss, backward on this rank's shard; returns the loss."""
        if self.offloader is not None:
            self.offloader.reset()
        with offload_context(self.offload_mode, self.offloader, self.device):
            with self.precision.autocast():
                output = net(inputs)
            loss = self.loss(output, targets)
            clock.lap("forward")
            if self.offloader is not None:
                self.offloader.start_backward()
            self.precision.backward(loss)
        clock.lap("backward")
        return loss.detach()

    def step(self, batch, clock: Clock) -> torch.Tensor:
        raise NotImplementedError

    def final_params(self) -> torch.Tensor:
        return torch.cat([p.detach().reshape(-1).float().cpu() for p in self.model.parameters()])

    def broadcast_initial(self) -> None:
        """Every rank starts from rank 0's parameters."""
        if self.world > 1:
            flat = FlatParams(list(self.model.parameters()))
            buf = flat.read_params(flat.new_buffer(self.device))
            dist.broadcast(buf, 0)
            flat.write_params(buf)


class Single(Strategy):
    name = "single"

    def __init__(self, *a):
        super().__init__(*a)
        self.optimizer = self.new_optimizer(self.model.parameters())

    def step(self, batch, clock: Clock) -> torch.Tensor:
        inputs, targets = batch
        loss = self.forward_backward(self.model, inputs, targets, clock)
        self.precision.step(self.optimizer)
        self.optimizer.zero_grad(set_to_none=True)
        clock.lap("optimizer")
        return loss


class DDP(Single):
    name = "ddp"

    def __init__(self, ctx, cfg, model, device):
        from torch.nn.parallel import DistributedDataParallel

        Strategy.__init__(self, ctx, cfg, model, device)
        ids = [device.index] if device.type == "cuda" else None
        self.net = DistributedDataParallel(model, device_ids=ids, bucket_cap_mb=cfg.bucket_cap_mb)
        self._hook(cfg)
        self.optimizer = self.new_optimizer(self.net.parameters())

    def _hook(self, cfg: ExecConfig) -> None:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

        kind = cfg.optimizations.param_compression
        if kind == "fp16":
            self.net.register_comm_hook(None, default_hooks.fp16_compress_hook)
        elif kind == "bf16":
            self.net.register_comm_hook(None, default_hooks.bf16_compress_hook)
        elif kind == "powersgd":
            state = powerSGD_hook.PowerSGDState(
                process_group=None, matrix_approximation_rank=cfg.optimizations.powersgd_rank,
                start_powerSGD_iter=2, min_compression_rate=1.0, use_error_feedback=True, warm_start=True)
            self.net.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
            self.notes.append("PowerSGD compresses from the 3rd iteration on (the first 2 are warm-up)")

    def step(self, batch, clock: Clock) -> torch.Tensor:
        inputs, targets = batch
        loss = self.forward_backward(self.net, inputs, targets, clock)
        self.precision.step(self.optimizer)
        self.optimizer.zero_grad(set_to_none=True)
        clock.lap("optimizer")
        return loss


class DPGpu0(Strategy):
    name = "dp-gpu0"

    def __init__(self, *a):
        super().__init__(*a)
        self.flat = FlatParams(list(self.model.parameters()))
        self.pbuf = self.flat.new_buffer(self.device)
        self.gbuf = self.flat.new_buffer(self.device)
        self.split = self.cfg.optimizations.cpu_batch_split
        self.optimizer = self.new_optimizer(self.model.parameters()) if self.rank == 0 else None

    def positions(self) -> range | None:
        if self.split:
            return super().positions()
        return range(self.cfg.batch_size) if self.rank == 0 else None

    def _scatter(self, full: torch.Tensor | None, like_shape, dtype) -> torch.Tensor:
        out = torch.empty(like_shape, dtype=dtype, device=self.device)
        chunks = [c.contiguous() for c in full.chunk(self.world)] if self.rank == 0 else None
        dist.scatter(out, chunks, src=0)
        return out

    def _gather(self, local: torch.Tensor) -> torch.Tensor | None:
        parts = [torch.empty_like(local) for _ in range(self.world)] if self.rank == 0 else None
        dist.gather(local.contiguous(), parts, dst=0)
        return torch.cat(parts) if self.rank == 0 else None

    def step(self, batch, clock: Clock) -> torch.Tensor:
        cfg, b = self.cfg, self.cfg.local_batch
        # rank 0 broadcasts its parameters (DataParallel's replicate)
        if self.rank == 0:
            self.flat.read_params(self.pbuf)
        dist.broadcast(self.pbuf, 0)
        if self.rank != 0:
            self.flat.write_params(self.pbuf)
        if self.split:  # every rank has its own shard; rank 0 still needs every target for the loss
            inputs, local_targets = batch
            targets = self._gather(local_targets)
        else:
            full_inputs, targets = batch if self.rank == 0 else (None, None)
            shape = [b, *zoo.input_shape(cfg.model, **cfg.model_cfg)]
            dtype = full_inputs.dtype if self.rank == 0 else _input_dtype(cfg)
            inputs = self._scatter(full_inputs, shape, dtype)
        clock.lap("comm")
        if self.offloader is not None:
            self.offloader.reset()
        with offload_context(self.offload_mode, self.offloader, self.device):
            with self.precision.autocast():
                output = self.model(inputs)
            clock.lap("forward")
            # outputs gathered to rank 0, which computes the loss of the whole batch
            gathered = self._gather(output.detach())
            if self.rank == 0:
                full_out = gathered.requires_grad_()
                loss = self.loss(full_out, targets)
                loss.backward()
                grad_out = full_out.grad
                loss = loss.detach()
            else:
                grad_out, loss = None, torch.zeros(())
            out_grad = self._scatter(grad_out, output.shape, output.dtype)
            clock.lap("comm")
            if self.offloader is not None:
                self.offloader.start_backward()
            output.backward(out_grad)
        clock.lap("backward")
        # gradients summed onto rank 0 (the loss already averaged over the whole batch)
        self.flat.read_grads(self.gbuf)
        dist.reduce(self.gbuf, dst=0)
        clock.lap("comm")
        if self.rank == 0:
            self.flat.write_grads(self.gbuf)
            self.precision.step(self.optimizer)
            self.optimizer.zero_grad(set_to_none=True)
        else:
            self.model.zero_grad(set_to_none=True)
        clock.lap("optimizer")
        return loss


def _input_dtype(cfg: ExecConfig) -> torch.dtype:
    return torch.long if zoo.model_spec(cfg.model).kind == "tokens" else torch.float32


class ParameterServer(Strategy):
    name = "parameter-server"

    def __init__(self, *a):
        super().__init__(*a)
        self.flat = FlatParams(list(self.model.parameters()))
        self.gbuf = self.flat.new_buffer(self.device)
        self.pbuf = self.flat.new_buffer(self.device)
        if self.rank == 0:  # the server: master parameters and optimizer state in host memory
            self.master = self.flat.read_params(self.flat.new_buffer("cpu")).clone().requires_grad_()
            self.optimizer = make_optimizer(self.cfg.optimizer, [self.master], self.cfg.lr)

    def step(self, batch, clock: Clock) -> torch.Tensor:
        inputs, targets = batch
        loss = self.forward_backward(self.model, inputs, targets, clock)
        self.flat.read_grads(self.gbuf)
        dist.reduce(self.gbuf, dst=0)
        clock.lap("comm")
        if self.rank == 0:
            self.master.grad = self.gbuf.to("cpu", copy=True).div_(self.world)
            self.optimizer.step()
            self.pbuf.copy_(self.master.detach())
        self.model.zero_grad(set_to_none=True)
        clock.lap("optimizer")
        dist.broadcast(self.pbuf, 0)
        self.flat.write_params(self.pbuf)
        clock.lap("comm")
        return loss


class Easgd(Single):
    name = "easgd"

    def __init__(self, *a):
        super().__init__(*a)
        self.flat = FlatParams(list(self.model.parameters()))
        self.w = self.flat.new_buffer(self.device)
        self.alpha = self.cfg.easgd_alpha
        self.variant = self.cfg.easgd.variant
        self.steps = 0
        self.exchanges = 0
        self.centre = None  # set by broadcast_initial

    def broadcast_initial(self) -> None:
        super().broadcast_initial()
        start = self.flat.read_params(self.flat.new_buffer(self.device))
        if self.variant == "sync":
            self.centre = start.clone()
        elif self.rank == 0:  # original: the centre lives in rank 0's host memory (or on its device)
            self.centre = start.to("cpu" if self.cfg.easgd.where == "host" else self.device, copy=True)

    def step(self, batch, clock: Clock) -> torch.Tensor:
        loss = super().step(batch, clock)  # the local SGD step on this rank's shard
        self.steps += 1
        if self.steps % self.cfg.easgd.tau == 0:
            self.flat.read_params(self.w)
            capture = self.cfg.capture_params
            before = self.w.clone() if capture else None
            centre_before = self.centre.clone() if capture and self.centre is not None else None
            if self.variant == "sync":
                self._sync()
            else:
                self._original()
            self.flat.write_params(self.w)
            self.exchanges += 1
            clock.lap("comm")
            if self.cfg.capture_params:
                self.extra["last_exchange"] = {
                    "w_before": before.float().cpu().numpy(), "w_after": self.w.float().cpu().numpy(),
                    "centre_before": None if centre_before is None else centre_before.float().cpu().numpy(),
                    "centre_after": None if self.centre is None else self.centre.float().cpu().numpy()}
        return loss

    def _sync(self) -> None:
        """All ranks: S = sum_i W_i (all-reduce); W_i -= a (W_i - C); C += a (S - P C)."""
        total = self.w.clone()
        dist.all_reduce(total)
        diff = self.w - self.centre
        self.w.sub_(diff, alpha=self.alpha)
        self.centre.add_(total - self.world * self.centre, alpha=self.alpha)

    def _original(self) -> None:
        """Round-robin in rank order: worker i sends W_i to rank 0, gets the centre back, and both move."""
        if self.rank == 0:
            buf = torch.empty_like(self.w)
            for worker in range(self.world):
                home = self.centre.device
                if worker == 0:
                    w_host = self.w.to(home, copy=True)  # a copy: rank 0's own W moves below
                else:
                    dist.recv(buf, src=worker)
                    w_host = buf.to(home, copy=True)
                old = self.centre.clone()
                if worker == 0:
                    self.w.sub_(self.w - old.to(self.device), alpha=self.alpha)
                else:
                    dist.send(old.to(self.device), dst=worker)
                self.centre.add_(w_host - old, alpha=self.alpha)
        else:
            dist.send(self.w, dst=0)
            centre = torch.empty_like(self.w)
            dist.recv(centre, src=0)
            self.w.sub_(self.w - centre, alpha=self.alpha)


STRATEGIES: dict[str, type[Strategy]] = {
    "single": Single, "ddp": DDP, "dp-gpu0": DPGpu0, "parameter-server": ParameterServer, "easgd": Easgd}
