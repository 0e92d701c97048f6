"""A `nanoplan run` launch as the process tests see it: every process it ever had, signals to all of them, its real
time (tests/test_budget_promise.py, tests/test_trainer_run.py), and the polling wait the reliability tests share."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from runner import runlock
from runner.launcher import child_pids, pid_alive


def wait_for(cond: Callable[[], object], timeout: float = 60, what: str = "") -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


class LaunchTree:
    """One launch started from `args`, its output in `log` (a file: a pipe left unread could block it), with every
    process it ever had (polled) and its real time."""

    def __init__(self, args: list[str], run: Path, log: Path, cwd: Path, env: dict[str, str]) -> None:
        self.run, self.log = run, log
        self.t0 = time.monotonic()
        with open(log, "w") as out:
            self.proc = subprocess.Popen(args, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        self.pids: set[int] = {self.proc.pid}
        self.end: float | None = None

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def poll(self) -> None:
        todo = list(self.pids if self.proc.poll() is None else [])
        while todo:
            for c in child_pids(todo.pop()):
                if c not in self.pids:
                    self.pids.add(c)
                    todo.append(c)

    def live(self) -> list[int]:
        return [p for p in self.pids if p != self.proc.pid and pid_alive(p)] + (
            [self.proc.pid] if self.proc.poll() is None else [])

    def wait_until(self, cond: Callable[[], object], timeout: float, what: str) -> None:
        def check() -> object:
            self.poll()
            return cond()
        wait_for(check, timeout, what)

    def signal_all(self, sig: int, launcher_only: bool = False) -> None:
        self.poll()
        for pid in [self.proc.pid] if launcher_only else self.live():
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def wait_gone(self, timeout: float = 60) -> float:
        """Wait until every process of the launch is gone and the run dir's locks are free; its real time."""
        wait_for(lambda: not self.live() and runlock.probe(self.run, runlock.LAUNCH_LOCK) is None
                 and runlock.probe(self.run, runlock.TRAIN_LOCK) is None, timeout, "the launch to end")
        self.proc.wait(timeout=10)
        self.end = time.monotonic()
        return self.end - self.t0

    def kill(self) -> None:
        self.signal_all(signal.SIGKILL)
        self.proc.wait(timeout=30)
