"""nanoplan runner: the torch training core.

A training worker (`python -m runner.train`) catches SIGTERM, SIGINT and SIGHUP from here,
before `runner.train` imports torch (seconds): a stop asked for during the start-up is recorded
in EARLY_SIGNALS, and runner.signals.Signals takes it over. Any other use of the package is left
alone.
"""

from __future__ import annotations

import signal as _signal
import sys as _sys

EARLY_SIGNALS: list[str] = []


def _record(signum: int, frame: object) -> None:
    EARLY_SIGNALS.append(_signal.Signals(signum).name)


def _is_training_worker(argv: list[str]) -> bool:
    return any(a == "-m" and argv[i + 1:i + 2] == ["runner.train"] for i, a in enumerate(argv[1:3], 1))


if _is_training_worker(list(getattr(_sys, "orig_argv", []))):
    for _s in (_signal.SIGTERM, _signal.SIGINT, _signal.SIGHUP):
        _signal.signal(_s, _record)
