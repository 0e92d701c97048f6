"""The checkpoint cadence a plan asks for, held against what writing a checkpoint costs (issue 30 #4).

The runner checkpoints at the first step after each interval of its budget clock (runner/train.py),
so a cadence shorter than a step is a checkpoint after every step, and each one takes the checkpoint's
bytes over the storage bandwidth (the profile's `storage_gb_s`, 1 GB/s assumed). The plan's steps and
tokens do not count that time: `--checkpoint-every-minutes 1e-9` planned 52,524 checkpoints of 2.2 GB
with the same tokens and no warning. Now:

- an interval shorter than one checkpoint write is refused: the run would spend more time writing
  checkpoints than training (one line, exit 2, naming the shortest cadence that is not);
- writes that take more than WRITE_SHARE_WARN of the training time are a warning in the plan.

Pure Python.
"""

from __future__ import annotations

from planner.errors import PlanError
from planner.units import fmt_bytes

WRITE_SHARE_WARN = 0.05     # checkpoint writes above 5% of the training time: say so in the plan's warnings


def check_cadence(minutes: float, checkpoint_bytes: int, bytes_per_s: float, option: str) -> None:
    """PlanError when one interval is shorter than writing one checkpoint."""
    write_s = checkpoint_bytes / bytes_per_s
    if minutes * 60.0 < write_s:
        floor = max(write_s / 60.0, 0.01)
        raise PlanError(option, f"{minutes:g} min is shorter than writing one checkpoint ({fmt_bytes(checkpoint_bytes)} "
                        f"at {bytes_per_s / 1e9:g} GB/s: {write_s:.3g} s); the run would write checkpoints more than "
                        "it trains", f"give at least {floor:.2g} min (the default is 60; --spot picks one)")


def cadence_warning(num_checkpoints: int, checkpoint_bytes: int, bytes_per_s: float, train_s: float,
                    every_steps: int, every_minutes: float) -> str | None:
    """A warning when the planned checkpoint writes take more than WRITE_SHARE_WARN of the training time."""
    write_s = num_checkpoints * checkpoint_bytes / bytes_per_s
    if train_s <= 0 or write_s <= WRITE_SHARE_WARN * train_s:
        return None
    every = "every step" if every_steps == 1 else f"every {every_steps:,} steps"
    return (f"checkpoints: {every_minutes:g} min is {every}: {num_checkpoints:,} writes of "
            f"{fmt_bytes(checkpoint_bytes)} take ~{write_s / 3600:.3g} h at {bytes_per_s / 1e9:g} GB/s "
            f"({write_s / train_s:.0%} of the training time), which the plan's steps do not count; "
            "checkpoint less often (--checkpoint-every-minutes)")
