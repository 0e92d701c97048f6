"""`nanoplan run PLAN.json`: re-validate the plan, preflight, then run it with torchrun.

Before anything is spawned: a spent budget ends the command at once (`nothing to do`, exit 0;
read-only, before the preflight), the run dir is locked (a second launch: exit 2), links among its
managed paths are refused (exit 2), and the launch is recorded in RUN_DIR/launches.json (exit 4 if
it cannot be). With --probe the probe runs after all of these, so it is locked, recorded and
charged once (by the launch's clock), then the probed plan is preflighted and run.

Nothing here imports torch at import time; the preflight imports it only to count GPUs.
"""

from __future__ import annotations

import os
import shlex
import uuid
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from nanoplan.cli import app
from nanoplan.common import at_least, check_rederived, check_run_args, examples, record_launch
from planner.errors import PlanError
from planner.launch import DEFAULT_MAX_RESTARTS

if TYPE_CHECKING:
    from pathlib import Path

    from planner.plan import Plan
    from runner.launcher import Launch, StopRequests

Opt = typer.Option


@app.command(epilog=examples(
    ("nanoplan run plan.json --dry-run", "print the torchrun command, run nothing"),
    ("nanoplan run plan.json --data data/tiny", "train on a prepared DATA_DIR"),
    ("nanoplan run plan.json --node-rank 1 --rdzv-endpoint head:29500", "a second node of a 2-node plan"),
    ("nanoplan run nanochat.json --trainer-dir ~/nanochat", "a nanochat plan, supervised under its budget"),
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
    max_restarts: Annotated[int, Opt(metavar="N", help="Restarts after a crash, each resuming (torchrun's; another trainer's: relaunches)")] = DEFAULT_MAX_RESTARTS,
    probe: Annotated[bool, Opt("--probe", help="First measure the plan here (nanoplan probe), then run the corrected "
                                               "plan RUN_DIR/plan.probed.json")] = False,
    tensorboard: Annotated[bool, Opt("--tensorboard", help="Also write loss, val loss, tokens/s, MFU, dollars and "
                                                           "memory to RUN_DIR/tensorboard (needs the tensorboard "
                                                           "package)")] = False,
    trainer_dir: Annotated[Optional[str], Opt(metavar="DIR", help="A plan for another trainer: where it runs (nanochat: "
                                                                  "its checkout; DeepSpeed: your train.py's directory; "
                                                                  "default: the current directory)")] = None,
) -> None:
    """Run a plan: DDP training with auto-stop at the budget, timed checkpoints and resume.

    A plan made for nanochat, torchtitan or DeepSpeed (estimate --trainer) runs that trainer under the same
    budget: its save cadence and step count are set so that its last save lands before the deadline, and a
    relaunch resumes from its newest complete checkpoint (docs/trainers.md)."""
    at_least(("--nnodes", nnodes, 1), ("--node-rank", node_rank, 0))
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
             probe, t0, stops, tensorboard, trainer_dir)
    finally:
        if stops is not None:
            stops.restore()


def _run(plan_path: str, run_dir: str | None, data: str | None, dry_run: bool, resume: bool, force: bool,
         nnodes: int | None, node_rank: int, rdzv_endpoint: str | None, max_restarts: int, probe: bool,
         t0: float, stops: StopRequests | None, tensorboard: bool = False, trainer_dir: str | None = None) -> None:
    from planner.plan import load_plan  # noqa: PLC0415
    from runner.clock import ENV_LAUNCH_ID, ENV_LAUNCH_PID, ENV_LAUNCH_T0, ENV_TIME_SCALE, _env_float  # noqa: PLC0415
    from runner.launcher import Launch, LaunchWriteError, build_command, launch_env, run_torchrun  # noqa: PLC0415

    plan = load_plan(plan_path)
    if plan.request.trainer.name != "nanoplan":   # planned for another trainer's step: supervise it (docs/trainers.md)
        from nanoplan.run_trainer import run_trainer  # noqa: PLC0415

        run_trainer(plan, plan_path, run_dir, trainer_dir=trainer_dir, data=data, dry_run=dry_run, resume=resume,
                    force=force, nnodes=nnodes, node_rank=node_rank, rdzv_endpoint=rdzv_endpoint, probe=probe,
                    max_restarts=max_restarts, tensorboard=tensorboard, t0=t0, stops=stops)
        return
    if trainer_dir is not None:
        raise PlanError("--trainer-dir", f"{plan_path} is a plan for nanoplan's own runner", "drop --trainer-dir")
    if not dry_run:
        from nanoplan.extras import require  # noqa: PLC0415

        require("torch", "run")    # torchrun's own interpreter would only say "Error while finding module specification"
    from planner.parallelism import RUNNER_HINT, runner_problem  # noqa: PLC0415

    if (no_run := runner_problem(plan.request)) is not None:     # hsdp or tensor parallelism: planned, not run
        raise PlanError(plan_path, no_run, RUNNER_HINT)
    check_rederived(plan, plan_path, force)
    nodes = nnodes or plan.hardware.nodes
    if nodes != plan.hardware.nodes and not force:
        raise PlanError("--nnodes", f"{nodes} but the plan is for {plan.hardware.nodes} node(s)", "re-plan, or --force")
    if nodes > 1 and not rdzv_endpoint:
        raise PlanError("--rdzv-endpoint", f"{nodes} nodes need a rendezvous endpoint", "pass --rdzv-endpoint HOST:PORT")
    check_run_args(plan, plan_path, run_dir, max_restarts)
    rdir = run_dir or plan.launch.run_dir
    if dry_run:
        if probe:
            from runner.probe import PROBED_PLAN  # noqa: PLC0415

            typer.echo(f"# --probe: nanoplan probe {plan_path} --out {rdir}/{PROBED_PLAN} --dir {rdir}/probe, then:")
            plan_path = f"{rdir}/{PROBED_PLAN}"
        typer.echo(("NANOPLAN_TENSORBOARD=1 " if tensorboard else "") + shlex.join(build_command(plan, plan_path, rdir, nnodes=nodes, node_rank=node_rank,
                                            rdzv_endpoint=rdzv_endpoint, max_restarts=max_restarts, data=data,
                                            resume=resume, force=force)))
        return
    from pathlib import Path  # noqa: PLC0415

    from planner.plan import budget_key, plan_hash  # noqa: PLC0415
    from runner.ledger import spent_before_s  # noqa: PLC0415
    from runner.preflight import check_run_dir_contained  # noqa: PLC0415

    rpath, source = Path(rdir), plan_hash(plan)
    launch = Launch(rpath, node_rank=node_rank, plan_hash=source, launch_id=uuid.uuid4().hex, t0=t0,
                    scale=_env_float(ENV_TIME_SCALE, 1.0) or 1.0,   # one id, the same in every torchrun restart
                    budget_key=budget_key(plan))                  # a changed cadence is the same run (issue 30 #2)
    if not probe:
        quick = rpath.is_dir() and not check_run_dir_contained(rpath) and spent_before_s(
            rpath, source, metrics=False, key=launch.budget_key)
        if quick and _done(rpath, plan, quick, launch):
            return                 # a spent run: one line, before the preflight (read-only, no lock, no link)
        _preflight(plan, plan_path, rpath, data, resume, force)
    with launch.held(stops):       # exit 2 if another live process holds the run dir (before any --probe trial)
        bad = check_run_dir_contained(rpath)     # never through a link, whatever --force says
        if bad:
            raise PlanError("preflight", bad, "remove the link, or pass the real directory as --run-dir")
        also: tuple[str, ...] = ()
        resumable = None
        if probe:
            from runner.probe import probed_plan_to_resume  # noqa: PLC0415

            resumable = probed_plan_to_resume(rpath)
            if resumable is not None:
                plan_path, plan, also = str(resumable), load_plan(resumable), (source,)
                launch.plan_hash, launch.budget_key = plan_hash(plan), budget_key(plan)
        carried = launch.carried_s(also)
        if _done(rpath, plan, carried, launch, also):
            return
        record_launch(launch, source_hash=source, also=also, carried_s=carried)   # before anything is spawned
        if probe:
            plan_path, plan = _probe(plan_path, plan, rdir, data, force, launch, resumable)
            _preflight(plan, plan_path, rpath, data, resume, force)
        cmd = build_command(plan, plan_path, rdir, nnodes=nodes, node_rank=node_rank, rdzv_endpoint=rdzv_endpoint,
                            max_restarts=max_restarts, data=data, resume=resume, force=force)
        import sys  # noqa: PLC0415

        from nanoplan.common import output_width, wrap_command  # noqa: PLC0415

        typer.echo(wrap_command("launching: ", cmd, output_width(sys.stderr)), err=True)
        env = launch_env(plan, run_dir=rdir)
        if tensorboard:
            from runner.tensorboard_log import ENV as ENV_TENSORBOARD  # noqa: PLC0415

            env[ENV_TENSORBOARD] = "1"
        env[ENV_LAUNCH_ID] = launch.id
        env[ENV_LAUNCH_T0] = repr(t0)
        env[ENV_LAUNCH_PID] = str(os.getpid())
        try:
            rc = run_torchrun(cmd, env, rdir, stops=stops, pass_fds=launch.pass_fds(), node_rank=node_rank)
        except LaunchWriteError as e:
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(4) from None
    if rc:
        raise typer.Exit(rc)


def _done(rpath: Path, plan: Plan, carried: float, launch: Launch, also: tuple[str, ...] = ()) -> bool:
    """True (after one line) when this launch would train nothing because its budget is spent (runner.ledger)."""
    from runner.ledger import nothing_to_do  # noqa: PLC0415

    why = nothing_to_do(rpath, plan, carried, launch.spent_s(), also)
    if why:
        typer.echo(f"nothing to do: {why}; nothing was started", err=True)
    return why is not None


def _probe(plan_path: str, plan: Plan, rdir: str, data: str | None, force: bool, launch: Launch,
           resumable: Path | None) -> tuple[str, Plan]:
    """`--probe`: the probed plan to run (a new probe unless RUN_DIR holds checkpoints of one); exit 4 on a failed write."""
    from planner.plan import budget_key, load_plan, plan_hash  # noqa: PLC0415

    if resumable is not None:
        typer.echo(f"probe: {rdir} holds checkpoints of {resumable}; resuming it without a new probe")
        return str(resumable), plan
    from nanoplan.probe import print_probe  # noqa: PLC0415
    from runner.probe import ProbeWriteError, probe_for_run  # noqa: PLC0415

    try:
        probed, res = probe_for_run(plan_path, rdir, data=data, force=force, log=typer.echo)
    except ProbeWriteError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(4) from None
    if res is not None:
        print_probe(res)
    new = load_plan(probed)
    launch.ran_plan(plan_hash(new), budget_key(new))
    return str(probed), new


def _preflight(plan: Plan, plan_path: str, rpath: Path, data: str | None, resume: bool, force: bool) -> None:
    """The preflight's notes, and its problems: PlanError (exit 2) unless --force."""
    from runner.clock import _env_float  # noqa: PLC0415
    from runner.preflight import run_preflight  # noqa: PLC0415

    pf = run_preflight(plan, plan_path, rpath, data, resume)
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
