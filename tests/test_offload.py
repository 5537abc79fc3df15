"""Activation offload hooks: same gradients as without them; prefetch k layers ahead serves backward."""

import pytest

torch = pytest.importorskip("torch")

from trainsim.calibrate import zoo  # noqa: E402
from trainsim.calibrate.execute.offload import PrefetchOffload, offload_context  # noqa: E402


def _grads(mode: str, device: str = "cpu", distance: int = 1, resnet: bool = False):
    torch.manual_seed(0)
    name, cfg = ("resnet18", {"image_size": 32, "num_classes": 10}) if resnet else ("tiny-cnn", {})
    model = zoo.build_model(name, **cfg).to(device)
    x, y = zoo.example_batch(name, 4, device, generator=torch.Generator().manual_seed(1), **cfg)
    offloader = PrefetchOffload(model, torch.device(device), distance) if mode == "prefetch" else None
    with offload_context(mode, offloader, torch.device(device)):
        loss = zoo.loss_fn(name, model(x), y)
        if offloader:
            offloader.start_backward()
        loss.backward()
    return [p.grad.clone() for p in model.parameters()], offloader


@pytest.mark.parametrize("mode", ["save_on_cpu", "prefetch"])
def test_offload_gives_the_same_gradients(mode):
    reference, _ = _grads("none")
    got, _ = _grads(mode)
    for a, b in zip(reference, got, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("distance", [1, 3])
def test_prefetch_serves_every_unpack_ahead_of_backward(distance):
    _, offloader = _grads("prefetch", distance=distance, resnet=True)
    stats = offloader.stats
    assert stats.offloaded_bytes > 0 and len(stats.layers) > 10
    assert stats.on_demand == 0 and stats.prefetched > 0  # backward never waited for an unissued copy


def test_a_tensor_saved_twice_is_copied_once():
    """ResNet-18 saves 144 tensors of which 20 again (a layer's output is the next one's input): the
    offloader copies the distinct ones only, and backward still gets every one (same gradients above)."""
    _, offloader = _grads("prefetch", distance=2, resnet=True)
    stats = offloader.stats
    assert stats.shared > 0 and stats.on_demand == 0
    torch.manual_seed(0)
    model = zoo.build_model("resnet18", image_size=32, num_classes=10)
    x, _ = zoo.example_batch("resnet18", 4, "cpu", generator=torch.Generator().manual_seed(1),
                             image_size=32, num_classes=10)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    packed: dict[int, int] = {}

    def pack(t):
        if t.untyped_storage().data_ptr() not in params and t.numel() * t.element_size() >= 4096:
            packed[id(t)] = t.numel() * t.element_size()     # the same live object once
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(x)
    assert stats.offloaded_bytes == sum(packed.values())


def test_a_tensor_changed_in_place_is_copied_again():
    offloader = PrefetchOffload(zoo.build_model("tiny-cnn"), torch.device("cpu"))
    t = torch.ones(2048)
    first = offloader.pack(t)
    assert offloader.pack(t) is first and first.uses == 2
    t.add_(1)                                  # a new version: the first copy holds the old values
    second = offloader.pack(t)
    assert second is not first and torch.equal(second.host, t)
    assert torch.equal(offloader.unpack(first), torch.ones(2048)) and first.device_copy is not None
    offloader.unpack(first)
    assert first.device_copy is None           # dropped after its last unpack


def test_parameters_are_not_offloaded():
    torch.manual_seed(0)
    model = zoo.build_model("tiny-cnn")
    offloader = PrefetchOffload(model, torch.device("cpu"))
    weight = model.fc.weight
    assert offloader.pack(weight) is weight  # the layer keeps its own weight; copying it saves nothing
    small = torch.ones(3)
    assert offloader.pack(small) is small


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("mode", ["save_on_cpu", "prefetch"])
def test_offload_on_cuda_matches(mode, monkeypatch):
    # with cuDNN's defaults (TF32 convolutions, backward algorithms that accumulate in a run-dependent order)
    # two plain runs differ by more than 1e-5: full fp32 and deterministic convolutions, so that what is left
    # (max-pool's backward still adds with atomics) stays at rounding
    monkeypatch.setattr(torch.backends.cudnn, "deterministic", True)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    reference, _ = _grads("none", "cuda", resnet=True)
    got, offloader = _grads(mode, "cuda", distance=2, resnet=True)
    for a, b in zip(reference, got, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
    if offloader:
        assert offloader.stats.on_demand == 0
