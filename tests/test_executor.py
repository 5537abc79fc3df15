"""The real executor on CPU ranks: every strategy runs and measures; the distributed code is checked
against single-process arithmetic (dp-gpu0 = ddp = parameter server = one rank on the whole batch; EASGD's
formulas)."""

import math
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from trainsim.calibrate.execute.config import (  # noqa: E402
    EasgdConfig,
    ExecConfig,
    OptimizationsConfig,
    PipelineConfig,
)
from trainsim.calibrate.execute.executor import run_many, run_variant  # noqa: E402
from trainsim.errors import TrainsimError  # noqa: E402

# Two ranks need two cores; a one-core box skips the distributed checks (their variants would be "skipped").
two_cores = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores for 2 CPU ranks")

# Exactness checks take one step: a second step's forward can flip a ReLU or max-pool tie on float noise
# (a different thread count or micro-batch size sums in another order), which is not a bug.
EXACT = dict(model="tiny-cnn", batch_size=8, iterations=1, warmup=0, lr=0.1, capture_params=True)
MEASURED = dict(model="tiny-cnn", batch_size=8, iterations=3, warmup=1, lr=0.1)
ALPHA_RHO = 2.0  # with lr 0.1: alpha = 0.2, a pull large enough to see
SCHEDULES = ("gpipe", "1f1b", "message-driven")


def _two_rank_configs(common: dict) -> dict:
    return {
        "ddp": ExecConfig(strategy="ddp", ranks=2, **common),
        "dp-gpu0": ExecConfig(strategy="dp-gpu0", ranks=2, **common),
        "dp-gpu0-split": ExecConfig(strategy="dp-gpu0", ranks=2,
                                    optimizations=OptimizationsConfig(cpu_batch_split=True), **common),
        "parameter-server": ExecConfig(strategy="parameter-server", ranks=2, **common),
        "easgd-sync": ExecConfig(strategy="easgd", ranks=2, easgd=EasgdConfig(rho=ALPHA_RHO), **common),
        "easgd-original": ExecConfig(strategy="easgd", ranks=2,
                                     easgd=EasgdConfig(variant="original", rho=ALPHA_RHO), **common),
        "ddp-fp16": ExecConfig(strategy="ddp", ranks=2, **common,
                               optimizations=OptimizationsConfig(param_compression="fp16")),
        **{f"pipeline-{s}": ExecConfig(strategy="pipeline", ranks=2, **common,
                                       pipeline=PipelineConfig(micro_batches=4, schedule=s))
           for s in SCHEDULES},
        "spatial": ExecConfig(strategy="spatial", ranks=2, **common),
    }


@pytest.fixture(scope="module")
def two_rank_runs():
    """{"exact": one SGD step per strategy with parameters captured, "measured": 1 + 3 timed steps}."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 cores for 2 CPU ranks")
    exact, measured = _two_rank_configs(EXACT), _two_rank_configs(MEASURED)
    exact["pipeline-replicas"] = ExecConfig(strategy="pipeline", ranks=2, **EXACT,  # 1 stage x 2 replicas
                                            pipeline=PipelineConfig(stages=1, micro_batches=2))
    exact["spatial-uneven"] = ExecConfig(strategy="spatial", ranks=2, **EXACT, model_cfg={"image_size": 30})
    measured["ddp-powersgd"] = ExecConfig(strategy="ddp", ranks=2, **{**MEASURED, "warmup": 2},
                                          optimizations=OptimizationsConfig(param_compression="powersgd"))
    runs = run_many([*exact.values(), *measured.values()])  # one launch: start-up paid once
    return {"exact": dict(zip(exact, runs[:len(exact)], strict=True)),
            "measured": dict(zip(measured, runs[len(exact):], strict=True))}


@pytest.fixture(scope="module")
def one_rank_runs():
    optimized = OptimizationsConfig(preload=2, offload_activations="prefetch", prefetch_distance=2)
    configs = {
        "single": ExecConfig(**EXACT),
        "preload-offload": ExecConfig(**EXACT, optimizations=optimized),
        "save-on-cpu": ExecConfig(**EXACT,
                                  optimizations=OptimizationsConfig(offload_activations="save_on_cpu")),
        "single-30px": ExecConfig(**EXACT, model_cfg={"image_size": 30}),
        "adam": ExecConfig(**{**EXACT, "optimizer": "adam", "lr": 0.01}),
        "adam-offloaded": ExecConfig(**{**EXACT, "optimizer": "adam", "lr": 0.01},  # 10 KiB: many chunks
                                     optimizations=OptimizationsConfig(offload_optimizer_state=True,
                                                                       offload_chunk_mb=0.01)),
        "measured-single": ExecConfig(**MEASURED),
        "measured-preload-offload": ExecConfig(**MEASURED, optimizations=optimized),
    }
    return dict(zip(configs, run_many(list(configs.values())), strict=True))


def _sane(m, ranks: int):
    assert len(m.iteration_s) == MEASURED["iterations"] and all(t > 0 for t in m.iteration_s)
    assert m.median_s > 0 and m.iqr_s >= 0
    assert m.samples_per_s == pytest.approx(MEASURED["batch_size"] / m.median_s)
    assert len(m.peak_memory_bytes) == ranks and all(b >= 0 for b in m.peak_memory_bytes)
    assert m.memory_measure.startswith("cpu.peak_rss_delta")
    assert {"data", "forward", "backward", "optimizer"} <= set(m.breakdown_s)
    assert sum(m.breakdown_s.values()) <= 1.5 * max(m.iteration_s)
    assert all(math.isfinite(x) for x in m.losses) and len(m.losses) == MEASURED["iterations"]
    assert m.ran["ranks"] == ranks and m.to_dict()["schema"] == "trainsim.measurement/1"


def test_one_rank_runs_measure(one_rank_runs):
    for name in ("measured-single", "measured-preload-offload"):
        _sane(one_rank_runs[name], 1)
    ran = one_rank_runs["measured-preload-offload"].ran
    assert ran["optimizations"] == {"preload": 2, "offload_activations": "prefetch", "prefetch_distance": 2}
    assert any("0 on demand" in note for note in ran["notes"])  # every unpack was prefetched


def test_optimizations_do_not_change_the_arithmetic(one_rank_runs):
    reference = one_rank_runs["single"].ranks[0].params
    for name in ("preload-offload", "save-on-cpu"):
        np.testing.assert_array_equal(one_rank_runs[name].ranks[0].params, reference)
    adam = one_rank_runs["adam"].ranks[0].params  # Adam's state on the device or streamed in chunks: the same
    np.testing.assert_array_equal(one_rank_runs["adam-offloaded"].ranks[0].params, adam)
    assert np.abs(adam - reference).max() > 0
    assert any("optimizer state in host memory" in n for n in one_rank_runs["adam-offloaded"].ran["notes"])


@two_cores
@pytest.mark.slow  # every strategy trains on 2 ranks (the two_rank_runs fixture)
def test_every_two_rank_strategy_measures(two_rank_runs):
    measured = two_rank_runs["measured"]
    for name, m in measured.items():
        _sane(m, 2)
        assert m.ran["strategy"] == m.config["strategy"] and name.startswith(m.ran["strategy"].split("-")[0])
    assert measured["ddp-fp16"].ran["optimizations"] == {"param_compression": "fp16"}
    assert measured["ddp-powersgd"].ran["optimizations"] == {"param_compression": "powersgd",
                                                             "powersgd_rank": 1}
    assert measured["dp-gpu0-split"].ran["optimizations"] == {"cpu_batch_split": True}
    for schedule in SCHEDULES:
        pipe = measured[f"pipeline-{schedule}"]
        assert pipe.ran["pipeline"]["schedule"] == schedule and pipe.ran["pipeline"]["stages"] == 2
        assert pipe.losses[0] > 0  # reported by the last stage, where the loss is computed
    assert "comm" in measured["dp-gpu0"].breakdown_s  # explicit collectives are timed
    assert measured["easgd-sync"].ran["easgd"]["exchanges"] == 4  # tau = 1: every step, warm-up included


@two_cores
@pytest.mark.slow  # every strategy trains on 2 ranks (the two_rank_runs fixture)
def test_data_parallel_strategies_compute_the_same_step(two_rank_runs, one_rank_runs):
    """Same data and SGD: one rank on the whole batch, DDP, the explicit DataParallel flow (with and without
    batch splitting), the parameter server, the pipeline under every schedule, the spatial split (and
    fp16-compressed DDP, to fp16 accuracy) agree."""
    exact = two_rank_runs["exact"]
    single = one_rank_runs["single"].ranks[0].params
    moved = np.abs(single - _initial_params()).max()
    assert moved > 1e-3  # the step really moved the parameters
    for name in ("ddp", "dp-gpu0", "dp-gpu0-split", "parameter-server"):
        np.testing.assert_allclose(exact[name].ranks[0].params, single, rtol=0, atol=1e-6, err_msg=name)
    for name in ("ddp", "parameter-server"):  # every rank holds the stepped parameters
        np.testing.assert_allclose(exact[name].ranks[1].params, single, rtol=0, atol=1e-6)
    fp16 = exact["ddp-fp16"].ranks[0].params
    np.testing.assert_allclose(fp16, single, rtol=0, atol=1e-3 * moved)
    assert np.abs(fp16 - single).max() > 0  # the gradients really went through fp16
    for schedule in SCHEDULES:  # stage 0's parameters, then stage 1's
        stages = np.concatenate([r.params for r in exact[f"pipeline-{schedule}"].ranks])
        np.testing.assert_allclose(stages, single, rtol=0, atol=1e-6, err_msg=schedule)
    for rank in exact["pipeline-replicas"].ranks:  # micro-batches accumulated, replicas all-reduced
        np.testing.assert_allclose(rank.params, single, rtol=0, atol=1e-6)
    # spatial: rows split, halos exchanged, convolution gradients summed (30 px: slabs of 15, 7 and 8 rows)
    single_30px = one_rank_runs["single-30px"].ranks[0].params
    for name, reference in (("spatial", single), ("spatial-uneven", single_30px)):
        for rank in exact[name].ranks:
            np.testing.assert_allclose(rank.params, reference, rtol=0, atol=1e-6, err_msg=name)


def _initial_params():
    from trainsim.calibrate import zoo

    torch.manual_seed(0)
    model = zoo.build_model("tiny-cnn")
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy()


@two_cores
@pytest.mark.slow  # every strategy trains on 2 ranks (the two_rank_runs fixture)
def test_easgd_sync_follows_the_formula(two_rank_runs):
    m = two_rank_runs["exact"]["easgd-sync"]
    alpha = m.ran["easgd"]["alpha"]
    assert alpha == pytest.approx(0.1 * ALPHA_RHO)
    ex = [r.extra["last_exchange"] for r in m.ranks]
    centre = ex[0]["centre_before"]
    np.testing.assert_array_equal(ex[1]["centre_before"], centre)  # every rank keeps the same centre
    expected_centre = centre + alpha * sum(e["w_before"] - centre for e in ex)
    for e in ex:
        np.testing.assert_allclose(e["centre_after"], expected_centre, atol=1e-6)
        np.testing.assert_allclose(e["w_after"], e["w_before"] - alpha * (e["w_before"] - centre), atol=1e-6)
    assert np.abs(ex[0]["w_before"] - ex[1]["w_before"]).max() > 0  # the workers really differed


@two_cores
@pytest.mark.slow  # every strategy trains on 2 ranks (the two_rank_runs fixture)
def test_easgd_original_serves_workers_in_rank_order(two_rank_runs):
    m = two_rank_runs["exact"]["easgd-original"]
    alpha = m.ran["easgd"]["alpha"]
    ex = [r.extra["last_exchange"] for r in m.ranks]
    c0 = ex[0]["centre_before"]  # hosted by rank 0 only
    assert ex[1]["centre_before"] is None
    c1 = c0 + alpha * (ex[0]["w_before"] - c0)  # rank 0's own worker first
    c2 = c1 + alpha * (ex[1]["w_before"] - c1)  # then rank 1, which is sent the centre as it is then
    np.testing.assert_allclose(ex[0]["centre_after"], c2, atol=1e-6)
    for e, centre_seen in ((ex[0], c0), (ex[1], c1)):
        expected = e["w_before"] - alpha * (e["w_before"] - centre_seen)
        np.testing.assert_allclose(e["w_after"], expected, atol=1e-6)


SCENARIO = {"workload": "tiny-cnn", "strategy": {"name": "single"}, "batch_size": 8, "iterations": 1,
            "warmup_iterations": 0, "executor": {"device": "cpu"}}


def test_variant_the_box_cannot_run_is_skipped_with_the_reason():
    too_many = len(os.sched_getaffinity(0)) + 1
    outcome = run_variant({**SCENARIO, "strategy": {"name": "ddp"}, "gpus": too_many,
                           "batch_size": 8 * too_many})
    assert outcome.measurement is None and "cores" in outcome.skipped
    assert outcome.to_dict()["skipped"] == outcome.skipped
    if not torch.cuda.is_available():
        cuda = run_variant({**SCENARIO, "executor": {"device": "cuda"}})
        assert cuda.measurement is None and "CUDA" in cuda.skipped


def test_run_refuses_what_the_box_cannot_run():
    from trainsim.calibrate.execute.executor import run

    too_many = len(os.sched_getaffinity(0)) + 1
    with pytest.raises(TrainsimError, match="cannot run here"):
        run(ExecConfig(strategy="ddp", ranks=too_many, batch_size=8 * too_many))
