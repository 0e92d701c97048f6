"""Re-draw the charts the docs show, from the commands the docs show, and check that none is stale.

A chart in the docs is made by a documented command: a `$ nanoplan ... --plot docs/NAME.png` line of a
console block in README.md or docs/*.md. This script runs each such command again (in a scratch directory,
the command up to its first `|` or `;`) and compares the fingerprint of what the chart draws (its data: the
points, labels and marks, as nanoplan/png.py stores it in the PNG's `nanoplan-chart-data` text chunk) with
the one in the committed PNG. Pixels are not compared: fonts and matplotlib versions move them.

    python scripts/render_charts.py            # re-draw every chart the docs name (writes docs/*.png)
    python scripts/render_charts.py --check    # list the stale charts; exit 1 if any; write nothing

scripts/render_docs.py re-runs the text of the same blocks; this script keeps their pictures with them.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_PLOT = re.compile(r"^\$ (nanoplan .*--plot (docs/[\w.-]+\.png).*)$")


@dataclass(frozen=True)
class Chart:
    """A chart the docs show and the documented command that draws it."""

    page: str          # the markdown file that runs the command
    png: str           # repository-relative path of the chart
    argv: list[str]    # the nanoplan arguments, the --plot path included


def documented_charts(root: Path = ROOT) -> list[Chart]:
    """Every `$ nanoplan ... --plot docs/X.png` line of README.md and docs/*.md."""
    out = []
    for page in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        for line in page.read_text().splitlines():
            m = _PLOT.match(line.strip())
            if m:
                cmd = re.split(r"\s[|;]\s?", m.group(1))[0]
                out.append(Chart(str(page.relative_to(root)), m.group(2), shlex.split(cmd)[1:]))
    return out


def draw(chart: Chart, where: Path, root: Path = ROOT) -> Path:
    """Run the chart's command with its --plot path moved under `where`; the fresh PNG's path."""
    argv = list(chart.argv)
    dest = where / Path(chart.png).name
    argv[argv.index("--plot") + 1] = str(dest)
    env = {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "COLUMNS": "80"}
    proc = subprocess.run([sys.executable, "-m", "nanoplan", *argv], cwd=where, env=env, capture_output=True,
                          text=True, timeout=600)
    if not dest.is_file():
        raise RuntimeError(f"{chart.page}: `nanoplan {shlex.join(chart.argv)}` drew nothing (exit "
                           f"{proc.returncode}): {proc.stderr.strip()[-300:]}")
    return dest


def stale(chart: Chart, root: Path = ROOT) -> str | None:
    """Why the committed chart differs from what its command draws today, or None."""
    from nanoplan.png import read_fingerprint  # noqa: PLC0415

    with tempfile.TemporaryDirectory(prefix="nanoplan-charts-") as tmp:
        fresh = read_fingerprint(draw(chart, Path(tmp), root))
    path = root / chart.png
    have = read_fingerprint(path) if path.is_file() else None
    if have is None:
        return f"{chart.png} has no data fingerprint (re-draw it: python scripts/render_charts.py)"
    if have != fresh:
        return (f"{chart.png} is stale: `nanoplan {shlex.join(chart.argv)}` ({chart.page}) draws other data "
                "today (re-draw it: python scripts/render_charts.py)")
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="list stale charts, exit 1 if any; write nothing")
    a = ap.parse_args(argv)
    bad = 0
    for chart in documented_charts():
        if a.check:
            why = stale(chart)
            print(f"{'stale' if why else 'ok'}: {why or chart.png}")
            bad += why is not None
            continue
        with tempfile.TemporaryDirectory(prefix="nanoplan-charts-") as tmp:
            fresh = draw(chart, Path(tmp))
            target = ROOT / chart.png
            tmp_target = target.with_name(f".{target.name}.tmp")
            shutil.copyfile(fresh, tmp_target)
            os.replace(tmp_target, target)
        print(f"wrote {chart.png} ({chart.page})")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
