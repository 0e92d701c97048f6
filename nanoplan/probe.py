"""`nanoplan probe PLAN.json`: measure the plan on this machine, then write a corrected plan.

torch runs only inside the trials (runner/probe_worker.py under torchrun). Exit codes: 0 done, 2 bad
input, 4 a place the probe writes cannot be written (checked before the first trial), 130 stopped by
SIGTERM, SIGINT or SIGHUP (the running trial is stopped too; a trial also dies with a probe killed -9).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from nanoplan.cli import app
from nanoplan.common import FLAG, examples
from planner.units import fmt_bytes

if TYPE_CHECKING:
    from runner.probe import ProbeResult

Opt = typer.Option
DEFAULT_OUT = "plan.probed.json"
DEFAULT_DIR = "probe"


def _status(r: dict) -> str:
    if r["status"] != "ok":
        return r["status"]
    return {True: "fits", False: "over headroom", None: "ok"}[r["fits_with_headroom"]]


def trials_table(report: dict) -> Table:
    """One row per trial; * marks the one kept. Predictions per trial are in probe.json."""
    t = Table(title="Trials", title_justify="left", box=None, pad_edge=False)
    for col in ("trial", "status", "tokens/s", "vs plan", "MFU", "peak memory", "time"):
        t.add_column(col, justify="left" if col in ("trial", "status", "peak memory") else "right", no_wrap=True)
    for r in report["trials"]:
        m = r["measured"] or {}
        ok = r["status"] == "ok"
        peak = m.get("peak_device_bytes")
        mem = fmt_bytes(peak) if peak else f"{fmt_bytes(r['predicted']['memory_bytes'])} model"
        mark = "*" if r["label"] == report["chosen"] else ""
        t.add_row(f"{r['label']}{mark} {r['role']}", _status(r),
                  f"{m['tokens_per_sec']:,.0f}" if ok else "-", f"{m['tokens_per_sec'] / r['predicted']['tokens_per_sec'] - 1:+.0%}" if ok else "",
                  f"{m['mfu']:.1%}" if ok else "-", mem, f"{r['seconds']:.0f} s")
    return t


def before_after_table(res: ProbeResult) -> Table:
    from planner.probe import before_after  # noqa: PLC0415

    chosen = next(r for r in res.report["trials"] if r["label"] == res.report["chosen"])
    t = Table(title="Before and after the probe", title_justify="left", box=None, pad_edge=False)
    t.add_column("")
    t.add_column("before (the plan)")
    t.add_column("after (probed)")
    assert res.corrected is not None
    for row in before_after(res.plan, res.corrected, chosen):
        t.add_row(*row)
    return t


def print_probe(res: ProbeResult, console: Console | None = None) -> None:
    """The trials, the before/after table and what the probe cost: one 80×24 screen for a few trials."""
    c = console or Console()
    rep = res.report
    c.print(trials_table(rep))
    c.print(f"chosen: {rep['reason']}", highlight=False)
    if res.corrected is not None:
        c.print(before_after_table(res))
    n_run = sum(r["status"] != "skipped" for r in rep["trials"])
    c.print(f"probe: {n_run} trial{'s' if n_run != 1 else ''} (${rep['cost']['usd']:,.2f}), {rep['charged']}",
            highlight=False)
    for line in new_warnings(res):
        c.print(f"[yellow]{line}[/yellow]", highlight=False)
    made = [str(res.report_path)] + ([rep["profile"]] if rep.get("profile") else [])
    if res.out is not None:
        c.print(f"wrote {res.out}, {' and '.join(made)}", highlight=False)
        c.print(f"next: nanoplan run {res.out}", highlight=False)
    else:
        c.print(f"wrote {' and '.join(made)}", highlight=False)


def new_warnings(res: ProbeResult) -> list[str]:
    """The corrected plan's warnings: in full where the plan did not have that kind (the words before ':'),
    else named in one line (the plan's own `estimate` said them already)."""
    if res.corrected is None:
        return []
    kinds = {w.split(":", 1)[0] for w in res.plan.warnings}
    new = [f"warning: {w}" for w in res.corrected.warnings if w.split(":", 1)[0] not in kinds]
    old = list(dict.fromkeys(w.split(":", 1)[0] for w in res.corrected.warnings if w.split(":", 1)[0] in kinds))
    return new + ([f"warnings as in the plan: {', '.join(old)}"] if old else [])


@app.command(epilog=examples(
    ("nanoplan probe plan.json", "measure the plan and its neighbours here; write plan.probed.json"),
    ("nanoplan probe plan.json --warmup 1 --steps 2", "a quicker probe: fewer steps per trial"),
    ("nanoplan probe plan.json --out runs/x/probed.json --dir runs/x/probe", "its files beside the run"),
    ("nanoplan run plan.json --probe", "both in one: probe, then run the corrected plan"),
))
def probe(
    plan_path: Annotated[str, typer.Argument(metavar="PLAN.json", help="plan.json from nanoplan estimate --out")],
    out: Annotated[str, Opt(metavar="FILE", help="Write the corrected plan here")] = DEFAULT_OUT,
    dir: Annotated[str, Opt("--dir", metavar="DIR", help="Trials, probe.json and the calibrated profile.yaml go "
                                                          "here")] = DEFAULT_DIR,
    data: Annotated[Optional[str], Opt(metavar="DIR", help="DATA_DIR from nanoplan prepare-data (default: the "
                                                           "plan's)")] = None,
    warmup: Annotated[int, Opt(metavar="N", help="Untimed steps per trial (the first compiles)")] = 3,
    steps: Annotated[int, Opt(metavar="N", help="Timed steps per trial")] = 6,
    trial_timeout: Annotated[float, Opt(metavar="SECONDS", help="Seconds before a trial is killed")] = 300.0,
    timeout: Annotated[float, Opt(metavar="SECONDS", help="Seconds for the whole probe; later trials are "
                                                          "skipped")] = 900.0,
    force: Annotated[bool, Opt("--force", metavar=FLAG, help="Probe despite device problems (a GPU plan on "
                                                             "CPU)")] = False,
    json_out: Annotated[bool, Opt("--json", metavar=FLAG, help="Print probe.json instead of the tables")] = False,
) -> None:
    """Measure a plan on this machine (it and its neighbouring micro-batches), then write a corrected plan."""
    from nanoplan.extras import require  # noqa: PLC0415

    require("torch", "probe")      # its trials run in other processes, where a missing torch reads as a failed trial
    from runner.launcher import StopRequests  # noqa: PLC0415
    from runner.probe import ProbeWriteError  # noqa: PLC0415
    from runner.probe import probe as run_probe  # noqa: PLC0415

    console = Console()
    # SIGTERM, SIGINT and SIGHUP stop the probe with one line (exit 130), its running trial with it
    stops = StopRequests("during the probe; its trial was stopped")
    try:
        with _progress(console, json_out) as log:
            res = run_probe(plan_path, out=out, work_dir=dir, data=data, warmup=warmup, steps=steps,
                            trial_timeout_s=trial_timeout, timeout_s=timeout, force=force, log=log)
    except ProbeWriteError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(4) from None
    finally:
        stops.restore()
    if json_out:
        typer.echo(json.dumps(res.report, indent=2))
        return
    print_probe(res, console)


@contextmanager
def _progress(console: Console, quiet: bool) -> Iterator[Callable[[str], None]]:
    """Where the probe says how it goes: on a terminal, one status line that each trial replaces (the trials
    table shows them all after, so the answer fits one screen); in a pipe or a log, one line each; --json: none."""
    if quiet:
        yield lambda s: None
    elif not console.is_terminal:
        yield typer.echo
    else:
        with console.status("probe: starting") as status:
            yield lambda s: status.update(s.strip()[: max(20, console.width - 4)])
