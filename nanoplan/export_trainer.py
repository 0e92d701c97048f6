"""`nanoplan export PLAN --for TRAINER`: the trainer's own launch files for a plan (no torch).

The plan must have been made for that trainer (`nanoplan estimate --trainer NAME`): its memory, batch and
steps are that trainer's. It is re-derived first, as `nanoplan validate` and the cluster exports do
(planner.export.check_exportable): a stale or hand-edited plan is refused in one line, exit 2, before anything is
written. The files (planner/trainers/launch_files.py) are rebuilt from the plan's request and numbers, never copied
from its text; they go to stdout, each after a `# ==> NAME <==` line, or with --out DIR into DIR, each written
atomically. Notes the files cannot carry (ds_config.json is JSON) go to stderr as `note:` lines.
"""

from __future__ import annotations

from pathlib import Path

import typer

from nanoplan.common import writable_target
from planner.errors import PlanError
from planner.plan import load_plan
from planner.writes import write_output

FOR = ("nanochat", "torchtitan", "deepspeed")


def export_for(plan_path: str, trainer: str, out: str | None) -> None:
    from planner.export import check_exportable  # noqa: PLC0415
    from planner.trainers.launch_files import export_notes, launch_files  # noqa: PLC0415

    if trainer not in FOR:
        raise PlanError("--for", f"unknown trainer {trainer!r}", f"choose one of {', '.join(FOR)}")
    plan = load_plan(plan_path)
    made_for = plan.request.trainer.name
    if made_for != trainer:
        raise PlanError("--for", f"{plan_path} plans {made_for}'s step, not {trainer}'s (memory, batch and steps "
                        "differ between trainers)",
                        f"re-plan it: nanoplan estimate ... --trainer {trainer} --out {plan_path}")
    check_exportable(plan, plan_path)    # re-derived as `nanoplan validate` does: an edited plan is refused
    if not plan.memory.fits:
        typer.echo(f"warning: {plan_path} does not fit in GPU memory by the plan's own estimate", err=True)
    files = launch_files(plan)
    for note in export_notes(plan):
        typer.echo(f"note: {note}", err=True)
    if out is None:
        for name, text in files.items():
            typer.echo(f"# ==> {name} <==")
            typer.echo(text, nl=False)
        return
    target = Path(out)
    if target.exists() and not target.is_dir():
        raise PlanError("--out", f"{out} is a file; --for writes several files", "give a directory")
    for name, text in files.items():
        path = target / name
        if writable_target(str(path)):
            write_output(path, text)
            if name.endswith(".sh"):
                path.chmod(0o755)
            typer.echo(f"wrote {path}", err=True)
