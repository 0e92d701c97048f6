"""`nanoplan run`: the torchrun command, plan re-validation, preflight refusals, SIGTERM, resume."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nanoplan.cli import app
from planner.build import build_plan
from planner.plan import PlanRequest, load_plan, save_plan
from planner.profiles import find_profile
from planner.spec import nanochat
from runner.checkpoint_layout import step_dir
from runner.checkpoint_meta import verify
from runner.metrics import read_metrics
from runner.preflight import check_data, check_resume, run_preflight
from tests.conftest import REPO, runner_env


def nanoplan(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nanoplan", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, env=runner_env(**(env or {})))


def one_error_line(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    lines = [x for x in r.stderr.splitlines() if x.startswith("error:")]
    assert len(lines) == 1, r.stderr
    hints = [x.removeprefix("hint: ") for x in r.stderr.splitlines() if x.startswith("hint:")]
    return lines[0] + (f" ({hints[0]})" if hints else "")   # the error with its hint, as one string


def gpu_plan(path: Path, data: Path, gpu: str = "8xH100") -> Path:
    req = PlanRequest(gpu=gpu, profile=find_profile("H100"), model=nanochat(4, 256, 256), hours=1.0,
                      total_batch_tokens=65536, data_dir=str(data))
    save_plan(build_plan(req, plan_path=str(path)), path)
    return path


def test_dry_run_prints_the_torchrun_command(tmp_path: Path, tiny_plan) -> None:
    plan = tiny_plan()
    res = CliRunner().invoke(app, ["run", str(plan), "--run-dir", str(tmp_path / "r"), "--dry-run"])
    assert res.exit_code == 0, res.output
    out = res.output.strip()
    assert out.endswith(f"-m torch.distributed.run --standalone --nnodes=1 --nproc-per-node=2 --max-restarts=3 "
                        f"-m runner.train --plan {plan} --run-dir {tmp_path / 'r'}")
    assert out.startswith(sys.executable)
    assert not (tmp_path / "r").exists()          # a dry run touches nothing


def test_multi_node_dry_run_uses_c10d(tmp_path: Path, tiny_data: Path) -> None:
    plan = gpu_plan(tmp_path / "p.json", tiny_data, gpu="2x8xH100")
    res = CliRunner().invoke(app, ["run", str(plan), "--dry-run", "--nnodes", "2", "--node-rank", "1",
                                   "--rdzv-endpoint", "10.0.0.1:29400", "--max-restarts", "5", "--resume"])
    assert res.exit_code == 0, res.output
    assert ("--nnodes=2 --node-rank=1 --rdzv-backend=c10d --rdzv-endpoint=10.0.0.1:29400 --rdzv-id=nanoplan "
            "--nproc-per-node=8 --max-restarts=5 -m runner.train") in res.output
    assert res.output.strip().endswith("--resume")


def test_multi_node_needs_an_endpoint(tmp_path: Path, tiny_data: Path) -> None:
    plan = gpu_plan(tmp_path / "p.json", tiny_data, gpu="2x8xH100")
    assert "--rdzv-endpoint" in one_error_line(nanoplan("run", str(plan), "--dry-run"))


def test_stale_plan_is_reported(tmp_path: Path, tiny_plan) -> None:
    path = tiny_plan()
    d = json.loads(path.read_text())
    d["throughput"]["tokens_per_sec"] *= 2
    path.write_text(json.dumps(d))
    r = nanoplan("run", str(path), "--dry-run")
    assert r.returncode == 0, r.stderr
    assert (f"warning: 1 derived number(s) in {path} differ from a fresh derivation "
            "(first: throughput.tokens_per_sec is ") in r.stderr


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
def test_preflight_refuses_a_gpu_plan_here(tmp_path: Path, tiny_data: Path) -> None:
    import torch

    if torch.cuda.is_available() and torch.cuda.device_count() >= 8:
        pytest.skip("this machine has 8 GPUs")
    plan = gpu_plan(tmp_path / "p.json", tiny_data)
    line = one_error_line(nanoplan("run", str(plan), "--run-dir", str(tmp_path / "run")))
    assert line.startswith("error: preflight: the plan needs 8 CUDA GPUs on this node, ")
    assert "--force" in line
    assert not (tmp_path / "run").exists()


def test_refuses_another_plans_checkpoints_and_a_missing_resume(tmp_path: Path, tiny_plan) -> None:
    plan = tiny_plan()
    run = tmp_path / "run"
    line = one_error_line(nanoplan("run", str(plan), "--run-dir", str(run), "--resume"))
    assert "no complete checkpoint to resume from" in line
    d = step_dir(run, 5)
    d.mkdir(parents=True)
    (d / "meta.json").write_text(json.dumps({"step": 5, "plan_hash": "0123456789abcdef"}))
    line = one_error_line(nanoplan("run", str(plan), "--run-dir", str(run)))
    assert "holds checkpoints of a different plan (hash 0123456789ab" in line


def test_preflight_checks_disk_and_data(tmp_path: Path, tiny_plan, tiny_data: Path) -> None:
    plan = load_plan(tiny_plan())
    assert run_preflight(plan, "p.json", tmp_path / "run", None, False).ok
    huge = plan.model_copy(update={"schedule": plan.schedule.model_copy(update={"storage_bytes": 1 << 60})})
    pf = run_preflight(huge, "p.json", tmp_path / "run", None, False)
    assert len(pf.problems) == 1 and pf.problems[0].startswith("free disk at ")
    small = plan.request.model.model_copy(update={"vocab_size": 100})
    other = plan.model_copy(update={"request": plan.request.model_copy(update={"model": small})})
    from planner.errors import PlanError
    with pytest.raises(PlanError, match="vocab 256 but the model's vocab is 100"):
        check_data(other, tiny_data)
    assert check_resume(plan, tmp_path / "nothing", resume=False) is None
    for strategy in ("zero1", "zero2", "fsdp"):      # the runner implements them all (runner/parallel.py)
        sharded = load_plan(tiny_plan(f"{strategy}.json", strategy=strategy))
        assert run_preflight(sharded, f"{strategy}.json", tmp_path / "run", None, False).ok


def test_sigterm_checkpoints_exits_0_and_the_next_run_resumes(tmp_path: Path, tiny_plan) -> None:
    plan = tiny_plan(steps=150)
    run = tmp_path / "run"
    # a slow final write (1 s) so that a second SIGTERM lands in the middle of it
    proc = subprocess.Popen([sys.executable, "-m", "nanoplan", "run", str(plan), "--run-dir", str(run)],
                            cwd=REPO, env=runner_env(NANOPLAN_CKPT_DELAY_S="1.0"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(read_metrics(run)) < 5 and proc.poll() is None:
            time.sleep(0.05)
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)              # a second signal during the checkpoint write
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:]
    assert "already stopping" in err
    stop = json.loads((run / "stop.json").read_text())
    assert stop["reason"] == "signal" and stop["signals"] == ["SIGTERM"]
    step = stop["step"]
    assert 5 <= step < 150 and read_metrics(run)[-1]["step"] == step
    assert verify(step_dir(run, step)) == (True, "ok")

    r = nanoplan("run", str(plan), "--run-dir", str(run), timeout=120)   # resumes automatically
    assert r.returncode == 0, r.stderr[-3000:]
    rows = read_metrics(run)
    assert [x["step"] for x in rows] == list(range(1, 151))
    assert rows[step]["segment"] == 1 and rows[step - 1]["segment"] == 0
    assert json.loads((run / "stop.json").read_text())["reason"] == "total_steps"


def test_example_plan_is_current() -> None:
    from planner.build import rederive

    path = REPO / "examples" / "tiny" / "plan.json"
    plan = load_plan(path)
    assert rederive(plan, "examples/tiny/plan.json")[1] == []
    assert plan.hardware.spec == "2xCPU" and plan.budget.hours == 0.01 and plan.training.compile is False
    assert plan.request.data_dir == "data/tiny" and plan.launch.run_dir == "runs/tiny"
