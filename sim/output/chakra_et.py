"""A simulated run as Chakra execution traces (``simulate --chakra DIR``).

The run becomes what ``simulate --trace DIR`` writes, per-rank Kineto traces (`kineto_ranks`), which a replay
reads back as the measurement it is; each replayed rank is then one ET (`trainsim.sim.replay.chakra_graph`),
so a simulated run and a real one reach ASTRA-sim the same way.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_simulation_et(result, folder: str | os.PathLike, *, provenance: dict | None = None) -> None:
    """``folder/trainsim.<rank>.et`` for every GPU of the simulated run ``result`` (recorded)."""
    from trainsim.sim.output.kineto_ranks import write_rank_traces
    from trainsim.sim.replay.chakra_graph import write_replay_et
    from trainsim.sim.replay.engine import replay_traces

    with tempfile.TemporaryDirectory() as tmp:
        write_rank_traces(result, Path(tmp) / "trace", provenance=provenance)
        report = replay_traces([Path(tmp) / "trace"], checks=False)
    write_replay_et(report, folder, provenance=provenance)
