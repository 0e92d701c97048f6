"""Rank 0's progress display: a rich Live panel on a terminal, plain lines otherwise."""

from __future__ import annotations

import sys
import time
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

PLAIN_EVERY_S = 5.0


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = max(0, int(seconds))
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s"


def _table(row: dict[str, Any], budget_usd: float | None) -> Table:
    t = Table(show_header=False, box=None, title="nanoplan run", title_justify="left")
    t.add_column(style="bold cyan")
    t.add_column()
    val = row.get("val_loss")
    spent = f"${row['usd_spent']:.2f}" + (f" of ${budget_usd:.2f}" if budget_usd else "")
    for k, v in (
        ("step", f"{row['step']:,} / {row['total_steps']:,}"),
        ("loss", f"{row['loss']:.4f}" + (f"   val {val:.4f}" if val is not None else "")),
        ("tokens/s", f"{row['tokens_per_sec']:,.0f}"),
        ("MFU", f"{row['mfu'] * 100:.1f}%"),
        ("spent", spent),
        ("elapsed", fmt_duration(row["elapsed_hours"] * 3600)),
        ("auto-stop in", fmt_duration(row.get("seconds_to_stop"))),
        ("next checkpoint in", fmt_duration(row.get("seconds_to_checkpoint"))),
    ):
        t.add_row(k, v)
    return t


class Display:
    """Shows progress on rank 0. `live` defaults to whether stdout is a terminal."""

    def __init__(self, enabled: bool, budget_usd: float | None, live: bool | None = None,
                 console: Console | None = None) -> None:
        self.enabled = enabled
        self.budget_usd = budget_usd
        self.live_mode = enabled and (sys.stdout.isatty() if live is None else live)
        self.console = console or Console()
        self._live: Live | None = None
        self._last_plain = 0.0

    def __enter__(self) -> Display:
        if self.live_mode:
            self._live = Live(console=self.console, refresh_per_second=4, transient=False)
            self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.__exit__(None, None, None)
            self._live = None

    def update(self, row: dict[str, Any]) -> None:
        if not self.enabled:
            return
        if self._live is not None:
            self._live.update(_table(row, self.budget_usd))
            return
        now = time.monotonic()
        if now - self._last_plain >= PLAIN_EVERY_S or row.get("val_loss") is not None:
            self._last_plain = now
            self.log(self.plain(row))

    def plain(self, row: dict[str, Any]) -> str:
        val = row.get("val_loss")
        return (f"step {row['step']}/{row['total_steps']}  loss {row['loss']:.4f}"
                + (f"  val {val:.4f}" if val is not None else "")
                + f"  {row['tokens_per_sec']:,.0f} tok/s  mfu {row['mfu'] * 100:.1f}%"
                + f"  ${row['usd_spent']:.2f}  {fmt_duration(row['elapsed_hours'] * 3600)} elapsed"
                + f"  stop in {fmt_duration(row.get('seconds_to_stop'))}")

    def log(self, msg: str) -> None:
        if not self.enabled:
            return
        try:
            if self._live is not None:
                self._live.console.print(msg)
            else:
                print(msg, flush=True)
        except OSError:  # a closed stdout (broken pipe) must not stop training
            self.enabled = False
