"""What a launch pays before its steps train: start-up, rendezvous and compile warm-up (pure Python).

A plan's hours are the paid hours of its launch as the runner's budget clock counts them (runner/clock.py
starts that clock when `nanoplan run` starts): start-up (imports, preflight, torchrun, CUDA/NCCL), the
rendezvous of a multi-node launch and torch.compile's warm-up, then the steps. These are the spot model's
constants (planner/spot.py: START_UP_S, RENDEZVOUS_S, COMPILE_S), so an on-demand plan and a spot plan count a
launch alike. (A spot relaunch also counts its first WARM_STEPS steps as lost; a first launch's cold steps
still train, and their extra time is the compile warm-up.)

- a budget or --hours plan: the hours are the budget's; its steps are those that fit after the start-up;
- a --steps or epoch-limited plan: the hours are the start-up plus its steps.

On a GPU that is 60 s + 120 s (assumptions, planner/spot.py); a 3-minute 8×H100 plan spends half of it there.
"""

from __future__ import annotations

import math

from planner.spot import COMPILE_S, RENDEZVOUS_S, START_UP_S


def fixed_seconds(kind: str, nodes: int, compile: bool) -> float:
    """Seconds a launch pays before its first step trains: start-up, a multi-node rendezvous, compile warm-up."""
    k = "gpu" if kind == "gpu" else "cpu"
    return START_UP_S[k] + (RENDEZVOUS_S if nodes > 1 else 0.0) + (COMPILE_S[k] if compile else 0.0)


def steps_within(seconds: float, step_s: float, fixed_s: float) -> int:
    """Whole steps that train within `seconds` of paid time after the launch's start-up (may be < 1)."""
    return math.floor((seconds - fixed_s) / step_s)


def paid_seconds(steps: int, step_s: float, fixed_s: float) -> float:
    """Paid seconds of a launch that trains `steps` steps."""
    return fixed_s + steps * step_s
