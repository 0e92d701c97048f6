"""`nanoplan validate`: re-derive and fit-check plan.json files (and trace their real step)."""

from __future__ import annotations

import json
from typing import Annotated, List

import typer
from rich.console import Console

from nanoplan.cli import app
from nanoplan.common import FLAG, examples
from planner.units import fmt_bytes

Opt = typer.Option


@app.command(epilog=examples(
    ("nanoplan validate plan.json", "re-derive every number and check the fit"),
    ("nanoplan validate plans/*.json --json", "many plans, as JSON"),
    ("nanoplan validate plans/*.json --wide", "every column, however narrow the terminal"),
    ("nanoplan validate plan.json --trace", "also trace the real training step (imports torch)"),
))
def validate(
    plans: Annotated[List[str], typer.Argument(metavar="PLAN.json...", help="plan.json files (from nanoplan estimate --out)")],
    trace: Annotated[bool, Opt("--trace", help="Also trace each plan's real training step (imports torch)")] = False,
    json_out: Annotated[bool, Opt("--json", help="Print a JSON list, one object per plan")] = False,
    headroom: Annotated[float, Opt(metavar="F", help="Memory kept free beyond the fragmentation, a fraction of the GPU")] = 0.0,
    wide: Annotated[bool, Opt("--wide", metavar=FLAG, help="Every column, however wide the table")] = False,
) -> None:
    """Re-derive every number in each plan, check it fits; exit 0 all fit (tight: a warning), 1 not, 2 bad input."""
    from planner.validate import exit_code, validate_paths  # noqa: PLC0415

    tracer = None
    if trace:
        from runner.trace import trace_memory  # noqa: PLC0415  (imports torch)

        tracer = trace_memory
    checks = validate_paths(plans, headroom=headroom, tracer=tracer)
    if json_out:
        typer.echo(json.dumps([c.as_json() for c in checks], indent=2))
    else:
        _print(checks, trace, wide)
    raise typer.Exit(exit_code(checks))


def _print(checks: list, trace: bool, wide: bool = False) -> None:
    from planner.tables import Col, fit_table, hidden_note, print_table  # noqa: PLC0415

    cols = [Col("plan", 0, "left"), Col("model", 1, "left"), Col("GPUs", 3, "left"), Col("analytic", 2),
            *((Col("traced", 0), Col("Δ", 0)) if trace else ()), Col("total", 0), Col("capacity", 1),
            Col("fits", 0), Col("consistent", 0)]
    rows = []
    for c in checks:
        traced: tuple[str, ...] = ()
        if trace:
            traced = (fmt_bytes(c.traced_peak_bytes or 0), f"{c.trace_error:+.2%}" if c.trace_error is not None else "-")
        rows.append([c.path, c.name, c.gpu, fmt_bytes(c.analytic_peak_bytes), *traced, fmt_bytes(c.per_gpu_bytes),
                     fmt_bytes(c.capacity_bytes), "[yellow]tight[/yellow]" if c.verdict == "tight" else _yes(c.fits),
                     _yes(c.consistent)])
    console = Console()     # the terminal's width, or $COLUMNS (80 when neither is known)
    t = fit_table(cols, rows, None if wide else console.width)
    note = hidden_note(cols, t)
    # the title wraps at the terminal's width, not the table's (a rich table title wraps at the table's)
    console.print("nanoplan validate: bytes per GPU (allocated peak; total adds the profile's overheads)",
                  style="italic", highlight=False)
    print_table(console, t)
    if note:
        console.print(note, style="dim", highlight=False)
    for c in checks:
        if c.band_line:
            console.print(f"{c.path}: {c.band_line}", highlight=False)
        for p in c.problems:
            console.print(f"[red]{c.path}[/red]: {p}", highlight=False)
        for w in c.warnings:        # tight: a warning, not a failure (planner.fit_verdict)
            console.print(f"[yellow]{c.path}[/yellow]: {w}", highlight=False)
        if c.trace_note:
            console.print(f"{c.path}: {c.trace_note}", highlight=False)
    bad = sum(not c.ok for c in checks)
    console.print(f"[green]all {len(checks)} plan(s) fit and are consistent[/green]" if not bad else
                  f"[red]{bad} of {len(checks)} plan(s) failed[/red]")


def _yes(ok: bool) -> str:
    return "[green]yes[/green]" if ok else "[bold red]no[/bold red]"
