"""NCCL figures measured on the box (a topology's ``nccl`` block, written by `trainsim calibrate` on CUDA)
in place of NCCL's tuning tables.

A measured figure gives, for one (collective, algorithm, protocol) on the group it was measured on (the
topology's first ``ranks`` GPUs), t(S) = latency + S / algbw. The plan keeps its structure (which links each
step loads) and takes two numbers from the measurement:
- latency: every latency of the plan (base and per step) scaled by measured / modelled, so the measured
  group's alpha is the measured latency and other groups keep the plan's shape of it (more steps, more
  latency);
- efficiency: measured algbw over what the plan's links allow at full rate on the measured group, the same
  fraction of the links then applying to any group.
On the measured group the result is the measurement itself, at every size.
"""

from __future__ import annotations

import dataclasses

from trainsim.topologies import Topology

from .plans import Phase, Plan, Transfer, alpha_beta


def figure(topo: Topology, op: str, algo: str, proto: str):
    """The measured `NcclFigure` for ``op`` / ``algo`` / ``proto`` on ``topo``, or None."""
    block = getattr(topo.spec, "nccl", None)
    if block is None:
        return None
    return next((f for f in block.figures if (f.collective, f.algo, f.proto) == (op, algo, proto)), None)


def measured_group(topo: Topology) -> list[str]:
    """The GPUs the block's figures were measured on."""
    return topo.gpus[:topo.spec.nccl.ranks]


def apply(plan: Plan, reference: Plan, topo: Topology, fig, bus_factor: float) -> Plan:
    """``plan`` with the latency scale and efficiency that make ``reference`` (the same collective, algorithm
    and protocol planned on the measured group, at efficiency 1) reproduce ``fig``."""
    ref_alpha, ref_beta = alpha_beta(topo, dataclasses.replace(reference, efficiency=1.0))
    scale = fig.latency_us * 1e-6 / ref_alpha if ref_alpha > 0 else 1.0
    algbw = fig.busbw_gbps * 1e9 / bus_factor
    efficiency = ref_beta * algbw if ref_beta > 0 else 1.0  # measured algbw / the links' full-rate algbw
    lanes = tuple(tuple(_scaled(phase, scale) for phase in lane) for lane in plan.lanes)
    return dataclasses.replace(plan, lanes=lanes, base_latency=plan.base_latency * scale,
                               efficiency=efficiency)


def _scaled(phase: Phase, scale: float) -> Phase:
    return dataclasses.replace(phase, transfers=tuple(Transfer(t.route, t.share, t.latency * scale)
                                                      for t in phase.transfers))
