"""Loading scenarios: a shipped scenario name or a YAML path, plus ``--set a.b=c`` overrides and variants.

    from trainsim.formats.scenario_loader import load_scenario
    scenario = load_scenario("ddp-resnet50-dgx-a100", ["batch_size=512", "strategy.bucket_cap_mb=50"])

Overrides are applied to the parsed YAML before validation, so a bad value is reported like a bad file
field. An override path that names no field lists the valid keys at that level.
"""

from __future__ import annotations

import copy
import os
import typing
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from trainsim.errors import TrainsimError, unknown_name
from trainsim.files import read_text
from trainsim.yamlio import load_yaml, parse_yaml_mapping

from .scenario import Scenario, validate_scenario


def _scenario_dir():
    return resources.files("trainsim.scenarios")


def list_scenarios() -> dict[str, str]:
    """Shipped scenarios: name -> description."""
    out = {}
    for entry in sorted(_scenario_dir().iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".yaml"):
            try:
                data = load_yaml(entry.read_text()) or {}
            except yaml.YAMLError:
                data = {}
            out[entry.name.removesuffix(".yaml")] = (
                str(data.get("description", "")) if isinstance(data, dict) else ""
            )
    return out


def _read_yaml(text: str, label: str) -> dict:
    return parse_yaml_mapping(text, label, "scenario file")


def _shipped_file(text: str):
    """The shipped scenario file ``text`` names (``ddp-resnet50-dgx-a100``, ``validate-cpu.yaml``,
    ``papers/easgd-alexnet-k80.yaml``), or None."""
    root = _scenario_dir()
    for candidate in (text, f"{text}.yaml"):
        if not candidate or Path(candidate).is_absolute():
            continue
        entry = root.joinpath(*Path(candidate).parts)
        if entry.name.endswith((".yaml", ".yml")) and entry.is_file():
            return entry, candidate
    return None


def read_scenario_data(source: str | os.PathLike) -> tuple[dict, str, Path | None]:
    """(parsed mapping, label for messages, folder for relative paths) of a YAML path or a shipped scenario
    (a name, or a file under trainsim's scenarios folder such as ``papers/easgd-alexnet-k80.yaml``)."""
    text = os.fspath(source)
    path = Path(text)
    if path.is_file():
        return _read_yaml(read_text(path, text, "scenario file"), text), text, path.resolve().parent
    shipped = _shipped_file(text)
    if shipped is not None:
        entry, label = shipped
        label = label if label.endswith((".yaml", ".yml")) else f"{label}.yaml"
        base = Path(str(entry)).parent if label.count("/") else None
        return _read_yaml(entry.read_text(), label), label, base
    if os.path.lexists(path):
        read_text(path, text, "scenario file")  # a folder or a symbolic link loop: says so
        raise TrainsimError("is not a regular file (a device, pipe or socket)", file=text)
    names = list_scenarios()
    if text.endswith((".yaml", ".yml")) or os.sep in text:
        raise TrainsimError("file not found", file=text)
    raise unknown_name("scenario", text, names)


# ---- overrides --------------------------------------------------------------------------------------------


def _model_of(annotation) -> type[BaseModel] | None:
    """The pydantic model inside a field annotation (``str | WorkloadRef`` -> WorkloadRef), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_of(arg)
        if found is not None:
            return found
    return None


def _keys(model: type[BaseModel]) -> dict[str, Any]:
    """Field names as written in YAML (aliases) -> annotation."""
    return {(info.alias or name): info.annotation for name, info in model.model_fields.items()}


def set_path(data: dict, dotted: str, value: Any, *, label: str | None = None) -> None:
    """Set ``data[a][b][c] = value`` for ``a.b.c``, checking each key against the scenario schema."""
    parts = dotted.split(".")
    if not all(parts):
        raise TrainsimError(f"bad override path {dotted!r}", field=dotted)
    model: type[BaseModel] | None = Scenario
    node = data
    for depth, key in enumerate(parts):
        here = ".".join(parts[:depth]) or "top level"
        annotation = None
        if model is not None and not getattr(model, "OPEN_KEYS", False):
            keys = _keys(model)
            if key not in keys:
                raise unknown_name(f"key at {here}", key, keys, file=label, field=dotted)
            annotation = keys[key]
        elif model is not None:
            annotation = _keys(model).get(key)
        if depth == len(parts) - 1:
            node[key] = value
            if depth == 0:
                _drop_other_batch(node, key)
            return
        child_model = _model_of(annotation) if annotation is not None else None
        child = node.get(key)
        if child is None:
            child = {}
        elif not isinstance(child, dict):
            if child_model is not None and "name" in _keys(child_model):
                child = {"name": child}  # workload: resnet50 -> {name: resnet50, image_size: ...}
            else:
                raise TrainsimError(
                    f"{'.'.join(parts[: depth + 1])} is not a mapping", file=label, field=dotted
                )
        node[key] = child
        node = child
        model = child_model


#: the two ways to give a scenario's batch: one given by an override or a variant replaces the other
BATCH_KEYS = ("batch_size", "batch_per_gpu")


def _drop_other_batch(data: dict, key: str) -> None:
    """``key`` (a top-level field just set) is one way to give the batch: the other goes."""
    if key in BATCH_KEYS:
        for other in BATCH_KEYS:
            if other != key:
                data.pop(other, None)


def parse_override(text: str) -> tuple[str, Any]:
    """``a.b=value`` -> ("a.b", YAML-parsed value)."""
    if "=" not in text:
        raise TrainsimError(f"an override must look like key.path=value, got {text!r}", field="--set")
    key, raw = text.split("=", 1)
    try:
        value = load_yaml(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key.strip(), value


def deep_merge(base: dict, over: dict) -> dict:
    """``over`` deep-merged over ``base`` (mappings merge, everything else replaces): how variants apply."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def apply_variant(data: dict, variant: str | None, *, label: str | None = None) -> dict:
    """The scenario mapping with variant ``variant`` deep-merged over it and ``variants`` dropped; the name
    becomes ``name[variant]``. ``None``: the base scenario. The one variant merge of trainsim: the simulator
    and the executor (calibrate/execute/config.py) both apply variants through it."""
    base = {k: v for k, v in data.items() if k != "variants"}
    if variant is None:
        return copy.deepcopy(base)
    variants = _variants(data, label)
    if variant not in variants:
        if not variants:
            raise TrainsimError(f"the scenario has no variants, so none is called {variant!r}", file=label,
                                field="variants")
        raise unknown_name("variant", variant, variants, file=label, field="variants")
    over = variants[variant] if variants[variant] is not None else {}
    if not isinstance(over, dict):
        raise TrainsimError(
            "a variant must be a mapping of overrides", file=label, field=f"variants.{variant}"
        )
    merged = deep_merge(base, over)
    for key in BATCH_KEYS:
        if key in over:
            _drop_other_batch(merged, key)
    merged["name"] = f"{data.get('name', 'scenario')}[{variant}]"
    return merged


def check_variants(source: str | os.PathLike | dict) -> list[str]:
    """Validate every variant of a scenario (merged over its base); returns their names."""
    data, label, _ = (
        (copy.deepcopy(source), None, None) if isinstance(source, dict) else read_scenario_data(source)
    )
    variants = _variants(data, label)
    for name in variants:
        load_scenario(data, variant=name)
    return list(variants)


def _variants(data: dict, label: str | None) -> dict:
    """The scenario's ``variants:``: a mapping from names (strings) to overrides."""
    variants = data.get("variants") or {}
    if not isinstance(variants, dict):
        raise TrainsimError("variants must be a mapping of name -> overrides", file=label, field="variants")
    for name in variants:
        if not isinstance(name, str) or not name:
            raise TrainsimError(f"a variant's name must be a non-empty string, got {name!r} (quote it in "
                                "YAML)", file=label, field="variants")
    return variants


def load_scenario(
    source: str | os.PathLike | dict | Scenario,
    overrides: list[str] | tuple[str, ...] = (),
    *,
    variant: str | None = None,
    values: dict[str, Any] | None = None,
    where: str | None = None,
) -> Scenario:
    """A validated `Scenario` from a shipped name, a YAML path or a mapping, with overrides applied.

    ``overrides`` are ``key.path=value`` texts; ``values`` are overrides already parsed (``{"gpus": 4}``),
    applied after them. ``where`` names the scenario in errors instead of its file (a sweep's point).
    A variant is checked when it is chosen (``check_variants`` checks them all), so a file may carry
    variants that only a later feature understands.
    """
    if isinstance(source, Scenario):
        source = source.model_dump(by_alias=True, exclude_defaults=False)
    if isinstance(source, dict):
        data, label, base_dir = copy.deepcopy(source), None, None
    else:
        data, label, base_dir = read_scenario_data(source)
    if variant is not None:
        data = apply_variant(data, variant, label=label)
    where = where or (f"{label or 'scenario'} variant {variant}" if variant is not None else label)
    set_here = set()
    for text in overrides:
        key, value = parse_override(text)
        set_path(data, key, value, label=where)
        set_here.add(key.split(".")[0])
    for key, value in (values or {}).items():
        set_path(data, key, copy.deepcopy(value), label=where)
    scenario = validate_scenario(data, label=where)
    scenario._source = label
    scenario._base_dir = str(base_dir) if base_dir else None
    scenario._set_here = frozenset(set_here)
    return scenario
