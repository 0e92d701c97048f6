"""Atomic, verifiable checkpoints with retention, best.json, and fault-injection points.

Layout of one checkpoint, RUN_DIR/checkpoints/step_{step:08d}/:

- model.pt            model state_dict (rank 0; the unwrapped module, no DDP/compile prefixes)
- optim_rank0.pt      optimizer + LR-scheduler state (rank 0 under DDP, where it is replicated)
- rng_rank{r}.pt      RNG states of every rank
- meta.json           written LAST by rank 0: step, elapsed hours, dollars, plan hash (and the
                      plan's fields, to name what differs on resume), data position and data
                      fingerprint, val loss, the sha256 and size of every file above, and a sha256
                      of its own content (meta_sha256), so a hand edit is caught as damage

Every file is written to a temp file, fsynced and renamed. A checkpoint is complete only when
meta.json exists and every checksum verifies, so a kill at any moment leaves the previous
checkpoint intact.

Fault injection (for reliability tests): NANOPLAN_FAULT=after_model|after_optim|after_rng|
before_meta|after_meta makes the process os._exit(137) at that point of the N-th checkpoint
write of this process (NANOPLAN_FAULT_AT=N, default 1) on rank NANOPLAN_FAULT_RANK (default 0).
NANOPLAN_FAULT=step:K exits after optimizer step K. NANOPLAN_FAULT=enospc|eio makes the
torch.save of that rank's rng file in the N-th write raise OSError(ENOSPC|EIO) part-way (a full
or failing disk): the write is abandoned on every rank, the partial step directory removed, and
CheckpointWriteError raised. NANOPLAN_FAULT=enospc:metrics makes the N-th metrics.jsonl line
fail with ENOSPC, enospc:run_info the run_info.json write of the launch (a disk that fills up
outside a checkpoint write). Faults fire only in the first launch (TORCHELASTIC_RESTART_COUNT
unset or 0), so torchrun's restart can resume.

torch is imported inside the functions that need it; listing, verifying and reading metas
is plain Python (nanoplan run's preflight uses them).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from planner.errors import PlanError, echo
from planner.plan import Plan, atomic_write_text, doc_sha, plan_doc
from runner.runfiles import Best, CheckpointMeta, problem_of, read_json_file, seal

CKPT_DIR = "checkpoints"
META = "meta.json"
BEST = "best.json"
FORMAT_VERSION = 2      # 2: meta.json carries meta_sha256 (runner/runfiles.py); 1 is still read, without it
ENV_FAULT = "NANOPLAN_FAULT"
ENV_FAULT_AT = "NANOPLAN_FAULT_AT"
ENV_FAULT_RANK = "NANOPLAN_FAULT_RANK"
FAULT_POINTS = ("after_model", "after_optim", "after_rng", "before_meta", "after_meta")
IO_FAULTS = {"enospc": errno.ENOSPC, "eio": errno.EIO}
FILE_FAULTS = ("metrics", "run_info")      # NANOPLAN_FAULT=enospc:metrics|enospc:run_info
FAULT_EXIT = 137
SHARDED_MODEL = "dcp/model/.metadata"   # zero2/fsdp checkpoints: DCP shards instead of model.pt (runner/dcp.py)
_HASH_CHUNK = 1 << 22


# Fields a resumed run may change: how often it checkpoints and how many it keeps (and what follows from them).
RESUME_SAFE_FIELDS = ("request.checkpoint_every_minutes", "request.keep_last", "schedule.checkpoint_every_minutes",
                      "schedule.checkpoint_every_steps", "schedule.num_checkpoints", "schedule.keep_last",
                      "schedule.storage_bytes")


def flatten(doc: Any, prefix: str = "") -> dict[str, Any]:
    """{"a.b.0": leaf} of a nested JSON document (an empty dict or list is a leaf)."""
    if isinstance(doc, dict) and doc:
        return {k: v for key, sub in doc.items() for k, v in flatten(sub, f"{prefix}.{key}" if prefix else str(key)).items()}
    if isinstance(doc, list) and doc:
        return {k: v for i, sub in enumerate(doc) for k, v in flatten(sub, f"{prefix}.{i}" if prefix else str(i)).items()}
    return {prefix: doc}


def train_hash(plan_or_doc: Plan | dict[str, Any]) -> str:
    """plan_hash without RESUME_SAFE_FIELDS: equal for plans a checkpoint may be resumed under."""
    doc = plan_doc(plan_or_doc) if isinstance(plan_or_doc, Plan) else plan_or_doc
    flat = flatten(doc)
    return doc_sha({k: v for k, v in flat.items() if k not in RESUME_SAFE_FIELDS})


RESUME_HINT = ("only checkpoint_every_minutes and keep_last may change on resume; "
               "use another --run-dir, or --force to resume from it anyway")


def resume_mismatch(meta: dict[str, Any], plan: Plan) -> str | None:
    """Why a checkpoint (its meta.json) is of a different plan, as text to follow "... a different plan": the
    fields that differ, or the hashes for an old checkpoint. None when it can be resumed: the same plan, or one that differs only in RESUME_SAFE_FIELDS (cadence, keep_last)."""
    ours = plan_doc(plan)
    if meta.get("plan_hash") == doc_sha(ours) or meta.get("train_hash") == train_hash(ours):
        return None
    theirs = meta.get("plan")
    if not isinstance(theirs, dict):    # a checkpoint written before meta.json kept the plan's fields
        return (f" (hash {str(meta.get('plan_hash'))[:12]}, this plan {doc_sha(ours)[:12]}; the checkpoint predates "
                "the record of the plan's fields in meta.json, so the ones that differ cannot be named)")
    a, b = flatten(theirs), flatten(ours)
    diff = [k for k in sorted(set(a) | set(b)) if a.get(k, "(absent)") != b.get(k, "(absent)")
            and k not in RESUME_SAFE_FIELDS]
    if not diff:
        return None
    first = diff[0]
    more = f" (and {len(diff) - 1} more: {', '.join(diff[1:4])}{', ...' if len(diff) > 4 else ''})" if len(diff) > 1 else ""
    return (f": {first} is {echo(a.get(first, '(absent)'), 80)} there, "
            f"{echo(b.get(first, '(absent)'), 80)} in this plan{more}")


def ckpt_root(run_dir: str | Path) -> Path:
    return Path(run_dir) / CKPT_DIR


def step_dir(run_dir: str | Path, step: int) -> Path:
    return ckpt_root(run_dir) / f"step_{step:08d}"


def list_steps(run_dir: str | Path) -> list[int]:
    """Steps of all checkpoint directories (complete or not), ascending."""
    root = ckpt_root(run_dir)
    if not root.is_dir():
        return []
    out = []
    for p in root.iterdir():
        if p.is_dir() and p.name.startswith("step_") and p.name[5:].isdigit():
            out.append(int(p.name[5:]))
    return sorted(out)


def complete_steps(run_dir: str | Path) -> list[int]:
    """Steps whose meta.json exists (not yet checksum-verified), ascending."""
    return [s for s in list_steps(run_dir) if (step_dir(run_dir, s) / META).is_file()]


# ---------------------------------------------------------------- faults

def _restart_count() -> int:
    try:
        return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    except ValueError:
        return 0


@dataclass
class Faults:
    """Fault-injection settings read from the environment."""

    point: str = ""
    at: int = 1
    rank: int = 0
    crash_step: int | None = None
    io_errno: int | None = None
    target: str = "checkpoint"          # what an io fault hits: a checkpoint, or one of FILE_FAULTS

    @classmethod
    def from_env(cls) -> Faults:
        raw = os.environ.get(ENV_FAULT, "").strip()
        if not raw or _restart_count() > 0:
            return cls()
        at = int(os.environ.get(ENV_FAULT_AT, "1") or 1)
        rank = int(os.environ.get(ENV_FAULT_RANK, "0") or 0)
        if raw.startswith("step:"):
            return cls(crash_step=int(raw[5:]), rank=rank)
        if raw in IO_FAULTS:
            return cls(point=raw, at=at, rank=rank, io_errno=IO_FAULTS[raw])
        kind, _, target = raw.partition(":")
        if kind in IO_FAULTS and target in FILE_FAULTS:
            return cls(point=raw, at=at, rank=0, io_errno=IO_FAULTS[kind], target=target)
        if raw not in FAULT_POINTS:
            files = ", ".join(f"enospc:{t}" for t in FILE_FAULTS)
            raise ValueError(f"{ENV_FAULT}={raw!r}: use one of {', '.join(FAULT_POINTS + tuple(IO_FAULTS))}, "
                             f"{files} or step:K")
        return cls(point=raw, at=at, rank=rank)

    def fire(self, point: str, rank: int, nth_write: int) -> None:
        if self.point == point and rank == self.rank and nth_write == self.at:
            os._exit(FAULT_EXIT)

    def io_error(self, rank: int, nth_write: int) -> int | None:
        """The errno to inject into this rank's rng-file write, or None."""
        if self.io_errno is not None and self.target == "checkpoint" and rank == self.rank and nth_write == self.at:
            return self.io_errno
        return None

    def file_fault(self, target: str) -> tuple[int, int] | None:
        """(errno, n): fail the n-th write of `target` (metrics, run_info), or None."""
        if self.io_errno is not None and self.target == target:
            return self.io_errno, self.at
        return None

    def file_errno(self, target: str, nth: int) -> int | None:
        f = self.file_fault(target)
        return f[0] if f is not None and f[1] == nth else None

    def after_step(self, step: int, rank: int) -> None:
        if self.crash_step is not None and step == self.crash_step and rank == self.rank:
            os._exit(FAULT_EXIT)


# ---------------------------------------------------------------- atomic files

def fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class _HashingWriter:
    """A write-only file wrapper that hashes what passes through it (so no second read).

    It keeps the OSError of a failed write: torch.save reports it only as an opaque
    "enforce fail ... unexpected pos" RuntimeError. `fail_errno` injects one (a test fault).
    """

    def __init__(self, f: Any, fail_errno: int | None = None) -> None:
        self.f = f
        self.sha = hashlib.sha256()
        self.size = 0
        self.error: OSError | None = None
        self.fail_errno = fail_errno

    def write(self, b: bytes) -> int:
        try:
            if self.fail_errno is not None and self.size > 0:
                raise OSError(self.fail_errno, os.strerror(self.fail_errno), getattr(self.f, "name", None))
            n = self.f.write(b)
        except OSError as e:
            self.error = e
            raise
        self.sha.update(b)
        self.size += len(b)
        return n

    def flush(self) -> None:
        self.f.flush()


def save_torch_atomic(obj: Any, path: Path, *, fail_errno: int | None = None) -> dict[str, Any]:
    """torch.save to a temp file, fsync, rename. Returns {"sha256", "bytes"}.

    A failed write (disk full, I/O error) raises the OSError itself and leaves no temp file.
    """
    import torch

    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    w: _HashingWriter | None = None
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)  # mkstemp makes 0600; give the file normal permissions
        with os.fdopen(fd, "wb") as f:
            w = _HashingWriter(f, fail_errno)
            torch.save(obj, w)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        err = w.error if w is not None and w.error is not None and not isinstance(e, OSError) else e
        if isinstance(err, OSError) and err.errno:    # name the checkpoint file, not its temp file
            raise OSError(err.errno, err.strerror or os.strerror(err.errno), str(path)) from None
        if err is not e:
            raise err from None
        raise
    return {"sha256": w.sha.hexdigest(), "bytes": w.size}


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            h.update(chunk)
    return h.hexdigest()


# ---------------------------------------------------------------- reading and verifying

def read_meta(path: Path) -> dict[str, Any] | None:
    """meta.json as stored, unchecked (None when absent or not JSON); check_meta validates it."""
    try:
        return json.loads((path / META).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def check_meta(path: Path) -> tuple[dict[str, Any] | None, str]:
    """(meta, "ok") when meta.json parses, fits its schema and matches its own checksum; else (None, why),
    naming the field. A format-1 meta.json (before meta_sha256) is accepted without the checksum."""
    data, problem = read_json_file(path / META)
    if data is None:
        return None, "no readable meta.json (the write did not finish)" if problem is None else problem
    meta, problem = problem_of(CheckpointMeta, data, str(path / META))
    if problem is not None or meta is None:
        return None, problem or "invalid"
    stamp = data.get("meta_sha256")
    if (stamp is not None or data.get("format_version", 1) >= 2) and stamp != seal(data)["meta_sha256"]:
        return None, (f"{path / META}: field 'meta_sha256': does not match the file's content "
                      "(edited or damaged after it was written)")
    return data, "ok"


def verify(path: Path) -> tuple[bool, str]:
    """(ok, reason): meta.json valid (schema and its own checksum), every listed file present with its checksum."""
    meta, why = check_meta(path)
    if meta is None:
        return False, why
    files = meta["files"]
    if not ({"model.pt", SHARDED_MODEL} & set(files)):
        return False, "meta.json lists no model.pt (nor DCP model shards)"
    for name, info in files.items():
        f = path / name
        if not f.is_file():
            return False, f"{name} is missing"
        if f.stat().st_size != info.get("bytes"):
            return False, f"{name} has {f.stat().st_size} bytes, meta.json says {info.get('bytes')}"
        if sha256_file(f) != info.get("sha256"):
            return False, f"{name} fails its sha256 check"
    return True, "ok"


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


# ---------------------------------------------------------------- writing

def prepare_dir(path: Path) -> None:
    """Create the step directory, clearing debris of an earlier unfinished write at the same step."""
    if path.exists() and not (path / META).exists():
        shutil.rmtree(path)
    path.mkdir(parents=True, exist_ok=True)
    fsync_dir(path.parent)


def write_meta(path: Path, meta: dict[str, Any]) -> None:
    """meta.json, sealed with its own sha256 (meta_sha256)."""
    atomic_write_text(path / META, json.dumps(seal(meta), indent=2, sort_keys=True) + "\n")
    fsync_dir(path)


def rng_state() -> dict[str, Any]:
    import random

    import torch

    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": list(random.getstate()[1])}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    import random

    import torch

    torch.set_rng_state(state["torch"])
    random.setstate((3, tuple(state["python"]), None))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def load_torch(path: Path, map_location: Any = "cpu") -> Any:
    """torch.load(weights_only=True): tensors and plain containers only, never a pickled object.

    A file that torch refuses (a pickle payload, a file that is not a torch checkpoint) raises
    a one-line PlanError naming the file; nothing in it is executed.
    """
    import pickle
    import warnings

    import torch

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")       # e.g. "Detected pickle protocol 4" on foreign files
            return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # noqa: BLE001 - any failure to load an untrusted file is the same refusal
        boiler = ("Weights only load failed", "Please file an issue", "Check the documentation")
        lines = [x.split("WeightsUnpickler error:")[-1].strip() for x in str(e).splitlines()]
        why = next((x for x in lines if x and not x.startswith(boiler)), "")[:200]
        if not isinstance(e, (pickle.UnpicklingError, OSError)):
            why = f"{type(e).__name__}: {why}" if why else type(e).__name__
        payload = isinstance(e, pickle.UnpicklingError) and "global" in str(e).lower()   # a class or function
        kind = ("holds pickled objects, not just tensors" if payload
                else "cannot be read" if isinstance(e, OSError) else "is not a torch checkpoint")
        raise PlanError(str(path), f"refused by torch.load(weights_only=True): it {kind} ({why})",
                        "it is not a nanoplan checkpoint; move it out of the run dir, or use another --run-dir") from None


# ---------------------------------------------------------------- retention and best.json

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


# ---------------------------------------------------------------- the collective save

def _dist() -> Any:
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (disk full, I/O error, unwritable). Raised on every rank;
    the partial step directory is removed and older checkpoints are untouched."""


def _io_line(e: BaseException, rank: int) -> str:
    if isinstance(e, OSError) and e.errno:
        where = f" ({Path(e.filename).name})" if e.filename else ""
        return f"rank {rank}: {os.strerror(e.errno)} [errno {errno.errorcode.get(e.errno, e.errno)}]{where}"
    return f"rank {rank}: {str(e).splitlines()[0] if str(e) else type(e).__name__}"


def _first_error(dist: Any, error: str | None, world_size: int) -> str | None:
    """Every rank learns the first rank's error (a collective, so it is also a barrier)."""
    if dist is None:
        return error
    gathered: list[Any] = [None] * world_size
    dist.all_gather_object(gathered, error)
    return next((g for g in gathered if g), None)


def save_checkpoint(run_dir: str | Path, step: int, *, rank: int, world_size: int,
                    model_state: Callable[[], dict[str, Any]], optim_state: Callable[[], dict[str, Any]],
                    meta: dict[str, Any] | Callable[[], dict[str, Any]], faults: Faults | None = None, nth_write: int = 1,
                    slow_write: Callable[[], None] | None = None, sharded_optimizer: bool = False,
                    shards: Callable[[Path], dict[str, dict[str, Any]]] | None = None) -> Path:
    """Write one checkpoint from every rank (a collective: all ranks must call it). Meta last.

    `model_state` / `optim_state` are called only on the ranks that write them, so other
    ranks never materialise a copy. `meta` may be a callable, evaluated on rank 0 just
    before meta.json is written (so its elapsed time includes the write). `shards` (zero2/fsdp)
    is called on every rank instead of writing model.pt: it writes that rank's DCP shards and
    returns their {name: {sha256, bytes}} (runner/dcp.py).

    An OSError on any rank (disk full, I/O error) abandons the write on every rank: rank 0
    removes the partial step directory, and all ranks raise CheckpointWriteError.
    """
    faults = faults or Faults()
    dist = _dist()
    path = step_dir(run_dir, step)

    def abandon(error: str) -> CheckpointWriteError:
        if rank == 0 and not existed:
            shutil.rmtree(path, ignore_errors=True)
        return CheckpointWriteError(f"checkpoint {path.name} could not be written: {error}")

    error: str | None = None
    existed = (path / META).exists()   # never remove a complete checkpoint that was already there
    if rank == 0:
        try:
            prepare_dir(path)
        except OSError as e:
            error = _io_line(e, rank)
    error = _first_error(dist, error, world_size)
    if error:
        raise abandon(error)
    files: dict[str, dict[str, Any]] = {}
    try:
        if shards is not None:      # zero2/fsdp: every rank writes its DCP shards (collective), not model.pt
            files.update(shards(path))
        elif rank == 0:
            files["model.pt"] = save_torch_atomic(model_state(), path / "model.pt")
        faults.fire("after_model", rank, nth_write)
        if rank == 0 or sharded_optimizer:
            files[f"optim_rank{rank}.pt"] = save_torch_atomic(optim_state(), path / f"optim_rank{rank}.pt")
        faults.fire("after_optim", rank, nth_write)
        files[f"rng_rank{rank}.pt"] = save_torch_atomic(rng_state(), path / f"rng_rank{rank}.pt",
                                                        fail_errno=faults.io_error(rank, nth_write))
        faults.fire("after_rng", rank, nth_write)
        fsync_dir(path)
    except OSError as e:
        error = _io_line(e, rank)
    if slow_write is not None and error is None:
        slow_write()
    if dist is not None:
        gathered: list[Any] = [None] * world_size
        dist.all_gather_object(gathered, (files, error))
        files = {k: v for part, _ in gathered for k, v in part.items()}
        error = next((err for _, err in gathered if err), None)
    if error:
        raise abandon(error)
    faults.fire("before_meta", rank, nth_write)
    if rank == 0:
        fields = meta() if callable(meta) else meta
        try:
            write_meta(path, {**fields, "format_version": FORMAT_VERSION, "step": step, "world_size": world_size,
                              "files": dict(sorted(files.items()))})
        except OSError as e:
            (path / META).unlink(missing_ok=True)
            error = _io_line(e, rank)
    faults.fire("after_meta", rank, nth_write)
    error = _first_error(dist, error, world_size)    # also the barrier: meta.json is on disk for everyone
    if error:
        raise abandon(error)
    return path
