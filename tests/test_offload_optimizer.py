"""The executor's optimizer-state offload: the state lives in host memory and streams through the device in
chunks, and the weights come out exactly as the plain optimizer's."""

import pytest

torch = pytest.importorskip("torch")

from trainsim.calibrate.execute.offload_optimizer import StreamedOptimizer, chunk_parameters  # noqa: E402
from trainsim.calibrate.execute.strategies import make_optimizer  # noqa: E402


def _model(device):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).to(device)


def _train(model, optimizer, device, steps=3):
    torch.manual_seed(1)
    for _ in range(steps):
        x = torch.randn(8, 16, device=device)
        optimizer.zero_grad()
        model(x).square().mean().backward()
        optimizer.step()
    return [p.detach().cpu().clone() for p in model.parameters()]


def test_chunks_hold_what_fits_in_the_chunk_size():
    params = [torch.zeros(10), torch.zeros(100), torch.zeros(5), torch.zeros(1)]
    # Adam: 2 state tensors of 4 bytes per value -> 80, 800, 40, 8 bytes
    assert chunk_parameters(params, 2, 100) == [[0], [1], [2, 3]]  # 800 bytes: a chunk of its own
    assert chunk_parameters(params, 2, 880) == [[0, 1], [2, 3]]
    assert chunk_parameters(params, 2, 1) == [[0], [1], [2], [3]]  # one parameter per chunk at least
    assert chunk_parameters(params, 2, 1e9) == [[0, 1, 2, 3]]


def _check(device, name):
    plain = _model(device)
    want = _train(plain, make_optimizer(name, plain.parameters(), 0.05), device)
    streamed = _model(device)
    opt = make_optimizer(name, streamed.parameters(), 0.05, offload=True, device=device, chunk_bytes=600)
    assert isinstance(opt, StreamedOptimizer)
    assert len(opt.chunks) >= 2 or name == "sgd"  # each layer's weights are a chunk (sgd has no state)
    got = _train(streamed, opt, device)
    opt.synchronize()
    for w, g in zip(want, got, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=0)
    assert all(not o.state for o in opt.optimizers)  # nothing left on the device between steps
    values = sum(p.numel() for p in streamed.parameters())
    state = {"sgd": 0, "momentum": 1, "adam": 2}[name]
    assert opt.host_state_bytes() == 4 * state * values
    largest = max(sum(opt.params[i].numel() for i in chunk) for chunk in opt.chunks)
    assert opt.device_buffer_bytes() == (2 * 4 * state * largest if state else 0)
    if state:  # the host copy is the state: the last step's momentum is non-zero
        assert any(t.abs().sum() > 0 for chunk in opt.host for t in chunk)


@pytest.mark.parametrize("name", ["sgd", "momentum", "adam"])
def test_streamed_state_steps_as_the_plain_optimizer_on_the_cpu(name):
    _check(torch.device("cpu"), name)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", ["momentum", "adam"])
def test_streamed_state_steps_as_the_plain_optimizer_on_cuda(name):
    _check(torch.device("cuda"), name)
    assert StreamedOptimizer(lambda ps: torch.optim.Adam(ps), "adam", _model("cuda").parameters(), "cuda",
                             600).host[0][0].is_pinned()
