"""The budget arithmetic of a supervised trainer (plain numbers, no processes): how often it saves, the step
count it is launched with, and when it must be stopped. Written once for every trainer.

Another trainer cannot be asked to save at a moment of nanoplan's choosing: it saves every K steps and at
the step count it was launched with (E), and no signal makes it save (runner/trainers/*.py). So:

- K = round(cadence / step time): the plan's hourly cadence (schedule.checkpoint_every_minutes) in the
  steps of the latest measured step time (the plan's own on a first launch).
- E is chosen at each launch so that the save at E lands before the deadline:
      carried + start-up + (E - S - 1) x step + (periodic saves before E) x 1.5 x save + 1.5 x save + exit <= deadline
  where S is the step it resumes from; the start-up counts the launch's first step. The trainer's
  learning-rate schedule ends at E, so its warmdown ends at the deadline.
- while it runs, the supervisor stops it (and no later) when the next save could not land before the
  deadline any more: a save in progress is waited for; between saves the steps since the last one are
  lost (at most K). A hard stop at the deadline less the time to kill catches anything slower.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from runner.clock import CKPT_FALLBACK_BYTES_S, CKPT_FALLBACK_MIN_S, CKPT_SAFETY, STEP_WINDOW

KILL_S = 1.0        # SIGKILL of the trainer's process tree until it is gone (0.1-0.3 s measured on the 2-core CI box)
EXIT_S = {"gpu": 5.0, "cpu": 1.0}   # a trainer's exit after its last save, until one is measured (assumption:
                                    # process-group teardown, torchrun's exit)


@dataclass
class Guard:
    """Budget seconds of the whole run (carried over launches); `deadline_s` None: only the step count binds."""

    deadline_s: float | None
    carried_s: float
    step_s: float                       # the next step's estimate (the median of the last 3 measured)
    save_s: float                       # the slowest save measured (or the fallback)
    startup_s: float                    # the trainer's own start-up: from its spawn to its first step line
    exit_s: float = 1.0
    save_measured: bool = False         # save_s is a measurement (not the fallback)
    mean_s: float = 0.0                 # seconds a step over the launch so far, pauses (evaluations) in, saves out
    history: list[float] = field(default_factory=list)

    @staticmethod
    def save_fallback(checkpoint_bytes: int, bytes_per_s: float = CKPT_FALLBACK_BYTES_S) -> float:
        """A save's time before one is measured: the checkpoint at `bytes_per_s` (the profile's storage
        figure, planner/profiles.py), and at least the runner's 2 s (runner/clock.py)."""
        return max(CKPT_FALLBACK_MIN_S, checkpoint_bytes / bytes_per_s)

    def observe_step(self, seconds: float) -> None:
        """The median of the last 3 step times (the slower of 2): one stalled step is no forecast."""
        if not (seconds > 0 and math.isfinite(seconds)):
            return
        self.history.append(seconds)
        del self.history[:-100]
        recent = sorted(self.history[-STEP_WINDOW:])
        self.step_s = recent[len(recent) // 2] if len(recent) % 2 else recent[-1]

    def observe_save(self, seconds: float) -> None:
        """The slowest save measured (the first measurement replaces the fallback)."""
        if seconds > 0 and math.isfinite(seconds):
            self.save_s = max(self.save_s, seconds) if self.save_measured else seconds
            self.save_measured = True

    @property
    def per_step(self) -> float:
        """Seconds a step over many: the launch's mean when slower than the next step's estimate (a trainer's
        evaluation passes, nanochat's every 250 steps, come between its steps)."""
        return max(self.step_s, self.mean_s)

    # ---------------------------------------------------------------- at a launch
    def save_every(self, cadence_s: float) -> int:
        """The save cadence in steps, at the current step time."""
        return max(1, round(cadence_s / self.per_step))

    def _cost(self, start: int, end: int, every: int) -> float:
        """Seconds after the first step to reach step `end` and save there, from a resume at `start`."""
        periodic = max(0, (end - 1) // every - start // every)
        return (end - start - 1) * self.per_step + periodic * CKPT_SAFETY * self.save_s

    def end_step(self, age_s: float, start: int, total: int, every: int, *, startup: bool = True) -> int:
        """The step count to launch with, `age_s` seconds into the launch: the last step whose save (and the
        trainer's exit) lands before the deadline, at most `total`; `start` (or less) when none does.
        `startup`: a new process still has its start-up (and first step) ahead; else `start` was just reached."""
        if self.deadline_s is None:
            return total
        first = self.startup_s if startup else self.step_s
        left = self.deadline_s - self.carried_s - age_s - first - CKPT_SAFETY * self.save_s - self.exit_s
        if left < 0 or start >= total:
            return min(start, total)
        lo, hi = start + 1, total
        if self._cost(start, lo, every) > left:
            return start
        while lo < hi:                      # the cost grows with the end step: the last that fits
            mid = (lo + hi + 1) // 2
            if self._cost(start, mid, every) <= left:
                lo = mid
            else:
                hi = mid - 1
        return lo

    # ---------------------------------------------------------------- while it runs
    def must_stop(self, age_s: float, *, done: int, saved: int, every: int, end: int,
                  starting_s: float | None = None) -> bool:
        """Whether to stop the trainer now, `age_s` seconds into the launch: `done` steps done, `saved` the
        newest complete checkpoint; `starting_s`: seconds since it was spawned, while no step line came yet."""
        if self.deadline_s is None:
            return False
        now = self.carried_s + age_s
        if now + KILL_S >= self.deadline_s:
            return True                                   # the hard stop
        if done >= end or (done // every) * every > saved:
            return False      # a save not yet seen complete (or the last one, then its exit): wait (or the hard stop)
        nxt = min(end, (done // every + 1) * every)
        eta = now + (nxt - done) * self.per_step + CKPT_SAFETY * self.save_s + (self.exit_s if nxt == end else KILL_S)
        if starting_s is not None:
            eta += max(0.0, self.startup_s - starting_s) - self.step_s
        return eta > self.deadline_s

    def relaunch(self, age_s: float, *, saved: int, end: int, every: int, total: int,
                 cadence_s: float) -> tuple[int, int] | None:
        """Right after a save at `saved` in a launch whose step count and cadence came from guesses: the
        (end step, cadence) of a relaunch from it when one is worth its start-up, else None. It is when the
        launch's own end no longer fits (it would be stopped before its last save), or a relaunch ends more
        than 2% later, or the cadence is off by more than 2x."""
        new_every = self.save_every(cadence_s)
        new_end = self.end_step(age_s, saved, total, new_every)
        if new_end <= saved:
            return None
        stays = self.end_step(age_s, saved, total, every, startup=False) >= end
        later = new_end > end + max(1, end // 50)
        off = not every / 2 <= new_every <= every * 2
        return (new_end, new_every) if (not stays or later or off) else None

    def seconds_to_end(self, age_s: float, done: int, end: int, every: int) -> float | None:
        """Budget seconds until the trainer's last save, by the estimates (None without a deadline)."""
        if self.deadline_s is None:
            return None
        rest = self._cost(done - 1, end, every) + CKPT_SAFETY * self.save_s if end > done else 0.0
        return max(0.0, min(rest, self.deadline_s - self.carried_s - age_s))
