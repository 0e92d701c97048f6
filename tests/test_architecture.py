"""The shape of the house: import contracts (pyproject.toml's [tool.importlinter]) and room sizes."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

PACKAGES = ("planner", "runner", "nanoplan")
MAX_LINES = 600


def test_import_contracts_are_kept() -> None:
    """Layers nanoplan > runner > planner, no torch in the planner, no cycles: lint-imports exits 0."""
    exe = shutil.which("lint-imports") or pytest.fail("lint-imports is missing: pip install -e '.[dev]'")
    r = subprocess.run([exe, "--config", str(REPO / "pyproject.toml")], capture_output=True, text=True,
                       cwd=REPO, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert r.stdout.count(" KEPT") == 3, r.stdout[-3000:]


def test_contracts_catch_a_planner_that_imports_the_runner(tmp_path: Path) -> None:
    """The contracts can fail: a copy of the packages with one back-arrow breaks the layers contract."""
    exe = shutil.which("lint-imports") or pytest.fail("lint-imports is missing")
    for p in PACKAGES:
        shutil.copytree(REPO / p, tmp_path / p, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    units = tmp_path / "planner" / "units.py"
    units.write_text(units.read_text() + "\n\ndef _bad() -> None:\n    from runner import checkpoint  # noqa\n")
    r = subprocess.run([exe, "--config", str(tmp_path / "pyproject.toml"), "--no-cache"], capture_output=True,
                       text=True, cwd=tmp_path, timeout=300, env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin"})
    assert r.returncode != 0, r.stdout[-2000:] + r.stderr
    assert "Layers: nanoplan (CLI) > runner (torch) > planner (pure maths) BROKEN" in r.stdout, r.stdout[-2000:]
    assert "planner.units -> runner.checkpoint" in r.stdout, r.stdout[-2000:]


def test_no_source_file_is_over_600_lines() -> None:
    big = {str(f.relative_to(REPO)): n for p in PACKAGES for f in sorted((REPO / p).rglob("*.py"))
           if (n := len(f.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert big == {}, f"rooms too big to hold in your head (> {MAX_LINES} lines): {big}"


def test_nanoplan_version() -> None:
    from planner import __version__

    r = subprocess.run([sys.executable, "-m", "nanoplan", "--version"], capture_output=True, text=True, cwd=REPO,
                       timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == f"nanoplan {__version__}", r.stdout + r.stderr
