"""Pipeline stages: the cut reproduces the model, the partitions are balanced, and a pipelined step on CPU
ranks computes what one rank computes (every schedule; pipeline x data parallelism too)."""

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from trainsim.calibrate import zoo  # noqa: E402
from trainsim.calibrate.execute.config import ExecConfig, PipelineConfig  # noqa: E402
from trainsim.calibrate.execute.pipeline import (  # noqa: E402
    balanced_cuts,
    cuts_from_stage_layers,
    leaf_count,
    sequential_parts,
)
from trainsim.errors import TrainsimError  # noqa: E402


@pytest.mark.parametrize("name, cfg", [("tiny-cnn", {}), ("resnet18", {"image_size": 32}),
                                       ("googlenet", {"image_size": 64})])
def test_the_parts_compose_to_the_model(name, cfg):
    torch.manual_seed(0)
    model = zoo.build_model(name, **cfg).eval()
    x, _ = zoo.example_batch(name, 2, **cfg)
    with torch.no_grad():
        y = x
        for part in sequential_parts(model):
            y = part(y)
        assert torch.allclose(y, model(x), atol=1e-5)
    leaves = sum(1 for m in model.modules() if not list(m.children()))
    assert sum(leaf_count(p) for p in sequential_parts(model)) == leaves


def test_balanced_cuts_minimise_the_largest_stage():
    assert balanced_cuts([1, 1, 1, 1], 2) == [0, 2, 4]
    assert balanced_cuts([5, 1, 1, 1, 1, 1], 2) == [0, 1, 6]
    assert balanced_cuts([1, 2, 3, 4, 5], 3) == [0, 3, 4, 5]  # stages of 6, 4, 5
    with pytest.raises(TrainsimError):
        balanced_cuts([1, 1], 3)


def test_stage_layers_round_to_part_boundaries():
    torch.manual_seed(0)
    parts = sequential_parts(zoo.build_model("tiny-cnn"))  # conv1 relu1 pool1 conv2 relu2 pool2 flatten fc
    assert cuts_from_stage_layers(parts, [3, 4]) == [0, 3, 8]
    assert cuts_from_stage_layers(parts, [1, 1, 5]) == [0, 1, 2, 8]


def test_pipeline_config_is_validated():
    with pytest.raises(TrainsimError) as err:
        ExecConfig(strategy="pipeline", ranks=2, batch_size=6, pipeline=PipelineConfig(micro_batches=4))
    assert err.value.field == "batch_size"
    with pytest.raises(TrainsimError) as err:
        ExecConfig(strategy="pipeline", ranks=3, batch_size=12, pipeline=PipelineConfig(stages=2))
    assert err.value.field == "pipeline.stages"
    with pytest.raises(TrainsimError) as err:
        PipelineConfig(schedule="zero-bubble")
    assert err.value.field == "pipeline.schedule"


def sgd_reference(cfg: ExecConfig) -> np.ndarray:
    """The same training steps in this process, on one device, written out: the ground truth."""
    from trainsim.calibrate.execute.datapipe import SyntheticSource

    torch.manual_seed(cfg.seed)
    model = zoo.build_model(cfg.model, **cfg.model_cfg)
    source = SyntheticSource(cfg.model, cfg.model_cfg, cfg.data, seed=cfg.seed)
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr)
    for it in range(cfg.warmup + cfg.iterations):
        x, y = source.batch(it, range(cfg.batch_size), cfg.batch_size)
        zoo.loss_fn(cfg.model, model(x), y).backward()
        opt.step()
        opt.zero_grad()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy()


@pytest.mark.slow
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores")
def test_pipeline_times_data_parallel_matches_one_device():
    """2 stages x 2 data-parallel replicas (4 ranks, oversubscribed: a correctness check, not a timing)."""
    from trainsim.calibrate.execute.executor import run

    cfg = ExecConfig(strategy="pipeline", ranks=4, oversubscribe=True, model="tiny-cnn", batch_size=16,
                     iterations=1, warmup=0, lr=0.1, capture_params=True,  # one step: see test_executor
                     pipeline=PipelineConfig(stages=2, micro_batches=2, schedule="message-driven"))
    got = run(cfg)
    ref = sgd_reference(cfg)
    for replica in range(2):  # ranks 2r, 2r+1 are the stages of replica r
        params = np.concatenate([got.ranks[2 * replica].params, got.ranks[2 * replica + 1].params])
        np.testing.assert_allclose(params, ref, rtol=0, atol=1e-6)
    assert got.ran["pipeline"]["stages"] == 2 and np.isfinite(got.losses).all() and got.losses[0] > 0
