"""The GPU day kit: one command that turns a short GPU loan into measurements to commit (docs/gpu.md).

    scripts/gpu_kit.sh run [ARGS]           # installs the carried wheels (.whl/), then runs this with ARGS
    python benchmarks/gpu_kit.py run [--cpu] [--out DIR] [--work DIR] [--parts compiled,probe,run,eager]
                                     [--depths 20,26] [--limit TASK=SECONDS ...]

It runs the tasks of benchmarks/gpu_kit_parts.py in order (env; compiled:d20, compiled:d26; probe; run;
eager:d20, eager:d26), each in its own process and session under its own time limit (at the limit: SIGTERM to
its process group, then SIGKILL), and after each task rewrites OUT/gpu_kit.json and OUT/gpu_kit.md; OUT/gpu_kit.log
holds everything printed. The limits add up to 400 s (GPU_LIMITS), and no task runs past --total-limit (420 s):
the kit ends within 7 minutes on one H100 or H200, however a part fails. Without CUDA (or with --cpu) it runs
the same tasks at toy sizes on the CPU (CPU_LIMITS), which is what tests/test_gpu_kit.py checks.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, TextIO

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "benchmarks"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

from gpu_kit_parts import read_json, task_file, write_json  # noqa: E402
from gpu_kit_report import markdown, summary_lines  # noqa: E402

PARTS = ("compiled", "probe", "run", "eager")
# Each task's share of the time, in seconds, on one H100/H200: 400 in all (the compile times are guesses until a
# loan measures them). A task may use its share plus whatever the tasks before it left unused, never the later
# tasks' shares (task_limit); the 20 s to TOTAL_LIMIT_S are for the processes' start and end.
GPU_LIMITS = {"env": 30, "compiled": (80, 75), "probe": 65, "run": 100, "eager": (25, 25)}
CPU_LIMITS = {"env": 60, "compiled": (60,), "probe": 90, "run": 120, "eager": (60,)}
TOTAL_LIMIT_S = 420.0
KILL_GRACE_S = 10.0
MIN_TASK_S = 10.0
GPU_CONFIG = {"seq_len": 2048, "max_batch": 32, "warmup": 3, "steps": 10, "probe_warmup": 2, "probe_steps": 3,
              "data_kb": 1024, "run_depth": 4, "run_hours": 0.023, "run_ckpt_minutes": 0.25, "run_first_steps": 5,
              "run_first_launch_s": 60.0, "cpu_compile": False,
              # the run's plan: its launch's start-up and d4 compile (estimate --startup-seconds; the planner's own
              # assumption, 60 + 120 s, is for a full-size model and would leave an 83 s plan no step)
              "run_startup_s": 40.0}
# toy sizes: micro-batch 1 (the probe then has one trial), a 43-second run (a launch's start-up counts: 5 to 20 s
# on a 2-core machine, by its load)
CPU_CONFIG = {**GPU_CONFIG, "max_batch": 1, "warmup": 1, "steps": 2, "probe_warmup": 1, "probe_steps": 1,
              "data_kb": 64, "run_hours": 0.012, "run_first_steps": 3, "run_first_launch_s": 45.0,
              "run_startup_s": None}
OUT_FILES = ("gpu_kit.json", "gpu_kit.md", "gpu_kit.log")


def task_list(cpu: bool, parts: list[str], depths: list[int]) -> list[tuple[str, float]]:
    """(task, limit seconds) in the order they run."""
    limits = CPU_LIMITS if cpu else GPU_LIMITS
    names = ["tiny"] if cpu else [f"d{d}" for d in depths]
    out: list[tuple[str, float]] = [("env", float(limits["env"]))]   # type: ignore[arg-type]
    for part in PARTS:
        if part not in parts:
            continue
        lim = limits[part]
        if isinstance(lim, tuple):
            out += [(f"{part}:{n}", float(lim[min(i, len(lim) - 1)])) for i, n in enumerate(names)]
        else:
            out.append((part, float(lim)))
    return out


def task_limit(tasks: list[tuple[str, float]], i: int, elapsed: float, total: float) -> float:
    """Task i's time: its share plus what the tasks before it left unused, but never the later tasks' shares
    nor past the kit's total."""
    before = sum(lim for _, lim in tasks[:i])
    return min(tasks[i][1] + max(0.0, before - elapsed), total - elapsed - sum(lim for _, lim in tasks[i + 1:]))


class Tee:
    """Lines of a child process to our stdout and to the log file."""

    def __init__(self, log: TextIO) -> None:
        self.log = log
        self.lock = threading.Lock()

    def write(self, text: str) -> None:
        with self.lock:
            sys.stdout.write(text)
            sys.stdout.flush()
            self.log.write(text)
            self.log.flush()

    def pump(self, stream: Any) -> None:
        for line in iter(stream.readline, ""):
            self.write(line)


def run_task(task: str, limit: float, config: Path, tee: Tee, env: dict[str, str]) -> dict[str, Any]:
    """One task in its own process group, stopped at `limit`; how it ended and how long it took."""
    t0 = time.monotonic()
    tee.write(f"\n=== {task} (limit {limit:.0f} s) ===\n")
    p = subprocess.Popen([sys.executable, str(BENCH / "gpu_kit_parts.py"), task, "--config", str(config),
                          "--limit", f"{limit:.1f}"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env=env, cwd=REPO, start_new_session=True)
    reader = threading.Thread(target=tee.pump, args=(p.stdout,), daemon=True)
    reader.start()
    timed_out = False
    try:
        rc = p.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        timed_out = True
        _stop_group(p)
        rc = p.wait()
    reader.join(timeout=5)
    wall = time.monotonic() - t0
    ended = f"timed out after {limit:.0f} s" if timed_out else ("exited 0" if rc == 0 else f"exited {rc}")
    tee.write(f"=== {task}: {ended}, {wall:.1f} s ===\n")
    return {"exit_code": rc, "timed_out": timed_out, "wall_s": wall, "ended": ended}


def _stop_group(p: subprocess.Popen) -> None:
    """SIGTERM the task's process group (nanoplan run checkpoints and stops), SIGKILL what is left."""
    for sig, wait in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            return
        try:
            p.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _clean_work(work: Path) -> None:
    """Start from nothing but the compile cache (kept: a rerun on the same machine compiles faster)."""
    work.mkdir(parents=True, exist_ok=True)
    for name in ("tasks", "data", "plans", "probe", "runs"):
        p = work / name
        if p.is_symlink() or p.is_file():
            p.unlink()
        elif p.is_dir():
            shutil.rmtree(p)


def _status(task: str, ended: dict[str, Any], rec: dict[str, Any] | None) -> str:
    if rec is None:
        return ended["ended"] if ended["exit_code"] != 0 or ended["timed_out"] else "no record"
    inner = rec.get("status")
    if ended["timed_out"]:
        return f"{ended['ended']}" + (f" (last: {inner})" if inner else "")
    if ended["exit_code"] != 0:
        return f"{ended['ended']}" + (f" (last: {inner})" if inner else "")
    return str(inner or "ok")


def parse_limits(items: list[str]) -> dict[str, float]:
    out = {}
    for it in items:
        name, sep, val = it.partition("=")
        try:
            out[name] = float(val)
        except ValueError:
            sep = ""
        if not sep:
            raise SystemExit(f"error: --limit {it!r}: give TASK=SECONDS, e.g. compiled:d20=150")
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="benchmarks/gpu_kit.py", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run the kit")
    r.add_argument("--cpu", action="store_true", help="toy sizes on the CPU (the default when CUDA is missing)")
    r.add_argument("--cpu-compile", action="store_true", help="CPU mode: torch.compile the compiled step and the probe "
                   "(about 40 s more on a 2-core machine)")
    r.add_argument("--out", default=os.environ.get("OUT") or str(REPO / "runs" / "gpu_kit" / "out"),
                   help="results folder (default: $OUT, else runs/gpu_kit/out)")
    r.add_argument("--work", default=str(REPO / "runs" / "gpu_kit" / "work"),
                   help="scratch: data, plans, run dirs, probe trials, the compile cache")
    r.add_argument("--parts", default=",".join(PARTS), help=f"any of {','.join(PARTS)} (always after env)")
    r.add_argument("--depths", default="20,26", help="nanochat depths of the compiled and eager steps (GPU)")
    r.add_argument("--limit", action="append", default=[], metavar="TASK=S", help="another time limit for a task")
    r.add_argument("--total-limit", type=float, default=TOTAL_LIMIT_S, help="seconds for the whole kit")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    start, t0 = dt.datetime.now(dt.timezone.utc), time.monotonic()
    parts = [x.strip() for x in a.parts.split(",") if x.strip()]
    bad = [x for x in parts if x not in PARTS]
    depths = [int(x) for x in a.depths.split(",") if x.strip().isdigit()]
    if bad or not depths:
        print(f"error: --parts {a.parts!r} / --depths {a.depths!r}", file=sys.stderr)
        print(f"hint: --parts takes any of {','.join(PARTS)}; --depths comma-separated integers", file=sys.stderr)
        return 2
    extra = parse_limits(a.limit)
    out, work = Path(a.out).resolve(), Path(a.work).resolve()
    out.mkdir(parents=True, exist_ok=True)
    _clean_work(work)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TORCHINDUCTOR_CACHE_DIR": str(work / "inductor"),
           "PYTHONPATH": os.pathsep.join([str(REPO), *[q for q in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                                                        if q and Path(q).resolve() != REPO]])}
    cpu = a.cpu
    if cpu:
        env.setdefault("OMP_NUM_THREADS", "1")      # toy sizes on a machine that may be shared: one thread each
    cfg: dict[str, Any] = {"mode": "cpu" if cpu else "gpu", "work": str(work), "out": str(out), "profile": None,
                           **(CPU_CONFIG if cpu else GPU_CONFIG), "cpu_compile": a.cpu_compile}
    config = work / "config.json"
    write_json(config, cfg)
    result: dict[str, Any] = {"kit": "benchmarks/gpu_kit.py", "command": " ".join(sys.argv), "mode": cfg["mode"],
                              "start": start.isoformat(timespec="seconds"), "date": start.date().isoformat(),
                              "config": cfg, "env": {}, "tasks": [], "notes": []}
    with open(out / "gpu_kit.log", "w") as log:
        tee = Tee(log)
        tasks = [(name, extra.get(name, lim)) for name, lim in task_list(cpu, parts, depths)]
        i = 0
        while i < len(tasks):
            task, _ = tasks[i]
            limit = task_limit(tasks, i, time.monotonic() - t0, a.total_limit)
            i += 1
            entry: dict[str, Any] = {"task": task, "limit_s": round(limit, 1)}
            if limit < MIN_TASK_S:
                entry.update(status=f"skipped: {limit:.0f} s left for it (the later tasks' shares kept, "
                                    f"--total-limit {a.total_limit:.0f})")
                result["tasks"].append(entry)
                if task == "env":
                    result["notes"].append("env did not run: nothing runs without it")
                    break
                continue
            ended = run_task(task, limit, config, tee, env)
            rec = read_json(task_file(work, task))
            entry.update(ended, status=_status(task, ended, rec), result=rec)
            if task == "env":
                result["env"] = rec or {}
                result["tasks"].append(entry)
                if "cuda_available" not in result["env"]:        # it died before torch answered: see the log
                    result["notes"].append(f"env {entry['status']}: stopped after it (its output is in gpu_kit.log)")
                    tasks = tasks[:1]
                elif not cpu and not result["env"]["cuda_available"]:
                    cpu = True
                    env.setdefault("OMP_NUM_THREADS", "1")
                    result["notes"].append("no CUDA here: ran the CPU mode (toy sizes)")
                    cfg.update(mode="cpu", **{**CPU_CONFIG, "cpu_compile": a.cpu_compile})
                    tasks = [("env", 0.0)] + [(n, extra.get(n, lim)) for n, lim in task_list(True, parts, depths)[1:]]
                elif not cpu:
                    cfg["profile"] = result["env"].get("profile")
                    if cfg["profile"] is None:
                        result["notes"].append(f"no profile for this GPU ({result['env'].get('profile_error')}); "
                                               "stopped after env")
                        tasks = tasks[:1]
                result["mode"] = cfg["mode"]
                write_json(config, cfg)
            else:
                result["tasks"].append(entry)
            result["wall_s"] = time.monotonic() - t0
            result["results_dir"] = results_dir(result)
            save_result(out, result)
        for line in summary_lines(result):
            tee.write(line + "\n")
    save_result(out, result)
    return 0


def results_dir(result: dict[str, Any]) -> str:
    """Where the results are committed: benchmarks/results/gpu/<date>-<profile> (docs/gpu.md)."""
    name = result["config"].get("profile") or ("CPU" if result["mode"] == "cpu" else "unknown")
    return f"benchmarks/results/gpu/{result['date']}-{name}"


def save_result(out: Path, result: dict[str, Any]) -> None:
    write_json(out / "gpu_kit.json", result)
    tmp = out / ".gpu_kit.md.tmp"
    tmp.write_text(markdown(result))
    os.replace(tmp, out / "gpu_kit.md")


if __name__ == "__main__":
    sys.exit(main())
