"""The LR schedule that ends when the money does.

The plan lays warm-up, flat and warmdown over its step count. When the machine is slower than
planned, the budget guard (runner/clock.py) stops the run before that count, and a schedule laid
over the planned steps would stop with the LR still at its peak. So, after the first steps of a
launch have been timed, rank 0 projects the step at which the guard will stop:

- the time left is the deadline minus what the guard keeps back (the final checkpoint and
  validation reserve, and its two-step margin) minus the run's budget seconds so far;
- it is spent on steps at the measured seconds per step (the median interval between steps over a
  recent window, so the odd checkpoint or validation step does not count), on the periodic
  checkpoints that fall due at the plan's cadence and on the scheduled validation passes, at their
  measured costs;
- the projection is the last step that fits, never above the plan's step count (a faster machine
  stops at the plan's count; a step-limited plan without a deadline keeps it).

All ranks apply rank 0's projection at the same step (it travels in the runner's per-step
all-reduce), so the LR stays identical across replicas. The warmdown is then laid over the
projected count. A projection that lands after the warmdown has begun (or that moves the warmdown
start behind the current step) re-anchors it: from the current step the multiplier goes from its
current value to 0 at the new end, so the LR never jumps. Re-projections follow after every 1% of
the projected steps, after each checkpoint or validation pass (their costs are then measured), and
right after a stall: a step interval STALL_FACTOR times the median (the run was stopped, SIGSTOP or
a paused machine, and the time left shrank at once), so the warmdown still ends at the stop.

The schedule's state is saved in every checkpoint's meta.json and restored on resume, so a
killed-and-resumed run continues from the saved projection and its warmdown happens once. The state
keeps the measured seconds per step too: a resumed launch re-projects at its second step with them
(its start-up took time the saved projection did not know of), and again once it has timed its own.

Deterministic given the measured times: `project_final_step` is a pure function, unit-tested.
Plain Python, no torch.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass
from typing import Any, Literal

Decay = Literal["linear", "cosine"]

SKIP_INTERVALS = 2          # the first intervals of a launch include torch.compile and cold caches
MIN_INTERVALS = 8           # intervals needed before the first projection of a launch
WINDOW = 50                 # median over the last WINDOW step intervals
REPROJECT_FRACTION = 0.01   # re-project after every 1% of the projected steps
STALL_FACTOR = 4.0          # an interval this many times the median is a stall: re-project at once
ANNOUNCE_CHANGE = 0.10      # log a projection that moved by 10% or more, at most once per 10% of the steps


def decay_shape(progress: float, decay: Decay) -> float:
    """1 → 0 as progress goes 0 → 1 (linear or cosine)."""
    p = min(1.0, max(0.0, progress))
    if decay == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * p))
    return 1.0 - p


def lr_multiplier(step: int, total: int, warmup: int, warmdown_frac: float, decay: Decay) -> float:
    """LR factor for optimizer step `step` (0-based): linear warmup, flat, then a warmdown to 0."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    n_down = round(warmdown_frac * total)
    start = total - n_down
    if n_down <= 0 or step < start:
        return 1.0
    return decay_shape((step - start) / n_down, decay)


@dataclass(frozen=True)
class Timing:
    """What the projection needs, in budget seconds of the whole run (carried over resumes)."""

    now_s: float                 # the run's budget seconds at this step
    deadline_s: float | None     # None: only the step count bounds the run
    reserve_s: float             # kept back for the final checkpoint and validation (BudgetGuard.reserve_s)
    step_s: float                # measured seconds per step (median interval)
    margin_s: float = 0.0        # BudgetGuard.step_s: its stop test keeps two of these
    ckpt_every_s: float = 0.0    # periodic checkpoint cadence (0: none)
    since_ckpt_s: float = 0.0    # since the last checkpoint
    ckpt_cost_s: float = 0.0     # one periodic checkpoint, with its validation pass
    val_every: int = 0           # scheduled validation every N steps (0: none)
    eval_s: float = 0.0          # one validation pass


def overhead_s(step: int, n: int, t: Timing) -> float:
    """Budget seconds of the checkpoints and validation passes that fall due in the next n steps."""
    out = 0.0
    if t.val_every > 0 and n > 0:
        out += (((step + n - 1) // t.val_every) - ((step - 1) // t.val_every)) * t.eval_s
    if t.ckpt_every_s > 0 and t.ckpt_cost_s > 0:
        out += math.floor(max(0.0, t.since_ckpt_s + n * t.step_s + out) / t.ckpt_every_s) * t.ckpt_cost_s
    return out


def project_final_step(step: int, planned_total: int, t: Timing) -> int:
    """The step at which the budget guard will stop the run, at most `planned_total`.

    The guard stops after step k when t_k + 2·margin + reserve > deadline. With `avail` the time
    left after the reserve and the margin, the run still takes step+1 and then every further step
    j for which the j-1 steps before it (and their checkpoints and validations) fit in `avail`.
    """
    if t.deadline_s is None or t.step_s <= 0 or step >= planned_total:
        return planned_total
    avail = t.deadline_s - t.reserve_s - 2.0 * t.margin_s - t.now_s
    if avail < 0:
        return step

    def cost(n: int) -> float:
        return n * t.step_s + overhead_s(step, n, t)

    lo, hi = 0, max(0, min(planned_total - step, math.floor(avail / t.step_s)))
    while lo < hi:                       # the largest n in [0, hi] with cost(n) <= avail (cost rises with n)
        mid = (lo + hi + 1) // 2
        if cost(mid) <= avail:
            lo = mid
        else:
            hi = mid - 1
    return min(planned_total, step + lo + 1)


class DeadlineSchedule:
    """The LR multiplier over the projected final step; see the module docstring.

    `multiplier(step)` is what torch's LambdaLR calls (step = optimizer steps done). Every rank
    holds one; only rank 0 `propose`s a projection, and every rank `apply`s the same one at the
    same step.
    """

    def __init__(self, planned_total: int, warmup: int, warmdown_frac: float, decay: Decay, *,
                 total: int | None = None, anchor_step: int | None = None, anchor_mult: float | None = None,
                 projected_at: int | None = None, step_s: float | None = None) -> None:
        self.planned_total = planned_total
        self.warmup = warmup
        self.warmdown_frac = warmdown_frac
        self.decay = decay
        self.total = planned_total if total is None else total
        self.anchor_step = anchor_step
        self.anchor_mult = anchor_mult
        self.projected_at = projected_at          # step of the last projection (any launch)
        self._launch_projected = False            # a projection was made in this launch
        self._measured = False                    # ... with this launch's own step times
        self.step_s = step_s                      # seconds per step last measured (saved; a resume starts with it)
        self._times: deque[tuple[int, float]] = deque(maxlen=WINDOW + 1)
        self._seen = 0
        self._last: tuple[int, float] | None = None
        self._last_gap: float | None = None      # budget seconds per step over the last interval
        self._inputs: tuple[float, ...] | None = None
        self._announced = planned_total if total is None else total
        self._announced_at: int | None = None

    def announcement(self, step: int) -> str | None:
        """A line for the log when the projection moved by ANNOUNCE_CHANGE or more since the last one logged,
        at most once per ANNOUNCE_CHANGE of the run's steps (the live view shows every change); else None."""
        if abs(self.total - self._announced) < max(1.0, ANNOUNCE_CHANGE * self._announced):
            return None
        if self._announced_at is not None and step - self._announced_at < ANNOUNCE_CHANGE * self.total:
            return None
        self._announced, self._announced_at = self.total, step
        if self.total >= self.planned_total:
            return f"schedule: the plan's {self.planned_total:,} steps fit before the deadline again"
        return (f"schedule: the deadline allows {self.total:,} of the planned {self.planned_total:,} steps; "
                "the warmdown now ends there")

    # ------------------------------------------------------------------ the multiplier

    def multiplier(self, step: int) -> float:
        if self.anchor_step is not None and self.anchor_mult is not None and step >= self.anchor_step:
            n = self.total - self.anchor_step
            if n <= 0:
                return 0.0
            return self.anchor_mult * decay_shape((step - self.anchor_step) / n, self.decay)
        return lr_multiplier(step, self.total, self.warmup, self.warmdown_frac, self.decay)

    def apply(self, step: int, total: int) -> bool:
        """Lay the schedule over `total` from `step` on (all ranks, same arguments). True if it changed."""
        total = max(1, min(int(total), self.planned_total))
        if total == self.total:
            return False
        current = self.multiplier(step)
        n_down = round(self.warmdown_frac * total)
        flat_still = self.anchor_step is None and current >= 1.0 and step >= self.warmup and step <= total - n_down
        if self.warmdown_frac > 0 and not flat_still and step >= self.warmup:
            self.anchor_step, self.anchor_mult = step, current
        elif self.anchor_step is None or step < self.warmup:
            self.anchor_step = self.anchor_mult = None
        self.total = total
        self.projected_at = step
        return True

    # ------------------------------------------------------------------ rank 0: measure and project

    def observe(self, step: int, now_s: float) -> None:
        """Rank 0, after each step: the run's budget seconds at that step."""
        self._seen += 1
        if self._last is not None and step > self._last[0]:
            self._last_gap = (now_s - self._last[1]) / (step - self._last[0])
        self._last = (step, now_s)
        if self._seen > SKIP_INTERVALS:
            self._times.append((step, now_s))

    def step_seconds(self) -> float | None:
        """Median budget seconds between consecutive steps over the window (None before MIN_INTERVALS)."""
        pts = list(self._times)
        gaps = [(b - a) / (sb - sa) for (sa, a), (sb, b) in zip(pts, pts[1:], strict=False) if sb > sa]
        return statistics.median(gaps) if len(gaps) >= MIN_INTERVALS else None

    def propose(self, step: int, now_s: float, guard: Any, *, ckpt_every_s: float, last_ckpt_s: float,
                val_every: int) -> int:
        """Rank 0: the total to use from this step (the current one unless a re-projection is due).

        `guard` is the run's BudgetGuard (deadline, reserve, margin and measured costs).
        """
        if guard.deadline_s is None:
            return self.total
        self.observe(step, now_s)
        dt = self.step_seconds()
        measured = dt is not None
        if dt is None and self.step_s is not None and not self._launch_projected and self._seen >= 2:
            dt = self.step_s         # a resumed launch, past its start-up: the saved step time, until it has its own
        if dt is None or step >= self.total:
            return self.total
        if measured:
            self.step_s = dt
        inputs = (guard.reserve_s(), guard.ckpt_s or 0.0, guard.eval_s)
        every = max(1, round(REPROJECT_FRACTION * self.total))
        stalled = self._last_gap is not None and self._last_gap > STALL_FACTOR * dt
        due = (not self._launch_projected or (measured and not self._measured) or inputs != self._inputs or stalled
               or self.projected_at is None or step - self.projected_at >= every)
        if not due:
            return self.total
        self._launch_projected, self._measured, self._inputs = True, self._measured or measured, inputs
        self.projected_at = step
        t = Timing(now_s=now_s, deadline_s=guard.deadline_s, reserve_s=guard.reserve_s(), step_s=dt,
                   margin_s=guard.step_s, ckpt_every_s=ckpt_every_s, since_ckpt_s=max(0.0, now_s - last_ckpt_s),
                   ckpt_cost_s=(guard.ckpt_s or guard.checkpoint_estimate()) + guard.eval_s,
                   val_every=val_every, eval_s=guard.eval_s)
        return project_final_step(step, self.planned_total, t)

    # ------------------------------------------------------------------ checkpoint meta

    def state(self) -> dict[str, Any]:
        return {"planned_total": self.planned_total, "total": self.total, "anchor_step": self.anchor_step,
                "anchor_mult": self.anchor_mult, "projected_at": self.projected_at, "step_s": self.step_s}

    @classmethod
    def resume(cls, state: Any, planned_total: int, warmup: int, warmdown_frac: float,
               decay: Decay) -> DeadlineSchedule:
        """The schedule saved in a checkpoint's meta.json, or a fresh one (no state, or another plan's)."""
        fresh = cls(planned_total, warmup, warmdown_frac, decay)
        if not isinstance(state, dict) or state.get("planned_total") != planned_total:
            return fresh
        try:
            total = int(state["total"])
            a_step = None if state.get("anchor_step") is None else int(state["anchor_step"])
            a_mult = None if state.get("anchor_mult") is None else float(state["anchor_mult"])
            at = None if state.get("projected_at") is None else int(state["projected_at"])
            step_s = None if state.get("step_s") is None else float(state["step_s"])
        except (KeyError, TypeError, ValueError):
            return fresh
        if not 1 <= total <= planned_total or (a_mult is not None and not 0.0 <= a_mult <= 1.0):
            return fresh
        if step_s is not None and not (math.isfinite(step_s) and step_s > 0):
            step_s = None
        return cls(planned_total, warmup, warmdown_frac, decay, total=total, anchor_step=a_step,
                   anchor_mult=a_mult, projected_at=at, step_s=step_s)
