"""sim/parallel/memory.py: the closed-form per-GPU memory of a layout against the mesh strategy's simulated
peak (equal, stage by stage), against hand counts, and against Korthikanti et al. 2022's activation
formulas."""

from __future__ import annotations

import dataclasses
import random

import pytest

from trainsim.formats.workload import load_workload
from trainsim.resolve import resolve
from trainsim.sim.compute.analytic_models import build_analytic
from trainsim.sim.compute.costs import STATE_BYTES
from trainsim.sim.core.devices import get_device
from trainsim.sim.parallel import memory
from trainsim.sim.parallel.memory import layout_memory, stage_memory
from trainsim.sim.parallel.stage_costs import BlockTable, Layout, ModelCosts
from trainsim.sim.simulation import Simulation

GIB = 2**30
H100 = get_device("h100-sxm")


def scenario(mesh: dict, *, topology="dgx-h100", workload=None, batch=8, gpus=None) -> dict:
    doc = {"name": "memory", "topology": topology,
           "workload": workload or {"name": "llama3-8b", "seq_len": 2048},
           "strategy": {"name": "mesh", "collectives": "analytic", "mesh": mesh}, "batch_size": batch,
           "precision": "bf16", "optimizer": {"name": "adam"}, "iterations": 1, "warmup_iterations": 0}
    if gpus:
        doc["gpus"] = gpus
    return doc


def simulated_and_closed(mesh: dict, **kw):
    run = resolve(scenario(mesh, **kw))
    result = Simulation(run, record=False).run()
    model = ModelCosts(run.workload, H100, "bf16", "adam")
    stages = stage_memory(model, Layout.of(mesh), len(run.ranks), run.scenario.batch_size)
    per_stage = len(run.ranks) // Layout.of(mesh).pp
    return [result.gpus[s * per_stage] for s in range(len(stages))], stages, model


CASES = {
    "fsdp": ({"zero": 3}, {}),
    "fsdp, 4 micro-batches": ({"zero": 3}, {"batch": 32}),
    "tp+sp": ({"tp": 8, "sequence_parallel": True}, {}),
    "pp 1f1b": ({"pp": 4}, {"gpus": 4, "batch": 16}),
    "tp x pp": ({"tp": 2, "pp": 4}, {"batch": 16}),
    "zero-1": ({"zero": 1, "tp": 2}, {"batch": 16}),
    "hsdp": ({"zero": 3, "shard": 2, "micro_batch": 2}, {"batch": 32}),
    "zero-2 gpipe": ({"zero": 2, "tp": 2, "pp": 2, "schedule": "gpipe"}, {"batch": 16}),
    "full recompute": ({"zero": 3, "tp": 2, "pp": 2, "recompute": "full"}, {"batch": 16}),
    "selective": ({"zero": 1, "tp": 2, "pp": 2, "recompute": "selective", "sequence_parallel": True},
                  {"batch": 16}),
    "interleaved": ({"pp": 4, "tp": 2, "virtual_stages": 2, "zero": 1}, {"batch": 32}),
    "interleaved, uneven": ({"pp": 4, "virtual_stages": 2, "stage_blocks": [3, 4, 4, 5, 5, 4, 4, 3]},
                            {"gpus": 4, "batch": 16}),
    "experts": ({"ep": 4, "zero": 1, "tp": 2, "sequence_parallel": True},
                {"workload": {"name": "mixtral-8x7b", "seq_len": 1024}, "batch": 16}),
    "zb-h1": ({"pp": 4, "schedule": "zb-h1"}, {"gpus": 4, "batch": 16}),
    "zb-h1, fsdp, full recompute": ({"zero": 3, "tp": 2, "pp": 2, "recompute": "full", "schedule": "zb-h1"},
                                    {"batch": 16}),
}


@pytest.mark.parametrize("name", list(CASES))
def test_the_closed_form_equals_the_simulated_peak_stage_by_stage(name):
    mesh, kw = CASES[name]
    gpus, stages, _ = simulated_and_closed(mesh, **kw)
    for gpu, stage in zip(gpus, stages, strict=True):
        assert stage.peak == pytest.approx(gpu.memory_peak_bytes, rel=1e-9), (name, stage.stage)
        at_peak = gpu.memory_at_peak
        assert stage.params == pytest.approx(at_peak["params"], rel=1e-9)
        assert stage.optimizer_state == pytest.approx(at_peak["optimizer_state"], rel=1e-9)
        assert stage.activations == pytest.approx(at_peak.get("activations", 0.0), rel=1e-9, abs=1)
        assert stage.gathered_params == pytest.approx(at_peak.get("gathered_params", 0.0), rel=1e-9, abs=1)
        assert stage.grads == pytest.approx(at_peak.get("grads", 0.0), rel=1e-9, abs=1)


def test_fsdp_by_hand():
    # Llama 3 8B on 8 GPUs, ZeRO-3, one sequence of 2048 per GPU: bf16 weights over 8, fp32 master and Adam's
    # moments over 8, the whole micro-batch's activations and the loss's gradients, the LM head's gathered 7/8
    # and the last block's
    model = ModelCosts(load_workload("llama3-8b"), H100, "bf16", "adam")
    n = model.workload.num_params
    m = layout_memory(model, Layout(zero=3), 8, 8)
    assert m.params == pytest.approx(2 * n / 8, rel=1e-9)
    assert m.optimizer_state == pytest.approx((STATE_BYTES["adam"] + 4) * n / 8, rel=1e-9)
    table = model.blocks(Layout(zero=3))
    # at the head's backward: every block's activations and the loss's gradients of the logits
    assert m.activations == pytest.approx(sum(table.saved) + table.grad_held[-1], rel=1e-9)
    assert m.gathered_params == pytest.approx(7 / 8 * (table.params[-1] + table.params[-2]), rel=1e-9)
    assert m.peak == pytest.approx(m.params + m.optimizer_state + m.activations + m.gathered_params
                                   + m.grads + m.workspaces, rel=1e-12)


def test_ddp_holds_everything_and_zero_shards_it_stage_by_stage():
    model = ModelCosts(load_workload("llama3-8b"), H100, "bf16", "adam")
    P = sum(model.blocks(Layout()).params)
    ddp = layout_memory(model, Layout(), 8, 8)
    assert ddp.params == pytest.approx(P) and ddp.optimizer_state == pytest.approx(6 * P)  # 2 + 4 + 8 per 2
    for zero, grads_over in ((1, 1), (2, 8), (3, 8)):
        m = layout_memory(model, Layout(zero=zero), 8, 8)
        assert m.optimizer_state == pytest.approx(6 * P / 8)
        assert m.params == pytest.approx(P / 8 if zero == 3 else P)
        assert max(m.grads, 0) <= P / grads_over * (1 + 1e-9)


def test_selective_recomputation_keeps_the_attention_cores_inputs():
    # flash attention: the core saves Q, K, V, its output and the fp32 log-sum-exp; recomputing it needs
    # Q, K, V, and its output is the output projection's saved input: only the log-sum-exp goes
    model = ModelCosts(load_workload("llama3-8b"), H100, "bf16", "adam")
    layout = Layout(tp=2, sequence_parallel=True, recompute="selective")
    table = model.blocks(layout)
    b = 1  # a transformer block
    seq, heads, kv, d = 8192, 32, 8, 128  # the preset trains on 8K-token sequences
    qkv_out = seq * (heads * d + 2 * kv * d + heads * d) * 2 / 2  # bf16, over tp 2
    # the fp32 log-sum-exp, over tp 2; the shipped workload is fp32 and bf16 training scales every saved
    # byte of it by 2 / 4 (sim/compute/costs.py), this fp32 statistic too
    lse = heads * seq * 4 / 2 / 2
    assert table.core_inputs[b] == pytest.approx(qkv_out)
    assert table.core_saved[b] == pytest.approx(qkv_out + lse)
    assert memory.kept_bytes(table, b, layout, 0.0) == pytest.approx(table.saved[b] - lse)


def test_full_recomputation_brings_one_blocks_activations_back_in_its_backward():
    model = ModelCosts(load_workload("llama3-8b"), H100, "bf16", "adam")
    layout = Layout(zero=3, recompute="full")
    m = layout_memory(model, layout, 8, 8)
    table = model.blocks(layout)
    hidden = model.hidden_bytes(layout)
    # the worst instant is the LM head's backward with its logits recomputed: its activations are back
    assert m.activations >= table.saved[-1] - hidden


def test_expert_state_shards_over_the_ranks_that_hold_those_experts():
    model = ModelCosts(load_workload("mixtral-8x7b"), H100, "bf16", "adam")
    layout = Layout(ep=8, zero=1, tp=2, sequence_parallel=True, micro_batch=1)
    table = model.blocks(layout)
    experts, dense = sum(table.experts), sum(table.params) - sum(table.experts)
    m = layout_memory(model, layout, 128, 64)  # dp 64: shard 64, experts over 64 / 8
    assert m.optimizer_state == pytest.approx(6 * (dense / 64 + experts / 8), rel=1e-9)


def test_alike_chunks_closed_form_equals_the_replay():
    rng = random.Random(3)
    for _ in range(200):
        pp, v = rng.choice([2, 4, 8]), rng.choice([2, 3, 4])
        n = rng.randint(1, 5)
        zero = rng.choice([0, 1, 2, 3])
        table = BlockTable(
            names=[f"block{i}" for i in range(n)], forward=[1.0] * n, backward=[2.0] * n, core=[0.5] * n,
            params=[rng.uniform(1, 10) for _ in range(n)], experts=[0.0] * n, num_params=[1.0] * n,
            saved=[rng.uniform(1, 20) for _ in range(n)], core_saved=[0.0] * n, core_inputs=[0.0] * n,
            row_layers=[2] * n, attention=[True] * n, moe=[False] * n, column_inputs=[0.0] * n,
            kinds=list(range(n)))
        layout = Layout(pp=pp, virtual_stages=v, zero=zero, recompute=rng.choice(["none", "full"]))
        terms = memory._stage_terms(table, 0, n, layout, 8 if zero else 1, 0.5)
        M, s = pp * rng.randint(1, 6), rng.randrange(pp)
        replay = memory._interleaved([tuple(terms) for _ in range(v)], layout, s, M)  # alike, not the same
        closed = memory._alike_chunks(terms, layout, s, M)
        assert replay[0] == closed[0]
        assert replay[1] == pytest.approx(closed[1], abs=1e-9)


# ---- Korthikanti et al. 2022 ----------------------------------------------------------------------------

def gpt3_block(tp=1, sp=False, recompute="none", attention="flash", seq=2048, layers=2):
    """One transformer block's saved bytes per sequence (b = 1) of a GPT-3 175B-shaped model (16-bit)."""
    wl = build_analytic("gpt3-175b", num_hidden_layers=layers, attention=attention, dropout=0.1, seq_len=seq,
                        dtype="bfloat16")
    model = ModelCosts(wl, H100, "bf16", "adam")
    layout = Layout(tp=tp, sequence_parallel=sp, recompute=recompute)
    table = model.blocks(layout)
    hidden = model.hidden_bytes(layout) / (tp if sp else 1)
    b = table.names.index("block1")
    return memory.kept_bytes(table, b, layout, hidden)


S, H, A = 2048, 12288, 96
SBH = S * H


@pytest.mark.parametrize(("kwargs", "formula"), [
    ({}, 34),  # flash: the 5as/h score terms are not stored
    ({"tp": 8}, 10 + 24 / 8),
    ({"tp": 8, "sp": True}, 34 / 8),
    ({"tp": 8, "sp": True, "recompute": "selective"}, 34 / 8),
    ({"recompute": "full"}, 2),
    ({"tp": 8, "sp": True, "recompute": "full"}, 2 / 8),
])
def test_activations_per_layer_are_korthikantis(kwargs, formula):
    assert gpt3_block(**kwargs) == pytest.approx(formula * SBH, rel=0.05)


def test_a_column_parallel_linears_input_is_whole_on_every_tensor_parallel_rank():
    # Korthikanti's 10 sbh replicated under tensor parallelism without sequence parallelism hold the inputs
    # of QKV and of the MLP's first linear (2 sbh each), whole on every rank; with sequence parallelism
    # each rank keeps 1/tp of them
    table_tp = gpt3_block(tp=8)
    assert table_tp - gpt3_block(tp=8, sp=True) == pytest.approx((10 - 10 / 8) * SBH, rel=0.02)


def test_unfused_attention_keeps_two_of_korthikantis_five_score_bytes():
    # Korthikanti's 5as^2b: the softmax output (2), the attention dropout's mask (1) and its output (2); the
    # workload models no dropout on the attention probabilities, so it keeps the softmax output and the
    # causal mask only (one byte per score, per batch)
    kept = gpt3_block(attention="unfused")
    assert kept == pytest.approx((34 + 2 * A * S / H) * SBH + S * S, rel=1e-3)
    # and selective recomputation drops exactly what the core keeps beyond its inputs
    assert gpt3_block(attention="unfused", tp=8, sp=True, recompute="selective") == pytest.approx(
        34 / 8 * SBH, rel=0.05)


def test_a_layout_is_a_value_the_scenario_takes_back():
    layout = Layout(tp=8, pp=4, zero=1, sequence_parallel=True, stage_blocks=(7, 9, 9, 7))
    assert Layout.of(layout.mesh_options()) == layout
    assert dataclasses.replace(layout, tp=4).label(512) == "tp4 cp1 pp4 dp32 z1 sp mb1 1f1b"
