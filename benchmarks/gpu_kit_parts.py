"""The GPU kit's parts, one task per process: benchmarks/gpu_kit.py runs each under its own time limit.

    python benchmarks/gpu_kit_parts.py TASK --config WORK/config.json

Tasks (GPU mode; the CPU mode runs the same code at toy sizes: the "tiny" preset, fp32, 1xCPU):
- env: Python, torch, CUDA, the device and its driver, the versions of the packages the kit relies on (and
  where each comes from: the carried wheels or the image), the torch APIs the runner needs, the project's imports.
- compiled:dN: the runner's compiled step (benchmarks/gpu_suite.py: runner.plan_model.build_model,
  runner.step.build_optimizer and train_step, one host sync per step) at the micro-batch the planner picks for
  nanochat dN on one GPU (bf16 autocast, seq 2048, AdamW, grad accum 1): tokens/s, peak allocated and
  reserved memory, mem_get_info, each against the plan.
- probe: `nanoplan probe` on the d20 plan of compiled:d20, on a data dir made here (no download).
- run: a short `nanoplan run` of a small model on that data: launch 1 is stopped by SIGINT after a few steps
  (it checkpoints), launch 2 resumes and runs to the end of the plan: the budget's deadline, or its last step
  first when the machine is faster than the plan said (it checkpoints again).
- eager:dN: the same step as compiled:dN without torch.compile, at the same micro-batch (the compile gain).

Each task saves its record (WORK/tasks/TASK.json, temp file then rename) as soon as it has something, so a
task killed at its time limit still leaves what it measured.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import platform
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "benchmarks"
for _p in (str(REPO), str(BENCH)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from gpu_kit_imports import KIT_COMMANDS  # noqa: E402

Save = Callable[[dict[str, Any]], None]
# what the env task reports versions of (distribution names)
PACKAGES = ("pydantic", "pydantic-core", "typing-extensions", "annotated-types", "typing-inspection", "typer", "rich",
            "click", "pyyaml", "numpy", "pandas", "packaging", "torch", "triton")
# the torch APIs on the kit's path that are newer than torch 2.4 (tested against torch 2.11.0's sources, docs/gpu.md)
TORCH_APIS = ("optim.Muon", "OutOfMemoryError", "get_autocast_dtype", "distributed.fsdp.fully_shard",
              "distributed.fsdp.MixedPrecisionPolicy", "distributed.tensor.experimental.implicit_replication",
              "utils.checkpoint.create_selective_checkpoint_contexts", "library._scoped_library",
              "distributed.checkpoint.state_dict.get_model_state_dict")
PROJECT_IMPORTS = ("planner.build", "runner.train", "runner.probe_worker", "nanoplan.cli", "nanoplan.run",
                   "nanoplan.probe", "nanoplan.data", "nanoplan.estimate")


def load_suite() -> Any:
    """benchmarks/gpu_suite.py as a module (benchmarks/ is no package)."""
    spec = importlib.util.spec_from_file_location("gpu_suite", BENCH / "gpu_suite.py")
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def write_json(path: Path, data: Any) -> None:
    """Temp file, then rename: a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n")
    os.replace(tmp, path)


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


class Kit:
    """A task's settings (WORK/config.json, written by benchmarks/gpu_kit.py) and its helpers."""

    def __init__(self, cfg: dict[str, Any], deadline: float) -> None:
        self.cfg = cfg
        self.cpu = cfg["mode"] == "cpu"
        self.work = Path(cfg["work"])
        self.deadline = deadline                 # time.monotonic() at which the kit kills this task

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def profile_name(self) -> str:
        return "CPU" if self.cpu else self.cfg["profile"]

    def step_point(self, depth: int | None, compiled: bool, batch: int | None = None) -> Any:
        """The plan of a step measurement: the planner's compiled micro-batch (or `batch`), grad accum 1."""
        from planner.profiles import find_profile
        from planner.spec import nanochat, preset

        suite, c = load_suite(), self.cfg
        prof = find_profile(self.profile_name())
        spec = preset("tiny") if self.cpu else nanochat(int(depth or 20), seq_len=c["seq_len"])
        precision = "fp32" if self.cpu else "bf16-autocast"
        compile_on = c["cpu_compile"] if self.cpu else True
        steps = c["warmup"] + c["steps"]
        if batch is None:
            batch = suite.plan_point(spec, prof, "adamw", precision=precision, compile=compile_on,
                                     max_batch=c["max_batch"], steps=steps).training.device_batch_size
        return suite.plan_point(spec, prof, "adamw", precision=precision, compile=compile_on and compiled,
                                max_batch=c["max_batch"], steps=steps, batch=batch)

    def nanoplan(self, *args: str, timeout: float | None = None) -> int:
        """`python -m nanoplan ARGS` (one of the kit's commands), its output on ours; the exit code."""
        if args[0] not in KIT_COMMANDS:
            raise ValueError(f"the kit runs only {KIT_COMMANDS} (benchmarks/gpu_kit_imports.py checks their imports)")
        print(f"$ nanoplan {' '.join(args)}", flush=True)
        try:
            return subprocess.run([sys.executable, "-m", "nanoplan", *args], cwd=self.work, env=child_env(),
                                  timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            return 124

    def data_dir(self) -> Path:
        """A prepared data dir (byte tokens) from generated English text: examples/tiny/make_text.py."""
        out = self.work / "data" / "tokens"
        if (out / "meta.json").exists():
            return out
        spec = importlib.util.spec_from_file_location("make_text", REPO / "examples" / "tiny" / "make_text.py")
        mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        spec.loader.exec_module(mod)  # type: ignore[union-attr]
        text = self.work / "data" / "text.txt"
        text.parent.mkdir(parents=True, exist_ok=True)
        text.write_text(mod.make_text(self.cfg["data_kb"] * 1024), encoding="utf-8")
        rc = self.nanoplan("prepare-data", str(text), "--out", str(out), "--val-fraction", "0.1")
        if rc != 0:
            raise RuntimeError(f"nanoplan prepare-data exited {rc}")
        return out


def child_env() -> dict[str, str]:
    """This process's environment with the repository first on PYTHONPATH (the carried wheels stay after it)."""
    env = dict(os.environ)
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *[p for p in parts if Path(p).resolve() != REPO]])
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


# ---------------------------------------------------------------------------- env


def _dist_info(name: str) -> dict[str, Any]:
    from importlib import metadata

    try:
        d = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return {"version": None, "location": None}
    loc = str(Path(str(d.locate_file(""))).resolve())
    carried = any(Path(p).resolve() == Path(loc) for p in os.environ.get("GPU_KIT_SITE", "").split(os.pathsep) if p)
    return {"version": d.version, "location": loc, "carried": carried}


def _requirement_check(packages: dict[str, dict[str, Any]]) -> list[str]:
    """The project's own requirements (pyproject.toml) against the versions here: problems."""
    from packaging.requirements import Requirement

    try:
        import tomllib
    except ModuleNotFoundError:         # Python 3.10
        return ["pyproject.toml: this Python has no tomllib; the requirements were not checked"]
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    out = []
    for raw in deps:
        req = Requirement(raw)
        ver = packages.get(req.name.lower(), {}).get("version") or _dist_info(req.name)["version"]
        if ver is None:
            out.append(f"{req.name}: not installed (pyproject.toml requires {raw})")
        elif req.specifier and not req.specifier.contains(ver, prereleases=True):
            out.append(f"{req.name} {ver} does not satisfy {raw} (pyproject.toml)")
    return out


def _torch_apis(torch: Any) -> dict[str, bool]:
    import importlib

    out = {}
    for api in TORCH_APIS:
        parts = api.split(".")
        obj: Any = torch
        ok = True
        for i, part in enumerate(parts):
            if not hasattr(obj, part):
                try:       # a submodule not imported yet
                    obj = importlib.import_module("torch." + ".".join(parts[: i + 1]))
                    continue
                except ImportError:
                    ok = False
                    break
            obj = getattr(obj, part)
        out[api] = ok
    if out.get("optim.Muon"):
        import inspect

        out["optim.Muon(adjust_lr_fn=...)"] = "adjust_lr_fn" in inspect.signature(torch.optim.Muon).parameters
    return out


def _nvidia_smi() -> dict[str, Any]:
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                            "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"error": str(e)}
    fields = [f.strip() for f in (r.stdout.splitlines() or [""])[0].split(",")]
    keys = ("name", "driver", "memory_total", "max_sm_clock")
    return dict(zip(keys, fields, strict=False)) if r.returncode == 0 else {"error": r.stderr.strip()[:200]}


def _commit() -> str | None:
    try:
        r = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10)
        if r.returncode == 0:
            return r.stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        pass
    stamp = REPO / ".whl" / "PREPARED"          # written by scripts/gpu_kit.sh prepare (the tree may have no .git)
    return f"prepared at {stamp.read_text().split()[0]}" if stamp.exists() else None


def task_env(kit: Kit, save: Save) -> None:
    rec: dict[str, Any] = {"python": platform.python_version(), "executable": sys.executable,
                           "platform": platform.platform(), "commit": _commit(), "cpu_count": os.cpu_count()}
    rec["packages"] = {n: _dist_info(n) for n in PACKAGES}
    rec["requirement_problems"] = _requirement_check(rec["packages"])
    save(rec)
    imports = {}
    for mod in PROJECT_IMPORTS:
        try:
            importlib.import_module(mod)
            imports[mod] = "ok"
        except Exception as e:  # noqa: BLE001 - what fails is the finding
            imports[mod] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
    rec["project_imports"] = imports
    import torch

    rec.update(torch=torch.__version__, cuda_runtime=torch.version.cuda, cuda_available=torch.cuda.is_available(),
               torch_apis=_torch_apis(torch))
    if rec["cuda_available"]:
        props = torch.cuda.get_device_properties(0)
        rec["device"] = {"name": torch.cuda.get_device_name(0), "count": torch.cuda.device_count(),
                         "total_memory": props.total_memory, "multiprocessors": props.multi_processor_count,
                         "capability": f"{props.major}.{props.minor}", **{f"smi_{k}": v for k, v in _nvidia_smi().items()}}
        try:
            rec["profile"] = load_suite().profile_for_device(rec["device"]["name"]).name
        except Exception as e:  # noqa: BLE001
            rec["profile_error"] = str(e)
    save(rec)


# ---------------------------------------------------------------------------- compiled / eager steps


def task_step(kit: Kit, save: Save, depth: int | None, compiled: bool) -> None:
    import torch

    suite = load_suite()
    device = torch.device("cpu") if kit.cpu else torch.device("cuda", 0)
    if device.type == "cuda":
        suite.cuda_setup(device)
    c = kit.cfg
    plan = kit.step_point(depth, compiled)
    b = plan.training.device_batch_size
    head = {"label": f"{plan.model.name}-{'compiled' if plan.training.compile else 'eager'}-b{b}",
            "model": plan.model.name, "n_params": plan.model.n_params, "device_batch_size": b,
            "compile": plan.training.compile, "predicted_tokens_per_sec": plan.throughput.tokens_per_sec,
            "predicted_memory_bytes": plan.memory.per_gpu_bytes, "predicted_fits": plan.memory.fits}
    save({**head, "status": "running"})
    notes: list[str] = []
    oom = None
    try:
        rec = suite.run_point(plan, device, c["warmup"], c["steps"])
    except torch.OutOfMemoryError as e:
        oom = (str(e).splitlines() or ["out of memory"])[0][:300]
    if oom is not None:        # cleaned up out here, where no traceback holds the model any more
        suite._cleanup(torch, device.type == "cuda")
        save({**head, "status": "OOM", "error": oom})
        if compiled or b < 2:
            return
        notes.append(f"OOM at micro-batch {b} (the planner said {'it fits' if plan.memory.fits else 'no fit'}); "
                     f"measured at {b // 2}")
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        plan = kit.step_point(depth, compiled, batch=b // 2)
        save({**head, "status": "OOM; measuring at half the micro-batch", "error": oom})
        rec = suite.run_point(plan, device, c["warmup"], c["steps"])
    row = suite.summarise(plan, rec, head["label"])
    row.setdefault("status", "ok")
    save({**row, "notes": notes})


# ---------------------------------------------------------------------------- probe


def probe_plan_args(kit: Kit, batch: int, seq: int, out: Path) -> list[str]:
    """`nanoplan estimate` arguments of the probe's plan: the compiled step's model and micro-batch, grad accum 1,
    one hour (the probe may use half of a plan's length)."""
    model = ["--preset", "tiny"] if kit.cpu else ["--depth", "20", "--seq-len", str(seq)]
    return ["--gpu", f"1x{kit.profile_name()}", *model, "--device-batch-size", str(batch),
            "--total-batch-tokens", str(batch * seq), "--hours", "1", "--optimizer", "adamw",
            *(["--compile"] if kit.cpu and kit.cfg["cpu_compile"] else []),
            "--run-dir", "runs/probe", "--out", str(out)]      # the run dir relative to WORK, the cwd


def task_probe(kit: Kit, save: Save) -> None:
    data = kit.data_dir()
    point = kit.step_point(20, compiled=True)
    b, seq = point.training.device_batch_size, point.training.seq_len
    plans, pdir = kit.work / "plans", kit.work / "probe"
    plans.mkdir(parents=True, exist_ok=True)
    plan_path = plans / "probe.json"
    rc = kit.nanoplan("estimate", *probe_plan_args(kit, b, seq, plan_path))
    rec: dict[str, Any] = {"plan": str(plan_path), "model": point.model.name, "device_batch_size": b,
                           "estimate_exit_code": rc}
    save(rec)
    if rc != 0:
        rec["status"] = f"nanoplan estimate exited {rc}"
        save(rec)
        return
    budget = max(10.0, kit.left() - 15.0)       # the probe's own time box, inside the task's
    t0 = time.monotonic()
    rc = kit.nanoplan("probe", str(plan_path), "--data", str(data), "--dir", str(pdir), "--out",
                      str(pdir / "plan.probed.json"), "--warmup", str(kit.cfg["probe_warmup"]), "--steps",
                      str(kit.cfg["probe_steps"]), "--trial-timeout", f"{budget:.0f}", "--timeout", f"{budget:.0f}",
                      timeout=budget + 10.0)
    rec.update(exit_code=rc, wall_s=time.monotonic() - t0, probe_timeout_s=budget)
    report = read_json(pdir / "probe.json")          # probe.json as runner/probe.py writes it
    rec["report"] = report if isinstance(report, dict) else None
    measured = bool(rec["report"]) and any(t.get("status") == "ok" for t in rec["report"].get("trials", []))
    rec["status"] = "ok" if rc == 0 and measured else f"nanoplan probe exited {rc}" + (
        "" if measured else ", no trial measured")
    save(rec)


# ---------------------------------------------------------------------------- run: checkpoint, stop, resume


def run_plan_args(kit: Kit, data: Path, out: Path) -> list[str]:
    """`nanoplan estimate` arguments of the run's plan: a small model whose whole loss fits at once (no loss
    chunks: a quicker first compile), enough epochs of the small data that the deadline, not the data, ends it."""
    c = kit.cfg
    model = (["--preset", "tiny", "--total-batch-tokens", "1024"] if kit.cpu else
             ["--depth", str(c["run_depth"]), "--seq-len", "1024", "--total-batch-tokens", "32768"])
    return ["--gpu", f"1x{kit.profile_name()}", *model, "--data", str(data), "--loss-chunk-tokens", "0",
            "--max-epochs", "100000", "--hours", f"{c['run_hours']}",
            *(["--startup-seconds", f"{c['run_startup_s']:g}"] if c.get("run_startup_s") is not None else []),
            "--checkpoint-every-minutes", f"{c['run_ckpt_minutes']}", "--run-dir", "runs/run", "--out", str(out)]


def task_run(kit: Kit, save: Save) -> None:
    data = kit.data_dir()
    c = kit.cfg
    run_dir, plan_path = kit.work / "runs" / "run", kit.work / "plans" / "run.json"
    plan_path.parent.mkdir(parents=True, exist_ok=True)
    rc = kit.nanoplan("estimate", *run_plan_args(kit, data, plan_path))
    rec: dict[str, Any] = {"plan": str(plan_path), "hours": c["run_hours"], "estimate_exit_code": rc, "launches": []}
    save(rec)
    if rc != 0:
        rec["status"] = f"nanoplan estimate exited {rc}"
        save(rec)
        return
    metrics = run_dir / "metrics.jsonl"
    # launch 1: SIGINT once it has logged a few steps (as Ctrl-C would): it finishes the step and checkpoints
    t0 = time.monotonic()
    print(f"$ nanoplan run {plan_path}   (SIGINT after {c['run_first_steps']} steps)", flush=True)
    p = subprocess.Popen([sys.executable, "-m", "nanoplan", "run", str(plan_path)], cwd=kit.work, env=child_env())
    give_up = t0 + c["run_first_launch_s"]
    while p.poll() is None and time.monotonic() < give_up and _lines(metrics) < c["run_first_steps"]:
        time.sleep(0.2)
    sent = p.poll() is None
    if sent:
        p.send_signal(signal.SIGINT)
    try:
        rc1 = p.wait(timeout=max(5.0, kit.left() / 2))
    except subprocess.TimeoutExpired:
        p.kill()
        rc1 = p.wait()
    rec["launches"].append({"exit_code": rc1, "sigint_sent": sent, "wall_s": time.monotonic() - t0,
                            "stop": read_json(run_dir / "stop.json")})
    save(rec)
    # launch 2: the same command resumes from that checkpoint and runs to the deadline (or the last step)
    t1 = time.monotonic()
    rc2 = kit.nanoplan("run", str(plan_path), timeout=max(5.0, kit.left() - 5.0))
    rec["launches"].append({"exit_code": rc2, "wall_s": time.monotonic() - t1, "stop": read_json(run_dir / "stop.json")})
    rows = [json.loads(ln) for ln in metrics.read_text().splitlines() if ln.strip()] if metrics.exists() else []
    rec["run_info"] = read_json(run_dir / "run_info.json")
    rec["segments"] = _segments(rows)
    rec["checkpoints"] = sorted(p.name for p in (run_dir / "checkpoints").glob("step_*")) if run_dir.exists() else []
    rec["checks"] = run_checks(rec, rows, kit.cpu)
    rec["status"] = "ok" if all(rec["checks"].values()) else "failed: " + "; ".join(
        k for k, v in rec["checks"].items() if not v)
    save(rec)


def _lines(path: Path) -> int:
    try:
        return sum(1 for ln in path.read_text().splitlines() if ln.strip())
    except OSError:
        return 0


def _segments(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per launch (metrics.jsonl's `segment`): steps, median tokens/s, peak CUDA memory, device."""
    import statistics

    out = []
    for seg in sorted({r.get("segment", 0) for r in rows}):
        rs = [r for r in rows if r.get("segment", 0) == seg]
        tps = [r["tokens_per_sec"] for r in rs[1:]] or [r["tokens_per_sec"] for r in rs]
        alloc = [r["max_memory_allocated"] for r in rs if r.get("max_memory_allocated") is not None]
        reserved = [r["max_memory_reserved"] for r in rs if r.get("max_memory_reserved") is not None]
        out.append({"segment": seg, "first_step": rs[0]["step"], "last_step": rs[-1]["step"], "steps": len(rs),
                    "median_tokens_per_sec": statistics.median(tps) if tps else None,
                    "max_memory_allocated": max(alloc) if alloc else None,
                    "max_memory_reserved": max(reserved) if reserved else None,
                    "device": rs[-1].get("device"), "compiled": rs[-1].get("compiled"),
                    "last_loss": rs[-1].get("loss"), "elapsed_hours": rs[-1].get("elapsed_hours")})
    return out


def run_checks(rec: dict[str, Any], rows: list[dict[str, Any]], cpu: bool) -> dict[str, bool]:
    """What the run part must show: the signal stop with a checkpoint, the resume, the deadline stop."""
    l1 = (rec["launches"][0].get("stop") or {}) if rec["launches"] else {}
    l2 = (rec["launches"][1].get("stop") or {}) if len(rec["launches"]) > 1 else {}
    segs = rec.get("segments") or []
    launches = (rec.get("run_info") or {}).get("segments") or []     # run_info.json: one entry per launch
    resumed = launches[1].get("resumed_from_step") if len(launches) > 1 else None
    ck = set(rec.get("checkpoints") or [])
    checks = {
        "launch 1 stopped on SIGINT with a checkpoint": l1.get("reason") == "signal" and bool(l1.get("checkpoint")),
        "launch 2 resumed from that checkpoint": l1.get("step") is not None and resumed == l1.get("step"),
        "launch 2 trained past it": len(segs) > 1 and segs[-1]["last_step"] > (l1.get("step") or 0),
        # the plan's steps are what its predicted speed fits in the hours: a faster machine ends at the last step
        "launch 2 ran to the deadline or the last step, with a checkpoint": l2.get("reason") in ("deadline",
                                                                                                  "total_steps")
        and bool(l2.get("checkpoint")) and Path(str(l2.get("checkpoint"))).name in ck,
        "within the budget": bool(rows) and rows[-1]["elapsed_hours"] <= rec["hours"],
        "finite losses": bool(rows) and all(math.isfinite(r["loss"]) for r in rows),
        "both launches exited 0": [x.get("exit_code") for x in rec["launches"]] == [0, 0],
    }
    if not cpu:
        checks["CUDA memory readings"] = bool(rows) and all(r.get("max_memory_allocated") for r in rows)
        checks["compiled on the GPU"] = bool(rows) and all(r.get("compiled") for r in rows)
    return checks


# ---------------------------------------------------------------------------- main

TASKS: dict[str, Callable[[Kit, Save, str], None]] = {
    "env": lambda k, s, arg: task_env(k, s),
    "compiled": lambda k, s, arg: task_step(k, s, int(arg[1:]) if arg.startswith("d") else None, compiled=True),
    "probe": lambda k, s, arg: task_probe(k, s),
    "run": lambda k, s, arg: task_run(k, s),
    "eager": lambda k, s, arg: task_step(k, s, int(arg[1:]) if arg.startswith("d") else None, compiled=False),
}


def task_file(work: Path, task: str) -> Path:
    return work / "tasks" / (task.replace(":", "_") + ".json")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("task", help="env | compiled:dN | probe | run | eager:dN (compiled:tiny, eager:tiny on CPU)")
    p.add_argument("--config", required=True, help="WORK/config.json (benchmarks/gpu_kit.py writes it)")
    p.add_argument("--limit", type=float, default=600.0, help="seconds this task has")
    a = p.parse_args(argv)
    cfg = json.loads(Path(a.config).read_text())
    kind, _, arg = a.task.partition(":")
    if kind not in TASKS:
        print(f"error: unknown task {a.task!r}", file=sys.stderr)
        return 2
    kit = Kit(cfg, time.monotonic() + a.limit)
    out = task_file(kit.work, a.task)
    record: dict[str, Any] = {}

    def save(rec: dict[str, Any]) -> None:
        record.clear()
        record.update(rec)
        write_json(out, rec)

    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(kit.work / "inductor"))
    TASKS[kind](kit, save, arg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
