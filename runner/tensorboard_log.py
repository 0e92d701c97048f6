"""Optional TensorBoard logging of a run, beside metrics.jsonl: RUN_DIR/tensorboard/.

On with `nanoplan run --tensorboard` (which sets NANOPLAN_TENSORBOARD=1 for the workers; the variable
works alone too, e.g. under an exported launch file). Off by default, and a no-op without the
`tensorboard` package (`pip install 'nanoplan[tensorboard]'`): torch's own writer,
`torch.utils.tensorboard.SummaryWriter`, needs it. Rank 0 writes, as it writes metrics.jsonl.

The scalars, per optimizer step (TAGS): the training and validation loss, tokens/s, MFU, the dollars
spent, and the CUDA memory high-water marks in GiB (absent on CPU), plus the learning rate and the
gradient norm. A resumed run starts its writer with `purge_step` at its first step, so that TensorBoard
drops the steps an earlier launch logged after the checkpoint it resumed from (as readers of
metrics.jsonl keep the last line of each step).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

ENV = "NANOPLAN_TENSORBOARD"
DIR = "tensorboard"
GiB = 2**30

# metrics.jsonl key -> (TensorBoard tag, scale)
TAGS: dict[str, tuple[str, float]] = {
    "loss": ("loss/train", 1.0),
    "val_loss": ("loss/val", 1.0),
    "tokens_per_sec": ("speed/tokens_per_sec", 1.0),
    "mfu": ("speed/mfu", 1.0),
    "usd_spent": ("cost/usd_spent", 1.0),
    "max_memory_allocated": ("memory/max_allocated_gib", 1 / GiB),
    "max_memory_reserved": ("memory/max_reserved_gib", 1 / GiB),
    "lr": ("train/lr", 1.0),
    "grad_norm": ("train/grad_norm", 1.0),
}


def available() -> bool:
    """Whether the tensorboard package is installed (torch's SummaryWriter imports it)."""
    return importlib.util.find_spec("tensorboard") is not None


def wanted(env: dict[str, str] | None = None) -> bool:
    """Whether this launch asked for TensorBoard (NANOPLAN_TENSORBOARD=1)."""
    return (os.environ if env is None else env).get(ENV, "0").strip().lower() in ("1", "true", "yes", "on")


class TensorBoardLog:
    """Writes the TAGS of each metrics row as TensorBoard scalars; the writer opens on the first row."""

    def __init__(self, run_dir: str | Path) -> None:
        self.log_dir = Path(run_dir) / DIR
        self._writer: Any = None

    def write(self, row: dict[str, Any]) -> None:
        step = int(row["step"])
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter  # noqa: PLC0415  (imports tensorboard)

            self._writer = SummaryWriter(log_dir=str(self.log_dir), purge_step=step)
        for key, (tag, scale) in TAGS.items():
            v = row.get(key)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                self._writer.add_scalar(tag, v * scale, step)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def open_log(run_dir: str | Path, enabled: bool | None = None) -> TensorBoardLog | None:
    """A TensorBoardLog when asked for (enabled, else NANOPLAN_TENSORBOARD) and tensorboard is installed."""
    if not (wanted() if enabled is None else enabled) or not available():
        return None
    return TensorBoardLog(run_dir)
