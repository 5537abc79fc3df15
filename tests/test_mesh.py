"""Strategy mesh: the device mesh's groups, a transformer split over it, and the simulated iteration's
time and memory against hand counts."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from trainsim.cli import app
from trainsim.errors import TrainsimError
from trainsim.formats.workload import load_workload
from trainsim.resolve import resolve
from trainsim.sim.compute.costs import STATE_BYTES
from trainsim.sim.parallel.layout import Mesh
from trainsim.sim.parallel.split import split_stages
from trainsim.sim.simulation import Simulation

GPUS = tuple(f"g{i}" for i in range(16))
GIB = 2**30


def scenario(mesh: dict, **top) -> dict:
    return {
        "name": "mesh",
        "topology": "dgx-h100",
        "workload": {"name": "llama3-8b", "seq_len": 2048},
        "strategy": {"name": "mesh", "mesh": mesh},
        "batch_size": 8,
        "precision": "bf16",
        "optimizer": {"name": "adam"},
        "iterations": 1,
        "warmup_iterations": 0,
        **top,
    }


def simulate(mesh: dict, **top):
    sim = Simulation(resolve(scenario(mesh, **top)))
    return sim, sim.run()


def test_ranks_lay_out_tensor_innermost_and_pipeline_outermost():
    mesh = Mesh(GPUS, tp=2, cp=2, pp=2, ep=2)
    assert mesh.dp == 2
    assert mesh.coords("g5") == {"tp": 1, "cp": 0, "dp": 1, "pp": 0}
    assert mesh.group("g5", "tp") == ["g4", "g5"]
    assert mesh.group("g5", "cp") == ["g5", "g7"]
    assert mesh.group("g5", "dp") == ["g1", "g5"]
    assert mesh.group("g5", "pp") == ["g5", "g13"]
    assert mesh.group("g5", "ep") == ["g1", "g5"]
    assert mesh.representatives() == {
        "g0": [f"g{i}" for i in range(8)],
        "g8": [f"g{i}" for i in range(8, 16)],
    }
    hsdp = Mesh(GPUS, shard=4)
    assert hsdp.group("g5", "shard") == ["g4", "g5", "g6", "g7"]
    assert hsdp.group("g5", "replica") == ["g1", "g5", "g9", "g13"]


@pytest.mark.parametrize(
    ("kwargs", "field", "says"),
    [
        ({"tp": 3}, "strategy.mesh", "does not divide the 16 GPUs"),
        ({"ep": 4, "tp": 8}, "strategy.mesh.ep", "ep 4 does not divide the data-parallel degree 2"),
        ({"shard": 3}, "strategy.mesh.shard", "shard 3 does not divide"),
    ],
)
def test_a_mesh_that_does_not_fit_the_gpus_is_one_line(kwargs, field, says):
    with pytest.raises(TrainsimError, match=says) as err:
        Mesh(GPUS, **kwargs)
    assert err.value.field == field


def test_a_stage_ranks_share_is_its_split_of_every_layer():
    full = load_workload("llama3-8b")
    tp, pp = 4, 2
    stages = split_stages(full, tp=tp, pp=pp, sequence_parallel=True)
    assert [len(s.blocks) for s in stages] == [17, 17]  # 16 blocks each, the embedding and the head
    params = sum(layer.param_bytes for s in stages for layer in s.workload.layers)
    norms = sum(layer.param_bytes for layer in full.layers if layer.kind == "rmsnorm")
    # every rank holds 1/tp of the split matrices and a whole copy of the norms' weights
    assert params * tp == pytest.approx(full.param_bytes - norms + tp * norms, rel=1e-9)
    flops = sum(layer.flops_forward_per_sample for s in stages for layer in s.workload.layers)
    assert flops * tp == pytest.approx(full.flops_forward_per_sample, rel=1e-9)
    assert stages[0].blocks[0].name == "pre" and stages[-1].blocks[-1].name == "post"
    assert stages[0].blocks[1].row_layers == 2 and stages[0].blocks[1].attention


@pytest.mark.parametrize(
    ("kwargs", "field", "says"),
    [
        ({"tp": 3}, "strategy.mesh.tp", "does not divide the 32 attention heads"),
        ({"pp": 5}, "strategy.mesh.pp", "pp 5 does not divide the 32 blocks"),
        ({"ep": 2}, "strategy.mesh.ep", "a model without experts"),
        ({"cp": 3}, "strategy.mesh.cp", "does not split into 2 x cp"),
        ({"pp": 2, "stage_blocks": [10, 20]}, "strategy.mesh.stage_blocks", "add up to 30"),
    ],
)
def test_a_mesh_the_model_cannot_take_is_one_line(kwargs, field, says):
    with pytest.raises(TrainsimError, match=says) as err:
        split_stages(load_workload("llama3-8b"), **kwargs)
    assert err.value.field == field


def test_fsdp_holds_one_eighth_of_the_state_and_the_activations_of_one_micro_batch():
    sim, result = simulate({"zero": 3})
    n_params = load_workload("llama3-8b").num_params
    at_peak = result.gpus[0].memory_at_peak
    # bf16 weights, and as many gradients, sharded over 8; fp32 master weights and Adam's two moments too
    assert at_peak["params"] == pytest.approx(2 * n_params / 8, rel=1e-6)
    assert at_peak["optimizer_state"] == pytest.approx(
        STATE_BYTES["adam"] * n_params / 8 + 4 * n_params / 8, rel=1e-6
    )
    assert result.gpus[0].memory_peak_bytes < 30 * GIB
    assert result.breakdown_s["compute"] > 0.9 * result.iteration_time_s  # the gathers hide under compute
    # every GPU stands for itself in a one-stage mesh of 8: one simulated
    assert result.stats["simulated_ranks"] == 1 and len({g.memory_peak_bytes for g in result.gpus}) == 1


def test_a_1f1b_pipeline_runs_m_micro_batches_plus_the_fill():
    from trainsim.sim.parallel.stage_costs import Layout, ModelCosts, stage_ranges

    sim, result = simulate({"pp": 4}, gpus=4, batch_size=16)
    model = ModelCosts(sim.workload, sim.machine.gpus["gpu0"].device, "bf16", "adam")
    table = model.blocks(Layout(pp=4))
    ranges = stage_ranges(model.n_blocks, 4)
    per_stage = [sum(table.forward[lo:hi]) + sum(table.backward[lo:hi]) for lo, hi in ranges]
    step = max(per_stage)  # the slowest stage's micro-batch
    fill = sum(per_stage) - step
    optimizer = max(model.step_seconds(sum(table.num_params[lo:hi])) for lo, hi in ranges)
    assert result.iteration_time_s == pytest.approx(16 * step + fill + optimizer, rel=0.02)
    first, last = result.gpus[0], result.gpus[3]
    assert first.memory_at_peak["activations"] > last.memory_at_peak["activations"]  # 1F1B: 4 vs 1 in flight


def test_interleaved_virtual_stages_shrink_the_bubble():
    idle = {}
    for v in (1, 2, 4):
        _, result = simulate({"pp": 4, "virtual_stages": v}, gpus=4, batch_size=16)
        idle[v] = result.breakdown_s["idle"]
        assert result.breakdown_s["compute"] == pytest.approx(0.598, rel=0.05)
    assert idle[1] > idle[2] > idle[4]


def test_an_interleaved_pipeline_needs_micro_batches_in_groups_of_pp():
    with pytest.raises(TrainsimError, match="not a multiple of pp 4"):
        simulate({"pp": 4, "virtual_stages": 2}, gpus=4, batch_size=6)
    with pytest.raises(TrainsimError, match="virtual_stages interleaves a 1f1b pipeline"):
        simulate({"virtual_stages": 2})


def test_tensor_parallelism_pays_its_all_reduces_and_sequence_parallelism_the_same_bytes():
    _, plain = simulate({"tp": 8})
    _, sp = simulate({"tp": 8, "sequence_parallel": True})
    comm = [o for o in plain.machine.ops if o.op.startswith("tp_")]
    assert {o.op for o in comm} == {"tp_allreduce"}
    # two row layers per block, a pass each way, 32 blocks, 8 micro-batches, plus the embedding and head
    assert len(comm) == 8 * 2 * (32 * 2 + 2)
    assert {o.op for o in sp.machine.ops if o.op.startswith("tp_")} == {"tp_allgather", "tp_reduce_scatter"}
    assert sp.gpus[0].memory_at_peak["activations"] < plain.gpus[0].memory_at_peak["activations"]


def test_full_recompute_keeps_block_inputs_and_runs_the_forward_again():
    _, plain = simulate({"zero": 3})
    _, full = simulate({"zero": 3, "recompute": "full"})
    assert full.breakdown_s["compute"] == pytest.approx(plain.breakdown_s["compute"] * 4 / 3, rel=0.05)
    # what stays is the blocks' inputs and, at the head's backward, the loss's two fp32 gradients of the
    # logits (a fixed 2 x seq x vocab x 4 bytes that recomputation cannot drop)
    assert full.gpus[0].memory_at_peak["activations"] < 0.3 * plain.gpus[0].memory_at_peak["activations"]


def test_mirroring_the_stages_is_exact():
    mesh = {"tp": 2, "pp": 2, "zero": 3}
    _, mirrored = simulate(mesh)
    _, every = simulate({**mesh, "mirror": False})
    assert mirrored.iteration_times_s == every.iteration_times_s
    assert [g.memory_peak_bytes for g in mirrored.gpus] == [g.memory_peak_bytes for g in every.gpus]
    assert every.stats["simulated_ranks"] == 8 and mirrored.stats["simulated_ranks"] == 2


def test_flow_and_analytic_collectives_agree_for_a_mesh():
    mesh = {"tp": 2, "zero": 3}
    _, flow = simulate(mesh)
    _, analytic = simulate(mesh, strategy={"name": "mesh", "collectives": "analytic", "mesh": mesh})
    assert analytic.iteration_time_s == pytest.approx(flow.iteration_time_s, rel=0.02)


def test_expert_parallelism_all_to_alls_and_splits_the_experts():
    over = {
        "workload": {"name": "mixtral-8x7b", "seq_len": 1024},
        "topology": "dgx-h100-4node",
        "batch_size": 16,
    }
    _, result = simulate({"ep": 8, "zero": 1, "tp": 2, "sequence_parallel": True}, **over)
    assert {o.op for o in result.machine.ops if o.op.startswith("ep_")} == {"ep_dispatch", "ep_combine"}
    _, fewer = simulate({"ep": 2, "zero": 1, "tp": 2, "sequence_parallel": True}, **over)
    assert result.gpus[0].memory_at_peak["params"] < fewer.gpus[0].memory_at_peak["params"]


def test_cli_bad_mesh_is_one_line_naming_the_file(tmp_path):
    import yaml

    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(scenario({"tp": 3})))
    result = CliRunner().invoke(app, ["simulate", str(path)])
    assert result.exit_code == 2
    assert result.output.strip() == (
        f"error: {path}: strategy.mesh: tp x cp x pp = 3 x 1 x 1 = 3 does not divide "
        "the 8 GPUs of the run; valid: a product that divides 8 (data parallelism "
        "takes what is left)"
    )


def test_tensor_parallelism_across_machines_is_allowed_with_a_note(tmp_path):
    import yaml

    doc = scenario({"tp": 16, "sequence_parallel": True}, topology="dgx-h100-4node", gpus=16, batch_size=1)
    doc["workload"] = {"name": "llama3-8b", "seq_len": 2048, "num_hidden_layers": 2}
    doc["strategy"]["collectives"] = "analytic"
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(doc))
    result = CliRunner().invoke(app, ["simulate", str(path)])
    assert result.exit_code == 0, result.output
    note = ("note: tensor parallelism of 16 (tp 16) crosses the network between machines: its collectives on "
            "every layer leave the NVLink domain")
    assert note in " ".join(result.output.split())
    inside = CliRunner().invoke(app, ["simulate", str(path), "--set", "strategy.mesh.tp=8", "--set",
                                      "batch_size=2", "--json"])
    assert inside.exit_code == 0 and '"notes": []' in inside.output
