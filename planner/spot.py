"""Spot (interruptible) GPUs: the price, the interruptions, the checkpoint cadence, and what a run costs.

The model (docs/spot.md):

- Interruptions arrive as a Poisson process in paid time, at a mean time between interruptions M
  (`--mtbi`, else the profile's figure), while the run trains, writes a checkpoint or restarts. Each one
  loses the work since the last complete checkpoint (a write in progress is lost too) and costs a
  restart R: start-up, rendezvous, checkpoint load and compile warm-up, from the plan's own figures
  (its checkpoint bytes, step time, nodes and compile flag) and the constants below.
- The runner checkpoints every tau of its budget clock; one write takes C = checkpoint bytes / storage
  bandwidth. A launch's start-up counts towards its first interval (runner/train.py starts the interval
  at the launch's carried time).
- Young (1974) and Daly (2006), first order: the tau that minimises the expected total time is
  sqrt(2·C·M).
- A seeded Monte-Carlo of the interruptions gives the rest: the steps that finish within the budget's
  cap in `quantile` of the runs (the plan's step count, so the LR schedule ends at the projected
  finish), the expected and P90 paid hours and dollars, and the work lost per interruption.

The runner's budget guard stops a run at the cap whatever the interruptions (runner/clock.py, every
launch counted by runner/ledger.py); the plan only chooses the steps, the cadence and the price.
Pure Python (random.Random): the same seed gives the same plan on every machine.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

# What a (re)launch costs besides the checkpoint load: planner/startup.py holds the figures, which every plan's
# hours count too (one source for on-demand and spot plans).
from planner.startup import COMPILE_S, COMPILE_SOURCE, RENDEZVOUS_S, START_UP_S, START_UP_SOURCE  # noqa: F401

WARM_STEPS = 2           # runner/schedule.SKIP_INTERVALS: a launch's first steps run cold; counted as lost
READ_FACTOR = 1.0        # a relaunch reads the checkpoint at the storage bandwidth it was written at
FINAL_RESERVE = 1.5      # runner/clock.CKPT_SAFETY: the guard keeps 1.5 checkpoint writes and two steps at the end
# The Monte-Carlo's time grows with the interruptions it simulates (a 100 h run at an MTBI of 0.1 h took 20 s on
# a loaded 2-core box; --mtbi 1e-9 never ended: issue 30 #4). Trials scale down so that it simulates about
# MC_INTERRUPTIONS in all (a run interrupted that often varies little from trial to trial), never below
# MIN_TRIALS; a run expected to be interrupted more than MAX_INTERRUPTIONS times is refused.
MC_INTERRUPTIONS = 200_000
MIN_TRIALS = 50
MAX_INTERRUPTIONS = 5_000


@dataclass(frozen=True)
class Costs:
    """Seconds of paid time. `first_s` is the first launch's start-up (R less the checkpoint load)."""

    step_s: float
    write_s: float          # C
    restart_s: float        # R
    first_s: float
    mtbi_s: float           # M

    def reserve_s(self) -> float:
        """What the budget guard keeps back at the end: the final checkpoint (x1.5) and two steps."""
        return FINAL_RESERVE * self.write_s + 2.0 * self.step_s


def restart_parts(*, kind: str, nodes: int, compile: bool, step_s: float, checkpoint_bytes: int,
                  storage_bytes_per_s: float) -> dict[str, float]:
    """A relaunch's cost, part by part (seconds)."""
    k = "gpu" if kind == "gpu" else "cpu"
    return {
        "start_up": START_UP_S[k],
        "rendezvous": RENDEZVOUS_S if nodes > 1 else 0.0,
        "checkpoint_load": READ_FACTOR * checkpoint_bytes / storage_bytes_per_s,
        "compile_warmup": (COMPILE_S[k] if compile else 0.0) + WARM_STEPS * step_s,
    }


def young_daly_s(write_s: float, mtbi_s: float) -> float:
    """First-order optimum checkpoint interval, sqrt(2·C·M) (Young 1974; Daly 2006)."""
    return math.sqrt(2.0 * write_s * mtbi_s)


def interval_s(costs: Costs) -> float:
    """The cadence a spot plan uses: Young/Daly, never shorter than a step or a write."""
    return max(young_daly_s(costs.write_s, costs.mtbi_s), costs.step_s, costs.write_s)


def expected_paid_s(work_s: float, tau_s: float, c: Costs) -> float:
    """Daly (2006): the expected paid time of `work_s` seconds of training checkpointed every tau_s,
    M·e^(R/M)·(e^((tau+C)/M) - 1)·W/tau (inf when it overflows: the run would never finish)."""
    m = c.mtbi_s
    x = (tau_s + c.write_s) / m + c.restart_s / m
    if x > 700:
        return math.inf
    return m * math.exp(c.restart_s / m) * math.expm1((tau_s + c.write_s) / m) * work_s / tau_s


def mc_trials(requested: int, interruptions: float) -> int:
    """Trials of the Monte-Carlo: `requested`, fewer when each run is interrupted so often that they would
    simulate more than MC_INTERRUPTIONS in all (never fewer than MIN_TRIALS)."""
    if interruptions * requested <= MC_INTERRUPTIONS:
        return requested
    return max(MIN_TRIALS, min(requested, math.floor(MC_INTERRUPTIONS / max(interruptions, 1.0))))


@dataclass(frozen=True)
class Trial:
    paid_s: float        # paid seconds until the run ended (finished, or stopped at the cap)
    done_s: float        # training seconds of work kept (in a checkpoint) at the end
    finished: bool
    interruptions: int
    lost_s: float        # training seconds lost to interruptions


def trial(rng: random.Random, work_s: float, tau_s: float, c: Costs, stop_s: float = math.inf) -> Trial:
    """One run: train `work_s` seconds of steps (math.inf: as far as the cap allows), checkpointing every
    `tau_s`, interrupted as a Poisson process. `stop_s` is when the budget guard stops the run (the cap
    less its reserve); the final checkpoint is then written within the reserve."""
    t, saved, n, lost = 0.0, 0.0, 0, 0.0
    fail = rng.expovariate(1.0 / c.mtbi_s)
    start = c.first_s                     # the launch in progress: its start-up, then the first interval
    while True:
        # ---- the launch's start-up (interrupted: another launch)
        while True:
            if t + start > stop_s:        # no time left for a step after the start-up
                return Trial(min(t + start, stop_s + c.write_s), saved, False, n, lost)
            if fail < t + start:
                n, t = n + 1, fail
                fail = t + rng.expovariate(1.0 / c.mtbi_s)
                start = c.restart_s
                continue
            t += start
            first = max(c.step_s, tau_s - start)     # the start-up counts towards the first interval
            break
        # ---- train and checkpoint, whole intervals at a time while nothing happens
        seg = first
        while True:
            seg = min(seg, work_s - saved)
            end_train, horizon = t + seg, min(fail, stop_s)
            if end_train + c.write_s <= horizon and seg == tau_s and work_s - saved > tau_s:
                k = min(math.floor((horizon - t) / (tau_s + c.write_s)),
                        math.ceil((work_s - saved) / tau_s) - 1 if math.isfinite(work_s) else 1 << 60)
                k = max(1, k)                                   # one whole interval fits (rounding aside)
                t, saved = t + k * (tau_s + c.write_s), saved + k * tau_s
                continue
            if stop_s <= min(end_train, fail):                  # the cap: stop, write the final checkpoint
                done = saved + max(0.0, stop_s - t)
                end = max(t, stop_s) + c.write_s
                if fail < end:                                  # interrupted in the final write
                    return Trial(end, saved, False, n + 1, lost + done - saved)
                return Trial(end, done, done >= work_s, n, lost)
            if fail < end_train + c.write_s:                    # interrupted: the interval's work is lost
                n, lost = n + 1, lost + min(fail, end_train) - t
                t = fail
                fail = t + rng.expovariate(1.0 / c.mtbi_s)
                start = c.restart_s
                break
            t, saved = end_train + c.write_s, saved + seg
            if saved >= work_s or t > stop_s:                   # done, or this write was the final one
                return Trial(t, saved, saved >= work_s, n, lost)
            seg = tau_s


def quantile(xs: list[float], q: float) -> float:
    """Nearest-rank quantile (q in (0, 1])."""
    s = sorted(xs)
    return s[max(0, min(len(s) - 1, math.ceil(q * len(s)) - 1))]


def simulate(work_s: float, tau_s: float, c: Costs, *, trials: int, seed: int,
             cap_s: float | None = None) -> list[Trial]:
    """`trials` seeded runs (common random numbers: the same seed replays the same interruptions)."""
    stop = math.inf if cap_s is None else cap_s - c.reserve_s()
    rng = random.Random(seed)
    return [trial(random.Random(rng.getrandbits(64)), work_s, tau_s, c, stop) for _ in range(trials)]


def work_within(cap_s: float, tau_s: float, c: Costs, *, quantile_: float, trials: int, seed: int) -> float:
    """Training seconds that finish within the cap in `quantile_` of the runs."""
    done = [r.done_s for r in simulate(math.inf, tau_s, c, trials=trials, seed=seed, cap_s=cap_s)]
    return quantile(done, 1.0 - quantile_)


@dataclass(frozen=True)
class Outcome:
    expected_s: float
    p_s: float                  # at the plan's quantile (P90 by default)
    finish_probability: float
    interruptions: float        # mean per run
    lost_per_interruption_s: float


def outcome(work_s: float, tau_s: float, c: Costs, *, quantile_: float, trials: int, seed: int,
            cap_s: float | None = None) -> Outcome:
    runs = simulate(work_s, tau_s, c, trials=trials, seed=seed, cap_s=cap_s)
    paid = [r.paid_s for r in runs]
    n = sum(r.interruptions for r in runs)
    return Outcome(expected_s=sum(paid) / len(paid), p_s=quantile(paid, quantile_),
                   finish_probability=sum(r.finished for r in runs) / len(runs),
                   interruptions=n / len(runs), lost_per_interruption_s=sum(r.lost_s for r in runs) / max(1, n))
