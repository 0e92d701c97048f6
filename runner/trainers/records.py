"""What a supervised run keeps in its run dir, and what a launch reads back from it (no torch).

- RUN_DIR/run_info.json (runner/metrics.py): the plan's hash, the trainer, the GPU count its checkpoints
  were written with, and one segment per launch attempt with what it was asked (`end_step`, `save_every`,
  `resumed_from_step`) and what it measured (`startup_seconds`, `step_seconds`, `save_seconds`,
  `exit_seconds`) and how it ended (`ended`: total_steps, deadline, signal, killed, crash). The next
  launch derives its save cadence and step count from these measurements.
- the trainer's checkpoints (the adapter says where, and when one is complete): a launch resumes from the
  newest complete one and first deletes every unfinished one. An unfinished save would otherwise be
  finished by a later save of the same step with the rest of its files from an abandoned run (nanochat
  writes model_, meta_ and each rank's optim_ file in place, one after the other).
"""

from __future__ import annotations

import datetime as dt
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from planner.errors import PlanError
from planner.plan import Plan
from runner.metrics import RUN_INFO, read_run_info, write_json
from runner.trainers.adapter import Adapter
from runner.trainers.files import remove_path

LOG = "trainer.log"
ENDED_FINAL = ("total_steps", "deadline")


def now_iso() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


@dataclass(frozen=True)
class Checkpoints:
    """The run's checkpoints: the newest complete one, the unfinished ones, and who wrote them."""

    newest: int | None            # the newest complete step
    unfinished: dict[int, str]    # step -> why it is not complete
    world: int                    # the GPU count the checkpoints were written with


def checkpoints(adapter: Adapter, run_dir: Path, plan: Plan, info: dict[str, Any] | None) -> Checkpoints:
    """Scan the checkpoints. The writers' GPU count: run_info.json's (the launches that wrote them), else what
    the newest step's files say, else the plan's."""
    steps = adapter.steps(run_dir)
    world = int((info or {}).get("world_size") or 0)
    if not world:
        world = next((w for s in reversed(steps) if (w := adapter.written_by(run_dir, s))), plan.hardware.num_gpus)
    newest, unfinished = None, {}
    for s in steps:
        why = adapter.problem(run_dir, s, world)
        if why is None:
            newest = s
        else:
            unfinished[s] = why
    return Checkpoints(newest, unfinished, world)


def clean_unfinished(adapter: Adapter, run_dir: Path, ck: Checkpoints) -> list[str]:
    """Delete every unfinished checkpoint (the caller holds the run-dir locks: nothing writes them); one line each."""
    said = []
    for s, why in sorted(ck.unfinished.items()):
        for p in adapter.paths(run_dir, s):
            remove_path(p)
        said.append(f"note: step {s:,}'s checkpoint was never finished ({why}); deleted")
    return said


def check_world(adapter: Adapter, ck: Checkpoints, plan: Plan, run_dir: Path) -> None:
    """A checkpoint on a GPU count the trainer cannot reshard to: one line (PlanError)."""
    g = plan.hardware.num_gpus
    if ck.newest is None or adapter.reshards or ck.world == g:
        return
    raise PlanError("--run-dir", f"{adapter.checkpoint_dir(run_dir)}: step {ck.newest:,} was written by {ck.world} "
                    f"GPU(s) and this plan runs {g}; {adapter.name} keeps optimizer state per rank and cannot resume "
                    "it on another GPU count",
                    f"run it on {ck.world} GPU(s) (the plan it was made with), or use another --run-dir")


def read_info(run_dir: Path) -> dict[str, Any] | None:
    return read_run_info(run_dir)


def check_plan(info: dict[str, Any] | None, plan_hash: str, ck: Checkpoints, run_dir: Path, force: bool) -> None:
    """Checkpoints of another plan resume only with --force (as the runner's)."""
    if ck.newest is None or info is None or info.get("plan_hash") in (None, plan_hash) or force:
        return
    raise PlanError("--run-dir", f"{run_dir} holds checkpoints of another plan (run_info.json: plan "
                    f"{str(info.get('plan_hash'))[:12]}, this plan {plan_hash[:12]})",
                    "use another --run-dir, or --force to resume them with this plan")


@dataclass(frozen=True)
class Measured:
    """What earlier launches measured (None: not yet)."""

    step_s: float | None
    save_s: float | None
    startup_s: float | None
    exit_s: float | None


def measured(info: dict[str, Any] | None) -> Measured:
    """The latest step time (its mean over the launch, evaluation passes in, when on record), the slowest save,
    start-up (of the last 3 launches) and exit on record."""
    segs = [s for s in (info or {}).get("segments") or [] if isinstance(s, dict)]

    def vals(key: str) -> list[float]:
        return [float(v) for s in segs if isinstance(v := s.get(key), (int, float)) and v > 0]

    steps = [float(s.get("mean_step_seconds") or s["step_seconds"]) for s in segs
             if isinstance(s.get("step_seconds"), (int, float)) and s["step_seconds"] > 0]
    starts = vals("startup_seconds")
    return Measured(step_s=steps[-1] if steps else None, save_s=max(vals("save_seconds"), default=None),
                    startup_s=max(starts[-3:], default=None), exit_s=max(vals("exit_seconds"), default=None))


def final_stop(info: dict[str, Any] | None, newest: int | None) -> dict[str, Any] | None:
    """The last launch's segment when it ended the run (its step count reached, or the deadline) at the newest
    checkpoint: the run is over."""
    segs = (info or {}).get("segments") or []
    last = segs[-1] if segs and isinstance(segs[-1], dict) else {}
    if last.get("ended") in ENDED_FINAL and newest is not None and last.get("last_saved") == newest:
        return last
    return None


class Segments:
    """This launch attempt's segment in run_info.json, rewritten (atomically) as its measurements come."""

    def __init__(self, run_dir: Path, base: dict[str, Any], segment: dict[str, Any]) -> None:
        self.path = run_dir / RUN_INFO
        info = read_run_info(run_dir) or {**base, "start_time": now_iso(), "segments": []}
        info.update(base)
        self.info = info
        self.seg = {"segment": len(info["segments"]), "start_time": now_iso(), **segment}
        info["segments"].append(self.seg)
        write_json(self.path, info)

    @property
    def number(self) -> int:
        return int(self.seg["segment"])

    def update(self, **fields: Any) -> None:
        """Record fields of this segment; a failed write is the caller's (OSError)."""
        changed = {k: v for k, v in fields.items() if self.seg.get(k) != v}
        if changed:
            self.seg.update(changed)
            write_json(self.path, self.info)


def link_in(adapter: Adapter, run_dir: Path) -> str | None:
    """A link among the run dir's managed paths (the runner's, the trainer's checkpoint dir, its parents inside
    the run dir and its entries, trainer.log and the adapter's own files), or None."""
    import os

    from runner.preflight import check_run_dir_contained

    bad = check_run_dir_contained(run_dir)
    if bad:
        return bad
    root = run_dir.resolve()
    ck = adapter.checkpoint_dir(run_dir)
    paths = [run_dir / LOG, *adapter.run_files(run_dir)]
    p = ck
    while p != root and root in p.parents:
        paths.append(p)
        p = p.parent
    if ck.is_dir() and not ck.is_symlink():
        paths += sorted(ck.iterdir())
    for p in paths:
        if p.is_symlink():
            return (f"{p} is a link (to {os.path.realpath(p)}); nanoplan never writes, cleans or deletes through a "
                    "link in its run dir")
    return None


def median_step(intervals: list[float]) -> float | None:
    return statistics.median(intervals[-50:]) if intervals else None
