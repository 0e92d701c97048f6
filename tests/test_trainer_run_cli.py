"""`nanoplan run` of another trainer's plan from the outside: what it refuses in one line before anything starts,
what --dry-run prints, and what a crash and a Ctrl-C do (with the nanochat stand-in of tests/standins/)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from runner import runlock
from runner.metrics import read_metrics
from tests.conftest import REPO, make_tiny_plan, nanoplan_cli
from tests.launch_tree import wait_for
from tests.test_trainer_run import KNOBS, STANDINS

cli = nanoplan_cli
NANOCHAT = STANDINS / "nanochat"
CPU_PLAN = ["estimate", "--trainer", "nanochat", "--depth", "2", "--gpu", "CPU", "--precision", "fp32", "--seq-len",
            "64", "--vocab-size", "256", "--device-batch-size", "1", "--total-batch-tokens", "64",
            "--checkpoint-every-minutes", "0.01"]


def plan(tmp_path: Path, capsys, *args: str, hours: float = 0.01, name: str = "plan.json",
         steps: int | None = None) -> Path:
    """A nanochat CPU plan of `hours` (its start-up and CPU compile, 25 s, come out of them) or of `steps`."""
    length = ["--steps", str(steps)] if steps is not None else ["--hours", str(hours)]
    code, _, err = cli([*CPU_PLAN, *length, *args, "--out", name], capsys, tmp_path)
    assert code == 0, err
    return tmp_path / name


def one_line(err: str) -> None:
    lines = err.strip().splitlines()
    assert lines[0].startswith("error: ") and len(lines) <= 2 and (len(lines) == 1 or lines[1].startswith("hint: ")), err


def test_what_cannot_be_supervised_is_refused_in_one_line(tmp_path: Path, capsys) -> None:
    """Before anything starts: a nanochat version that cannot resume, a checkout without base_train.py, --probe,
    --data, --trainer-dir with a plan of nanoplan's own runner."""
    p = plan(tmp_path, capsys)
    code, _, err = cli(["run", str(p), "--run-dir", "r"], capsys, tmp_path)        # tmp_path holds no checkout
    assert code == 2 and "holds no scripts/base_train.py" in err and "--trainer-dir" in err, err
    one_line(err)
    for extra, words in ((["--probe"], "measures nanoplan's own runner"), (["--data", "d"], "reads its own data")):
        code, _, err = cli(["run", str(p), "--run-dir", "r", "--trainer-dir", str(NANOCHAT), *extra], capsys, tmp_path)
        assert code == 2 and words in err, err
        one_line(err)
    code, _, err = cli(["estimate", "--trainer", "nanochat", "--trainer-version", "2025-10", "--depth", "2", "--gpu",
                        "2xH100", "--hours", "0.1", "--out", "old.json"], capsys, tmp_path)
    assert code == 0, err
    code, _, err = cli(["run", "old.json", "--run-dir", "r", "--trainer-dir", str(NANOCHAT)], capsys, tmp_path)
    assert code == 2 and "saves only at the end of its run and cannot resume" in err, err
    one_line(err)
    own = make_tiny_plan(tmp_path / "own.json", None)
    code, _, err = cli(["run", str(own), "--trainer-dir", str(NANOCHAT), "--dry-run"], capsys, tmp_path)
    assert code == 2 and "a plan for nanoplan's own runner" in err, err
    assert not (tmp_path / "r").exists()


def test_checkpoints_of_another_gpu_count_are_refused_for_nanochat(tmp_path: Path, capsys) -> None:
    """nanochat's optimizer state is per rank (optim_*_rank{r}.pt): a 1-process plan cannot resume a 2-rank
    checkpoint; refused before anything is locked or started."""
    torch = pytest.importorskip("torch")
    p = plan(tmp_path, capsys)
    ck = tmp_path / "r" / "checkpoints"
    ck.mkdir(parents=True)
    torch.save({"x": 1}, ck / "model_000012.pt")
    (ck / "meta_000012.json").write_text('{"step": 12}')
    for r in range(2):
        torch.save({"x": 1}, ck / f"optim_000012_rank{r}.pt")
    code, _, err = cli(["run", str(p), "--run-dir", "r", "--trainer-dir", str(NANOCHAT)], capsys, tmp_path)
    assert code == 2 and "step 12 was written by 2 GPU(s) and this plan runs 1" in err, err
    assert "cannot resume it on another GPU count" in err and "hint: run it on 2 GPU(s)" in err
    one_line(err)
    assert sorted(x.name for x in (tmp_path / "r").iterdir()) == ["checkpoints"]     # no lock, no record


def test_the_runner_refuses_another_trainer_s_plan(tmp_path: Path, capsys) -> None:
    """`python -m runner.train` (a plain torchrun of nanoplan's runner) on a nanochat plan: one line, exit 2."""
    p = plan(tmp_path, capsys)
    r = subprocess.run([sys.executable, "-m", "runner.train", "--plan", str(p), "--run-dir", str(tmp_path / "r")],
                       capture_output=True, text=True, cwd=REPO, timeout=120)
    assert r.returncode == 2 and "plans nanochat's training step, not nanoplan's runner" in r.stderr, r.stderr
    assert f"run it with: nanoplan run {p}" in r.stderr


def dry_run(tmp_path: Path, p: Path, run: str = "r", **env: str) -> subprocess.CompletedProcess:
    """`nanoplan run --dry-run` as a user starts it (its launch's age counts from its own start)."""
    return subprocess.run([sys.executable, "-m", "nanoplan", "run", str(p), "--run-dir", run, "--trainer-dir",
                           str(NANOCHAT), "--dry-run"], capture_output=True, text=True, cwd=tmp_path, timeout=120,
                          env={**os.environ, **env})


def test_dry_run_prints_the_launch_it_would_make(tmp_path: Path, capsys) -> None:
    """--dry-run: what the next launch would run, nothing started. A budget too short for the start-up is refused
    when planned (planner/startup.py: nanochat compiles on a CPU too, 5 s + 20 s)."""
    code, _, err = cli([*CPU_PLAN, "--hours", "0.004", "--out", "short.json"], capsys, tmp_path)
    assert code == 2 and "after the launch's start-up and compile warm-up (25 s)" in err, err
    p = plan(tmp_path, capsys)
    r = dry_run(tmp_path, p, NANOPLAN_TRAINER_STARTUP_S="0.8")
    assert r.returncode == 0, r.stderr
    about, cmd = r.stdout.strip().splitlines()
    assert about.startswith("# nanochat starts fresh, stops at step ") and "saves every 20 steps" in about
    assert " -m scripts.base_train " in cmd and "--device-type=cpu" in cmd and "--save-every=20" in cmd
    assert f"--model-tag={(tmp_path / 'r' / 'checkpoints').resolve()}" in cmd
    assert not (tmp_path / "r").exists()


def run_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {**os.environ, **KNOBS, "NANOCHAT_BASE_DIR": str(tmp_path / "base"), "NANOPLAN_TRAINER_STARTUP_S": "0.8",
            **extra}


def test_a_crash_after_progress_restarts_from_the_newest_checkpoint(tmp_path: Path, capsys) -> None:
    """The trainer dies (exit 1) at step 27: its last lines are shown, and it is relaunched from its newest
    complete checkpoint, within the same budget; a failure before any step is not retried."""
    p = plan(tmp_path, capsys, steps=60)
    mark = tmp_path / "crashed"
    r = subprocess.run([sys.executable, "-m", "nanoplan", "run", str(p), "--run-dir", "r", "--trainer-dir",
                        str(NANOCHAT)], capture_output=True, text=True, cwd=tmp_path, timeout=120,
                       env=run_env(tmp_path, STANDIN_CRASH_ONCE=f"27:{mark}"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "error: nanochat exited with code 1 at step 27" in r.stderr and "stand-in crash at step 27" in r.stderr
    assert "restarting nanochat from its newest complete checkpoint (restart 1 of 3)" in r.stderr, r.stderr
    heads = [x for x in (tmp_path / "r" / "trainer.log").read_text().splitlines() if x.startswith("==> ")]
    saved = max(int(x.split("--resume-from-step=")[1].split()[0]) for x in heads if "--resume-from-step" in x)
    assert 20 <= saved <= 27, heads
    assert json.loads((tmp_path / "r" / "stop.json").read_text())["reason"] in ("deadline", "total_steps")
    r = subprocess.run([sys.executable, "-m", "nanoplan", "run", str(plan(tmp_path, capsys, name="p2.json")),
                        "--run-dir", "r2", "--trainer-dir", str(NANOCHAT)], capture_output=True, text=True,
                       cwd=tmp_path, timeout=120, env=run_env(tmp_path, STANDIN_CRASH_ONCE=f"0:{tmp_path / 'c2'}"))
    assert r.returncode == 1 and "error: nanochat exited with code 1 at step 0" in r.stderr, r.stderr
    assert "restarting" not in r.stderr


def test_ctrl_c_stops_the_trainer_at_once_and_a_relaunch_resumes(tmp_path: Path, capsys) -> None:
    """SIGINT to `nanoplan run` (a terminal sends it to the foreground group; the trainer runs in its own
    session): nanochat saves on no signal, so it is stopped at once; exit 0, stop.json says signal, no process
    is left, and the next launch resumes from the newest complete checkpoint."""
    p = plan(tmp_path, capsys, hours=0.01)
    run = tmp_path / "r"
    proc = subprocess.Popen([sys.executable, "-m", "nanoplan", "run", str(p), "--run-dir", "r", "--trainer-dir",
                             str(NANOCHAT)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                            env=run_env(tmp_path), start_new_session=True)
    def steps() -> int:      # the metrics rows (a first save makes it relaunch with measured figures: past that)
        rows = read_metrics(run)
        return rows[-1]["step"] if rows and rows[-1]["segment"] >= 1 else 0
    wait_for(lambda: steps() > 30 or proc.poll() is not None, 60, "training past the first save")
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, out + err
    assert "got SIGINT; stopping nanochat now (it saves on no signal)" in err, err
    stop = json.loads((run / "stop.json").read_text())
    assert stop["reason"] == "signal" and stop["signals"] == ["SIGINT"]
    assert runlock.probe(run, runlock.TRAIN_LOCK) is None and runlock.probe(run, runlock.LAUNCH_LOCK) is None
    r = dry_run(tmp_path, p)
    assert r.returncode == 0 and f"# nanochat resumes from step {stop['step']}," in r.stdout, r.stdout + r.stderr
