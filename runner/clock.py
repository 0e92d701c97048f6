"""The run's budget clock and the deadline guard that stops a run before its budget ends.

The clock is injectable so that tests can simulate long runs quickly:

- ``NANOPLAN_TIME_SCALE=60`` makes every real second count as 60 budget seconds (elapsed
  hours, dollars, checkpoint cadence and the deadline all use the budget clock; tokens/s
  and MFU use real time).
- ``NANOPLAN_CKPT_DELAY_S=2`` sleeps 2 real seconds inside every checkpoint write (after
  the data files, before meta.json), to simulate a slow disk.

The clock starts when the launch started, not when this worker did: `nanoplan run` passes its
own process start (NANOPLAN_LAUNCH_T0, seconds on CLOCK_BOOTTIME), else the torchrun agent's
process start is used. So a launch's start-up (imports, preflight, torchrun, rendezvous) is
counted (1:1, also under NANOPLAN_TIME_SCALE), and a worker restarted by torchrun after a crash
carries everything since the launch began (the crashed attempt, the crash and the restart; × the
scale). Durations only ever come from
monotonic clocks (CLOCK_MONOTONIC, CLOCK_BOOTTIME): stepping the wall clock (an NTP jump)
changes nothing that is charged. The wall-clock start is kept for information only.

No torch here: the guard is plain arithmetic and is unit-tested on its own.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

ENV_TIME_SCALE = "NANOPLAN_TIME_SCALE"
ENV_CKPT_DELAY = "NANOPLAN_CKPT_DELAY_S"
ENV_LAUNCH_ID = "NANOPLAN_LAUNCH_ID"    # set by `nanoplan run`: one id per launch, the same across torchrun restarts
ENV_LAUNCH_T0 = "NANOPLAN_LAUNCH_T0"    # set by `nanoplan run`: its process start, CLOCK_BOOTTIME seconds
ENV_LAUNCH_PID = "NANOPLAN_LAUNCH_PID"  # set by `nanoplan run`: its PID (is the launcher still alive?)

CKPT_SAFETY = 1.5          # reserve 1.5x the slowest measured checkpoint write (+ eval)
CKPT_FALLBACK_BYTES_S = 50e6  # before any write is measured: assume 50 MB/s ...
CKPT_FALLBACK_MIN_S = 2.0     # ... and at least 2 s
STEP_WINDOW = 3               # the guard's step estimate: the median of the last 3 steps (2 of 3 must be slow)


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name, "")
    if not raw:
        return default
    try:
        v = float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number") from None
    if not math.isfinite(v) or v < 0:
        raise ValueError(f"{name}={raw!r} must be a finite number >= 0")
    return v


def boottime() -> float:
    """Seconds since boot on a clock that never steps (CLOCK_BOOTTIME; CLOCK_MONOTONIC elsewhere)."""
    clk = getattr(time, "CLOCK_BOOTTIME", None)
    return time.clock_gettime(clk) if clk is not None else time.monotonic()


def process_start_boottime(pid: int | str = "self") -> float | None:
    """When process `pid` started, in boottime() seconds (Linux /proc), else None."""
    try:
        stat = open(f"/proc/{pid}/stat", encoding="ascii", errors="replace").read()  # noqa: SIM115
        ticks = int(stat.rsplit(")", 1)[1].split()[19])       # field 22: starttime, clock ticks since boot
        return ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def launch_age_s(env: dict[str, str] | None = None) -> float:
    """Real seconds since this launch began: since `nanoplan run` started (NANOPLAN_LAUNCH_T0), else
    since the torchrun agent that started this worker did, else 0 (a plain process)."""
    env = dict(os.environ) if env is None else env
    t0: float | None = None
    raw = env.get(ENV_LAUNCH_T0, "")
    if raw:
        try:
            t0 = float(raw)
        except ValueError:
            t0 = None
    if t0 is None and env.get("TORCHELASTIC_RUN_ID"):
        t0 = process_start_boottime(os.getppid())
    if t0 is None or not math.isfinite(t0):
        return 0.0
    return max(0.0, boottime() - t0)


class Clock:
    """Real and budget seconds since the launch started, on a monotonic clock.

    `age_s` is how long ago the launch began when this clock was made (launch_age_s()). It is
    counted 1:1; only what the clock measures itself is multiplied by `scale` (a test hook:
    without it, the start-up of a 2-process CPU run, times a large scale, would eat a test's
    whole budget). With scale 1, budget == real.
    """

    def __init__(self, scale: float = 1.0, time_fn: Callable[[], float] = time.monotonic,
                 ckpt_delay_s: float = 0.0, wall_fn: Callable[[], float] = time.time, age_s: float = 0.0,
                 launch_age_s: float | None = None) -> None:
        if scale <= 0:
            raise ValueError(f"time scale must be > 0, got {scale}")
        self.scale = scale
        self.ckpt_delay_s = ckpt_delay_s
        self._time = time_fn
        self._start = time_fn()
        self._age = max(0.0, age_s)
        self.launch_age = self._age if launch_age_s is None else launch_age_s   # the launch's age at _start
        self.start_unix = wall_fn() - self._age   # for information (run_info.json); never for durations

    @classmethod
    def from_env(cls) -> Clock:
        """The worker's clock. A first attempt counts from the launch's start; a torchrun restart
        counts from now, and carries the launch's age instead (runner.train, × scale)."""
        age = launch_age_s()
        try:
            restarted = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0) > 0
        except ValueError:
            restarted = False
        return cls(scale=_env_float(ENV_TIME_SCALE, 1.0) or 1.0, ckpt_delay_s=_env_float(ENV_CKPT_DELAY, 0.0),
                   age_s=0.0 if restarted else age, launch_age_s=age)

    def start_earlier(self, age_s: float) -> None:
        """Count from `age_s` real seconds ago if that is earlier than the start (never later).

        Multi-node: every rank reports its launch's age and the oldest wins, so the time the
        first node waited in the rendezvous for the others is counted."""
        self._age = max(self._age, age_s - (self._time() - self._start))

    @property
    def age(self) -> float:
        """Real seconds before this clock was made that it counts (1:1): the launch's start-up."""
        return self._age

    def real(self) -> float:
        """Real seconds since start (for tokens/s and MFU)."""
        return self._age + self._time() - self._start

    def budget(self) -> float:
        """Budget seconds since start (for elapsed hours, dollars, cadence, deadline)."""
        return self._age + (self._time() - self._start) * self.scale

    def simulate_slow_write(self) -> None:
        if self.ckpt_delay_s > 0:
            time.sleep(self.ckpt_delay_s)


@dataclass
class BudgetGuard:
    """Decides, after each step, whether one more step still leaves time for the final checkpoint.

    All times are budget seconds of the whole run (carried over resumes). ``deadline_s`` is
    None when only total_steps bounds the run.
    """

    deadline_s: float | None
    carried_s: float = 0.0
    ckpt_bytes: int = 0
    safety: float = CKPT_SAFETY
    step_s: float = 0.0                 # the next step's estimate: the median of the last STEP_WINDOW steps
    ckpt_s: float | None = None          # slowest measured checkpoint write
    eval_s: float = 0.0                  # slowest measured validation pass
    history: list[float] = field(default_factory=list)

    def observe_step(self, seconds: float) -> None:
        """The next step's estimate: the median of the last STEP_WINDOW (3) steps, the slower of two.

        One step that took far longer than the others (the run was stopped: SIGSTOP, a paused VM,
        a stalled disk) is an outlier, not a forecast: with the slowest recent step as the estimate,
        one 60 s stall made the guard keep 2 × 60 s back and stop a third of the budget early. A
        machine that really got slower shows it in two steps of three, and the estimate follows.
        """
        self.history.append(seconds)
        del self.history[:-100]
        recent = sorted(self.history[-STEP_WINDOW:])
        self.step_s = recent[len(recent) // 2] if len(recent) % 2 else recent[-1]

    def observe_checkpoint(self, seconds: float) -> None:
        self.ckpt_s = max(self.ckpt_s or 0.0, seconds)

    def observe_eval(self, seconds: float) -> None:
        self.eval_s = max(self.eval_s, seconds)

    def checkpoint_estimate(self) -> float:
        if self.ckpt_s is not None:
            return self.ckpt_s
        return max(CKPT_FALLBACK_MIN_S, self.ckpt_bytes / CKPT_FALLBACK_BYTES_S)

    def reserve_s(self) -> float:
        """Budget seconds kept back for the final validation pass and checkpoint."""
        return self.safety * (self.checkpoint_estimate() + self.eval_s)

    def total(self, run_s: float) -> float:
        return self.carried_s + run_s

    def due_s(self, checkpoint_due: bool = False, eval_due: bool = False) -> float:
        """Budget seconds of the work due before the next step: a periodic checkpoint (with its
        validation pass) or a scheduled validation pass, each with the safety factor."""
        if checkpoint_due:
            return self.reserve_s()
        return self.safety * self.eval_s if eval_due else 0.0

    def should_stop(self, run_s: float, *, checkpoint_due: bool = False, eval_due: bool = False) -> bool:
        """True when the work due now, one more step (plus one step of margin) and the reserve for
        the final checkpoint would pass the deadline.

        A periodic checkpoint or validation pass due at this step is counted too: without it a
        run that passes the test here would write that checkpoint, take one more step, and then
        have its final checkpoint run past the deadline. When it would not fit, the run stops
        now and the checkpoint due becomes the final one.
        """
        if self.deadline_s is None:
            return False
        need = 2 * self.step_s + self.due_s(checkpoint_due, eval_due) + self.reserve_s()
        return self.total(run_s) + need > self.deadline_s

    def seconds_to_stop(self, run_s: float) -> float | None:
        """Budget seconds until the guard stops the run (None without a deadline)."""
        if self.deadline_s is None:
            return None
        return max(0.0, self.deadline_s - self.reserve_s() - self.step_s - self.total(run_s))


def deadline_seconds(hours: float | None, budget_usd: float | None, usd_per_hour: float) -> float | None:
    """The run's hard stop in seconds: the requested hours or dollars, whichever comes first.

    Pass the plan *request*'s hours and budget_usd: a plan whose length is set by --steps has
    neither (its hours are a prediction, so there is no deadline); one capped by --max-epochs
    keeps the user's hours or dollars as the hard limit.
    """
    limits = []
    if hours is not None:
        limits.append(hours * 3600.0)
    if budget_usd is not None and usd_per_hour > 0:
        limits.append(budget_usd / usd_per_hour * 3600.0)
    return min(limits) if limits else None


def launch_first_segment(segments: list[Any], job: str | None, restart_count: int) -> dict[str, Any] | None:
    """The first attempt's segment of this job (the earliest of the trailing segments of `job`), when
    this worker is a torchrun restart of it (the last segment is an earlier attempt); else None."""
    if restart_count <= 0 or not job or not segments or not isinstance(segments[-1], dict):
        return None
    try:
        if segments[-1].get("job") != job or int(segments[-1].get("restart_count", 0)) >= restart_count:
            return None
    except (TypeError, ValueError):
        return None
    first = segments[-1]
    for seg in reversed(segments):
        if not isinstance(seg, dict) or seg.get("job") != job:
            break
        first = seg
    return first


def restart_carried_s(segments: list[Any], job: str | None, restart_count: int) -> float | None:
    """Budget seconds the launch carried in, when this worker is a torchrun restart of it.

    That is the carried time of the job's first attempt recorded in run_info.json (the job is
    NANOPLAN_LAUNCH_ID, else TORCHELASTIC_RUN_ID); the restart adds the launch's age, measured on
    CLOCK_BOOTTIME from the launch's start (the crashed attempts, the crashes and the restarts).
    None for a first launch, a new job, or a segment without these fields. No wall clock is
    involved.
    """
    first = launch_first_segment(segments, job, restart_count)
    if first is None:
        return None
    try:
        carried = float(first["carried_hours"]) * 3600.0
    except (KeyError, TypeError, ValueError):
        return None
    if not math.isfinite(carried) or carried < 0:
        return None
    return carried
