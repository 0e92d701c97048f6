"""RUN_DIR/launches.json: every `nanoplan run` launch and the budget time it has used so far.

`nanoplan run` (node rank 0) appends its record before it spawns anything (torchrun, or the
trials of `--probe`), and a heartbeat thread rewrites it every HEARTBEAT_S while it runs, and
once, exactly, when it ends:

    {"launches": [{"id", "plan_hash", "source_hash", "budget_key", "source_key", "host", "pid", "carried_s",
                   "spent_s", "state"}, ...]}

- carried_s: budget seconds the run had used before this launch (the most that any record
  of the run says: this ledger, the checkpoints' meta.json, metrics.jsonl);
- spent_s: real seconds since this launch's process started, on a monotonic clock. While the
  launch runs, each heartbeat counts PREPAID_S ahead, so a launch killed with -9 at any moment
  (during its start-up, its probe, or training) is never counted short; it is counted at most
  PREPAID_S long.
- source_hash: the plan the user passed (`run --probe` runs the probed plan made from it, and
  records the probed plan's hash as plan_hash once the probe is done).
- budget_key, source_key: what those two plans ARE for the budget (planner.plan.budget_key: the plan
  without the fields a resume may change, its checkpoint cadence and keep_last). A relaunch with a
  changed `--checkpoint-every-minutes` or `--keep-last` is a new plan hash but the same run: its
  launch carries every earlier launch's time (issue 30 #2: keyed by plan hash alone, eleven killed
  launches and one with a new cadence ran 1.37x the budget).

Workers outlive a launcher that is killed with -9 alone: torchrun is told to stop, and the
workers finish their step and checkpoint. The rank-0 worker therefore keeps its own heartbeat,
RUN_DIR/.nanoplan.alive.json ({"id", "spent_s"}: its launch's age, PREPAID_S ahead, exact when it
exits), and every reader of the ledger folds it into that launch's record: the time orphaned
workers ran until they died is counted.

The next launch carries max(carried_s + spent_s) over the run's records that name its plan: its
plan hash or budget key, or one linked to them by a record (a probed plan and its source). Gaps between launches
(a relaunch by hand an hour later) are not counted: the machines need not have been rented.
Plain Python, no torch.
"""

from __future__ import annotations

import json
import math
import os
import socket
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from planner.errors import PlanError
from planner.plan import Plan, atomic_write_text
from runner.runfiles import Ledger, problem_of, read_json_file

LEDGER = "launches.json"
ALIVE = ".nanoplan.alive.json"
HEARTBEAT_S = 0.5          # how often a launch, and its rank-0 worker, rewrite their spent time
PREPAID_S = 1.0            # each heartbeat counts this far ahead (the next beat is due in HEARTBEAT_S)
ORPHAN_EXIT_S = 2.0        # an orphaned worker's last beat counts torchrun's own exit after it (0.9 s measured
                           # on a loaded 2-core box, torch 2.13 CPU): nobody else is left to count it


def read_ledger(run_dir: Path) -> list[dict[str, Any]]:
    """The records of RUN_DIR/launches.json ([] when there is none), with the rank-0 worker's own
    heartbeat (ALIVE) folded into its launch's record; a malformed ledger is refused."""
    p = Path(run_dir) / LEDGER
    data, problem = read_json_file(p)
    if problem is None and data is None:
        return []
    if problem is None:
        problem = problem_of(Ledger, data, str(p))[1]
    if problem is not None:
        raise PlanError(str(p), problem.removeprefix(f"{p}: "),
                        "move it away; the run then counts only what metrics.jsonl and the checkpoints say")
    recs: list[dict[str, Any]] = data["launches"]
    alive = read_alive(run_dir)
    if alive is not None:
        for r in recs:
            if r["id"] == alive["id"]:
                r["spent_s"] = max(float(r["spent_s"]), alive["spent_s"])
    return recs


def read_alive(run_dir: Path) -> dict[str, Any] | None:
    """The rank-0 worker's heartbeat {"id", "spent_s", ...}, or None (absent or unreadable: it only adds time)."""
    data, problem = read_json_file(Path(run_dir) / ALIVE)
    if problem is not None or not isinstance(data, dict):
        return None
    spent = data.get("spent_s")
    if not isinstance(data.get("id"), str) or not _finite(spent):
        return None
    return {**data, "spent_s": float(spent)}


def _ids(r: dict[str, Any]) -> set[str]:
    """The plan hashes and budget keys a record names."""
    return {v for v in (r.get("plan_hash"), r.get("source_hash"), r.get("budget_key"), r.get("source_key"))
            if isinstance(v, str)}


def budget_keys(records: list[dict[str, Any]], plan_hash: str, also: Iterable[str] = (),
                key: str | None = None) -> set[str]:
    """The plan hashes and budget keys whose records count towards this plan's budget: the plan itself, its
    budget key (`key`, planner.plan.budget_key: the same run with another checkpoint cadence or keep_last),
    the plan a `run --probe` made it from (source_hash), and everything a record links to those (the other
    probed plans made from that source, their keys)."""
    keys = {plan_hash, *also} | ({key} if key else set())
    grew = True
    while grew:
        grew = False
        for r in records:
            ids = _ids(r)
            if ids & keys and not ids <= keys:
                keys |= ids
                grew = True
    return keys


def _counts(r: dict[str, Any], keys: set[str]) -> bool:
    return bool(_ids(r) & keys)


def ledger_total_s(records: list[dict[str, Any]], plan_hash: str, skip: set[str | None] | None = None,
                   also: Iterable[str] = (), key: str | None = None) -> float:
    """The most budget seconds any record of this plan (but those in `skip`) says the run had used by its end."""
    keys = budget_keys(records, plan_hash, also, key)
    return max((float(r["carried_s"]) + float(r["spent_s"]) for r in records
                if _counts(r, keys) and r["id"] not in (skip or set())), default=0.0)


def live_record(run_dir: Path, records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The record of the launch that is running now: node rank 0's `nanoplan run`, which holds the
    run dir's launch lock. On a multi-node run, global rank 0 may live on another node (c10d orders
    the nodes by arrival), whose own launch id has no record: this one is the same launch."""
    from runner.runlock import LAUNCH_LOCK, probe

    holder = probe(Path(run_dir), LAUNCH_LOCK)
    if not holder:
        return None
    return next((r for r in reversed(records) if r.get("pid") == holder.get("pid")
                 and r.get("host") == holder.get("host") and r["state"] == "running"), None)


def spent_before_s(run_dir: Path, plan_hash: str, also: Iterable[str] = (), *, metrics: bool = True,
                   key: str | None = None) -> float:
    """Budget seconds this plan's run in RUN_DIR had used: the most that the ledger, any complete
    checkpoint of this run, or metrics.jsonl (when run_info.json names this run) records.
    `also`: hashes that count as this plan too (`run --probe`: the plan it probes); `key`: the plan's
    budget key (planner.plan.budget_key), which a changed cadence keeps. `metrics=False` skips
    metrics.jsonl (a long file): a quick lower bound."""
    from runner.checkpoint_layout import complete_steps, step_dir
    from runner.checkpoint_meta import read_meta
    from runner.metrics import RUN_INFO, read_json, read_metrics

    recs = read_ledger(run_dir)
    keys = budget_keys(recs, plan_hash, also, key)
    best = ledger_total_s(recs, plan_hash, also=also, key=key)
    for s in complete_steps(run_dir):
        meta = read_meta(step_dir(run_dir, s)) or {}
        h = meta.get("elapsed_hours")
        if _of_run(meta, keys) and _finite(h):
            best = max(best, float(h) * 3600.0)
    info = read_json(Path(run_dir) / RUN_INFO) or {}
    if metrics and (info.get("plan_hash") is None or info.get("plan_hash") in keys):
        for row in read_metrics(run_dir):
            h = row.get("elapsed_hours") if isinstance(row, dict) else None
            if _finite(h):
                best = max(best, float(h) * 3600.0)
    return best


def nothing_to_do(run_dir: Path, plan: Plan, carried_s: float, age_s: float, also: Iterable[str] = ()) -> str | None:
    """Why a launch of `plan` in RUN_DIR would train nothing because its budget is spent, as the workers
    would find after their start-up (runner/train.py), or None. Read before anything is spawned.

    Only a plan with a deadline (hours or dollars) is judged here, and it is spent when
    - the budget guard (runner/clock.py) would stop before the first step: what the run has used
      (`carried_s`), this launch so far (`age_s`) and the final checkpoint's reserve pass the deadline;
    - or the newest complete checkpoint of this plan is at the step where the deadline's projection
      ended the schedule (runner/schedule.py).
    A run that reached its step count is left to the workers (they verify the checkpoint, and say so).
    """
    from planner.plan import budget_key
    from planner.plan import plan_hash as hash_of
    from runner.checkpoint_layout import complete_steps, step_dir
    from runner.checkpoint_meta import read_meta
    from runner.clock import BudgetGuard, deadline_seconds

    req = plan.request
    guard = BudgetGuard(deadline_seconds(req.hours, req.budget_usd, plan.budget.usd_per_hour), carried_s=carried_s,
                        ckpt_bytes=plan.schedule.checkpoint_bytes)
    if guard.deadline_s is None:
        return None
    keys = budget_keys(read_ledger(run_dir), hash_of(plan), also, budget_key(plan))
    meta: dict[str, Any] = {}
    for s in reversed(complete_steps(run_dir)):
        m = read_meta(step_dir(run_dir, s)) or {}
        if _of_run(m, keys):
            meta = {**m, "step": s}
            break
    step, total = int(meta.get("step") or 0), plan.schedule.total_steps
    sched = meta.get("schedule") if isinstance(meta.get("schedule"), dict) else {}
    projected = sched.get("total") if sched.get("planned_total") == total else None
    if meta and isinstance(projected, int) and projected < total and step >= projected:
        return f"{run_dir} stopped at its deadline, at step {step:,} (checkpoint step_{step:08d})"
    if _finite(meta.get("write_seconds")):
        guard.observe_checkpoint(float(meta["write_seconds"]))
    if _finite(meta.get("eval_seconds")):
        guard.observe_eval(float(meta["eval_seconds"]))
    if not guard.should_stop(age_s):
        return None
    return (f"the budget of {run_dir} is spent: {carried_s:,.1f} s of its {guard.deadline_s:,.1f} s were used before "
            f"this launch, which has taken {age_s:,.1f} s, and the final checkpoint needs {guard.reserve_s():,.1f} s")


def _of_run(meta: dict[str, Any], keys: set[str]) -> bool:
    """Whether a checkpoint's meta.json is of this run: its plan hash, or its train_hash (the budget key)."""
    return meta.get("plan_hash") in keys or meta.get("train_hash") in keys


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0


def write_record(run_dir: Path, record: dict[str, Any]) -> None:
    """Add or replace (by id) one launch record; atomic. Raises OSError on a failed write."""
    p = Path(run_dir) / LEDGER
    try:
        recs = [r for r in read_ledger(run_dir) if r["id"] != record["id"]]
    except PlanError:
        recs = []
    recs.append(record)
    atomic_write_text(p, json.dumps({"launches": recs}, indent=1) + "\n")


class Heartbeat:
    """Calls `beat(final=False)` every HEARTBEAT_S on a daemon thread, and `beat(final=True)` once at stop().

    A thread, so that the time is recorded whatever the main thread does (a probe's trial, a
    checkpoint write, a long step). `beat` must not raise.
    """

    def __init__(self, beat: Callable[[bool], None]) -> None:
        self._beat = beat
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._done = False
        self._thread = threading.Thread(target=self._run, name="nanoplan-heartbeat", daemon=True)

    def start(self) -> Heartbeat:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            with self._lock:
                if not self._done:
                    self._beat(False)

    def now(self) -> None:
        """One beat now, from the caller's thread."""
        with self._lock:
            if not self._done:
                self._beat(False)

    def stop(self) -> None:
        """The last, exact beat; no beat follows it."""
        self._stop.set()
        with self._lock:
            if not self._done:
                self._done = True
                self._beat(True)


def launcher_alive(env: dict[str, str] | None = None) -> bool:
    """Whether the `nanoplan run` that started this launch still runs (NANOPLAN_LAUNCH_PID, whose
    process start must be NANOPLAN_LAUNCH_T0: a reused PID is not it)."""
    from runner.clock import ENV_LAUNCH_PID, ENV_LAUNCH_T0, process_start_boottime

    env = dict(os.environ) if env is None else env
    try:
        pid, t0 = int(env.get(ENV_LAUNCH_PID, "")), float(env.get(ENV_LAUNCH_T0, ""))
    except ValueError:
        return False
    started = process_start_boottime(pid)
    return started is not None and abs(started - t0) < 0.05


def worker_heartbeat(run_dir: Path) -> Heartbeat | None:
    """The rank-0 worker's own heartbeat in RUN_DIR/ALIVE (it holds the training lock: one writer),
    when `nanoplan run` launched it; None under a plain torchrun (no launch record to fold it into).

    Its last beat, when the worker exits, is exact while its launcher lives (the launcher counts the
    rest: torchrun's exit). An orphan's last beat counts ORPHAN_EXIT_S ahead instead: torchrun's own
    exit after its workers is then counted by nobody else.
    """
    from runner.clock import ENV_LAUNCH_ID, ENV_LAUNCH_T0, boottime

    launch_id, raw = os.environ.get(ENV_LAUNCH_ID), os.environ.get(ENV_LAUNCH_T0, "")
    try:
        t0 = float(raw)
    except ValueError:
        return None
    if not launch_id or not math.isfinite(t0):
        return None
    host, pid = socket.gethostname(), os.getpid()

    def beat(final: bool) -> None:
        ahead = PREPAID_S if not final else 0.0 if launcher_alive() else ORPHAN_EXIT_S
        spent = max(0.0, boottime() - t0) + ahead
        try:
            atomic_write_text(Path(run_dir) / ALIVE, json.dumps({"id": launch_id, "host": host, "pid": pid,
                                                                 "spent_s": spent, "final": final}) + "\n")
        except OSError:
            pass                 # best effort: the worker's own writes report a full disk

    hb = Heartbeat(beat)
    hb.now()
    return hb.start()
