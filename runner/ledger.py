"""RUN_DIR/launches.json: every `nanoplan run` launch and the budget time it has used so far.

`nanoplan run` (node rank 0) appends its record before it spawns torchrun, and rewrites it
every HEARTBEAT_S while it runs and once when it ends:

    {"launches": [{"id", "plan_hash", "host", "carried_s", "spent_s", "state"}, ...]}

- carried_s: budget seconds the run had used before this launch (the most that any record
  of the run says: this ledger, the checkpoints' meta.json, metrics.jsonl);
- spent_s: budget seconds since this launch's process started, measured on a monotonic clock
  (so a launch killed with -9 during its start-up, before any worker wrote a line, still
  counts, up to its last heartbeat).

The next launch carries max(carried_s + spent_s) over the run's records. Gaps between launches
(a relaunch by hand an hour later) are not counted: the machines need not have been rented.
Plain Python, no torch.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from planner.errors import PlanError
from planner.plan import atomic_write_text
from runner.runfiles import Ledger, problem_of, read_json_file

LEDGER = "launches.json"
HEARTBEAT_S = 1.0


def read_ledger(run_dir: Path) -> list[dict[str, Any]]:
    """The records of RUN_DIR/launches.json ([] when there is none); a malformed file is refused."""
    p = Path(run_dir) / LEDGER
    data, problem = read_json_file(p)
    if problem is None and data is None:
        return []
    if problem is None:
        problem = problem_of(Ledger, data, str(p))[1]
    if problem is not None:
        raise PlanError(str(p), problem.removeprefix(f"{p}: "),
                        "move it away; the run then counts only what metrics.jsonl and the checkpoints say")
    return data["launches"]


def ledger_total_s(records: list[dict[str, Any]], plan_hash: str, skip: set[str | None] | None = None) -> float:
    """The most budget seconds any record of this plan (but those in `skip`) says the run had used by its end."""
    return max((float(r["carried_s"]) + float(r["spent_s"]) for r in records
                if r["plan_hash"] == plan_hash and r["id"] not in (skip or set())), default=0.0)


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


def spent_before_s(run_dir: Path, plan_hash: str) -> float:
    """Budget seconds this plan's run in RUN_DIR had used: the most that the ledger, any complete
    checkpoint of this plan, or metrics.jsonl (when run_info.json names this plan) records."""
    from runner.checkpoint_layout import complete_steps, step_dir
    from runner.checkpoint_meta import read_meta
    from runner.metrics import RUN_INFO, read_json, read_metrics

    best = ledger_total_s(read_ledger(run_dir), plan_hash)
    for s in complete_steps(run_dir):
        meta = read_meta(step_dir(run_dir, s)) or {}
        h = meta.get("elapsed_hours")
        if meta.get("plan_hash") == plan_hash and _finite(h):
            best = max(best, float(h) * 3600.0)
    info = read_json(Path(run_dir) / RUN_INFO) or {}
    if info.get("plan_hash") in (None, plan_hash):
        for row in read_metrics(run_dir):
            h = row.get("elapsed_hours") if isinstance(row, dict) else None
            if _finite(h):
                best = max(best, float(h) * 3600.0)
    return best


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
