"""The worker's stop signals: SIGTERM, SIGINT and SIGHUP only set a flag, which the loop reads once a step.

The loop then finishes the step, checkpoints, and exits 0 (runner/train.py). Nothing is lost at
start-up: runner/__init__.py records signals that arrive while torch is imported
(runner.EARLY_SIGNALS), and `nanoplan run` leaves a stop asked for before this worker could hear it
in the file NANOPLAN_STOP_FILE names.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

from runner.launcher import ENV_STOP_FILE


class Signals:
    """SIGTERM/SIGINT/SIGHUP only set a flag: the loop finishes the step, checkpoints, and exits 0.

    install() also takes over what arrived before it (runner.EARLY_SIGNALS, caught while torch
    was imported) and a stop that `nanoplan run` asked for before this worker could hear it
    (the file NANOPLAN_STOP_FILE names, holding the signal's name): none is lost.
    """

    def __init__(self) -> None:
        self.count = 0
        self.names: list[str] = []

    def install(self) -> None:
        import runner

        for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(s, self._handle)
        for name in runner.EARLY_SIGNALS:
            self._note(name)
        runner.EARLY_SIGNALS.clear()
        stop = os.environ.get(ENV_STOP_FILE)      # read after the handlers are in place: no gap
        if stop and Path(stop).exists():
            self._note(_requested() or "SIGTERM")

    def _note(self, name: str) -> None:
        self.count += 1
        self.names.append(name)

    def _handle(self, signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        if signum == signal.SIGTERM:     # `nanoplan run` writes the signal it got (Ctrl-C: SIGINT) first, then sends SIGTERM
            name = _requested() or name
        self._note(name)


def _requested() -> str | None:
    """The signal `nanoplan run` got, from its stop-request file (None without one)."""
    stop = os.environ.get(ENV_STOP_FILE)
    if not stop:
        return None
    try:
        return Path(stop).read_text().strip()[:20] or None
    except OSError:
        return None
