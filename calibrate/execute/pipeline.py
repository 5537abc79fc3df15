"""Pipeline parallelism for the executor with point-to-point ``isend``/``irecv`` (Myelin/AxoNN,
docs/techniques.md, section 4).

The model is cut into ``stages`` consecutive stages (ranks ``r`` with ``r % stages == s`` hold stage s;
``ranks / stages`` replicas of the pipeline do data parallelism, each stage all-reducing its gradients with
its peers after the flush). Each iteration splits the replica's batch into ``micro_batches``; activations go
forward and their gradients backward as messages between neighbouring stages. Schedules:

- ``gpipe``: every forward, then every backward (in reverse), each receive blocking;
- ``1f1b``: the static one-forward-one-backward order (stage s runs ``stages - s - 1`` forwards first);
- ``message-driven``: each stage keeps receives posted for the next forward and the next backward message
  and runs whichever arrives first (backward first when both are there), never more than ``stages - s``
  micro-batches in flight. gloo's receive handles never report completion before ``wait()``, so a helper
  thread waits on each posted receive and signals a condition variable; on NCCL the handle is polled.

Every micro-batch's loss is divided by ``micro_batches`` so that the accumulated gradient is the gradient of
the replica's whole batch, as with one rank: the tests check the parameters against a single-rank step.

The cut: the model's sequence of parts (`sequential_parts`: leaf layers, or whole blocks where a block has a
residual connection) is split where the scenario's ``stage_layers`` (leaf layers per stage, the simulator's
granularity) say, rounded to part boundaries, or else balanced by forward time measured on rank 0.
"""

from __future__ import annotations

import threading
import time

import torch
import torch.distributed as dist
from torch import nn

from trainsim.calibrate import zoo
from trainsim.calibrate.execute.strategies import Clock, FlatParams, Strategy
from trainsim.errors import TrainsimError


class Flatten(nn.Module):
    def forward(self, x):
        return torch.flatten(x, 1)


def sequential_parts(model: nn.Module) -> list[nn.Module]:
    """The zoo image model as a list of modules whose composition is its forward."""
    from trainsim.calibrate.zoo import VGG16, AlexNet, GoogLeNet, ResNet, TinyCNN

    if isinstance(model, TinyCNN):
        return [model.conv1, model.relu1, model.pool1, model.conv2, model.relu2, model.pool2, Flatten(),
                model.fc]
    if isinstance(model, AlexNet | VGG16):
        return [*model.features, model.avgpool, Flatten(), *model.classifier]
    if isinstance(model, ResNet):
        blocks = [b for name in ("layer1", "layer2", "layer3", "layer4") for b in getattr(model, name)]
        stem = [model.conv1, model.bn1, model.relu, model.maxpool]
        return [*stem, *blocks, model.avgpool, Flatten(), model.fc]
    if isinstance(model, GoogLeNet):
        names = ["conv1", "maxpool1", "conv2", "conv3", "maxpool2", "inception3a", "inception3b", "maxpool3",
                 "inception4a", "inception4b", "inception4c", "inception4d", "inception4e", "maxpool4",
                 "inception5a", "inception5b", "avgpool"]
        return [*(getattr(model, n) for n in names), Flatten(), model.dropout, model.fc]
    raise TrainsimError(f"the executor cannot cut {type(model).__name__} into pipeline stages", field="model")


def leaf_count(module: nn.Module) -> int:
    return sum(1 for m in module.modules() if not list(m.children()) and not isinstance(m, Flatten))


def balanced_cuts(costs: list[float], stages: int) -> list[int]:
    """Start index of each stage (plus the end) minimising the most expensive stage (dynamic programming)."""
    n = len(costs)
    if stages > n:
        raise TrainsimError(f"{stages} stages but the model has only {n} parts to cut",
                            field="pipeline.stages")
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(stages + 1)]
    cut = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0.0
    for s in range(1, stages + 1):
        for end in range(s, n + 1):
            for start in range(s - 1, end):
                cost = max(best[s - 1][start], prefix[end] - prefix[start])
                if cost < best[s][end]:
                    best[s][end], cut[s][end] = cost, start
    bounds = [n]
    for s in range(stages, 0, -1):
        bounds.append(cut[s][bounds[-1]])
    return bounds[::-1]


def cuts_from_stage_layers(parts: list[nn.Module], stage_layers: list[int]) -> list[int]:
    """Part boundaries nearest to the cumulative leaf-layer counts ``stage_layers`` (each stage >= 1 part)."""
    counts = [leaf_count(p) for p in parts]
    ends = [0]
    for c in counts:
        ends.append(ends[-1] + c)
    bounds, target = [0], 0
    for k in stage_layers[:-1]:
        target += k
        nearest = min(range(bounds[-1] + 1, len(parts)), key=lambda i: abs(ends[i] - target),
                      default=bounds[-1] + 1)
        bounds.append(nearest)
    bounds.append(len(parts))
    if any(b >= e for b, e in zip(bounds, bounds[1:], strict=False)):
        raise TrainsimError(f"cannot cut the model's {len(parts)} parts into {stage_layers} layers per stage",
                            field="pipeline.stage_layers")
    return bounds


class _Incoming:
    """A posted receive whose arrival can be tested without blocking (see the module docstring)."""

    def __init__(self, buf: torch.Tensor, src: int, group, arrived: threading.Condition | None):
        self.buf = buf
        self.work = dist.irecv(buf, src=src, group=group)
        self.done = threading.Event()
        self.cond = arrived
        if arrived is not None:  # gloo: a thread waits, then signals
            threading.Thread(target=self._wait, daemon=True).start()

    def _wait(self) -> None:
        self.work.wait()
        with self.cond:
            self.done.set()
            self.cond.notify_all()

    def ready(self) -> bool:
        if self.cond is not None:
            return self.done.is_set()
        return self.work.is_completed()

    def take(self) -> torch.Tensor:
        if self.cond is None:
            self.work.wait()
        else:
            self.done.wait()
        return self.buf


class Pipeline(Strategy):
    name = "pipeline"

    def __init__(self, ctx, cfg, model, device):
        super().__init__(ctx, cfg, model, device)
        if self.offloader is not None:
            self.offloader.remove()
        if self.offload_mode != "none":
            self.notes.append("activation offload is not applied to pipeline stages")
        self.offload_mode, self.offloader = "none", None
        opts = cfg.pipeline
        self.comm_device = device  # NCCL sends device tensors only
        self.stages = opts.stages or self.world
        self.stage = self.rank % self.stages
        self.replica = self.rank // self.stages
        self.replicas = self.world // self.stages
        self.micro = opts.micro_batches
        self.schedule = opts.schedule
        self.first, self.last = self.stage == 0, self.stage == self.stages - 1
        self.prev = self.rank - 1 if not self.first else None
        self.next = self.rank + 1 if not self.last else None
        parts = sequential_parts(model)  # still on the CPU: only this stage's parts go to the device
        bounds = self._plan(parts, opts.stage_layers)
        self.bounds = bounds
        self.in_shape, self.out_shape = self._shapes(parts, bounds)
        self.module = nn.Sequential(*parts[bounds[self.stage]:bounds[self.stage + 1]]).to(device)
        # forward activations and backward gradients travel in their own groups: on NCCL a group's
        # point-to-point operations share one stream, so a gradient receive posted early would hold up an
        # activation send queued behind it (and the stage waiting for that activation would never answer)
        self.fwd_group = dist.new_group(list(range(self.world)))
        self.bwd_group = dist.new_group(list(range(self.world)))
        self.group = None
        if self.replicas > 1:  # every rank creates every stage's group, in the same order
            for s in range(self.stages):
                group = dist.new_group([r * self.stages + s for r in range(self.replicas)])
                if s == self.stage:
                    self.group = group
        self.params = list(self.module.parameters())
        self.flat = FlatParams(self.params) if self.params else None
        self.optimizer = self.new_optimizer(self.params) if self.params else None
        self.extra["stage_parts"] = [bounds[s + 1] - bounds[s] for s in range(self.stages)]
        self.cuda = device.type == "cuda"

    # ---- set-up

    def _plan(self, parts: list[nn.Module], stage_layers) -> list[int]:
        if stage_layers:
            return cuts_from_stage_layers(parts, list(stage_layers))
        costs = torch.zeros(len(parts), dtype=torch.float64, device=self.comm_device)
        if self.rank == 0:  # forward time per part on one micro-batch (rank 0's CPU), shared with all
            costs = torch.tensor(self._part_times(parts), dtype=torch.float64, device=self.comm_device)
        if self.world > 1:
            dist.broadcast(costs, 0)
        return balanced_cuts(costs.tolist(), self.stages)

    def _example(self) -> torch.Tensor:
        mb = self.cfg.batch_size // self.replicas // self.micro
        x, _ = zoo.example_batch(self.cfg.model, mb, "cpu", **self.cfg.model_cfg)
        return x

    def _part_times(self, parts: list[nn.Module]) -> list[float]:
        x = self._example()
        times = []
        with torch.no_grad():
            for part in parts:
                best = float("inf")
                for _ in range(3):
                    t0 = time.perf_counter()
                    y = part(x)
                    best = min(best, time.perf_counter() - t0)
                times.append(best + 1e-6)
                x = y
        return times

    def _shapes(self, parts, bounds):
        """This stage's input and output shapes (one fp32 forward of the whole model on the CPU). Messages
        between stages are fp32 whatever the compute precision, so their shapes are all the receiver needs."""
        x = self._example()
        shapes = [tuple(x.shape)]
        with torch.no_grad():
            for s in range(self.stages):
                for part in parts[bounds[s]:bounds[s + 1]]:
                    x = part(x)
                shapes.append(tuple(x.shape))
        return shapes[self.stage], shapes[self.stage + 1]

    def broadcast_initial(self) -> None:
        """Every rank built the same model from the same seed; replicas check nothing more."""

    # ---- data: stage 0 loads the inputs, the last stage the targets

    def positions(self) -> range:
        b = self.cfg.batch_size // self.replicas
        return range(self.replica * b, (self.replica + 1) * b)

    def host_batch(self, source, it: int, pin: bool):
        pos = self.positions()
        if self.first:
            inputs, targets = source.batch(it, pos, self.cfg.batch_size, pin=pin)
            return inputs, (targets if self.last else None)
        if self.last:
            return None, source.targets(it, pos, self.cfg.batch_size, pin=pin)
        return None

    # ---- one micro-batch

    def _forward(self, m: int, x: torch.Tensor, clock: Clock) -> None:
        if not self.first:
            x.requires_grad_()
        with self.precision.autocast():
            out = self.module(x)
        if self.last:
            loss = self.loss(out, self.targets[m]) / self.micro
            self.saved[m] = (x, loss)
            self.loss_sum += loss.detach().float()
        else:
            self.saved[m] = (x, out)
            msg = out.detach().float().contiguous()
            self.sends.append((dist.isend(msg, dst=self.next, group=self.fwd_group), msg))
        clock.lap("forward")

    def _backward(self, m: int, grad: torch.Tensor | None, clock: Clock) -> None:
        x, out = self.saved.pop(m)
        if self.last:
            out.backward()
        else:
            out.backward(grad.to(out.dtype))
        if not self.first:
            msg = x.grad.float().contiguous()
            self.sends.append((dist.isend(msg, dst=self.prev, group=self.bwd_group), msg))
        clock.lap("backward")

    def _recv(self, src: int, shape, clock: Clock) -> torch.Tensor:
        buf = torch.empty(shape, device=self.device)
        dist.recv(buf, src=src, group=self.fwd_group if src == self.prev else self.bwd_group)
        clock.lap("comm")
        return buf

    # ---- schedules

    def _gpipe(self, clock: Clock) -> None:
        for m in range(self.micro):
            x = self.inputs[m] if self.first else self._recv(self.prev, self.in_shape, clock)
            self._forward(m, x, clock)
        for m in reversed(range(self.micro)):
            g = None if self.last else self._recv(self.next, self.out_shape, clock)
            self._backward(m, g, clock)

    def _one_f_one_b(self, clock: Clock) -> None:
        warm = min(self.stages - self.stage - 1, self.micro)

        def fwd(m):
            x = self.inputs[m] if self.first else self._recv(self.prev, self.in_shape, clock)
            self._forward(m, x, clock)

        def bwd(m):
            g = None if self.last else self._recv(self.next, self.out_shape, clock)
            self._backward(m, g, clock)

        for m in range(warm):
            fwd(m)
        for i in range(self.micro - warm):
            fwd(warm + i)
            bwd(i)
        for m in range(self.micro - warm, self.micro):
            bwd(m)

    def _message_driven(self, clock: Clock) -> None:
        arrived = None if self.cuda else threading.Condition()
        limit = self.stages - self.stage
        next_f = next_b = 0
        fwd_in = bwd_in = None
        while next_b < self.micro:
            if not self.first and fwd_in is None and next_f < self.micro:
                fwd_in = _Incoming(torch.empty(self.in_shape, device=self.device), self.prev, self.fwd_group,
                                   arrived)
            if not self.last and bwd_in is None and next_b < next_f:
                bwd_in = _Incoming(torch.empty(self.out_shape, device=self.device), self.next, self.bwd_group,
                                   arrived)
            can_fwd = next_f < self.micro and next_f - next_b < limit
            if self.last and next_b < next_f:
                self._backward(next_b, None, clock)
                next_b += 1
            elif bwd_in is not None and bwd_in.ready():
                self._backward(next_b, bwd_in.take(), clock)
                bwd_in, next_b = None, next_b + 1
            elif can_fwd and (self.first or fwd_in.ready()):
                self._forward(next_f, self.inputs[next_f] if self.first else fwd_in.take(), clock)
                fwd_in, next_f = None, next_f + 1
            else:  # nothing to do until a message arrives
                if arrived is not None:
                    waiting = [i for i in (bwd_in, fwd_in if can_fwd else None) if i is not None]
                    with arrived:
                        arrived.wait_for(lambda w=waiting: any(i.ready() for i in w), timeout=1.0)
                else:
                    time.sleep(1e-5)
                clock.lap("comm")

    # ---- one iteration

    def step(self, batch, clock: Clock) -> torch.Tensor:
        inputs, targets = batch if batch is not None else (None, None)
        self.inputs = list(inputs.chunk(self.micro)) if inputs is not None else None
        self.targets = list(targets.chunk(self.micro)) if targets is not None else None
        self.saved, self.sends = {}, []
        self.loss_sum = torch.zeros((), device=self.device)
        {"gpipe": self._gpipe, "1f1b": self._one_f_one_b, "message-driven": self._message_driven}[
            self.schedule](clock)
        for work, _ in self.sends:
            work.wait()
        self.sends = []
        clock.lap("comm")
        if self.group is not None and self.flat is not None:  # data parallelism between replicas
            grads = self.flat.read_grads(self.flat.new_buffer(self.device))
            dist.all_reduce(grads, group=self.group)
            self.flat.write_grads(grads.div_(self.replicas))
            clock.lap("comm")
        if self.optimizer is not None:
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        clock.lap("optimizer")
        return self.loss_sum.detach()

    def final_params(self) -> torch.Tensor:
        """This stage's parameters (the tests put the stages back together in rank order)."""
        if not self.params:
            return torch.zeros(0)
        return torch.cat([p.detach().reshape(-1).float().cpu() for p in self.params])
