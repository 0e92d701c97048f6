"""`nanoplan calibrate` on metrics recorded from real CPU runs (tests/data/calibration/make_fixtures.sh)."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from planner.build import build_plan
from planner.calibrate import calibrate_profile, file_hash, measure_run
from planner.plan import load_plan, save_plan
from planner.profiles import find_profile, load_profile_file
from planner.throughput import OVERLAP
from tests.errlines import error_and_hint

FIX = Path(__file__).parent / "data" / "calibration"
RUNS = ["tiny-1cpu", "tiny-2cpu", "d2-1cpu", "d3-1cpu"]
# estimate flags that rebuild each fixture's configuration (make_fixtures.sh)
MODEL_ARGS = {"tiny-1cpu": ["--preset", "tiny"], "tiny-2cpu": ["--preset", "tiny"],
              "d2-1cpu": ["--depth", "2"], "d3-1cpu": ["--depth", "3"]}


def nanoplan(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nanoplan", *args], capture_output=True, text=True, timeout=60)


def run_cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, *args: str) -> tuple[int, str, str]:
    """nanoplan.main in this process (fast): (exit code, stdout, stderr)."""
    from nanoplan.cli import main

    monkeypatch.setattr(sys, "argv", ["nanoplan", *args])
    monkeypatch.setenv("COLUMNS", "200")
    with pytest.raises(SystemExit) as e:
        main()
    out = capsys.readouterr()
    return int(e.value.code or 0), out.out, out.err


def expected(name: str) -> dict[str, float]:
    """Steady-state numbers computed straight from the files with plain arithmetic."""
    d = FIX / name
    lines = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines() if x.strip()]
    plan = json.loads((d / "plan.json").read_text())
    info = json.loads((d / "run_info.json").read_text())
    last = {}
    for r in lines:                      # a resumed launch re-logs steps; its lines win
        last[r["step"]] = r
    total = plan["schedule"]["total_steps"]
    starts = [s["resumed_from_step"] or 0 for s in info["segments"]]
    kept_steps = []
    for i, start in enumerate(starts):   # each launch: steps start+1 .. next launch's start (or the end)
        end = starts[i + 1] if i + 1 < len(starts) else total
        steps = list(range(start + 1, end + 1))
        skip = max(5, math.ceil(len(steps) / 10))
        kept_steps += [s for s in steps[skip:] if s % 10]   # validation ran every 10 steps
    tps = statistics.median(last[s]["tokens_per_sec"] for s in kept_steps)
    ws = plan["hardware"]["num_gpus"]
    mfu = tps * plan["model"]["flops_per_token"] / (ws * plan["throughput"]["peak_flops_per_gpu"])
    return {"tps": tps, "mfu": mfu, "used": len(kept_steps), "first": kept_steps[0], "ws": ws,
            "n_params": plan["model"]["n_params"], "tokens_per_step": plan["schedule"]["tokens_per_step"],
            "flops": plan["model"]["flops_per_token"], "peak": plan["throughput"]["peak_flops_per_gpu"],
            "comm": plan["throughput"]["comm_seconds"], "micro_batch": plan["training"]["device_batch_size"],
            "strategy": plan["training"]["strategy"]}


CPU_HBM_BYTES_S = 0.02e12 * 0.9   # CPU profile hbm_tb_s × throughput.HBM_EFFICIENCY


def fixed_seconds(e: dict) -> float:
    """The step time the planner does not scale with 1/MFU, for these fixtures (fp32 AdamW, ddp, one
    micro-step, CPU: no launch term): fused AdamW reads p, g, m, v and writes p, m, v (7 × 4 bytes per
    parameter); clipping reads the gradients and scales them in place (3 × 4 bytes)."""
    return (7 + 3) * 4 * e["n_params"] / CPU_HBM_BYTES_S


def fitted(e: dict) -> float:
    """The planner MFU that reproduces a 1-process run's measured step: compute = step - fixed."""
    step = e["tokens_per_step"] / e["tps"]
    return e["tokens_per_step"] * e["flops"] / (e["peak"] * (step - fixed_seconds(e)))


def test_fixtures_are_real_runner_output() -> None:
    for name in RUNS:
        info = json.loads((FIX / name / "run_info.json").read_text())
        stop = json.loads((FIX / name / "stop.json").read_text())
        assert info["torch_version"] and info["device"] == "cpu" and stop["reason"] == "total_steps"
    segs = json.loads((FIX / "d2-1cpu" / "run_info.json").read_text())["segments"]
    assert len(segs) == 2 and segs[1]["resumed_from_step"] is not None   # killed at step 30 and resumed


@pytest.mark.parametrize("name", RUNS)
def test_steady_state_numbers(name: str) -> None:
    e = expected(name)
    m = measure_run(FIX / name)
    assert m.tokens_per_sec == pytest.approx(e["tps"], rel=1e-12)
    assert m.mfu == pytest.approx(e["mfu"], rel=1e-12)
    assert (m.steps_used, m.first_step_used, m.num_gpus) == (e["used"], e["first"], e["ws"])
    assert m.max_memory_allocated is None and m.max_memory_reserved is None and m.fragmentation is None
    assert m.warnings == (), f"{m.warnings}: re-record with bash tests/data/calibration/make_fixtures.sh"
    if e["ws"] == 1:   # no communication: compute is the measured step less the optimizer's memory traffic
        assert m.fitted_mfu == pytest.approx(fitted(e), rel=1e-9)
        assert m.fitted_mfu > m.mfu


def test_file_hash_is_the_runners_plan_hash(tmp_path: Path) -> None:
    from planner.plan import plan_hash

    plan = load_plan(FIX / "d3-1cpu" / "plan.json")
    save_plan(plan, tmp_path / "plan.json")
    assert file_hash(tmp_path / "plan.json") == plan_hash(plan)


def test_skip_steps_option_and_partial_last_line(tmp_path: Path) -> None:
    run = tmp_path / "tiny-1cpu"
    shutil.copytree(FIX / "tiny-1cpu", run)
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 41, "tokens_per')                   # a write in progress: ignored
    rows = {json.loads(x)["step"]: json.loads(x) for x in (FIX / "tiny-1cpu" / "metrics.jsonl").read_text().splitlines()}
    m = measure_run(run, skip_steps=20)
    steps = [s for s in range(21, 41) if s % 10]
    assert m.tokens_per_sec == pytest.approx(statistics.median(rows[s]["tokens_per_sec"] for s in steps), rel=1e-12)
    assert m.steps_used == len(steps) == 18


def test_torn_line_of_a_killed_launch_is_skipped(tmp_path: Path) -> None:
    """A kill mid-write leaves a torn line; the resumed launch (segment 1) starts a fresh line after it."""
    run = tmp_path / "d2-1cpu"
    shutil.copytree(FIX / "d2-1cpu", run)
    lines = (run / "metrics.jsonl").read_text().splitlines()
    first_resumed = next(i for i, x in enumerate(lines) if json.loads(x)["segment"] == 1)
    lines.insert(first_resumed, '{"step": 30, "total_steps": 40, "lo')
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    m = measure_run(run)
    assert m.tokens_per_sec == measure_run(FIX / "d2-1cpu").tokens_per_sec
    assert len(m.warnings) == 1 and "torn line" in m.warnings[0]


def test_calibrate_writes_profile_and_estimate_uses_it(tmp_path: Path) -> None:
    out = tmp_path / "my_profile.yaml"
    r = nanoplan("calibrate", *(str(FIX / n) for n in RUNS), "--out", str(out), "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    prof = load_profile_file(out)
    e = {n: expected(n) for n in RUNS}

    # one MFU point per model size, from its single-process run (no communication there)
    single = {e[n]["n_params"]: fitted(e[n]) for n in RUNS if e[n]["ws"] == 1}
    assert [p.n_params for p in prof.mfu_curve] == sorted(single) == [131_072, 458_752, 1_425_408]
    for p in prof.mfu_curve:
        assert p.mfu == pytest.approx(single[p.n_params], abs=1e-6)
    assert prof.default_mfu == pytest.approx(statistics.median(single.values()), abs=1e-6)

    # the 2-process run's extra time over its 1-process compute becomes an effective link bandwidth
    t2 = e["tiny-2cpu"]
    step = t2["tokens_per_step"] / t2["tps"]
    compute = t2["tokens_per_step"] * t2["flops"] / (2 * single[131_072] * t2["peak"])
    # throughput.exposed_seconds inverted by hand: grad_accum 1, the all-reduce runs beside the backward (2/3 of
    # the compute); beside it (1 - OVERLAP) of its time shows, beyond it all of it
    exposed, window = step - compute - fixed_seconds(t2), 2 / 3 * compute
    comm = exposed / (1 - OVERLAP) if exposed <= (1 - OVERLAP) * window else exposed + OVERLAP * window
    assert prof.intra_node_gb_s == pytest.approx(5.0 * t2["comm"] / comm, rel=1e-5)

    # assumptions stay assumptions and say so; calibrated figures name runs, device and date
    base = load_plan(FIX / RUNS[0] / "plan.json").request.profile      # the profile the runs were planned on
    assert prof.overheads.fragmentation == base.overheads.fragmentation
    assert "assumption" in prof.overheads.source and "no CUDA memory" in prof.overheads.source
    for key in ("default_mfu", "mfu_curve", "intra_node_gb_s"):
        assert "calibrated" in prof.sources[key] and "cpu" in prof.sources[key] and "runs dated 20" in prof.sources[key]
    assert all(n in prof.sources["mfu_curve"] for n in RUNS)
    assert [x["run_dir"] for x in report["runs"]] == [str(FIX / n) for n in RUNS]
    assert out.read_text().startswith("# Calibrated by nanoplan calibrate")

    # estimate --profile: predicted tokens/s lands on the measured one, per configuration
    for name in RUNS:
        x = e[name]
        args = ["estimate", "--profile", str(out), "--gpu", f"{x['ws']}xCPU", *MODEL_ARGS[name], "--seq-len", "64",
                "--vocab-size", "256", "--steps", "40", "--total-batch-tokens", str(x["tokens_per_step"]),
                "--device-batch-size", str(x["micro_batch"]), "--strategy", x["strategy"], "--json"]   # the run's setting
        before = json.loads(nanoplan(*[a for a in args if a not in ("--profile", str(out))]).stdout)
        res = nanoplan(*args)
        assert res.returncode == 0, res.stderr
        after = json.loads(res.stdout)["throughput"]["tokens_per_sec"]
        assert abs(after - x["tps"]) / x["tps"] < 1e-5, (name, after, x["tps"])   # exact up to the YAML's rounding
        assert abs(after - x["tps"]) < abs(before["throughput"]["tokens_per_sec"] - x["tps"])
        if name == "tiny-2cpu":
            break   # the other three are covered by the in-process check below (keeps the test fast)
    for row in report["runs"]:
        # the calibrated profile reproduces every run: the inversion is exact, up to the 6 digits the YAML keeps
        assert row["calibrated_tokens_per_sec"] == pytest.approx(row["tokens_per_sec"], rel=1e-5)

    # a model between two calibrated sizes gets the log-linear interpolation of their MFUs
    res = nanoplan("estimate", "--profile", str(out), "--gpu", "1xCPU", "--n-layer", "4", "--d-model", "64",
                   "--n-head", "2", "--seq-len", "64", "--vocab-size", "256", "--steps", "10",
                   "--total-batch-tokens", "1024", "--json")
    plan = json.loads(res.stdout)
    n = plan["model"]["n_params"]
    (n0, m0), (n1, m1) = [(p.n_params, p.mfu) for p in prof.mfu_curve[:2]]
    assert n0 < n < n1
    t = (math.log(n) - math.log(n0)) / (math.log(n1) - math.log(n0))
    assert plan["throughput"]["mfu"] == pytest.approx(m0 + t * (m1 - m0), rel=1e-9)


def test_table_output(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    code, out, err = run_cli(monkeypatch, capsys, "calibrate", str(FIX / "tiny-1cpu"), str(FIX / "tiny-2cpu"))
    assert code == 0, err
    assert "Predicted vs measured" in out and "tiny-2cpu" in out and "add --out" in out
    e = expected("tiny-1cpu")
    assert f"{e['tps']:,.0f}" in out and f"{e['mfu']:.2%}" in out


def test_fragmentation_from_cuda_memory() -> None:
    """With CUDA numbers, fragmentation = median(reserved / allocated - 1); context stays assumed."""
    m = measure_run(FIX / "tiny-1cpu")
    a = dataclasses.replace(m, max_memory_allocated=1000, max_memory_reserved=1100)
    b = dataclasses.replace(m, max_memory_allocated=2000, max_memory_reserved=2600)
    c = dataclasses.replace(m, max_memory_allocated=4000, max_memory_reserved=4400)
    base = find_profile("CPU")
    prof = calibrate_profile(base, [a, b, c], today="2026-01-02")
    assert prof.overheads.fragmentation == pytest.approx(0.10)
    assert prof.overheads.cuda_context_bytes == base.overheads.cuda_context_bytes
    assert "fragmentation measured" in prof.overheads.source and "cuda_context_bytes kept" in prof.overheads.source
    prof2 = calibrate_profile(base, [a], today="2026-01-02", non_allocator_bytes=123_456_789)
    assert prof2.overheads.cuda_context_bytes == 123_456_789 and "mem_get_info" in prof2.overheads.source


def test_other_base_profile_rescales_mfu(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture,
                                         tmp_path: Path) -> None:
    """--profile FILE with twice the peak: the same measured speed is half the MFU."""
    import yaml

    data = find_profile("CPU").model_dump(mode="json")
    data.update(fp32_tflops=0.15, name="CPU2x")
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(data))
    code, out, err = run_cli(monkeypatch, capsys, "calibrate", str(FIX / "d3-1cpu"), "--profile",
                             str(tmp_path / "base.yaml"), "--json")
    assert code == 0, err
    prof = json.loads(out)["profile"]
    assert prof["name"] == "CPU2x"
    assert prof["mfu_curve"][0]["mfu"] == pytest.approx(fitted(expected("d3-1cpu")) / 2, abs=1e-6)


def test_swapped_plan_with_same_batch_warns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture) -> None:
    run = _copy(tmp_path)
    shutil.copy(FIX / "d2-1cpu" / "plan.json", run / "plan.json")   # same tokens/step, another model
    code, out, err = run_cli(monkeypatch, capsys, "calibrate", str(run))
    assert code == 0, err
    assert "warning:" in out and "differs from run_info.json" in out


def _copy(tmp_path: Path, name: str = "tiny-1cpu") -> Path:
    dst = tmp_path / name
    shutil.copytree(FIX / name, dst)
    return dst


def _edit_lines(run: Path, fn) -> None:  # noqa: ANN001
    p = run / "metrics.jsonl"
    p.write_text("".join(x + "\n" for x in fn(p.read_text().splitlines())))


@pytest.mark.parametrize("case,needle", [
    ("missing", "is not a directory"),
    ("no_metrics", "metrics.jsonl: does not exist"),
    ("few_steps", "only 2 remain"),
    ("malformed", "metrics.jsonl:12: is not valid JSON"),
    ("not_object", "metrics.jsonl:3: is not a JSON object"),
    ("no_tokens", "has no tokens_per_sec"),
    ("other_world", "ran on 1 processes but its plan is for 2 GPUs"),
    ("other_plan", "is not the plan this run executed: it has 512 tokens per step"),
    ("no_plan", "has no plan.json and run_info.json"),
    ("skip", "--skip-steps"),
])
def test_bad_input_one_line_exit_2(case: str, needle: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture) -> None:
    args: list[str] = []
    if case == "missing":
        args = [str(tmp_path / "nope")]
    elif case == "no_metrics":
        (tmp_path / "empty").mkdir()
        args = [str(tmp_path / "empty")]
    else:
        run = _copy(tmp_path)
        args = [str(run)]
        if case == "few_steps":
            _edit_lines(run, lambda ls: ls[:7])
        elif case == "malformed":
            _edit_lines(run, lambda ls: ls[:11] + ['{"step": 12, "loss": 1.0,'] + ls[12:])
        elif case == "not_object":
            _edit_lines(run, lambda ls: ls[:2] + ["[1, 2]"] + ls[3:])
        elif case == "no_tokens":
            _edit_lines(run, lambda ls: [json.dumps({k: v for k, v in json.loads(x).items() if k != "tokens_per_sec"})
                                         for x in ls])
        elif case == "other_world":
            shutil.copy(FIX / "tiny-2cpu" / "plan.json", run / "plan.json")
        elif case == "other_plan":
            plan = load_plan(run / "plan.json")
            save_plan(build_plan(plan.request.model_copy(update={"total_batch_tokens": 512, "device_batch_size": 8})),
                      run / "plan.json")
        elif case == "no_plan":
            (run / "plan.json").unlink()
        elif case == "skip":
            args += ["--skip-steps", "-1"]
    code, out, err = run_cli(monkeypatch, capsys, "calibrate", *args)
    assert code == 2, (out, err)
    line, _ = error_and_hint(err)
    assert needle in line, err
