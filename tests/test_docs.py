"""The documentation: the README as a front page, the MkDocs site in docs/ builds strictly, its CLI reference
lists every command of the app, and what modules cite is in docs/."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
#: the README is a front page; the rest lives in docs/
README_MAX_BYTES = 10_240
#: modules that still cite a design document outside the repository, until their owner points them at docs/


def _generator():
    spec = importlib.util.spec_from_file_location("gen_cli_reference", ROOT / "docs" / "gen_cli_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _app_commands() -> list[str]:
    """Every command of the Typer app as typed (``trainsim topo show``), walked here independently of the
    generator."""
    import typer.main

    from trainsim.cli import app

    paths = []

    def walk(command, words):
        for name, sub in (getattr(command, "commands", None) or {}).items():
            if not sub.hidden:
                paths.append(" ".join([*words, name]))
                walk(sub, [*words, name])

    walk(typer.main.get_command(app), ["trainsim"])
    return paths


def test_readme_is_a_front_page():
    text = README.read_text(encoding="utf-8")
    assert README.stat().st_size <= README_MAX_BYTES, "the README is a front page: move the details to docs/"
    # the two set-up commands CI runs (.ci/run), and the main job
    assert 'pip install torch==2.13.0 -e ".[calibrate,dev]"' in text
    assert re.search(r"^pytest\b", text, re.MULTILINE)
    assert "trainsim quickstart" in text


def test_readme_links_resolve():
    text = README.read_text(encoding="utf-8")
    links = [target for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text) if "://" not in target]
    assert links, "the README points at the docs"
    missing = [target for target in links if not (ROOT / target).exists()]
    assert not missing, f"README links to files that do not exist: {missing}"


def test_cli_reference_lists_every_command():
    page = _generator().render()
    headings = set(re.findall(r"^#+ (trainsim(?: [\w-]+)*)$", page, re.MULTILINE))
    commands = _app_commands()
    assert len(commands) > 20
    missing = [path for path in commands if path not in headings]
    assert not missing, f"commands missing from the CLI reference: {missing}"
    for path in commands:  # each command's usage line, as --help prints it
        assert re.search(rf"^Usage: {re.escape(path)}( |$)", page, re.MULTILINE), path


def test_docs_build_strictly(tmp_path):
    pytest.importorskip("mkdocs")
    site = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(ROOT / "mkdocs.yml"),
         "--site-dir", str(site)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    cli = (site / "reference" / "cli" / "index.html").read_text(encoding="utf-8")
    for path in _app_commands():
        assert f'id="{path.replace(" ", "-")}"' in cli, f"{path} is not in the built CLI reference"
    assert (site / "import_graph.png").exists()


def _module_files():
    for folder in ("sim", "calibrate", "topologies", "scenarios", "trainsim"):
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix in (".py", ".yaml") and path.is_file():
                yield path


#: a design document outside the repository: REFERENCE.md, "TECHNIQUES 4", shared/DESIGN.md, ...
EXTERNAL = re.compile(r"\b(?:REFERENCE|DESIGN|TECHNIQUES)\.md\b|\bREFERENCE\b|\bTECHNIQUES\s+\d"
                      r"|shared/[A-Z]+\.md")


def test_modules_cite_docs_in_the_repository():
    outside, missing = [], []
    for path in _module_files():
        rel = path.relative_to(ROOT).as_posix()
        text = path.read_text(encoding="utf-8")
        if EXTERNAL.search(text):
            outside.append(rel)
        missing += [f"{rel}: {doc}" for doc in re.findall(r"\bdocs/[\w./-]+\.md\b", text)
                    if not (ROOT / doc).exists()]
    assert not outside, f"cite the docs/ page instead of a document outside the repository: {outside}"
    assert not missing, f"cited docs pages that do not exist: {missing}"
