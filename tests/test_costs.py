"""Per-rank costs: bytes per parameter by precision and optimizer, the optimizer step, layer times."""

import pytest
from simtools import tiny_workload

from trainsim.errors import TrainsimError
from trainsim.formats.workload import Workload, load_workload
from trainsim.sim.compute.costs import optimizer_traffic, rank_costs, state_bytes
from trainsim.sim.compute.roofline import DEFAULT_EFFICIENCY, layer_times
from trainsim.sim.core.devices import get_device


def test_mixed_precision_adam_is_16_bytes_per_parameter():
    # REFERENCE.md: 2 (fp16 weights) + 2 (grads) + 12 (fp32 master, m, v)
    wl = load_workload("tiny-cnn")
    costs = rank_costs(wl, get_device("a100"), 4, "fp16", "adam")
    psi = wl.num_params
    assert costs.param_bytes == 2 * psi and costs.grad_bytes == 2 * psi and costs.state_bytes == 12 * psi
    fp32 = rank_costs(wl, get_device("a100"), 4, "fp32", "momentum")
    assert fp32.param_bytes == 4 * psi and fp32.grad_bytes == 4 * psi and fp32.state_bytes == 4 * psi
    assert state_bytes(psi, "fp32", "sgd") == 0


def test_activations_scale_with_precision_and_batch():
    wl = load_workload("tiny-cnn")
    a = rank_costs(wl, get_device("a100"), 8, "fp32", "sgd")
    b = rank_costs(wl, get_device("a100"), 8, "bf16", "sgd")
    assert a.saved_bytes == pytest.approx(wl.saved_activation_bytes(8))
    assert b.saved_bytes == pytest.approx(a.saved_bytes / 2)
    assert a.input_bytes == 8 * wl.input.bytes_per_sample


def test_layer_times_come_from_the_roofline_module():
    wl = load_workload("resnet50")
    device = get_device("v100")
    costs = rank_costs(wl, device, 32, "fp32", "sgd")
    times = layer_times(wl, device, 32, "fp32")
    assert costs.forward_s == [f for f, _ in times] and costs.backward_s == [b for _, b in times]


def test_unmeasured_optimizer_step_is_memory_bound():
    wl = load_workload("resnet50")
    device = get_device("a100")
    psi = wl.num_params
    costs = rank_costs(wl, device, 32, "fp32", "adam")
    # Adam fp32: read grads (4), read+write weights (8), read+write m and v (16) = 28 B per parameter
    assert optimizer_traffic(psi, "fp32", "adam") == 28 * psi
    # at the share of the memory bandwidth streaming kernels reach, as the roofline's elementwise layers
    assert costs.step_s == pytest.approx(28 * psi / (device.memory_bandwidth * DEFAULT_EFFICIENCY.memory))
    # SGD: read grads, read and write weights
    assert optimizer_traffic(psi, "fp32", "sgd") == 12 * psi


def test_optimizer_step_measured_on_another_gpu_scales_by_memory_bandwidth():
    """Measured 2 ms on an A100 40 GB (1555 GB/s): on an H100 SXM (3350 GB/s) 2 ms x 1555 / 3350."""
    layers = [{"name": "fc", "fwd": 1e-3, "bwd": 2e-3, "params": 4_000_000}]
    wl = Workload.model_validate(tiny_workload(layers, batch=8, step_s=2e-3, device_spec="a100-40gb"))
    here = rank_costs(wl, get_device("a100-40gb"), 8, "fp32", "adam")
    h100 = get_device("h100-sxm")
    there = rank_costs(wl, h100, 8, "fp32", "adam")
    assert here.step_s == pytest.approx(2e-3)
    a100 = get_device("a100-40gb")
    assert there.step_s == pytest.approx(2e-3 * a100.memory_bandwidth / h100.memory_bandwidth)


def test_unattributed_time_of_a_calibrated_workload():
    from types import SimpleNamespace

    from trainsim.formats.provenance import IterationRecord
    from trainsim.sim.compute.costs import unattributed_s

    def wl(points):
        iteration = IterationRecord(unattributed=points) if points is not None else None
        return SimpleNamespace(provenance=SimpleNamespace(iteration=iteration))

    points = [[16, -0.001], [32, 0.002], [64, 0.004]]
    assert unattributed_s(wl(points), 48) == pytest.approx(0.003)  # linear between measured sizes
    assert unattributed_s(wl(points), 128) == pytest.approx(0.008)  # proportional beyond them
    assert unattributed_s(wl(points), 16) == 0.0  # negative: the hooks' own cost, not work
    assert unattributed_s(wl(None), 32) == 0.0


def _without_autocast_bytes(wl):
    layers = [layer.model_copy(update={"autocast": None}) for layer in wl.layers]
    return wl.model_copy(update={"layers": layers})


def test_autocast_uses_the_workloads_bytes_under_autocast_and_master_scales_its_bytes():
    from trainsim.formats.workload import AutocastBytes

    wl = _without_autocast_bytes(load_workload("tiny-cnn"))
    measured = AutocastBytes(saved_per_sample=300, saved_fixed=7, packed_per_sample=500, packed_fixed=11,
                             output_per_sample=40)
    first = wl.layers[0].model_copy(update={"autocast": measured})
    ac = wl.model_copy(update={"layers": [first] + wl.layers[1:]})
    a100 = get_device("a100")
    plain = rank_costs(wl, a100, 8, "bf16", "sgd", mixed_precision="autocast")
    costs = rank_costs(ac, a100, 8, "bf16", "sgd", mixed_precision="autocast")
    assert costs.saved_bytes_per_layer[0] == 8 * 300 + 7
    assert costs.packed_bytes_per_layer[0] == 8 * 500 + 11
    assert costs.output_bytes_per_layer[0] == 8 * 40
    # the other layers, without bytes under autocast, keep the element-size scaling (and their weight copies)
    assert costs.saved_bytes_per_layer[1:] == plain.saved_bytes_per_layer[1:]
    assert plain.saved_bytes_per_layer[0] == pytest.approx(
        (8 * wl.layers[0].saved_activation_bytes_per_sample + wl.layers[0].saved_activation_bytes_fixed) / 2
        + 2 * wl.layers[0].param_bytes / 4)
    # a model held in 16 bit (master) does not run under autocast: its bytes are the fp32 ones halved
    master = rank_costs(ac, a100, 8, "bf16", "sgd")
    assert master.saved_bytes_per_layer == rank_costs(wl, a100, 8, "bf16", "sgd").saved_bytes_per_layer
    assert master.saved_bytes_per_layer[0] == pytest.approx(
        (8 * wl.layers[0].saved_activation_bytes_per_sample + wl.layers[0].saved_activation_bytes_fixed) / 2)
    # fp32 ignores them
    assert rank_costs(ac, a100, 8, "fp32", "sgd").saved_bytes_per_layer == \
        rank_costs(wl, a100, 8, "fp32", "sgd").saved_bytes_per_layer


def test_autocast_keeps_fp32_weights_and_gradients_and_16_bit_copies_until_backward():
    # torch.autocast with Adam: weights 4 + gradients 4 + m, v 8 B/param, no separate master; the forward
    # copies each conv/linear weight to 16 bit and the backward keeps the copy (2 B/param of those layers)
    wl = load_workload("tiny-cnn")
    psi = wl.num_params
    a100 = get_device("a100")
    amp = rank_costs(wl, a100, 4, "bf16", "adam", mixed_precision="autocast")
    master = rank_costs(wl, a100, 4, "bf16", "adam")
    assert (amp.param_bytes, amp.grad_bytes, amp.state_bytes) == (4 * psi, 4 * psi, 8 * psi)
    # tiny-cnn's 16-bit copies: the weights of conv1 (16x3x3x3), conv2 (32x16x3x3) and fc (10x2048), not
    # the biases, which backward does not keep
    copies = [layer.autocast.weight_copies for layer in wl.layers]
    assert copies == [2 * 16 * 3 * 9, 0, 0, 2 * 32 * 16 * 9, 0, 0, 2 * 10 * 32 * 8 * 8]
    assert amp.saved_bytes_per_layer == [4 * layer.autocast.saved_per_sample + layer.autocast.saved_fixed + c
                                         for layer, c in zip(wl.layers, copies, strict=True)]
    # without bytes under autocast, the fp32 bytes halved, and 2 B per parameter of the convs and linears
    bare = _without_autocast_bytes(wl)
    copied = [2 * layer.param_bytes / 4 if layer.kind in ("conv2d", "linear") else 0 for layer in wl.layers]
    assert rank_costs(bare, a100, 4, "bf16", "adam", mixed_precision="autocast").saved_bytes_per_layer == \
        pytest.approx([m + c for m, c in zip(master.saved_bytes_per_layer, copied, strict=True)])
    # its step reads fp32 gradients and writes no 16-bit copy: 4 + 2 x 4 + 2 x 8 = 28 B/param
    assert optimizer_traffic(psi, "bf16", "adam", "autocast") == 28 * psi
    assert optimizer_traffic(psi, "bf16", "adam") == (2 + 8 + 16 + 2) * psi
    # fp32 runs are the same either way
    assert rank_costs(wl, a100, 4, "fp32", "adam", mixed_precision="autocast") == \
        rank_costs(wl, a100, 4, "fp32", "adam")
    with pytest.raises(TrainsimError, match="unknown mixed_precision .amp.; valid choices: autocast, master"):
        rank_costs(wl, a100, 4, "bf16", "adam", mixed_precision="amp")


def test_ddp_under_autocast_all_reduces_fp32_gradients():
    # torch DDP under autocast reduces the fp32 .grad tensors: twice the NVLink bytes of 16-bit gradients
    # (not exactly: buckets of another size pick NCCL protocols whose wire overhead differs)
    from trainsim.api import simulate

    nvlink = {}
    for mode in ("master", "autocast"):
        result = simulate("ddp-resnet50-dgx-a100", record=False,
                          overrides=["precision=bf16", f"mixed_precision={mode}", "iterations=1"])
        nvlink[mode] = sum(link.bytes for link in result.links if link.kind == "nvlink")
    assert 1.9 < nvlink["autocast"] / nvlink["master"] <= 2.0


def test_autocast_is_refused_where_it_is_not_modelled():
    from trainsim.api import simulate

    with pytest.raises(TrainsimError, match="valid there: master") as err:
        simulate("validate-gpu", variant="single-bf16",
                 overrides=["topology=dgx-h100", "strategy.name=spatial"], record=False)
    assert err.value.field == "mixed_precision"
