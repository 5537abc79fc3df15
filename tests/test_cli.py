"""The CLI's shared behaviour: help, version, one-line errors."""

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from trainsim.cli import app

runner = CliRunner()


def test_help_lists_commands():
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    assert "version" in result.output


def test_version_json():
    result = runner.invoke(app, ["version", "--json"])
    assert result.exit_code == 0
    assert json.loads(result.output)["trainsim"]


#: the CLI in a fresh interpreter where ``import torch`` fails as it does where torch is not installed
WITHOUT_TORCH = "import sys; sys.modules['torch'] = None; from trainsim.cli import main; main()"


@pytest.mark.parametrize("args", [["calibrate", "describe", "tiny-cnn"], ["calibrate", "--model", "tiny-cnn"],
                                  ["execute", "validate-cpu", "--json"]])
def test_a_command_that_needs_torch_says_so_in_one_line_where_it_is_missing(args, tmp_path):
    run = subprocess.run([sys.executable, "-c", WITHOUT_TORCH, *args], capture_output=True, text=True,
                         cwd=tmp_path)
    assert run.returncode == 2
    assert run.stderr.count("\n") == 1 and run.stderr.startswith("error: `trainsim ")
    assert "needs torch (the calibrate extra): pip install torch" in run.stderr
    if "--json" in args:
        assert json.loads(run.stdout)["exit_code"] == 2
    assert not any(tmp_path.iterdir())  # refused before anything was written
