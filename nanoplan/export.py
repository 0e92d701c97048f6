"""`nanoplan export`: an sbatch script or a SkyPilot task YAML for a plan (no torch)."""

from __future__ import annotations

import shlex
from typing import Annotated, Optional

import typer

from nanoplan.cli import app
from nanoplan.common import examples
from planner.errors import PlanError
from planner.plan import load_plan
from planner.writes import write_output

Opt = typer.Option


@app.command(epilog=examples(
    ("nanoplan export plan.json --slurm --out train.sbatch", "an sbatch script"),
    ("nanoplan export plan.json --skypilot --bucket s3://my-bucket/run", "a SkyPilot task YAML"),
    ("nanoplan export spot.json --skypilot --spot --bucket s3://my-bucket/run", "a managed spot job that resumes"),
    ("nanoplan export plan.json --for deepspeed --out launch/", "ds_config.json and train.sh (docs/trainers.md)"),
))
def export(
    plan_path: Annotated[str, typer.Argument(metavar="PLAN.json", help="plan.json from nanoplan estimate --out")],
    slurm: Annotated[bool, Opt("--slurm", help="Write a SLURM sbatch script")] = False,
    skypilot: Annotated[bool, Opt("--skypilot", help="Write a SkyPilot task YAML")] = False,
    bucket: Annotated[Optional[str], Opt(metavar="URL|DIR",
        help="Where the run dir lives: a bucket URL for --skypilot (mounted, required), "
             "a shared directory for --slurm (default: the plan's run_dir)")] = None,
    time_margin: Annotated[float, Opt(metavar="F", help="SLURM time limit = plan hours × (1 + margin)")] = 0.1,
    partition: Annotated[Optional[str], Opt(metavar="NAME", help="SLURM partition")] = None,
    account: Annotated[Optional[str], Opt(metavar="NAME", help="SLURM account")] = None,
    out: Annotated[Optional[str], Opt(metavar="FILE", help="Write here (atomically) instead of stdout; "
                                      "with --for, a directory for the trainer's files")] = None,
    for_trainer: Annotated[Optional[str], Opt("--for", metavar="TRAINER",
        help="The trainer's own launch files for a plan made with --trainer: nanochat | torchtitan | deepspeed")] = None,
    spot: Annotated[bool, Opt("--spot", help="For a plan made with --spot: a managed spot job (sky jobs launch) "
                                             "or a requeued SLURM job, resuming from the newest checkpoint")] = False,
) -> None:
    """Launch files for real clusters, running the same torchrun command as `nanoplan run`."""
    from planner.export import check_exportable, data_problem, skypilot_task, slurm_script  # noqa: PLC0415

    if for_trainer is not None:
        from nanoplan.export_trainer import export_for  # noqa: PLC0415

        if slurm or skypilot or bucket or partition or account or spot:
            raise PlanError("--for", "writes the trainer's own files", "drop --slurm/--skypilot/--bucket/--partition/--account/--spot")
        export_for(plan_path, for_trainer, out)
        return
    if slurm == skypilot:
        raise PlanError("--slurm/--skypilot", "give exactly one of them", "e.g. nanoplan export plan.json --slurm")
    plan = load_plan(plan_path)
    check_exportable(plan, plan_path)     # re-derived as `nanoplan validate` does: a hand-edited plan is refused
    if skypilot and (partition or account):
        raise PlanError("--partition/--account", "are SLURM options", "drop them with --skypilot")
    if not plan.memory.fits:
        typer.echo(f"warning: {plan_path} does not fit in GPU memory by the plan's own estimate", err=True)
    words = ["nanoplan", "export", plan_path, "--slurm" if slurm else "--skypilot"]
    for flag, value in (("--bucket", bucket), ("--partition", partition), ("--account", account)):
        if value:
            words += [flag, value]
    if slurm and time_margin != 0.1:
        words += ["--time-margin", f"{time_margin:g}"]
    if spot:
        words.append("--spot")
    cmd = shlex.join(words)
    if slurm:
        text = slurm_script(plan, plan_path, run_dir=bucket, time_margin=time_margin, partition=partition,
                            account=account, command=cmd, spot=spot)
    else:
        text = skypilot_task(plan, plan_path, bucket=bucket, command=cmd, spot=spot)
    if not spot and (why := data_problem(plan)):    # a --spot job without data is refused (planner/export.py)
        typer.echo(f"warning: {plan_path}: {why}; plan with --data DATA_DIR (nanoplan prepare-data)", err=True)
    if out:
        write_output(out, text)
        typer.echo(f"wrote {out}", err=True)
    else:
        typer.echo(text, nl=False)
