"""How long a call costs beyond its transfer: the machine's one latency hook.

Every copy and collective the strategies start names the call it is part of (a `CallSite`); the machine asks
its `CallLatencyModel` what that call pays before its bytes move. The default, `RouteLatency`, answers None
everywhere: the route's own link latencies (alpha-beta of the route). A host plug-in (`trainsim.sim.hosts`)
answers with what its host measured instead.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class CallSite:
    """Which call a copy or a collective belongs to.

    ``op``: the collective it is part of (``allreduce``, ``reduce``, ``broadcast``, ..., ``p2p`` for one
    point-to-point message). ``key``: which call of it, where each rank's part is a copy of its own (every
    part with the same key is one call). ``skew_s``: how far apart the ranks arrived, where the strategy
    knows; None otherwise."""

    op: str
    key: Hashable = None
    skew_s: float | None = None


class CallLatencyModel:
    """What a call pays before its bytes move. `cost` answers None where the route's link latencies apply."""

    #: the host runs its calls one at a time, each blocking its caller (gloo), rather than on streams
    blocking_calls: bool = False

    def cost(self, call: CallSite, nbytes: float, *, now: float) -> float | None:
        """Seconds ``call`` on ``nbytes``, starting at ``now``, pays before its bytes move; None: the
        route's own latency."""
        return None

    def message_cost(self, call: CallSite | None, nbytes: float, *, now: float) -> float | None:
        """The same for one point-to-point message, part of ``call`` if named: that call's cost where the
        model knows it, else that of a plain message (``p2p``)."""
        if call is not None and call.op != "p2p":
            paid = self.cost(call, nbytes, now=now)
            if paid is not None:
                return paid
        return self.cost(CallSite("p2p", call.key if call else None), nbytes, now=now)


class RouteLatency(CallLatencyModel):
    """The default: every call pays its route's link latencies (alpha-beta of the route)."""
