"""`nanoplan export`: sbatch scripts and SkyPilot task YAMLs that run `nanoplan run`'s torchrun command.

The scripts are executed for real under bash, with stub `srun`, `scontrol`, `scancel` and `python`
programs on PATH: the stub python records the argv it was started with, which must equal
planner.launch.torchrun_command for the plan with the scheduler's node rank and rendezvous filled in.
"""

from __future__ import annotations

import math
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from planner.build import build_plan
from planner.export import (
    SKYPILOT_ACCELERATORS,
    cluster_torchrun_args,
    format_slurm_time,
    grace_seconds,
    skypilot_task,
    slurm_script,
)
from planner.launch import torchrun_command
from planner.plan import Plan, PlanRequest, load_plan, save_plan
from planner.profiles import find_profile
from planner.spec import nanochat
from tests.conftest import nanoplan_cli
from tests.errlines import error_and_hint

REPO = Path(__file__).resolve().parents[1]
BUCKET = "s3://my-bucket/nanoplan"


def make_plan(gpu: str = "2x8xH100", depth: int = 20, hours: float = 10.0) -> Plan:
    name = gpu.split("x")[-1]
    return build_plan(PlanRequest(gpu=gpu, profile=find_profile(name), model=nanochat(depth), hours=hours))


@pytest.fixture(scope="module")
def plan_dir(tmp_path_factory) -> Path:
    """A directory holding plan.json (2x8xH100, d20, 10 h); tests run the CLI from inside it."""
    d = tmp_path_factory.mktemp("cluster")
    save_plan(make_plan(), d / "plan.json")
    return d


cli = nanoplan_cli   # tests/conftest.py


def stub_bin(d: Path, python_body: str) -> Path:
    """Stub SLURM tools and a stub python that logs what the job script asks of them."""
    b = d / "bin"
    b.mkdir()
    stubs = {
        "srun": 'while [[ "$1" == -* ]]; do echo "srun $1" >> "$LOG"; shift; done\n'
                'export SLURM_NODEID=1\nexec "$@"\n',
        "scontrol": 'if [ "$1 $2" = "show hostnames" ]; then printf "node-a\\nnode-b\\n"; '
                    'else echo "scontrol $*" >> "$LOG"; fi\n',
        "scancel": 'echo "scancel $*" >> "$LOG"\nkill -TERM "$(cat "$PID_OUT")"\n',
        "python": python_body,
    }
    for name, body in stubs.items():
        p = b / name
        p.write_text("#!/bin/bash\n" + body)
        p.chmod(0o755)
    return b


RECORD_ARGV = ('printf "%s\\n" "$@" > "$ARGV_OUT"\necho $$ > "$PID_OUT"\n'
               'printf "%s\\n" "${TORCH_DISABLE_SHARE_RDZV_TCP_STORE-unset}" "${PET_LOG_DIR-unset}" > "$ARGV_OUT.env"\n')


def assert_torchrun_env_is_nanoplan_runs(d: Path, plan: Plan, run_dir: str) -> None:
    """The job's torchrun saw the environment `nanoplan run` gives it (runner.launcher.launch_env): a fresh
    rendezvous store for each restart, and its log folders in the run dir (they piled up in the node's /tmp)."""
    from runner.launcher import launch_env

    env = launch_env(plan, base={}, run_dir=run_dir)
    assert (d / "argv.env").read_text().splitlines() == [env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"], env["PET_LOG_DIR"]]
    assert env["PET_LOG_DIR"] == f"{run_dir}/torchrun"


def job_env(d: Path, bindir: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SKYPILOT_"))}
    env.update(PATH=f"{bindir}:{env['PATH']}", LOG=str(d / "log"), ARGV_OUT=str(d / "argv"),
               PID_OUT=str(d / "pid"), SLURM_JOB_ID="42", SLURM_JOB_NODELIST="node-[a-b]",
               SLURM_CPUS_PER_TASK="64", **extra)
    return env


def sbatch_lines(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        if line.startswith("#SBATCH "):
            k, _, v = line[len("#SBATCH "):].partition("=")
            out[k] = v
    return out


# ---------------------------------------------------------------- SLURM


def test_sbatch_header_lines_and_syntax(plan_dir: Path, capsys, tmp_path: Path) -> None:
    code, text, err = cli(["export", "plan.json", "--slurm", "--partition", "gpu", "--account", "proj"],
                          capsys, plan_dir)
    assert code == 0, err
    assert text.startswith("#!/bin/bash\n")
    (tmp_path / "job.sbatch").write_text(text)
    r = subprocess.run(["bash", "-n", str(tmp_path / "job.sbatch")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    sb = sbatch_lines(text)
    plan = load_plan(plan_dir / "plan.json")
    # Lead time: 120 s + 2 steps + checkpoint bytes at 1 GB/s, rounded up to a minute (d20: 6.73 GB -> 180 s).
    lead = math.ceil((120 + 2 * plan.throughput.step_seconds + plan.schedule.checkpoint_bytes / 1e9) / 60) * 60
    assert lead == 180
    assert sb == {
        "--job-name": "nanoplan-d20", "--nodes": "2", "--ntasks-per-node": "1", "--gpus-per-node": "8",
        "--cpus-per-task": "64", "--time": "0-11:00:00", "--requeue": "", "--signal": f"B:USR1@{lead}",
        "--output": "%x-%j.out", "--open-mode": "append", "--exclusive": "", "--partition": "gpu",
        "--account": "proj",
    }
    # #SBATCH lines only count before the first command.
    first_cmd = next(i for i, x in enumerate(text.splitlines()) if x and not x.startswith("#"))
    assert all(i < first_cmd for i, x in enumerate(text.splitlines()) if x.startswith("#SBATCH"))
    assert 'scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1' in text
    assert "srun --kill-on-bad-exit=1" in text and "--rdzv-backend=c10d" in text


@pytest.mark.parametrize("hours,margin,expected", [
    (10.0, 0.1, "0-11:00:00"), (10.0, 0.25, "0-12:30:00"), (30.0, 0.1, "1-09:00:00"),
    (1.0, 0.0, "0-01:00:00"), (0.1, 0.1, "0-00:07:00"),   # 0.1 h: the shortest 8xH100 plan that trains (start-up)
])
def test_time_limit_is_hours_plus_margin(hours: float, margin: float, expected: str) -> None:
    text = slurm_script(make_plan(hours=hours), "plan.json", time_margin=margin)
    assert sbatch_lines(text)["--time"] == expected


def test_format_slurm_time() -> None:
    assert format_slurm_time(90_061) == "1-01:01:01"
    assert format_slurm_time(59) == "0-00:00:59"


def test_sbatch_runs_the_dry_run_torchrun_args(plan_dir: Path, tmp_path: Path) -> None:
    """The job runs exactly nanoplan run's torchrun command, with node rank and endpoint from SLURM."""
    from runner.checkpoint_layout import META, step_dir  # the runner's checkpoint layout (no torch import)

    script = tmp_path / "job.sbatch"
    script.write_text(slurm_script(load_plan(plan_dir / "plan.json"), "plan.json"))
    bindir = stub_bin(tmp_path, RECORD_ARGV)
    expected = torchrun_command("plan.json", 8, "runs/latest", nnodes=2, node_rank="1",
                                rdzv_endpoint="node-a:29500", max_restarts=3, python="python")
    # First start; a requeue before any checkpoint; a requeue with a complete checkpoint.
    for restart, checkpoint, tail in (("0", False, []), ("1", False, []), ("1", True, ["--resume"])):
        if checkpoint:
            meta = step_dir(tmp_path / "runs" / "latest", 12_470) / META
            meta.parent.mkdir(parents=True)
            meta.write_text("{}")
        r = subprocess.run(["bash", str(script)], env=job_env(tmp_path, bindir, SLURM_RESTART_COUNT=restart),
                           capture_output=True, text=True, timeout=30, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        argv = (tmp_path / "argv").read_text().splitlines()
        assert argv == expected[1:] + tail
    log = (tmp_path / "log").read_text().splitlines()
    assert log[:2] == ["srun --kill-on-bad-exit=1", "srun --cpus-per-task=64"]
    assert not any("requeue" in x for x in log)
    assert_torchrun_env_is_nanoplan_runs(tmp_path, load_plan(plan_dir / "plan.json"), "runs/latest")


def test_sbatch_checkpoints_then_requeues_before_time_limit(plan_dir: Path, tmp_path: Path) -> None:
    """USR1 (--signal) -> SIGTERM to the job step -> the runner exits after its checkpoint -> requeue."""
    script = tmp_path / "job.sbatch"
    script.write_text(slurm_script(load_plan(plan_dir / "plan.json"), "plan.json"))
    runner = RECORD_ARGV + ('trap \'echo "runner: SIGTERM, checkpoint, exit 0" >> "$LOG"; exit 0\' TERM\n'
                            "while :; do sleep 0.05; done\n")
    bindir = stub_bin(tmp_path, runner)
    proc = subprocess.Popen(["bash", str(script)], env=job_env(tmp_path, bindir), stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while not (tmp_path / "pid").exists() or not (tmp_path / "pid").read_text().strip():
            assert time.monotonic() < deadline, "the job never started the stub runner"
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGUSR1)
        _, err = proc.communicate(timeout=20)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert "time limit near" in err
    log = [x for x in (tmp_path / "log").read_text().splitlines() if not x.startswith("srun ")]
    assert log == ["scancel --signal=TERM 42", "runner: SIGTERM, checkpoint, exit 0", "scontrol requeue 42"]


def test_single_node_plan_uses_standalone(tmp_path: Path) -> None:
    plan = make_plan(gpu="8xH100")
    text = slurm_script(plan, "p.json", run_dir="/shared/me")
    assert sbatch_lines(text)["--nodes"] == "1" and "MASTER_ADDR" not in text
    bindir = stub_bin(tmp_path, RECORD_ARGV)
    (tmp_path / "job.sbatch").write_text(text)
    r = subprocess.run(["bash", str(tmp_path / "job.sbatch")], env=job_env(tmp_path, bindir),
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    argv = (tmp_path / "argv").read_text().splitlines()
    assert argv == torchrun_command("p.json", 8, "/shared/me/runs/latest", python="python")[1:]
    assert argv[2:4] == ["--standalone", "--nnodes=1"]


# ---------------------------------------------------------------- SkyPilot


def test_skypilot_yaml_fields(plan_dir: Path, capsys, tmp_path: Path) -> None:
    code, text, err = cli(["export", "plan.json", "--skypilot", "--bucket", BUCKET], capsys, plan_dir)
    assert code == 0, err
    task = yaml.safe_load(text)
    assert task["name"] == "nanoplan-d20" and task["workdir"] == "."
    assert task["num_nodes"] == 2
    assert task["resources"] == {"accelerators": "H100:8", "max_hourly_cost": 31.6,      # 8 x $3.95 (modal)
                                 "autostop": {"idle_minutes": 5, "down": True}}
    assert task["file_mounts"] == {"/checkpoints": {"source": BUCKET, "mode": "MOUNT_CACHED"}}
    assert task["envs"] == {"MASTER_PORT": "29500", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": str(grace_seconds(
        load_plan(plan_dir / "plan.json")) - 30)}
    assert 'pip install "torch==2.13.0"' in task["setup"] and "pip install -e ." in task["setup"]
    for key in ("setup", "run"):
        (tmp_path / key).write_text(task[key])
        r = subprocess.run(["bash", "-n", str(tmp_path / key)], capture_output=True, text=True)
        assert r.returncode == 0, (key, r.stderr)
    for var in ("SKYPILOT_NODE_RANK", "SKYPILOT_NODE_IPS", "SKYPILOT_NUM_NODES", "SKYPILOT_NUM_GPUS_PER_NODE"):
        assert var in task["run"]
    assert "setup: |" in text and "run: |" in text  # readable literal blocks, not escaped strings


def run_skypilot(task: dict, tmp_path: Path, gpus: str) -> subprocess.CompletedProcess:
    bindir = stub_bin(tmp_path, RECORD_ARGV)
    (tmp_path / "run.sh").write_text(task["run"])
    env = job_env(tmp_path, bindir, SKYPILOT_NODE_RANK="1", SKYPILOT_NODE_IPS="10.0.0.7\n10.0.0.8\n",
                  SKYPILOT_NUM_NODES="2", SKYPILOT_NUM_GPUS_PER_NODE=gpus, **task["envs"])
    return subprocess.run(["bash", str(tmp_path / "run.sh")], env=env, capture_output=True, text=True, timeout=30)


def test_skypilot_runs_the_dry_run_torchrun_args(plan_dir: Path, tmp_path: Path) -> None:
    task = yaml.safe_load(skypilot_task(load_plan(plan_dir / "plan.json"), "plan.json", bucket=BUCKET))
    r = run_skypilot(task, tmp_path, gpus="8")
    assert r.returncode == 0, r.stderr
    expected = torchrun_command("plan.json", 8, "/checkpoints/runs/latest", nnodes=2, node_rank="1",
                                rdzv_endpoint="10.0.0.7:29500", max_restarts=3, python="python")
    assert (tmp_path / "argv").read_text().splitlines() == expected[1:]
    assert_torchrun_env_is_nanoplan_runs(tmp_path, load_plan(plan_dir / "plan.json"), "/checkpoints/runs/latest")


def test_skypilot_refuses_a_cluster_unlike_the_plan(plan_dir: Path, tmp_path: Path) -> None:
    task = yaml.safe_load(skypilot_task(load_plan(plan_dir / "plan.json"), "plan.json", bucket=BUCKET))
    r = run_skypilot(task, tmp_path, gpus="4")
    assert r.returncode == 1 and "needs 2 node(s) x 8 GPUs, got 2 x 4" in r.stderr
    assert not (tmp_path / "argv").exists()


@pytest.mark.parametrize("gpu,accelerators", [
    ("8xH100-PCIe", "H100:8"), ("8xA100-80GB", "A100-80GB:8"), ("4xA100-40GB", "A100:4"),
    ("8xH200", "H200:8"), ("8xB200", "B200:8"), ("4x8xH100", "H100:8"),
])
def test_accelerator_names(gpu: str, accelerators: str) -> None:
    task = yaml.safe_load(skypilot_task(make_plan(gpu=gpu, depth=12), "plan.json", bucket="gs://b"))
    assert task["resources"]["accelerators"] == accelerators
    assert task["num_nodes"] == (4 if gpu.startswith("4x8") else 1)


def test_every_builtin_gpu_profile_has_a_skypilot_name() -> None:
    from planner.profiles import builtin_profiles

    gpus = {n for n, p in builtin_profiles().items() if p.kind == "gpu"}
    assert gpus == set(SKYPILOT_ACCELERATORS)


# ---------------------------------------------------------------- same command as nanoplan run


def test_exports_match_the_plans_own_launch_command(plan_dir: Path) -> None:
    """plan.json's launch.command (what estimate prints) uses $NODE_RANK and $MASTER_ADDR:29500."""
    plan = load_plan(plan_dir / "plan.json")
    cmd_plan = plan.launch.command[plan.launch.command.index("--plan") + 1]
    assert cluster_torchrun_args(plan, cmd_plan, plan.launch.run_dir, "$NODE_RANK",
                                 "$MASTER_ADDR:29500") == plan.launch.command


def test_exports_match_nanoplan_run_dry_run(plan_dir: Path, tmp_path: Path) -> None:
    """The torchrun words that `nanoplan run --dry-run` prints equal the ones the launch files run."""
    plan_path = str(plan_dir / "plan.json")
    r = subprocess.run([sys.executable, "-m", "nanoplan", "run", plan_path, "--dry-run", "--nnodes", "2",
                        "--node-rank", "1", "--rdzv-endpoint", "node-a:29500", "--run-dir", "runs/latest"],
                       capture_output=True, text=True, timeout=60, cwd=plan_dir)
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stdout.replace("\\\n", " ").splitlines() if "torch.distributed.run" in x)
    words = shlex.split(line)
    dry = words[words.index("torch.distributed.run") + 1:]
    plan = load_plan(plan_path)
    ours = cluster_torchrun_args(plan, plan_path, "runs/latest", "1", "node-a:29500")
    assert dry == ours[ours.index("torch.distributed.run") + 1:]


# ---------------------------------------------------------------- CLI behaviour and errors


def test_out_writes_the_same_text(plan_dir: Path, capsys, tmp_path: Path) -> None:
    code, text, _ = cli(["export", "plan.json", "--skypilot", "--bucket", BUCKET], capsys, plan_dir)
    out = tmp_path / "sub" / "task.yaml"
    code2, stdout, err = cli(["export", "plan.json", "--skypilot", "--bucket", BUCKET, "--out", str(out)],
                             capsys, plan_dir)
    assert code == code2 == 0 and stdout == ""
    assert out.read_text() == text and f"wrote {out}" in err
    assert not [p for p in out.parent.iterdir() if p.name != "task.yaml"]  # no temp file left


@pytest.fixture(scope="module")
def bad_plans(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("bad")
    (d / "broken.json").write_text("{not json")
    (d / "other.json").write_text('{"schema_version": 1, "hello": 2}')
    cpu = build_plan(PlanRequest(gpu="2xCPU", profile=find_profile("CPU"), model=nanochat(2, 64, 256),
                                 hours=0.01, precision="fp32", compile=False, total_batch_tokens=1024))
    save_plan(cpu, d / "cpu.json")
    save_plan(make_plan(), d / "plan.json")
    return d


@pytest.mark.parametrize("args,words", [
    (["missing.json", "--slurm"], "cannot read"),
    (["broken.json", "--slurm"], "not valid JSON"),
    (["other.json", "--skypilot", "--bucket", BUCKET], "field"),
    (["cpu.json", "--slurm"], "CPU plan"),
    (["cpu.json", "--skypilot", "--bucket", BUCKET], "CPU plan"),
    (["plan.json"], "exactly one"),
    (["plan.json", "--slurm", "--skypilot"], "exactly one"),
    (["plan.json", "--skypilot"], "--bucket"),
    (["plan.json", "--skypilot", "--bucket", "/local/dir"], "not a bucket URL"),
    (["plan.json", "--slurm", "--bucket", "s3://b"], "shared filesystem"),
    (["plan.json", "--slurm", "--time-margin", "-0.5"], "--time-margin"),
    (["plan.json", "--skypilot", "--bucket", BUCKET, "--partition", "gpu"], "SLURM options"),
    (["ABS/plan.json", "--skypilot", "--bucket", BUCKET], "outside the launch directory"),
])
def test_bad_input_one_line_exit_2(bad_plans: Path, capsys, args: list[str], words: str) -> None:
    args = [a.replace("ABS", str(bad_plans)) for a in args]
    code, out, err = cli(["export", *args], capsys, bad_plans)
    assert code == 2 and out == "", err
    line, _ = error_and_hint(err)
    assert words in line, err


def test_bad_plan_exit_2_from_the_installed_command(bad_plans: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "nanoplan", "export", "cpu.json", "--slurm"],
                       capture_output=True, text=True, timeout=60, cwd=bad_plans)
    assert r.returncode == 2 and r.stdout == ""
    error_and_hint(r.stderr)   # one error line (and a hint line where there is a fix), no traceback


# ---------------------------------------------------------------- shipped examples


@pytest.mark.parametrize("args,name", [
    (["--slurm"], "job.sbatch"),
    (["--skypilot", "--bucket", "s3://my-bucket/nanoplan"], "task.yaml"),
])
def test_examples_are_up_to_date(capsys, args: list[str], name: str) -> None:
    """examples/cluster/ holds what `nanoplan export examples/cluster/plan.json ...` writes today."""
    code, text, err = cli(["export", "examples/cluster/plan.json", *args], capsys, REPO)
    assert code == 0, err
    assert (REPO / "examples" / "cluster" / name).read_text() == text, \
        f"regenerate: nanoplan export examples/cluster/plan.json {' '.join(args)} --out examples/cluster/{name}"


def test_export_does_not_import_torch(plan_dir: Path) -> None:
    code = ("import sys\nfrom typer.testing import CliRunner\nfrom nanoplan.cli import app\n"
            f"r = CliRunner().invoke(app, ['export', {str(plan_dir / 'plan.json')!r}, '--slurm'])\n"
            "assert r.exit_code == 0, r.output\n"
            "assert not [m for m in sys.modules if m == 'torch' or m.startswith('torch.')]\nprint('ok')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]
