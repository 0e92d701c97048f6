"""Resuming a run: from which checkpoint (or none), the hours already spent before this launch,
and loading that checkpoint's model, optimizer, LR-scheduler and RNG state into this rank.

decide_resume runs on rank 0 only (the trainer broadcasts its answer); it sets aside damaged and
unfinished checkpoints newer than the one it picks, and refuses one of another plan or other data
unless --force.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import torch

from planner.errors import PlanError, echo
from planner.plan import Plan, budget_key
from runner import ledger
from runner.checkpoint import set_rng_state
from runner.checkpoint_layout import complete_steps, list_steps, step_dir
from runner.checkpoint_meta import RESUME_HINT, resume_mismatch, verify
from runner.checkpoint_retention import best_problem, latest_good, set_aside
from runner.clock import ENV_LAUNCH_ID, Clock, launch_first_segment, restart_carried_s
from runner.data import fingerprint_change
from runner.elastic import launch_job, restart_count
from runner.metrics import read_metrics, read_run_info
from runner.parallel import Parallel
from runner.state_check import model_problem, optimizer_problem
from runner.torch_files import load_torch

NOT_OURS = "it is not this plan's checkpoint; use another --run-dir"


def _crafted(ckdir: Path) -> str:
    return (f"it was not written by this plan's run, or was edited after; move {ckdir.name} out of "
            f"{ckdir.parent} to resume from an earlier checkpoint, or use another --run-dir")


def _launch_carry_h(run_dir: Path, phash: str, key: str | None = None) -> tuple[float | None, float, float]:
    """(hours this launch carried in, if known; hours the run dir's launch records add up to;
    real seconds of the launch's start-up that its first attempt counted 1:1).

    A launch of `nanoplan run` has its record in launches.json (runner/ledger.py). A torchrun
    restart without one carries what its launch's first attempt did (run_info.json segments).
    The clock counts from the launch's start, so nothing else of this launch is added here.
    """
    job = os.environ.get(ENV_LAUNCH_ID)
    recs = ledger.read_ledger(run_dir)
    live = ledger.live_record(run_dir, recs)      # this launch, recorded by node rank 0's launcher
    own = next((r for r in recs if job and r["id"] == job), None) or live
    total_h = ledger.ledger_total_s(recs, phash, skip={job, live["id"] if live else None}, key=key) / 3600.0
    segs = (read_run_info(run_dir) or {}).get("segments") or []
    segs = segs if isinstance(segs, list) else []
    s = restart_carried_s(segs, launch_job(), restart_count())
    first = launch_first_segment(segs, launch_job(), restart_count())
    try:
        first_age = max(0.0, float((first or {}).get("launch_age_s") or 0.0))
    except (TypeError, ValueError):
        first_age = 0.0
    first_age = first_age if math.isfinite(first_age) else 0.0
    if own is not None:
        return float(own["carried_s"]) / 3600.0, total_h, first_age
    return (None if s is None else s / 3600.0), total_h, first_age


def decide_resume(plan: Plan, phash: str, run_dir: Path, resume: bool, force: bool,
                  log: Any, clock: Clock, data_dir: Path | None = None,
                  data_fp: dict[str, Any] | None = None) -> dict[str, Any]:
    """Rank 0: which checkpoint to resume from (or an error to raise on every rank), and the
    hours already spent before this launch ("carried_hours").

    A first attempt carries the most that any record says: the checkpoint's hours, the
    metrics logged after it, and the launch records (launches.json: launches killed before
    any worker wrote a line count too). A torchrun restart carries what its launch carried in:
    its clock already counts from the launch's start (the crash and the restart included).
    """
    try:
        steps = list_steps(run_dir)
        restarted = restart_count() > 0
        launch_h, ledger_h, first_age = _launch_carry_h(run_dir, phash, budget_key(plan))
        if restarted and launch_h is not None:   # + everything since the launch began: the clock restarts at 0
            # the first attempt's start-up counted 1:1, the rest of the launch × the scale (a test hook)
            age = clock.launch_age
            restart_h = (launch_h * 3600.0 + min(first_age, age) + max(0.0, age - first_age) * clock.scale) / 3600.0
        else:
            restart_h = max(launch_h or 0.0, ledger_h)
        if (bad_best := best_problem(run_dir)) is not None:
            log(f"warning: {bad_best}; ignored (rewritten at the next checkpoint with a validation loss)")
        if not complete_steps(run_dir):     # nothing, or only writes killed before meta.json
            if resume and not restarted:
                raise PlanError("--resume", f"{run_dir} has no checkpoint to resume from", "drop --resume to start a new run")
            for s in steps:
                set_aside(run_dir, s)
                log(f"removed step_{s:08d}: a checkpoint write that did not finish (no meta.json)")
            return {"step": None, "carried_hours": restart_h}
        found = latest_good(run_dir, log)
        if found is None:
            if not force:
                newest = list_steps(run_dir)[-1]
                why = verify(step_dir(run_dir, newest))[1]
                raise PlanError("--run-dir", f"{run_dir} holds checkpoints but none is intact "
                                f"(the newest, step_{newest:08d}: {why})",
                                "use another --run-dir, or --force to start from scratch here")
            log("no intact checkpoint; starting from scratch (--force)")
            return {"step": None, "carried_hours": restart_h}
        step, meta = found
        for bad in [s for s in steps if s > step]:
            moved = set_aside(run_dir, bad)
            if moved is not None:
                log(f"moved the damaged checkpoint step_{bad:08d} to {moved}")
        mismatch = resume_mismatch(meta, plan)
        if mismatch:
            if not force:
                raise PlanError("--run-dir", f"checkpoint step_{step:08d} was made by a different plan{mismatch}",
                                RESUME_HINT)
            log(f"resuming from a checkpoint of a different plan (--force){mismatch}")
        changed = fingerprint_change((meta.get("data") or {}).get("fingerprint"), data_dir or Path("."), data_fp or {})
        if changed:
            if not force:
                raise PlanError(changed[0], f"{changed[1]} (checkpoint step_{step:08d})",
                                "restore the data the run was trained on, or --force to resume on this data")
            log(f"warning: {changed[0]}: {changed[1]}; resuming on it anyway (--force)")
        if restarted and launch_h is not None:
            meta["carried_hours"] = restart_h
        else:
            rows = read_metrics(run_dir, warn=lambda m: log(f"warning: {m}"))
            logged_h = max((r.get("elapsed_hours") or 0.0 for r in rows), default=0.0)
            meta["carried_hours"] = max(float(meta.get("elapsed_hours", 0.0)), float(logged_h), restart_h)
        return {"step": step, "meta": meta, "carried_hours": meta["carried_hours"]}
    except PlanError as e:
        return {"error": [e.field, e.problem, e.fix]}


def _first_line(e: BaseException) -> str:
    """The first line of an error that says something (torch's "Error(s) in loading ...:" heads a list)."""
    lines = [x.strip() for x in str(e).splitlines() if x.strip()]
    text = " ".join(lines[:2]) if lines and lines[0].endswith(":") else (lines[0] if lines else type(e).__name__)
    return text[:400]


def restore_model(par: Parallel, ckdir: Path, device: torch.device) -> None:
    """The checkpoint's model weights into `par` (before its LR schedulers exist); a PlanError when they do not fit.
    Every tensor's name, shape and dtype is checked against the live model before any is loaded."""
    par.check_format(ckdir)
    live = par.raw.state_dict()

    def check(state: Any) -> None:
        if (why := model_problem(state, live)) is not None:
            raise PlanError(str(ckdir / "model.pt"), why, _crafted(ckdir))

    try:
        par.load_model(ckdir, device, check)
    except PlanError:
        raise                    # refused by the checks, or by torch.load(weights_only=True): it says so itself
    except (RuntimeError, KeyError, TypeError, ValueError) as e:
        raise PlanError(str(ckdir / "model.pt"), f"does not fit this plan's model ({_first_line(e)})",
                        NOT_OURS) from None


def _scheduler_problem(saved: Any, scheds: list[Any]) -> str | None:
    """The LR schedulers' saved state against the live ones (LambdaLR.load_state_dict sets every key as an
    attribute): one dict each, no key the live one lacks, values of the same kind, lists of the same length."""
    if not isinstance(saved, list) or len(saved) != len(scheds):
        n = len(saved) if isinstance(saved, list) else "no list of"
        return f"holds {n} LR scheduler state(s), this run has {len(scheds)}"
    for i, (st, s) in enumerate(zip(saved, scheds, strict=True)):
        live = s.state_dict()
        if not isinstance(st, dict):
            return f"schedulers[{i}] is a {type(st).__name__}, not the state of an LR scheduler"
        if extra := [k for k in st if k not in live]:
            return f"schedulers[{i}] holds {echo(extra[0], 80)}, which this run's {type(s).__name__} does not keep"
        for k, v in ((k, v) for k, v in live.items() if k in st and v is not None):
            got = st[k]
            if isinstance(v, list):
                num = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v)
                if not isinstance(got, list) or len(got) != len(v) or (num and not all(
                        isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in got)):
                    return f"schedulers[{i}].{k} is {echo(got, 80)}, not {len(v)} number(s) like this run's"
            elif not isinstance(got, type(v)) or isinstance(got, bool) != isinstance(v, bool):
                return f"schedulers[{i}].{k} is a {type(got).__name__}, not a {type(v).__name__}"
    return None


def restore_training_state(par: Parallel, scheds: list[Any], ckdir: Path, rank: int, device: torch.device) -> None:
    """The checkpoint's optimizer and LR-scheduler state, and this rank's RNG state; a PlanError when they do not fit.
    optim_rank0.pt's tensors are checked against the live optimizer before any is loaded (runner/state_check.py);
    a DCP checkpoint's, in runner/dcp.py."""
    optim = ckdir / "optim_rank0.pt"
    ostate = load_torch(optim, device)
    if not isinstance(ostate, dict):
        raise PlanError(str(optim), f"holds a {type(ostate).__name__}, not a dict", NOT_OURS)
    if not par.sharded_checkpoint:
        names = {id(p): n for n, p in par.raw.named_parameters()}
        if (why := optimizer_problem(ostate.get("optimizer"), par.opt.optimizers, names)) is not None:
            raise PlanError(str(optim), why, _crafted(ckdir))
    if (why := _scheduler_problem(ostate.get("schedulers"), scheds)) is not None:
        raise PlanError(str(optim), why, _crafted(ckdir))
    try:
        par.load_optimizer(ckdir, ostate)
        for s, st in zip(scheds, ostate["schedulers"], strict=True):
            s.load_state_dict(st)
    except PlanError:
        raise                    # a refused DCP .metadata or tensor (runner/dcp.py)
    except (RuntimeError, KeyError, TypeError, ValueError, IndexError) as e:
        raise PlanError(str(optim), f"does not fit this plan's optimizer ({_first_line(e)})", NOT_OURS) from None
    rng = ckdir / f"rng_rank{rank}.pt"
    if rng.exists():
        try:
            set_rng_state(load_torch(rng))
        except PlanError:
            raise
        except (RuntimeError, KeyError, TypeError, ValueError, IndexError) as e:
            raise PlanError(str(rng), f"is not an RNG state ({_first_line(e)})", NOT_OURS) from None
