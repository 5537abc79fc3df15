"""LayerHooks: which layer runs, in forward and in backward, through autograd-node hooks."""

import pytest

torch = pytest.importorskip("torch")

from trainsim.calibrate import zoo  # noqa: E402
from trainsim.calibrate.measure.layer_hooks import LayerHooks, leaf_modules, tensors_in  # noqa: E402


class _Log:
    def __init__(self):
        self.events = []
        self.outputs = {}

    def start(self, phase, layer):
        self.events.append(("start", phase, layer))

    def end(self, phase, layer):
        self.events.append(("end", phase, layer))

    def output(self, layer, inputs, outputs):
        self.outputs[layer] = (inputs, outputs)


def _step(name="tiny-cnn", **cfg):
    model = zoo.build_model(name, **cfg)
    x, y = zoo.example_batch(name, 2, **cfg)
    log = _Log()
    with LayerHooks(model, [log]) as hooks:
        zoo.loss_fn(name, model(x), y).backward()
    return model, hooks, log


def test_forward_order_and_outputs():
    _, hooks, log = _step()
    assert hooks.order == ["conv1", "relu1", "pool1", "conv2", "relu2", "pool2", "fc"]
    forward = [(kind, layer) for kind, phase, layer in log.events if phase == "forward"]
    assert forward[:2] == [("start", "conv1"), ("end", "conv1")]
    assert log.outputs["pool2"][1][0].shape == (2, 32, 8, 8)


def test_backward_reaches_every_layer_in_reverse_and_balanced():
    _, _, log = _step()
    backward = [(kind, layer) for kind, phase, layer in log.events if phase == "backward"]
    # every layer's autograd nodes ran, including conv1 whose input needs no gradient (a full backward
    # hook would fire before its weight gradient)
    assert {layer for _, layer in backward} == {"conv1", "relu1", "pool1", "conv2", "relu2", "pool2", "fc"}
    first_seen = list(dict.fromkeys(layer for _, layer in backward))
    assert first_seen[0] == "fc" and first_seen[-1] == "conv1"
    depth = 0
    for kind, _ in backward:  # node spans never nest
        depth += 1 if kind == "start" else -1
        assert depth in (0, 1)
    assert depth == 0


def test_weight_accumulation_belongs_to_the_layer():
    model = zoo.build_model("tiny-cnn")
    x, y = zoo.example_batch("tiny-cnn", 2)
    seen = []

    class Watch(_Log):
        def end(self, phase, layer):
            if phase == "backward" and layer == "conv1":
                seen.append(model.conv1.weight.grad is not None)

    with LayerHooks(model, [Watch()]):
        zoo.loss_fn("tiny-cnn", model(x), y).backward()
    assert seen and seen[-1]  # conv1's last backward node is its AccumulateGrad


def test_functional_glue_is_not_claimed():
    # in resnet, the residual add between bn2 and relu2 is nobody's node
    model, hooks, log = _step("resnet18", image_size=32, num_classes=4)
    assert "layer1.0.relu2" in hooks.order
    assert not any(name.endswith("add") for name in hooks.order)


def test_hooks_are_removed_on_exit():
    model, _, log = _step()
    count = len(log.events)
    x, y = zoo.example_batch("tiny-cnn", 2)
    zoo.loss_fn("tiny-cnn", model(x), y).backward()
    assert len(log.events) == count


def test_helpers():
    model = zoo.build_model("tiny-cnn")
    assert [n for n, _ in leaf_modules(model)][0] == "conv1"
    a, b = torch.zeros(1), torch.ones(2)
    assert tensors_in((a, [b, {"k": a}], 3)) == [a, b, a]
