"""FLOPs and bytes of matrix multiplies and convolutions from a profiler's recorded shapes (`op_work`).

FLOPs are checked against PyTorch's own FLOP counter on the same ops, recorded by a real (CPU) profiler;
bytes against hand counts of the operands.
"""

import json

import pytest

from trainsim.sim.compute.kernels.layers import op_kernels
from trainsim.sim.replay.op_work import op_work

FLOAT = ["float", "float"]


def test_matmuls_by_hand():
    mm = op_work("aten::mm", [[64, 128], [128, 32]], FLOAT)
    assert (mm.flops, mm.precision) == (2 * 64 * 128 * 32, "fp32")
    assert mm.nbytes == (64 * 128 + 128 * 32 + 64 * 32) * 4
    addmm = op_work("aten::addmm", [[32], [64, 128], [128, 32], [], []],
                    ["float", *FLOAT, "Scalar", "Scalar"])
    assert (addmm.flops, addmm.nbytes) == (mm.flops, mm.nbytes + 32 * 4)
    bmm = op_work("aten::bmm", [[3, 4, 5], [3, 5, 6]], ["c10::BFloat16"] * 2)
    assert (bmm.flops, bmm.nbytes, bmm.precision) == (2 * 3 * 4 * 5 * 6, 3 * (20 + 30 + 24) * 2, "bf16")
    assert (mm.shape, addmm.shape, bmm.shape) == (("gemm", 1, 64, 32, 128),) * 2 + (("gemm", 3, 4, 6, 5),)


@pytest.mark.parametrize("name, shapes, types, concrete", [
    ("aten::relu", [[4, 4]], ["float"], None),                                  # not a matrix op
    ("aten::mm", [[4, 5], [6, 7]], FLOAT, None),                                # K does not match
    ("aten::mm", [[4, 5, 1], [5, 7]], FLOAT, None),                             # wrong rank
    ("aten::mm", [[4, 5], [5, 7]], ["TensorList", "float"], None),              # no element size
    ("aten::mm", "[[4, 5], [5, 7]]", FLOAT, None),                              # not lists
    ("aten::convolution", [[2, 3, 8, 8], [4, 3, 3, 3], [4]], ["float"] * 3, None),   # no stride/padding
    ("aten::convolution", [[2, 3, 8, 8], [4, 3, 3, 3], [], [], [], [], [], [], []], ["float"] * 9,
     ["", "", "", "[1, 1]", "[0, 0", "[1, 1]", "False", "[0, 0]", "1"]),         # unreadable padding
    ("aten::convolution", [[2, 3, 2, 2], [4, 3, 3, 3], [], [], [], [], [], [], []], ["float"] * 9,
     ["", "", "", "[1, 1]", "[0, 0]", "[1, 1]", "False", "[0, 0]", "1"]),       # kernel larger than input
])
def test_what_is_not_read_gives_none(name, shapes, types, concrete):
    assert op_work(name, shapes, types, concrete) is None


def test_flops_match_pytorchs_counter_on_a_recorded_step(tmp_path):
    """A forward and backward of convolutions (strided, padded, dilated, transposed, the first one without
    grad_input), linear layers and a bmm, recorded with record_shapes: summed per op, the FLOPs read from
    the shapes are PyTorch's FlopCounterMode counts. (Grouped convolutions are checked by hand below: the
    counter's grad_weight count ignores groups.)"""
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile
    from torch.utils.flop_counter import FlopCounterMode

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, stride=2, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(8, 8, 3, dilation=2), torch.nn.ReLU(),
        torch.nn.ConvTranspose2d(8, 4, 3, stride=2, padding=1, output_padding=1),
        torch.nn.Flatten(), torch.nn.Linear(4 * 8 * 8, 16), torch.nn.Linear(16, 10, bias=False))
    x, a, b = torch.randn(2, 3, 16, 16), torch.randn(3, 4, 5), torch.randn(3, 5, 6, requires_grad=True)

    def step():
        (model(x).sum() + torch.bmm(a, b).sum()).backward()

    step()
    with FlopCounterMode(display=False) as counter:
        step()
    expected = {str(op).split(".")[1]: n for op, n in counter.get_flop_counts()["Global"].items()}
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        step()
    prof.export_chrome_trace(str(tmp_path / "t.json"))
    events = json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    read: dict[str, float] = {}
    for e in events:
        name, args = e.get("name", ""), e.get("args", {})
        if e.get("cat") != "cpu_op" or name == "aten::_convolution":     # nested in aten::convolution
            continue
        work = op_work(name, args.get("Input Dims"), args.get("Input type"), args.get("Concrete Inputs"))
        if work is not None:
            key = name.removeprefix("aten::")
            read[key] = read.get(key, 0) + work.flops
    assert set(read) == {"convolution", "convolution_backward", "addmm", "mm", "bmm"}
    assert read == pytest.approx(expected)


def test_convolution_bytes_by_hand():
    """A strided, padded convolution: input, weight, bias and the output (2 x 8 x 8 x 8) once each;
    backward with only grad_weight reads grad_output and the input and writes the weight's grad."""
    concrete = ["", "", "", "[2, 2]", "[1, 1]", "[1, 1]", "False", "[0, 0]", "1"]
    fwd = op_work("aten::convolution", [[2, 3, 16, 16], [8, 3, 3, 3], [8], [], [], [], [], [], []],
                  ["float"] * 3 + ["ScalarList"] * 3 + ["Scalar", "ScalarList", "Scalar"], concrete)
    assert fwd.flops == 2 * 2 * 64 * (8 * 3 * 3 * 3)
    assert fwd.nbytes == (2 * 3 * 256 + 8 * 27 + 8 + 2 * 8 * 64) * 4
    bwd = op_work("aten::convolution_backward", [[2, 8, 8, 8], [2, 3, 16, 16], [8, 3, 3, 3]], ["float"] * 3,
                  ["", "", "", "[8]", "[2, 2]", "[1, 1]", "[1, 1]", "False", "[0, 0]", "1",
                   "[False, True, True]"])
    assert bwd.flops == fwd.flops
    assert bwd.nbytes == (2 * 8 * 64 + 2 * 3 * 256 + 8 * 27) * 4
    # the geometry the kernel model rebuilds them from (`replay --gpu`), the same FLOPs
    assert fwd.shape == ("conv", 2, 3, 8, 16, 16, 3, 3, 2, 1, 1, "forward")
    assert bwd.shape == ("conv", 2, 3, 8, 16, 16, 3, 3, 2, 1, 1, "backward_weight")
    for work in (fwd, bwd):
        assert sum(k.flops for k in op_kernels(work.shape, "fp32")) == work.flops


def test_grouped_convolution_by_hand():
    """Groups of 2: each output channel meets 4 of the 8 input channels (the weight's [8, 4, 3, 3]); with
    dilation 2 a 3x3 kernel spans 5, so 8x8 gives 4x4. Backward computes two products of the same size."""
    concrete = ["", "", "", "[1, 1]", "[0, 0]", "[2, 2]", "False", "[0, 0]", "2"]
    fwd = op_work("aten::convolution", [[2, 8, 8, 8], [8, 4, 3, 3], [], [], [], [], [], [], []],
                  ["float"] * 9, concrete)
    assert fwd.flops == 2 * 2 * 16 * (8 * 4 * 9)
    bwd = op_work("aten::convolution_backward", [[2, 8, 4, 4], [2, 8, 8, 8], [8, 4, 3, 3]], ["float"] * 3,
                  ["", "", "", "[8]", "[1, 1]", "[0, 0]", "[2, 2]", "False", "[0, 0]", "2",
                   "[True, True, True]"])
    assert bwd.flops == 2 * fwd.flops
    assert fwd.shape == bwd.shape == ()  # dilated: no kernel-model form, the what-if goes by FLOPs and bytes


def test_attention_flops_match_pytorchs_formulas_on_a_recorded_step(tmp_path):
    """Fused attention forward and backward, recorded by the CPU profiler with its shapes (key and value of
    two heads shared by four query heads): the FLOPs read are those of PyTorch's FLOP counter formulas for
    the same shapes (the counter itself registers only the CUDA kernels)."""
    torch = pytest.importorskip("torch")
    from torch.nn.functional import scaled_dot_product_attention
    from torch.profiler import ProfilerActivity, profile
    from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

    q = torch.randn(2, 4, 16, 8, requires_grad=True)
    k, v = torch.randn(2, 2, 16, 8, requires_grad=True), torch.randn(2, 2, 16, 8, requires_grad=True)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        scaled_dot_product_attention(q, k, v, enable_gqa=True).sum().backward()
    prof.export_chrome_trace(str(tmp_path / "t.json"))
    read = {}
    for e in json.loads((tmp_path / "t.json").read_text())["traceEvents"]:
        args = e.get("args", {})
        work = op_work(e.get("name", ""), args.get("Input Dims"), args.get("Input type"),
                       args.get("Concrete Inputs"))
        if e.get("cat") == "cpu_op" and work is not None:
            read[e["name"]] = work
    shapes = (list(q.shape), list(k.shape), list(v.shape))
    fwd = read["aten::_scaled_dot_product_flash_attention_for_cpu"]
    bwd = read["aten::_scaled_dot_product_flash_attention_for_cpu_backward"]
    assert (fwd.flops, fwd.precision) == (sdpa_flop_count(*shapes), "fp32")
    assert bwd.flops == sdpa_backward_flop_count(shapes[0], *shapes)
    assert fwd.nbytes == (2 * 4 * 16 * 8 * 2 + 2 * 2 * 16 * 8 * 2) * 4     # q and out; k and v
    assert bwd.nbytes == 2 * fwd.nbytes                                    # and each one's gradient


def test_causal_attention_counts_the_pairs_its_mask_keeps():
    """Causal: query row i meets keys 0..i. Six rows over four keys keep 1+2+3+4+4+4 = 18 of 24 pairs;
    sixteen over sixteen keep 136. The mask's place among the arguments differs per op."""
    def forward(rows, keys, causal):
        return op_work("aten::_scaled_dot_product_efficient_attention",
                       [[1, 2, rows, 8], [1, 2, keys, 8], [1, 2, keys, 4], [], [], [], [], []],
                       ["c10::BFloat16"] * 3 + ["", "Scalar", "Scalar", "Scalar", "Scalar"],
                       ["", "", "", "", "True", "0.", str(causal), ""])

    assert forward(6, 4, False).flops == 2 * 2 * 24 * (8 + 4)
    assert forward(6, 4, True).flops == 2 * 2 * 18 * (8 + 4)
    assert forward(16, 16, True).flops == 2 * 2 * 136 * (8 + 4)
    assert forward(6, 4, True).precision == "bf16"
    backward = op_work("aten::_scaled_dot_product_flash_attention_backward",
                       [[1, 2, 16, 4], [1, 2, 16, 8], [1, 2, 16, 8], [1, 2, 16, 4], [1, 2, 16, 4], [1, 2, 16],
                        [], [], [], [], [], [], [], []],
                       ["c10::Half"] * 6 + [""] * 8,
                       [""] * 10 + ["0.", "True", "", ""])
    assert backward.flops == 2 * 2 * 136 * (3 * 8 + 2 * 4)
    assert backward.precision == "fp16"


@pytest.mark.parametrize("shapes", [
    [[2, 3, 16, 8], [2, 2, 16, 8], [2, 2, 16, 8]],      # three query heads cannot share two key heads
    [[2, 4, 16, 8], [2, 4, 16, 4], [2, 4, 16, 8]],      # query and key features differ
    [[2, 4, 16, 8], [2, 4, 12, 8], [2, 4, 16, 8]],      # key and value lengths differ
    [[2, 4, 16], [2, 4, 16], [2, 4, 16]],               # not [batch, heads, sequence, features]
])
def test_attention_that_does_not_attend_gives_none(shapes):
    assert op_work("aten::_scaled_dot_product_flash_attention", [*shapes, [], [], []], ["float"] * 6,
                   None) is None
