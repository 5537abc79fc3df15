"""Scenario files: the schema, shipped scenarios, --set overrides and variants."""

import pytest

from trainsim.errors import TrainsimError
from trainsim.formats.scenario import Scenario
from trainsim.formats.scenario_loader import check_variants, list_scenarios, load_scenario, parse_override

BASE = {
    "schema": "trainsim.scenario/1",
    "name": "base",
    "topology": "dgx-a100",
    "workload": "resnet50",
    "strategy": {"name": "ddp"},
    "batch_size": 256,
}


def test_every_shipped_scenario_validates():
    names = list_scenarios()
    required = {"single-gpu-resnet50", "ddp-resnet50-dgx-a100", "ddp-resnet50-64gpu"}
    for model in ("resnet50", "vgg16"):
        for machine in ("pcie-4gpu-gen3", "dgx1-v100"):
            required |= {f"dp-gpu0-{model}-{machine}", f"ddp-{model}-{machine}"}
    assert required <= set(names)
    for name in names:
        scenario = load_scenario(name)
        assert isinstance(scenario, Scenario) and scenario.name == name and names[name]
    for name in required:
        check_variants(name)


def test_defaults_and_types():
    scenario = load_scenario(BASE)
    assert scenario.strategy.bucket_cap_mb == 25
    assert scenario.iterations == 3 and scenario.warmup_iterations == 1
    assert scenario.optimizer.name == "sgd" and scenario.precision == "fp32"
    assert scenario.host.pinned and scenario.gpus is None


def test_set_overrides_parse_yaml_values():
    scenario = load_scenario(
        BASE,
        [
            "batch_size=512",
            "strategy.bucket_cap_mb=50",
            "gpus=[0, 1]",
            "host.pinned=false",
            "workload.image_size=112",
        ],
    )
    assert scenario.batch_size == 512 and scenario.strategy.bucket_cap_mb == 50
    assert scenario.gpus == [0, 1] and scenario.host.pinned is False
    assert scenario.workload.name == "resnet50" and scenario.workload.overrides == {"image_size": 112}


def test_set_unknown_key_lists_the_valid_ones():
    with pytest.raises(TrainsimError) as err:
        load_scenario(BASE, ["strategy.bucket_size=3"])
    assert "unknown key at strategy 'bucket_size'" in str(err.value)
    assert "bucket_cap_mb" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(TrainsimError, match="valid choices: .*batch_size"):
        load_scenario(BASE, ["batchsize=3"])
    with pytest.raises(TrainsimError, match="key.path=value"):
        parse_override("batch_size")


def test_unknown_fields_and_bad_values_are_rejected():
    with pytest.raises(TrainsimError, match="optimizations.prefetch: unknown field"):
        load_scenario({**BASE, "optimizations": {"prefetch": True}})
    with pytest.raises(TrainsimError, match="colour: unknown field"):
        load_scenario({**BASE, "colour": "red"})
    with pytest.raises(TrainsimError, match="strategy.name"):
        load_scenario({**BASE, "strategy": {"name": "zero-3"}})
    with pytest.raises(TrainsimError, match="batch_size"):
        load_scenario({**BASE, "batch_size": 0})
    with pytest.raises(TrainsimError, match="strategy single runs on one GPU"):
        load_scenario({**BASE, "strategy": {"name": "single"}, "gpus": [0, 1]})
    with pytest.raises(TrainsimError, match="unsupported schema"):
        load_scenario({**BASE, "schema": "trainsim.scenario/9"})


def test_files_names_and_yaml_errors(tmp_path):
    with pytest.raises(
        TrainsimError, match="unknown scenario 'nope'; valid choices: .*ddp-resnet50-dgx-a100"
    ):
        load_scenario("nope")
    with pytest.raises(TrainsimError, match="file not found"):
        load_scenario(str(tmp_path / "missing.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(TrainsimError, match="malformed YAML"):
        load_scenario(str(bad))
    good = tmp_path / "good.yaml"
    good.write_text("topology: dgx-a100\nworkload: resnet50\nstrategy: {name: ddp}\nbatch_size: 64\n")
    scenario = load_scenario(str(good))
    assert scenario.source == str(good) and scenario.base_dir == str(tmp_path.resolve())


def test_variants_merge_and_are_checked():
    data = {**BASE, "variants": {"old-way": {"strategy": {"name": "dp-gpu0"}, "batch_size": 128}}}
    base = load_scenario(data)
    variant = load_scenario(data, variant="old-way")
    assert base.strategy.name == "ddp"
    assert (
        variant.strategy.name == "dp-gpu0" and variant.batch_size == 128 and variant.name == "base[old-way]"
    )
    with pytest.raises(TrainsimError, match="unknown variant 'x'; valid choices: old-way"):
        load_scenario(data, variant="x")
    broken = {**BASE, "variants": {"fine": {"batch_size": 64}, "broken": {"batch_size": -1}}}
    assert load_scenario(broken).batch_size == 256  # a variant is checked when chosen
    with pytest.raises(TrainsimError, match="scenario variant broken: batch_size"):
        check_variants(broken)
    assert check_variants(data) == ["old-way"]


@pytest.mark.parametrize("text, value", [("1e-9", 1e-9), ("2E+3", 2000.0), ("-1.5e3", -1500.0), (".5", 0.5),
                                         ("10", 10), ("1e", "1e"), ("e9", "e9")])
def test_an_exponent_without_a_dot_is_a_number_as_in_yaml_1_2(text, value):
    assert parse_override(f"host.prep_s_per_sample={text}") == ("host.prep_s_per_sample", value)


def test_an_exponent_in_a_scenario_file_is_a_number(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("schema: trainsim.scenario/1\nname: s\ntopology: dgx-a100\nworkload: resnet50\n"
                    "strategy: {name: ddp}\nbatch_size: 256\nhost: {prep_s_per_sample: 2e-6}\n")
    assert load_scenario(str(path)).host.prep_s_per_sample == 2e-6


@pytest.mark.parametrize("override, message", [
    ("host.prep_s_per_sample=abc", "host.prep_s_per_sample: should be a valid number, got 'abc'"),
    ("host.prep_s_per_sample=true", "host.prep_s_per_sample: should be a valid number, got true"),
    ("batch_size=1.5", "batch_size: should be a valid integer, got 1.5"),
    ("iterations=0", "iterations: should be greater than or equal to 1, got 0"),
    ("host=[1, 2]", "host: should be a mapping, got [1, 2]"),
])
def test_a_wrong_value_is_named_with_what_it_should_be(override, message):
    with pytest.raises(TrainsimError) as info:
        load_scenario(BASE, [override])
    assert str(info.value) == message


def test_a_union_branch_that_failed_its_constraint_is_reported_as_such():
    from typing import Annotated, Literal

    from pydantic import BaseModel, Field, ValidationError

    from trainsim.errors import from_validation_error

    class Model(BaseModel):
        count: Annotated[int, Field(ge=1)] | list[int] = 1
        mode: Literal["a", "b"] | int = 1

    def message(**given):
        with pytest.raises(ValidationError) as info:
            Model(**given)
        return str(from_validation_error(info.value))

    assert message(count=0) == "count: should be greater than or equal to 1, got 0"
    assert message(count="q") == "count: should be an integer or a list, got 'q'"
    assert message(mode="c") == "mode: should be 'a' or 'b' or an integer, got 'c'"


def test_a_relative_path_given_with_set_is_the_working_folders(tmp_path, monkeypatch):
    """A path in the scenario file resolves against the file's folder; one given on the command line
    against the folder the command runs in, even when the scenario's folder has a file of that name."""
    import yaml

    from trainsim.resolve import resolve
    from trainsim.topologies import load_spec

    def topology_named(folder, name):
        folder.mkdir()
        data = load_spec("pcie-4gpu-gen3")[0].model_dump(mode="json", exclude_none=True) | {"name": name}
        (folder / "box.yaml").write_text(yaml.safe_dump(data))

    topology_named(tmp_path / "scenarios", "the-scenarios-box")
    topology_named(tmp_path / "here", "the-box-here")
    scenario = tmp_path / "scenarios" / "s.yaml"
    scenario.write_text(yaml.safe_dump(BASE | {"topology": "box.yaml", "workload": "tiny-cnn",
                                                "batch_size": 64}))
    monkeypatch.chdir(tmp_path / "here")
    assert resolve(str(scenario)).topology.name == "the-scenarios-box"
    assert resolve(str(scenario), overrides=["topology=box.yaml"]).topology.name == "the-box-here"


def test_batch_per_gpu_scales_the_global_batch_with_the_gpus():
    from trainsim.resolve import resolve

    per_gpu = ["batch_per_gpu=64"]
    assert resolve("ddp-resnet50-dgx-a100", overrides=per_gpu).scenario.batch_size == 64 * 8
    assert resolve("ddp-resnet50-dgx-a100", overrides=[*per_gpu, "gpus=2"]).scenario.batch_size == 64 * 2
    # the global form stays the global batch, whatever the GPU count
    assert resolve("ddp-resnet50-dgx-a100", overrides=["batch_size=512", "gpus=2"]).scenario.batch_size == 512


def test_a_scenario_gives_one_batch():
    both = {"topology": "dgx-a100", "workload": "resnet50", "strategy": {"name": "ddp"}, "batch_size": 64,
            "batch_per_gpu": 8}
    with pytest.raises(TrainsimError, match="give batch_size .* or batch_per_gpu .*, not both"):
        load_scenario(both)
    with pytest.raises(TrainsimError, match="give batch_size .* or batch_per_gpu"):
        load_scenario({k: v for k, v in both.items() if not k.startswith("batch")})
    # an override of one replaces the other
    switched = load_scenario({k: v for k, v in both.items() if k != "batch_per_gpu"}, ["batch_per_gpu=8"])
    assert (switched.batch_size, switched.batch_per_gpu) == (None, 8)
