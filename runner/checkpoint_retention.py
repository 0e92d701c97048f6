"""Which checkpoints a run keeps: the newest one that verifies, the best (best.json), the last
keep_last; damaged ones are set aside and debris of killed writes removed.

Plain Python (no torch). Cleaning never follows a link out of RUN_DIR/checkpoints.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from planner.plan import atomic_write_text
from runner.checkpoint_layout import BEST, CKPT_DIR, META, ckpt_root, complete_steps, list_steps, step_dir
from runner.checkpoint_meta import check_meta, read_meta, verify
from runner.runfiles import Best, problem_of, read_json_file
from runner.torch_files import fsync_dir


def latest_good(run_dir: str | Path, log: Callable[[str], None] = print) -> tuple[int, dict[str, Any]] | None:
    """The newest checkpoint that verifies, saying why newer ones were skipped."""
    for s in reversed(list_steps(run_dir)):
        p = step_dir(run_dir, s)
        ok, why = verify(p)
        if ok:
            return s, check_meta(p)[0] or {}
        log(f"checkpoint {p.name} is not usable: {why}; falling back to the previous one")
    return None


def set_aside(run_dir: str | Path, step: int) -> Path | None:
    """Move an unusable checkpoint out of the way before a resume writes newer ones.

    Unfinished writes (no meta.json) are deleted; damaged complete ones are kept for
    inspection under checkpoints/.damaged/.
    """
    p = step_dir(run_dir, step)
    if not p.exists():
        return None
    if not (p / META).exists():
        shutil.rmtree(p, ignore_errors=True)
        return None
    dest = ckpt_root(run_dir) / ".damaged" / p.name
    dest.parent.mkdir(parents=True, exist_ok=True)
    if dest.exists():
        shutil.rmtree(dest)
    os.replace(p, dest)
    fsync_dir(ckpt_root(run_dir))
    return dest


def best_problem(run_dir: str | Path) -> str | None:
    """What is wrong with RUN_DIR/best.json (file and field), or None when it is valid or absent."""
    data, problem = read_json_file(Path(run_dir) / BEST)
    if data is None:
        return problem
    return problem_of(Best, data, str(Path(run_dir) / BEST))[1]


def read_best(run_dir: str | Path) -> dict[str, Any] | None:
    """best.json when valid; None when absent or invalid (it is then rewritten at the next checkpoint
    with a validation loss; best_problem says what is wrong)."""
    data, problem = read_json_file(Path(run_dir) / BEST)
    if data is None or problem_of(Best, data, BEST)[1] is not None:
        return None
    return data


def update_best(run_dir: str | Path, step: int, val_loss: float | None) -> bool:
    """Point best.json at this checkpoint when its validation loss is the lowest so far."""
    if val_loss is None:
        return False
    best = read_best(run_dir)
    best_alive = best is not None and (step_dir(run_dir, int(best["step"])) / META).is_file()
    if best_alive and best["val_loss"] is not None and best["val_loss"] <= val_loss:
        return False
    atomic_write_text(Path(run_dir) / BEST, json.dumps({
        "step": step, "val_loss": val_loss, "path": f"{CKPT_DIR}/{step_dir(run_dir, step).name}",
    }, indent=2) + "\n")
    return True


def best_by_meta(run_dir: str | Path) -> int | None:
    """The complete checkpoint with the lowest val_loss in its meta.json (None without any)."""
    scored = []
    for s in complete_steps(run_dir):
        v = (read_meta(step_dir(run_dir, s)) or {}).get("val_loss")
        if isinstance(v, (int, float)) and v == v:
            scored.append((v, s))
    return min(scored)[1] if scored else None


def retain(run_dir: str | Path, keep_last: int) -> list[int]:
    """Delete old checkpoints: keep the last `keep_last` complete ones and the best. Returns deleted steps.

    Incomplete directories older than the newest complete checkpoint are debris of killed
    writes and are removed too. The newest complete checkpoint is never deleted. The best is
    the one best.json names and also the lowest val_loss among the metas (best.json may be
    stale). The only good checkpoint is never deleted: before deleting a complete one, a kept
    one must verify (checksums; normally the newest, just written); if none does, the newest
    older one that verifies is kept as well, and if no checkpoint verifies, no complete one is
    deleted.
    """
    done = complete_steps(run_dir)
    if not done:
        return []
    keep = set(done[-max(1, keep_last):])
    best = read_best(run_dir)
    if best is not None and str(best.get("step", "")).isdigit():
        keep.add(int(best["step"]))
    by_meta = best_by_meta(run_dir)
    if by_meta is not None:
        keep.add(by_meta)
    newest = done[-1]
    doomed = [s for s in list_steps(run_dir) if s not in keep and s < newest]
    if any(s in done for s in doomed) and not any(verify(step_dir(run_dir, s))[0] for s in sorted(keep, reverse=True)):
        good = next((s for s in reversed(doomed) if s in done and verify(step_dir(run_dir, s))[0]), None)
        keep |= {good} if good is not None else set(done)   # none verifies: delete no complete one
    deleted = []
    for s in list_steps(run_dir):
        if s in keep or s >= newest:
            continue
        shutil.rmtree(step_dir(run_dir, s), ignore_errors=True)
        deleted.append(s)
    if deleted:
        fsync_dir(ckpt_root(run_dir))
    return deleted
