"""A device mesh: how a run's GPUs split into tensor-, context-, data- and pipeline-parallel groups.

Ranks are numbered in the topology's GPU order (machine by machine), and the dimensions are laid out with
tensor parallelism innermost, then context, then data, then pipeline outermost (Megatron-LM's order): a rank
``r`` has coordinates ``tp = r % TP``, ``cp = (r // TP) % CP``, ``dp = (r // (TP CP)) % DP`` and
``pp = r // (TP CP DP)``. So a tensor-parallel group of up to a machine's GPUs stays inside its NVLink or
NVSwitch domain, and the data-parallel and pipeline groups cross the network. Expert parallelism is carved
out of data parallelism: the ``EP`` consecutive data-parallel ranks of a block hold different experts.
With ``shard`` (HSDP), the data-parallel ranks shard their state within consecutive groups of ``shard`` and
hold copies across the groups.

`Mesh` is pure: it knows ranks and groups, not costs (`trainsim.sim.parallel.split` and the `mesh` strategy
use it).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from trainsim.errors import TrainsimError

__all__ = ["Mesh"]

DIMS = ("tp", "cp", "dp", "pp")


@dataclass(frozen=True)
class Mesh:
    """The mesh of ``gpus`` (rank order) with the given degrees; ``dp`` is what is left."""

    gpus: tuple[str, ...]
    tp: int = 1
    cp: int = 1
    pp: int = 1
    ep: int = 1
    shard: int | None = None

    def __post_init__(self):
        n, inner = len(self.gpus), self.tp * self.cp * self.pp
        if n % inner:
            raise TrainsimError(
                f"tp x cp x pp = {self.tp} x {self.cp} x {self.pp} = {inner} does not divide the "
                f"{n} GPUs of the run; valid: a product that divides {n} (data parallelism "
                "takes what is left)",
                field="strategy.mesh",
            )
        dp = n // inner
        if dp % self.ep:
            raise TrainsimError(
                f"ep {self.ep} does not divide the data-parallel degree {dp} (GPUs / (tp x cp x "
                "pp)): experts are split over data-parallel ranks",
                field="strategy.mesh.ep",
            )
        if self.shard is not None and dp % self.shard:
            raise TrainsimError(
                f"shard {self.shard} does not divide the data-parallel degree {dp}",
                field="strategy.mesh.shard",
            )

    @property
    def n(self) -> int:
        return len(self.gpus)

    @property
    def dp(self) -> int:
        return self.n // (self.tp * self.cp * self.pp)

    @property
    def shard_size(self) -> int:
        """How many data-parallel ranks shard a copy of the state (all of them without HSDP)."""
        return self.shard or self.dp

    @cached_property
    def _index(self) -> dict[str, int]:
        return {g: i for i, g in enumerate(self.gpus)}

    def coords(self, gpu: str) -> dict[str, int]:
        """``gpu``'s coordinate along each dimension (tp, cp, dp, pp)."""
        r = self._index[gpu]
        tp, r = r % self.tp, r // self.tp
        cp, r = r % self.cp, r // self.cp
        dp, pp = r % self.dp, r // self.dp
        return {"tp": tp, "cp": cp, "dp": dp, "pp": pp}

    def gpu(self, tp: int = 0, cp: int = 0, dp: int = 0, pp: int = 0) -> str:
        return self.gpus[tp + self.tp * (cp + self.cp * (dp + self.dp * pp))]

    def stage(self, gpu: str) -> int:
        return self.coords(gpu)["pp"]

    def group(self, gpu: str, dim: str) -> list[str]:
        """The ranks that differ from ``gpu`` only along ``dim``: tp, cp, dp, pp, ep (its block of ``ep``
        data-parallel ranks), shard (its block of ``shard_size`` data-parallel ranks) or replica (the ranks
        holding the same shard in the other blocks: HSDP's all-reduce group)."""
        c = self.coords(gpu)
        if dim in DIMS:
            return [self.gpu(**{**c, dim: i}) for i in range(getattr(self, dim))]
        size = {"ep": self.ep, "shard": self.shard_size}.get(dim)
        if size is not None:
            first = c["dp"] - c["dp"] % size
            return [self.gpu(**{**c, "dp": first + i}) for i in range(size)]
        if dim == "replica":
            size = self.shard_size
            return [self.gpu(**{**c, "dp": c["dp"] % size + k * size}) for k in range(self.dp // size)]
        raise ValueError(f"unknown mesh dimension {dim!r}")

    def representatives(self) -> dict[str, list[str]]:
        """One rank per pipeline stage (its first) -> every rank of that stage: what a symmetric mesh
        simulates and what each simulated rank stands for (the stage's ranks run the same work)."""
        out = {}
        for s in range(self.pp):
            first = self.gpu(pp=s)
            out[first] = [g for g in self.gpus if self.stage(g) == s]
            out[first].sort(key=lambda g: g != first)  # itself first
        return out

    def crosses_machines(self, dim: str, machine_of) -> bool:
        """Whether a group along ``dim`` spans more than one machine (``machine_of(gpu) -> id``)."""
        return len({machine_of(g) for g in self.group(self.gpus[0], dim)}) > 1
