"""matplotlib for the charts: imported only when one is drawn (headless), and a figure saved as a PNG through the
one write path (planner/writes.py): a temp file beside the target, renamed, so a chart is never left half-written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from planner.errors import PlanError


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend; without matplotlib, the one-line --plot error (exit 2)."""
    try:
        import matplotlib  # noqa: PLC0415

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        raise PlanError("--plot", "matplotlib is not installed",
                        "pip install 'nanoplan[plot]' (or pip install matplotlib), or drop --plot") from None
    return plt


def save_png(fig: Any, path: str | Path) -> Path:
    """Write `fig` to `path` through the one write path (planner/writes.py: a directory or a missing chain of
    folders is one line, exit 2; a failed write one line, exit 4), with a normal file's permissions; close it."""
    from planner.writes import atomic_output, check_target, failed, is_device  # noqa: PLC0415

    plt = pyplot()
    try:
        check_target(path, "--plot")
        if is_device(path):
            try:
                with open(path, "wb") as f:
                    fig.savefig(f, format="png")
            except OSError as e:
                raise failed(path, e, "--plot") from None
        else:
            with atomic_output(path, "--plot") as tmp:
                fig.savefig(tmp, format="png")
    finally:
        plt.close(fig)
    return Path(path)
