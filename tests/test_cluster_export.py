"""Cluster exports, round four: another trainer's plan runs that trainer under `nanoplan run` (issue 32 #2),
the SkyPilot task caps the hourly price and tears itself down, the run dir sits on a bucket mode that takes
appends, one job holds a bucket path (issue 30 #9), and a spot job without data is refused (issue 28).

The scripts run for real under bash with stub programs (tests/test_export.py): the stub python records the
argv each node starts. Where SkyPilot installs (a separate venv; not in CI's), its own task loader reads
every exported task: test_skypilot_s_own_loader_reads_every_task."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from planner.plan import load_plan
from runner import bucket_claim
from tests.conftest import REPO, make_tiny_plan, runner_env
from tests.test_export import BUCKET, RECORD_ARGV, cli, job_env, stub_bin

TRAINERS = {   # trainer -> estimate arguments (one plan on two nodes: the rendezvous flags)
    "nanochat": ["--trainer", "nanochat", "--depth", "20", "--gpu", "8xH100", "--budget", "100"],
    "torchtitan": ["--trainer", "torchtitan", "--preset", "llama3-8b", "--gpu", "8xH100", "--hours", "2"],
    "deepspeed": ["--trainer", "deepspeed", "--depth", "20", "--gpu", "2x8xH100", "--hours", "2"],
}


@pytest.fixture(scope="module")
def plans(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("trainer_plans")
    for name, args in TRAINERS.items():
        r = subprocess.run([sys.executable, "-m", "nanoplan", "estimate", *args, "--out", f"{name}.json"],
                           capture_output=True, text=True, timeout=120, cwd=d)
        assert r.returncode == 0, r.stderr
    return d


def expected_argv(plan_path: str, run_dir: str, name: str, trainer_dir: str, rank: str, endpoint: str) -> list[str]:
    plan = load_plan(Path(plan_path)) if Path(plan_path).is_absolute() else None
    argv = ["-m", "nanoplan", "run", Path(plan_path).name, "--run-dir", run_dir]
    if name == "nanochat":
        argv += ["--trainer-dir", trainer_dir]
    nodes = plan.hardware.nodes if plan else 1
    return argv + (["--node-rank", rank, "--rdzv-endpoint", endpoint] if nodes > 1 else [])


@pytest.mark.parametrize("name", list(TRAINERS))
def test_a_trainer_plan_s_skypilot_job_runs_that_trainer_under_nanoplan_run(name: str, plans: Path, capsys,
                                                                            tmp_path: Path) -> None:
    code, text, err = cli(["export", f"{name}.json", "--skypilot", "--bucket", BUCKET], capsys, plans)
    assert code == 0, err
    task = yaml.safe_load(text)
    assert "runner.train" not in text and "torch.distributed.run" not in task["run"]
    plan = load_plan(plans / f"{name}.json")
    node_usd = plan.hardware.gpus_per_node * plan.hardware.usd_per_gpu_hour
    assert task["resources"]["max_hourly_cost"] == math.ceil(node_usd * 100) / 100
    assert task["resources"]["autostop"] == {"idle_minutes": 5, "down": True}
    setup = task["setup"]
    if name == "nanochat":      # its checkout at the plan's commit, its .venv, its data and tokenizer
        assert "git -C \"$NANOCHAT_DIR\" fetch -q origin && git -C \"$NANOCHAT_DIR\" checkout -q 92d63d4e" in setup
        assert "uv sync --extra gpu" in setup and ".venv/bin/python -m nanochat.dataset -n " in setup
    else:
        assert {"torchtitan": "pip install torchtitan==0.3.0", "deepspeed": "pip install deepspeed==0.19.8"}[name] \
            in setup
    for part in ("setup", "run"):
        (tmp_path / f"{part}.sh").write_text(task[part])
        assert subprocess.run(["bash", "-n", str(tmp_path / f"{part}.sh")]).returncode == 0
    run = task["run"].replace("/checkpoints/runs/", f"{tmp_path}/mnt/runs/")
    (tmp_path / "run.sh").write_text(run)
    bindir = stub_bin(tmp_path, RECORD_ARGV)
    nodes = plan.hardware.nodes
    env = job_env(tmp_path, bindir, SKYPILOT_NODE_RANK=str(nodes - 1), SKYPILOT_NODE_IPS="10.0.0.7\n10.0.0.8\n",
                  SKYPILOT_NUM_NODES=str(nodes), SKYPILOT_NUM_GPUS_PER_NODE="8", SKYPILOT_TASK_ID="sky-1_x_1",
                  HOME=str(tmp_path / "home"), **task["envs"])
    r = subprocess.run(["bash", str(tmp_path / "run.sh")], env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    got = (tmp_path / "argv").read_text().splitlines()
    assert got == expected_argv(str(plans / f"{name}.json"), f"{tmp_path}/mnt/runs/latest", name,
                                f"{tmp_path}/home/nanochat", str(nodes - 1), "10.0.0.7:29500")
    assert got[3] == f"{name}.json"


@pytest.mark.parametrize("name", list(TRAINERS))
def test_a_trainer_plan_s_slurm_job_runs_that_trainer_under_nanoplan_run(name: str, plans: Path, capsys,
                                                                         tmp_path: Path) -> None:
    code, text, err = cli(["export", f"{name}.json", "--slurm"], capsys, plans)
    assert code == 0, err
    assert "runner.train" not in text and "torch.distributed.run" not in text
    (tmp_path / "job.sbatch").write_text(text)
    bindir = stub_bin(tmp_path, RECORD_ARGV)
    checkout = tmp_path / "nanochat"
    env = job_env(tmp_path, bindir, NANOCHAT_DIR=str(checkout))
    if name == "nanochat":      # no checkout: one line, before anything starts
        r = subprocess.run(["bash", str(tmp_path / "job.sbatch")], env=env, capture_output=True, text=True, cwd=plans,
                           timeout=30)
        assert r.returncode == 2 and r.stderr.strip().splitlines() == [
            f"nanoplan: no nanochat checkout at {checkout}: clone https://github.com/karpathy/nanochat there at "
            "92d63d4e8bb4 (or set NANOCHAT_DIR), then submit again"], r.stderr
        (checkout / "scripts").mkdir(parents=True)
        (checkout / "scripts" / "base_train.py").write_text("")
    r = subprocess.run(["bash", str(tmp_path / "job.sbatch")], env=env, capture_output=True, text=True, cwd=plans,
                       timeout=30)
    assert r.returncode == 0, r.stderr
    plan = load_plan(plans / f"{name}.json")
    assert (tmp_path / "argv").read_text().splitlines() == expected_argv(
        str(plans / f"{name}.json"), plan.launch.run_dir, name, str(checkout), "1", "node-a:29500")


def test_a_spot_job_without_data_is_refused_and_other_exports_warn(tmp_path: Path, capsys) -> None:
    """Issue 28: `export --skypilot --spot` wrote a job for a plan with no data directory; the paid node then
    stopped at its preflight."""
    r = subprocess.run([sys.executable, "-m", "nanoplan", "estimate", "--gpu", "8xH100", "--depth", "12", "--budget",
                        "100", "--spot", "--out", "nodata.json"], capture_output=True, text=True, timeout=120,
                       cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    for target in (["--skypilot", "--bucket", BUCKET], ["--slurm"]):
        code, out, err = cli(["export", "nodata.json", *target, "--spot"], capsys, tmp_path)
        assert code == 2 and out == "" and err.splitlines()[0] == (
            "error: --spot: the plan has no data directory, so the job would find nothing to train on and stop on its "
            "node, after paying for its start-up"), err
    doc = json.loads((tmp_path / "nodata.json").read_text())
    doc["request"]["data_dir"] = "data/fineweb"         # relative: SkyPilot uploads it with the workdir
    (tmp_path / "withdata.json").write_text(json.dumps(doc))
    code, out, err = cli(["export", "withdata.json", "--skypilot", "--bucket", BUCKET, "--spot"], capsys, tmp_path)
    assert code == 0 and "# Data: data/fineweb must exist on every node" in out, err
    od = subprocess.run([sys.executable, "-m", "nanoplan", "estimate", "--gpu", "8xH100", "--depth", "12", "--hours",
                         "1", "--out", "od.json"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert od.returncode == 0, od.stderr
    code, out, err = cli(["export", "od.json", "--slurm"], capsys, tmp_path)
    assert code == 0 and err.splitlines() == [
        "warning: od.json: the plan has no data directory, so the job would find nothing to train on and stop on its "
        "node, after paying for its start-up; plan with --data DATA_DIR (nanoplan prepare-data)"], err


def test_skypilot_s_own_loader_reads_every_task(plans: Path, capsys) -> None:
    """SkyPilot's task loader (sky.Task.from_yaml: its schema and sky.Resources) reads each exported task, its cost
    cap, autodown and mount mode included. Skipped where skypilot is not installed (it is not in the dev extras:
    checked by hand with skypilot 0.14.1 in a separate venv)."""
    sky = pytest.importorskip("sky")
    for name in TRAINERS:
        code, text, err = cli(["export", f"{name}.json", "--skypilot", "--bucket", BUCKET], capsys, plans)
        assert code == 0, err
        (plans / f"{name}.yaml").write_text(text)
        task = sky.Task.from_yaml(str(plans / f"{name}.yaml"))
        res = next(iter(task.resources))
        assert res.autostop_config.down and str(next(iter(task.storage_mounts.values())).mode).endswith("MOUNT_CACHED")


# ---------------------------------------------------------------- one job per bucket path (runner/bucket_claim.py)


def claim(run: Path, job: str, **kw: object) -> subprocess.CompletedProcess:
    env = runner_env(NANOPLAN_CLAIM_SETTLE_S=str(kw.pop("settle", 0)))
    args = [sys.executable, "-m", "runner.bucket_claim", str(run), "--job", job]
    if "lease" in kw:
        args += ["--lease-s", str(kw["lease"])]
    return subprocess.run(args, capture_output=True, text=True, timeout=60, cwd=REPO, env=env)


def test_one_job_holds_a_bucket_path_and_a_recovery_or_an_abandoned_one_goes_on(tmp_path: Path) -> None:
    run = tmp_path / "bucket" / "runs" / "latest"
    assert claim(run, "job-A").returncode == 0
    (run / "launches.json").write_text('{"launches": []}')               # job A's budget records, fresh
    held = json.loads((run / bucket_claim.CLAIM).read_text())
    assert held["job"] == "job-A"
    held["host"] = "another-machine"                                      # as written by another node
    (run / bucket_claim.CLAIM).write_text(json.dumps(held))
    assert claim(run, "job-A").returncode == 0                            # its own recovery, on a new machine
    held = {**json.loads((run / bucket_claim.CLAIM).read_text()), "host": "another-machine"}
    (run / bucket_claim.CLAIM).write_text(json.dumps(held))
    r = claim(run, "job-B")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 2, r.stderr
    assert r.stderr.startswith(f"error: {run}: is in use by SkyPilot job job-A (host another-machine; its run dir "
                               "changed "), r.stderr
    assert json.loads((run / bucket_claim.CLAIM).read_text())["job"] == "job-A"
    old = (run / "launches.json").stat().st_mtime - 3600                  # job A gone an hour ago
    for name in os.listdir(run):
        os.utime(run / name, (old, old))
    r = claim(run, "job-B")
    assert r.returncode == 0 and f"note: {run} was claimed by SkyPilot job job-A, idle for " in r.stderr, r.stderr
    assert json.loads((run / bucket_claim.CLAIM).read_text())["job"] == "job-B"


def test_two_jobs_claiming_at_once_leave_one(tmp_path: Path) -> None:
    """A fresh claim is read back after the settle time: the job whose claim was overwritten steps back."""
    run = tmp_path / "run"
    run.mkdir()
    a = subprocess.Popen([sys.executable, "-m", "runner.bucket_claim", str(run), "--job", "job-A"], cwd=REPO,
                         env=runner_env(NANOPLAN_CLAIM_SETTLE_S="3"), stderr=subprocess.PIPE, text=True)
    from tests.test_reliability_faults import wait_for

    wait_for(lambda: (run / bucket_claim.CLAIM).exists(), timeout=30, what="job A's claim")
    doc = json.loads((run / bucket_claim.CLAIM).read_text())
    (run / bucket_claim.CLAIM).write_text(json.dumps({**doc, "job": "job-B"}))   # B wrote in the same moment
    _, err = a.communicate(timeout=60)
    assert a.returncode == 2 and "was claimed at the same moment by SkyPilot job job-B" in err, err


# ---------------------------------------------------------------- a run dir on a filesystem like mode MOUNT

FUSE_LIKE = '''
import builtins, errno, io, os
_ROOT = os.environ["FUSE_LIKE_DIR"].rstrip("/") + "/"
_open, _os_open, _pwrite = builtins.open, os.open, os.pwrite


def _inside(p):
    try:
        return os.path.abspath(os.fspath(p)).startswith(_ROOT)
    except TypeError:
        return False


def _refuse(p):
    raise OSError(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP), str(p))


def _open_(file, mode="r", *a, **k):
    if "a" in mode and _inside(file):
        _refuse(file)
    return _open(file, mode, *a, **k)


def _os_open_(path, flags, *a, **k):
    if flags & os.O_APPEND and _inside(path):
        _refuse(path)
    return _os_open(path, flags, *a, **k)


def _pwrite_(fd, data, offset):
    try:
        p = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        p = ""
    if p.startswith(_ROOT) and offset < os.fstat(fd).st_size:
        _refuse(p)
    return _pwrite(fd, data, offset)


builtins.open = io.open = _open_
os.open, os.pwrite = _os_open_, _pwrite_
'''


def test_a_run_dir_that_refuses_appends_is_refused_before_the_launch(tmp_path: Path, tiny_data: Path) -> None:
    """Issue 30 #9: SkyPilot's mode MOUNT supports neither appends nor random writes ("Most notably, random writes
    and append operations are not supported", its storage.rst), yet a run appends to metrics.jsonl and rewrites its
    lock files. Simulated here (a sitecustomize refuses O_APPEND and writes before the end under FUSE_LIKE_DIR):
    the preflight finds it by doing both, and nothing starts."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(FUSE_LIKE)
    bucket = tmp_path / "bucket"
    bucket.mkdir()
    plan = make_tiny_plan(tmp_path / "plan.json", tiny_data, steps=5, gpus=1)
    env = runner_env(FUSE_LIKE_DIR=str(bucket), PYTHONPATH=f"{site}{os.pathsep}{os.environ.get('PYTHONPATH', REPO)}")
    r = subprocess.run([sys.executable, "-m", "nanoplan", "run", str(plan), "--run-dir", str(bucket / "run")],
                       capture_output=True, text=True, timeout=180, cwd=REPO, env=env)
    errors = [x for x in r.stderr.splitlines() if x.startswith("error:")]
    assert r.returncode == 2 and errors == [
        f"error: preflight: run dir {bucket / 'run'} refuses appends or in-place writes (Operation not supported): a "
        "run appends to metrics.jsonl and rewrites its lock files in place (a bucket mounted with SkyPilot's mode "
        "MOUNT does neither; mode MOUNT_CACHED, which nanoplan export writes, does both); pick another --run-dir"], \
        r.stderr[-3000:]
    assert not (bucket / "run" / "metrics.jsonl").exists() and "launching:" not in r.stderr
