"""The CLI's shared behaviour: help, version, one-line errors."""

import json

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
