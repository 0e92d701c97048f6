"""Real 2-process DDP runs over gloo via torchrun: learning, replicas, auto-stop, cadence, resume.

Each test launches torchrun as a subprocess with OMP_NUM_THREADS=1 (see conftest.torchrun).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runner.checkpoint_layout import complete_steps, list_steps, step_dir
from runner.checkpoint_meta import read_meta, verify
from runner.checkpoint_retention import read_best
from runner.launcher import child_pids
from runner.metrics import read_metrics
from tests.conftest import REPO, make_tiny_plan, runner_env, torchrun, torchrun_cmd

pytestmark = pytest.mark.slow


def metas(run_dir: Path) -> list[dict]:
    return [read_meta(step_dir(run_dir, s)) for s in complete_steps(run_dir)]


EVERY_S = 0.15   # checkpoint cadence of the reference run: 0.0025 minutes


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, tiny_data: Path) -> tuple[Path, Path]:
    """One uninterrupted run shared by several tests: (plan, run_dir).

    device batch 4 x seq 64 x 2 ranks x grad accum 2 = 1024 tokens per step (exercises no_sync),
    40 steps, validation every 10, a checkpoint every 0.15 s of wall clock, none deleted.
    """
    d = tmp_path_factory.mktemp("reference")
    plan = make_tiny_plan(d / "plan.json", tiny_data, steps=40, device_batch_size=4, total_batch_tokens=1024,
                          checkpoint_every_minutes=EVERY_S / 60, keep_last=1000, hyper={"val_every_steps": 10})
    r = torchrun(plan, d / "run")
    assert r.returncode == 0, r.stderr[-3000:]
    return plan, d / "run"


def test_ddp_learns_and_replicas_stay_identical(reference) -> None:
    _, run = reference
    rows = read_metrics(run)
    assert [x["step"] for x in rows] == list(range(1, 41))
    first, last = rows[0], rows[-1]
    assert first["world_size"] == 2 and first["device"] == "cpu" and first["compiled"] is False
    assert first["loss"] > 5.0                      # ~ln(256) = 5.55 at init
    assert sum(x["loss"] for x in rows[-5:]) / 5 < first["loss"] - 2.0
    vals = [x["val_loss"] for x in rows if x["step"] % 10 == 0]            # the scheduled passes, every 10 steps
    assert len(vals) == 4 and vals[-1] < vals[0] - 1.0
    by_step = {x["step"]: x.get("val_loss") for x in rows}                  # and the one before each checkpoint
    for key in ("lr", "grad_norm", "tokens_per_sec", "mfu", "step_seconds", "elapsed_hours", "usd_spent"):
        assert isinstance(last[key], float) and last[key] >= 0
    assert last["tokens_seen"] == 40 * 1024 and last["max_memory_allocated"] is None
    # replicas: every rank's parameter fingerprint is gathered into each checkpoint's meta
    ms = metas(run)
    assert ms[0]["step"] == 1 and ms[-1]["step"] == 40    # the early probe checkpoint ... the final one
    for m in ms:
        rep = m["replicas"]
        assert rep["agree"] is True and rep["kind"] == "bytes" and len(set(rep["fingerprints"])) == 1
        assert len(rep["fingerprints"]) == 2
        assert verify(step_dir(run, m["step"])) == (True, "ok")
    assert len({m["replicas"]["fingerprints"][0] for m in ms}) == len(ms)   # they do change with training
    assert all(by_step[m["step"]] == m["val_loss"] for m in ms)             # metrics.jsonl has every validation
    assert ms[-1]["val_loss"] == vals[-1]
    best = min((m for m in ms if m["val_loss"] is not None), key=lambda m: m["val_loss"])
    assert read_best(run)["step"] == best["step"]
    assert json.loads((run / "stop.json").read_text())["reason"] == "total_steps"
    info = json.loads((run / "run_info.json").read_text())
    assert info["world_size"] == 2 and info["plan_hash"] == ms[0]["plan_hash"] and info["device"] == "cpu"


def test_checkpoints_follow_wall_clock_not_steps(reference) -> None:
    _, run = reference
    ms = metas(run)
    assert len(ms) >= 4
    max_step_s = max(x["step_seconds"] for x in read_metrics(run))
    periodic = ms[:-1]                               # the final one is written at stop, not by the clock
    for a, b in zip(periodic, periodic[1:], strict=False):
        gap = (b["elapsed_hours"] - a["elapsed_hours"]) * 3600
        assert gap >= EVERY_S                                     # never before the interval is over
        # ... and at the first step after it: about one step late, plus evaluations and this write
        assert gap <= EVERY_S + 2 * max_step_s + 2 * b["eval_seconds"] + b["write_seconds"] + 0.5, (a, b)


def test_estimate_plan_runs_as_is_and_stops_at_the_deadline(tmp_path: Path, tiny_data: Path) -> None:
    """A plan straight from `nanoplan estimate --gpu 2xCPU --hours 0.01`; time runs 4x fast and
    every checkpoint write is slow (0.25 s real = 1 s of budget)."""
    plan = tmp_path / "plan.json"
    r = subprocess.run([sys.executable, "-m", "nanoplan", "estimate", "--gpu", "2xCPU", "--preset", "tiny", "--hours", "0.01",
                        "--total-batch-tokens", "1024", "--data", str(tiny_data), "--out", str(plan),
                        "--max-epochs", "1000"],      # the tiny data would stop it at 4 epochs, long before the clock
                       capture_output=True, text=True, timeout=60, cwd=REPO)
    assert r.returncode == 0, r.stderr
    assert json.loads(plan.read_text())["budget"]["limited_by"] == "hours"
    run = tmp_path / "run"
    env = runner_env(NANOPLAN_TIME_SCALE="4", NANOPLAN_CKPT_DELAY_S="0.25")
    r = subprocess.run([sys.executable, "-m", "nanoplan", "run", str(plan), "--run-dir", str(run)], capture_output=True, text=True,
                       timeout=90, cwd=REPO, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    stop = json.loads((run / "stop.json").read_text())
    rows = read_metrics(run)
    assert stop["reason"] == "deadline" and stop["step"] == rows[-1]["step"] < rows[-1]["total_steps"]
    final = step_dir(run, stop["step"])
    assert verify(final) == (True, "ok")
    meta = read_meta(final)
    assert meta["elapsed_hours"] <= 0.01           # the budget is never exceeded, final write included
    assert stop["elapsed_hours"] <= 0.01
    assert meta["write_seconds"] >= 1.0            # the slow write was measured and reserved for
    assert meta["elapsed_hours"] * 3600 > 36 / 2   # ... without stopping absurdly early


def test_resume_after_sigkill_repeats_the_uninterrupted_losses(tmp_path: Path, reference) -> None:
    plan, ref = reference
    ref_loss = {x["step"]: x["loss"] for x in read_metrics(ref)}

    run = tmp_path / "run"
    proc = subprocess.Popen(torchrun_cmd(plan, run), cwd=REPO, env=runner_env(NANOPLAN_CKPT_DELAY_S="1.0"),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    killed_during = None
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            done = complete_steps(run)
            pending = [s for s in list_steps(run) if s not in done and done and s > done[-1]]
            if done and done[-1] >= 3 and pending:
                killed_during = pending[0]
                for pid in [*child_pids(proc.pid), proc.pid]:   # the workers (own sessions) and torchrun
                    os.kill(pid, signal.SIGKILL)
                break
            time.sleep(0.02)
    finally:
        if proc.poll() is None and killed_during is None:
            for pid in [*child_pids(proc.pid), proc.pid]:
                os.kill(pid, signal.SIGKILL)
        proc.wait(timeout=30)
    assert killed_during is not None, "the run ended before it could be killed"
    resume_step = complete_steps(run)[-1]
    assert not verify(step_dir(run, killed_during))[0]
    before = read_metrics(run)

    r = torchrun(plan, run)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"checkpoint step_{killed_during:08d} is not usable: no readable meta.json" in r.stdout
    rows = read_metrics(run)
    resumed = [x for x in rows if x["segment"] == 1]
    assert resumed[0]["step"] == resume_step + 1 and resumed[-1]["step"] == 40
    for x in resumed:
        assert x["loss"] == pytest.approx(ref_loss[x["step"]], rel=1e-6, abs=1e-6), x["step"]
    # elapsed time and dollars carry over: the killed launch's time is not forgotten
    assert resumed[0]["elapsed_hours"] > max(x["elapsed_hours"] for x in before)
    info = json.loads((run / "run_info.json").read_text())
    assert [s["resumed_from_step"] for s in info["segments"]] == [None, resume_step]


def test_crashed_worker_is_restarted_by_torchrun_and_resumes(tmp_path: Path, tiny_plan) -> None:
    plan = tiny_plan(steps=30, checkpoint_every_minutes=0.002)
    run = tmp_path / "run"
    env = runner_env(NANOPLAN_FAULT="step:15")      # rank 0 dies (exit 137) after step 15, first launch only
    r = subprocess.run([sys.executable, "-m", "nanoplan", "run", str(plan), "--run-dir", str(run), "--max-restarts", "1"],
                       capture_output=True, text=True, timeout=120, cwd=REPO, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    info = json.loads((run / "run_info.json").read_text())
    segs = info["segments"]
    assert [s["restart_count"] for s in segs] == [0, 1]
    resumed_from = segs[1]["resumed_from_step"]
    assert 1 <= resumed_from < 15
    rows = read_metrics(run)
    assert max(x["step"] for x in rows if x["segment"] == 0) == 14   # died after step 15, before logging it
    assert [x["step"] for x in rows if x["segment"] == 1] == list(range(resumed_from + 1, 31))
    assert json.loads((run / "stop.json").read_text())["reason"] == "total_steps"
