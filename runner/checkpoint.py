"""Writing one checkpoint from every rank: atomic, verifiable, meta.json last.

Layout of one checkpoint, RUN_DIR/checkpoints/step_{step:08d}/ (runner/checkpoint_layout.py):

- model.pt            model state_dict (rank 0; the unwrapped module, no DDP/compile prefixes)
- optim_rank0.pt      optimizer + LR-scheduler state (rank 0 under DDP, where it is replicated)
- rng_rank{r}.pt      RNG states of every rank
- meta.json           written LAST by rank 0: step, elapsed hours, dollars, plan hash (and the
                      plan's fields, to name what differs on resume), data position and data
                      fingerprint, val loss, the sha256 and size of every file above, and a sha256
                      of its own content (meta_sha256), so a hand edit is caught as damage

Every file is written to a temp file, fsynced and renamed (runner/torch_files.py). A checkpoint
is complete only when meta.json exists and every checksum verifies (runner/checkpoint_meta.py),
so a kill at any moment leaves the previous checkpoint intact. Which checkpoints are kept is
runner/checkpoint_retention.py's; the fault points of the reliability tests are runner/faults.py's.

torch is imported inside the functions that need it.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from planner.plan import atomic_write_text
from runner.checkpoint_layout import FORMAT_VERSION, META, step_dir
from runner.faults import Faults
from runner.runfiles import seal
from runner.torch_files import fsync_dir, save_torch_atomic


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
