"""Issue 30 #3: a separate `nanoplan probe` could wreck a live run, and two probes on one --dir raced.

`nanoplan probe P --dir RUN/probe --out RUN/plan.probed.json` beside a live `run --probe --run-dir RUN`
replaced the run's probed plan (its next resume probed again, was charged, and refused "checkpoints of
a different plan"); two probes on one --dir at the same instant cleaned each other's trials, and one
picked the smaller micro-batch because the other held the plan's own. Now a probe holds its DIR's lock
and, when it writes into a run dir, that run dir's launch lock (runner/probe.py probe_locks).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

from runner import runlock
from tests.conftest import REPO, make_tiny_plan, runner_env
from tests.test_reliability_faults import wait_for


def nanoplan(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nanoplan", *args], capture_output=True, text=True, timeout=timeout,
                          cwd=REPO, env=env or runner_env())


def errors(r: subprocess.CompletedProcess) -> list[str]:
    return [x for x in r.stderr.splitlines() if x.startswith("error:")]


def test_a_probe_into_a_live_run_dir_is_refused_and_touches_nothing(tmp_path: Path, tiny_data: Path) -> None:
    plan = make_tiny_plan(tmp_path / "plan.json", tiny_data, steps=None, hours=0.01)
    run = tmp_path / "run"
    run.mkdir()
    (run / "plan.probed.json").write_text("the live run's probed plan\n")
    live = runlock.RunLock.acquire(run, runlock.LAUNCH_LOCK, "nanoplan run")      # a run in progress
    try:
        r = nanoplan("probe", str(plan), "--dir", str(run / "probe"), "--out", str(run / "plan.probed.json"))
    finally:
        live.release()
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert errors(r) == [f"error: --dir: {run} is in use by nanoplan run (PID {os.getpid()} on host "
                         f"{socket.gethostname()}, since {errors(r)[0].split(', since ')[1].split(')')[0]}); the probe "
                         "would replace what that process uses"], r.stderr
    assert (run / "plan.probed.json").read_text() == "the live run's probed plan\n"
    assert not (run / "probe" / "trials").exists()


def test_two_probes_on_one_dir_and_a_launch_beside_a_probe_are_refused(tmp_path: Path, tiny_data: Path) -> None:
    """The first probe (its trial hangs) holds RUN/probe and RUN: a second probe on the same --dir, and
    `run --probe` on that run dir, are each refused in one line, and the first probe's trial is untouched."""
    plan = make_tiny_plan(tmp_path / "plan.json", tiny_data, steps=None, hours=0.01)
    run = tmp_path / "run"
    first = subprocess.Popen([sys.executable, "-m", "nanoplan", "probe", str(plan), "--dir", str(run / "probe"),
                              "--out", str(run / "plan.probed.json"), "--trial-timeout", "300"],
                             cwd=REPO, env=runner_env(NANOPLAN_PROBE_FAULT="hang:*"), stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        wait_for(lambda: first.poll() is not None or any((run / "probe" / "trials").glob("*/plan.json")), timeout=120,
                 what="the first probe's trial")
        assert first.poll() is None
        trial = next((run / "probe" / "trials").glob("*/plan.json"))
        second = nanoplan("probe", str(plan), "--dir", str(run / "probe"), "--out", str(tmp_path / "other.json"))
        assert second.returncode == 2 and len(errors(second)) == 1, second.stderr[-3000:]
        assert errors(second)[0].startswith(f"error: --dir: {run / 'probe'} is in use by nanoplan probe (PID "
                                            f"{first.pid} on host "), second.stderr
        launch = nanoplan("run", str(plan), "--probe", "--run-dir", str(run))
        assert launch.returncode == 2 and errors(launch)[0].startswith(
            f"error: --run-dir: {run} is in use by nanoplan probe (PID {first.pid} on host "), launch.stderr
        assert trial.is_file() and not (tmp_path / "other.json").exists()
    finally:
        os.killpg(first.pid, signal.SIGTERM)
        first.wait(timeout=60)
    assert first.returncode == 130, first.stderr.read()[-3000:] if first.stderr else ""
