"""The simulator must run where torch is absent: sim/, topologies/, scenarios/ and the simulate CLI."""

import subprocess
import sys

SCRIPT = r"""
import importlib, pkgutil, sys

class NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("torch is not installed here")

sys.meta_path.insert(0, NoTorch())
import trainsim.sim as sim
for info in pkgutil.iter_modules(sim.__path__):
    importlib.import_module(f"trainsim.sim.{info.name}")
from typer.testing import CliRunner
from trainsim.cli import app
result = CliRunner().invoke(app, ["simulate", "ddp-resnet50-pcie-4gpu-gen3", "--json"])
assert result.exit_code == 0, result.output
assert not [m for m in sys.modules if m == "torch" or m.startswith("torch.")]
print("ok")
"""


def test_simulator_imports_and_runs_without_torch():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().endswith("ok")
