"""Strategy mesh executed for real (calibrate/execute/mesh.py): the zoo's Llama against the simulator's
transformer workload, the executor's configuration and refusals, measured layers split over tensor
parallelism, and (slow) 2-rank gloo runs of FSDP2 and TP whose parameters match one process's."""

import dataclasses
import math

import pytest

torch = pytest.importorskip("torch")

from trainsim.calibrate import zoo  # noqa: E402
from trainsim.calibrate.execute.config import (  # noqa: E402
    DataConfig,
    ExecConfig,
    MeshConfig,
    exec_config_from_scenario,
    infeasible_reason,
)
from trainsim.calibrate.measure.layer_hooks import leaf_modules  # noqa: E402
from trainsim.errors import TrainsimError  # noqa: E402
from trainsim.formats.workload import TimeModel  # noqa: E402
from trainsim.sim.compute.analytic_models import build_analytic  # noqa: E402
from trainsim.sim.parallel.split import split_stages  # noqa: E402

SCENARIO = "scenarios/validate-cpu.yaml"


def _meta(name="llama-tiny", **cfg):
    with torch.device("meta"):
        return zoo.build_model(name, **cfg)


# ---- the model is the simulator's workload -----------------------------------------------------------------

def test_llama_modules_are_the_workloads_layers_in_order():
    names = [name for name, _ in leaf_modules(_meta())]
    workload = build_analytic("transformer", **zoo.LLAMA_TINY)
    assert names == [layer.name for layer in workload.layers]


def test_llama_parameters_equal_the_workloads():
    workload = build_analytic("transformer", **zoo.LLAMA_TINY)
    assert zoo.count_params(_meta()) == sum(layer.param_bytes for layer in workload.layers) // 4
    other = dict(zoo.LLAMA_TINY, num_key_value_heads=2, intermediate_size=512, num_hidden_layers=2)
    workload = build_analytic("transformer", **other)
    assert zoo.count_params(_meta(**other)) == sum(layer.param_bytes for layer in workload.layers) // 4


def test_llama_kinds_are_the_workloads():
    from trainsim.calibrate.measure.describe import describe

    described = {layer.name: layer.kind for layer in describe("llama-tiny", num_hidden_layers=1).layers}
    analytic = {layer.name: layer.kind for layer in
                build_analytic("transformer", **dict(zoo.LLAMA_TINY, num_hidden_layers=1)).layers}
    assert described == analytic


def test_llama_grouped_query_attention_is_standard_attention():
    """The fused projection's group layout and the interleaved SwiGLU compute the textbook block."""
    torch.manual_seed(0)
    cfg = dict(hidden_size=64, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
               intermediate_size=48, vocab_size=32, seq_len=8)
    model = zoo.build_model("llama-tiny", **cfg)
    attn = model.model.layers[0].self_attn
    x = torch.randn(2, 8, 64)
    qkv = attn.qkv_proj(x).view(2, 8, 2, 4, 16)  # per group: 2 query heads, key, value
    q = qkv[:, :, :, :2].reshape(2, 8, 4, 16).transpose(1, 2)
    k, v = (qkv[:, :, :, i].transpose(1, 2).repeat_interleave(2, dim=1) for i in (2, 3))
    cos, sin = attn.rotary.cos[:8], attn.rotary.sin[:8]

    def rope(t):
        a, b = t.chunk(2, dim=-1)
        return t * cos + torch.cat([-b, a], dim=-1) * sin

    scores = rope(q) @ rope(k).transpose(-1, -2) / math.sqrt(16)
    scores = scores.masked_fill(torch.ones(8, 8, dtype=torch.bool).triu(1), float("-inf"))
    want = attn.o_proj((scores.softmax(-1) @ v).transpose(1, 2).reshape(2, 8, 64))
    assert torch.allclose(attn(x), want, atol=1e-5)
    mlp = model.model.layers[0].mlp
    h = mlp.gate_up_proj(x).view(2, 8, 48, 2)
    assert torch.allclose(mlp(x), mlp.down_proj(torch.nn.functional.silu(h[..., 0]) * h[..., 1]), atol=1e-6)


def test_llama_bad_options_name_the_field():
    with pytest.raises(TrainsimError) as exc:
        zoo.build_model("llama-tiny", num_key_value_heads=3)
    assert exc.value.field == "num_key_value_heads"
    with pytest.raises(TrainsimError) as exc:
        zoo.build_model("llama-tiny", dropout=0.1)
    assert exc.value.field == "dropout"


def test_token_inputs_have_the_llamas_sequence_length():
    x, y = zoo.example_batch("llama-tiny", 2, seq_len=16)
    assert x.shape == y.shape == (2, 16)
    assert zoo.input_shape("llama-tiny") == [128]


# ---- configuration and refusals ----------------------------------------------------------------------------

def test_scenario_rows_map_onto_the_mesh():
    cfg = exec_config_from_scenario(SCENARIO, "fsdp-2-llama-tiny")
    assert (cfg.strategy, cfg.model, cfg.ranks, cfg.mesh.zero, cfg.mesh.micro_batch) == (
        "mesh", "llama-tiny", 2, 3, 4)
    assert cfg.local_batch == 4 and infeasible_reason(cfg) is None
    tp = exec_config_from_scenario(SCENARIO, "tp2-sp-llama-tiny")
    assert (tp.mesh.tp, tp.mesh.sequence_parallel, tp.mesh.dp(tp.ranks), tp.local_batch) == (2, True, 1, 4)


def _cfg(**mesh):
    return ExecConfig(model="llama-tiny", strategy="mesh", ranks=2, batch_size=8, mesh=MeshConfig(**mesh))


@pytest.mark.parametrize(("mesh", "words"), [
    ({"zero": 2}, "strategy.mesh.zero 2 is not executed"),
    ({"zero": 1}, "strategy.mesh.zero 1 is not executed"),
    ({"zero": 0}, "zero 0 over 2 data/context-parallel ranks"),
    ({"cp": 2, "zero": 3}, "it runs on CUDA ranks"),
    ({"pp": 2}, "strategy.mesh.pp 1"),
    ({"zero": 3, "shard": 1}, "strategy.mesh.shard (HSDP)"),
])
def test_what_the_executor_does_not_run_is_skipped_with_the_field(mesh, words):
    assert words in infeasible_reason(_cfg(**mesh))


def test_only_the_llama_is_sharded_over_a_mesh():
    cfg = ExecConfig(model="gpt2-small", strategy="mesh", ranks=2, batch_size=8, mesh=MeshConfig(zero=3))
    assert "llama-tiny" in infeasible_reason(cfg)


def test_tp_must_split_whole_key_value_groups():
    cfg = ExecConfig(model="llama-tiny", model_cfg={"num_key_value_heads": 1}, strategy="mesh", ranks=2,
                     batch_size=4, mesh=MeshConfig(tp=2))
    assert "key/value heads" in infeasible_reason(cfg)


@pytest.mark.parametrize(("mesh", "field"), [
    ({"tp": 1, "sequence_parallel": True}, "mesh.sequence_parallel"),
    ({"zero": 3, "micro_batch": 3}, "batch_size"),
    ({"tp": 4}, "mesh.tp"),
    ({"zero": 5}, "mesh.zero"),
])
def test_bad_meshes_name_the_field(mesh, field):
    with pytest.raises(TrainsimError) as exc:
        _cfg(**mesh)
    assert exc.value.field == field


# ---- measured layers split over tensor parallelism ---------------------------------------------------------

def _measured(workload):
    """``workload`` with every layer timed: t(b) = 1 ms + b x (1 ms per GFLOP of the layer, + 0.1 ms)."""
    layers = []
    for layer in workload.layers:
        per = 1e-3 * (layer.flops_forward_per_sample / 1e9) + 1e-4
        fwd = TimeModel.from_points([(b, 1e-3 + b * per, 0.0) for b in (1, 2, 4)])
        bwd = TimeModel.from_points([(b, 2e-3 + 2 * b * per, 0.0) for b in (1, 2, 4)])
        layers.append(layer.model_copy(update={"forward": fwd, "backward": bwd}))
    return workload.model_copy(update={"layers": layers})


def test_measured_layers_split_by_their_roles_share():
    workload = _measured(build_analytic("transformer", **dict(zoo.LLAMA_TINY, num_hidden_layers=1)))
    whole = {layer.name: layer for layer in workload.layers}
    for sp in (False, True):
        split = {layer.name: layer for layer in
                 split_stages(workload, tp=2, sequence_parallel=sp)[0].workload.layers}
        qkv = "model.layers.0.self_attn.qkv_proj"
        # a rank's half of the columns at batch 4 is the whole layer's work at batch 2, with its call cost
        assert split[qkv].forward.at(4) == pytest.approx(whole[qkv].forward.at(2))
        assert split[qkv].backward.at(8) == pytest.approx(whole[qkv].backward.at(4))
        assert split[qkv].forward.at(16) == pytest.approx(whole[qkv].forward.fitted(8))
        norm = "model.layers.0.input_layernorm"
        want = whole[norm].forward.at(2) if sp else whole[norm].forward.at(4)
        assert split[norm].forward.at(4) == pytest.approx(want)
        assert split[qkv].param_bytes == whole[qkv].param_bytes / 2


def test_measured_layers_are_refused_under_expert_parallelism():
    workload = _measured(build_analytic("mixtral-8x7b", num_hidden_layers=1, seq_len=64))
    with pytest.raises(TrainsimError) as exc:
        split_stages(workload, ep=2)
    assert exc.value.field == "strategy.mesh.ep"


# ---- real runs ---------------------------------------------------------------------------------------------

def test_allocator_peak_counts_an_iterations_tensors():
    from trainsim.calibrate.execute.mesh import AllocatorPeak

    probe = AllocatorPeak()
    probe.start()
    x = torch.ones(1 << 20)  # 4 MiB
    y = x * 2  # and 4 more while both live
    del x, y
    probe.stop(persistent=1000)
    assert 8 << 20 <= probe.peak - 1000 < 9 << 20


SMALL = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=96, vocab_size=128, seq_len=16)


def _run(strategy, ranks, batch, **kw):
    return ExecConfig(model="llama-tiny", model_cfg=SMALL, strategy=strategy, ranks=ranks, batch_size=batch,
                      iterations=3, warmup=1, optimizer="momentum", lr=0.05, capture_params=True,
                      data=DataConfig(workers=0), oversubscribe=True, **kw)


@pytest.mark.slow
def test_fsdp_and_tp_on_two_gloo_ranks_train_as_one_process():
    """The sharding is real: 2 ranks of FSDP2 (global batch 8) and of TP with and without sequence
    parallelism (batch 4), and both with recomputation, end with the parameters one process reaches on the
    same batches."""
    from trainsim.calibrate.execute.executor import run_many

    single8, single4 = run_many([_run("single", 1, 8), _run("single", 1, 4)])
    fsdp, tp_sp, tp, full, selective = run_many([
        _run("mesh", 2, 8, mesh=MeshConfig(zero=3, micro_batch=2)),
        _run("mesh", 2, 4, mesh=MeshConfig(tp=2, sequence_parallel=True, micro_batch=4)),
        _run("mesh", 2, 4, mesh=MeshConfig(tp=2, micro_batch=2)),
        _run("mesh", 2, 8, mesh=MeshConfig(zero=3, micro_batch=4, recompute="full")),
        _run("mesh", 2, 4, mesh=MeshConfig(tp=2, micro_batch=4, recompute="selective"))])
    pairs = ((fsdp, single8), (tp_sp, single4), (tp, single4), (full, single8), (selective, single4))
    for mine, ref in pairs:
        for rank in mine.ranks:
            moved = ref.ranks[0].params - single_start(ref)
            assert abs(rank.params - ref.ranks[0].params).max() <= 1e-4 * abs(moved).max()
        assert mine.memory_measure == "cpu.allocator_peak" and min(mine.peak_memory_bytes) > 0
    assert tp.losses == pytest.approx(single4.losses, rel=1e-5)
    # and each rank held only its shards: FSDP half of every tensor (padded to even rows), TP half of all but
    # the replicated norms
    whole = single_start(single8).size
    norms = (2 * SMALL["num_hidden_layers"] + 1) * SMALL["hidden_size"]
    for rank in fsdp.ranks:
        assert whole / 2 <= rank.extra["local_params"] <= whole / 2 + norms
    for rank in tp.ranks + tp_sp.ranks:
        assert rank.extra["local_params"] == (whole - norms) / 2 + norms


def single_start(measurement):
    """The parameters before training: the model every rank builds from the seed."""
    torch.manual_seed(measurement.config["seed"])
    model = zoo.build_model("llama-tiny", **SMALL)
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy()


@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_fsdp_on_one_gpu_runs_its_collectives_and_reads_cuda_memory():
    from trainsim.calibrate.execute.executor import run

    cfg = _run("mesh", 1, 8, mesh=MeshConfig(zero=3, micro_batch=8))
    measured = run(dataclasses.replace(cfg, device="cuda", oversubscribe=False))
    assert measured.memory_measure == "cuda.max_memory_allocated"
    assert measured.peak_memory_bytes[0] > 0 and measured.median_s > 0


@pytest.mark.slow
def test_tp_by_fsdp_on_a_two_dimensional_mesh_trains_as_one_process():
    """4 gloo ranks (oversubscribed: a correctness check, not a timing) as dp 2 x tp 2 with sequence
    parallelism and FSDP2 over the data-parallel pairs end where one process does."""
    from trainsim.calibrate.execute.executor import run

    single = run(_run("single", 1, 8))
    mesh = run(_run("mesh", 4, 8, mesh=MeshConfig(tp=2, zero=3, sequence_parallel=True, micro_batch=4)))
    moved = single.ranks[0].params - single_start(single)
    whole = moved.size
    for rank in mesh.ranks:
        assert abs(rank.params - single.ranks[0].params).max() <= 1e-4 * abs(moved).max()
        assert rank.extra["local_params"] < whole / 2  # a quarter of the split tensors, half of the norms
