"""The budget across relaunches and stalls, and the probe in its lane (issue 22, items 1-8).

Fast tests here drive the budget guard, the ledger and the CLI in-process (the probe's trials
faked where they would only cost time); the slow ones are real `nanoplan run` / `nanoplan probe`
processes (2 CPU workers over gloo under torchrun), killed, stopped and relaunched for real. The
property test of the promise (random kills, stalls and relaunches, the probe included) is in
tests/test_budget_promise.py. See docs/reliability.md for the table these rows belong to.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from planner.plan import load_plan, plan_hash
from runner import ledger
from runner.clock import BudgetGuard, boottime
from runner.schedule import DeadlineSchedule
from tests.conftest import REPO, make_tiny_plan, runner_env
from tests.test_probe import fake_trials
from tests.test_reliability_faults import kill_tree, wait_for
from tests.test_reliability_input import nanoplan as cli

# ---------------------------------------------------------------- item 1: the ledger, heartbeats and orphans


def record(rid: str, phash: str, carried: float, spent: float, state: str = "ended", **kw: object) -> dict:
    return {"id": rid, "plan_hash": phash, "host": "h", "pid": 1, "carried_s": carried, "spent_s": spent,
            "state": state, **kw}


def test_orphaned_workers_time_and_probed_plans_count_towards_the_budget(tmp_path: Path) -> None:
    """The rank-0 worker's own heartbeat (orphans of a launcher killed with -9) is folded into its
    launch's record; a `run --probe` launch killed in its probe (recorded under the plan it probes)
    counts towards the probed plan made later from the same plan, and another plan's launches do not."""
    (tmp_path / ledger.LEDGER).write_text(json.dumps({"launches": [
        record("a", "src", 0.0, 12.0, "running"),                       # killed during its probe
        record("b", "probed", 12.0, 5.0, "running", source_hash="src"),  # killed: its workers lived on
        record("c", "other", 0.0, 99.0),
    ]}))
    (tmp_path / ledger.ALIVE).write_text(json.dumps({"id": "b", "spent_s": 9.5, "final": True}))
    recs = ledger.read_ledger(tmp_path)
    assert [r["spent_s"] for r in recs] == [12.0, 9.5, 99.0]          # b's workers ran 4.5 s past its last beat
    assert ledger.budget_keys(recs, "probed") == {"probed", "src"}
    assert ledger.spent_before_s(tmp_path, "probed") == 12.0 + 9.5
    assert ledger.spent_before_s(tmp_path, "src") == 21.5               # a new probe of the same plan
    assert ledger.spent_before_s(tmp_path, "other") == 99.0
    ledger.write_record(tmp_path, record("d", "probed", 21.5, 1.0, "running", source_hash="src"))
    on_disk = json.loads((tmp_path / ledger.LEDGER).read_text())["launches"]
    assert on_disk[1]["spent_s"] == 9.5                                 # the fold is persisted by the next write


def test_heartbeats_count_ahead_and_the_last_beat_is_exact(tmp_path: Path, monkeypatch) -> None:
    """A launch killed at any moment is never counted short: every beat counts PREPAID_S ahead; the last
    one (a clean end) is exact. An orphaned worker's last beat also counts torchrun's exit after it."""
    from runner.clock import ENV_LAUNCH_ID, ENV_LAUNCH_PID, ENV_LAUNCH_T0
    from runner.launcher import Launch

    t0 = boottime() - 5.0
    launch = Launch(tmp_path, node_rank=0, plan_hash="p", launch_id="L", t0=t0, scale=1.0)
    launch.start(carried_s=3.0)
    first = ledger.read_ledger(tmp_path)[0]
    assert first["carried_s"] == 3.0 and 5.0 + ledger.PREPAID_S <= first["spent_s"] < 5.5 + ledger.PREPAID_S
    time.sleep(3 * ledger.HEARTBEAT_S)
    beat = ledger.read_ledger(tmp_path)[0]["spent_s"]
    assert beat >= boottime() - t0 + ledger.PREPAID_S - ledger.HEARTBEAT_S - 0.3, "the heartbeat thread is not beating"
    launch.finish()
    end = ledger.read_ledger(tmp_path)[0]
    assert end["state"] == "ended" and abs(end["spent_s"] - (boottime() - t0)) < 0.3

    monkeypatch.setenv(ENV_LAUNCH_ID, "W")
    monkeypatch.setenv(ENV_LAUNCH_T0, repr(t0))
    monkeypatch.setenv(ENV_LAUNCH_PID, "1")                              # not our launcher: an orphan
    hb = ledger.worker_heartbeat(tmp_path)
    assert hb is not None and ledger.read_alive(tmp_path)["spent_s"] >= boottime() - t0 + ledger.PREPAID_S - 0.3
    hb.stop()
    assert ledger.read_alive(tmp_path)["spent_s"] >= boottime() - t0 + ledger.ORPHAN_EXIT_S - 0.3
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:                                                                 # a launcher that lives: exact
        from runner.clock import process_start_boottime

        monkeypatch.setenv(ENV_LAUNCH_PID, str(proc.pid))
        monkeypatch.setenv(ENV_LAUNCH_T0, repr(process_start_boottime(proc.pid)))
        assert ledger.launcher_alive()
        hb = ledger.worker_heartbeat(tmp_path)
        hb.stop()
        assert ledger.read_alive(tmp_path)["spent_s"] < boottime() - process_start_boottime(proc.pid) + 0.3
    finally:
        proc.kill()
        proc.wait()


def test_a_spent_run_starts_nothing(tmp_path: Path, tiny_data: Path) -> None:
    """A relaunch of a run whose budget is spent reads the ledger first and exits at once: one line,
    exit 0, no launch record, no torchrun, no worker (no run_info.json), no probe."""
    plan = make_tiny_plan(tmp_path / "plan.json", tiny_data, steps=None, hours=0.002)   # 7.2 s
    run = tmp_path / "run"
    run.mkdir()
    body = json.dumps({"launches": [record("x", plan_hash(load_plan(plan)), 0.0, 7.0)]})
    (run / ledger.LEDGER).write_text(body)
    for extra in ([], ["--resume"], ["--probe"]):
        t = time.monotonic()
        r = subprocess.run([sys.executable, "-m", "nanoplan", "run", str(plan), "--run-dir", str(run), *extra],
                           capture_output=True, text=True, timeout=120, cwd=REPO, env=runner_env())
        took = time.monotonic() - t
        assert r.returncode == 0, r.stderr[-3000:]
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"nothing to do: the budget of {run} is spent: 7.0 s of "
                                                       "its 7.2 s were used before this launch, which has taken "), lines
        assert lines[0].endswith("; nothing was started"), lines
        assert (run / ledger.LEDGER).read_text() == body                 # no launch recorded
        names = {p.name for p in run.iterdir()}                         # no run_info.json: no worker; no probe/
        assert names == {ledger.LEDGER} | ({".nanoplan.lock"} if "--probe" in extra else set()), names
        print(f"{extra}: {took:.2f} s")


# ---------------------------------------------------------------- item 3: a stall

def simulate_stall(stall_s: float, *, deadline: float = 180.0, step_s: float = 180 / 9897, planned: int = 9897,
                   stall_at_s: float = 60.0) -> tuple[int, float, float]:
    """The trainer's loop (runner/train.py: propose and stop test from rank 0's clock, then the step is
    observed), on a budget clock, with the whole run stopped for `stall_s` at `stall_at_s`.
    Returns (the step it stops at, the budget seconds then, the LR multiplier of its last step)."""
    guard = BudgetGuard(deadline_s=deadline, ckpt_bytes=0)
    guard.observe_checkpoint(0.4)
    sched = DeadlineSchedule(planned, 100, 0.2, "linear")
    t = prev = 0.0
    step, stalled = 0, False
    while True:
        mult = sched.multiplier(step)
        t += step_s
        if not stalled and t >= stall_at_s:
            t, stalled = t + stall_s, True
        step += 1
        projected = sched.propose(step, t, guard, ckpt_every_s=0.0, last_ckpt_s=0.0, val_every=0)
        stop = guard.should_stop(t)
        sched.apply(step, projected)
        guard.observe_step(t - prev)
        prev = t
        if stop or step >= sched.total:
            return step, t, mult


def test_a_stall_does_not_waste_the_budget_and_the_warmdown_ends() -> None:
    """Issue 22 #3: SIGSTOP of the whole run for 60 s at t = 60 s of a 180 s plan. The stalled step is
    not taken for the next step's length (the guard used to keep 2 x 60 s back and stop at 120 s with
    the LR at its peak); the schedule re-projects at once, so the run uses the budget and the LR ends
    its warmdown."""
    step, t, mult = simulate_stall(60.0)
    assert t > 175.0, (step, t)                        # 180 s less the reserve and two steps
    assert mult < 0.01, mult                          # the warmdown ended at the stop
    step0, t0, mult0 = simulate_stall(0.0)
    assert t0 > 175.0 and mult0 < 0.01 and step0 > 9800
    assert 9897 / 2 < step < 9897 * 0.7                # the 60 s stall cost a third of the steps, no more


def test_a_resumed_launch_reprojects_past_its_start_up_with_the_saved_step_time() -> None:
    """A relaunch's start-up is time the saved projection did not know of, like a stall: the resumed
    launch re-projects at its second step with the saved seconds per step (it has not timed its own
    yet), so a short last launch still ends its warmdown; its first step keeps the saved projection."""
    from runner.schedule import MIN_INTERVALS, SKIP_INTERVALS, Timing, project_final_step

    guard = BudgetGuard(deadline_s=100.0, ckpt_bytes=0)
    guard.observe_checkpoint(1.0)
    guard.observe_step(0.5)
    saved = {**DeadlineSchedule(10_000, 0, 0.2, "linear").state(), "total": 150, "projected_at": 50, "step_s": 0.5}
    sched = DeadlineSchedule.resume(saved, 10_000, 0, 0.2, "linear")
    kw = {"ckpt_every_s": 0.0, "last_ckpt_s": 0.0, "val_every": 0}
    assert sched.propose(61, 70.0, guard, **kw) == 150                # resumed at step 60, 70 s used
    expect = project_final_step(62, 10_000, Timing(now_s=70.5, deadline_s=100.0, reserve_s=1.5, step_s=0.5,
                                                   margin_s=0.5))
    assert sched.propose(62, 70.5, guard, **kw) == expect == 62 + 54 + 1
    assert sched.state()["step_s"] == 0.5
    for k in range(63, 63 + SKIP_INTERVALS + MIN_INTERVALS):          # then its own step times take over
        got = sched.propose(k, 70.5 + (k - 62) * 0.25, guard, **kw)
    assert got > expect and sched.state()["step_s"] == 0.25


# ---------------------------------------------------------------- item 2: the probe charged once

def test_run_probe_leaves_the_charge_to_the_launch_clock(tmp_path, tiny_data, monkeypatch) -> None:
    """`run --probe` does not also take the probe's cost off the plan (its launch clock, started before the
    probe, counts it); `nanoplan probe` alone still does, since no launch clock counts it there."""
    from runner.probe import probe, probe_for_run

    plan = make_tiny_plan(tmp_path / "plan.json", tiny_data, steps=None, hours=0.05, total_batch_tokens=128)
    monkeypatch.setenv("NANOPLAN_TIME_SCALE", "100")             # a 0.2 s fake trial is 20 budget seconds
    fake_trials(monkeypatch, 0.2)
    path, res = probe_for_run(plan, tmp_path / "run", log=lambda s: None)
    assert res is not None and res.report["cost"]["seconds"] >= 20
    assert load_plan(path).request.hours == 0.05
    assert res.report["charged"].startswith("counted on the run's own clock")
    alone = probe(plan, out=tmp_path / "alone.json", work_dir=tmp_path / "p", log=lambda s: None)
    assert alone.corrected.request.hours == pytest.approx(0.05 - alone.report["cost"]["hours"])


# ---------------------------------------------------------------- item 5: links in a run dir

@pytest.mark.parametrize("link", ["probe", "plan.probed.json", "probe/trials", "checkpoints"])
def test_a_run_dir_with_a_linked_managed_path_is_refused(tmp_path, tiny_data, monkeypatch, link: str) -> None:
    """Issue 22 #5: RUN/probe a link to another folder: `run --probe` deleted victim/trials/b8/precious.txt,
    overwrote victim/probe.json and wrote profile.yaml there. Every managed path that is a link is
    refused (exit 2, one line) before anything is cleaned or written, wherever it leads."""
    plan = make_tiny_plan(tmp_path / "plan.json", tiny_data, steps=30, total_batch_tokens=128)
    ran = fake_trials(monkeypatch, 0.0)
    run, victim = tmp_path / "run", tmp_path / "victim"
    (victim / "trials" / "b1").mkdir(parents=True)
    (victim / "trials" / "b1" / "precious.txt").write_text("keep me\n")
    (victim / "probe.json").write_text("{}\n")
    target = victim / "probe.json" if link.endswith(".json") else victim if link != "checkpoints" else run / "real"
    (run / link).parent.mkdir(parents=True, exist_ok=True)
    target.mkdir(exist_ok=True) if link == "checkpoints" else None
    (run / link).symlink_to(target)
    before = {p: p.read_bytes() for p in victim.rglob("*") if p.is_file()}
    code, out, err = cli("run", str(plan), "--probe", "--run-dir", str(run))
    assert code == 2, err
    lines = [x for x in err.splitlines() if x.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"error: preflight: {run / link} is a link"), lines
    assert ran == [] and {p: p.read_bytes() for p in victim.rglob("*") if p.is_file()} == before
    assert not (victim / "profile.yaml").exists() and not (run / "launches.json").exists()


# ---------------------------------------------------------------- item 7: a probe with no room

def test_a_probe_with_no_room_says_so_in_one_line_before_any_trial(tmp_path, tiny_data, monkeypatch) -> None:
    """Issue 22 #7: a read-only or full --out or --dir ended in an OSError traceback, found only after every
    trial had run. Every place the probe writes is checked first (a real write, as root too), and a
    failed write at any time is one line and exit 4."""
    import runner.probe as rp

    plan = make_tiny_plan(tmp_path / "plan.json", tiny_data, steps=30, total_batch_tokens=128)
    ran = fake_trials(monkeypatch, 0.0)
    (tmp_path / "afile").write_text("not a directory\n")

    def probe(*args: str) -> str:
        code, out, err = cli("probe", str(plan), *args)
        assert code == 4, (code, err)
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
        return lines[0]

    line = probe("--dir", "/proc/nanoplan-probe", "--out", str(tmp_path / "o.json"))
    assert line.startswith("error: /proc/nanoplan-probe") and line.endswith(
        "; nothing was probed (free disk space, or give the probe another --dir or --out)"), line
    line = probe("--dir", str(tmp_path / "p"), "--out", str(tmp_path / "afile" / "plan.json"))
    assert line.startswith(f"error: {tmp_path / 'afile'}") and "[errno " in line, line
    assert ran == []                                              # found before the first trial

    real = rp.shutil.disk_usage
    monkeypatch.setattr(rp.shutil, "disk_usage", lambda p: real(p)._replace(free=4096))
    line = probe("--dir", str(tmp_path / "p"), "--out", str(tmp_path / "o.json"))
    assert "No space left on device [errno ENOSPC]" in line and ran == [], line
    monkeypatch.setattr(rp.shutil, "disk_usage", real)

    def full(path, text):  # noqa: ANN001, ANN202 - the disk fills up while the trials run
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(rp, "atomic_write_text", full)
    line = probe("--dir", str(tmp_path / "p"), "--out", str(tmp_path / "o.json"))
    assert line == (f"error: {tmp_path / 'p' / 'probe.json'} could not be written: No space left on device "
                    f"[errno ENOSPC]; the trials ran (their logs are in {tmp_path / 'p' / 'trials'}) (free disk space, or give "
                    "the probe another --dir or --out)"), line
    assert ran == ["b1"]


# ---------------------------------------------------------------- item 8: prepare-data killed mid-write

def test_prepare_data_removes_the_temporaries_of_killed_writers(tmp_path: Path) -> None:
    """Issue 22 #8: prepare-data killed mid-write left hidden .train.bin.*.tmp files (1.2 GB after two
    kills) that no later run removed. A temporary names its writer (PID, host); the next prepare-data
    removes those of dead writers, and leaves a live writer's, another host's, and links alone."""
    big = tmp_path / "big.txt"
    big.write_bytes(b"the quick brown fox jumps over the lazy dog\n" * 400_000)      # 17.6 MB
    out = tmp_path / "data"
    cmd = [sys.executable, "-m", "nanoplan", "prepare-data", str(big), "--out", str(out), "--chunk-mb", "0.05"]
    killed = 0
    for _ in range(2):
        p = subprocess.Popen(cmd, cwd=REPO, env=runner_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_for(lambda p=p: p.poll() is not None or any(f.stat().st_size for f in out.glob(".train.bin.*.tmp")),
                     timeout=60, what="a temporary output being written")
        finally:
            p.kill()
            p.wait()
        killed += p.returncode == -signal.SIGKILL
    n_dead = len(list(out.glob(".*.tmp")))          # train and val of the last one (it removed the first's)
    assert killed == 2 and n_dead >= 1 and list(out.glob(".train.bin.*.tmp"))
    r = subprocess.run(cmd[:-2], capture_output=True, text=True, timeout=120, cwd=REPO, env=runner_env())
    assert r.returncode == 0, r.stderr
    assert not [f.name for f in out.iterdir() if f.name.endswith(".tmp")]
    assert f"note: removed {n_dead} temporary file(s)" in r.stderr and f"left in {out} by a prepare-data that was " \
        "killed" in r.stderr, r.stderr

    from runner.prepare import _temp_prefix

    live = out / (_temp_prefix("val.bin") + "live.tmp")              # this test process: alive
    other = out / ".train.bin.w1-elsewhere.abcdefgh.tmp"              # another host's writer
    (tmp_path / "victim").write_text("keep\n")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    link = out / f".train.bin.w{int(dead.stdout)}-{_temp_prefix('x').split('-', 1)[1]}zzzzzzzz.tmp"
    for f in (live, other):
        f.write_bytes(b"x" * 10)
    link.symlink_to(tmp_path / "victim")
    r = subprocess.run(cmd[:-2], capture_output=True, text=True, timeout=120, cwd=REPO, env=runner_env())
    assert r.returncode == 0, r.stderr
    left = sorted(f.name for f in out.iterdir() if f.name.endswith(".tmp"))
    assert left == sorted([live.name, other.name, link.name]), left
    assert (tmp_path / "victim").read_text() == "keep\n" and "note: removed" not in r.stderr


# ---------------------------------------------------------------- items 2, 4 and 6: real probes, killed

def start(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "nanoplan", *args], cwd=REPO, env=runner_env(**(env or {})),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def trial_processes(trial: Path) -> list[int]:
    """The live processes of a trial: its workers (pid files) and their parent, torchrun."""
    from runner.launcher import pid_alive

    pids = [int(f.read_text()) for f in trial.glob("pid_rank*")]
    parents = []
    for pid in pids:
        try:
            parents.append(int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]))
        except (OSError, ValueError, IndexError):
            pass
    return [p for p in {*pids, *parents} if p > 1 and pid_alive(p)]


def kill_trial_processes(trial: Path) -> None:
    """Whatever is left of a trial (only when the test fails: nothing must be)."""
    for pid in trial_processes(trial):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def wait_trial_workers(trial: Path, proc: subprocess.Popen) -> list[int]:
    """Wait until both workers of the trial run (they hang in their first step: NANOPLAN_PROBE_FAULT)."""
    wait_for(lambda: len(trial_processes(trial)) == 3 or proc.poll() is not None, timeout=120,
             what=f"the trial's workers in {trial}")
    assert proc.poll() is None, proc.communicate()
    procs = trial_processes(trial)
    assert len(procs) == 3, procs                       # torchrun and two workers
    return procs


HANG = {"NANOPLAN_PROBE_FAULT": "hang:*"}


@pytest.mark.slow
def test_run_probe_takes_the_lock_first_is_recorded_and_its_trials_die_with_it(tmp_path, tiny_data) -> None:
    """Issue 22 #2, #4, #6 with real trials (2 workers under torchrun, hanging in their first step):
    `run --probe` locks the run dir before any trial, and records its launch before the probe; a second
    `run --probe` is refused at once (exit 2, naming the live PID) and starts no trial; kill -9 of the
    first takes its trial down with it (torchrun and both workers), and its record counts the time up
    to the kill; SIGTERM during a probe: exit 130, one line, no trial left, the launch recorded."""
    plan = make_tiny_plan(tmp_path / "plan.json", tiny_data, steps=None, hours=0.05, total_batch_tokens=128)
    run = tmp_path / "run"
    trial = run / "probe" / "trials" / "b1"
    t_a = time.monotonic()
    a = start("run", str(plan), "--probe", "--run-dir", str(run), env=HANG)
    try:
        procs = wait_trial_workers(trial, a)
        (rec,) = ledger.read_ledger(run)                  # recorded before the probe started its trial
        assert rec["pid"] == a.pid and rec["state"] == "running" and rec["source_hash"] == plan_hash(load_plan(plan))
        pid_files = {f.name: f.read_text() for f in trial.glob("pid_rank*")}
        t_b = time.monotonic()
        b = subprocess.run([sys.executable, "-m", "nanoplan", "run", str(plan), "--probe", "--run-dir", str(run)],
                           cwd=REPO, env=runner_env(**HANG), capture_output=True, text=True, timeout=60)
        took_b = time.monotonic() - t_b
        assert b.returncode == 2, b.stderr[-3000:]
        (line,) = [x for x in b.stderr.splitlines() if x.startswith("error:")]
        assert line.startswith(f"error: --run-dir: {run} is in use by nanoplan run (PID {a.pid} on host "), line
        assert {f.name: f.read_text() for f in trial.glob("pid_rank*")} == pid_files    # its trial untouched
        assert len(ledger.read_ledger(run)) == 1 and sorted(p.name for p in trial.parent.iterdir()) == ["b1"]
        assert trial_processes(trial) == procs
        os.kill(a.pid, signal.SIGKILL)
        a.wait(timeout=10)
        d_a = time.monotonic() - t_a
        wait_for(lambda: not trial_processes(trial), timeout=30, what="the trial to die with its launcher")
    finally:
        kill_tree(a)
        kill_trial_processes(trial)
    (rec,) = ledger.read_ledger(run)
    assert rec["state"] == "running" and d_a - 1.0 <= rec["spent_s"] <= d_a + ledger.PREPAID_S, (rec, d_a)
    print(f"second launch refused in {took_b:.2f} s")

    t_c = time.monotonic()
    c = start("run", str(plan), "--probe", "--run-dir", str(run), env=HANG)
    try:
        procs = wait_trial_workers(trial, c)
        os.kill(c.pid, signal.SIGTERM)
        _out, err = c.communicate(timeout=60)
        d_c = time.monotonic() - t_c
        wait_for(lambda: not trial_processes(trial), timeout=30, what="the trial to stop")
    finally:
        kill_tree(c)
        kill_trial_processes(trial)
    assert c.returncode == 130, err[-3000:]
    assert [x for x in err.splitlines() if x.startswith("error:")] == [
        "error: interrupted by SIGTERM before the launch; nothing was started"], err[-3000:]
    first, second = ledger.read_ledger(run)
    assert second["pid"] == c.pid and second["state"] == "interrupted" and second["carried_s"] == first["spent_s"]
    assert 0 < second["spent_s"] <= d_c, (second, d_c)


@pytest.mark.slow
def test_probe_trials_die_with_a_probe_closed_by_sighup(tmp_path, tiny_data) -> None:
    """Issue 22 #6: SIGHUP (or SIGTERM) of `nanoplan probe` during a hanging trial left torchrun and two
    workers alive past the trial's own time box. Now: one line, exit 130, and the trial is gone."""
    plan = make_tiny_plan(tmp_path / "plan.json", tiny_data, steps=30, total_batch_tokens=128)
    pdir = tmp_path / "probe"
    p = start("probe", str(plan), "--dir", str(pdir), "--out", str(tmp_path / "out.json"), env=HANG)
    try:
        wait_trial_workers(pdir / "trials" / "b1", p)
        os.kill(p.pid, signal.SIGHUP)
        _out, err = p.communicate(timeout=60)
        wait_for(lambda: not trial_processes(pdir / "trials" / "b1"), timeout=30, what="the trial to stop")
    finally:
        kill_tree(p)
        kill_trial_processes(pdir / "trials" / "b1")
    assert p.returncode == 130, err[-3000:]
    assert [x for x in err.splitlines() if x.startswith("error:")] == [
        "error: interrupted by SIGHUP during the probe; its trial was stopped"], err[-3000:]
