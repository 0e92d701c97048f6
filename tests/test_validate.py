"""`nanoplan validate`: exit codes on good, non-fitting, tampered and malformed plans; --json; --trace."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from planner.build import build_plan
from planner.fit_verdict import DEFAULT_HEADROOM
from planner.plan import PlanRequest, load_plan, save_plan
from planner.profiles import find_profile
from planner.spec import nanochat
from planner.validate import validate_paths
from tests.conftest import make_tiny_plan
from tests.errlines import error_and_hint


def nanoplan(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nanoplan", "validate", *args], capture_output=True,
                          text=True, timeout=300, env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})


@pytest.fixture
def good(tmp_path: Path) -> Path:
    return make_tiny_plan(tmp_path / "good.json", None)


@pytest.fixture
def too_big(tmp_path: Path) -> Path:
    """d32 at micro-batch 32 on one 80 GB H100: several times over."""
    req = PlanRequest(gpu="H100", profile=find_profile("H100"), model=nanochat(32), device_batch_size=32,
                      hours=1, loss_chunk_tokens=0)
    path = tmp_path / "too_big.json"
    save_plan(build_plan(req, plan_path=str(path)), path)
    return path


def edited(src: Path, dst: Path, edit) -> Path:
    d = json.loads(src.read_text())
    edit(d)
    dst.write_text(json.dumps(d))
    return dst


def test_good_plan_exits_0_and_json_parses(good: Path) -> None:
    r = nanoplan(str(good), "--json")
    assert r.returncode == 0, r.stderr
    (c,) = json.loads(r.stdout)
    plan = load_plan(good)
    assert c["path"] == str(good) and c["fits"] is True and c["consistent"] is True and c["problems"] == []
    assert c["traced_peak_bytes"] is None
    assert c["analytic_peak_bytes"] > 0 and c["per_gpu_bytes"] == plan.memory.per_gpu_bytes
    assert c["capacity_bytes"] == int(find_profile("CPU").usable_bytes * (1 - DEFAULT_HEADROOM))
    r = nanoplan(str(good))
    assert r.returncode == 0 and "all 1 plan(s) fit" in r.stdout


def test_non_fitting_plan_exits_1(good: Path, too_big: Path) -> None:
    r = nanoplan(str(good), str(too_big), "--json")
    assert r.returncode == 1, r.stderr
    ok, big = json.loads(r.stdout)
    assert ok["fits"] and not big["fits"] and big["consistent"]
    assert big["per_gpu_bytes"] > big["capacity_bytes"]
    assert any(p.startswith("does not fit") for p in big["problems"])
    r = nanoplan(str(good), str(too_big))
    assert r.returncode == 1 and "1 of 2 plan(s) failed" in r.stdout


def test_headroom_changes_the_verdict(good: Path) -> None:
    (c,) = validate_paths([str(good)], headroom=0.0)
    assert c.fits and c.capacity_bytes == find_profile("CPU").usable_bytes


def test_tampered_plan_exits_1(good: Path, tmp_path: Path) -> None:
    def edit(d: dict) -> None:
        d["model"]["n_params"] += 1
        d["memory"]["per_gpu_bytes"] //= 2
    bad = edited(good, tmp_path / "tampered.json", edit)
    r = nanoplan(str(bad), "--json")
    assert r.returncode == 1, r.stderr
    (c,) = json.loads(r.stdout)
    assert not c["consistent"]
    assert any("model.n_params" in p for p in c["problems"])
    assert any("memory.per_gpu_bytes" in p for p in c["problems"])


def test_edited_profile_is_caught(tmp_path: Path) -> None:
    req = PlanRequest(gpu="8xH100", profile=find_profile("H100"), model=nanochat(12), hours=1)
    path = tmp_path / "plan.json"
    save_plan(build_plan(req, plan_path=str(path)), path)
    bad = edited(path, tmp_path / "roomy.json", lambda d: d["request"]["profile"].update(usable_bytes=10**12))
    (c,) = validate_paths([str(bad)])
    assert any("request.profile.usable_bytes" in p for p in c.problems) and not c.ok


@pytest.mark.parametrize("content,word", [
    ('{"schema_version": 1,', "not valid JSON"),
    ("SCHEMA2", "schema_version"),
    ("UNKNOWN", "memory.bogus"),
])
def test_malformed_plans_exit_2(good: Path, tmp_path: Path, content: str, word: str) -> None:
    path = tmp_path / "bad.json"
    if content == "SCHEMA2":
        edited(good, path, lambda d: d.update(schema_version=2))
    elif content == "UNKNOWN":
        edited(good, path, lambda d: d["memory"].update(bogus=1))
    else:
        path.write_text(content)
    r = nanoplan(str(good), str(path))
    assert r.returncode == 2
    assert r.stdout == ""                                  # nothing validated: inputs are read first
    line, _ = error_and_hint(r.stderr)
    assert word in line


def test_missing_file_exits_2(tmp_path: Path) -> None:
    r = nanoplan(str(tmp_path / "nope.json"))
    assert r.returncode == 2 and "cannot read" in r.stderr


def test_trace_compares_traced_and_analytic(good: Path) -> None:
    r = nanoplan(str(good), "--trace", "--json")
    assert r.returncode == 0, r.stderr
    (c,) = json.loads(r.stdout)
    assert isinstance(c["traced_peak_bytes"], int) and c["traced_peak_bytes"] > 0
    assert abs(c["analytic_peak_bytes"] / c["traced_peak_bytes"] - 1) < 0.03
    assert c["trace_error"] == pytest.approx(c["analytic_peak_bytes"] / c["traced_peak_bytes"] - 1)
    r = nanoplan(str(good), "--trace")
    assert r.returncode == 0 and "traced" in r.stdout


NO_TORCH = """
import sys
from typer.testing import CliRunner
from nanoplan.cli import app
r = CliRunner().invoke(app, ["validate", sys.argv[1], "--json"])
assert r.exit_code == 0, r.output
assert not [m for m in sys.modules if m == "torch" or m.startswith("torch.")]
print("ok")
"""


def test_validate_does_not_import_torch(good: Path) -> None:
    out = subprocess.run([sys.executable, "-c", NO_TORCH, str(good)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().endswith("ok")
