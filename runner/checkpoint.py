"""Atomic, verifiable checkpoints with retention, best.json, and fault-injection points.

Layout of one checkpoint, RUN_DIR/checkpoints/step_{step:08d}/:

- model.pt            model state_dict (rank 0; the unwrapped module, no DDP/compile prefixes)
- optim_rank0.pt      optimizer + LR-scheduler state (rank 0 under DDP, where it is replicated)
- rng_rank{r}.pt      RNG states of every rank
- meta.json           written LAST by rank 0: step, elapsed hours, dollars, plan hash, data
                      position, val loss, and the sha256 and size of every file above

Every file is written to a temp file, fsynced and renamed. A checkpoint is complete only when
meta.json exists and every checksum verifies, so a kill at any moment leaves the previous
checkpoint intact.

Fault injection (for reliability tests): NANOPLAN_FAULT=after_model|after_optim|after_rng|
before_meta|after_meta makes the process os._exit(137) at that point of the N-th checkpoint
write of this process (NANOPLAN_FAULT_AT=N, default 1) on rank NANOPLAN_FAULT_RANK (default 0).
NANOPLAN_FAULT=step:K exits after optimizer step K. Faults fire only in the first launch
(TORCHELASTIC_RESTART_COUNT unset or 0), so torchrun's restart can resume.

torch is imported inside the functions that need it; listing, verifying and reading metas
is plain Python (nanoplan run's preflight uses them).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from planner.plan import Plan, atomic_write_text

CKPT_DIR = "checkpoints"
META = "meta.json"
BEST = "best.json"
FORMAT_VERSION = 1
ENV_FAULT = "NANOPLAN_FAULT"
ENV_FAULT_AT = "NANOPLAN_FAULT_AT"
ENV_FAULT_RANK = "NANOPLAN_FAULT_RANK"
FAULT_POINTS = ("after_model", "after_optim", "after_rng", "before_meta", "after_meta")
FAULT_EXIT = 137
_HASH_CHUNK = 1 << 22


def plan_hash(plan: Plan) -> str:
    """sha256 of what a plan trains: every field except launch, run_dir, created_by and warnings."""
    d = plan.model_dump(mode="json", exclude={"launch", "created_by", "warnings"})
    d["request"].pop("run_dir", None)
    return hashlib.sha256(json.dumps(d, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


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

    @classmethod
    def from_env(cls) -> Faults:
        raw = os.environ.get(ENV_FAULT, "").strip()
        if not raw or _restart_count() > 0:
            return cls()
        at = int(os.environ.get(ENV_FAULT_AT, "1") or 1)
        rank = int(os.environ.get(ENV_FAULT_RANK, "0") or 0)
        if raw.startswith("step:"):
            return cls(crash_step=int(raw[5:]), rank=rank)
        if raw not in FAULT_POINTS:
            raise ValueError(f"{ENV_FAULT}={raw!r}: use one of {', '.join(FAULT_POINTS)} or step:K")
        return cls(point=raw, at=at, rank=rank)

    def fire(self, point: str, rank: int, nth_write: int) -> None:
        if self.point == point and rank == self.rank and nth_write == self.at:
            os._exit(FAULT_EXIT)

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
    """A write-only file wrapper that hashes what passes through it (so no second read)."""

    def __init__(self, f: Any) -> None:
        self.f = f
        self.sha = hashlib.sha256()
        self.size = 0

    def write(self, b: bytes) -> int:
        self.sha.update(b)
        self.size += len(b)
        return self.f.write(b)

    def flush(self) -> None:
        self.f.flush()


def save_torch_atomic(obj: Any, path: Path) -> dict[str, Any]:
    """torch.save to a temp file, fsync, rename. Returns {"sha256", "bytes"}."""
    import torch

    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)  # mkstemp makes 0600; give the file normal permissions
        with os.fdopen(fd, "wb") as f:
            w = _HashingWriter(f)
            torch.save(obj, w)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
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
    try:
        return json.loads((path / META).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def verify(path: Path) -> tuple[bool, str]:
    """(ok, reason): meta.json present and parseable, every listed file present with its checksum."""
    meta = read_meta(path)
    if meta is None:
        return False, "no readable meta.json (the write did not finish)"
    files = meta.get("files")
    if not isinstance(files, dict) or "model.pt" not in files:
        return False, "meta.json lists no model.pt"
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
            return s, read_meta(p) or {}
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
    atomic_write_text(path / META, json.dumps(meta, indent=2, sort_keys=True) + "\n")
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
    import torch

    return torch.load(path, map_location=map_location, weights_only=True)


# ---------------------------------------------------------------- retention and best.json

def read_best(run_dir: str | Path) -> dict[str, Any] | None:
    try:
        return json.loads((Path(run_dir) / BEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


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


def retain(run_dir: str | Path, keep_last: int) -> list[int]:
    """Delete old checkpoints: keep the last `keep_last` complete ones and the best. Returns deleted steps.

    Incomplete directories older than the newest complete checkpoint are debris of killed
    writes and are removed too. The newest complete checkpoint is never deleted.
    """
    done = complete_steps(run_dir)
    if not done:
        return []
    keep = set(done[-max(1, keep_last):])
    best = read_best(run_dir)
    if best is not None:
        keep.add(int(best["step"]))
    newest = done[-1]
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


def save_checkpoint(run_dir: str | Path, step: int, *, rank: int, world_size: int,
                    model_state: Callable[[], dict[str, Any]], optim_state: Callable[[], dict[str, Any]],
                    meta: dict[str, Any] | Callable[[], dict[str, Any]], faults: Faults | None = None, nth_write: int = 1,
                    slow_write: Callable[[], None] | None = None, sharded_optimizer: bool = False) -> Path:
    """Write one checkpoint from every rank (a collective: all ranks must call it). Meta last.

    `model_state` / `optim_state` are called only on the ranks that write them, so other
    ranks never materialise a copy. `meta` may be a callable, evaluated on rank 0 just
    before meta.json is written (so its elapsed time includes the write).
    """
    faults = faults or Faults()
    dist = _dist()
    path = step_dir(run_dir, step)
    if rank == 0:
        prepare_dir(path)
    if dist is not None:
        dist.barrier()
    files: dict[str, dict[str, Any]] = {}
    if rank == 0:
        files["model.pt"] = save_torch_atomic(model_state(), path / "model.pt")
        faults.fire("after_model", rank, nth_write)
    if rank == 0 or sharded_optimizer:
        files[f"optim_rank{rank}.pt"] = save_torch_atomic(optim_state(), path / f"optim_rank{rank}.pt")
    faults.fire("after_optim", rank, nth_write)
    files[f"rng_rank{rank}.pt"] = save_torch_atomic(rng_state(), path / f"rng_rank{rank}.pt")
    faults.fire("after_rng", rank, nth_write)
    fsync_dir(path)
    if slow_write is not None:
        slow_write()
    if dist is not None:
        gathered: list[Any] = [None] * world_size
        dist.all_gather_object(gathered, files)
        files = {k: v for part in gathered for k, v in part.items()}
    faults.fire("before_meta", rank, nth_write)
    if rank == 0:
        fields = meta() if callable(meta) else meta
        write_meta(path, {**fields, "format_version": FORMAT_VERSION, "step": step, "world_size": world_size,
                          "files": dict(sorted(files.items()))})
    faults.fire("after_meta", rank, nth_write)
    if dist is not None:
        dist.barrier()
    return path
