"""`nanoplan run PLAN.json`: re-validate the plan, preflight, then run it with torchrun.

Nothing here imports torch at import time; the preflight imports it only to count GPUs.
"""

from __future__ import annotations

import shlex
import uuid
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from nanoplan.cli import app
from nanoplan.common import examples
from planner.errors import PlanError
from planner.launch import DEFAULT_MAX_RESTARTS

if TYPE_CHECKING:
    from runner.launcher import StopRequests

Opt = typer.Option


@app.command(epilog=examples(
    ("nanoplan run plan.json --dry-run", "print the torchrun command, run nothing"),
    ("nanoplan run plan.json --data data/tiny", "train on a prepared DATA_DIR"),
    ("nanoplan run plan.json --tensorboard", "also log to RUN_DIR/tensorboard (tensorboard --logdir runs)"),
    ("nanoplan run plan.json --node-rank 1 --rdzv-endpoint head:29500", "a second node of a 2-node plan"),
))
def run(
    plan_path: Annotated[str, typer.Argument(metavar="PLAN.json", help="plan.json from nanoplan estimate --out")],
    run_dir: Annotated[Optional[str], Opt(metavar="DIR", help="Checkpoints and metrics go here (default: the plan's run_dir)")] = None,
    data: Annotated[Optional[str], Opt(metavar="DIR", help="DATA_DIR from nanoplan prepare-data (default: the plan's)")] = None,
    dry_run: Annotated[bool, Opt("--dry-run", help="Print the torchrun command and exit")] = False,
    resume: Annotated[bool, Opt("--resume", help="Require a checkpoint in the run dir to resume from")] = False,
    force: Annotated[bool, Opt("--force", help="Launch despite preflight problems or a different plan's checkpoints")] = False,
    nnodes: Annotated[Optional[int], Opt(metavar="N", help="Nodes (default: the plan's)")] = None,
    node_rank: Annotated[int, Opt(metavar="N", help="This node's rank (multi-node)")] = 0,
    rdzv_endpoint: Annotated[Optional[str], Opt(metavar="HOST:PORT", help="HOST:PORT of the c10d rendezvous (multi-node)")] = None,
    max_restarts: Annotated[int, Opt(metavar="N", help="torchrun restarts after a worker crash (each resumes)")] = DEFAULT_MAX_RESTARTS,
    probe: Annotated[bool, Opt("--probe", help="First measure the plan here (nanoplan probe), then run the corrected "
                                               "plan RUN_DIR/plan.probed.json")] = False,
    tensorboard: Annotated[bool, Opt("--tensorboard", help="Also write loss, val loss, tokens/s, MFU, dollars and "
                                                           "memory to RUN_DIR/tensorboard (needs the tensorboard "
                                                           "package)")] = False,
) -> None:
    """Run a plan: DDP training with auto-stop at the budget, timed checkpoints and resume."""
    from runner.clock import boottime, process_start_boottime  # noqa: PLC0415

    t0 = process_start_boottime() or boottime()     # the budget clock of this launch starts here
    stops: StopRequests | None = None
    if not dry_run:
        from runner.launcher import StopRequests  # noqa: PLC0415

        stops = StopRequests()     # a Ctrl-C from now on is never lost (nor a SIGTERM, nor a SIGHUP)
    if tensorboard:
        from runner.tensorboard_log import available  # noqa: PLC0415

        if not available():
            raise PlanError("--tensorboard", "needs the tensorboard package, which is not installed",
                            "pip install 'nanoplan[tensorboard]' (or: pip install tensorboard)")
    try:
        _run(plan_path, run_dir, data, dry_run, resume, force, nnodes, node_rank, rdzv_endpoint, max_restarts,
             probe, t0, stops, tensorboard)
    finally:
        if stops is not None:
            stops.restore()


def _run(plan_path: str, run_dir: str | None, data: str | None, dry_run: bool, resume: bool, force: bool,
         nnodes: int | None, node_rank: int, rdzv_endpoint: str | None, max_restarts: int, probe: bool,
         t0: float, stops: StopRequests | None, tensorboard: bool = False) -> None:
    from planner.build import rederive  # noqa: PLC0415
    from planner.plan import load_plan  # noqa: PLC0415
    from runner.clock import ENV_LAUNCH_ID, ENV_LAUNCH_T0, ENV_TIME_SCALE, _env_float  # noqa: PLC0415
    from runner.launcher import Launch, LaunchWriteError, build_command, launch_env, run_torchrun  # noqa: PLC0415

    plan = load_plan(plan_path)
    if plan.request.trainer.name != "nanoplan":   # planned for another trainer's step (docs/trainers.md)
        name = plan.request.trainer.name
        raise PlanError(plan_path, f"plans {name}'s training step, not nanoplan's runner",
                        f"run it with {name}: nanoplan export {plan_path} --for {name}")
    fresh, stale = rederive(plan, plan_path)
    if stale:
        typer.echo(f"warning: {len(stale)} derived number(s) in {plan_path} differ from a fresh derivation "
                   f"(first: {stale[0]}); `nanoplan validate {plan_path}` lists them", err=True)
        if not fresh.memory.fits and not force:
            raise PlanError(plan_path, "no longer fits in memory when re-derived",
                            "re-plan with nanoplan estimate, or --force")
    nodes = nnodes or plan.hardware.nodes
    if nodes != plan.hardware.nodes and not force:
        raise PlanError("--nnodes", f"{nodes} but the plan is for {plan.hardware.nodes} node(s)", "re-plan, or --force")
    if nodes > 1 and not rdzv_endpoint:
        raise PlanError("--rdzv-endpoint", f"{nodes} nodes need a rendezvous endpoint", "pass --rdzv-endpoint HOST:PORT")
    if max_restarts < 0:
        raise PlanError("--max-restarts", f"must be >= 0, got {max_restarts}")
    if run_dir is None:
        from runner.preflight import check_plan_run_dir  # noqa: PLC0415

        bad = check_plan_run_dir(plan.launch.run_dir)
        if bad:
            raise PlanError(f"{plan_path}: field 'launch.run_dir'", bad, f"pass --run-dir {plan.launch.run_dir} to use it anyway")
    rdir = run_dir or plan.launch.run_dir
    if probe:
        from nanoplan.probe import print_probe  # noqa: PLC0415
        from runner.probe import PROBED_PLAN, probe_for_run  # noqa: PLC0415

        if dry_run:
            typer.echo(f"# --probe: nanoplan probe {plan_path} --out {rdir}/{PROBED_PLAN} --dir {rdir}/probe, then:")
            plan_path = f"{rdir}/{PROBED_PLAN}"
        else:
            probed, res = probe_for_run(plan_path, rdir, data=data, force=force, log=typer.echo)
            if res is not None:
                print_probe(res)
            plan_path, plan = str(probed), load_plan(probed)
    cmd = build_command(plan, plan_path, rdir, nnodes=nodes, node_rank=node_rank, rdzv_endpoint=rdzv_endpoint,
                        max_restarts=max_restarts, data=data, resume=resume, force=force)
    if dry_run:
        typer.echo(("NANOPLAN_TENSORBOARD=1 " if tensorboard else "") + shlex.join(cmd))
        return
    from pathlib import Path  # noqa: PLC0415

    from runner.preflight import run_preflight  # noqa: PLC0415

    pf = run_preflight(plan, plan_path, Path(rdir), data, resume)
    if (hold := _env_float("NANOPLAN_PREFLIGHT_DELAY_S", 0.0)) > 0:   # test hook: a slow preflight
        import time  # noqa: PLC0415

        time.sleep(hold)
    for note in pf.notes:
        typer.echo(f"note: {note}", err=True)
    if pf.problems:
        if not force:      # every problem on its own line, so that one fix does not just reveal the next
            from nanoplan.cli import echo_err  # noqa: PLC0415

            for p in pf.problems:
                echo_err(f"error: preflight: {p}")
            fix = "fix it" if len(pf.problems) == 1 else f"fix these {len(pf.problems)}"
            echo_err(f"hint: {fix}, or pass --force to launch anyway")
            raise typer.Exit(2)
        for p in pf.problems:
            typer.echo(f"warning: preflight: {p} (--force)", err=True)
    from planner.plan import plan_hash  # noqa: PLC0415

    launch_id = uuid.uuid4().hex   # the same in every torchrun restart: they count each other's time
    launch = Launch(Path(rdir), node_rank=node_rank, plan_hash=plan_hash(plan), launch_id=launch_id, t0=t0,
                    scale=_env_float(ENV_TIME_SCALE, 1.0) or 1.0)
    launch.acquire()               # exit 2 if another live process holds the run dir
    try:
        try:
            launch.start()         # persisted before torchrun is spawned
        except LaunchWriteError as e:
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(4) from None
        import sys  # noqa: PLC0415

        from nanoplan.common import output_width, wrap_command  # noqa: PLC0415

        typer.echo(wrap_command("launching: ", cmd, output_width(sys.stderr)), err=True)
        env = launch_env(plan)
        if tensorboard:
            from runner.tensorboard_log import ENV as ENV_TENSORBOARD  # noqa: PLC0415

            env[ENV_TENSORBOARD] = "1"
        env[ENV_LAUNCH_ID] = launch_id
        env[ENV_LAUNCH_T0] = repr(t0)
        rc = run_torchrun(cmd, env, rdir, stops=stops, heartbeat=launch.heartbeat, pass_fds=launch.pass_fds())
        launch.heartbeat("ended")
    finally:
        launch.release()
    if rc:
        raise typer.Exit(rc)
