"""Watching a supervised trainer: its log read as it grows, and the progress it shows (no torch).

The trainer writes everything it prints into RUN_DIR/trainer.log (the keeper opens it for its stdout and
stderr). The supervisor reads the new lines as they come (`LogTail`), turns each step line into a
metrics.jsonl row, and shows progress (`Progress`): a rich panel on a terminal, a plain line every 5 s
otherwise, with tokens/s against the plan, dollars spent and the time to the stop.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from runner.display import PLAIN_EVERY_S, SMOOTH_STEPS, Smoother, fmt_duration, vs_plan


class LogTail:
    """The whole lines appended to a file since `offset` (a line still being written waits for its end)."""

    def __init__(self, path: Path, offset: int) -> None:
        self.path, self.offset = path, offset
        self._part = b""

    def lines(self) -> list[str]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read(4 << 20)
        except OSError:
            return []
        self.offset += len(data)
        chunks = (self._part + data).split(b"\n")
        self._part = chunks.pop()
        return [c.decode("utf-8", "replace") for c in chunks]


def _fmt(v: float | None, spec: str, none: str = "-") -> str:
    return none if v is None else format(v, spec)


class Progress:
    """Shows a supervised run's progress on stdout; `live` defaults to whether stdout is a terminal."""

    def __init__(self, trainer: str, planned_tokens_per_sec: float, budget_usd: float | None,
                 live: bool | None = None) -> None:
        self.trainer, self.planned, self.budget_usd = trainer, planned_tokens_per_sec, budget_usd
        self.live_mode = sys.stdout.isatty() if live is None else live
        self.console = Console()
        self._live: Live | None = None
        self._speed = Smoother(SMOOTH_STEPS)
        self._last_plain = 0.0
        self.row: dict[str, Any] | None = None

    def __enter__(self) -> Progress:
        if self.live_mode:
            self._live = Live(console=self.console, refresh_per_second=4, transient=False)
            self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.__exit__(None, None, None)
            self._live = None

    def update(self, row: dict[str, Any], tokens: float, seconds: float) -> None:
        self._speed.add(tokens, seconds)
        self.row = row
        if self._live is not None:
            self._live.update(self._table(row))
            return
        now = time.monotonic()
        if now - self._last_plain >= PLAIN_EVERY_S:
            self._last_plain = now
            self.say(self.plain(row))

    def _view(self) -> tuple[str, str]:
        speed = self._speed.value()
        gap = vs_plan(speed, self.planned)
        return _fmt(speed, ",.0f"), f" ({gap:+.0%} vs plan)" if gap is not None else ""

    def plain(self, row: dict[str, Any]) -> str:
        speed, gap = self._view()
        loss = f"  loss {row['loss']:.4f}" if row.get("loss") is not None else ""
        return (f"step {row['step']:,}/{row['end_step']:,}{loss}  {speed} tok/s{gap}  "
                f"${row['usd_spent']:.2f}  {fmt_duration(row['elapsed_hours'] * 3600)} elapsed  "
                f"stop in {fmt_duration(row.get('seconds_to_stop'))}  saved {_fmt(row.get('saved'), ',')}")

    def _table(self, row: dict[str, Any]) -> Table:
        t = Table(show_header=False, box=None, title=f"nanoplan run ({self.trainer})", title_justify="left")
        t.add_column(style="bold cyan")
        t.add_column()
        speed, gap = self._view()
        spent = f"${row['usd_spent']:.2f}" + (f" of ${self.budget_usd:.2f}" if self.budget_usd else "")
        for k, v in (("step", f"{row['step']:,} / {row['end_step']:,} (plan: {row['total_steps']:,})"),
                     ("loss", _fmt(row.get("loss"), ".4f")),
                     (f"tokens/s ({SMOOTH_STEPS}-step avg)", speed + gap),
                     ("spent", spent),
                     ("elapsed", fmt_duration(row["elapsed_hours"] * 3600)),
                     ("stop in", fmt_duration(row.get("seconds_to_stop"))),
                     ("last save", f"step {row['saved']:,}" if row.get("saved") else "-"),
                     ("saves every", f"{row['save_every']:,} steps")):
            t.add_row(k, v)
        return t

    def say(self, msg: str) -> None:
        """One line for the user (above the live panel on a terminal); never raises on a closed stdout."""
        try:
            if self._live is not None:
                self._live.console.print(msg, markup=False, highlight=False)
            else:
                print(msg, flush=True)
        except OSError:
            pass
