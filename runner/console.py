"""The worker's stdout and stderr, made safe against a terminal that went away.

A closed terminal (SIGHUP of `nanoplan run`) makes every write fail with EIO; the worker must still
finish its step and its checkpoint, so output is dropped from then on instead of raising.
"""

from __future__ import annotations

from typing import Any


class HangupSafe:
    """A text stream that drops output once writing to it fails (a closed terminal gives EIO), so that
    a worker whose terminal went away (SIGHUP of `nanoplan run`) still finishes its step and checkpoint."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.broken = False

    def write(self, text: str) -> int:
        if not self.broken:
            try:
                return int(self._inner.write(text))
            except (OSError, ValueError):
                self.broken = True
        return len(text)

    def flush(self) -> None:
        if not self.broken:
            try:
                self._inner.flush()
            except (OSError, ValueError):
                self.broken = True

    def isatty(self) -> bool:
        try:
            return not self.broken and bool(self._inner.isatty())
        except (OSError, ValueError):
            return False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)
