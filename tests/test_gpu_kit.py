"""The GPU day kit (scripts/gpu_kit.sh, benchmarks/gpu_kit*.py): its CPU mode end to end, so the kit cannot rot
between GPU loans, and the offline checks behind `prepare` (imports against the GPU image, the wheels)."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import statistics
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from types import ModuleType

import pytest

from planner.build import build_plan
from planner.plan import PlanRequest, load_plan
from planner.profiles import find_profile
from planner.spec import preset

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "benchmarks"
KIT_SH = REPO / "scripts" / "gpu_kit.sh"


def load(name: str) -> ModuleType:
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[name] = mod         # dataclasses look their module up there
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess, Path]:
    """`scripts/gpu_kit.sh run --cpu` once, as a person would run it (no wheels: this Python's packages)."""
    tmp = tmp_path_factory.mktemp("kit")
    (tmp / "nowheels").mkdir()
    env = {k: v for k, v in os.environ.items() if k != "OUT"}
    env.update(OMP_NUM_THREADS="1", GPU_KIT_WHEELS=str(tmp / "nowheels"), PYTHON=sys.executable)
    r = subprocess.run(["bash", str(KIT_SH), "run", "--cpu", "--out", str(tmp / "out"), "--work", str(tmp / "work")],
                       capture_output=True, text=True, timeout=400, env=env, cwd=tmp)
    return r, tmp


@pytest.mark.slow
def test_cpu_mode_runs_every_part_end_to_end(cpu_run: tuple[subprocess.CompletedProcess, Path]) -> None:
    r, tmp = cpu_run
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = tmp / "out"
    assert sorted(p.name for p in out.iterdir()) == ["gpu_kit.json", "gpu_kit.log", "gpu_kit.md"]
    res = json.loads((out / "gpu_kit.json").read_text())
    assert res["mode"] == "cpu" and res["results_dir"] == f"benchmarks/results/gpu/{res['date']}-CPU"
    assert [t["task"] for t in res["tasks"]] == ["env", "compiled:tiny", "probe", "run", "eager:tiny"]
    assert {t["task"]: t["status"] for t in res["tasks"]} == dict.fromkeys(
        ["env", "compiled:tiny", "probe", "run", "eager:tiny"], "ok"), [t["status"] for t in res["tasks"]]
    assert res["wall_s"] < 420 and all(t["wall_s"] <= t["limit_s"] for t in res["tasks"])

    env = res["env"]
    assert env["torch"].startswith("2.") and env["cuda_available"] is False and env["python"].startswith("3.")
    assert env["packages"]["pydantic"]["version"] == metadata.version("pydantic")
    assert set(env["project_imports"].values()) == {"ok"} and all(env["torch_apis"].values())
    assert env["requirement_problems"] == []

    # (a) and (d): the measured numbers recomputed from the recorded step times, the predictions the planner's
    spec = preset("tiny")
    for name in ("compiled:tiny", "eager:tiny"):
        row = next(t for t in res["tasks"] if t["task"] == name)["result"]
        st = row["step_seconds"]
        assert len(st) == res["config"]["steps"] == 2 and all(s > 0 for s in st)
        assert row["tokens_per_sec"] == pytest.approx(row["tokens_per_step"] / statistics.median(st), rel=1e-12)
        plan = build_plan(PlanRequest(gpu="1xCPU", profile=find_profile("CPU"), model=spec, precision="fp32",
                                      total_batch_tokens=spec.seq_len, device_batch_size=1, optimizer="adamw",
                                      compile=False, steps=3))
        assert row["predicted_tokens_per_sec"] == pytest.approx(plan.throughput.tokens_per_sec, rel=1e-12)
        assert row["compile"] is False and row["max_memory_allocated"] is None    # CPU mode: no compile, no CUDA
        assert 0 < row["final_loss"] < 6.0

    # (b) the probe measured the plan's own trial and wrote its report
    probe = next(t for t in res["tasks"] if t["task"] == "probe")["result"]
    assert probe["exit_code"] == 0 and probe["report"]["chosen"] == "b1"
    assert [(t["label"], t["status"]) for t in probe["report"]["trials"]] == [("b1", "ok")]
    assert load_plan(probe["plan"]).training.device_batch_size == 1

    # (c) launch 1 stopped on SIGINT with a checkpoint; launch 2 resumed there and ran to the deadline (or, on a
    # machine faster than the CPU profile says, to the plan's last step first)
    run = next(t for t in res["tasks"] if t["task"] == "run")["result"]
    assert all(run["checks"].values()) and len(run["checks"]) == 7, run["checks"]
    (s1, s2) = [la["stop"] for la in run["launches"]]
    assert s1["reason"] == "signal" and s2["reason"] in ("deadline", "total_steps") and s2["step"] > s1["step"] >= 3
    assert [s["first_step"] for s in run["segments"]] == [1, s1["step"] + 1]
    assert run["segments"][1]["last_step"] == s2["step"]
    assert f"step_{s2['step']:08d}" == run["checkpoints"][-1]       # launch 1's may be gone: keep-last 3
    assert run["segments"][-1]["elapsed_hours"] <= run["hours"]

    md = (out / "gpu_kit.md").read_text()
    for heading in ("## Tasks", "## (a) compiled step and (d) eager step", "## (b) nanoplan probe on the d2 plan",
                    "## (c) nanoplan run: checkpoint, stop, resume"):
        assert heading in md
    assert "| compiled:tiny | d2 | 131k | 1 | eager | ok |" in md and "CPU mode: torch.compile is off" in md
    assert "| launch 1 stopped on SIGINT with a checkpoint | yes |" in md and "**no**" not in md
    assert "Compile gain" not in md       # both steps were eager: no gain to claim
    log = (out / "gpu_kit.log").read_text()
    assert "=== run: exited 0" in log and "resumed from runs/run/checkpoints/" in log
    assert "note: no wheels in" in r.stdout and r.stdout.rstrip().endswith(f"{res['results_dir']}/")


@pytest.mark.slow
def test_compare_replans_the_measured_steps(cpu_run: tuple[subprocess.CompletedProcess, Path]) -> None:
    """benchmarks/gpu_kit_compare.py on the CPU run's result: today's planner is the one that ran, so its
    predictions now equal those on the day, for every step and quantity."""
    r, tmp = cpu_run
    assert r.returncode == 0
    cmp = load("gpu_kit_compare")
    rows = cmp.compare(json.loads((tmp / "out" / "gpu_kit.json").read_text()))
    assert [(x["task"], x["quantity"]) for x in rows] == [
        (task, q) for task in ("compiled:tiny", "eager:tiny") for q in ("tokens/s", "allocated", "reserved",
                                                                        "device used")]
    for x in rows:
        assert x["predicted_now"] == pytest.approx(x["predicted_then"], rel=1e-12), x
    tps = [x for x in rows if x["quantity"] == "tokens/s"]
    assert all(x["error_now"] == pytest.approx(x["predicted_now"] / x["measured"] - 1) for x in tps)
    assert all(x["measured"] is None and x["error_now"] is None for x in rows if x["quantity"] != "tokens/s")
    p = subprocess.run([sys.executable, str(BENCH / "gpu_kit_compare.py"), str(tmp / "out")], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0 and p.stdout.splitlines()[2].startswith("compiled:tiny  tokens/s")


# ---------------------------------------------------------------------------- imports against the GPU image


def test_every_import_on_the_kit_path_is_in_the_image_or_the_wheels() -> None:
    imp = load("gpu_kit_imports")
    cov = imp.coverage()
    assert cov.problems == [], cov.problems
    by = {mod: frm for mod, _dist, frm, _who in cov.rows}
    assert by["pydantic"] == "kit" and by["torch"] == by["typer"] == by["yaml"] == by["numpy"] == "image"
    found = imp.kit_imports()
    # the torchrun targets are found through the strings that launch them, the commands through the CLI's table
    for mod in ("runner.train", "runner.probe_worker", "nanoplan.probe", "nanoplan.run", "nanoplan.data",
                "nanoplan.estimate", "planner.plan", "runner.step", "runner.model"):
        assert mod in found.project, mod
    assert "nanoplan.export" not in found.project and "runner.trace" not in found.project    # not on its path
    assert "matplotlib" in found.modules and "matplotlib" not in found.required              # optional import


def test_a_missing_package_is_named(tmp_path: Path) -> None:
    imp = load("gpu_kit_imports")
    found = imp.kit_imports()
    pins = tmp_path / "wheels.txt"
    pins.write_text("\n".join(ln for ln in imp.WHEELS_FILE.read_text().splitlines() if "pydantic==" not in ln))
    cov = imp.coverage(wheels_file=pins, found=found)
    assert any(p.startswith("pydantic (distribution pydantic)") for p in cov.problems), cov.problems
    image = tmp_path / "image.txt"
    image.write_text("\n".join(ln for ln in imp.IMAGE_FILE.read_text().splitlines() if ln.strip() != "torch"))
    assert any(p.startswith("torch ") for p in imp.coverage(image_file=image, found=found).problems)


def test_the_walk_reads_every_kind_of_import() -> None:
    imp = load("gpu_kit_imports")
    src = ("from typing import TYPE_CHECKING\nimport alpha.sub\nif TYPE_CHECKING:\n    import hidden\n"
           "try:\n    import beta\nexcept ImportError:\n    beta = None\n"
           "def f():\n    from gamma import x\n    return ['-m', 'runner.train']\nfrom . import sibling\n")
    got = dict(imp._imports(ast.parse(src), "runner"))
    assert got["alpha.sub"] is False and got["beta"] is True and got["gamma"] is False
    assert "hidden" not in got and got["runner.train"] is False and got["runner.sibling"] is False
    assert "runner.train" not in dict(imp._imports(ast.parse(src), "runner", strings=False))


def test_image_list_is_dated_and_has_no_pydantic() -> None:
    imp = load("gpu_kit_imports")
    text = imp.IMAGE_FILE.read_text()
    assert "# image-date: 2026-11-17" in text and "KINDS.md" in text
    names = imp.image_packages()
    assert len(names) > 150 and {"torch", "numpy", "typer", "rich", "pyyaml", "packaging"} <= names
    assert not names & {"pydantic", "pydantic-core", "annotated-types", "typing-inspection"}
    pins = imp.kit_wheels()
    assert {"pydantic", "pydantic-core", "annotated-types", "typing-inspection"} <= set(pins)


def test_the_wheels_requirements_are_carried_at_fitting_versions() -> None:
    imp = load("gpu_kit_imports")
    pins, image = imp.kit_wheels(), imp.image_packages()
    if metadata.version("pydantic") != pins["pydantic"]:
        pytest.skip("this environment's pydantic is not the pinned one: prepare checks the wheels' own metadata")
    assert imp.requirement_problems(pins, image) == ([], [])
    # pydantic needs typing-extensions>=4.16.0: an older pin is refused, and so is none at all
    old = {**pins, "typing-extensions": "4.12.2"}
    assert any("typing-extensions>=4.16.0" in p for p in imp.requirement_problems(old, image)[0])
    gone = {k: v for k, v in pins.items() if k != "pydantic-core"}
    assert any("pydantic-core==" in p for p in imp.requirement_problems(gone, image - {"pydantic-core"})[0])


def test_the_install_constraints_pin_the_kits_wheels() -> None:
    """What the GPU machine installs is what every other install of this project gets: constraints.txt pins each
    carried wheel at its version (a Python that already had an older pydantic kept it, and the docs' output of
    `python benchmarks/gpu_kit_imports.py` changed)."""
    pins = load("gpu_kit_imports").kit_wheels()
    constraints = {}
    for ln in (REPO / "constraints.txt").read_text().splitlines():
        name, sep, ver = ln.split("#")[0].strip().partition("==")
        if sep:
            constraints[name.strip().lower().replace("_", "-")] = ver.strip()
    assert {n: constraints.get(n) for n in pins} == pins


def _touch(d: Path, *names: str) -> None:
    for n in names:
        (d / n).write_bytes(b"")


def test_the_wheel_folder_check_prune_and_has(tmp_path: Path) -> None:
    imp = load("gpu_kit_imports")
    pins = {"pydantic": "2.14.4", "pydantic-core": "2.50.5"}
    ok = ("pydantic-2.14.4-py3-none-any.whl",
          "pydantic_core-2.50.5-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.whl")
    _touch(tmp_path, *ok)
    assert imp.wheel_problems(tmp_path, pins) == []
    assert imp.has(tmp_path, "pydantic==2.14.4") and not imp.has(tmp_path, "pydantic==2.14.3")
    _touch(tmp_path, "pydantic-2.13.0-py3-none-any.whl", "rich-13.0.0-py3-none-any.whl")
    probs = imp.wheel_problems(tmp_path, pins)
    assert any("pydantic: 2 wheels" in p and "keep one version" in p for p in probs)
    assert any(p.startswith("rich-13.0.0-py3-none-any.whl: not in") for p in probs)
    assert sorted(p.name for p in imp.prune(tmp_path, pins)) == ["pydantic-2.13.0-py3-none-any.whl",
                                                                 "rich-13.0.0-py3-none-any.whl"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(ok)
    (tmp_path / ok[1]).unlink()
    _touch(tmp_path, "pydantic_core-2.50.5-cp311-cp311-manylinux_2_17_x86_64.whl",
           "pydantic_core-2.50.5-cp312-cp312-macosx_11_0_arm64.whl")
    probs = imp.wheel_problems(tmp_path, pins)
    assert sum("not for CPython 3.12 on manylinux x86-64" in p for p in probs) == 2
    (tmp_path / "pydantic_core-2.50.5-cp311-cp311-manylinux_2_17_x86_64.whl").unlink()
    (tmp_path / "pydantic_core-2.50.5-cp312-cp312-macosx_11_0_arm64.whl").unlink()
    assert imp.wheel_problems(tmp_path, pins) == ["pydantic-core==2.50.5: no wheel in "
                                                  f"{tmp_path} (run scripts/gpu_kit.sh prepare)"]


# ---------------------------------------------------------------------------- the GPU side, checked on the CPU


def test_the_time_shares_fit_seven_minutes() -> None:
    kit = load("gpu_kit")
    tasks = kit.task_list(False, list(kit.PARTS), [20, 26])
    assert [t for t, _ in tasks] == ["env", "compiled:d20", "compiled:d26", "probe", "run", "eager:d20", "eager:d26"]
    assert sum(lim for _, lim in tasks) <= 400 and kit.TOTAL_LIMIT_S <= 420
    # a task gets its share and what the ones before it left unused, never the later tasks' shares
    assert kit.task_limit(tasks, 0, 0.0, 420.0) == 30
    assert kit.task_limit(tasks, 3, 100.0, 420.0) == 65 + (30 + 80 + 75 - 100)
    assert kit.task_limit(tasks, 3, 250.0, 420.0) == 420 - 250 - (100 + 25 + 25)      # late: less than its share
    assert kit.task_limit(tasks, 6, 300.0, 420.0) == 25 + (375 - 300)


@pytest.mark.parametrize("profile", ["H100-SXM", "H200"])
def test_the_gpu_plans_are_valid_and_fit(profile: str, tmp_path: Path) -> None:
    """What the GPU mode plans, made here: the steps fit with grad accum 1, and `nanoplan estimate` accepts
    the probe's and the run's arguments for the GPU (exit 0, a plan with a run dir inside WORK)."""
    kit, parts = load("gpu_kit"), load("gpu_kit_parts")
    k = parts.Kit({**kit.GPU_CONFIG, "mode": "gpu", "work": str(tmp_path), "profile": profile}, deadline=1e18)
    for depth in (20, 26):
        plan = k.step_point(depth, compiled=True)
        eager = k.step_point(depth, compiled=False)
        assert plan.memory.fits and plan.training.compile and plan.training.grad_accum_steps == 1
        assert plan.training.seq_len == 2048 and plan.training.precision == "bf16-autocast"
        assert eager.training.device_batch_size == plan.training.device_batch_size and not eager.training.compile
        assert (kit.GPU_CONFIG["warmup"] + kit.GPU_CONFIG["steps"]) * plan.throughput.step_seconds < 15
    b = k.step_point(20, compiled=True).training.device_batch_size
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "meta.json").write_text('{"vocab_size": 256, "train_tokens": 1000000, "val_tokens": 100000, '
                                                 '"dtype": "uint16", "tokenizer": "byte"}')
    for name, args in (("probe", parts.probe_plan_args(k, b, 2048, tmp_path / "probe.json")),
                       ("run", parts.run_plan_args(k, tmp_path / "data", tmp_path / "run.json"))):
        r = subprocess.run([sys.executable, "-m", "nanoplan", "estimate", *args], capture_output=True, text=True,
                           cwd=tmp_path, env=parts.child_env(), timeout=120)
        assert r.returncode == 0, (name, r.stdout[-2000:], r.stderr[-2000:])
        plan = load_plan(tmp_path / f"{name}.json")
        assert plan.hardware.num_gpus == 1 and plan.request.profile.name == profile and plan.memory.fits
        assert plan.training.compile and plan.launch.run_dir == f"runs/{name}"
    run = load_plan(tmp_path / "run.json")
    assert run.request.hours == kit.GPU_CONFIG["run_hours"] and run.training.loss_chunk_tokens == 0


def test_run_checks_catch_a_run_that_did_not_resume() -> None:
    parts = load("gpu_kit_parts")
    rows = [{"step": s, "loss": 2.0, "elapsed_hours": 0.01, "max_memory_allocated": 1, "compiled": True,
             "tokens_per_sec": 1000.0, "device": "NVIDIA H100 80GB HBM3",
             "segment": 0 if s <= 5 else 1} for s in range(1, 30)]
    rec = {"hours": 0.02, "launches": [
        {"exit_code": 0, "stop": {"reason": "signal", "step": 5, "checkpoint": "runs/run/checkpoints/step_00000005"}},
        {"exit_code": 0, "stop": {"reason": "deadline", "step": 29, "checkpoint": "runs/run/checkpoints/step_00000029"}}],
        "run_info": {"segments": [{"resumed_from_step": None}, {"resumed_from_step": 5}]},
        "checkpoints": ["step_00000005", "step_00000029"]}
    rec["segments"] = parts._segments(rows)
    assert all(parts.run_checks(rec, rows, cpu=False).values())
    rec["launches"][1]["stop"]["reason"] = "total_steps"      # a machine faster than the plan: its last step first
    assert all(parts.run_checks(rec, rows, cpu=False).values())
    rec["run_info"]["segments"][1]["resumed_from_step"] = None          # launch 2 started over
    rec["launches"][1]["stop"]["reason"] = "signal"                      # and was stopped before the plan's end
    rows[-1]["max_memory_allocated"] = None                              # and one step had no CUDA reading
    failed = [k for k, v in parts.run_checks(rec, rows, cpu=False).items() if not v]
    assert failed == ["launch 2 resumed from that checkpoint",
                      "launch 2 ran to the deadline or the last step, with a checkpoint", "CUDA memory readings"]


def test_an_eager_oom_is_measured_at_half_the_micro_batch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On the GPU the eager step may not fit at the compiled step's micro-batch: it is recorded, and measured at
    half (the compiled step is not retried). The OOM is injected into the CPU mode's step."""
    import torch

    parts, kit = load("gpu_kit_parts"), load("gpu_kit")
    suite = parts.load_suite()
    real, calls = suite.run_point, []

    def run_point(plan, device, warmup, steps):  # noqa: ANN001, ANN202
        calls.append(plan.training.device_batch_size)
        if len(calls) == 1:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(plan, device, warmup, steps)

    suite.run_point = run_point
    monkeypatch.setattr(parts, "load_suite", lambda: suite)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    k = parts.Kit({**kit.CPU_CONFIG, "max_batch": 4, "mode": "cpu", "work": str(tmp_path), "profile": None}, 1e18)
    saved: list[dict] = []
    parts.task_step(k, saved.append, None, compiled=False)
    assert calls == [4, 2]
    assert [s["status"] for s in saved] == ["running", "OOM", "OOM; measuring at half the micro-batch", "ok"]
    assert saved[-1]["device_batch_size"] == 2 and saved[-1]["tokens_per_step"] == 2 * 64
    assert saved[-1]["notes"] == ["OOM at micro-batch 4 (the planner said it fits); measured at 2"]
    calls.clear()
    saved.clear()
    parts.task_step(k, saved.append, None, compiled=True)
    assert calls == [4] and [s["status"] for s in saved] == ["running", "OOM"]
    assert saved[-1]["error"] == "CUDA out of memory. Tried to allocate 2.00 GiB"


def test_the_markdown_of_a_gpu_result() -> None:
    """The report's GPU-only cells (device, driver, GiB, the compile gain), from a hand-made GPU record."""
    report = load("gpu_kit_report")
    step = {"model": "d20", "n_params": 560_988_160, "device_batch_size": 16, "predicted_tokens_per_sec": 102_619,
            "tokens_per_sec": 90_000.0, "tokens_per_sec_error": 0.14, "predicted_allocated_bytes": 40 * 2**30,
            "max_memory_allocated": 38 * 2**30, "allocated_error": 0.05, "predicted_reserved_bytes": 42 * 2**30,
            "max_memory_reserved": 41 * 2**30, "reserved_error": 0.02, "predicted_memory_bytes": 46 * 2**30,
            "device_used_bytes": 42 * 2**30, "device_used_error": 0.1, "compile_and_first_step_s": 61.2}
    res = {"mode": "gpu", "date": "2026-12-01", "start": "2026-12-01T10:00:00+00:00", "wall_s": 350.0,
           "results_dir": "benchmarks/results/gpu/2026-12-01-H100-SXM", "notes": [],
           "config": {"profile": "H100-SXM", "warmup": 3, "steps": 10},
           "env": {"torch": "2.11.0+cu130", "cuda_runtime": "13.0", "python": "3.12.3", "commit": "abc",
                   "packages": {"pydantic": {"version": "2.14.4", "carried": True}},
                   "device": {"name": "NVIDIA H100 80GB HBM3", "total_memory": 85_520_809_984, "multiprocessors": 132,
                              "capability": "9.0", "smi_driver": "580.159.04"}},
           "tasks": [{"task": "env", "status": "ok", "limit_s": 35, "wall_s": 9.0, "result": {}},
                     {"task": "compiled:d20", "status": "ok", "limit_s": 80, "wall_s": 70.0,
                      "result": {**step, "compile": True}},
                     {"task": "eager:d20", "status": "ok", "limit_s": 30, "wall_s": 20.0,
                      "result": {**step, "compile": False, "tokens_per_sec": 60_000.0}}]}
    md = report.markdown(res)
    assert md.startswith("# GPU kit: NVIDIA H100 80GB HBM3 (H100-SXM), 2026-12-01\n")
    assert "| driver | 580.159.04 |" in md and "| pydantic | 2.14.4 (carried wheel) |" in md
    assert "| compiled:d20 | d20 | 561M | 16 | compiled | ok | 102,619 | 90,000 | +14.0% | 40.00 | 38.00 |" in md
    assert "Compile gain, d20: 90,000 / 60,000 tokens/s = 1.50×" in md
    assert report.summary_lines(res)[-2] == "  compile gain d20: 1.50x"


def test_bad_arguments_and_a_python_without_pydantic(tmp_path: Path) -> None:
    r = subprocess.run(["bash", str(KIT_SH)], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.startswith("usage: scripts/gpu_kit.sh prepare | check | run")
    bare = tmp_path / "python"      # this interpreter without its site-packages: no pydantic, as on the GPU image
    bare.write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')
    bare.chmod(0o755)
    (tmp_path / "nowheels").mkdir()
    env = {**os.environ, "PYTHON": str(bare), "GPU_KIT_WHEELS": str(tmp_path / "nowheels"), "PYTHONPATH": ""}
    r = subprocess.run(["bash", str(KIT_SH), "run", "--cpu"], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 2
    assert r.stderr.splitlines() == [
        f"error: pydantic cannot be imported by {bare}, and {tmp_path / 'nowheels'} holds no wheels",
        f"hint: run scripts/gpu_kit.sh prepare on a machine with the network, and carry {tmp_path / 'nowheels'}"]
    kit = load("gpu_kit")
    assert kit.main(["run", "--parts", "compiled,bogus", "--out", str(tmp_path / "o"),
                     "--work", str(tmp_path / "w")]) == 2
    # nothing runs without env (it decides the mode and the GPU's profile)
    assert kit.main(["run", "--cpu", "--limit", "env=0.5", "--out", str(tmp_path / "o"), "--work",
                     str(tmp_path / "w")]) == 0
    res = json.loads((tmp_path / "o" / "gpu_kit.json").read_text())
    assert [t["task"] for t in res["tasks"]] == ["env"] and res["tasks"][0]["status"].startswith("skipped: 0 s left")
    assert res["notes"] == ["env did not run: nothing runs without it"]
