"""benchmarks/gpu_suite.py: the tiny CPU mode runs end to end, so the GPU harness cannot rot."""

from __future__ import annotations

import importlib.util
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from planner.build import build_plan
from planner.counts import flops_per_token
from planner.errors import PlanError
from planner.plan import PlanRequest
from planner.profiles import find_profile, load_profile_file
from planner.spec import preset

REPO = Path(__file__).resolve().parents[1]
SUITE = REPO / "benchmarks" / "gpu_suite.py"


def load_suite():  # noqa: ANN201
    spec = importlib.util.spec_from_file_location("gpu_suite", SUITE)
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def test_cpu_tiny_mode_writes_json_markdown_and_profile(tmp_path: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    r = subprocess.run([sys.executable, str(SUITE), "--cpu-tiny", "--out-dir", str(tmp_path)], capture_output=True,
                       text=True, timeout=180, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    [js] = list(tmp_path.glob("CPU-*.json"))
    res = json.loads(js.read_text())
    assert js.with_suffix(".md").exists() and Path(res["calibrated_profile"]).exists()
    assert res["device"] == "cpu" and res["profile"] == "CPU" and res["config"]["compile"] is False
    runs = res["runs"]
    assert [r["optimizer"] for r in runs] == ["adamw", "muon"] and all(r["status"] == "ok" for r in runs)

    spec = preset("tiny")
    peak = find_profile("CPU").fp32_tflops * 1e12
    for row in runs:
        # measured numbers, recomputed from the recorded step times with plain arithmetic
        st = row["step_seconds"]
        assert len(st) == 2 and all(t > 0 for t in st)
        tokens = row["device_batch_size"] * spec.seq_len
        assert row["tokens_per_step"] == tokens
        tps = tokens / statistics.median(st)
        assert row["tokens_per_sec"] == pytest.approx(tps, rel=1e-12)
        assert row["mfu"] == pytest.approx(tps * flops_per_token(spec) / peak, rel=1e-12)
        # predictions are the planner's for the same configuration
        req = PlanRequest(gpu="1xCPU", profile=find_profile("CPU"), model=spec, total_batch_tokens=tokens,
                          device_batch_size=row["device_batch_size"], precision="fp32", optimizer=row["optimizer"],
                          compile=False, steps=3)
        plan = build_plan(req)
        assert row["predicted_tokens_per_sec"] == pytest.approx(plan.throughput.tokens_per_sec, rel=1e-12)
        assert row["predicted_memory_bytes"] == plan.memory.per_gpu_bytes
        assert row["max_memory_reserved"] is None and row["device_used_bytes"] is None   # no CUDA here
        assert 0 < row["final_loss"] < 6.0   # finite, and no worse than ~ln(256) = 5.55 on random tokens

    md = js.with_suffix(".md").read_text()
    assert md.count("| d2 |") == 2 and "tokens/s pred" in md and "mem_get_info used" in md
    prof = load_profile_file(res["calibrated_profile"])
    assert [p.n_params for p in prof.mfu_curve] == [131_072]
    assert prof.mfu_curve[0].mfu == pytest.approx(statistics.median(r["fitted_mfu"] for r in runs), abs=1e-6)


def test_bad_arguments_exit_2(capsys: pytest.CaptureFixture) -> None:
    suite = load_suite()
    assert suite.main(["--cpu-tiny"]) == 2
    assert suite.main(["--cpu-tiny", "--out-dir", "x", "--optimizers", "sgd"]) == 2
    err = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert err[0].startswith("error: --out-dir") and err[1].startswith("error: --optimizers")


@pytest.mark.parametrize("name,profile", [
    ("NVIDIA H100 80GB HBM3", "H100-SXM"), ("NVIDIA H100 PCIe", "H100-PCIe"), ("NVIDIA H200", "H200"),
    ("NVIDIA A100-SXM4-40GB", "A100-40GB"), ("NVIDIA A100-SXM4-80GB", "A100-80GB"), ("NVIDIA B200", "B200"),
])
def test_profile_from_device_name(name: str, profile: str) -> None:
    assert load_suite().profile_for_device(name).name == profile


def test_unknown_gpu_needs_profile() -> None:
    with pytest.raises(PlanError, match="--profile"):
        load_suite().profile_for_device("NVIDIA GeForce GTX 1080")


def test_default_h100_grid_is_planned_within_the_time_box() -> None:
    """The default grid: micro-batch <= 32 that the planner says fits, grad accum 1, and predicted
    step time small enough that 10 runs fit in 8 minutes with room for compilation."""
    suite = load_suite()
    prof = find_profile("H100")
    total = 0.0
    for depth in suite.DEFAULT_DEPTHS:
        for opt in suite.DEFAULT_OPTIMIZERS:
            plan = suite.plan_point(suite.nanochat(depth), prof, opt, precision="bf16-autocast", compile=True,
                                    max_batch=32, steps=15)
            assert plan.memory.fits and plan.training.grad_accum_steps == 1
            assert plan.training.device_batch_size <= 32 and plan.training.seq_len == 2048
            total += 15 * plan.throughput.step_seconds
    assert total < 120, total
    assert suite.DEFAULT_TIME_BUDGET_S < 480


def test_time_budget_skips_and_probe_larger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    suite = load_suite()
    assert suite.main(["--cpu-tiny", "--out-dir", str(tmp_path / "a"), "--time-budget", "0"]) == 0
    res = json.loads(next((tmp_path / "a").glob("*.json")).read_text())
    assert [r["status"].split(":")[0] for r in res["runs"]] == ["skipped", "skipped"]
    assert res["calibrated_profile"] is None and "| skipped" in next((tmp_path / "a").glob("*.md")).read_text()

    assert suite.main(["--cpu-tiny", "--out-dir", str(tmp_path / "b"), "--optimizers", "adamw", "--probe-larger"]) == 0
    runs = json.loads(next((tmp_path / "b").glob("*.json")).read_text())["runs"]
    assert [(r["device_batch_size"], r["status"]) for r in runs] == [(4, "ok"), (8, "ok")]
    assert runs[1]["note"].startswith("probe") and runs[1]["tokens_per_step"] == 8 * 64
