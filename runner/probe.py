"""`nanoplan probe` on this machine: short trials of a plan and its neighbours, then a corrected plan.

Each trial (planner/probe.py chooses them) is the plan with one micro-batch and checkpointing
setting, run by torchrun with all the plan's processes on this node (runner/probe_worker.py, which
sets up the run as `nanoplan run` does). Every trial starts in its own session, so neither an OOM
nor a hang can take the probe down, is time-boxed (--trial-timeout, and what is left of --timeout
for the whole probe), and dies with the probe however the probe ends (runner/probe_trial.py).
After the plan's own trial, no trial starts that would take the probe past MAX_SHARE of the
plan's hours or budget, judged by the longest trial so far.

Before the first trial the probe checks that it can write where it will (DIR, DIR/trials, the
directory of --out) and that none of its paths in DIR is a link; a write that fails then or later
is one line and exit 4 (ProbeWriteError), never a traceback.

Layout of the probe directory (DIR):
- DIR/trials/<label>/: the trial's plan.json, log.txt (torchrun's output), result.json or
  oom_rank{r}.json, pid_rank{r}
- DIR/probe.json: every trial measured against predicted, the choice, the probe's cost, device,
  torch version and date, the plan before and after
- DIR/profile.yaml: the profile calibrated from the chosen trial (nanoplan estimate --profile)
The corrected plan goes to --out (plan.probed.json).

The probe's time counts on the budget clock (NANOPLAN_TIME_SCALE, runner/clock.py) and is charged
to the corrected plan (planner.probe.corrected_length), except under `nanoplan run --probe`, where
the launch's own clock, which started before the probe, counts it (charged once). Plain Python:
torch runs in the trials only.
"""

from __future__ import annotations

import datetime as dt
import errno
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from planner import __version__
from planner.errors import PlanError
from planner.launch import torchrun_command
from planner.plan import Plan, atomic_write_text, load_plan, save_plan
from runner.preflight import PROBE_DIR, PROBED_PLAN, PROFILE, REPORT, TRIALS  # noqa: F401 - names of the probe's files
from runner.probe_trial import (  # noqa: F401 - the trial's processes, re-exported
    ENV_TRIAL_DEADLINE,
    KILL_GRACE_S,
    ProbeWriteError,
    _write_problem_line,
    hold_trial_worker,
    kill_trial,
    read_trial,
    run_trial,
)

ENV_PROBE_FAULT = "NANOPLAN_PROBE_FAULT"
FAULT_KINDS = ("oom", "hang")
DEFAULT_WARMUP = 3            # untimed steps: the first compiles (torch.compile) and warms the caches
DEFAULT_STEPS = 6             # timed steps per trial
DEFAULT_TRIAL_TIMEOUT_S = 300.0
DEFAULT_TIMEOUT_S = 900.0
MIN_TRIAL_S = 5.0             # a trial is skipped when less than this is left of the probe's time
MAX_SHARE = 0.5               # after the plan's own trial, no trial starts that would take the probe past half the
                              # plan's length (judged by the longest trial so far)
TRIAL_SHUTDOWN_S = 5          # torchrun's grace for the other ranks after one fails (they wait in a collective)
MIN_FREE_BYTES = 1 << 20      # the probe writes small files: plans, logs, probe.json, profile.yaml


# ---------------------------------------------------------------------------- the fault hook


def parse_faults(raw: str) -> list[tuple[str, str]]:
    """NANOPLAN_PROBE_FAULT='oom:8,hang:b2-ac' -> [('oom', '8'), ('hang', 'b2-ac')]."""
    out = []
    for part in (p.strip() for p in raw.split(",")):
        if not part:
            continue
        kind, _, sel = part.partition(":")
        if kind not in FAULT_KINDS or not sel:
            raise PlanError(ENV_PROBE_FAULT, f"cannot read {raw!r}",
                            "use oom:SEL or hang:SEL, SEL a micro-batch (8), a trial label (b8-ac) or *")
        out.append((kind, sel))
    return out


def fault_for(faults: list[tuple[str, str]], device_batch_size: int, label: str) -> str | None:
    for kind, sel in faults:
        if sel in ("*", str(device_batch_size), label):
            return kind
    return None


# ---------------------------------------------------------------------------- the probe


@dataclass
class ProbeResult:
    report: dict[str, Any]
    plan: Plan
    corrected: Plan | None
    out: Path | None
    report_path: Path


def trial_env(plan: Plan, work: Path) -> dict[str, str]:
    """The trials' environment; torchrun's log folders go in the probe's DIR (WORK/torchrun)."""
    from runner.launcher import launch_env  # noqa: PLC0415

    env = launch_env(plan, {**os.environ, "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": str(TRIAL_SHUTDOWN_S),
                            "NANOPLAN_TENSORBOARD": "0"}, run_dir=work)
    for k in ("NANOPLAN_FAULT", "NANOPLAN_STATUS_FILE"):   # the run's own fault hooks do not apply to trials
        env.pop(k, None)
    return env


def _fresh_dir(d: Path) -> None:
    """Empty a trial directory of an earlier probe (only one that looks like a trial's; never through a link)."""
    if d.is_symlink():
        raise PlanError("--dir", f"{d} is a link; the probe never cleans through a link", "remove it, or give another --dir")
    if d.exists():
        if not ((d / "plan.json").exists() or (d / "log.txt").exists()):
            raise PlanError("--dir", f"{d} exists and is not a probe trial directory", "give another --dir")
        shutil.rmtree(d)
    d.mkdir(parents=True)


def check_probe_paths(work: Path, out: Path | None) -> None:
    """Before the first trial: no path the probe writes or cleans in `work` is a link (PlanError, exit 2),
    and every place it writes (work, work/trials, the directory of `out`) takes a real write and has
    MIN_FREE_BYTES free (ProbeWriteError, exit 4)."""
    trials = work / TRIALS
    managed = [trials, work / REPORT, work / PROFILE]
    if trials.is_dir() and not trials.is_symlink():
        managed += sorted(trials.iterdir())
    for p in managed:
        if p.is_symlink():
            raise PlanError("--dir", f"{p} is a link (to {os.path.realpath(p)}); the probe never writes or cleans "
                            "through a link", "remove the link, or give another --dir")
    places = [trials] + ([Path(out).parent] if out is not None else [])
    for d in places:
        try:
            d.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=d, prefix=".nanoplan-write-test.")
            try:
                os.write(fd, b"\0" * 4096)
                os.fsync(fd)
            finally:
                os.close(fd)
                os.unlink(tmp)
            free = shutil.disk_usage(d).free
            if free < MIN_FREE_BYTES:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(d))
        except OSError as e:
            raise ProbeWriteError(_write_problem_line(Path(e.filename or d), e)) from None


@contextmanager
def probe_locks(work: Path, out: Path | None, *, run_dirs: bool = True) -> Iterator[None]:
    """Hold DIR's probe lock, and (run_dirs) the launch lock of each run dir the probe writes into: DIR's parent
    when DIR is RUN/probe, --out's folder when --out is RUN/plan.probed.json, or either folder when it looks like
    a run dir (runner/runlock.py). A holder refuses the probe before it touches anything: PlanError, exit 2; a
    folder it cannot write there: ProbeWriteError, exit 4."""
    from runner.runlock import (  # noqa: PLC0415
        LAUNCH_LOCK,
        PROBE_LOCK,
        TRAIN_LOCK,
        RunDirBusy,
        RunLock,
        looks_like_run_dir,
    )
    from runner.runlock import probe as holder_of  # noqa: PLC0415

    targets: list[tuple[str, Path, str]] = [("--dir", work, PROBE_LOCK)]
    if run_dirs:
        for option, d, ours in (("--dir", work.parent, work.name == PROBE_DIR),
                                ("--out", out.parent if out is not None else None,
                                 out is not None and out.name == PROBED_PLAN)):
            if d is not None and (ours or looks_like_run_dir(d)) and all(d != t[1] for t in targets[1:]):
                targets.append((option, d, LAUNCH_LOCK))
    held: list[Any] = []
    try:
        for option, d, name in targets:
            try:
                d.mkdir(parents=True, exist_ok=True)
                held.append(RunLock.acquire(d, name, "nanoplan probe"))
                busy = holder_of(d, TRAIN_LOCK) if name == LAUNCH_LOCK else None
                if busy is not None:                 # workers of a launcher killed with -9 still train there
                    raise RunDirBusy(d, busy)
            except RunDirBusy as e:
                raise PlanError(option, f"{e}; the probe would replace what that process uses",
                                f"wait for it to end, or give the probe another {option}") from None
            except OSError as e:                     # a place it cannot write: exit 4, as check_probe_paths says
                raise ProbeWriteError(_write_problem_line(Path(e.filename or d / name), e)) from None
        yield
    finally:
        for lock in reversed(held):
            lock.release()


def probe(plan_path: str | Path, *, out: str | Path | None, work_dir: str | Path, data: str | None = None,
          warmup: int = DEFAULT_WARMUP, steps: int = DEFAULT_STEPS, trial_timeout_s: float = DEFAULT_TRIAL_TIMEOUT_S,
          timeout_s: float = DEFAULT_TIMEOUT_S, force: bool = False, charge: bool = True,
          log: Callable[[str], None] = print, lock_run_dirs: bool = True) -> ProbeResult:
    """Probe `plan_path` on this machine; write probe.json, the calibrated profile and the corrected plan.

    `charge`: take the probe's cost off the corrected plan's hours or dollars (`nanoplan probe`). False
    under `nanoplan run --probe`, whose launch clock counts the probe already (it must be charged once).
    `lock_run_dirs`: also lock a run dir the probe writes into (probe_locks); False under `run --probe`,
    whose launch holds that lock already.
    ProbeWriteError (exit 4) when a place it writes cannot be written, checked before the first trial.
    """
    from runner.clock import Clock  # noqa: PLC0415
    from runner.preflight import check_data, check_devices, resolve_data_dir  # noqa: PLC0415

    if warmup < 1 or steps < 1:
        raise PlanError("--warmup/--steps", f"need at least 1 warm-up and 1 timed step, got {warmup} and {steps}")
    if trial_timeout_s <= 0 or timeout_s <= 0:
        raise PlanError("--trial-timeout/--timeout", "must be > 0 seconds")
    try:
        clock = Clock.from_env()
    except ValueError as e:
        raise PlanError("NANOPLAN_TIME_SCALE", str(e), "unset it or give a number > 0") from None
    parse_faults(os.environ.get(ENV_PROBE_FAULT, ""))     # a bad hook fails here, in one line, not in every trial
    plan = load_plan(plan_path)
    if (name := plan.request.trainer.name) != "nanoplan":   # probe times the runner's own step (issue 28)
        raise PlanError(str(plan_path), f"plans {name}'s training step; the probe measures nanoplan's own runner",
                        f"run it with nanoplan run {plan_path}: its first launch measures {name}'s step, and each "
                        "relaunch re-derives the save cadence and step count from it")
    if plan.hardware.nodes > 1:
        raise PlanError(str(plan_path), f"is for {plan.hardware.nodes} nodes; the probe runs its trials on this node",
                        "probe a one-node plan of the same GPUs, then re-plan with its DIR/profile.yaml")
    problems, _ = check_devices(plan)
    if problems and not force:
        raise PlanError("probe", problems[0], "run on the planned machine, or --force")
    data_dir = resolve_data_dir(plan, data, plan_path).resolve()
    check_data(plan, data_dir)
    work = Path(work_dir)
    with probe_locks(work, Path(out) if out is not None else None, run_dirs=lock_run_dirs):
        return _probe_locked(plan, plan_path, out, work, data_dir, clock, warmup, steps, trial_timeout_s, timeout_s,
                             force, charge, log)


def _probe_locked(plan: Plan, plan_path: str | Path, out: str | Path | None, work: Path, data_dir: Path, clock: Any,
                  warmup: int, steps: int, trial_timeout_s: float, timeout_s: float, force: bool, charge: bool,
                  log: Callable[[str], None]) -> ProbeResult:
    """The trials, the choice and the files, with the probe's locks held (probe_locks)."""
    from planner import probe as pp  # noqa: PLC0415
    from planner.calibrate import write_profile  # noqa: PLC0415
    from planner.plan import plan_hash  # noqa: PLC0415
    from runner.clock import deadline_seconds  # noqa: PLC0415

    check_probe_paths(work, Path(out) if out is not None else None)
    env = trial_env(plan, work)
    date = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    n_steps = warmup + steps + pp.PHASE_STEPS

    configs = pp.neighbours(plan)
    length_s = deadline_seconds(plan.request.hours, plan.request.budget_usd, plan.budget.usd_per_hour)
    log(f"probe: {len(configs)} trial{'s' if len(configs) != 1 else ''} of {plan.model.name} on {plan.hardware.spec}, {warmup} warm-up + {steps} timed "
        f"steps each, at most {trial_timeout_s:.0f} s per trial and {timeout_s:.0f} s in all")
    records: list[dict[str, Any]] = []
    plans: dict[str, Plan] = {}
    device, torch_version, cuda = None, None, None
    for cfg in configs:
        tdir = work / TRIALS / cfg.label
        tplan = pp.trial_plan(plan, cfg, n_steps, plan_path=str(tdir / "plan.json"))
        plans[cfg.label] = tplan
        left = timeout_s - clock.real()
        longest = max((r["seconds"] for r in records), default=0.0) * clock.scale   # budget seconds of a trial
        skip = (f"the probe's {timeout_s:.0f} s are used up" if left < MIN_TRIAL_S else
                f"another trial would take the probe past {MAX_SHARE:.0%} of the plan's length"
                if records and length_s is not None and clock.budget() + longest > MAX_SHARE * length_s else "")
        if skip:
            records.append(pp.trial_record(cfg, tplan, pp.SKIPPED, None, 0.0, skip))
            log(f"  {cfg.label:<8} {cfg.role:<17} skipped: {skip}")
            continue
        _fresh_dir(tdir)
        try:
            save_plan(tplan, tdir / "plan.json")
        except OSError as e:
            raise ProbeWriteError(_write_problem_line(tdir / "plan.json", e, "stopped before this trial")) from None
        cmd = torchrun_command(str(tdir / "plan.json"), plan.hardware.gpus_per_node, str(tdir), max_restarts=0,
                               python=sys.executable,
                               extra=["--data", str(data_dir), "--warmup", str(warmup), "--steps", str(steps)]
                               + (["--force"] if force else []))
        cmd[cmd.index("runner.train")] = "runner.probe_worker"
        box = min(trial_timeout_s, left)
        t0 = time.perf_counter()
        timed_out, rc = run_trial(cmd, env, tdir, box)
        status, raw, note = read_trial(tdir, timed_out, rc, box)
        rec = pp.trial_record(cfg, tplan, status, raw, time.perf_counter() - t0, note)
        rec["dir"] = str(tdir)
        records.append(rec)
        if status == pp.OK and raw is not None:
            device, torch_version, cuda = raw.get("device"), raw.get("torch"), raw.get("cuda")
        log("  " + trial_line(rec))

    cost_s = clock.budget()
    chosen, why = pp.choose(records)
    report: dict[str, Any] = {
        "probe": f"nanoplan {__version__} probe", "date": date, "device": device, "torch": torch_version,
        "cuda": cuda, "plan": str(plan_path), "plan_hash": plan_hash(plan), "world_size": plan.hardware.num_gpus,
        "config": {"warmup_steps": warmup, "timed_steps": steps, "phase_steps": pp.PHASE_STEPS,
                   "trial_timeout_s": trial_timeout_s, "timeout_s": timeout_s, "time_scale": clock.scale},
        "trials": records, "chosen": chosen["label"] if chosen else None, "reason": why,
        "cost": pp.probe_cost(cost_s, plan), "before": pp.plan_summary(plan), "after": None, "corrected_plan": None,
        "profile": None, "charged": None,
    }
    report_path = work / REPORT
    corrected = None
    if chosen is not None:
        tplan = plans[chosen["label"]]
        meas = chosen["measured"]
        m = pp.measurement_of(tplan, label=f"probe/{chosen['label']}", tokens_per_sec=meas["tokens_per_sec"],
                              steps=len(meas["step_seconds"]), device=device or "unknown", date=date[:10],
                              max_memory_allocated=meas.get("max_memory_allocated"),
                              max_memory_reserved=meas.get("max_memory_reserved"), first_step_used=warmup + 1)
        extra = meas.get("non_allocator_bytes")
        if extra is not None and plan.hardware.num_gpus > 1:     # NCCL's buffers are modelled on their own
            extra = max(0, extra - plan.request.profile.overheads.nccl_bytes)
        try:
            corrected, profile, charged = pp.replan(plan, tplan, m, cost_s if charge else 0.0,
                                                    plan_path=str(out or "plan.probed.json"), today=date[:10],
                                                    non_allocator_bytes=extra)
        except PlanError:
            _write_report(report_path, work, report)
            raise
        if not charge:
            charged = (pp.corrected_length(plan, cost_s)[1] if length_s is None else
                       f"counted on the run's own clock: the launch's time, the probe's {cost_s:,.0f} s included, "
                       "is charged to the plan's budget once (launches.json)")
        prof_path = work / PROFILE
        _write(prof_path, work, lambda: write_profile(profile, prof_path, f"Calibrated by nanoplan probe on {date} "
                                                      f"from trial {chosen['label']} of {plan_path} on {device}"))
        report.update(after=pp.plan_summary(corrected), charged=charged, profile=str(prof_path))
        if out is not None:
            _write(Path(out), work, lambda: save_plan(corrected, out))
            report["corrected_plan"] = str(out)
    _write_report(report_path, work, report)
    if chosen is None:
        raise PlanError("probe", why + f"; see {report_path}",
                        "re-plan with a smaller micro-batch, --activation-checkpointing or a sharded --strategy")
    return ProbeResult(report, plan, corrected, Path(out) if out is not None else None, report_path)


def _write(path: Path, work: Path, write: Callable[[], object]) -> None:
    """One of the probe's results; a failed write is a ProbeWriteError (exit 4) naming the file."""
    try:
        write()
    except OSError as e:
        raise ProbeWriteError(_write_problem_line(path, e, f"the trials ran (their logs are in {work / TRIALS})")) \
            from None


def _write_report(path: Path, work: Path, report: dict[str, Any]) -> None:
    _write(path, work, lambda: atomic_write_text(path, json.dumps(report, indent=2) + "\n"))


def trial_line(rec: dict[str, Any]) -> str:
    """One line per trial, as the probe goes."""
    head = (f"{rec['label']:<8} {rec['role']:<17} micro-batch {rec['device_batch_size']} × {rec['grad_accum_steps']}, "
            f"checkpointing {'on' if rec['activation_checkpointing'] else 'off'}: ")
    if rec["status"] != "ok":
        return head + rec["status"] + (f" ({rec['note']})" if rec["note"] else "") + f" in {rec['seconds']:.1f} s"
    m, p = rec["measured"], rec["predicted"]
    return (head + f"{m['tokens_per_sec']:,.0f} tokens/s (planned {p['tokens_per_sec']:,.0f}), MFU {m['mfu']:.1%}"
            + ("" if rec["fits_with_headroom"] else ", over the headroom") + f" in {rec['seconds']:.1f} s")



def probed_plan_to_resume(run_dir: str | Path) -> Path | None:
    """RUN_DIR/plan.probed.json when RUN_DIR's newest checkpoint is of that plan, or of it with another
    checkpoint cadence or keep_last (a resumed or restarted `run --probe`), else None."""
    from planner.plan import budget_key, plan_hash  # noqa: PLC0415
    from runner.checkpoint_layout import complete_steps, step_dir  # noqa: PLC0415
    from runner.checkpoint_meta import read_meta  # noqa: PLC0415

    rdir = Path(run_dir)
    out = rdir / PROBED_PLAN
    done = complete_steps(rdir)
    if out.is_file() and not out.is_symlink() and done:
        meta = read_meta(step_dir(rdir, done[-1])) or {}
        probed = load_plan(out)
        if meta.get("plan_hash") == plan_hash(probed) or meta.get("train_hash") == budget_key(probed):
            return out
    return None


def probe_for_run(plan_path: str | Path, run_dir: str | Path, *, data: str | None = None, force: bool = False,
                  log: Callable[[str], None] = print) -> tuple[Path, ProbeResult | None]:
    """`nanoplan run --probe`: the corrected plan's path, RUN_DIR/plan.probed.json, and the probe's result.

    The probe's files go to RUN_DIR/probe/. When RUN_DIR already holds checkpoints of a probed plan
    (a resumed or restarted run), that plan is resumed without a new probe: a new one would change
    the plan and orphan the checkpoints. The probe's cost is not taken off the plan: the launch's
    clock, which started before the probe, counts it (`nanoplan run` records the launch first).
    """
    rdir = Path(run_dir)
    out = rdir / PROBED_PLAN
    if probed_plan_to_resume(rdir) is not None:
        log(f"probe: {rdir} holds checkpoints of {out}; resuming it without a new probe")
        return out, None
    return out, probe(plan_path, out=out, work_dir=rdir / PROBE_DIR, data=data, force=force, charge=False, log=log,
                      lock_run_dirs=False)      # the launch holds the run dir's lock
