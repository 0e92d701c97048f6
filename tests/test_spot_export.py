"""`nanoplan export --spot`: a managed SkyPilot job on spot instances and a requeued SLURM job whose nodes run
`nanoplan run` (every launch counted against the budget) and resume from the newest checkpoint.

What they write is parsed (yaml.safe_load, shlex) and run for real under bash with stub programs: the stub
python records the argv each node starts, which must be planner.export.nanoplan_run_args, plus --resume once
the run dir holds a complete checkpoint."""

from __future__ import annotations

import math
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

from planner.build import build_plan
from planner.export import nanoplan_run_args, skypilot_task, slurm_script
from planner.plan import Plan, PlanRequest, SpotRequest, save_plan
from planner.profiles import find_profile
from planner.spec import nanochat
from runner.checkpoint import META, step_dir
from tests.test_export import BUCKET, RECORD_ARGV, cli, job_env, sbatch_lines, stub_bin


def spot_plan(gpu: str = "2x8xH100", spot: bool = True) -> Plan:
    """A spot plan needs a data directory to be exported (issue 28: its job stopped at the preflight)."""
    return build_plan(PlanRequest(gpu=gpu, profile=find_profile("H100"), model=nanochat(20), hours=10.0,
                                  spot=SpotRequest() if spot else None, data_dir="data/tokens"))


@pytest.fixture(scope="module")
def plan_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("spot_cluster")
    save_plan(spot_plan(), d / "spot.json")
    save_plan(spot_plan(spot=False), d / "od.json")
    return d


def complete_checkpoint(run_dir: Path, step: int = 1234) -> None:
    meta = step_dir(run_dir, step) / META
    meta.parent.mkdir(parents=True)
    meta.write_text("{}")


def test_skypilot_spot_is_a_managed_spot_job_that_resumes(plan_dir: Path, capsys, tmp_path: Path) -> None:
    code, text, err = cli(["export", "spot.json", "--skypilot", "--spot", "--bucket", BUCKET], capsys, plan_dir)
    assert code == 0, err
    task = yaml.safe_load(text)
    plan = spot_plan()
    node_usd = plan.hardware.gpus_per_node * plan.hardware.usd_per_gpu_hour    # the spot price, per node-hour
    assert task["resources"] == {"accelerators": "H100:8", "use_spot": True,
                                 "max_hourly_cost": math.ceil(node_usd * 100) / 100}
    assert task["num_nodes"] == 2
    assert task["file_mounts"] == {"/checkpoints": {"source": BUCKET, "mode": "MOUNT_CACHED"}}
    assert "sky jobs launch" in text.split("\nname:")[0]
    (tmp_path / "run.sh").write_text(task["run"])
    assert subprocess.run(["bash", "-n", str(tmp_path / "run.sh")]).returncode == 0
    # the last command, as the shell reads it: nanoplan run with the node's rank, and the resume flag variable
    last = task["run"].rstrip("\n").split("\nexec ", 1)[1].replace("\\\n", " ")
    assert shlex.split(last) == [*nanoplan_run_args(spot_plan(), "spot.json", "/checkpoints/runs/latest",
                                                    "$SKYPILOT_NODE_RANK", "$MASTER_ADDR:$MASTER_PORT"),
                                 "$NANOPLAN_RESUME"]
    # run it (node rank 1): a first launch starts fresh; after a preemption it resumes from the bucket's checkpoint
    mount = tmp_path / "mnt"
    run = task["run"].replace("/checkpoints/runs/", f"{mount}/runs/")   # the bucket, mounted here
    (tmp_path / "run.sh").write_text(run)
    bindir = stub_bin(tmp_path, RECORD_ARGV)
    expected = nanoplan_run_args(spot_plan(), "spot.json", f"{mount}/runs/latest", "1", "10.0.0.7:29500")
    for tail in ([], ["--resume"]):
        if tail:
            complete_checkpoint(mount / "runs" / "latest")
        env = job_env(tmp_path, bindir, SKYPILOT_NODE_RANK="1", SKYPILOT_NODE_IPS="10.0.0.7\n10.0.0.8\n",
                      SKYPILOT_NUM_NODES="2", SKYPILOT_NUM_GPUS_PER_NODE="8", **task["envs"])
        r = subprocess.run(["bash", str(tmp_path / "run.sh")], env=env, capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        assert (tmp_path / "argv").read_text().splitlines() == expected[1:] + tail


def test_slurm_spot_requeues_and_resumes_whenever_a_checkpoint_exists(plan_dir: Path, capsys, tmp_path: Path) -> None:
    code, text, err = cli(["export", "spot.json", "--slurm", "--spot"], capsys, plan_dir)
    assert code == 0, err
    assert "--requeue" in sbatch_lines(text)
    srun = next(x for x in text.split("\n\n") if x.startswith("# nanoplan run on every node"))
    words = shlex.split(srun.split("\n", 2)[2].split("\nSTEP_PID=")[0])   # srun ... bash -c 'SCRIPT' &
    assert words[:3] == ["srun", "--kill-on-bad-exit=1", '--cpus-per-task=$SLURM_CPUS_PER_TASK']
    assert words[3:5] == ["bash", "-c"] and words[-1] == "&"
    inner = shlex.split(words[5].replace("\\\n", " "))
    assert inner == ["exec", *nanoplan_run_args(spot_plan(), "spot.json", "runs/latest", "$SLURM_NODEID",
                                                 "$MASTER_ADDR:$MASTER_PORT"), "$NANOPLAN_RESUME"]
    script = tmp_path / "job.sbatch"
    script.write_text(text)
    bindir = stub_bin(tmp_path, RECORD_ARGV)
    expected = nanoplan_run_args(spot_plan(), "spot.json", "runs/latest", "1", "node-a:29500")
    # a first start, then a start after a preemption (SLURM requeued it) with a checkpoint in the run dir;
    # on spot a checkpoint resumes even when SLURM_RESTART_COUNT says 0 (the job was resubmitted)
    for restart, checkpoint, tail in (("0", False, []), ("1", True, ["--resume"]), ("0", False, ["--resume"])):
        if checkpoint:
            complete_checkpoint(tmp_path / "runs" / "latest")
        r = subprocess.run(["bash", str(script)], env=job_env(tmp_path, bindir, SLURM_RESTART_COUNT=restart),
                           capture_output=True, text=True, timeout=30, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        assert (tmp_path / "argv").read_text().splitlines() == expected[1:] + tail


def test_single_node_spot_job_runs_nanoplan_run_without_a_rendezvous() -> None:
    plan = spot_plan("8xH100")
    task = yaml.safe_load(skypilot_task(plan, "p.json", bucket=BUCKET, spot=True))
    assert "MASTER_ADDR" not in task["run"]
    assert nanoplan_run_args(plan, "p.json", "/r", 0, "x") == ["python", "-m", "nanoplan", "run", "p.json",
                                                               "--run-dir", "/r"]
    assert "--requeue" in sbatch_lines(slurm_script(plan, "p.json", spot=True))


@pytest.mark.parametrize("plan_file,args,words", [
    ("spot.json", ["--skypilot", "--bucket", BUCKET], ["--spot", "priced for spot GPUs"]),
    ("spot.json", ["--slurm"], ["--spot", "priced for spot GPUs"]),
    ("od.json", ["--skypilot", "--spot", "--bucket", BUCKET], ["--spot", "on-demand GPUs"]),
    ("od.json", ["--slurm", "--spot"], ["--spot", "on-demand GPUs"]),
])
def test_a_plan_and_its_export_agree_on_spot(plan_dir: Path, capsys, plan_file: str, args: list[str],
                                             words: list[str]) -> None:
    """A spot plan's cap is priced at the spot price: on demand it would overspend; an on-demand plan is not
    sized for interruptions. Either mismatch is one line and exit 2."""
    code, out, err = cli(["export", plan_file, *args], capsys, plan_dir)
    assert code == 2 and out == ""
    assert all(w in err.splitlines()[0] for w in words), err
