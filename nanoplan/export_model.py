"""`nanoplan export-model RUN_DIR [--step N] [--out FILE]`: one model file from a checkpoint.

zero2/fsdp checkpoints hold DCP shards. They are consolidated into one ``torch.save`` state dict,
the plain GPT's, with ``dcp_to_torch_save`` (runner/dcp.py). ddp/zero1 checkpoints already hold
one model.pt, which is copied. The result loads with ``torch.load(path, weights_only=True)``
into ``runner.model.GPT(spec)``. torch is imported only when the command runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from nanoplan.cli import app
from nanoplan.common import examples
from planner.errors import PlanError

Opt = typer.Option


def _pick_step(run_dir: Path, step: int | None) -> Path:
    """The verified step directory to export (the newest intact one when step is None)."""
    from runner.checkpoint_layout import complete_steps, step_dir  # noqa: PLC0415
    from runner.checkpoint_meta import verify  # noqa: PLC0415
    from runner.checkpoint_retention import latest_good  # noqa: PLC0415

    done = complete_steps(run_dir)
    if not done:
        raise PlanError("RUN_DIR", f"{run_dir} has no complete checkpoint", "pass the run dir of a run that checkpointed")
    if step is None:
        found = latest_good(run_dir, log=lambda msg: typer.echo(f"note: {msg}", err=True))
        if found is None:
            raise PlanError("RUN_DIR", f"no checkpoint in {run_dir} verifies", "see nanoplan run's messages about them")
        step = found[0]
    path = step_dir(run_dir, step)
    if step not in done:
        listed = ", ".join(str(s) for s in done[-6:])
        raise PlanError("--step", f"no complete checkpoint step_{step:08d} in {run_dir}", f"use one of {listed}")
    ok, why = verify(path)
    if not ok:
        raise PlanError("--step", f"checkpoint {path.name} is not usable: {why}", "export another --step")
    return path


def _plan_check(run_dir: Path, meta: dict[str, Any], sd: dict[str, Any]) -> str:
    """A note comparing the exported tensors with the plan that trained them (names and shapes)."""
    from planner.plan import (
        load_plan,  # noqa: PLC0415
        plan_hash,  # noqa: PLC0415
    )
    from runner.metrics import RUN_INFO, read_json  # noqa: PLC0415

    info = read_json(run_dir / RUN_INFO) or {}
    plan_path = info.get("plan_path")
    if not plan_path or not Path(plan_path).is_file():
        return "the plan that trained it was not found (run_info.json), so it was not checked against the model"
    plan = load_plan(plan_path)
    if plan_hash(plan) != meta.get("plan_hash"):
        return f"{plan_path} has changed since this checkpoint, so it was not checked against the model"
    from runner.model import build_meta_model  # noqa: PLC0415

    shapes = {k: tuple(v.shape) for k, v in build_meta_model(plan.request.model).state_dict().items()}
    got = {k: tuple(v.shape) for k, v in sd.items()}
    if shapes != got:
        diff = sorted(set(shapes.items()) ^ set(got.items()))[:3]
        raise PlanError("RUN_DIR", f"the exported tensors do not match the model of {plan_path}: {diff}",
                        "the checkpoint is not this plan's")
    return f"matches the model of {plan_path} ({plan.request.model.name}): GPT(spec).load_state_dict works"


@app.command("export-model", epilog=examples(
    ("nanoplan export-model runs/latest", "the newest intact checkpoint as one model file"),
    ("nanoplan export-model runs/latest --step 2000 --out model.pt", "a given step, to a given file"),
))
def export_model(
    run_dir: Annotated[str, typer.Argument(metavar="RUN_DIR", help="Run directory of nanoplan run")],
    step: Annotated[Optional[int], Opt(metavar="N", help="Checkpoint step (default: the newest intact one)")] = None,
    out: Annotated[Optional[str], Opt(metavar="FILE", help="Model file to write (default: RUN_DIR/model_step_N.pt)")] = None,
) -> None:
    """One model file (a state dict) from a checkpoint, sharded (DCP) or not, for inference."""
    from planner.writes import check_target, is_device  # noqa: PLC0415
    from runner.checkpoint_meta import read_meta  # noqa: PLC0415

    if out is not None:
        check_target(out)          # a directory or a missing chain of folders: one line, before any reading
        if is_device(out):
            raise PlanError("--out", f"{out} is a device; export-model writes a file and renames it into place",
                            "give a file path")
    rdir = Path(run_dir)
    path = _pick_step(rdir, step)
    meta = read_meta(path) or {}
    s = int(meta.get("step", int(path.name[5:])))
    dest = Path(out) if out else rdir / f"model_step_{s:08d}.pt"
    if not dest.parent.is_dir():
        try:
            dest.parent.mkdir()     # at most the last folder (check_target refused a missing chain)
        except OSError as e:
            from planner.writes import failed  # noqa: PLC0415

            raise failed(dest.parent, e) from None

    from runner.dcp import has_shards  # noqa: PLC0415
    from runner.model_file import export_model_file  # noqa: PLC0415

    kind = "DCP shards consolidated" if has_shards(path) else "model.pt copied"
    sd, removed = export_model_file(path, dest)
    if removed[0]:
        typer.echo(f"note: removed {removed[0]} temporary file(s) ({removed[1]:,} bytes) left in {dest.parent} by an "
                   "export-model that was killed", err=True)
    n = sum(v.numel() for v in sd.values())
    dtypes = sorted({str(v.dtype).removeprefix("torch.") for v in sd.values()})
    typer.echo(f"wrote {dest}: {len(sd)} tensors, {n:,} parameters ({'/'.join(dtypes)}), step {s}, {kind}")
    typer.echo(_plan_check(rdir, meta, sd))
