"""The keeper: the one process between `nanoplan run` and a trainer, so that no process of the trainer ever
outlives its launch uncounted. Plain Python, no torch: `python -m runner.trainers.keeper RUN_DIR LOG CWD -- CMD`.

- It dies with `nanoplan run` (PR_SET_PDEATHSIG) and is a child subreaper (PR_SET_CHILD_SUBREAPER): the
  trainer's processes that lose their parent (torchrun's workers live in sessions of their own, DeepSpeed's
  under its launcher) become its children, so it can always find and kill the whole tree.
- It holds RUN_DIR/.nanoplan.train.lock while the trainer runs (a second launch is refused while any of it
  lives), and keeps this launch's time in RUN_DIR/.nanoplan.alive.json (runner/ledger.py `worker_heartbeat`),
  which every reader of the launch ledger folds in: time the trainer ran after its launcher died is counted.
- On SIGTERM, SIGINT or SIGHUP (the supervisor's stop, or the death of `nanoplan run`) it sends SIGKILL to
  every process of the tree until none is left, writes its last beat, and exits 143. When the trainer's own
  process exits, whatever it left behind is killed the same way and the trainer's exit code is returned.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
EXIT_STOPPED = 143
_stop: list[str] = []


def _prctl(option: int, value: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0) == 0
    except OSError:
        return False


def die_with_parent(sig: int = signal.SIGKILL) -> Callable[[], None]:
    """preexec_fn: `sig` reaches the child when its parent dies (Linux; elsewhere nothing)."""
    parent = os.getpid()

    def preexec() -> None:
        _prctl(PR_SET_PDEATHSIG, int(sig))
        if os.getppid() != parent:            # the parent died before the prctl
            os.kill(os.getpid(), sig)

    return preexec


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (Linux /proc children lists), parents before children."""
    out: list[int] = []
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            tasks = list(Path(f"/proc/{p}/task").iterdir())
        except OSError:
            continue
        for t in tasks:
            try:
                kids = [int(x) for x in (t / "children").read_text().split()]
            except (OSError, ValueError):
                continue
            for k in kids:
                if k not in out:
                    out.append(k)
                    todo.append(k)
    return out


def kill_tree(pid: int, *, timeout_s: float = 10.0) -> None:
    """SIGKILL every process below `pid` until none is left (a process may fork while it is being killed)."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        alive = [p for p in descendants(pid) if _running(p)]
        if not alive:
            return
        for p in alive:
            try:
                os.kill(p, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        _reap()
        time.sleep(0.02)


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _reap() -> dict[int, int]:
    """Collect every exited child (orphans that reparented to us included): {pid: wait status}."""
    done: dict[int, int] = {}
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return done
        if pid == 0:
            return done
        done[pid] = status


def _on_signal(signum: int, frame: object) -> None:
    _stop.append(signal.Signals(signum).name)


def main(argv: list[str]) -> int:
    from runner.ledger import worker_heartbeat
    from runner.runlock import TRAIN_LOCK, RunDirBusy, RunLock

    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, _on_signal)
    _prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM))
    launcher = os.environ.get("NANOPLAN_LAUNCH_PID")
    if launcher and str(os.getppid()) != launcher:
        return EXIT_STOPPED                  # `nanoplan run` died before the prctl
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    sep = argv.index("--")
    run_dir, log, cwd = Path(argv[0]), Path(argv[1]), argv[2]
    cmd = argv[sep + 1:]
    try:
        lock = RunLock.acquire(run_dir, TRAIN_LOCK, "nanoplan run (the trainer)")
    except RunDirBusy as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 2
    alive = worker_heartbeat(run_dir)
    code = EXIT_STOPPED
    try:
        if _stop:
            return EXIT_STOPPED
        with open(log, "ab") as out:
            try:
                proc = subprocess.Popen(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        start_new_session=True, preexec_fn=die_with_parent())  # noqa: PLW1509
            except OSError as e:           # no such program or directory: one line in the trainer's log
                out.write(f"error: cannot run {cmd[0]} in {cwd}: {e.strerror or e}\n".encode())
                return 127
        status: int | None = None
        while status is None and not _stop:
            status = _reap().get(proc.pid)
            if status is None:
                time.sleep(0.05)
        kill_tree(os.getpid())
        if status is not None and not _stop:
            code = os.waitstatus_to_exitcode(status)
            code = code if code >= 0 else 128 - code
        return code
    finally:
        kill_tree(os.getpid())
        if alive is not None:
            alive.stop()
        lock.release()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
