"""nanoplan probe: neighbour selection, trial records, the choice, the corrected plan, the time box,
and (slow) real 2-process trials on CPU with a forced out-of-memory neighbour."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from planner.build import build_plan
from planner.errors import PlanError
from planner.plan import PlanRequest, load_plan
from planner.probe import (
    MIN_GAIN,
    NO_FIT,
    OK,
    TrialConfig,
    before_after,
    choose,
    corrected_length,
    measurement_of,
    neighbours,
    replan,
    trial_plan,
    trial_record,
)
from planner.profiles import find_profile
from planner.spec import nanochat
from runner.probe import fault_for, kill_trial, parse_faults, read_trial, run_trial
from tests.conftest import REPO, make_tiny_plan, runner_env

GiB = 1 << 30


def gpu_plan(**kw):  # noqa: ANN201
    req = dict(gpu="8xH100", profile=find_profile("H100"), model=nanochat(4, 256, 256), hours=2.0,
               total_batch_tokens=65536, device_batch_size=8)
    return build_plan(PlanRequest(**{**req, **kw}))


def raw_ok(tps_steps: list[float], **memory) -> dict:
    mem = dict.fromkeys(("max_memory_allocated", "max_memory_reserved", "mem_get_info_free", "mem_get_info_total",
                         "device_used_bytes", "non_allocator_bytes"))
    mem.update(memory)
    return {"status": "ok", "step_seconds": tps_steps, "warmup_step_seconds": [5.0], "phases": None,
            "final_loss": 5.0, "setup_seconds": 3.0, "memory": mem}


# ---------------------------------------------------------------------------- neighbours


def test_neighbours_are_the_next_micro_batches_and_checkpointing_off() -> None:
    plan = gpu_plan(activation_checkpointing=True)          # 65536 / (256 × 8) = 32 rows: 32, 16, 8, 4, 2, 1
    got = [(c.role, c.device_batch_size, c.activation_checkpointing) for c in neighbours(plan)]
    assert got == [("plan", 8, True), ("smaller", 4, True), ("bigger", 16, True), ("ckpt off", 8, False)]
    assert [c.label for c in neighbours(plan)] == ["b8-ac", "b4-ac", "b16-ac", "b8"]
    top = gpu_plan(device_batch_size=None)  # the planner's own choice
    b = top.training.device_batch_size
    roles = [c.role for c in neighbours(top)]
    assert roles[0] == "plan" and "ckpt off" not in roles and ("bigger" in roles) == (b < 32)
    one = build_plan(PlanRequest(gpu="2xCPU", profile=find_profile("CPU"), model=nanochat(1, 64, 256), steps=5,
                                 total_batch_tokens=128, precision="fp32", compile=False))
    assert [c.label for c in neighbours(one)] == ["b1"]     # nothing divides a one-row batch but itself


def test_trial_plan_is_the_plan_at_that_config_and_length() -> None:
    plan = gpu_plan(activation_checkpointing=True)
    tp = trial_plan(plan, TrialConfig("bigger", 16, True), 11)
    assert tp.training.device_batch_size == 16 and tp.training.grad_accum_steps == 2
    assert tp.schedule.total_steps == 11 and tp.budget.limited_by == "steps"
    assert tp.request.hyper.val_every_steps == 0 and tp.request.model == plan.request.model
    assert tp.throughput.mfu == plan.throughput.mfu and tp.memory.per_gpu_bytes > plan.memory.per_gpu_bytes


# ---------------------------------------------------------------------------- records and choice


def test_trial_record_measures_tokens_mfu_and_fit_on_cuda_readings() -> None:
    plan = gpu_plan()
    tp = trial_plan(plan, TrialConfig("plan", 8, False), 11)
    step = tp.schedule.tokens_per_step / 1e6                 # 1M tokens/s
    raw = raw_ok([step * 1.1, step, step * 0.9, step], max_memory_allocated=40 * GiB, max_memory_reserved=44 * GiB,
                 mem_get_info_total=80 * GiB, non_allocator_bytes=GiB)
    rec = trial_record(TrialConfig("plan", 8, False), tp, OK, raw, 12.0)
    m = rec["measured"]
    assert m["tokens_per_sec"] == pytest.approx(1e6)          # median of the step times
    assert m["mfu"] == pytest.approx(1e6 * tp.model.flops_per_token / (8 * tp.throughput.peak_flops_per_gpu))
    assert m["peak_device_bytes"] == 45 * GiB and rec["fits_with_headroom"] is True
    assert rec["error"]["tokens_per_sec"] == pytest.approx(tp.throughput.tokens_per_sec / 1e6 - 1)
    # the cap is the smaller of mem_get_info's total and the profile's usable memory, less the headroom
    cap = min(80 * GiB, tp.request.profile.usable_bytes) * (1 - tp.request.headroom)
    over = raw_ok([step], max_memory_reserved=int(cap) - GiB + 1, non_allocator_bytes=GiB, mem_get_info_total=80 * GiB)
    assert trial_record(TrialConfig("plan", 8, False), tp, OK, over, 1.0)["fits_with_headroom"] is False
    under = raw_ok([step], max_memory_reserved=int(cap) - GiB, non_allocator_bytes=GiB, mem_get_info_total=80 * GiB)
    assert trial_record(TrialConfig("plan", 8, False), tp, OK, under, 1.0)["fits_with_headroom"] is True


def test_without_cuda_readings_the_memory_model_decides_the_fit() -> None:
    plan = gpu_plan()
    tp = trial_plan(plan, TrialConfig("plan", 8, False), 11)
    rec = trial_record(TrialConfig("plan", 8, False), tp, OK, raw_ok([0.1, 0.1, 0.1]), 1.0)
    assert rec["fits_with_headroom"] is tp.memory.fits and rec["measured"]["peak_device_bytes"] is None
    assert "memory model" in rec["fit_basis"]
    oom = trial_record(TrialConfig("bigger", 16, False), tp, NO_FIT, {"memory": {"max_memory_allocated": 9}}, 1.0)
    assert oom["fits_with_headroom"] is False and oom["measured"] == {"max_memory_allocated": 9}


def rec(label: str, role: str, tps: float | None, fits: bool = True, status: str = OK) -> dict:
    return {"label": label, "role": role, "status": status, "fits_with_headroom": fits if status == OK else False,
            "measured": {"tokens_per_sec": tps} if tps else None}


def test_choose_the_fastest_that_fits_but_keep_the_plans_within_noise() -> None:
    trials = [rec("b8", "plan", 100.0), rec("b4", "smaller", 90.0), rec("b16", "bigger", 130.0, fits=False),
              rec("b8-off", "ckpt off", 120.0)]
    best, why = choose(trials)
    assert best["label"] == "b8-off" and "fastest" in why
    close = [rec("b8", "plan", 100.0), rec("b16", "bigger", 100.0 * (1 + MIN_GAIN) - 0.01)]
    assert choose(close)[0]["label"] == "b8"
    far = [rec("b8", "plan", 100.0), rec("b16", "bigger", 100.0 * (1 + MIN_GAIN) + 0.01)]
    assert choose(far)[0]["label"] == "b16"
    no_own = [rec("b8", "plan", None, status=NO_FIT), rec("b4", "smaller", 50.0)]
    assert choose(no_own)[0]["label"] == "b4"
    none, why = choose([rec("b8", "plan", None, status=NO_FIT), rec("b4", "smaller", 9.0, fits=False)])
    assert none is None and "b8 does not fit" in why and "b4 ok (over the headroom)" in why


# ---------------------------------------------------------------------------- the corrected plan


def test_probe_time_is_charged_to_hours_and_dollars_not_to_steps() -> None:
    hours_plan = gpu_plan()
    assert corrected_length(hours_plan, 360.0)[0] == {"hours": pytest.approx(1.9)}
    budget = build_plan(PlanRequest(gpu="8xH100", profile=find_profile("H100"), model=nanochat(4, 256, 256),
                                    budget_usd=100.0, total_batch_tokens=65536))
    upd, note = corrected_length(budget, 1800.0)
    assert upd == {"budget_usd": pytest.approx(100.0 - 0.5 * budget.budget.usd_per_hour)} and "probe" in note
    steps = build_plan(PlanRequest(gpu="8xH100", profile=find_profile("H100"), model=nanochat(4, 256, 256),
                                   steps=1000, total_batch_tokens=65536))
    upd, note = corrected_length(steps, 1800.0)
    assert upd == {} and "not charged" in note
    with pytest.raises(PlanError, match="whole 2.0 h"):
        corrected_length(hours_plan, 2.5 * 3600)


def test_replan_reproduces_the_measured_speed_and_derives_the_schedule_from_it() -> None:
    plan = gpu_plan(activation_checkpointing=True, mfu=0.9)       # an optimistic plan
    chosen = trial_plan(plan, TrialConfig("ckpt off", 8, False), 11)
    tps = chosen.throughput.tokens_per_sec / 3                     # the machine does a third of it
    m = measurement_of(chosen, label="probe/b8", tokens_per_sec=tps, steps=6, device="NVIDIA H100", date="2026-11-23")
    new, profile, note = replan(plan, chosen, m, 600.0, plan_path="plan.probed.json", today="2026-11-23")
    assert new.throughput.tokens_per_sec == pytest.approx(tps, rel=1e-4)
    assert new.request.mfu is None and len(profile.mfu_curve) == 1 and "calibrated 2026-11-23" in profile.description
    assert profile.name == "H100-SXM-probed" and new.request.profile == profile
    from planner.validate import check_plan

    assert check_plan(new, "plan.probed.json").ok              # nanoplan validate accepts the corrected plan
    assert new.training.device_batch_size == 8 and new.training.activation_checkpointing is False
    assert new.request.hours == pytest.approx(2.0 - 600 / 3600) and "probe" in note
    step_s = new.schedule.tokens_per_step / tps
    assert new.budget.startup_seconds == 60 + 120           # the run after the probe starts and compiles again
    assert new.schedule.total_steps == pytest.approx(math.floor((new.request.hours * 3600 - 180) / step_s), rel=1e-5)
    assert new.schedule.checkpoint_every_steps == pytest.approx(60 * 60 / step_s, rel=1e-5)
    assert new.launch.command[new.launch.command.index("--plan") + 1] == "plan.probed.json"
    rows = dict((a, (b, c)) for a, b, c in before_after(plan, new, {"measured": {"peak_device_bytes": 3 * GiB}}))
    assert rows["micro-batch × accum"] == ("8 × 4, ddp, AC", "8 × 4, ddp, no AC") and "measured" in rows["tokens/s (MFU)"][1]
    assert rows["peak memory per GPU"][1] == "3.00 GiB measured"


# ---------------------------------------------------------------------------- fault hook and time box


def test_fault_hook_selectors() -> None:
    faults = parse_faults("oom:8, hang:b2-ac")
    assert faults == [("oom", "8"), ("hang", "b2-ac")]
    assert fault_for(faults, 8, "b8-ac") == "oom" and fault_for(faults, 2, "b2-ac") == "hang"
    assert fault_for(faults, 2, "b2") is None and fault_for(parse_faults("oom:*"), 3, "b3") == "oom"
    assert parse_faults("") == []
    with pytest.raises(PlanError, match="NANOPLAN_PROBE_FAULT"):
        parse_faults("crash:8")


HANG = """
import os, subprocess, sys, time, pathlib
d = pathlib.Path(sys.argv[1])
kid = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])                  # same group
own = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)  # like a worker
(d / "kids").write_text(f"{kid.pid} {own.pid}")
time.sleep(600)
"""


def test_time_box_kills_the_trial_and_its_own_session_children(tmp_path: Path) -> None:
    from runner.launcher import pid_alive

    t0 = time.monotonic()
    timed_out, rc = run_trial([sys.executable, "-c", HANG, str(tmp_path)], dict(os.environ), tmp_path, 3.0)
    assert timed_out and rc is None and time.monotonic() - t0 < 20
    kids = [int(x) for x in (tmp_path / "kids").read_text().split()]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(pid_alive(p) for p in kids):
        time.sleep(0.05)
    assert not any(pid_alive(p) for p in kids)
    assert read_trial(tmp_path, True, None, 3.0)[0] == "timed out"


def test_read_trial_statuses(tmp_path: Path) -> None:
    (tmp_path / "log.txt").write_text("...\nerror: --data: nope (fix it)\n")
    assert read_trial(tmp_path, False, 1, 9.0) == ("failed", None, "exit 1: error: --data: nope (fix it)")
    (tmp_path / "log.txt").write_text("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n")
    assert read_trial(tmp_path, False, 1, 9.0)[0] == NO_FIT
    (tmp_path / "oom_rank1.json").write_text(json.dumps({"rank": 1, "error": "CUDA out of memory", "memory": {}}))
    assert read_trial(tmp_path, False, 1, 9.0)[:1] == (NO_FIT,)
    (tmp_path / "oom_rank1.json").unlink()
    (tmp_path / "result.json").write_text(json.dumps({"status": "ok"}))
    assert read_trial(tmp_path, False, 0, 9.0)[0] == OK


def test_kill_trial_leaves_unrelated_processes_alone(tmp_path: Path) -> None:
    from runner.launcher import pid_alive

    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    (tmp_path / "pid_rank0").write_text(str(other.pid))        # a pid file naming a process that is not a worker
    trial = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        kill_trial(trial, tmp_path)
        assert trial.poll() is not None and pid_alive(other.pid)
    finally:
        other.kill()
        other.wait()


# ---------------------------------------------------------------------------- real trials (2 gloo processes)


def nanoplan(*args: str, env: dict[str, str] | None = None, timeout: float = 240,
             cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nanoplan", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd, env=runner_env(**(env or {})))


@pytest.mark.slow
def test_probe_end_to_end_with_an_oom_neighbour(tmp_path: Path, tiny_data: Path) -> None:
    """Two real trials: the plan (micro-batch 1) and its bigger neighbour (2), which is made to run out
    of memory inside its first step. probe.json records it as not fitting; the corrected plan is the
    plan's configuration at its measured speed, with the probe's time taken off the hours."""
    plan = make_tiny_plan(tmp_path / "plan.json", tiny_data, steps=None, hours=0.5, total_batch_tokens=256,
                          device_batch_size=1, mfu=0.9)
    out, pdir = tmp_path / "plan.probed.json", tmp_path / "probe"
    r = nanoplan("probe", str(plan), "--out", str(out), "--dir", str(pdir), "--warmup", "2", "--steps", "4",
                 env={"NANOPLAN_PROBE_FAULT": "oom:2"})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rep = json.loads((pdir / "probe.json").read_text())
    trials = {t["label"]: t for t in rep["trials"]}
    assert list(trials) == ["b1", "b2"] and [t["role"] for t in rep["trials"]] == ["plan", "bigger"]
    big, own = trials["b2"], trials["b1"]
    assert big["status"] == NO_FIT and big["fits_with_headroom"] is False and big["grad_accum_steps"] == 1
    assert "injected by NANOPLAN_PROBE_FAULT" in big["note"]
    assert (pdir / "trials" / "b2" / "oom_rank0.json").exists()
    assert rep["device"] == "cpu" and rep["torch"] and rep["date"][:4].isdigit() and rep["world_size"] == 2
    assert own["status"] == OK and own["fits_with_headroom"] is True and own["grad_accum_steps"] == 2
    m = own["measured"]
    assert len(m["step_seconds"]) == 4 and len(m["warmup_step_seconds"]) == 2
    assert set(m["phases"]) == {"data", "forward_backward", "optimizer", "rest"} and all(v >= 0 for v in m["phases"].values())
    assert m["tokens_per_sec"] < own["predicted"]["tokens_per_sec"]              # --mfu 0.9 is optimistic
    assert rep["chosen"] == "b1"
    new = load_plan(out)
    assert new.training.device_batch_size == 1 and new.request.mfu is None
    assert new.throughput.tokens_per_sec == pytest.approx(m["tokens_per_sec"], rel=1e-4)
    assert new.request.hours == pytest.approx(0.5 - rep["cost"]["hours"], rel=1e-9)
    assert 0 < rep["cost"]["seconds"] < 240
    assert new.schedule.total_steps < load_plan(plan).schedule.total_steps
    assert rep["after"]["steps"] == new.schedule.total_steps and Path(rep["profile"]).exists()
    assert "Trials" in r.stdout and "Before and after the probe" in r.stdout and "charged to the budget" in r.stdout
    assert "does not fit" in r.stdout


@pytest.mark.slow
def test_run_probe_measures_then_runs_the_corrected_plan(tmp_path: Path, tiny_data: Path) -> None:
    """`run --probe` on a plan with one configuration (a one-row batch): the probe, then the corrected
    plan runs to its steps in the same command; a second `run --probe` resumes it without probing."""
    plan = make_tiny_plan(tmp_path / "plan.json", tiny_data, steps=25, total_batch_tokens=128, mfu=0.9)
    run = tmp_path / "run"
    r = nanoplan("run", str(plan), "--probe", "--run-dir", str(run))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rep = json.loads((run / "probe" / "probe.json").read_text())
    assert [t["label"] for t in rep["trials"]] == ["b1"] and rep["chosen"] == "b1"
    new = load_plan(run / "plan.probed.json")
    assert new.schedule.total_steps == 25 and "not charged" in rep["charged"]
    assert new.throughput.tokens_per_sec == pytest.approx(rep["trials"][0]["measured"]["tokens_per_sec"], rel=1e-4)
    stop = json.loads((run / "stop.json").read_text())
    assert stop["reason"] == "total_steps" and stop["step"] == 25
    assert stop["summary"]["planned"]["steps"] == 25 and stop["summary"]["achieved"]["tokens"] == 25 * 128
    assert "--plan " + str(run / "plan.probed.json") in r.stderr           # the launch runs the corrected plan
    assert "summary" in r.stdout and "Before and after the probe" in r.stdout

    from runner.probe import probe_for_run

    logs: list[str] = []
    path, res = probe_for_run(plan, run, log=logs.append)
    assert res is None and path == run / "plan.probed.json" and "without a new probe" in logs[0]


# ---------------------------------------------------------------------------- the probe's loop, with fake trials


def fake_trials(monkeypatch, seconds: float, oom: tuple[str, ...] = ()) -> list[str]:  # noqa: ANN001
    """Replace the torchrun launch: each trial sleeps `seconds` and writes what a worker would."""
    import runner.probe as rp

    ran: list[str] = []

    def run(cmd, env, trial_dir, timeout_s):  # noqa: ANN001, ANN202
        time.sleep(seconds)
        label = trial_dir.name
        ran.append(label)
        if label in oom:
            (trial_dir / "oom_rank0.json").write_text(json.dumps({"rank": 0, "error": "out of memory", "memory": {}}))
            return False, 1
        (trial_dir / "result.json").write_text(json.dumps({"status": "ok", "step_seconds": [0.01] * 4, "memory": {},
                                                           "device": "cpu", "torch": "x", "cuda": None}))
        return False, 0

    monkeypatch.setattr(rp, "run_trial", run)
    return ran


def test_no_trial_may_take_the_probe_past_half_the_plan(tmp_path, tiny_data, monkeypatch) -> None:
    from runner.probe import probe

    plan = make_tiny_plan(tmp_path / "plan.json", tiny_data, steps=None, hours=0.5, total_batch_tokens=1024,
                          device_batch_size=4, activation_checkpointing=True)
    monkeypatch.setenv("NANOPLAN_TIME_SCALE", "4000")          # a 0.15 s trial is 600 budget seconds
    ran = fake_trials(monkeypatch, 0.15)
    res = probe(plan, out=tmp_path / "out.json", work_dir=tmp_path / "p", log=lambda s: None)
    assert ran == ["b4-ac"]                                     # 600 s + 600 s > half of 1800 s
    skipped = [t for t in res.report["trials"] if t["status"] == "skipped"]
    assert [t["label"] for t in skipped] == ["b2-ac", "b8-ac", "b4"]
    assert "50% of the plan's length" in skipped[0]["note"]
    assert res.corrected is not None and res.corrected.request.hours == pytest.approx(0.5 - res.report["cost"]["hours"])
    assert json.loads((tmp_path / "p" / "probe.json").read_text())["chosen"] == "b4-ac"


def test_nothing_fits_is_one_error_line_and_probe_json_is_kept(tmp_path, tiny_data, monkeypatch) -> None:
    from runner.probe import probe

    plan = make_tiny_plan(tmp_path / "plan.json", tiny_data, steps=30, total_batch_tokens=1024, device_batch_size=8)
    fake_trials(monkeypatch, 0.0, oom=("b8", "b4"))
    with pytest.raises(PlanError, match="no trial ran and fit with headroom"):
        probe(plan, out=tmp_path / "out.json", work_dir=tmp_path / "p", log=lambda s: None)
    rep = json.loads((tmp_path / "p" / "probe.json").read_text())
    assert [t["status"] for t in rep["trials"]] == [NO_FIT, NO_FIT] and rep["chosen"] is None
    assert not (tmp_path / "out.json").exists()


def test_bad_input_is_one_error_line(tmp_path: Path, tiny_data: Path) -> None:
    plan = make_tiny_plan(tmp_path / "plan.json", tiny_data, steps=30)
    for args, env, field in ((["--steps", "0"], {}, "--warmup/--steps"),
                             ([], {"NANOPLAN_PROBE_FAULT": "boom"}, "NANOPLAN_PROBE_FAULT"),
                             (["--data", str(tmp_path / "none")], {}, "--data")):
        r = nanoplan("probe", str(plan), "--dir", str(tmp_path / "p"), *args, env=env, timeout=60)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        lines = [x for x in r.stderr.splitlines() if x.startswith("error:")]
        assert len(lines) == 1 and lines[0].startswith(f"error: {field}"), r.stderr
