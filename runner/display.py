"""Rank 0's progress display: a rich Live panel on a terminal, plain lines otherwise.

It says where the run is going: the projected final step and tokens (runner/schedule.py), the
validation loss, tokens/s averaged over the last SMOOTH_STEPS steps (one step's figure jumps), and
how that average compares with the plan's tokens/s ("-12% vs plan": 12% slower; the same words
as probe's "vs plan" column). When the run has stopped, the panel says why and where its last
checkpoint is (`finish`) instead of the time to the next one. At the end `summary` prints planned
against achieved tokens, steps, time (in s, min or h), dollars and the final loss; runner/train.py
also writes that summary into stop.json (`stop_summary`).
"""

from __future__ import annotations

import math
import sys
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from planner.units import fmt_count

if TYPE_CHECKING:
    from planner.plan import Plan

PLAIN_EVERY_S = 5.0
SMOOTH_STEPS = 20          # tokens/s is averaged over this many steps


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = max(0, int(seconds))
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s"


class Smoother:
    """Tokens/s over the last `n` steps: their tokens over their seconds."""

    def __init__(self, n: int = SMOOTH_STEPS) -> None:
        self._steps: deque[tuple[float, float]] = deque(maxlen=n)

    def add(self, tokens: float, seconds: float) -> None:
        if seconds > 0:
            self._steps.append((tokens, seconds))

    def value(self) -> float | None:
        secs = sum(s for _, s in self._steps)
        return sum(t for t, _ in self._steps) / secs if secs > 0 else None


def vs_plan(smoothed: float | None, planned: float | None) -> float | None:
    """Measured tokens/s against the plan's, as a signed fraction (-0.12: 12% slower); None without both."""
    if not smoothed or not planned:
        return None
    return smoothed / planned - 1.0


def _speed(view: dict[str, Any], unit: str = "") -> str:
    s = (f"{view['smoothed']:,.0f}" if view["smoothed"] is not None else "-") + unit
    if view["vs_plan"] is not None:
        s += f" ({view['vs_plan']:+.0%} vs plan)"
    return s


def fmt_hours(hours: float | None) -> str:
    """A duration in the unit that reads best: 6.6 s, 12.5 min, 31.6 h."""
    if hours is None or not math.isfinite(hours):
        return "-"
    if hours >= 1:
        return f"{hours:,.1f} h"
    if hours * 60 >= 1:
        return f"{hours * 60:.1f} min"
    return f"{hours * 3600:.1f} s"


def _projected(row: dict[str, Any]) -> str:
    proj = row.get("projected_steps")
    if proj is None:
        return "-"
    tokens = row.get("projected_tokens")
    return f"step {proj:,}" + (f", {fmt_count(tokens)} tokens" if tokens else "")


def _table(row: dict[str, Any], view: dict[str, Any], budget_usd: float | None,
           stopped: tuple[str, str] | None = None) -> Table:
    """The live panel; `stopped` (why, last checkpoint) replaces the countdowns once the run has ended."""
    t = Table(show_header=False, box=None, title="nanoplan run" + (" (stopped)" if stopped else ""),
              title_justify="left")
    t.add_column(style="bold cyan")
    t.add_column()
    val = row.get("val_loss", view.get("val_loss"))
    spent = f"${row['usd_spent']:.2f}" + (f" of ${budget_usd:.2f}" if budget_usd else "")
    for k, v in (
        ("step", f"{row['step']:,} / {row['total_steps']:,}"),
        ("ends at", _projected(row)),
        ("loss", f"{row['loss']:.4f}" + (f"   val {val:.4f}" if val is not None else "")),
        (f"tokens/s ({SMOOTH_STEPS}-step avg)", _speed(view)),
        ("MFU", f"{row['mfu'] * 100:.1f}%"),
        ("spent", spent),
        ("elapsed", fmt_duration(row["elapsed_hours"] * 3600)),
        *((("stopped", stopped[0]), ("last checkpoint", stopped[1])) if stopped else (
            ("auto-stop in", fmt_duration(row.get("seconds_to_stop")) if row.get("seconds_to_stop") is not None
             else f"- (no deadline: stops at step {row['total_steps']:,})"),
            ("next checkpoint in", _next_checkpoint(row, view)))),
    ):
        t.add_row(k, v)
    return t


def _next_checkpoint(row: dict[str, Any], view: dict[str, Any]) -> str:
    """The time to the next checkpoint: the cadence's, or the final one's when the run stops first (at its
    deadline, or at its last step at the current speed), which a 2-minute run with hourly checkpoints does."""
    cadence = row.get("seconds_to_checkpoint")
    ends = [s for s in (row.get("seconds_to_stop"), _seconds_to_last_step(row, view)) if s is not None]
    end = min(ends) if ends else None
    if end is not None and (cadence is None or end <= cadence):
        return f"{fmt_duration(end)} (the final one)"
    return fmt_duration(cadence)


def _seconds_to_last_step(row: dict[str, Any], view: dict[str, Any]) -> float | None:
    """Seconds until the projected last step at the smoothed speed; None before there is a speed."""
    proj, step, tokens, speed = row.get("projected_steps"), row.get("step"), row.get("tokens_seen"), view.get("smoothed")
    if not proj or not step or not tokens or not speed:
        return None
    return max(0, proj - step) * tokens / step / speed


def stop_summary(plan: Plan, *, steps: int, tokens: int, hours: float, usd: float, loss: float | None,
                 val_loss: float | None) -> dict[str, Any]:
    """Planned against achieved, for stop.json and the last lines of the run."""
    return {
        "planned": {"steps": plan.schedule.total_steps, "tokens": plan.schedule.total_tokens,
                    "hours": plan.budget.hours, "usd": plan.budget.usd},
        "achieved": {"steps": steps, "tokens": tokens, "hours": hours, "usd": usd},
        "final_loss": _finite(loss), "final_val_loss": _finite(val_loss),
    }


def _finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


def summary_lines(s: dict[str, Any]) -> list[str]:
    p, a = s["planned"], s["achieved"]

    def pct(x: float, y: float) -> str:
        return f" ({x / y:.0%})" if y else ""

    loss = "-" if s["final_loss"] is None else f"{s['final_loss']:.4f}"
    if s.get("final_val_loss") is not None:
        loss += f", val {s['final_val_loss']:.4f}"
    return [
        "summary         planned        achieved",
        f"  steps   {p['steps']:>14,}  {a['steps']:>14,}{pct(a['steps'], p['steps'])}",
        f"  tokens  {fmt_count(p['tokens']):>14}  {fmt_count(a['tokens']):>14}{pct(a['tokens'], p['tokens'])}",
        f"  time    {fmt_hours(p['hours']):>14}  {fmt_hours(a['hours']):>14}",
        f"  dollars {'$' + format(p['usd'], ',.2f'):>14}  {'$' + format(a['usd'], ',.2f'):>14}",
        f"  final loss {loss}",
    ]


class Display:
    """Shows progress on rank 0. `live` defaults to whether stdout is a terminal."""

    def __init__(self, enabled: bool, budget_usd: float | None, live: bool | None = None,
                 console: Console | None = None, planned_tokens_per_sec: float | None = None) -> None:
        self.enabled = enabled
        self.budget_usd = budget_usd
        self.planned_tokens_per_sec = planned_tokens_per_sec
        self.live_mode = enabled and (sys.stdout.isatty() if live is None else live)
        self.console = console or Console()
        self._live: Live | None = None
        self._last_plain = 0.0
        self._speed = Smoother()
        self._val: float | None = None
        self._prev_tokens: float | None = None
        self._last: tuple[dict[str, Any], dict[str, Any]] | None = None    # the last row and its view

    def __enter__(self) -> Display:
        if self.live_mode:
            self._live = Live(console=self.console, refresh_per_second=4, transient=False)
            self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            if self._last is not None and exc and exc[0] is not None:   # an error: no countdown left behind
                self._live.update(_table(*self._last, self.budget_usd, stopped=("error", "-")))
            self._live.__exit__(None, None, None)
            self._live = None

    def finish(self, reason: str | None, checkpoint: str | None) -> None:
        """The run has stopped: the panel's countdowns give way to why, and the last checkpoint."""
        if self._live is not None and self._last is not None:
            row, view = self._last
            where = checkpoint.rstrip("/").rsplit("/", 1)[-1] if checkpoint else "-"
            self._live.update(_table(row, view, self.budget_usd,
                                     stopped=(f"{reason or 'ended'} at step {row['step']:,}", where)))

    def view(self, row: dict[str, Any]) -> dict[str, Any]:
        """Fold one metrics row into the window; the smoothed speed, the gap to plan, the last val loss."""
        tokens = row.get("tokens_seen")
        per_step = (tokens - self._prev_tokens if tokens is not None and self._prev_tokens is not None
                    and tokens > self._prev_tokens else row.get("tokens_per_sec", 0.0) * row.get("step_seconds", 0.0))
        self._prev_tokens = tokens
        self._speed.add(per_step, row.get("step_seconds") or 0.0)
        if row.get("val_loss") is not None:
            self._val = row["val_loss"]
        smoothed = self._speed.value() or row.get("tokens_per_sec")
        return {"smoothed": smoothed, "vs_plan": vs_plan(smoothed, self.planned_tokens_per_sec),
                "val_loss": self._val}

    def update(self, row: dict[str, Any]) -> None:
        if not self.enabled:
            return
        view = self.view(row)
        self._last = (row, view)
        if self._live is not None:
            self._live.update(_table(row, view, self.budget_usd))
            return
        now = time.monotonic()
        if now - self._last_plain >= PLAIN_EVERY_S or row.get("val_loss") is not None:
            self._last_plain = now
            self.log(self.plain(row, view))

    def plain(self, row: dict[str, Any], view: dict[str, Any] | None = None) -> str:
        view = view or {"smoothed": row.get("tokens_per_sec"), "vs_plan": None, "val_loss": None}
        val = row.get("val_loss", view.get("val_loss"))
        proj = row.get("projected_steps")
        ends = f" (ends at {proj:,})" if proj is not None and proj != row["total_steps"] else ""
        return (f"step {row['step']}/{row['total_steps']}{ends}  loss {row['loss']:.4f}"
                + (f"  val {val:.4f}" if val is not None else "")
                + f"  {_speed(view, ' tok/s')}  mfu {row['mfu'] * 100:.1f}%"
                + f"  ${row['usd_spent']:.2f}  {fmt_duration(row['elapsed_hours'] * 3600)} elapsed"
                + f"  stop in {fmt_duration(row.get('seconds_to_stop'))}")

    def summary(self, s: dict[str, Any]) -> None:
        for line in summary_lines(s):
            self.log(line)

    def log(self, msg: str) -> None:
        if not self.enabled:
            return
        try:
            if self._live is not None:
                self._live.console.print(msg, markup=False, highlight=False)
            elif self.live_mode:     # a terminal: wrap between words, never inside a path or a number
                self.console.print(msg, markup=False, highlight=False)
            else:                    # a pipe or a log file: whole lines, for grep
                print(msg, flush=True)
        except OSError:  # a closed stdout (broken pipe) must not stop training
            self.enabled = False
