"""Launch files for real clusters: a SLURM sbatch script and a SkyPilot task YAML (pure Python, no torch).

Both run the same torchrun command as `nanoplan run` (planner.launch.torchrun_command). Only the node
rank and the rendezvous endpoint become the scheduler's variables; `cluster_torchrun_args` builds that
list, so the tests compare the launch files against it argument by argument. A spot job, and any plan
of another trainer (planner/export_node.py), runs `nanoplan run` on every node instead, so that every
launch is counted against the budget and the run resumes by itself.

SkyPilot (issue 30 #9, issue 32 #2): the run dir lives on the bucket mounted with mode MOUNT_CACHED
(rclone with a VFS cache: "All write operations are supported", and the mode SkyPilot documents for
checkpoints; mode MOUNT supports neither the appends to metrics.jsonl nor the in-place rewrites of the
lock files: skypilot docs/source/reference/storage.rst). flock on a mount excludes only processes of one
machine, so node rank 0 claims the run dir for its job first (runner/bucket_claim.py): a second job on
the same bucket path is refused in one line. `resources.max_hourly_cost` (SkyPilot >= 0.12, PR 9132:
only instances at or below that price per node-hour, spot prices for spot) holds SkyPilot to the plan's
price, and a `sky launch` task tears itself down when idle (`resources.autostop: {down: true}`); a
managed job's cluster is torn down by SkyPilot when the job ends (sky/jobs/recovery_strategy.py launches
it with `down=True`).

Hostile input: a string that reaches either file, from the plan or from the command line, must
not hold a control character, nor an invisible bidi or zero-width one (the plan's schema refuses
them; `_printable` refuses them in the CLI's arguments), so no value can start a line of its own or
read as something else. Every value is shlex-quoted where it
lands in the shell script, comments included, and the SkyPilot YAML is emitted by yaml's
SafeDumper (the dumper yaml.safe_dump uses, plus one representer that picks readable literal
blocks for the multi-line setup/run strings where the emitter allows them).
"""

from __future__ import annotations

import math
import posixpath
import re
import shlex

import yaml

from planner.errors import PlanError, control_char, echo
from planner.export_node import TRAINER_DIR, trainer_node
from planner.launch import DEFAULT_MAX_RESTARTS, DEFAULT_RDZV_PORT, torchrun_command, torchrun_env_lines
from planner.plan import Plan

# SkyPilot accelerator names for the built-in profiles (`sky show-gpus` lists them).
SKYPILOT_ACCELERATORS = {
    "H100-SXM": "H100",
    "H100-PCIe": "H100",  # SkyPilot has one H100 name; most clouds serve it as SXM (faster than planned)
    "A100-80GB": "A100-80GB",
    "A100-40GB": "A100",
    "H200": "H200",
    "B200": "B200",
    # `sky show-gpus -a --cloud runpod` lists H100-NVL, RTX3090, RTX4090 and L4; AWS's are L40S (g6e) and A10G (g5)
    "H100-NVL": "H100-NVL",
    "L40S": "L40S",
    "L4": "L4",
    "A10G": "A10G",
    "RTX-3090": "RTX3090",
    "RTX-4090": "RTX4090",
    "RTX-5090": "RTX5090",   # assumption: the same pattern; not seen in a listing
}
TORCH_VERSION = "2.13.0"        # the torch the runner is tested with
CPUS_PER_GPU = 8                # --cpus-per-task = this × GPUs per node; edit for your nodes
CHECKPOINT_WRITE_BYTES_PER_S = 1e9  # assumption: 1 GB/s to a shared filesystem or bucket mount
BASE_GRACE_S = 120              # rendezvous teardown, the step in flight, the meta file
SKYPILOT_MOUNT = "/checkpoints"  # where the bucket is mounted on every SkyPilot node
SKYPILOT_MOUNT_MODE = "MOUNT_CACHED"   # appends and in-place writes supported; MOUNT supports neither
AUTODOWN_IDLE_MINUTES = 5       # SkyPilot's default idle time; then the cluster is torn down, not stopped
RESUME_FLAG = "--resume"        # appended after a SLURM requeue (the runner also resumes by itself)
CHECKPOINT_META_GLOB = "checkpoints/*/meta.json"  # a complete checkpoint (runner/checkpoint.py layout)
MAX_TIME_LIMIT_S = 1e6 * 3600 * 11  # a plan's request.hours is at most 1e6 h; × (1 + the largest margin, 10)

# Placeholders put into torchrun_command, then replaced by the scheduler's shell variables.
_NODE_RANK = "@NANOPLAN_NODE_RANK@"
_ENDPOINT = "@NANOPLAN_RDZV_ENDPOINT@"


def cluster_torchrun_args(plan: Plan, plan_path: str, run_dir: str, node_rank: int | str,
                          rdzv_endpoint: str) -> list[str]:
    """The torchrun command a cluster node runs: `nanoplan run`'s, with this node's rank and endpoint."""
    hw = plan.hardware
    return torchrun_command(plan_path, hw.gpus_per_node, run_dir, nnodes=hw.nodes, node_rank=node_rank,
                            rdzv_endpoint=rdzv_endpoint, max_restarts=DEFAULT_MAX_RESTARTS, python="python")


def nanoplan_run_args(plan: Plan, plan_path: str, run_dir: str, node_rank: int | str, rdzv_endpoint: str) -> list[str]:
    """What a node of a spot job, or of any plan of another trainer, runs: `nanoplan run`, so that every launch,
    a preempted one included, is counted against the budget (runner/ledger.py), and the run resumes from the
    run dir's newest checkpoint. A nanochat plan adds `--trainer-dir` (a placeholder for "$NANOCHAT_DIR")."""
    cmd = ["python", "-m", "nanoplan", "run", plan_path, "--run-dir", run_dir]
    node = trainer_node(plan)
    if node is not None:
        cmd += node.run_args()
    if plan.hardware.nodes > 1:
        cmd += ["--node-rank", str(node_rank), "--rdzv-endpoint", rdzv_endpoint]
    return cmd


def runs_nanoplan_run(plan: Plan, spot: bool) -> bool:
    """Whether a node runs `nanoplan run` (a spot job, or another trainer's plan) rather than torchrun directly."""
    return spot or trainer_node(plan) is not None


def _check_spot(plan: Plan, spot: bool) -> None:
    """A spot plan's cap is priced at the spot price: on demand it would overspend; an on-demand plan's steps and
    hourly checkpoints assume no interruptions."""
    if plan.spot is not None and not spot:
        raise PlanError("--spot", f"the plan is priced for spot GPUs ({plan.spot.provider}); on demand its budget "
                        "would buy fewer hours than it runs", "add --spot, or re-plan without --spot")
    if spot and plan.spot is None:
        raise PlanError("--spot", "the plan is for on-demand GPUs: its steps and hourly checkpoints assume no "
                        "interruptions", "re-plan with nanoplan estimate ... --spot --out plan.json")


def _slurm_resume(rd: str, spot: bool) -> list[str]:
    return ["# After a requeue, resume from the run dir's latest checkpoint. The runner finds it by itself too;",
            f"# {RESUME_FLAG} is passed only when one exists, because it refuses to start without one.",
            *_resume_lines(rd, "" if spot else '[ "${SLURM_RESTART_COUNT:-0}" -gt 0 ] && ')]


def data_problem(plan: Plan) -> str | None:
    """Why a nanoplan plan's job would find no data on its node (None for another trainer's plan: it reads
    its own): no data directory at all, or one outside the launch directory."""
    if trainer_node(plan) is not None:
        return None
    d = plan.request.data_dir
    if not d:
        return ("the plan has no data directory, so the job would find nothing to train on and stop on its node, "
                "after paying for its start-up")
    p = posixpath.normpath(d.replace("\\", "/"))
    if posixpath.isabs(p) or p.startswith(".."):
        return (f"the plan's data directory {echo(d, 120)} is outside the launch directory: it must exist at that "
                "path on every node (mount it), or be moved inside")
    return None


def check_data(plan: Plan, spot: bool) -> None:
    """A spot job without data is refused: unattended, it would pay for its start-up and stop at the preflight
    (and SkyPilot would relaunch a preempted one into the same stop). Other exports warn (nanoplan/export.py)."""
    if spot and trainer_node(plan) is None and not plan.request.data_dir:
        raise PlanError("--spot", data_problem(plan) or "", "plan with --data DATA_DIR (nanoplan prepare-data): a "
                        "folder inside the directory you launch from, which SkyPilot uploads with the workdir (or, "
                        "for SLURM, on the shared filesystem)")


def _resume_lines(rd: str, when: str = "") -> list[str]:
    """Set NANOPLAN_RESUME to --resume when the run dir holds a complete checkpoint (`when`: a further test)."""
    return [f"RUN_DIR={shlex.quote(rd)}",
            'NANOPLAN_RESUME=""',
            f'if {when}compgen -G "$RUN_DIR/{CHECKPOINT_META_GLOB}" >/dev/null; then',
            f'    NANOPLAN_RESUME="{RESUME_FLAG}"',
            "fi"]


VALUE_FLAGS = ("-m", "--plan", "--run-dir", "--node-rank", "--rdzv-endpoint", "--trainer-dir")   # take a value


def _shell_lines(plan: Plan, plan_path: str, run_dir: str, node_rank_var: str, endpoint_var: str,
                 spot: bool = False) -> list[str]:
    """The command, one shell word per line; the rank, endpoint and trainer dir expand from shell variables."""
    words = []
    use_run = runs_nanoplan_run(plan, spot)
    args = (nanoplan_run_args if use_run else cluster_torchrun_args)(plan, plan_path, run_dir, _NODE_RANK, _ENDPOINT)
    node = trainer_node(plan)
    for arg in args:
        q = shlex.quote(arg)  # the placeholders hold only characters shlex leaves bare
        q = q.replace(TRAINER_DIR, node.placeholder() if node else "")
        words.append(q.replace(_NODE_RANK, f'"${node_rank_var}"').replace(_ENDPOINT, f'"{endpoint_var}"'))
    # Keep "--plan PATH" style pairs on one line: a flag this module writes with a separate value, and that value
    # (whatever it looks like: a run dir named "-x" is still the value).
    lines: list[str] = []
    i = 0
    while i < len(words):
        w = words[i]
        if w in VALUE_FLAGS and i + 1 < len(words):
            lines.append(f"{w} {words[i + 1]}")
            i += 2
        else:
            lines.append(w)
            i += 1
    if len(lines) > 1 and lines[1].startswith("-m "):  # "python -m torch.distributed.run" on one line
        lines[:2] = [f"{lines[0]} {lines[1]}"]
    if use_run:                                         # "python -m nanoplan run PLAN" on one line
        lines[:3] = [" ".join(lines[:3])]
    return lines


def _printable(field: str, value: str | None) -> None:
    """Refuse a control character (newline, CR, NUL, escape, ...) or an invisible one (bidi override, zero-width
    space, ...: planner.errors.INVISIBLE) in a value written into a launch file."""
    if value is not None and (hit := control_char(value)):
        raise PlanError(field, f"holds a control character ({hit[1]} at index {hit[0]}): {echo(value, 120)}",
                        "give a printable path or name")


def _q(value: object) -> str:
    """A value as one shell word (for comments too: a path with spaces stays one readable word)."""
    return shlex.quote(str(value))


def _job_name(plan: Plan) -> str:
    """nanoplan-MODEL with anything but letters, digits, '.', '_' and '-' replaced (SLURM/SkyPilot names)."""
    return "nanoplan-" + (re.sub(r"[^A-Za-z0-9._-]", "_", plan.model.name)[:60] or "model")


def _check_gpu_plan(plan: Plan, target: str) -> None:
    if plan.request.profile.kind != "gpu":
        raise PlanError("plan", f"is for {plan.hardware.spec}, a CPU plan; {target} export requests GPUs",
                        "make a GPU plan, e.g. nanoplan estimate --gpu 2x8xH100 ... --out plan.json")


def check_exportable(plan: Plan, plan_path: str) -> None:
    """Refuse (one-line PlanError, exit 2) a plan that `nanoplan validate` finds stale or edited (every number
    re-derived from its request, planner/validate.py), or whose budget is shorter than one step: an export
    writes the plan's nodes and hours into a job that takes them as they are."""
    from planner.validate import check_plan

    check = check_plan(plan, plan_path, headroom=plan.request.headroom)
    if not check.consistent:
        more = f" (and {len(check.problems) - 1} more)" if len(check.problems) > 1 else ""
        raise PlanError(plan_path, f"{check.problems[0]}{more}",
                        "regenerate it with nanoplan estimate --out; nanoplan validate lists every difference")
    if plan.budget.hours * 3600 < plan.throughput.step_seconds:
        raise PlanError(f"{plan_path}: field 'budget.hours'",
                        f"{plan.budget.hours:.3g} h is shorter than one step ({plan.throughput.step_seconds:.3g} s); "
                        "nothing would train", "plan a longer run: nanoplan estimate --hours H or --budget USD")


def _margin(time_margin: float) -> float:
    if not (math.isfinite(time_margin) and 0 <= time_margin <= 10):
        raise PlanError("--time-margin", f"must be a fraction between 0 and 10, got {time_margin}",
                        "e.g. 0.1 for 10% on top of the plan's hours")
    return time_margin


def time_limit_seconds(plan: Plan, time_margin: float) -> int:
    """The plan's hours plus the margin, rounded up to a whole minute."""
    minutes = plan.budget.hours * (1 + _margin(time_margin)) * 60
    if not minutes <= MAX_TIME_LIMIT_S / 60:
        raise PlanError("budget.hours", f"{plan.budget.hours:.3g} h is more than SLURM can be asked for",
                        "regenerate the plan with nanoplan estimate --out")
    return max(60, math.ceil(minutes) * 60)


def format_slurm_time(seconds: int) -> str:
    """SLURM's D-HH:MM:SS."""
    d, rest = divmod(int(seconds), 86400)
    h, rest = divmod(rest, 3600)
    m, s = divmod(rest, 60)
    return f"{d}-{h:02d}:{m:02d}:{s:02d}"


def grace_seconds(plan: Plan) -> int:
    """Time to finish the step in flight and write a checkpoint (at an assumed 1 GB/s), whole minutes."""
    need = BASE_GRACE_S + 2 * plan.throughput.step_seconds + plan.schedule.checkpoint_bytes / CHECKPOINT_WRITE_BYTES_PER_S
    return min(65_535, math.ceil(need / 60) * 60)


def _under(base: str, run_dir: str) -> str:
    """The plan's run dir placed under a shared directory or mount point."""
    rel = posixpath.normpath(run_dir.replace("\\", "/")).lstrip("/")
    if rel in ("", ".") or rel.startswith(".."):
        rel = posixpath.basename(posixpath.normpath(run_dir)) or "run"
    return posixpath.join(base.rstrip("/") or "/", rel)


def _summary(plan: Plan) -> str:
    b, s = plan.budget, plan.schedule
    return (f"{_q(plan.model.name)} ({plan.model.n_params:,} params) on {_q(plan.hardware.spec)}: "
            f"{b.hours:.2f} h, {s.total_steps:,} steps, {s.total_tokens:,} tokens, ${b.usd:,.2f}")


def slurm_script(plan: Plan, plan_path: str, *, run_dir: str | None = None, time_margin: float = 0.1,
                 partition: str | None = None, account: str | None = None, command: str = "",
                 spot: bool = False) -> str:
    """An sbatch script: one torchrun agent per node, c10d rendezvous on the first node, requeue on preemption.
    `spot`: each node runs `nanoplan run` (every launch counted) and resumes whenever a checkpoint exists."""
    for field, value in (("PLAN", plan_path), ("--bucket", run_dir), ("--partition", partition),
                         ("--account", account), ("command", command)):
        _printable(field, value)
    _check_gpu_plan(plan, "SLURM")
    _check_spot(plan, spot)
    check_data(plan, spot)
    node = trainer_node(plan)
    if run_dir is not None and "://" in run_dir:
        raise PlanError("--bucket", f"{echo(run_dir, 120)} is a URL; SLURM nodes need a shared filesystem path",
                        "give a directory all nodes see, e.g. --bucket /scratch/$USER/nanoplan")
    hw = plan.hardware
    rd = _under(run_dir, plan.launch.run_dir) if run_dir else plan.launch.run_dir
    limit = time_limit_seconds(plan, time_margin)
    lead = min(grace_seconds(plan), limit // 2)
    shutdown = max(10, lead - 30)
    multi = hw.nodes > 1
    name = _job_name(plan)
    for field, value in (("--partition", partition), ("--account", account)):
        if value is not None and (not value or shlex.quote(value) != value):
            raise PlanError(field, f"must be one plain word (letters, digits, @%+=:,./-_), got {echo(value, 120)}",
                            "give the name sbatch knows")
    sb = [
        f"--job-name={name}",
        f"--nodes={hw.nodes}",
        "--ntasks-per-node=1",
        f"--gpus-per-node={hw.gpus_per_node}",
        f"--cpus-per-task={CPUS_PER_GPU * hw.gpus_per_node}",
        f"--time={format_slurm_time(limit)}",
        "--requeue",
        f"--signal=B:USR1@{lead}",
        "--output=%x-%j.out",
        "--open-mode=append",
    ]
    if hw.gpus_per_node == plan.request.profile.gpus_per_node:
        sb.append("--exclusive")
    if partition:
        sb.append(f"--partition={partition}")
    if account:
        sb.append(f"--account={account}")

    lines = ["#!/bin/bash",
             f"# nanoplan: {_summary(plan)}",
             f"# Generated by: {command or 'nanoplan export PLAN --slurm'}",
             f"# Submit where {_q(plan_path)} and {_q(rd)} resolve (relative paths start at the submit directory;",
             "# every node must see both, so use a shared filesystem):",
             "#     sbatch job.sbatch",
             f"# Time limit: the plan's {plan.budget.hours:.2f} h + {time_margin:.0%} margin. The runner stops itself at the",
             "# plan's budget; if the limit comes first, this script makes it checkpoint, then requeues the job.",
             "# One task per node: each runs a torchrun agent that starts the node's workers.",
             f"# --cpus-per-task assumes {CPUS_PER_GPU} cores per GPU; --gpus-per-node may need a type on your site"]
    if not partition:
        lines.append("# (add --partition=NAME / --account=NAME with nanoplan export, or below)")
    lines += [f"#SBATCH {x}" for x in sb]
    lines += [
        "",
        "set -uo pipefail  # no -e: the requeue logic below must run even when the step fails",
        "",
        "# Activate the environment that has nanoplan and a CUDA build of torch, for example:",
        "#   source .venv/bin/activate",
        "",
    ]
    if multi:
        lines += [
            "# c10d rendezvous on the first node of the allocation.",
            'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)',
            f"MASTER_PORT={DEFAULT_RDZV_PORT}",
            "export MASTER_ADDR MASTER_PORT",
            "",
        ]
    lines += [
        "# On SIGTERM, torchrun gives its workers this long to write their checkpoint before SIGKILL.",
        f"export TORCH_ELASTIC_SHUTDOWN_TIMEOUT={shutdown}",
        "",
        *([] if runs_nanoplan_run(plan, spot) else [*torchrun_env_lines(rd), ""]),
        *(_slurm_resume(rd, spot) if node is None else
          [*node.slurm_check(), "# nanoplan run resumes the trainer from its newest complete checkpoint by itself.",
           'NANOPLAN_RESUME=""']),
        "export NANOPLAN_RESUME",
        "",
        f"# USR1 comes {lead} s before the time limit (--signal): SIGTERM the job step so the runner",
        "# checkpoints and exits, then requeue. (srun itself must not get SIGTERM: it would SIGKILL the tasks.)",
        "NANOPLAN_REQUEUE=0",
        "on_time_limit() {",
        '    echo "nanoplan: time limit near; asking the runner to checkpoint, then requeueing" >&2',
        "    NANOPLAN_REQUEUE=1",
        '    scancel --signal=TERM "$SLURM_JOB_ID"',
        "}",
        "# Preemption and scancel send SIGTERM to the step too: the runner checkpoints; SLURM decides on requeue.",
        "on_term() {",
        '    echo "nanoplan: SIGTERM; the runner checkpoints and exits" >&2',
        "}",
        "trap on_time_limit USR1",
        "trap on_term TERM",
        "",
        ("# nanoplan run on every node (each launch is counted against the budget, runner/ledger.py);"
         if runs_nanoplan_run(plan, spot) else "# The same torchrun command as `nanoplan run --dry-run`; bash -c "
         "expands the node rank on each node."),
        "# (Since Slurm 22.05 srun does not inherit --cpus-per-task from sbatch, so it is passed again.)",
        "srun --kill-on-bad-exit=1 --cpus-per-task=\"$SLURM_CPUS_PER_TASK\" bash -c " + _single_quote_block(
            _shell_lines(plan, plan_path, rd, "SLURM_NODEID", "$MASTER_ADDR:$MASTER_PORT", spot),
            prefix="exec ", tail=" $NANOPLAN_RESUME") + " &",
        "STEP_PID=$!",
        "",
        "# A trapped signal interrupts `wait`; keep waiting until the step has exited.",
        "while :; do",
        '    wait "$STEP_PID"',
        "    STATUS=$?",
        '    kill -0 "$STEP_PID" 2>/dev/null || break',
        "done",
        'if [ "$NANOPLAN_REQUEUE" = 1 ]; then',
        '    scontrol requeue "$SLURM_JOB_ID"',
        "fi",
        'exit "$STATUS"',
    ]
    return "\n".join(lines) + "\n"


def _single_quote_block(lines: list[str], prefix: str, tail: str) -> str:
    """A multi-line command as one single-quoted bash -c argument, with line continuations."""
    body = prefix + " \\\n    ".join(lines) + tail
    return "'\n" + body.replace("'", "'\"'\"'") + "'"


def _literal_str(dumper: yaml.SafeDumper, data: str) -> yaml.Node:
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


class _BlockDumper(yaml.SafeDumper):
    """SafeDumper that writes multi-line strings (setup, run) as readable literal blocks."""


_BlockDumper.add_representer(str, _literal_str)


class _Quoted(str):
    """A value from the command line, written double-quoted (a bucket URL in file_mounts' `source:`)."""


_BlockDumper.add_representer(_Quoted, lambda d, data: d.represent_scalar("tag:yaml.org,2002:str", str(data), style='"'))


def _skypilot_plan_path(plan_path: str) -> str:
    p = posixpath.normpath(plan_path.replace("\\", "/"))
    if posixpath.isabs(p) or p.startswith(".."):
        raise PlanError("PLAN", f"{echo(plan_path, 120)} is outside the launch directory, which SkyPilot syncs as workdir",
                        "copy the plan into the directory you run `sky launch` from and give a relative path")
    return p


def skypilot_task(plan: Plan, plan_path: str, *, bucket: str | None, command: str = "", spot: bool = False) -> str:
    """A SkyPilot task YAML: accelerators and nodes from the plan, the run dir on a mounted bucket. `spot`: a
    managed job on spot instances (`sky jobs launch`) whose nodes run `nanoplan run` and resume from the newest
    checkpoint in the bucket after each preemption."""
    for field, value in (("PLAN", plan_path), ("--bucket", bucket), ("command", command)):
        _printable(field, value)
    _check_gpu_plan(plan, "SkyPilot")
    _check_spot(plan, spot)
    check_data(plan, spot)
    if not bucket:
        raise PlanError("--bucket", "SkyPilot needs a bucket for the run dir, or the checkpoints vanish with the VMs",
                        "give --bucket s3://BUCKET/PATH (or gs://, r2://, ...)")
    if "://" not in bucket:
        raise PlanError("--bucket", f"{echo(bucket, 120)} is not a bucket URL", "give e.g. s3://BUCKET/PATH or gs://BUCKET/PATH")
    hw = plan.hardware
    prof = hw.profile_name
    acc = SKYPILOT_ACCELERATORS.get(prof, prof)
    path = _skypilot_plan_path(plan_path)
    rd = _under(SKYPILOT_MOUNT, plan.launch.run_dir)
    lead = grace_seconds(plan)
    multi = hw.nodes > 1
    run = [
        "set -euo pipefail",
        f"# The plan's batch and schedule assume {hw.nodes} node(s) x {hw.gpus_per_node} GPUs: refuse anything else.",
        f'if [ "$SKYPILOT_NUM_NODES" != {hw.nodes} ] || [ "$SKYPILOT_NUM_GPUS_PER_NODE" != {hw.gpus_per_node} ]; then',
        f'  echo "nanoplan: the plan needs {hw.nodes} node(s) x {hw.gpus_per_node} GPUs,'
        ' got $SKYPILOT_NUM_NODES x $SKYPILOT_NUM_GPUS_PER_NODE" >&2',
        "  exit 1",
        "fi",
    ]
    if multi:
        run += ["# c10d rendezvous on the head node: the first line of SKYPILOT_NODE_IPS.",
                'MASTER_ADDR=$(echo "$SKYPILOT_NODE_IPS" | head -n1)',
                "export MASTER_ADDR"]
    node = trainer_node(plan)
    run += ["# One job per run dir: the bucket is shared by every machine that mounts it, and the run dir's locks",
            "# exclude only processes of one machine (runner/bucket_claim.py; SKYPILOT_TASK_ID is the same in every",
            "# recovery of a managed job).",
            'if [ "$SKYPILOT_NODE_RANK" = 0 ]; then',
            f'  python -m runner.bucket_claim {shlex.quote(rd)} --job "$SKYPILOT_TASK_ID"',
            "fi"]
    if node is not None:
        run += [*node.dir_var("$HOME/" + node.name),
                f"# {node.name} under nanoplan run: its budget clock and launch ledger stop it before the money runs "
                "out, and a",
                "# relaunch (after a preemption) resumes it from its newest complete checkpoint (docs/trainers.md).",
                "exec " + " \\\n  ".join(_shell_lines(plan, path, rd, "SKYPILOT_NODE_RANK", "$MASTER_ADDR:$MASTER_PORT"))]
    elif spot:
        run += ["# After a preemption SkyPilot relaunches the job: resume from the newest checkpoint in the bucket.",
                *_resume_lines(rd),
                "# nanoplan run counts every launch against the budget (runner/ledger.py) and stops before it.",
                "exec " + " \\\n  ".join(_shell_lines(plan, path, rd, "SKYPILOT_NODE_RANK", "$MASTER_ADDR:$MASTER_PORT",
                                                     spot=True)) + " $NANOPLAN_RESUME"]
    else:
        run += [*torchrun_env_lines(rd),
                "# The same torchrun command as `nanoplan run --dry-run`. The run dir is on the bucket, so a",
                "# recovered job (sky jobs launch) resumes from its latest checkpoint by itself.",
                "exec " + " \\\n  ".join(_shell_lines(plan, path, rd, "SKYPILOT_NODE_RANK", "$MASTER_ADDR:$MASTER_PORT"))]
    setup = [
        "set -euo pipefail",
        "# Install the CUDA build of torch your nodes need, pinned, before nanoplan (the PyPI Linux",
        f"# wheel of torch {TORCH_VERSION} is a CUDA build; use --index-url for another CUDA version).",
        f'pip install "torch=={TORCH_VERSION}"',
        "# The workdir is a nanoplan checkout: install it; otherwise install the released package.",
        "if [ -f pyproject.toml ]; then pip install -e .; else pip install nanoplan; fi",
        *(node.skypilot_setup(plan) if node is not None else []),
    ]
    node_usd = hw.gpus_per_node * hw.usd_per_gpu_hour
    resources: dict[str, object] = {"accelerators": f"{acc}:{hw.gpus_per_node}", **({"use_spot": True} if spot else {})}
    if node_usd > 0:      # SkyPilot refuses 0: a plan priced at $0 (your own machine) sets no cap
        resources["max_hourly_cost"] = math.ceil(node_usd * 100) / 100
    if not spot:          # a managed job's cluster is torn down by SkyPilot when the job ends
        resources["autostop"] = {"idle_minutes": AUTODOWN_IDLE_MINUTES, "down": True}
    task = {
        "name": _job_name(plan),
        "workdir": ".",
        "num_nodes": hw.nodes,
        "resources": resources,
        "envs": {"MASTER_PORT": str(DEFAULT_RDZV_PORT),
                 "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": str(max(10, lead - 30))},
        "file_mounts": {SKYPILOT_MOUNT: {"source": _Quoted(bucket), "mode": SKYPILOT_MOUNT_MODE}},
        "setup": "\n".join(setup) + "\n",
        "run": "\n".join(run) + "\n",
    }
    head = [f"# nanoplan: {_summary(plan)}",
            f"# Generated by: {command or 'nanoplan export PLAN --skypilot'}",
            f"# Launch from the directory that {_q(path)} is relative to; it is synced to the nodes as the workdir:",
            ("#     sky jobs launch -n nanoplan task.yaml     (a managed job on spot instances: after a preemption"
             "\n#     SkyPilot relaunches it and the run resumes from its newest checkpoint)" if spot else
             "#     sky launch -c nanoplan task.yaml     (or `sky jobs launch task.yaml` to recover from preemption)"),
            f"# Run dir and checkpoints: {_q(rd)}, where {SKYPILOT_MOUNT} is {_q(bucket)} mounted (mode "
            f"{SKYPILOT_MOUNT_MODE}:",
            "# rclone with a local cache; appends and in-place writes work, files upload when closed)."]
    if node_usd > 0:
        head.append(f"# max_hourly_cost: the plan's price per node-hour (${node_usd:,.2f}); SkyPilot skips pricier "
                    "instances (re-plan with --price if none is found).")
    if not spot:
        head.append(f"# autostop down: the cluster is torn down {AUTODOWN_IDLE_MINUTES} min after the run ends, so a "
                    "stopped run stops billing.")
    if acc != prof:
        head.append(f"# accelerators: profile {_q(prof)} -> SkyPilot {_q(acc)}.")
    if prof == "H100-PCIe":
        head.append("# SkyPilot's H100 is usually SXM, which is faster than this PCIe plan assumed.")
    if prof not in SKYPILOT_ACCELERATORS:
        head.append(f"# {_q(prof)} is a custom profile: check its name with `sky show-gpus`.")
    if plan.request.data_dir:
        head.append(f"# Data: {_q(plan.request.data_dir)} must exist on every node (inside the workdir, or mount it).")
    return "\n".join(head) + "\n" + yaml.dump(task, Dumper=_BlockDumper, sort_keys=False, default_flow_style=False,
                                              width=1000, allow_unicode=True)
