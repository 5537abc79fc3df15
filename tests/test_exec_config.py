"""ExecConfig validation (errors name the field), the scenario mapping, and what this box can run."""

import os

import pytest

pytest.importorskip("torch")

from trainsim.calibrate.execute.config import (
    DataConfig,
    EasgdConfig,
    ExecConfig,
    OptimizationsConfig,
    PipelineConfig,
    exec_config_from_scenario,
    infeasible_reason,
    load_scenario_dict,
    merge,
    scenario_variants,
)
from trainsim.errors import TrainsimError  # noqa: E402


@pytest.mark.parametrize("kwargs, field", [
    ({"device": "tpu"}, "device"),
    ({"strategy": "allreduce"}, "strategy"),
    ({"strategy": "single", "ranks": 2}, "ranks"),
    ({"strategy": "ddp", "ranks": 3, "batch_size": 32}, "batch_size"),
    ({"optimizer": "lamb"}, "optimizer"),
    ({"lr": 0}, "lr"),
    ({"iterations": 0}, "iterations"),
    ({"model": "resnet9000"}, "model"),
    ({"model_cfg": {"depth": 3}}, "depth"),
    ({"optimizations": OptimizationsConfig(param_compression="fp16")}, "optimizations.param_compression"),
    ({"strategy": "ddp", "ranks": 2, "warmup": 1,
      "optimizations": OptimizationsConfig(param_compression="powersgd")}, "warmup"),
    ({"strategy": "ddp", "ranks": 2, "optimizations": OptimizationsConfig(cpu_batch_split=True)},
     "optimizations.cpu_batch_split"),
    ({"strategy": "dp-gpu0", "ranks": 2, "precision": "fp16"}, "precision"),
])
def test_bad_config_names_the_field(kwargs, field):
    with pytest.raises(TrainsimError) as err:
        ExecConfig(**kwargs)
    assert err.value.field == field


@pytest.mark.parametrize("build, field", [
    (lambda: EasgdConfig(variant="bogus"), "easgd.variant"),
    (lambda: EasgdConfig(moving_rate=0), "easgd.moving_rate"),
    (lambda: EasgdConfig(tau=0), "easgd.tau"),
    (lambda: EasgdConfig(rho=-1.0), "easgd.rho"),
    (lambda: DataConfig(augment_repeats=0), "data.augment_repeats"),
    (lambda: OptimizationsConfig(offload_activations="disk"), "optimizations.offload_activations"),
    (lambda: OptimizationsConfig(preload=-1), "optimizations.preload"),
])
def test_bad_sub_config_names_the_field(build, field):
    with pytest.raises(TrainsimError) as err:
        build()
    assert err.value.field == field


def test_unknown_choice_lists_the_valid_ones():
    with pytest.raises(TrainsimError, match="dp-gpu0.*easgd.*parameter-server"):
        ExecConfig(strategy="nope")


def test_easgd_alpha_is_lr_times_rho():
    cfg = ExecConfig(strategy="easgd", ranks=2, lr=0.1, easgd=EasgdConfig(rho=3.0))
    assert cfg.easgd_alpha == pytest.approx(0.3)
    assert ExecConfig(strategy="easgd", ranks=2, lr=0.1,
                      easgd=EasgdConfig(rho=3.0, lr=0.5)).easgd_alpha == pytest.approx(1.5)


BASE = {
    "schema": "trainsim.scenario/1", "topology": "calibrated",
    "workload": {"name": "tiny-cnn", "image_size": 32}, "strategy": {"name": "single"},
    "batch_size": 16, "gpus": 1, "iterations": 4, "warmup_iterations": 2,
    "optimizer": {"name": "momentum", "lr": 0.05}, "host": {"pinned": False, "data_workers": 3},
    "executor": {"device": "cpu", "data": {"augment_repeats": 5}},
    "variants": {
        "ddp": {"strategy": {"name": "ddp", "bucket_cap_mb": 4}, "gpus": [0, 1],
                "optimizations": {"param_compression": {"method": "powersgd", "rank": 3}}},
        "easgd": {"strategy": {"name": "easgd",
                               "easgd": {"variant": "original", "tau": 2, "flat_buffer": True}},
                  "executor": {"easgd": {"moving_rate": 0.3}}, "gpus": 2},
        "hogwild": {"strategy": {"name": "easgd", "easgd": {"variant": "hogwild"}}, "gpus": 2},
        "hybrid": {"strategy": {"name": "hybrid"}, "gpus": 2},
        "pre": {"optimizations": {"preload": 3, "offload_activations": "all", "prefetch_distance": 2}},
        "bad": {"optimizations": {"teleport": True}},
    },
}


def test_scenario_mapping_reads_every_field():
    base = exec_config_from_scenario(BASE)
    assert (base.model, base.model_cfg) == ("tiny-cnn", {"image_size": 32})
    assert (base.strategy, base.ranks) == ("single", 1)
    assert (base.batch_size, base.iterations, base.warmup) == (16, 4, 2)
    assert (base.optimizer, base.lr, base.pinned) == ("momentum", 0.05, False)
    assert (base.data.workers, base.data.augment_repeats) == (3, 5)
    ddp = exec_config_from_scenario(BASE, "ddp")
    assert (ddp.strategy, ddp.ranks, ddp.bucket_cap_mb) == ("ddp", 2, 4)
    assert (ddp.optimizations.param_compression, ddp.optimizations.powersgd_rank) == ("powersgd", 3)
    easgd = exec_config_from_scenario(BASE, "easgd")
    assert (easgd.easgd.variant, easgd.easgd.tau, easgd.easgd_alpha, easgd.ranks) == ("original", 2, 0.3, 2)
    pre = exec_config_from_scenario(BASE, "pre", iterations=1)
    assert pre.optimizations.preload == 3 and pre.iterations == 1
    assert (pre.optimizations.offload_activations, pre.optimizations.prefetch_distance) == ("prefetch", 2)


def test_scenario_errors_name_the_variant_and_field():
    with pytest.raises(TrainsimError, match="teleport"):
        exec_config_from_scenario(BASE, "bad", file="x.yaml")
    with pytest.raises(TrainsimError, match="valid choices: bad, ddp, easgd, hogwild, hybrid, pre"):
        exec_config_from_scenario(BASE, "missing")


def test_a_shared_loader_is_simulated_not_executed():
    # the executor gives every rank its own DataLoader: it runs host.loader per-gpu and refuses the other
    assert exec_config_from_scenario(merge(BASE, {"host": {"loader": "per-gpu"}})).data.workers == 3
    with pytest.raises(TrainsimError, match="per-gpu only") as err:
        exec_config_from_scenario(merge(BASE, {"host": {"loader": "shared"}}))
    assert err.value.field == "host.loader"


def test_what_only_the_simulator_models_is_skipped_with_the_reason_the_rest_runs():
    assert "hogwild" in infeasible_reason(exec_config_from_scenario(BASE, "hogwild"))
    assert "hybrid" in infeasible_reason(exec_config_from_scenario(BASE, "hybrid"))
    cfg = exec_config_from_scenario({**BASE, "optimizations": {"offload_optimizer_state": True}})
    assert cfg.optimizations.offload_optimizer_state and infeasible_reason(cfg) is None  # it runs
    assert cfg.optimizations.offload_chunk_mb == 64.0  # the simulator's default chunk
    chunked = {**BASE, "optimizations": {"offload_optimizer_state": True, "offload_chunk_mb": 8}}
    assert exec_config_from_scenario(chunked).optimizations.offload_chunk_mb == 8
    with pytest.raises(TrainsimError, match="should be greater than 0") as err:
        exec_config_from_scenario(merge(chunked, {"optimizations": {"offload_chunk_mb": 0}}))
    assert err.value.field == "optimizations.offload_chunk_mb"
    recompute = exec_config_from_scenario({**BASE, "strategy": {"name": "pipeline", "pipeline": {
        "stages": 2, "micro_batches": 2, "schedule": "message-driven", "recompute": True}}, "gpus": 2})
    assert recompute.pipeline.recompute and "checkpoint" in infeasible_reason(recompute)


def test_merge_is_deep_and_leaves_inputs_alone():
    base = {"a": {"b": 1, "c": 2}, "d": [1]}
    out = merge(base, {"a": {"b": 5}, "d": [2]})
    assert out == {"a": {"b": 5, "c": 2}, "d": [2]} and base["a"]["b"] == 1


def test_shipped_validation_scenarios_are_scenarios():
    """Their base and every variant validate in the one scenario schema the simulator and executor read."""
    from trainsim.formats.scenario_loader import check_variants, load_scenario

    for name in ("validate-cpu", "validate-gpu"):
        assert load_scenario(name).executor.device in ("cpu", "cuda")
        assert check_variants(name) == scenario_variants(load_scenario_dict(name))


@pytest.mark.parametrize(("block", "hint"), [
    ({"preload": True}, "write preload: 1"),
    ({"preload": {"depth": 3}}, "write preload: 3"),
    ({"param_compression": {"name": "powersgd", "rank": 2}}, "write {method: powersgd"),
    ({"offload_activations": "save_on_cpu"}, "offload_copies: blocking and prefetch_distance: 0"),
    ({"offload_activations": {"mode": "prefetch", "distance": 2}}, "prefetch_distance: K"),
])
def test_the_optimizations_block_has_one_grammar(block, hint):
    with pytest.raises(TrainsimError, match="optimizations") as err:
        exec_config_from_scenario({**BASE, "optimizations": block}, file="x.yaml")
    assert hint in str(err.value) and str(err.value).startswith("x.yaml: ")


def test_the_executor_reads_the_schemas_defaults():
    bare = {"workload": {"name": "tiny-cnn", "image_size": 16}, "strategy": {"name": "single"},
            "batch_size": 4}
    cfg = exec_config_from_scenario(bare)
    assert (cfg.iterations, cfg.warmup, cfg.data.augment_repeats, cfg.seed) == (3, 1, 1, 0)
    assert exec_config_from_scenario({**bare, "batch_size": None, "batch_per_gpu": 4, "gpus": 2,
                                      "strategy": {"name": "ddp"}}).batch_size == 8
    assert "conv layers" in infeasible_reason(exec_config_from_scenario(
        {**bare, "optimizations": {"offload_activations": "conv"}}))
    assert "int8" in infeasible_reason(exec_config_from_scenario(
        {**bare, "strategy": {"name": "ddp"}, "optimizations": {"param_compression": "int8"}}))


def test_shipped_validation_scenarios_map_onto_configs():
    for name in ("validate-cpu", "validate-gpu"):
        data = load_scenario_dict(name)
        names = scenario_variants(data)
        assert names
        configs = [exec_config_from_scenario(data, v) for v in names]
        assert {c.device for c in configs} == {"cpu" if name == "validate-cpu" else "cuda"}
    cpu = {v: exec_config_from_scenario(load_scenario_dict("validate-cpu"), v)
           for v in scenario_variants(load_scenario_dict("validate-cpu"))}
    strategies = {(c.strategy, c.ranks) for c in cpu.values()}
    assert {("single", 1), ("ddp", 2), ("dp-gpu0", 2), ("easgd", 2)} <= strategies
    assert {c.easgd.variant for c in cpu.values() if c.strategy == "easgd"} == {"sync", "original"}
    assert any(c.optimizations.preload for c in cpu.values())
    assert any(c.optimizations.param_compression != "none" for c in cpu.values())


def test_unknown_scenario_lists_shipped_ones():
    with pytest.raises(TrainsimError, match="validate-cpu"):
        load_scenario_dict("no-such-scenario")


def test_infeasible_more_ranks_than_cores():
    cores = len(os.sched_getaffinity(0))
    cfg = ExecConfig(strategy="ddp", ranks=cores + 1, batch_size=8 * (cores + 1))
    assert "cores" in infeasible_reason(cfg)
    assert infeasible_reason(ExecConfig()) is None


def test_infeasible_cuda_without_gpu_and_bf16_on_gloo():
    import torch

    if not torch.cuda.is_available():
        assert "CUDA" in infeasible_reason(ExecConfig(device="cuda"))
    cfg = ExecConfig(strategy="ddp", ranks=1, optimizations=OptimizationsConfig(param_compression="bf16"))
    assert "bf16" in infeasible_reason(cfg)


def test_cores_per_rank_that_do_not_fit_make_the_variant_a_skip():
    cores = len(os.sched_getaffinity(0))
    assert "cores each" in infeasible_reason(ExecConfig(ranks=1, cores_per_rank=cores + 1))
    assert infeasible_reason(ExecConfig(ranks=1, cores_per_rank=1)) is None


def test_easgd_centre_must_be_the_layout_the_executor_runs():
    base = {"workload": {"name": "tiny-cnn", "image_size": 16}, "gpus": 1, "batch_size": 4}

    def reason(**easgd):
        strategy = {"name": "easgd", "easgd": easgd}
        return infeasible_reason(exec_config_from_scenario({**base, "strategy": strategy}))

    assert "centre: replicated" in reason(variant="sync")  # the simulator's default centre is the host
    assert reason(variant="sync", centre="replicated") is None
    assert reason(variant="original") is None and reason(variant="original", centre="gpu") is None
    with pytest.raises(TrainsimError, match="centre replicated applies to variant sync"):
        reason(variant="original", centre="replicated")  # the scenario schema refuses it
    assert ExecConfig(strategy="easgd").easgd.where == "replicated"  # built directly: the variant's own


def test_fixed_pipeline_schedules_run_only_without_blocking_sends():
    base = {"workload": {"name": "tiny-cnn", "image_size": 16}, "gpus": 2, "batch_size": 8}

    def reason(**pipeline):
        strategy = {"name": "pipeline", "pipeline": {"stages": 2, "micro_batches": 2, **pipeline}}
        return infeasible_reason(exec_config_from_scenario({**base, "strategy": strategy}))

    assert "blocking_sends: false" in reason(schedule="gpipe")  # the simulator's default waits for sends
    assert reason(schedule="1f1b", blocking_sends=False) is None
    assert reason(schedule="message-driven") is None  # never blocks
    with pytest.raises(TrainsimError, match="true or false"):
        PipelineConfig(blocking_sends="yes")


def test_16_bit_runs_say_they_are_autocast_runs():
    # the executor's bf16 is torch.autocast: fp32 weights and gradients; a scenario that leaves
    # mixed_precision at master would be simulated with 16-bit weights and gradients instead
    with pytest.raises(TrainsimError, match="set mixed_precision: autocast") as err:
        exec_config_from_scenario(merge(BASE, {"precision": "bf16"}))
    assert err.value.field == "mixed_precision"
    cfg = exec_config_from_scenario(merge(BASE, {"precision": "bf16", "mixed_precision": "autocast"}))
    assert cfg.precision == "bf16"
