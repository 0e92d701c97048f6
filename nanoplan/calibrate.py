"""`nanoplan calibrate RUN_DIR...`: measured against predicted, and a calibrated profile."""

from __future__ import annotations

import datetime as _dt
import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, List, Optional

import typer
from rich import box
from rich.console import Console
from rich.table import Table

from nanoplan.cli import app
from nanoplan.common import examples
from planner.errors import PlanError
from planner.units import fmt_bytes, fmt_count

if TYPE_CHECKING:
    from planner.calibrate import Measurement
    from planner.plan import Plan
    from planner.profiles import HardwareProfile

Opt = typer.Option


def _base_profile(arg: str | None, run_dirs: list[str]) -> HardwareProfile:
    from planner.calibrate import base_profile_of  # noqa: PLC0415
    from planner.profiles import find_profile, load_profile_file  # noqa: PLC0415

    if arg is None:
        return base_profile_of(run_dirs)
    p = Path(arg)
    if p.suffix.lower() in (".yaml", ".yml") or p.exists():
        return load_profile_file(p)
    return find_profile(arg)


def _pct(x: float | None) -> str:
    return "" if x is None else f"{x:+.1%}"


def _err(pred: float, meas: float | None) -> float | None:
    return None if not meas else (pred - meas) / meas


def _tables(ms: list[Measurement], after: list[Plan]) -> list[Table]:
    """One table per run, titled with its name, model and GPUs; numbers are never cut."""
    out = []
    for m, a in zip(ms, after, strict=True):
        t = Table(title=f"{Path(m.run_dir).name}: {m.model} ({fmt_count(m.n_params)} params), {m.num_gpus} "
                  f"GPU{'s' if m.num_gpus > 1 else ''}", title_justify="left", box=box.SIMPLE_HEAD,
                  pad_edge=False, show_edge=False)
        for col, just in (("metric", "left"), ("plan", "right"), ("measured", "right"), ("error", "right"),
                          ("calibrated", "right"), ("error", "right")):
            t.add_column(col, justify=just, no_wrap=True)  # type: ignore[arg-type]
        rows = [
            ("tokens/s", m.predicted_tokens_per_sec, m.tokens_per_sec, a.throughput.tokens_per_sec, "{:,.0f}"),
            ("MFU (model FLOPs)", m.predicted_effective_mfu, m.mfu, a.throughput.effective_mfu, "{:.2%}"),
        ]
        for name, pred, meas, cal, f in rows:
            t.add_row(name, f.format(pred), f.format(meas), _pct(_err(pred, meas)), f.format(cal),
                      _pct(_err(cal, meas)))
        mem = m.measured_memory_bytes
        label = "peak memory (reserved)" if m.max_memory_reserved else "peak memory (allocated)"
        t.add_row(label if mem else "peak memory", fmt_bytes(m.predicted_memory_bytes),
                  fmt_bytes(mem) if mem else "n/a (no CUDA)", _pct(_err(m.predicted_memory_bytes, mem)),
                  fmt_bytes(a.memory.per_gpu_bytes), _pct(_err(a.memory.per_gpu_bytes, mem)))
        t.add_row("steps used", "", f"{m.steps_used} of {m.steps_logged}", "", "", "")
        out.append(t)
    return out


@app.command(epilog=examples(
    ("nanoplan calibrate runs/latest", "measured against predicted for one run"),
    ("nanoplan calibrate runs/a runs/b --out my-h100.yaml", "fit a calibrated profile from two runs"),
    ("nanoplan estimate --profile my-h100.yaml --budget 100", "then plan with it"),
))
def calibrate(
    run_dirs: Annotated[List[str], typer.Argument(metavar="RUN_DIR...", help="Run directories written by nanoplan run",
                                                  show_default=False)],
    profile: Annotated[Optional[str], Opt(metavar="NAME|FILE", help="Base profile NAME or FILE.yaml (default: the runs' plan profile)")] = None,
    out: Annotated[Optional[str], Opt(metavar="FILE", help="Write the calibrated profile YAML here")] = None,
    skip_steps: Annotated[int, Opt(metavar="N", help="Warm-up/compile steps to drop per launch (at least 10% are dropped)")] = 5,
    json_out: Annotated[bool, Opt("--json", help="Print the measurements and the profile as JSON")] = False,
) -> None:
    """Measure finished or partial runs, compare with their plans, and fit a calibrated profile."""
    from planner.calibrate import calibrate_profile, measure_run, repredict, write_profile  # noqa: PLC0415

    if skip_steps < 0:
        raise PlanError("--skip-steps", f"must be >= 0, got {skip_steps}")
    if out:
        from planner.writes import check_target  # noqa: PLC0415

        check_target(out)           # a directory or a missing chain of folders: before any run is read
    ms = [measure_run(d, skip_steps) for d in run_dirs]
    base = _base_profile(profile, run_dirs)
    today = _dt.date.today().isoformat()
    prof = calibrate_profile(base, ms, today=today)
    header = (f"Calibrated by nanoplan calibrate on {today} from {len(ms)} run(s): "
              f"{', '.join(m.run_dir for m in ms)}\nBase profile: {base.name}. Use: nanoplan estimate --profile THIS.yaml ...")
    if out:
        prof = write_profile(prof, out, header, option="--out")
    after = [repredict(m, prof) for m in ms]
    if json_out:
        runs = [{**m.to_json(), "calibrated_tokens_per_sec": a.throughput.tokens_per_sec,
                 "calibrated_memory_bytes": a.memory.per_gpu_bytes} for m, a in zip(ms, after, strict=True)]
        typer.echo(json.dumps({"runs": runs, "profile": prof.model_dump(mode="json"), "written": out}, indent=2))
        return
    console = Console()
    console.print("[bold]Predicted vs measured (steady state)[/bold]")
    for t in _tables(ms, after):
        console.print(t)
    for w in (w for m in ms for w in m.warnings):
        console.print(f"[yellow]warning: {w}[/yellow]")
    console.print(f"Calibrated {base.name}: default_mfu {base.default_mfu:.2%} -> {prof.default_mfu:.2%}; MFU curve "
                  + ", ".join(f"{fmt_count(p.n_params)} params: {p.mfu:.2%}" for p in prof.mfu_curve))
    for key in ("intra_node_gb_s", "inter_node_gb_s"):
        if getattr(prof, key) != getattr(base, key):
            console.print(f"{key}: {getattr(base, key):g} -> {getattr(prof, key):.4g} (effective, fitted to multi-GPU runs)")
    console.print(f"overheads: {prof.overheads.source}")
    if out:
        console.print(f"[green]wrote {out}[/green] (use: nanoplan estimate --profile {out} ...)")
    else:
        console.print("add --out FILE.yaml to write the calibrated profile")
