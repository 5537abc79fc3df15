"""Spatial parallelism for the executor: every sample's rows split over the ranks, with halo exchange
(Dryden et al., IPDPS 2019; docs/techniques.md, section 3).

Rank r holds rows [r H / P, (r + 1) H / P) of every activation of the model's convolutional front (the
leading convolutions, ReLUs and max-pools of `exec_pipeline.sequential_parts`). Before a convolution or
pooling window reads across its slab's edge, `HaloExchange` brings the rows it needs from the neighbours
with point-to-point send/recv (``k // 2`` rows for a stride-1 ``k x k`` convolution; the row range is
worked out from kernel, stride and padding, so strided layers work too), and fills the rows beyond the
image's edge with the layer's padding (zeros; minus infinity for max-pooling). Its backward sends the
halo rows' gradients back to the ranks that own those rows. The layers run on the padded slab with no
padding along the height.

At the end of the front the slabs are all-gathered (`GatherRows`) and the rest of the model (pooling to a
fixed size, the classifier) runs on the whole activation on every rank; its backward keeps each rank's rows.
The convolution weights' gradients are summed over the ranks (each saw only its rows); the classifier's are
the same on every rank (dropout masks too: every rank draws them from the same seed in the same order).
Every rank loads the whole batch and keeps its rows. Activation offload is not applied here.

BatchNorm would need statistics synchronised over the split, so models with it (ResNet, GoogLeNet) are not
run spatially; tiny-cnn, AlexNet and VGG-16 are.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from trainsim.calibrate import zoo
from trainsim.calibrate.execute.pipeline import sequential_parts
from trainsim.calibrate.execute.strategies import Clock, FlatParams, Strategy
from trainsim.errors import TrainsimError


def rows(rank: int, height: int, ranks: int) -> tuple[int, int]:
    """The rows [a, b) of an activation of ``height`` rows that ``rank`` holds."""
    return rank * height // ranks, (rank + 1) * height // ranks


@dataclass(frozen=True)
class HaloPlan:
    """One windowed layer's geometry along the height, and for every rank the input rows it reads."""

    height_in: int
    kernel: int
    stride: int
    padding: int
    ranks: int
    fill: float  # value of the rows beyond the image's edge

    @property
    def height_out(self) -> int:
        return (self.height_in + 2 * self.padding - self.kernel) // self.stride + 1

    def needed(self, rank: int) -> tuple[int, int]:
        """Input rows [lo, hi) (may reach past the edges) that ``rank``'s output rows read."""
        o0, o1 = rows(rank, self.height_out, self.ranks)
        if o1 <= o0:
            raise TrainsimError(f"{self.ranks} ranks split {self.height_out} output rows: one would get none",
                                field="ranks")
        lo, hi = o0 * self.stride - self.padding, (o1 - 1) * self.stride - self.padding + self.kernel
        first = rows(max(rank - 1, 0), self.height_in, self.ranks)[0]
        last = rows(min(rank + 1, self.ranks - 1), self.height_in, self.ranks)[1]
        if max(lo, 0) < first or min(hi, self.height_in) > last:
            raise TrainsimError(f"slabs of {self.height_in} rows over {self.ranks} ranks are thinner than "
                                f"the {self.kernel}-row window: halos would span more than one neighbour",
                                field="ranks")
        return lo, hi

    def from_neighbour(self, rank: int, other: int) -> tuple[int, int]:
        """Rows of ``other``'s slab that ``rank`` reads (an empty range when none)."""
        lo, hi = self.needed(rank)
        a, b = rows(other, self.height_in, self.ranks)
        lo, hi = max(lo, a), min(hi, b)
        return (lo, hi) if hi > lo else (0, 0)


def _exchange(sends: list[tuple[torch.Tensor, int]], recvs: list[tuple[torch.Tensor, int]]) -> None:
    """Every send and receive at once, then wait. Batched, NCCL runs them as one group, so two neighbours
    that both send first cannot block each other; on gloo they are the plain isend/irecv calls."""
    ops = [dist.P2POp(dist.isend, t.contiguous(), peer) for t, peer in sends if t.shape[2] > 0]
    ops += [dist.P2POp(dist.irecv, t, peer) for t, peer in recvs if t.shape[2] > 0]
    for work in dist.batch_isend_irecv(ops) if ops else []:
        work.wait()


class HaloExchange(torch.autograd.Function):
    """Local slab (N, C, rows, W) -> the rows [lo, hi) this rank's next layer reads, padded at the edges."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, plan: HaloPlan, rank: int):
        a, b = rows(rank, plan.height_in, plan.ranks)
        lo, hi = plan.needed(rank)
        n, c, _, w = x.shape
        neighbours = [p for p in (rank - 1, rank + 1) if 0 <= p < plan.ranks]
        sends, recvs, pieces = [], [], {}
        for peer in neighbours:
            s0, s1 = plan.from_neighbour(peer, rank)  # my rows the neighbour reads
            sends.append((x[:, :, s0 - a:s1 - a] if s1 > s0 else x[:, :, :0], peer))
            r0, r1 = plan.from_neighbour(rank, peer)  # the neighbour's rows I read
            buf = x.new_empty(n, c, r1 - r0, w)
            recvs.append((buf, peer))
            pieces[peer] = (r0, r1, buf)
        _exchange(sends, recvs)
        out = x.new_full((n, c, hi - lo, w), plan.fill)
        own0, own1 = max(lo, a), min(hi, b)
        if own1 > own0:
            out[:, :, own0 - lo:own1 - lo] = x[:, :, own0 - a:own1 - a]
        for r0, r1, buf in pieces.values():
            if r1 > r0:
                out[:, :, r0 - lo:r1 - lo] = buf
        ctx.plan, ctx.rank, ctx.shape = plan, rank, x.shape
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        plan, rank = ctx.plan, ctx.rank
        a, b = rows(rank, plan.height_in, plan.ranks)
        lo, hi = plan.needed(rank)
        grad = grad_out.new_zeros(ctx.shape)
        own0, own1 = max(lo, a), min(hi, b)
        if own1 > own0:
            grad[:, :, own0 - a:own1 - a] += grad_out[:, :, own0 - lo:own1 - lo]
        sends, recvs = [], []
        for peer in (p for p in (rank - 1, rank + 1) if 0 <= p < plan.ranks):
            r0, r1 = plan.from_neighbour(rank, peer)  # the neighbour's rows I read: their gradients go home
            sends.append((grad_out[:, :, r0 - lo:r1 - lo] if r1 > r0 else grad_out[:, :, :0], peer))
            s0, s1 = plan.from_neighbour(peer, rank)  # my rows the neighbour read
            buf = grad_out.new_empty(grad.shape[0], grad.shape[1], max(0, s1 - s0), grad.shape[3])
            recvs.append((buf, peer, s0, s1))
        _exchange(sends, [(buf, peer) for buf, peer, _, _ in recvs])
        for buf, _, s0, s1 in recvs:
            if s1 > s0:
                grad[:, :, s0 - a:s1 - a] += buf
        return grad, None, None


class GatherRows(torch.autograd.Function):
    """Every rank's slab -> the whole activation on every rank; backward keeps this rank's rows."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, height: int, ranks: int, rank: int):
        n, c, _, w = x.shape
        parts = [x.new_empty(n, c, b - a, w) for a, b in (rows(r, height, ranks) for r in range(ranks))]
        if all(p.shape == x.shape for p in parts):
            dist.all_gather(parts, x.contiguous())
        else:  # uneven slabs: gloo's all_gather wants equal sizes, so each rank broadcasts its own
            for r, part in enumerate(parts):
                if r == rank:
                    part.copy_(x)
                dist.broadcast(part, r)
        ctx.rows = rows(rank, height, ranks)
        return torch.cat(parts, dim=2)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        a, b = ctx.rows
        return grad_out[:, :, a:b].contiguous(), None, None, None


class SpatialLayer(nn.Module):
    """A conv/pool layer run on this rank's slab: halo exchange, then the layer without height padding."""

    def __init__(self, layer: nn.Module, height_in: int, ranks: int, rank: int):
        super().__init__()
        self.layer, self.ranks, self.rank = layer, ranks, rank
        if isinstance(layer, nn.Conv2d):
            k, s, p = layer.kernel_size[0], layer.stride[0], layer.padding[0]
            fill = 0.0
        else:
            k, s, p = _pair0(layer.kernel_size), _pair0(layer.stride), _pair0(layer.padding)
            fill = float("-inf")
        self.plan = HaloPlan(height_in, k, s, p, ranks, fill)

    def forward(self, x):
        x = HaloExchange.apply(x, self.plan, self.rank)
        layer = self.layer
        if isinstance(layer, nn.Conv2d):
            return F.conv2d(x, layer.weight, layer.bias, layer.stride, (0, layer.padding[1]), layer.dilation,
                            layer.groups)
        kw = _pair(layer.kernel_size)
        return F.max_pool2d(x, (kw[0], kw[1]), _pair(layer.stride), (0, _pair(layer.padding)[1]),
                            ceil_mode=layer.ceil_mode)


def _pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


def _pair0(v) -> int:
    return _pair(v)[0]


def spatial_front(parts: list[nn.Module]) -> int:
    """How many leading parts can run on row slabs (convolutions, ReLUs, max-pools)."""
    n = 0
    for part in parts:
        if isinstance(part, nn.Conv2d) and part.dilation[0] == 1 or isinstance(part, nn.ReLU | nn.MaxPool2d):
            n += 1
        else:
            break
    return n


class Spatial(Strategy):
    name = "spatial"

    def __init__(self, ctx, cfg, model, device):
        super().__init__(ctx, cfg, model, device)
        if self.offloader is not None:
            self.offloader.remove()
        if self.offload_mode != "none":
            self.notes.append("activation offload is not applied to the spatial split")
        if any(isinstance(m, nn.BatchNorm2d) for m in model.modules()):
            raise TrainsimError(f"{cfg.model} has BatchNorm: a spatial split needs synchronised statistics",
                                field="strategy")
        parts = sequential_parts(model)
        front = spatial_front(parts)
        if front == 0:
            raise TrainsimError(f"{cfg.model} starts with no convolution to split", field="strategy")
        height = zoo.input_shape(cfg.model, **cfg.model_cfg)[1]
        self.height_in = height
        layers: list[nn.Module] = []
        x = torch.zeros(1, *zoo.input_shape(cfg.model, **cfg.model_cfg), device=device)
        with torch.no_grad():
            for part in parts[:front]:
                h = x.shape[2]
                layers.append(SpatialLayer(part, h, self.world, self.rank) if not isinstance(part, nn.ReLU)
                              else part)
                x = part(x)
        self.height_out = x.shape[2]
        self.front = nn.Sequential(*layers)
        self.back = nn.Sequential(*parts[front:])
        self.split_params = list(nn.Sequential(*parts[:front]).parameters())  # gradients summed over ranks
        self.flat = FlatParams(self.split_params) if self.split_params else None
        self.optimizer = self.new_optimizer(model.parameters())
        self.extra["spatial_layers"] = front

    def positions(self) -> range:
        return range(self.cfg.batch_size)  # every rank reads the whole batch and keeps its rows

    def step(self, batch, clock: Clock) -> torch.Tensor:
        inputs, targets = batch
        a, b = rows(self.rank, self.height_in, self.world)
        local = inputs[:, :, a:b].contiguous()
        with self.precision.autocast():
            y = self.front(local)
            y = GatherRows.apply(y, self.height_out, self.world, self.rank)
            out = self.back(y)
        loss = self.loss(out, targets)
        clock.lap("forward")
        self.precision.backward(loss)
        clock.lap("backward")
        if self.flat is not None:  # each rank's convolution gradients cover its rows only
            grads = self.flat.read_grads(self.flat.new_buffer(self.device))
            dist.all_reduce(grads)
            self.flat.write_grads(grads)
            clock.lap("comm")
        self.precision.step(self.optimizer)
        self.optimizer.zero_grad(set_to_none=True)
        clock.lap("optimizer")
        return loss.detach()
