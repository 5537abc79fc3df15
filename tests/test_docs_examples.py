"""The Python examples of the docs run as they are written: every ```python block of a page, in order, in one
namespace, from the repository's root (as the pages say), and what they print is what the pages show next to
them where the figures are not the simulator's to change."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def blocks(page: str, language: str) -> list[str]:
    """The fenced ``language`` blocks of docs/``page``, in order."""
    text = (ROOT / "docs" / page).read_text(encoding="utf-8")
    return re.findall(rf"^```{language}\n(.*?)^```$", text, re.MULTILINE | re.DOTALL)


def run_page(page: str, monkeypatch, capsys) -> list[str]:
    """Run every Python block of ``page``; return the lines they printed."""
    monkeypatch.chdir(ROOT)
    code = blocks(page, "python")
    assert code, f"docs/{page} has no Python example"
    namespace: dict = {"__name__": f"docs_{Path(page).stem.replace('-', '_')}"}
    for block in code:
        exec(compile(block, f"docs/{page}", "exec"), namespace)  # noqa: S102 - the docs' own examples
    return capsys.readouterr().out.splitlines()


@pytest.fixture
def clean_registry():
    """The strategy the example registers leaves the registry afterwards (the shipped ones it imports stay:
    their modules register only when first imported)."""
    from trainsim.sim.strategies import registry

    yield
    registry._REGISTRY.pop("allreduce-once", None)


def test_add_strategy_example_registers_and_simulates(monkeypatch, capsys, clean_registry):
    from trainsim.sim.strategies.registry import get_strategy

    printed = run_page("how-to/add-strategy.md", monkeypatch, capsys)
    assert get_strategy("allreduce-once").name == "allreduce-once"
    rows = {line.split()[0]: [float(x) for x in re.findall(r"(\d+\.\d+) ms", line)] for line in printed}
    assert set(rows) == {"ddp", "allreduce-once"}
    (ddp_ms, ddp_comm), (once_ms, once_comm) = rows["ddp"], rows["allreduce-once"]
    # one all-reduce after the whole backward exposes more communication than DDP's overlapped buckets
    assert once_comm > ddp_comm and once_ms > ddp_ms
    shown = blocks("how-to/add-strategy.md", "text")[0].splitlines()
    assert [line.split()[0] for line in shown] == ["ddp", "allreduce-once"]


def test_python_page_session_runs(monkeypatch, capsys):
    printed = run_page("reference/python.md", monkeypatch, capsys)
    shown = [line for block in blocks("reference/python.md", "text") for line in block.splitlines()]
    assert len(printed) == len(shown)
    # what the pages show that no model change moves: the resolved batch and ranks, the error, the stop
    stable = [0, 3, 6]
    assert [printed[i] for i in stable] == [shown[i] for i in stable]
    assert printed[5].startswith("step 4: 50.92 ms measured, ")  # the trace's own measurement
    assert printed[1].endswith("oom: []")
