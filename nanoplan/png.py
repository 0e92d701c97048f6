"""matplotlib for the charts: imported only when one is drawn (headless), and a figure saved as a PNG through the
one write path (planner/writes.py): a temp file beside the target, renamed, so a chart is never left half-written."""

from __future__ import annotations

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


CHART_KEY = "nanoplan-chart-data"   # a PNG text chunk: the sha256 of the data the chart draws (scripts/render_charts.py)


def fingerprint(data: Any) -> str:
    """sha256 of `data` as canonical JSON: what a chart draws, not its pixels (fonts and matplotlib differ)."""
    import hashlib  # noqa: PLC0415
    import json  # noqa: PLC0415

    return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def read_fingerprint(path: str | Path) -> str | None:
    """The CHART_KEY text chunk of a PNG written by save_png(data=...), or None."""
    import struct  # noqa: PLC0415

    raw = Path(path).read_bytes()
    i = 8
    while i + 8 <= len(raw):
        n, kind = struct.unpack(">I4s", raw[i:i + 8])
        if kind == b"tEXt":
            key, _, value = raw[i + 8:i + 8 + n].partition(b"\0")
            if key.decode("latin-1") == CHART_KEY:
                return value.decode("latin-1")
        i += 12 + n
    return None


def save_png(fig: Any, path: str | Path, data: Any = None) -> Path:
    """Write `fig` to `path` through the one write path (planner/writes.py: a directory or a missing chain of
    folders is one line, exit 2; a failed write one line, exit 4), with a normal file's permissions; close it.
    With `data` (what the chart draws), its fingerprint goes into the PNG as a text chunk, so a check can tell a
    stale chart."""
    from planner.writes import atomic_output, check_target, failed, is_device  # noqa: PLC0415

    plt = pyplot()
    try:
        meta = {CHART_KEY: fingerprint(data)} if data is not None else None
        check_target(path, "--plot")
        if is_device(path):
            try:
                with open(path, "wb") as f:
                    fig.savefig(f, format="png", metadata=meta)
            except OSError as e:
                raise failed(path, e, "--plot") from None
        else:
            with atomic_output(path, "--plot") as tmp:
                fig.savefig(tmp, format="png", metadata=meta)
    finally:
        plt.close(fig)
    return Path(path)
