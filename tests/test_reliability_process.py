"""What a second launch, a closed terminal, an early Ctrl-C, a relaunch by hand, a stepped wall clock
and a full disk outside a checkpoint do to `nanoplan run` (issue 14, items 2-7).

Every multi-process test is a real `nanoplan run` (2 CPU workers over gloo under torchrun). See
docs/reliability.md for the table these rows belong to.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import select
import signal
import socket
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path

import pytest

from planner.plan import load_plan
from runner import runlock
from runner.checkpoint_layout import step_dir
from runner.checkpoint_meta import verify
from runner.launcher import handles_sigterm
from runner.ledger import PREPAID_S
from runner.metrics import read_metrics
from runner.preflight import run_preflight
from tests.conftest import REPO, runner_env
from tests.test_reliability_faults import kill_tree, process_tree, segments, wait_for

pytestmark = pytest.mark.slow


def start(plan: Path, run: Path, *extra: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "nanoplan", "run", str(plan), "--run-dir", str(run), *extra],
                            cwd=REPO, env=runner_env(**(env or {})), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)


class Terminal:
    """`nanoplan run` on a pseudo-terminal that is its controlling terminal, as in an interactive shell.
    close() hangs the terminal up (an ssh session dropped, a terminal window closed): the kernel sends
    SIGHUP to the launcher, and every later write to the terminal, the workers' included, fails (EIO)."""

    def __init__(self, args: list[str]) -> None:
        self.master, slave = pty.openpty()
        self.proc = subprocess.Popen(args, cwd=REPO, env=runner_env(), stdin=slave, stdout=slave, stderr=slave,
                                     start_new_session=True,
                                     preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0))  # noqa: PLW1509
        os.close(slave)
        self.out = bytearray()
        self.stop = threading.Event()
        self.reader = threading.Thread(target=self._drain, daemon=True)
        self.reader.start()

    def _drain(self) -> None:
        while not self.stop.is_set():
            if select.select([self.master], [], [], 0.05)[0]:
                try:
                    data = os.read(self.master, 1 << 16)
                except OSError:
                    return
                if not data:
                    return
                self.out += data

    def close(self) -> None:
        self.stop.set()
        self.reader.join(timeout=10)
        os.close(self.master)      # the last reference to the master: the terminal hangs up


def error_lines(err: str) -> list[str]:
    assert "Traceback" not in err and "ChildFailedError" not in err, err[-3000:]
    return [x for x in err.splitlines() if x.startswith("error:")]


def workers_of(proc: subprocess.Popen) -> list[int]:
    return [p for p in process_tree(proc.pid) if p != proc.pid][1:]    # below torchrun


def gone(pids: list[int]) -> bool:
    return not [p for p in pids if Path(f"/proc/{p}").exists()
                and Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"]


# ---------------------------------------------------------------- items 2 and 3: a second launch, SIGHUP, kill -9

def test_a_second_launch_is_refused_and_sighup_or_kill_9_of_the_launcher_stops_the_run(tmp_path: Path,
                                                                                        tiny_plan) -> None:
    """While a run trains, a second `nanoplan run` on its run dir is refused (exit 2, naming the PID and
    host). Closing the run's terminal (SIGHUP to the launcher, EIO for every write to it) stops the run
    like SIGTERM: checkpoint, exit 0, no process left. The relaunch resumes; kill -9 of its launcher
    alone still makes the workers checkpoint and exit (torchrun dies with its launcher), and the
    locks are free again."""
    plan = tiny_plan(steps=100_000)
    run = tmp_path / "run"
    term = Terminal([sys.executable, "-m", "nanoplan", "run", str(plan), "--run-dir", str(run)])
    a = term.proc
    try:
        wait_for(lambda: len(read_metrics(run)) >= 3, timeout=90, what="3 steps")
        b = subprocess.run([sys.executable, "-m", "nanoplan", "run", str(plan), "--run-dir", str(run)], cwd=REPO,
                           env=runner_env(), capture_output=True, text=True, timeout=60)
        assert b.returncode == 2, b.stderr[-3000:]
        (line,) = error_lines(b.stderr)
        assert line.startswith(f"error: --run-dir: {run} is in use by nanoplan run (PID {a.pid} on host "
                               f"{socket.gethostname()}, since "), line
        assert f"kill -TERM {a.pid} on {socket.gethostname()}" in b.stderr
        pids = process_tree(a.pid)
        assert len(pids) == 4
        term.close()
        a.wait(timeout=60)
        wait_for(lambda: gone(pids), timeout=30, what="every process to exit")
    finally:
        kill_tree(a)
    assert a.returncode == 0, term.out.decode(errors="replace")[-3000:]
    stop = json.loads((run / "stop.json").read_text())
    assert stop["reason"] == "signal" and stop["signals"] and stop["step"] == read_metrics(run)[-1]["step"]
    assert verify(step_dir(run, stop["step"])) == (True, "ok")
    assert [r["step"] for r in read_metrics(run)] == list(range(1, stop["step"] + 1))   # one writer only
    assert {r["segment"] for r in read_metrics(run)} == {0}

    tmp = tmp_path / "tmp"                   # the system's temp dir of the relaunch: nothing may land there
    tmp.mkdir()
    a2 = start(plan, run, env={"TMPDIR": str(tmp)})   # resumes; then its launcher alone is killed with -9
    try:
        wait_for(lambda: any(r["segment"] == 1 for r in read_metrics(run)), timeout=90, what="the resumed run")
        pids = process_tree(a2.pid)
        os.kill(a2.pid, signal.SIGKILL)
        a2.wait(timeout=10)
        wait_for(lambda: gone(pids), timeout=60, what="torchrun and the workers to follow their launcher")
    finally:
        kill_tree(a2)
    stop2 = json.loads((run / "stop.json").read_text())
    assert stop2["reason"] == "signal" and stop2["segment"] == 1 and stop2["step"] > stop["step"]
    assert verify(step_dir(run, stop2["step"])) == (True, "ok")
    wait_for(lambda: runlock.probe(run, runlock.LAUNCH_LOCK) is None and runlock.probe(run, runlock.TRAIN_LOCK)
             is None, timeout=30, what="the locks to be released by the kernel")
    # a launcher killed with -9 cleans nothing up: its status file and torchrun's log folder are in the run dir,
    # where the next launch finds them, not in the temp dir (it held nanoplan-status-*.json and torchelastic_*).
    # torch's compile cache (torchinductor_USER) stays where torch keeps it, shared by every run
    assert [p.name for p in tmp.iterdir() if not p.name.startswith("torchinductor_")] == []
    assert [len(list(d.iterdir())) for d in (run / "torchrun").iterdir()] == [1, 1]   # one attempt per launch


def test_locks_name_their_holder_and_die_with_it(tmp_path: Path, tiny_plan) -> None:
    """A training lock held by a live process (workers left over from a killed launcher) refuses a
    launch before anything starts; a holder killed with -9 releases it by itself."""
    run = tmp_path / "run"
    run.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from pathlib import Path; from runner.runlock import RunLock, TRAIN_LOCK; "
        f"RunLock.acquire(Path({str(run)!r}), TRAIN_LOCK, 'a training worker'); print('locked', flush=True); "
        "time.sleep(60)")], cwd=REPO, env=runner_env(), stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        held = runlock.probe(run, runlock.TRAIN_LOCK)
        assert held and held["pid"] == holder.pid and held["host"] == socket.gethostname()
        with pytest.raises(runlock.RunDirBusy, match=f"PID {holder.pid} on host"):
            runlock.RunLock.acquire(run, runlock.TRAIN_LOCK, "test")
        r = subprocess.run([sys.executable, "-m", "nanoplan", "run", str(tiny_plan()), "--run-dir", str(run)],
                           cwd=REPO, env=runner_env(), capture_output=True, text=True, timeout=60)
        assert r.returncode == 2, r.stderr
        (line,) = error_lines(r.stderr)
        assert f"is in use by a training worker (PID {holder.pid} on host {socket.gethostname()}" in line
        assert not (run / "metrics.jsonl").exists() and not (run / "checkpoints").exists()
        assert runlock.probe(run, runlock.LAUNCH_LOCK) is None     # the refused launch let go of its own lock
    finally:
        holder.kill()
        holder.wait(timeout=10)
    assert runlock.probe(run, runlock.TRAIN_LOCK) is None
    runlock.RunLock.acquire(run, runlock.TRAIN_LOCK, "test").release()


# ---------------------------------------------------------------- item 4: Ctrl-C in the first seconds

def test_ctrl_c_in_the_first_seconds_stops_the_run(tmp_path: Path, tiny_plan) -> None:
    """SIGINT before torchrun exists (during the preflight): exit 130, nothing started. SIGINT the moment torchrun's first
    worker exists (before it has imported torch, let alone installed its handlers): the run stops
    after one step with a checkpoint and exit 0 -- no worker killed, no torchrun restart."""
    plan = tiny_plan(steps=100_000)
    early = start(plan, tmp_path / "early", env={"NANOPLAN_PREFLIGHT_DELAY_S": "30"})   # SIGINT lands in it
    try:   # `nanoplan run` catches signals from the start of its command, before the preflight
        wait_for(lambda: handles_sigterm(early.pid), timeout=60, what="the launcher's handlers")
        assert not workers_of(early)
        os.kill(early.pid, signal.SIGINT)
        out, err = early.communicate(timeout=60)
    finally:
        kill_tree(early)
    assert early.returncode == 130, err
    assert error_lines(err) == ["error: interrupted by SIGINT before the launch; nothing was started"], err
    assert not (tmp_path / "early" / "metrics.jsonl").exists()

    run = tmp_path / "run"
    p = start(plan, run)
    try:
        wait_for(lambda: workers_of(p), timeout=60, what="the first worker")
        first = workers_of(p)[0]
        unready = not handles_sigterm(first)
        os.kill(p.pid, signal.SIGINT)
        out, err = p.communicate(timeout=90)
    finally:
        kill_tree(p)
    assert p.returncode == 0, err[-3000:]
    assert "got SIGINT" in err and "exitcode" not in err
    stop = json.loads((run / "stop.json").read_text())
    assert stop["reason"] == "signal" and stop["signals"], stop
    assert stop["step"] <= 2 and verify(step_dir(run, stop["step"])) == (True, "ok")
    assert [s["restart_count"] for s in segments(run)] == [0]     # torchrun restarted nothing
    print(f"worker had no SIGTERM handler yet when signalled: {unready}")


# ---------------------------------------------------------------- items 5 and 6: the budget clock

TICK = 0.02      # a process's start time is known to the kernel's clock tick (10 ms)

SITE = """
import os, time
_jump = float(os.environ.get("TEST_WALL_JUMP_S") or 0)
if _jump and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") not in ("", "0"):
    _real = time.time
    time.time = lambda: _real() + _jump        # an NTP step of the wall clock, in the restarted workers
"""


def test_start_up_killed_launches_and_wall_clock_steps_are_counted_right(tmp_path: Path, tiny_plan) -> None:
    """Launch 1 is killed with -9 (every process) before any worker wrote a line; it still counts.
    Launch 2 counts its own start-up; its rank 0 crashes after step 3 and torchrun restarts it with
    the wall clock stepped +1 h: the restart carries the launch's time (on a monotonic clock), not an hour. No figure
    exceeds the real time the launches took by more than the one prepaid heartbeat of the launch killed with -9
    (issue 22: a killed launch is never counted short)."""
    plan = tiny_plan(steps=100_000)
    run = tmp_path / "run"
    t1 = time.monotonic()
    l1 = start(plan, run)
    try:
        wait_for(lambda: len(process_tree(l1.pid)) >= 2, timeout=60, what="launch 1's torchrun")
        time.sleep(1.5)
        assert not read_metrics(run), "launch 1 got further than its start-up; the test needs it killed earlier"
        d1 = time.monotonic() - t1
        kill_tree(l1)
    finally:
        kill_tree(l1)

    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITE)
    env = {"PYTHONPATH": f"{site}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "TEST_WALL_JUMP_S": "3600",
           "NANOPLAN_FAULT": "step:3"}
    t2 = time.monotonic()
    l2 = start(plan, run, "--max-restarts", "1", env=env)
    try:
        wait_for(lambda: read_metrics(run), timeout=90, what="launch 2's first step")
        first_seen = time.monotonic() - t2
        wait_for(lambda: [r for r in read_metrics(run) if r["segment"] == 1][2:], timeout=90, what="the restart")
        os.kill(l2.pid, signal.SIGTERM)
        out, err = l2.communicate(timeout=60)
    finally:
        kill_tree(l2)
    d2 = time.monotonic() - t2
    assert l2.returncode == 0, err[-3000:]
    segs = segments(run)
    assert [s["restart_count"] for s in segs] == [0, 1]
    carried = segs[0]["carried_hours"] * 3600
    assert d1 - 1.0 <= carried <= d1 + PREPAID_S + TICK, (carried, d1)   # launch 1, killed in its start-up, counts
    rows = read_metrics(run)
    start_up = rows[0]["elapsed_hours"] * 3600 - carried       # launch 2's start-up and first step count
    assert first_seen - 2.0 <= start_up <= first_seen + TICK, (start_up, first_seen)
    restart_carried = segs[1]["carried_hours"] * 3600             # launch 1 + launch 2 up to the restart
    assert carried + first_seen - 2.0 <= restart_carried <= d1 + d2 + PREPAID_S, (restart_carried, d1 + d2)  # not +1 h
    stop = json.loads((run / "stop.json").read_text())
    assert stop["reason"] == "signal"
    for h in [r["elapsed_hours"] for r in rows] + [stop["elapsed_hours"]]:
        assert h * 3600 <= d1 + d2 + PREPAID_S, (h * 3600, d1 + d2)   # never more than the real time (+ the prepaid beat)
    ledger = json.loads((run / "launches.json").read_text())["launches"]
    assert [r["state"] for r in ledger] == ["running", "ended"]    # launch 1 never got to say it ended
    assert ledger[1]["carried_s"] == pytest.approx(carried)


# ---------------------------------------------------------------- item 7: a full disk outside a checkpoint write

@pytest.mark.parametrize("target", ["metrics", "run_info"])
def test_disk_full_outside_a_checkpoint_write_stops_with_exit_4(tmp_path: Path, tiny_plan, target: str) -> None:
    """ENOSPC in the 5th metrics.jsonl line, or in run_info.json before the first step: exit 4 and one
    error line, no traceback, no torchrun restart, stop.json written; after the metrics failure the
    final checkpoint still keeps the work."""
    plan = tiny_plan(steps=40)
    run = tmp_path / "run"
    p = start(plan, run, env={"NANOPLAN_FAULT": f"enospc:{target}", "NANOPLAN_FAULT_AT": "5" if target == "metrics" else "1"})
    try:
        out, err = p.communicate(timeout=120)
    finally:
        kill_tree(p)
    assert p.returncode == 4, err[-3000:]
    (line,) = error_lines(err)
    stop = json.loads((run / "stop.json").read_text())
    assert stop["reason"] == "write_error" and stop["exit_code"] == 4 and stop["error"] == line[len("error: "):]
    if target == "run_info":
        assert line == (f"error: {run / 'run_info.json'} could not be written: No space left on device "
                        "[errno ENOSPC]; stopped before the first step (free disk space or fix the run dir, then "
                        "run the same command to resume)")
        assert not read_metrics(run)
        return
    assert line == (f"error: {run / 'metrics.jsonl'} could not be written: No space left on device [errno ENOSPC]; "
                    "stopped at step 6, step_00000006 is the last checkpoint (free disk space or fix the run dir, "
                    "then run the same command to resume)")
    assert [r["step"] for r in read_metrics(run)] == [1, 2, 3, 4]
    assert stop["step"] == 6 and verify(step_dir(run, 6)) == (True, "ok")
    assert [s["restart_count"] for s in segments(run)] == [0]


def test_preflight_counts_the_checkpoint_written_before_retention_frees_one(tmp_path: Path, tiny_plan,
                                                                              monkeypatch) -> None:
    """With room for exactly the kept checkpoints (keep_last + the best), the write of the next one,
    before retention deletes the oldest, would fill the disk: preflight refuses it."""
    import shutil as sh

    plan = load_plan(tiny_plan(steps=400, checkpoint_every_minutes=0.001, keep_last=2))
    s = plan.schedule
    # the plan's own figure already counts the one being written (estimate and preflight agree, issue 23)
    assert s.num_checkpoints > s.keep_last + 2 and s.storage_bytes == (s.keep_last + 2) * s.checkpoint_bytes
    real = sh.disk_usage

    def disk(free: int):
        monkeypatch.setattr("runner.preflight.shutil.disk_usage",
                            lambda p: real(p)._replace(free=free))

    disk((s.keep_last + 1) * s.checkpoint_bytes)
    pf = run_preflight(plan, "plan.json", tmp_path / "run", None, False)
    assert len(pf.problems) == 1 and "(keep_last + the best + the one being written)" in pf.problems[0], pf.problems
    disk((s.keep_last + 2) * s.checkpoint_bytes)
    assert run_preflight(plan, "plan.json", tmp_path / "run", None, False).ok


def test_a_multi_node_rendezvous_wait_is_counted(tmp_path: Path, tiny_plan) -> None:
    """Two "nodes" on loopback; node 1 starts 3 s before node 0 (whose rank 0 keeps the clock) and
    waits for it in the rendezvous. That wait was paid for: rank 0's first metrics line counts the
    time since node 1's launcher started."""
    from tests.test_multinode import free_port

    plan = tiny_plan(steps=3, gpu="2x1xCPU")
    run = tmp_path / "run"
    port = free_port()
    common = ["--nnodes", "2", "--rdzv-endpoint", f"127.0.0.1:{port}", "--max-restarts", "0"]
    t1 = time.monotonic()
    n1 = start(plan, run, *common, "--node-rank", "1")
    n0 = None
    try:
        time.sleep(3.0)
        n0 = start(plan, run, *common, "--node-rank", "0")
        wait_for(lambda: read_metrics(run), timeout=120, what="the first step")
        seen = time.monotonic() - t1
        outs = [p.communicate(timeout=120) for p in (n0, n1)]
    finally:
        for p in (n0, n1):
            if p is not None:
                kill_tree(p)
    for p, (_out, err) in zip((n0, n1), outs, strict=True):
        assert p.returncode == 0, err[-3000:]
    first = read_metrics(run)[0]["elapsed_hours"] * 3600
    assert seen - 2.0 <= first <= seen + TICK, (first, seen)
