"""The layering the design asks for, read from the imports (benchmarks/import_graph.py): no import cycles
between packages or modules, sim/ imports no calibrate/ and no scenario loader, the formats layer imports
neither sim/ nor calibrate/."""

from __future__ import annotations

import importlib.util
from pathlib import Path

GRAPH = Path(__file__).resolve().parent.parent / "benchmarks" / "import_graph.py"


def _report() -> dict:
    spec = importlib.util.spec_from_file_location("import_graph", GRAPH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    mods = module.modules()
    return module.report(mods, module.imports(mods))


def test_no_import_cycles_and_no_forbidden_imports():
    report = _report()
    assert report["package_cycles"] == []
    assert report["module_cycles"] == []
    assert report["forbidden_imports"] == []


def test_the_rules_see_a_forbidden_import(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("import_graph", GRAPH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for folder in ("sim", "calibrate", "trainsim", "topologies", "scenarios"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "__init__.py").write_text("")
    (tmp_path / "sim" / "a.py").write_text("from trainsim.calibrate import b\n")
    (tmp_path / "calibrate" / "b.py").write_text("from trainsim.sim import a\n")
    (tmp_path / "sim" / "c.py").write_text("from trainsim.topologies import load_topology\n")  # reads a file
    monkeypatch.setattr(module, "ROOT", tmp_path)
    mods = module.modules()
    report = module.report(mods, module.imports(mods))
    assert report["forbidden_imports"] == ["trainsim.sim.a -> trainsim.calibrate.b",
                                           "trainsim.sim.c -> trainsim.topologies.load_topology"]
    assert report["module_cycles"] and report["package_cycles"]
