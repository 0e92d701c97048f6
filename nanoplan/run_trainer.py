"""`nanoplan run PLAN [--trainer-dir DIR]` for a plan made for nanochat, torchtitan or DeepSpeed.

The launch is held as the runner's is (nanoplan/run.py): a spent budget ends the command before anything
starts (read-only), then the run dir is locked (a second launch: exit 2), links among its managed paths are
refused, and the launch is recorded in RUN_DIR/launches.json with its heartbeat (exit 4 if it cannot be);
then runner/trainers/supervise.py runs the trainer under the budget. Nothing here imports torch.
"""

from __future__ import annotations

import shlex
import sys
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from nanoplan.common import check_rederived, check_run_args, record_launch
from planner.errors import PlanError

if TYPE_CHECKING:
    from planner.plan import Plan
    from runner.launcher import StopRequests

def run_trainer(plan: Plan, plan_path: str, run_dir: str | None, *, trainer_dir: str | None, data: str | None,
                dry_run: bool, resume: bool, force: bool, nnodes: int | None, node_rank: int, rdzv_endpoint: str | None,
                probe: bool, max_restarts: int,
                tensorboard: bool, t0: float, stops: StopRequests | None) -> None:
    from planner.plan import budget_key, plan_hash  # noqa: PLC0415
    from runner.launcher import Launch  # noqa: PLC0415
    from runner.trainers import adapter_for  # noqa: PLC0415
    from runner.trainers.records import link_in  # noqa: PLC0415
    from runner.trainers.supervise import Supervisor  # noqa: PLC0415

    name = plan.request.trainer.name
    adapter = adapter_for(name)
    adapter.refuse(plan, plan_path)
    if probe:
        raise PlanError("--probe", f"measures nanoplan's own runner, not {name}",
                        f"drop --probe: the first launch measures {name}'s step, and each relaunch re-derives the "
                        "save cadence and step count from it")
    if data is not None:
        raise PlanError("--data", f"{name} reads its own data, where it prepared it", "drop --data")
    if node_rank or rdzv_endpoint:
        raise PlanError("--node-rank" if node_rank else "--rdzv-endpoint", f"nanoplan run supervises {name} on one node",
                        "drop it")
    if nnodes is not None and nnodes != plan.hardware.nodes:
        raise PlanError("--nnodes", f"{nnodes} but the plan is for {plan.hardware.nodes} node(s)", "re-plan it")
    check_run_args(plan, plan_path, run_dir, max_restarts)
    check_rederived(plan, plan_path, force)
    rpath = Path(run_dir or plan.launch.run_dir)
    tdir = adapter.trainer_dir(trainer_dir)
    phash = plan_hash(plan)
    launch = Launch(rpath, node_rank=0, plan_hash=phash, launch_id=uuid.uuid4().hex, t0=t0, scale=1.0,
                    budget_key=budget_key(plan))       # a changed checkpoint cadence is the same run (issue 30 #2)

    def supervisor(carried: float) -> Supervisor:
        return Supervisor(plan, plan_path, rpath, adapter, tdir, launch_id=launch.id, t0=t0, carried_s=carried,
                          stops=stops, force=force, resume=resume, max_restarts=max_restarts, tensorboard=tensorboard,
                          say=lambda m: typer.echo(m, err=True), show_command=_show)

    if dry_run:
        cmd, about = supervisor(launch.carried_s() if rpath.is_dir() else 0.0).dry_run()
        typer.echo(about)
        if cmd is not None:
            typer.echo(shlex.join(cmd))
        return
    if rpath.is_dir() and not link_in(adapter, rpath):
        _, _, why = supervisor(launch.carried_s()).decide()
        if why is not None:            # a spent run: one line, before anything is locked or started
            typer.echo(f"nothing to do: {why}; nothing was started", err=True)
            return
    with launch.held(stops):           # exit 2 if another live process holds the run dir
        bad = link_in(adapter, rpath)
        if bad:
            raise PlanError("preflight", bad, "remove the link, or pass the real directory as --run-dir")
        carried = launch.carried_s()
        sup = supervisor(carried)
        first, _, why = sup.decide()
        if why is not None:
            typer.echo(f"nothing to do: {why}; nothing was started", err=True)
            return
        if first is not None:
            adapter.command(first)           # what it needs to run is there (a PlanError otherwise), before the record
        if resume and first is not None and first.resume_step is None:
            raise PlanError("--resume", f"{adapter.checkpoint_dir(rpath)} holds no complete checkpoint of {name}",
                            "drop --resume to start afresh")
        record_launch(launch, carried_s=carried)   # before anything is spawned
        rc = sup.run()
    if rc:
        raise typer.Exit(rc)


def _show(cmd: list[str]) -> None:
    from nanoplan.common import output_width, wrap_command  # noqa: PLC0415

    typer.echo(wrap_command("launching: ", cmd, output_width(sys.stderr)), err=True)
