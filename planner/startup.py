"""What a launch pays before its steps train: start-up, rendezvous and compile warm-up (pure Python).

A plan's hours are the paid hours of its launch as the runner's budget clock counts them (runner/clock.py
starts that clock when `nanoplan run` starts): start-up (imports, preflight, torchrun, CUDA/NCCL), the
rendezvous of a multi-node launch and torch.compile's warm-up, then the steps. The spot model's restarts
(planner/spot.py) use the same constants, START_UP_S, RENDEZVOUS_S and COMPILE_S below, so an on-demand plan
and a spot plan count a launch alike. (A spot relaunch also counts its first WARM_STEPS steps as lost; a first launch's cold steps
still train, and their extra time is the compile warm-up.) planner/spot.py imports them from here, so
`estimate` does not load the spot model to plan an on-demand run.

- a budget or --hours plan: the hours are the budget's; its steps are those that fit after the start-up;
- a --steps or epoch-limited plan: the hours are the start-up plus its steps.

On a GPU that is 60 s + 120 s (assumptions, sources below); a 3-minute 8×H100 plan spends half of it there.
"""

from __future__ import annotations

import math

# What a launch costs before its first step (seconds). The budget clock counts all of it: it starts when
# `nanoplan run` starts (runner/clock.py). The machine's own boot and set-up before that are billed by the
# provider but not seen by the runner (docs/spot.md). planner/spot.py's relaunches use the same figures.
START_UP_S = {"gpu": 60.0, "cpu": 5.0}
START_UP_SOURCE = {
    "gpu": "assumption: Python and torch imports, the preflight, torchrun and CUDA/NCCL start on a GPU node "
           "(not measured: no GPU has been lent to this project)",
    "cpu": "measured: nanoplan run of a 1xCPU tiny plan to its first step, 4.2 s on a 2-core machine "
           "(9.5 s under load; docs/sources.md §10)",
}
RENDEZVOUS_S = 30.0      # assumption: a multi-node launch waits for its slowest node in the c10d rendezvous
COMPILE_S = {"gpu": 120.0, "cpu": 20.0}
COMPILE_SOURCE = {
    "gpu": "assumption: torch.compile of the training step again on every launch (no cache carried over)",
    "cpu": "measured: the first compiled step of the tiny model on CPU, about 20 s idle, 41 s under load "
           "(docs/sources.md §10)",
}


def fixed_seconds(kind: str, nodes: int, compile: bool, measured: float | None = None) -> float:
    """Seconds a launch pays before its first step trains: start-up, a multi-node rendezvous, compile warm-up;
    `measured` (estimate --startup-seconds: what a launch on this machine took) replaces the assumptions."""
    if measured is not None:
        return measured
    k = "gpu" if kind == "gpu" else "cpu"
    return START_UP_S[k] + (RENDEZVOUS_S if nodes > 1 else 0.0) + (COMPILE_S[k] if compile else 0.0)


def steps_within(seconds: float, step_s: float, fixed_s: float) -> int:
    """Whole steps that train within `seconds` of paid time after the launch's start-up (may be < 1)."""
    return math.floor((seconds - fixed_s) / step_s)


def paid_seconds(steps: int, step_s: float, fixed_s: float) -> float:
    """Paid seconds of a launch that trains `steps` steps."""
    return fixed_s + steps * step_s
