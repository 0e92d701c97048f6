"""Issue 30 #4: inputs that hung or misled.

`--spot --mtbi 1e-9` never answered (the Monte-Carlo's time grows as 1/MTBI; profiles refuse under 0.1 h,
the flag did not); `--checkpoint-every-minutes 1e-9` planned 52,524 checkpoints of 2.2 GB with the same
tokens and no warning; `0` silently became 60.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from planner.build import build_plan
from planner.plan import PlanRequest, SpotRequest
from planner.profiles import find_profile
from planner.spec import style_spec
from planner.spot import MC_INTERRUPTIONS
from tests.conftest import REPO

D12 = ["--gpu", "8xH100", "--depth", "12"]


def estimate(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nanoplan", "estimate", *D12, *args], capture_output=True,
                          text=True, timeout=timeout, cwd=REPO)


def test_an_absurd_mtbi_is_one_line_not_a_hang() -> None:
    r = estimate("--hours", "10", "--spot", "--mtbi", "1e-9", "--out", "/dev/null")
    lines = r.stderr.splitlines()
    assert r.returncode == 2 and len(lines) == 2 and lines[1] == "hint: e.g. --mtbi 6h", r.stderr
    assert lines[0].startswith("error: --mtbi: 1e-09 h between interruptions (3.6e-06 s for the 8xH100-SXM cluster) "
                               "is not longer than one restart of this run (") and lines[0].endswith(
        " s: start-up, checkpoint load, compile); it would never get past its start-up"), lines


def test_a_run_interrupted_too_often_is_refused_and_a_long_one_answers_with_fewer_trials() -> None:
    r = estimate("--hours", "1000", "--spot", "--mtbi", "0.1h", "--out", "/dev/null")
    assert r.returncode == 2 and r.stderr.splitlines()[0] == (
        "error: --mtbi: at 0.1 h between interruptions (of the 8xH100 cluster) this run would be interrupted about "
        "10,000 times; nanoplan models at most 5,000"), r.stderr
    req = PlanRequest(gpu="8xH100", profile=find_profile("H100-SXM"), model=style_spec("nanochat", 12, 2048, 65536),
                      hours=100, spot=SpotRequest(mtbi_hours=0.1))
    plan = build_plan(req)                                # 1,000 interruptions a run: 200 trials, not 1,000
    assert plan.spot is not None and plan.spot.trials == MC_INTERRUPTIONS // 1000 == 200
    assert plan.spot.expected_interruptions == pytest.approx(1000, rel=0.05)


def test_a_cadence_shorter_than_a_write_is_refused_and_zero_is_not_sixty(tmp_path: Path) -> None:
    r = estimate("--hours", "1", "--checkpoint-every-minutes", "1e-9", "--out", "/dev/null")
    assert r.returncode == 2 and r.stderr.splitlines() == [
        "error: --checkpoint-every-minutes: 1e-09 min is shorter than writing one checkpoint (2.07 GiB at 1 GB/s: "
        "2.23 s); the run would write checkpoints more than it trains",
        "hint: give at least 0.037 min (the default is 60; --spot picks one)"], r.stderr
    r = estimate("--hours", "1", "--checkpoint-every-minutes", "0", "--out", "/dev/null")
    assert r.returncode == 2 and r.stderr.splitlines() == [
        "error: --checkpoint-every-minutes: Input should be greater than 0"], r.stderr


def test_checkpoint_writes_that_eat_the_run_are_a_warning(tmp_path: Path) -> None:
    r = estimate("--hours", "1", "--checkpoint-every-minutes", "0.1", "--out", str(tmp_path / "p.json"))
    assert r.returncode == 0, r.stderr
    plan = json.loads((tmp_path / "p.json").read_text())
    s, step_s = plan["schedule"], plan["throughput"]["step_seconds"]
    write_s = s["num_checkpoints"] * s["checkpoint_bytes"] / 1e9            # at the assumed 1 GB/s
    share = write_s / (s["total_steps"] * step_s)
    assert share > 0.05                                                      # 2.2 GB every 6 s of training
    warn = [w for w in plan["warnings"] if w.startswith("checkpoints: ")]
    assert warn == [f"checkpoints: 0.1 min is every {s['checkpoint_every_steps']:,} steps: {s['num_checkpoints']:,} "
                    f"writes of 2.07 GiB take ~{write_s / 3600:.3g} h at 1 GB/s ({share:.0%} of the training time), "
                    "which the plan's steps do not count; checkpoint less often (--checkpoint-every-minutes)"], warn
    quiet = json.loads(estimate("--hours", "1", "--json").stdout)          # hourly: no warning
    assert not [w for w in quiet["warnings"] if w.startswith("checkpoints: ")]
