"""One run dir, one run: OS locks (fcntl.flock) that a killed process releases by itself.

Two lock files live in RUN_DIR (they are never deleted: deleting a held lock file would let a
second process lock a new file of the same name):

- ``.nanoplan.lock`` is held by `nanoplan run` on node rank 0 (``.nanoplan.node{R}.lock`` on
  node rank R) for its whole life, and by its torchrun, which inherits the descriptor: while
  either lives, a second `nanoplan run` on the run dir is refused (exit 2, naming the PID and
  host). It covers the launcher's start-up and torchrun's restarts, when no worker runs.
- ``.nanoplan.train.lock`` is held by the rank-0 worker from before it reads or cleans the run
  dir until it exits. It refuses a second plain `torchrun ... -m runner.train` on the run dir,
  and tells `nanoplan run` about workers left over from a launcher killed with -9.
- ``.nanoplan.probe.lock`` in a probe's DIR is held by `nanoplan probe` (and `run --probe`) while it
  probes: a second probe on the same DIR is refused before it touches a trial. A standalone
  `nanoplan probe` that writes into a run dir (its DIR is RUN/probe, or its --out RUN/plan.probed.json,
  or the folder looks like a run dir) also holds that run dir's ``.nanoplan.lock``, as `nanoplan run`
  does: a live run refuses it, and it refuses a launch (issue 30 #3).

Each holder writes who it is ({"pid", "host", "role", "since"}) into its lock file, in place
(not by rename: the lock belongs to the file's inode). Plain Python, no torch.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import json
import os
import socket
from pathlib import Path

LAUNCH_LOCK = ".nanoplan.lock"
TRAIN_LOCK = ".nanoplan.train.lock"
PROBE_LOCK = ".nanoplan.probe.lock"
LOCK_FILES = (LAUNCH_LOCK, TRAIN_LOCK)
RUN_MARKERS = (LAUNCH_LOCK, TRAIN_LOCK, "launches.json", "run_info.json", "checkpoints")   # a run dir holds one


def looks_like_run_dir(d: Path) -> bool:
    """Whether `d` is (or was) a run dir of `nanoplan run`: it holds one of RUN_MARKERS."""
    return any(os.path.lexists(d / m) for m in RUN_MARKERS)


def launch_lock_name(node_rank: int = 0) -> str:
    return LAUNCH_LOCK if node_rank == 0 else f".nanoplan.node{node_rank}.lock"


class RunDirBusy(Exception):
    """The run dir is locked by another live process; str() says which."""

    def __init__(self, run_dir: Path, holder: dict[str, object] | None) -> None:
        self.run_dir, self.holder = run_dir, holder or {}
        super().__init__(describe(run_dir, self.holder))

    @property
    def pid(self) -> object:
        return self.holder.get("pid", "?")

    @property
    def host(self) -> object:
        return self.holder.get("host", "?")


def describe(run_dir: Path, holder: dict[str, object]) -> str:
    role = holder.get("role") or "another process"
    since = f", since {holder['since']}" if holder.get("since") else ""
    return f"{run_dir} is in use by {role} (PID {holder.get('pid', '?')} on host {holder.get('host', '?')}{since})"


def _read_holder(fd: int) -> dict[str, object] | None:
    try:
        raw = os.pread(fd, 4096, 0).decode("utf-8", "replace")
        data = json.loads(raw) if raw.strip() else None
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


class RunLock:
    """An exclusive flock on RUN_DIR/NAME, held until release() or the holder's death."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path, self.fd = path, fd

    @classmethod
    def acquire(cls, run_dir: Path, name: str, role: str) -> RunLock:
        """Lock RUN_DIR/NAME now or raise RunDirBusy; OSError when the file cannot be made."""
        path = run_dir / name
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise RunDirBusy(run_dir, holder) from None
        except OSError:
            os.close(fd)
            raise
        lock = cls(path, fd)
        lock.describe_holder(role)
        return lock

    def describe_holder(self, role: str, **extra: object) -> None:
        """Write who holds the lock into it (best effort: a full disk must not stop a run here)."""
        info = {"pid": os.getpid(), "host": socket.gethostname(), "role": role,
                "since": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), **extra}
        try:
            os.ftruncate(self.fd, 0)
            os.pwrite(self.fd, (json.dumps(info) + "\n").encode(), 0)
        except OSError:
            pass

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)      # closing the last descriptor drops the flock
            self.fd = -1


def probe(run_dir: Path, name: str) -> dict[str, object] | None:
    """Who holds RUN_DIR/NAME (its holder record, or {} if unreadable), or None when it is free."""
    path = run_dir / name
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return _read_holder(fd) or {}
    except OSError:
        return None
    finally:
        os.close(fd)
    return None
