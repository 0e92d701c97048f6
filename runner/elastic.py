"""What a worker knows about its launch from the environment: torchrun's restart count and the job's id.

`nanoplan run` sets NANOPLAN_LAUNCH_ID (one id per launch, the same across torchrun's restarts);
plain torchrun sets TORCHELASTIC_RUN_ID and TORCHELASTIC_RESTART_COUNT.
"""

from __future__ import annotations

import os

from runner.clock import ENV_LAUNCH_ID


def restart_count() -> int:
    """How many times torchrun has restarted this job's workers (0 on the first attempt)."""
    try:
        return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    except ValueError:
        return 0


def launch_job() -> str | None:
    """What identifies this torchrun job across its restarts: `nanoplan run`'s launch id, else torchrun's run id."""
    return os.environ.get(ENV_LAUNCH_ID) or os.environ.get("TORCHELASTIC_RUN_ID") or None
