"""Faults injected for real into 2-process gloo runs under torchrun: no completed work is lost.

- SIGKILL of one worker in the middle of training: torchrun (--max-restarts) restarts the group,
  which resumes from the newest complete checkpoint and then repeats the uninterrupted losses
  exactly;
- a kill inside a checkpoint write (after model.pt, after the optimizer file, before meta.json):
  the previous checkpoint is intact and is the one resumed from, and a watcher that polls the
  run dir during the run never sees an incomplete checkpoint listed as complete; a kill inside
  the first write leaves only debris, and the restart starts over;
- a truncated and a bit-flipped checkpoint: a relaunch names the file and the check that failed,
  sets both aside and resumes from the newest good one;
- SIGTERM to every process (launcher, torchrun, workers) and a second one during the final
  write: exit 0 within seconds, with a verified checkpoint;
- a disk-full or I/O error in the middle of a checkpoint write: exit code 4 with one error line,
  the previous checkpoint intact, and the next launch resumes from it;
- a dollar budget on a simulated clock with slow checkpoint writes and a crash in the middle:
  the run stops before the budget with its final checkpoint written, and the resumed launch
  counts the time the crashed one spent, including the part after its last checkpoint.

These complement tests/test_runner_*.py (SIGKILL of the whole group during a write, SIGTERM to
`nanoplan run`, a crashing rank 0, the hours deadline) rather than repeating them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from runner.checkpoint_layout import complete_steps, list_steps, step_dir
from runner.checkpoint_meta import read_meta, verify
from runner.launcher import child_pids
from runner.metrics import read_metrics
from tests.conftest import REPO, make_tiny_plan, runner_env, torchrun, torchrun_cmd
from tests.launch_tree import wait_for

pytestmark = pytest.mark.slow

STEPS = 40
EVERY_S = 0.12          # checkpoint cadence of these runs (wall clock)


@pytest.fixture(scope="session")
def reliability_reference(tmp_path_factory: pytest.TempPathFactory, tiny_data: Path) -> tuple[Path, Path, dict[int, float]]:
    """(plan, run_dir, loss by step) of one uninterrupted run that the faulted runs are held against.

    device batch 4 x seq 64 x 2 ranks x grad accum 2 = 1024 tokens per step, 40 steps, a
    checkpoint every 0.12 s, none deleted.
    """
    d = tmp_path_factory.mktemp("reliability_reference")
    plan = make_tiny_plan(d / "plan.json", tiny_data, steps=STEPS, device_batch_size=4, total_batch_tokens=1024,
                          checkpoint_every_minutes=EVERY_S / 60, keep_last=1000)
    r = torchrun(plan, d / "run", timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = read_metrics(d / "run")
    assert [x["step"] for x in rows] == list(range(1, STEPS + 1))
    return plan, d / "run", {x["step"]: x["loss"] for x in rows}


# ---------------------------------------------------------------- helpers

def launch(plan: Path, run: Path, *, max_restarts: int = 0, env: dict[str, str] | None = None) -> subprocess.Popen:
    """torchrun as `nanoplan run` starts it (with its restart workaround, see runner.launcher.launch_env)."""
    cmd = [f"--max-restarts={max_restarts}" if a.startswith("--max-restarts") else a for a in torchrun_cmd(plan, run)]
    env = runner_env(TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1", **(env or {}))
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def process_tree(pid: int) -> list[int]:
    out = [pid]
    for c in child_pids(pid):
        out += process_tree(c)
    return out


def kill_tree(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        for pid in reversed(process_tree(proc.pid)):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait(timeout=30)


def worker_by_rank(torchrun_pid: int) -> dict[int, int]:
    """{rank: pid} of torchrun's workers, from their environment."""
    out = {}
    for pid in child_pids(torchrun_pid):
        try:
            env = dict(kv.split("=", 1) for kv in Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in kv)
        except OSError:          # exited meanwhile
            continue
        if "RANK" in env:        # a child caught between fork and exec has torchrun's environment, not a rank yet
            out[int(env["RANK"])] = pid
    return out


def metas(run: Path) -> list[dict]:
    return [read_meta(step_dir(run, s)) for s in complete_steps(run)]


def segments(run: Path) -> list[dict]:
    return json.loads((run / "run_info.json").read_text())["segments"]


class Watcher(threading.Thread):
    """Polls a run dir during a run: each checkpoint is checksum-verified when it is first listed
    as complete (meta.json present). None may ever fail."""

    def __init__(self, run: Path) -> None:
        super().__init__(daemon=True)
        self.run_dir, self.seen, self.done = run, {}, threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            for s in complete_steps(self.run_dir):
                if s not in self.seen:
                    self.seen[s] = verify(step_dir(self.run_dir, s))
            time.sleep(0.01)

    def finish(self) -> dict[int, tuple[bool, str]]:
        self.done.set()
        self.join(timeout=10)
        assert self.seen, "the watcher saw no checkpoint"
        bad = {s: why for s, why in self.seen.items() if not why[0]}
        assert not bad, f"listed as complete but not intact: {bad}"
        return self.seen


def assert_losses_continue_exactly(run: Path, ref: dict[int, float], resumed_from: int, segment: int = 1) -> None:
    rows = [x for x in read_metrics(run) if x["segment"] == segment]
    assert [x["step"] for x in rows] == list(range(resumed_from + 1, STEPS + 1))
    assert [x["loss"] for x in rows] == [ref[x["step"]] for x in rows]      # bit-identical to the reference


# ---------------------------------------------------------------- 1. SIGKILL of one worker

def test_sigkill_of_one_worker_restarts_the_group_and_resumes_exactly(tmp_path: Path, reliability_reference) -> None:
    plan, _, ref = reliability_reference
    run = tmp_path / "run"
    proc = launch(plan, run, max_restarts=1)
    watcher = Watcher(run)
    watcher.start()
    try:
        wait_for(lambda: len(complete_steps(run)) >= 2 and len(read_metrics(run)) >= 12, what="12 steps")
        victim = worker_by_rank(proc.pid)[1]
        logged_before_kill = read_metrics(run)[-1]["step"]
        os.kill(victim, signal.SIGKILL)
        out, err = proc.communicate(timeout=120)
    finally:
        kill_tree(proc)
    seen = watcher.finish()
    assert proc.returncode == 0, err[-3000:]
    segs = segments(run)
    assert [s["restart_count"] for s in segs] == [0, 1]
    killed_launch = [m["step"] for m in metas(run) if m["segment"] == 0]
    resumed_from = segs[1]["resumed_from_step"]
    assert resumed_from == max(killed_launch)          # the newest complete checkpoint of the killed launch
    assert max(x["step"] for x in read_metrics(run) if x["segment"] == 0) >= logged_before_kill > 1
    assert_losses_continue_exactly(run, ref, resumed_from)
    assert set(complete_steps(run)) <= set(seen)


# ---------------------------------------------------------------- 2. kill inside a checkpoint write

@pytest.mark.parametrize("point,rank", [("after_model", 0), ("after_optim", 1), ("before_meta", 0)])
def test_kill_inside_a_checkpoint_write_resumes_from_the_previous_one(tmp_path: Path, reliability_reference,
                                                                       point: str, rank: int) -> None:
    """The 3rd write of the first launch dies (exit 137) at `point` on `rank`; torchrun restarts."""
    plan, _, ref = reliability_reference
    run = tmp_path / "run"
    proc = launch(plan, run, max_restarts=1,
                  env={"NANOPLAN_FAULT": point, "NANOPLAN_FAULT_AT": "3", "NANOPLAN_FAULT_RANK": str(rank)})
    watcher = Watcher(run)
    watcher.start()
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        kill_tree(proc)
    watcher.finish()
    assert proc.returncode == 0, err[-3000:]
    partial = [int(s) for s in re.findall(r"checkpoint step_(\d+) is not usable: no readable meta\.json", out)]
    assert len(partial) == 1, out
    first_launch = sorted(m["step"] for m in metas(run) if m["segment"] == 0)
    assert len(first_launch) == 2 and first_launch[-1] < partial[0]   # writes 1 and 2 survived, 3 never counted
    segs = segments(run)
    assert [s["restart_count"] for s in segs] == [0, 1]
    assert segs[1]["resumed_from_step"] == first_launch[-1]
    assert_losses_continue_exactly(run, ref, first_launch[-1])
    if partial[0] in complete_steps(run):          # the same step may be written again, by the new launch
        assert read_meta(step_dir(run, partial[0]))["segment"] == 1
    assert all(verify(step_dir(run, s))[0] for s in complete_steps(run))


def test_kill_inside_the_first_checkpoint_write_starts_over(tmp_path: Path, reliability_reference) -> None:
    """The very first write dies after model.pt: there is no checkpoint yet, only debris. The restart
    removes it and starts over (it used to refuse: "holds checkpoints but none is intact"), counting
    the time the crashed launch spent."""
    plan, _, ref = reliability_reference
    run = tmp_path / "run"
    proc = launch(plan, run, max_restarts=1, env={"NANOPLAN_FAULT": "after_model", "NANOPLAN_FAULT_AT": "1"})
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        kill_tree(proc)
    assert proc.returncode == 0, err[-3000:]
    assert "removed step_00000001: a checkpoint write that did not finish (no meta.json)" in out
    assert "no checkpoint to resume from: starting over, with " in out
    segs = segments(run)
    assert [s["restart_count"] for s in segs] == [0, 1] and segs[1]["resumed_from_step"] is None
    assert segs[1]["carried_hours"] > max(x["elapsed_hours"] for x in read_metrics(run) if x["segment"] == 0) > 0
    assert_losses_continue_exactly(run, ref, 0)


# ---------------------------------------------------------------- 3. damaged checkpoints

def test_damaged_checkpoints_are_named_and_the_resume_falls_back(tmp_path: Path, reliability_reference) -> None:
    """The finished reference run, with its newest checkpoint truncated and the one before it
    bit-flipped: a plain relaunch names both, resumes from the newest good one and finishes."""
    plan, ref_run, ref = reliability_reference
    run = tmp_path / "run"
    shutil.copytree(ref_run, run)
    *_, good, flipped, truncated = complete_steps(run)
    cut = step_dir(run, truncated) / "optim_rank0.pt"
    size = cut.stat().st_size
    with open(cut, "r+b") as f:
        f.truncate(size // 2)                       # a copy or a disk that lost the tail
    rot = step_dir(run, flipped) / "model.pt"
    data = bytearray(rot.read_bytes())
    data[len(data) // 2] ^= 0x10                    # one flipped bit, same size
    rot.write_bytes(bytes(data))
    r = torchrun(plan, run, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert (f"checkpoint step_{truncated:08d} is not usable: optim_rank0.pt has {size // 2} bytes, meta.json says "
            f"{size}; falling back to the previous one") in r.stdout
    assert f"checkpoint step_{flipped:08d} is not usable: model.pt fails its sha256 check" in r.stdout
    assert f"resumed from {step_dir(run, good)} (step {good}," in r.stdout
    assert segments(run)[1]["resumed_from_step"] == good
    assert_losses_continue_exactly(run, ref, good)
    damaged = run / "checkpoints" / ".damaged"      # kept for inspection, out of the way of the new writes
    assert sorted(p.name for p in damaged.iterdir()) == [f"step_{flipped:08d}", f"step_{truncated:08d}"]
    assert not verify(damaged / f"step_{truncated:08d}")[0]
    assert json.loads((run / "stop.json").read_text())["reason"] == "total_steps"
    assert all(verify(step_dir(run, s))[0] for s in complete_steps(run))


# ---------------------------------------------------------------- 4. SIGTERM to every process, twice

def test_sigterm_to_every_process_twice_checkpoints_and_exits_0(tmp_path: Path, tiny_plan) -> None:
    """A preemption notice reaches the launcher, torchrun's agent and the workers alike; a second
    one arrives while the final checkpoint is being written (slowed to 1 s)."""
    plan = tiny_plan(steps=1000)
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "nanoplan", "run", str(plan), "--run-dir", str(run)], cwd=REPO,
                            env=runner_env(NANOPLAN_CKPT_DELAY_S="1.0"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        wait_for(lambda: len(read_metrics(run)) >= 5 and len(process_tree(proc.pid)) == 4, what="5 steps")
        pids = process_tree(proc.pid)
        t0 = time.monotonic()
        for pid in pids:
            os.kill(pid, signal.SIGTERM)
        wait_for(lambda: set(list_steps(run)) - set(complete_steps(run)), timeout=10, what="the final write")
        for pid in pids:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        out, err = proc.communicate(timeout=90)
        took = time.monotonic() - t0
    finally:
        kill_tree(proc)
    assert proc.returncode == 0, err[-3000:]
    stop = json.loads((run / "stop.json").read_text())
    assert stop["reason"] == "signal" and stop["signals"][:2] == ["SIGTERM", "SIGTERM"]
    assert stop["step"] == read_metrics(run)[-1]["step"]          # the step in flight, and no further
    assert verify(step_dir(run, stop["step"])) == (True, "ok")
    assert list_steps(run) == complete_steps(run)           # nothing half-written left behind
    # bounded: one step, the validation-free 1 s write and process exits; far inside the 60 s
    # torchrun allows (TORCH_ELASTIC_SHUTDOWN_TIMEOUT) before it would SIGKILL the workers
    assert took < 20, took
    assert not [p for p in pids if Path(f"/proc/{p}").exists()]


# ---------------------------------------------------------------- 6. a failed write mid-run

def nanoplan_run(plan: Path, run: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nanoplan", "run", str(plan), "--run-dir", str(run)], cwd=REPO,
                          env=runner_env(**(env or {})), capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("fault,rank,errno_name,strerror,relaunch", [
    ("enospc", 1, "ENOSPC", "No space left on device", True), ("eio", 0, "EIO", "Input/output error", False)])
def test_a_failed_checkpoint_write_keeps_the_previous_one_and_stops_cleanly(
        tmp_path: Path, tiny_plan, fault: str, rank: int, errno_name: str, strerror: str, relaunch: bool) -> None:
    """The 3rd checkpoint write of `nanoplan run` fails part-way on one rank (disk full, I/O error):
    exit code 4 and one error line, no traceback; the previous checkpoint is intact and the next
    plain launch resumes from it (checked once: the relaunch is the same for both)."""
    plan = tiny_plan(steps=30, checkpoint_every_minutes=EVERY_S / 60, keep_last=1000)
    run = tmp_path / "run"
    watcher = Watcher(run)
    watcher.start()
    r = nanoplan_run(plan, run, env={"NANOPLAN_FAULT": fault, "NANOPLAN_FAULT_AT": "3",
                                     "NANOPLAN_FAULT_RANK": str(rank)})
    watcher.finish()
    assert r.returncode == 4, r.stderr[-3000:]
    assert "Traceback" not in r.stderr and "ChildFailedError" not in r.stderr, r.stderr
    errors = [x for x in r.stderr.splitlines() if x.startswith("error:")]
    assert len(errors) == 1, r.stderr
    stop = json.loads((run / "stop.json").read_text())
    failed, kept = stop["step"], complete_steps(run)
    assert stop["reason"] == "write_error" and stop["exit_code"] == 4 and stop["checkpoint"] is None
    assert len(kept) == 2 and kept[-1] < failed                  # writes 1 and 2; write 3 never listed
    assert list_steps(run) == kept                             # its partial directory is gone
    assert all(verify(step_dir(run, s)) == (True, "ok") for s in kept)
    assert errors[0] == (f"error: checkpoint step_{failed:08d} could not be written: rank {rank}: {strerror} "
                         f"[errno {errno_name}] (rng_rank{rank}.pt); stopped at step {failed}, step_{kept[-1]:08d} "
                         "is the last checkpoint (free disk space or fix the run dir, then run the same command "
                         "to resume)")
    assert read_metrics(run)[-1]["step"] == failed                # it stopped at once
    if not relaunch:
        return
    r = nanoplan_run(plan, run)                                   # the disk has room again
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"resumed from {step_dir(run, kept[-1])} (step {kept[-1]}," in r.stdout
    rows = [x for x in read_metrics(run) if x["segment"] == 1]
    assert [x["step"] for x in rows] == list(range(kept[-1] + 1, 31))
    assert json.loads((run / "stop.json").read_text())["reason"] == "total_steps"


# ---------------------------------------------------------------- 5. the budget guard

BUDGET_USD, PRICE, SCALE, DELAY_S = 4.0, 36.0, 10, 0.3   # $72/h for 2 "GPUs": $4.00 is 200 budget seconds
CRASH_STEP = 40


def test_dollar_budget_holds_across_a_crash_with_slow_writes(tmp_path: Path, tiny_data: Path) -> None:
    """Time runs 10x fast; each checkpoint write sleeps 0.3 s real (3 s of budget); rank 0 crashes
    after step 40 and torchrun restarts the group. Every dollar figure stays within $4.00, and the
    resumed launch counts what the crashed one spent after its last checkpoint and the restart."""
    plan = make_tiny_plan(tmp_path / "plan.json", tiny_data, steps=None, budget_usd=BUDGET_USD, price=PRICE,
                          checkpoint_every_minutes=0.25, keep_last=1000)
    run = tmp_path / "run"
    proc = launch(plan, run, max_restarts=1, env={"NANOPLAN_TIME_SCALE": str(SCALE), "NANOPLAN_CKPT_DELAY_S": str(DELAY_S),
                                                  "NANOPLAN_FAULT": f"step:{CRASH_STEP}"})
    try:
        wait_for(lambda: 0 in worker_by_rank(proc.pid), what="the workers")
        victim = worker_by_rank(proc.pid)[0]
        wait_for(lambda: not Path(f"/proc/{victim}").exists() or "Z" in Path(f"/proc/{victim}/stat").read_text()
                 .rsplit(")", 1)[1].split()[:1], timeout=90, what="the crash")
        crashed_at = time.time()
        out, err = proc.communicate(timeout=150)
    finally:
        kill_tree(proc)
    assert proc.returncode == 0, err[-3000:]
    segs = segments(run)
    assert [s["restart_count"] for s in segs] == [0, 1] and segs[0]["job"] == segs[1]["job"]
    rows = read_metrics(run)
    first, second = [x for x in rows if x["segment"] == 0], [x for x in rows if x["segment"] == 1]
    assert first[-1]["step"] == CRASH_STEP - 1 and second[0]["step"] == segs[1]["resumed_from_step"] + 1 < CRASH_STEP
    # the resumed launch starts from the time the crashed one had spent, not from its checkpoint's: the
    # work after that checkpoint, the crash, torchrun's restart and the new processes' start-up
    restart_s = segs[1]["clock_start_unix"] - crashed_at
    assert restart_s > 0.5, restart_s                                     # a restart takes real time ...
    counted_s = (segs[1]["carried_hours"] - first[-1]["elapsed_hours"]) * 3600
    assert counted_s >= SCALE * (restart_s - 0.1), (counted_s, restart_s)  # ... and it is paid for
    ckpt_h = read_meta(step_dir(run, segs[1]["resumed_from_step"]))["elapsed_hours"]
    assert second[0]["elapsed_hours"] > segs[1]["carried_hours"] > first[-1]["elapsed_hours"] > ckpt_h
    stop = json.loads((run / "stop.json").read_text())
    final = read_meta(step_dir(run, stop["step"]))
    assert stop["reason"] == "deadline" and stop["step"] == rows[-1]["step"] < stop["total_steps"]
    assert verify(step_dir(run, stop["step"])) == (True, "ok")
    for usd in [x["usd_spent"] for x in rows] + [final["usd_spent"], stop["usd_spent"]]:
        assert usd <= BUDGET_USD
    assert final["usd_spent"] == pytest.approx(final["elapsed_hours"] * 2 * PRICE)
    assert final["write_seconds"] >= DELAY_S * SCALE               # the slow write was measured, in budget seconds
    assert stop["usd_spent"] > 0.85 * BUDGET_USD, stop              # ... and reserved for, without quitting early
