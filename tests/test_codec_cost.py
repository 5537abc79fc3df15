"""The DDP comm hook's cost on a CPU rank: measured for real on one pinned rank (a world of one)."""

import pytest

pytest.importorskip("torch")

from trainsim.calibrate.execute.codec_cost import measure_hook_cost  # noqa: E402
from trainsim.calibrate.execute.config import ExecConfig, OptimizationsConfig  # noqa: E402


def _cfg(compression: str, **kw) -> ExecConfig:
    return ExecConfig(strategy="ddp", ranks=2, batch_size=8, model="tiny-cnn", model_cfg={"image_size": 16},
                      warmup=2, optimizations=OptimizationsConfig(param_compression=compression), **kw)


def test_a_hook_is_timed_against_the_same_ddp_step_without_it():
    cost = measure_hook_cost(_cfg("powersgd"), rounds=2, steps=2)
    assert cost is not None and 0 <= cost < 1.0


def test_nothing_to_measure_without_a_hook_or_off_cpu_ranks():
    assert measure_hook_cost(_cfg("none")) is None
    assert measure_hook_cost(ExecConfig(strategy="single", ranks=1)) is None
