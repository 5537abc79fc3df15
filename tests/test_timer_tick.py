"""The timer tick stalled gloo calls wait for: period, offset and dead time, fitted from when calls
returned."""

import math

import numpy as np
import pytest

from trainsim.calibrate.measure.timer_tick import PROBE_BYTES, PROBE_CALLS, TOGETHER_S, fit

PERIOD, OFFSET, DEAD, FAST = 0.004, 0.00025, 0.0015, 0.0003


def _stamps(stall_every: int, on_tick: bool = True, calls: int = PROBE_CALLS) -> list[list[tuple]]:
    """Two ranks' (arrival, return) per call: every ``stall_every``-th call stalls until the first tick at
    least DEAD after the last arrival (or, without ``on_tick``, for a random 2-6 ms)."""
    rng = np.random.default_rng(3)
    t, ranks = 1000.0, ([], [])
    for i in range(calls):
        t += rng.uniform(0.003, 0.012)
        late = rng.uniform(0, 1e-4)  # rank 1 arrives a little after rank 0
        arrival = t + late
        if i % stall_every == 0:
            end = (OFFSET + math.ceil((arrival + DEAD - OFFSET) / PERIOD) * PERIOD if on_tick
                   else arrival + rng.uniform(0.002, 0.006))
        else:
            end = arrival + FAST
        ranks[0].append((t, end - 1e-5))
        ranks[1].append((arrival, end))
        t = end
    return [list(ranks[0]), list(ranks[1])]


def test_the_period_offset_and_dead_time_of_calls_that_wake_on_a_tick():
    found = fit(_stamps(stall_every=2))
    assert found["period_s"] == 0.004  # not 1 ms, which 4 ms multiples also fall on
    assert found["offset_s"] == pytest.approx(OFFSET, abs=1e-6)
    assert found["dead_time_s"] == pytest.approx(DEAD, abs=PERIOD / 80)
    assert found["stalled_calls"] == PROBE_CALLS // 2 and found["calls"] == PROBE_CALLS
    assert found["resultant"] > 0.99


def test_the_shares_of_calls_that_stalled_with_the_ranks_together_and_apart():
    t, ranks, together = 1000.0, ([], []), []
    for i in range(PROBE_CALLS):
        t += 0.003 + (i % 7) * 0.0013
        apart = i % 3 == 0  # rank 1 arrives 0.5 ms late, and those calls never stall
        last = t + (5e-4 if apart else 1e-5)
        end = (OFFSET + math.ceil((last + DEAD - OFFSET) / PERIOD) * PERIOD if not apart and i % 2 == 0
               else last + FAST)
        ranks[0].append((t, end))
        ranks[1].append((last, end))
        together.append(not apart)
        t = end
    found = fit([list(ranks[0]), list(ranks[1])])
    assert found["together_s"] == TOGETHER_S and found["probe_bytes"] == PROBE_BYTES
    assert found["stall_apart"] == 0.0
    stalled_together = sum(1 for i, met in enumerate(together) if met and i % 2 == 0)
    assert found["stall_together"] == pytest.approx(stalled_together / sum(together), abs=1e-3)


def test_no_tick_where_calls_do_not_stall_or_stall_at_random():
    assert fit(_stamps(stall_every=1000))["period_s"] is None
    assert "fewer than" in fit(_stamps(stall_every=1000))["reason"]
    at_random = fit(_stamps(stall_every=2, on_tick=False))
    assert at_random["period_s"] is None and "no tick" in at_random["reason"]
