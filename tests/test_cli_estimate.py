"""`nanoplan estimate` end to end: output, plan.json, one-line errors with exit code 2."""

import json
import subprocess
import sys

import pytest

from planner.plan import load_plan
from tests.errlines import error_and_hint


def nanoplan(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nanoplan", *args], capture_output=True, text=True, timeout=60)


def test_estimate_writes_valid_plan(tmp_path) -> None:
    out = tmp_path / "plan.json"
    r = nanoplan("estimate", "--gpu", "8xH100", "--budget", "1000", "--depth", "20", "--price", "4",
                 "--dataset-tokens", "100B", "--explain", "--out", str(out))
    assert r.returncode == 0, r.stderr
    for word in ("560,988,160", "31.25 h", "grad accum", "epochs", "storage", "torch.distributed.run"):
        assert word in r.stdout
    plan = load_plan(out)
    assert plan.hardware.num_gpus == 8 and plan.model.n_params == 560_988_160
    assert plan.training.device_batch_size * plan.training.grad_accum_steps == 32
    assert plan.memory.per_gpu_bytes <= plan.memory.capacity_bytes
    assert plan.schedule.total_steps > 0 and plan.budget.usd == pytest.approx(1000)
    assert "--plan" in plan.launch.command and str(out) in plan.launch.command


def test_json_output_parses() -> None:
    r = nanoplan("estimate", "--gpu", "2xCPU", "--preset", "tiny", "--hours", "0.01",
                 "--total-batch-tokens", "1024", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["schema_version"] == 1 and d["training"]["precision"] == "fp32"
    assert d["hardware"]["num_gpus"] == 2 and d["budget"]["usd"] == 0


@pytest.mark.parametrize("args,field", [
    (["--gpu", "8xV100", "--depth", "20", "--hours", "1"], "--gpu"),
    (["--gpu", "8xH100", "--depth", "0", "--hours", "1"], "--depth"),
    (["--gpu", "8xH100", "--depth", "20", "--hours", "1", "--budget", "5"], "exactly one"),
    (["--gpu", "8xH100", "--depth", "20", "--hours", "1", "--device-batch-size", "3"], "--device-batch-size"),
    (["--gpu", "8xH100", "--depth", "20", "--hours", "1", "--dataset-tokens", "lots"], "--dataset-tokens"),
    (["--gpu", "8xH100", "--depth", "20", "--hours", "1", "--provider", "nope"], "--provider"),
    (["--gpu", "8xH100", "--n-layer", "4", "--d-model", "100", "--n-head", "3", "--hours", "1"], "divisible"),
    (["--gpu", "8xH100", "--depth", "20", "--hours", "1", "--profile", "/nonexistent.yaml"], "--profile"),
    (["--gpu", "8xH100", "--depth", "20", "--hours", "-1"], "hours"),
])
def test_bad_input_one_line_exit_2(args: list[str], field: str) -> None:
    r = nanoplan("estimate", *args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    line, _ = error_and_hint(r.stderr)
    assert field in line, r.stderr


def test_user_profile(tmp_path) -> None:
    import yaml

    from planner.profiles import find_profile
    d = find_profile("H100").model_dump()
    d.update(name="my-cluster", aliases=[], usable_bytes=40 * 2**30)
    f = tmp_path / "mine.yaml"
    f.write_text(yaml.safe_dump(d))
    r = nanoplan("estimate", "--gpu", "8xmy-cluster", "--profile", str(f), "--depth", "12", "--hours", "1", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["hardware"]["profile_name"] == "my-cluster"


def test_a_model_without_a_length_plans_twenty_tokens_per_param(tmp_path) -> None:
    """`estimate --gpu 8xH100 --depth 20` (no --budget/--hours/--steps) plans a compute-optimal run, not an error."""
    out = tmp_path / "plan.json"
    r = nanoplan("estimate", "--gpu", "8xH100", "--depth", "20", "--out", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "20 tokens per parameter (Chinchilla's rule), over all 561M parameters" in " ".join(r.stdout.split())
    plan = load_plan(out)
    steps = -(-20 * 560_988_160 // 524_288)
    assert plan.schedule.total_steps == steps and plan.budget.limited_by == "steps"
    assert plan.schedule.tokens_per_param == pytest.approx(20, rel=1e-3)
    r = nanoplan("estimate", "--gpu", "8xH100")          # no model and no length: the search needs a budget
    assert r.returncode == 2 and "--budget" in r.stdout + r.stderr
