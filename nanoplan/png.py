"""Save a matplotlib figure as a PNG: written to a temp file beside the target, then renamed, so a chart is
never left half-written; the figure is closed either way."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any


def save_png(fig: Any, path: str | Path) -> Path:
    """Write `fig` to `path` (parents made), with the permissions of a normal file, and close it."""
    import matplotlib.pyplot as plt  # noqa: PLC0415

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
