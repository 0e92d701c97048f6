"""Fault injection for the reliability tests, read from the environment.

NANOPLAN_FAULT=after_model|after_optim|after_rng|before_meta|after_meta makes the process
os._exit(137) at that point of the N-th checkpoint write of this process (NANOPLAN_FAULT_AT=N,
default 1) on rank NANOPLAN_FAULT_RANK (default 0). NANOPLAN_FAULT=step:K exits after optimizer
step K. NANOPLAN_FAULT=enospc|eio makes the torch.save of that rank's rng file in the N-th write
raise OSError(ENOSPC|EIO) part-way (a full or failing disk): the write is abandoned on every
rank, the partial step directory removed, and CheckpointWriteError raised (runner/checkpoint.py).
NANOPLAN_FAULT=enospc:metrics makes the N-th metrics.jsonl line fail with ENOSPC,
enospc:run_info the run_info.json write of the launch (a disk that fills up outside a
checkpoint write). Faults fire only in the first launch (TORCHELASTIC_RESTART_COUNT unset or
0), so torchrun's restart can resume.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass

from runner.elastic import restart_count

ENV_FAULT = "NANOPLAN_FAULT"
ENV_FAULT_AT = "NANOPLAN_FAULT_AT"
ENV_FAULT_RANK = "NANOPLAN_FAULT_RANK"
FAULT_POINTS = ("after_model", "after_optim", "after_rng", "before_meta", "after_meta")
IO_FAULTS = {"enospc": errno.ENOSPC, "eio": errno.EIO}
FILE_FAULTS = ("metrics", "run_info")      # NANOPLAN_FAULT=enospc:metrics|enospc:run_info
FAULT_EXIT = 137


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
        if not raw or restart_count() > 0:
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
