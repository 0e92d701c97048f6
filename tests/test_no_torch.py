"""Importing planner and running estimate/compare/validate must not import torch."""

import subprocess
import sys

CODE = """
import sys
import planner, planner.build, nanoplan
from typer.testing import CliRunner
from nanoplan.cli import app
r = CliRunner()
for args in (["estimate", "--gpu", "8xH100", "--budget", "1000", "--depth", "20"],
             ["estimate", "--gpu", "8xH100", "--budget", "1000"],
             ["profiles"], ["schema"]):
    res = r.invoke(app, args)
    assert res.exit_code == 0, (args, res.output)
bad = [m for m in sys.modules if m == "torch" or m.startswith("torch.")]
assert not bad, bad[:5]
print("ok")
"""


def test_planner_does_not_import_torch() -> None:
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().endswith("ok")
