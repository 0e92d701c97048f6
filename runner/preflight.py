"""Checks `nanoplan run` makes before launching: devices, memory, disk, run dir, data, resume.

Plain Python; torch is imported only to count CUDA devices for GPU plans.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from planner.datameta import DataMeta, load_data_meta
from planner.errors import PlanError
from planner.plan import Plan, run_dir_problem
from planner.units import fmt_bytes, plural
from runner.checkpoint_layout import BEST, CKPT_DIR, complete_steps, list_steps, step_dir
from runner.checkpoint_meta import RESUME_HINT, read_meta, resume_mismatch
from runner.ledger import ALIVE, LEDGER
from runner.runlock import LOCK_FILES


@dataclass
class Preflight:
    """What the checks found: `problems` refuse the launch (unless --force), `notes` inform."""

    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def resolve_data_dir(plan: Plan, override: str | None, plan_path: str | Path | None = None) -> Path:
    """--data, else the plan's data_dir (relative to the current directory, else to the plan file)."""
    raw = override or plan.request.data_dir
    if not raw:
        raise PlanError("--data", "the plan names no data directory",
                        "pass --data DIR (from nanoplan prepare-data) or re-estimate with --data DIR")
    p = Path(raw).expanduser()
    if not p.is_absolute() and not p.exists() and plan_path is not None:
        alt = Path(plan_path).resolve().parent / p
        if alt.exists():
            return alt
    return p


def check_data(plan: Plan, data_dir: Path) -> DataMeta:
    """The data's meta.json, checked against the model: vocabulary and enough tokens for one window."""
    meta = load_data_meta(data_dir)
    spec = plan.request.model
    if meta.vocab_size > spec.vocab_size:
        raise PlanError("--data", f"{data_dir} has vocab {meta.vocab_size:,} but the model's vocab is {spec.vocab_size:,}",
                        f"re-estimate with --data {data_dir} (sets the vocab) or --vocab-size {meta.vocab_size}")
    if meta.train_tokens < 2 * spec.seq_len:
        raise PlanError("--data", f"{data_dir}/train.bin holds {meta.train_tokens:,} tokens, fewer than 2 × seq_len",
                        "prepare more text")
    return meta


def check_resume(plan: Plan, run_dir: Path, resume: bool) -> str | None:
    """A problem with resuming in run_dir (plan hash of its newest complete checkpoint), or None."""
    done = complete_steps(run_dir)
    if not done:
        return f"--resume: {run_dir} has no complete checkpoint to resume from" if resume else None
    mismatch = resume_mismatch(read_meta(step_dir(run_dir, done[-1])) or {}, plan)
    return f"{run_dir} holds checkpoints of a different plan{mismatch}; {RESUME_HINT}" if mismatch else None


def _existing_parent(p: Path) -> Path:
    p = p.resolve()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


# What `nanoplan probe` writes in its DIR (runner/probe.py), and `run --probe` in RUN_DIR.
TRIALS, REPORT, PROFILE = "trials", "probe.json", "profile.yaml"
PROBE_DIR, PROBED_PLAN = "probe", "plan.probed.json"        # RUN_DIR/probe/, RUN_DIR/plan.probed.json
# What the runner writes (or deletes) directly under RUN_DIR; checkpoints/ holds step_* directories,
# probe/ what `run --probe` writes (trials/<label>/, probe.json, profile.yaml).
RUN_DIR_ENTRIES = (CKPT_DIR, "metrics.jsonl", "run_info.json", "stop.json", BEST, "tensorboard", LEDGER, ALIVE,
                   PROBE_DIR, PROBED_PLAN, *LOCK_FILES)


def check_plan_run_dir(raw: str) -> str | None:
    """Problem with a run dir taken from a plan file (not from --run-dir), or None.

    A plan may be someone else's file, so the directory it names must be relative and free of
    '..': it lands under the current directory. Any other place must be asked for on the
    command line with --run-dir.
    """
    return run_dir_problem(raw)     # one rule: estimate refuses to write what run refuses


def check_run_dir_contained(run_dir: Path) -> str | None:
    """A path the runner writes or deletes in RUN_DIR that is a symbolic link, or None.

    RUN_DIR itself may be a symlink (it is resolved first); checkpoints/, metrics.jsonl,
    run_info.json, stop.json, best.json, tensorboard/, launches.json, probe/ (and its trials/,
    trials/<label>, probe.json, profile.yaml), plan.probed.json and every entry of checkpoints/
    (and of checkpoints/.damaged/) must not be links, wherever they lead: nanoplan never writes,
    cleans or deletes through a link, so retention, the probe and the writes cannot reach files
    elsewhere (nor, through a link inside the run dir, another of its own files).
    """
    if not run_dir.is_dir():
        return None
    root = run_dir.resolve()
    paths = [run_dir / n for n in RUN_DIR_ENTRIES]
    probe = run_dir / PROBE_DIR
    paths += [probe / TRIALS, probe / REPORT, probe / PROFILE]
    for sub in (run_dir / CKPT_DIR, run_dir / CKPT_DIR / ".damaged", probe / TRIALS):
        if sub.is_dir() and not sub.is_symlink() and not sub.parent.is_symlink():
            paths += sorted(sub.iterdir())
    for p in paths:
        if not p.is_symlink():
            continue
        target = Path(os.path.realpath(p))
        if not target.is_relative_to(root):
            return f"{p} is a link to {target}, outside the run dir {root}; the runner only writes inside its run dir"
        return (f"{p} is a link (to {target}); nanoplan never writes, cleans or deletes through a link in its "
                "run dir")
    return None


def _write_problem(run_dir: Path, parent: Path) -> str | None:
    """Why run_dir cannot be created or written, found by really writing there (None when it can)."""
    if not run_dir.exists():
        if not parent.is_dir():
            return f"run dir {run_dir} cannot be created: {parent} is not a directory; pick another --run-dir"
        try:   # a real probe: os.access says yes to root on read-only mounts and root-owned 0555 dirs
            os.rmdir(tempfile.mkdtemp(dir=parent, prefix=".nanoplan-write-test."))
        except OSError as e:
            return f"run dir {run_dir} cannot be created ({parent} is not writable: {e.strerror}); pick another --run-dir"
        return _posix_problem(run_dir, parent)
    if not run_dir.is_dir():
        return f"run dir {run_dir} is not a directory; pick another --run-dir"
    try:
        with tempfile.NamedTemporaryFile(dir=run_dir, prefix=".write-test."):
            pass
    except OSError as e:
        return f"run dir {run_dir} is not writable ({e.strerror}); pick another --run-dir"
    return _posix_problem(run_dir, run_dir)


def _posix_problem(run_dir: Path, where: Path) -> str | None:
    """Why the run dir's filesystem cannot hold a run, found by really doing what the run does there: append a
    line (metrics.jsonl) and rewrite bytes in place (the lock files' holder records). A bucket mounted with
    SkyPilot's mode MOUNT refuses both ("random writes and append operations are not supported",
    docs/source/reference/storage.rst); a launch there failed at its first metrics line (issue 30 #9)."""
    fd, tmp = tempfile.mkstemp(dir=where, prefix=".nanoplan-posix-test.")
    try:
        os.write(fd, b"ab")
        os.close(fd)
        fd = -1
        with open(tmp, "ab") as f:
            f.write(b"c")
        fd = os.open(tmp, os.O_RDWR)
        os.pwrite(fd, b"X", 0)
        os.close(fd)
        fd = -1
        got = Path(tmp).read_bytes()
        why = None if got == b"Xbc" else f"read back {got!r} after an append and an in-place write"
    except OSError as e:
        why = e.strerror or str(e)
    finally:
        if fd >= 0:
            os.close(fd)
        Path(tmp).unlink(missing_ok=True)
    if why is None:
        return None
    return (f"run dir {run_dir} refuses appends or in-place writes ({why}): a run appends to metrics.jsonl and "
            "rewrites its lock files in place (a bucket mounted with SkyPilot's mode MOUNT does neither; mode "
            "MOUNT_CACHED, which nanoplan export writes, does both); pick another --run-dir")


def peak_checkpoint_bytes(plan: Plan) -> int:
    """The most checkpoint bytes on disk at once, from the planner's own figure (planner.build)."""
    from planner.build import checkpoint_disk_bytes  # noqa: PLC0415  (one figure with estimate's)

    s = plan.schedule
    return max(s.storage_bytes, checkpoint_disk_bytes(s.num_checkpoints, s.keep_last, s.checkpoint_bytes))


def _checkpoint_bytes_on_disk(run_dir: Path) -> int:
    total = 0
    for st in list_steps(run_dir):
        for f in step_dir(run_dir, st).rglob("*"):
            try:
                total += f.stat().st_size if f.is_file() else 0
            except OSError:
                pass
    return total


def check_run_dir(run_dir: Path, storage_bytes: int, checkpoint_bytes: int = 0) -> list[str]:
    """Problems with the run dir: it cannot be written (then nothing else is checked), or its disk
    has less free space than the plan's checkpoints need at their peak (`storage_bytes`), less
    what the run dir's checkpoints already take (but at least one more checkpoint)."""
    parent = _existing_parent(run_dir)
    bad = _write_problem(run_dir, parent)
    if bad:
        return [bad]
    free = shutil.disk_usage(parent).free
    need = max(checkpoint_bytes, storage_bytes - (_checkpoint_bytes_on_disk(run_dir) if run_dir.is_dir() else 0))
    if free < need:
        return [f"free disk at {parent} is {fmt_bytes(free)}, the plan's checkpoints need {fmt_bytes(need)} "
                "(keep_last + the best + the one being written); "
                "free space, lower --keep-last or pick another --run-dir"]
    return []


def available_ram_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def check_devices(plan: Plan, force_cpu: bool = False) -> tuple[list[str], list[str]]:
    """(problems, notes) about the devices this node has against the plan's per-node needs."""
    per_node = plan.hardware.gpus_per_node
    need = plan.memory.per_gpu_bytes
    problems: list[str] = []
    notes: list[str] = []
    if plan.request.profile.kind == "cpu":
        cores = os.cpu_count() or 1
        if per_node > cores:
            notes.append(f"{per_node} processes on {cores} CPU cores: they will share cores")
        ram = available_ram_bytes()
        if ram is not None and need * per_node > ram:
            problems.append(f"the plan needs {fmt_bytes(need * per_node)} of RAM for {per_node} processes, "
                            f"{fmt_bytes(ram)} is available; use a smaller device batch or fewer processes")
        return problems, notes
    import torch

    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if n < per_node:
        hidden_by = os.environ.get("CUDA_VISIBLE_DEVICES")
        fix = (f"CUDA_VISIBLE_DEVICES={hidden_by} hides the others: widen it, or run on the planned machine"
               if n and hidden_by is not None else "run it on the planned machine, or plan for this one "
               f"(nanoplan estimate --gpu {f'{n}x<GPU>' if n else f'{min(os.cpu_count() or 1, per_node)}xCPU'} ...)")
        problems.append(f"the plan needs {plural(per_node, 'CUDA GPU')} on this node, "
                        f"{n if n else 'and this machine has none'}{' visible' if n else ''}; {fix}")
        return problems, notes
    for i in range(per_node):
        props = torch.cuda.get_device_properties(i)
        if props.total_memory < need:
            problems.append(f"GPU {i} ({props.name}) has {fmt_bytes(props.total_memory)}, the plan needs "
                            f"{fmt_bytes(need)} per GPU; re-plan with --gpu matching this machine")
            break
    name = torch.cuda.get_device_name(0)
    if plan.request.profile.name.split("-")[0].lower() not in name.lower():
        notes.append(f"the plan's profile is {plan.request.profile.name}, this GPU is {name}")
    return problems, notes


def run_preflight(plan: Plan, plan_path: str | Path, run_dir: Path, data_override: str | None,
                  resume: bool) -> Preflight:
    """Every check; collects problems instead of stopping at the first."""
    pf = Preflight()
    if not plan.memory.fits:
        pf.problems.append(f"the plan does not fit: {fmt_bytes(plan.memory.per_gpu_bytes)} per GPU > "
                           f"{fmt_bytes(plan.memory.capacity_bytes)}; re-plan with a smaller batch or another strategy")
    probs, notes = check_devices(plan)
    pf.problems += probs
    pf.notes += notes
    pf.problems += check_run_dir(run_dir, peak_checkpoint_bytes(plan), plan.schedule.checkpoint_bytes)
    escape = check_run_dir_contained(run_dir)
    if escape:        # never a problem --force may pass: nanoplan run refuses it after the lock whatever --force says
        raise PlanError("preflight", escape, "remove the link, or pass the real directory as --run-dir")
    try:
        check_data(plan, resolve_data_dir(plan, data_override, plan_path))
    except PlanError as e:
        pf.problems.append(str(e))
    r = check_resume(plan, run_dir, resume)
    if r:
        pf.problems.append(r)
    return pf
