"""`python -m runner.bucket_claim RUN_DIR --job ID`: one job per run dir on a shared bucket (issue 30 #9).

A run dir on a bucket mount is shared by every machine that mounts that bucket path, and the run
dir's locks (runner/runlock.py, fcntl.flock) exclude only processes of one machine: two SkyPilot jobs
launched with one `--bucket` would both "hold" the run dir and corrupt each other's checkpoints and
budget records. Before `nanoplan run`, node rank 0 of an exported SkyPilot job claims the run dir
for its job (SKYPILOT_TASK_ID, which SkyPilot keeps across every recovery of a managed job,
docs/source/running-jobs/environment-variables.rst) in RUN_DIR/.nanoplan.job.json:

- no claim, or a claim of this job (a recovery after a preemption): claim it, go on;
- another job's claim whose run dir changed within LEASE_S (its budget records are rewritten every
  0.5 s while it runs; the bucket shows them within seconds): refuse, exit 2, one line;
- another job's claim, idle for longer: take it over and say so (the run resumes, and its records
  carry the budget the earlier job used).

A fresh claim is read back after SETTLE_S: two jobs that claimed at the same moment both see the
later write, and the one that lost steps back. Plain Python, no torch.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

from planner.errors import PlanError, error_lines
from planner.plan import atomic_write_text

CLAIM = ".nanoplan.job.json"
LEASE_S = 300.0          # another job's run dir idle this long is abandoned (a recovery takes minutes)
SETTLE_S = 15.0          # a fresh claim is read back after this (the mount's write-back and dir cache: ~10 s)
ENV_SETTLE = "NANOPLAN_CLAIM_SETTLE_S"
LIVE_FILES = ("launches.json", ".nanoplan.alive.json", "metrics.jsonl", CLAIM)


def _read(p: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("job"), str) else None


def idle_s(run_dir: Path, now: float | None = None) -> float:
    """Seconds since anything a live run rewrites in RUN_DIR last changed (inf when none exists)."""
    times = []
    for name in LIVE_FILES:
        try:
            times.append((run_dir / name).stat().st_mtime)
        except OSError:
            continue
    return (time.time() if now is None else now) - max(times) if times else float("inf")


def claim(run_dir: Path, job: str, *, lease_s: float = LEASE_S, settle_s: float = SETTLE_S,
          say: Any = print) -> None:
    """Claim RUN_DIR for `job`, or raise PlanError naming the job that holds it."""
    if not job:
        raise PlanError("--job", "is empty (SKYPILOT_TASK_ID is not set)", "run this inside a SkyPilot task")
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / CLAIM
    held = _read(path)
    if held is not None and held["job"] != job:
        idle = idle_s(run_dir)
        if idle < lease_s:
            raise PlanError(str(run_dir), f"is in use by SkyPilot job {held['job']} (host {held.get('host', '?')}; its "
                            f"run dir changed {idle:.0f} s ago); two jobs on one bucket path would corrupt each "
                            "other's checkpoints and budget records",
                            f"cancel that job (sky jobs cancel), wait {lease_s:.0f} s after it ends, or export "
                            "with another --bucket path")
        say(f"note: {run_dir} was claimed by SkyPilot job {held['job']}, idle for {idle:,.0f} s; this job takes it "
            "over, and its records carry the budget that job used")
    fresh = held is None or held["job"] != job
    atomic_write_text(path, json.dumps({"job": job, "host": socket.gethostname(), "pid": os.getpid(),
                                        "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}) + "\n")
    if fresh and settle_s > 0:
        time.sleep(settle_s)
        now = _read(path)
        if now is not None and now["job"] != job:
            raise PlanError(str(run_dir), f"was claimed at the same moment by SkyPilot job {now['job']}",
                            "export with another --bucket path, or cancel one of the two jobs")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m runner.bucket_claim", description=__doc__.splitlines()[0])
    ap.add_argument("run_dir")
    ap.add_argument("--job", default=os.environ.get("SKYPILOT_TASK_ID", ""))
    ap.add_argument("--lease-s", type=float, default=LEASE_S)
    args = ap.parse_args(argv)
    try:
        settle = float(os.environ.get(ENV_SETTLE, SETTLE_S))
        claim(Path(args.run_dir), args.job, lease_s=args.lease_s, settle_s=settle,
              say=lambda m: print(m, file=sys.stderr))
    except PlanError as e:
        for line in e.lines():
            print(line, file=sys.stderr)
        return 2
    except (OSError, ValueError) as e:
        for line in error_lines(f"{args.run_dir}: the claim could not be written ({e})"):
            print(line, file=sys.stderr)
        return 4
    return 0


if __name__ == "__main__":
    sys.exit(main())
