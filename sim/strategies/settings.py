"""`RunSettings`: what a run's strategy reads of its scenario, frozen once the run is built.

Built from the resolved run (its scenario, the input pipeline's cost and the spread of a rank's passes that
the host figures give) by `RunSettings.of`; strategies and plug-ins only read it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from trainsim.formats.scenario_options import DEFAULT_COMPUTE_MODEL

if TYPE_CHECKING:
    from trainsim.formats.scenario import Optimizations, Scenario, StrategySpec
    from trainsim.sim.core.jitter import JitterSpec

__all__ = ["RunSettings"]


@dataclass(frozen=True)
class RunSettings:
    """The run's settings, in the simulator's units (bytes, seconds)."""

    precision: str = "fp32"
    mixed_precision: str = "master"  # how a 16-bit precision keeps weights and gradients (costs.MIXED_MODES)
    optimizer: str = "sgd"
    pinned: bool = True
    data_workers: int = 4
    loader_layout: str = "per-gpu"  # or "shared": one DataLoader per machine feeds its ranks (SharedLoader)
    prep_s_per_sample: float = 0.0
    bucket_cap_bytes: float = 25 * 2**20
    first_bucket_cap_bytes: float = 1 * 2**20
    collectives: str = "flow"  # or "analytic"
    collective_algo: str = "auto"
    ps_cores: int | None = None
    ps_socket: int = 0
    detail: bool = True  # False: one record per run of back-to-back layers instead of one per layer
    batch_size: int = 0  # global
    strategy: StrategySpec | None = None  # the scenario's, for options of one strategy (pipeline, easgd...)
    optimizations: Optimizations | None = None
    preload_depth: int = 0  # batches copied ahead on the H2D engine (ScaleDNN pre-loading; 0: off)
    cpu_batch_split: bool = False  # dp-gpu0: each GPU loads its own shard (ScaleDNN)
    # the spread of a rank's passes: the scenario's strategy.jitter, else a calibrated host's measured one;
    # None: every pass takes its nominal time
    jitter_spec: JitterSpec | None = None
    compute_model: str = DEFAULT_COMPUTE_MODEL  # how layer times not measured on a device are estimated
    comm_interference: bool = True  # compute slows while communication kernels hold SMs and HBM

    @classmethod
    def of(cls, scenario: Scenario, *, prep_s_per_sample: float, jitter_spec: JitterSpec | None,
           detail: bool) -> RunSettings:
        """The settings of ``scenario`` with the input pipeline's cost per sample and the passes' spread
        worked out from the run's inputs."""
        st, opts = scenario.strategy, scenario.optimizations
        first_cap = st.first_bucket_cap_mb if st.first_bucket_cap_mb is not None else st.bucket_cap_mb
        return cls(
            precision=scenario.precision, mixed_precision=scenario.mixed_precision,
            optimizer=scenario.optimizer.name, pinned=scenario.host.pinned,
            data_workers=scenario.host.data_workers, loader_layout=scenario.host.loader,
            prep_s_per_sample=prep_s_per_sample, bucket_cap_bytes=st.bucket_cap_mb * 2**20,
            first_bucket_cap_bytes=first_cap * 2**20, collectives=st.collectives,
            collective_algo=st.collective_algo, ps_cores=st.ps_cores, ps_socket=st.ps_socket, detail=detail,
            batch_size=scenario.batch_size, strategy=st, optimizations=opts, preload_depth=opts.preload,
            cpu_batch_split=opts.cpu_batch_split, jitter_spec=jitter_spec,
            compute_model=scenario.compute_model, comm_interference=scenario.comm_interference)
