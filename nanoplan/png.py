"""matplotlib for the charts: imported only when one is drawn (headless), and a figure saved as a PNG, written to
a temp file beside the target and renamed, so a chart is never left half-written."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend; without matplotlib, the one-line --plot error (exit 2)."""
    try:
        import matplotlib  # noqa: PLC0415

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        from nanoplan.extras import missing  # noqa: PLC0415

        raise missing("matplotlib", "--plot") from None   # type: ignore[misc]
    return plt


def save_png(fig: Any, path: str | Path) -> Path:
    """Write `fig` to `path` (parents made), with the permissions of a normal file, and close it."""
    plt = pyplot()
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    os.close(fd)
    try:
        fig.savefig(tmp, format="png")
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)     # mkstemp makes 0600; a chart gets normal file permissions
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    finally:
        plt.close(fig)
    return p
