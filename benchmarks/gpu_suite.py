"""GPU benchmark suite: short runs of the runner's own training step against the planner's predictions.

One command, on whatever GPU is present:

    python benchmarks/gpu_suite.py                      # nanochat d8..d26 x {adamw, muon}, bf16, compile
    python benchmarks/gpu_suite.py --depths 20 --optimizers adamw --probe-larger   # also try 2x the batch
    python benchmarks/gpu_suite.py --cpu-tiny --out-dir /tmp/suite                 # tiny CPU mode (tests)

Each grid point (nanochat depth, optimizer) is planned with planner.build.build_plan on one GPU
(strategy ddp, bf16 autocast, torch.compile, seq 2048): the micro-batch is the largest one up to
--max-batch that the planner says fits, with gradient accumulation 1. The run then uses the
runner's code, not a second training loop: runner.plan_model.build_model, runner.step.build_optimizer
(fused AdamW, or torch.optim.Muon + fused AdamW) and runner.step.train_step, with one host sync
per step as in runner/train.py, on synthetic random tokens. A few warm-up steps (the first
compiles) are followed by --steps timed steps.

Per run it records measured tokens/s (median per-step, and the mean), model-FLOPs MFU,
torch.cuda.max_memory_allocated / max_memory_reserved over the timed steps (peak stats are
reset after warm-up), torch.cuda.mem_get_info, and the plan's predictions next to them. It
writes OUT_DIR/<profile>-<date>.json, a markdown table <profile>-<date>.md, and a profile
calibrated from the runs (<profile>-<date>.profile.yaml, planner.calibrate.calibrate_profile,
with cuda_context_bytes from mem_get_info) to copy into hardware_profiles/.

A time budget (--time-budget, default 420 s, under the 8-minute target on an H100) skips the
runs that would not finish in time; they are listed as skipped.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import itertools
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from planner.build import build_plan  # noqa: E402
from planner.calibrate import Measurement, calibrate_profile, fitted_mfu, rel_err, write_profile  # noqa: E402
from planner.errors import PlanError  # noqa: E402
from planner.plan import Plan, PlanRequest, atomic_write_text  # noqa: E402
from planner.probe import measurement_of  # noqa: E402
from planner.profiles import HardwareProfile, find_profile  # noqa: E402
from planner.spec import ModelSpec, nanochat, preset  # noqa: E402

DEFAULT_DEPTHS = (8, 12, 16, 20, 26)
DEFAULT_OPTIMIZERS = ("adamw", "muon")
DEFAULT_TIME_BUDGET_S = 420.0
FIRST_COMPILE_GUESS_S = 60.0      # before any run has compiled: assume a minute (H100, whole model)
# torch.cuda.get_device_name substrings -> hardware profile (first match wins)
GPU_NAMES = (("H200", "H200"), ("H100 PCIe", "H100-PCIe"), ("H100", "H100-SXM"), ("B200", "B200"),
             ("A100-SXM4-40GB", "A100-40GB"), ("A100 40GB", "A100-40GB"), ("A100", "A100-80GB"))


def profile_for_device(device_name: str) -> HardwareProfile:
    for needle, name in GPU_NAMES:
        if needle.lower() in device_name.lower():
            return find_profile(name)
    raise PlanError("--profile", f"no built-in profile matches the GPU {device_name!r}",
                    "pass --profile NAME (see nanoplan profiles)")


def plan_point(spec: ModelSpec, prof: HardwareProfile, optimizer: str, *, precision: str, compile: bool,
               max_batch: int, steps: int, batch: int | None = None) -> Plan:
    """A one-GPU plan with grad accum 1: the given micro-batch, else the largest <= max_batch that fits."""
    base = dict(gpu=f"1x{prof.name}", profile=prof, model=spec, optimizer=optimizer, precision=precision,
                strategy="ddp", compile=compile, steps=steps, run_dir="gpu_suite")
    if batch is None:
        batch = build_plan(PlanRequest.model_validate({**base, "total_batch_tokens": max_batch * spec.seq_len})
                           ).training.device_batch_size
    return build_plan(PlanRequest.model_validate({**base, "total_batch_tokens": batch * spec.seq_len,
                                                  "device_batch_size": batch}))


def cuda_setup(device: Any) -> None:
    """As runner.train.Trainer.setup on CUDA: the device, and TF32 for any fp32 matmul left outside autocast
    (the legacy switch only: mixing it with torch's newer fp32_precision settings breaks inductor, pytorch#166387)."""
    import torch

    torch.cuda.set_device(device)
    torch.set_float32_matmul_precision("high")


def _cleanup(torch: Any, cuda: bool) -> None:
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    torch._dynamo.reset()


def run_point(plan: Plan, device: Any, warmup: int, steps: int) -> dict[str, Any]:
    """Train `warmup + steps` steps of the plan with the runner's code; time and measure them."""
    import torch

    from runner.memstats import cuda_memory
    from runner.plan_model import build_model
    from runner.step import build_optimizer, train_step

    tr, hyper, spec = plan.training, plan.request.hyper, plan.request.model
    cuda = device.type == "cuda"
    torch.manual_seed(hyper.seed)
    raw = build_model(plan, device)
    model = torch.compile(raw) if tr.compile else raw    # as runner.train.Trainer.setup (no DDP wrapper on 1 GPU)
    opt = build_optimizer(raw, tr.optimizer, hyper.lr, hyper.matrix_lr, hyper.weight_decay, tuple(hyper.betas),
                          device.type)
    x = torch.randint(0, spec.vocab_size, (tr.device_batch_size, tr.seq_len), device=device)
    y = torch.randint(0, spec.vocab_size, (tr.device_batch_size, tr.seq_len), device=device)

    it: Iterator[tuple[Any, Any]] = itertools.repeat((x, y))   # synthetic tokens, one fixed batch
    times: list[float] = []
    losses: list[float] = []
    warm_alloc = None
    for i in range(warmup + steps):
        if i == warmup and cuda:
            warm_alloc = torch.cuda.max_memory_allocated(device)
            torch.cuda.reset_peak_memory_stats(device)
        t0 = time.perf_counter()
        loss, gnorm = train_step(model, opt, it, tr.grad_accum_steps, tr.precision, device.type, hyper.grad_clip)
        vals = torch.stack([loss.detach().float(), gnorm.detach().float().to(loss.device)]).tolist()  # 1 sync/step
        times.append(time.perf_counter() - t0)
        losses.append(vals[0])
    rec: dict[str, Any] = {"compile_and_first_step_s": times[0], "warmup_s": sum(times[:warmup]),
                           "step_seconds": times[warmup:], "final_loss": losses[-1],
                           "max_memory_allocated": None, "max_memory_reserved": None,
                           "max_memory_allocated_warmup": warm_alloc, "mem_get_info_free": None,
                           "mem_get_info_total": None, "device_used_bytes": None, "non_allocator_bytes": None}
    if cuda:
        rec.update(cuda_memory(device))
    del model, raw, opt, x, y, it
    _cleanup(torch, cuda)
    return rec


def summarise(plan: Plan, rec: dict[str, Any], label: str) -> dict[str, Any]:
    """Measured numbers next to the plan's predictions, with relative errors."""
    tps_step = plan.schedule.tokens_per_step
    st = rec["step_seconds"]
    tps = tps_step / statistics.median(st)
    mfu = tps * plan.model.flops_per_token / plan.throughput.peak_flops_per_gpu
    pred_alloc = plan.memory.per_gpu_bytes - sum(plan.memory.overhead.values())
    frag = plan.memory.overhead.get("fragmentation", 0)
    out = {
        "label": label, "model": plan.model.name, "n_params": plan.model.n_params, "optimizer": plan.training.optimizer,
        "device_batch_size": plan.training.device_batch_size, "seq_len": plan.training.seq_len,
        "precision": plan.training.precision, "compile": plan.training.compile, "tokens_per_step": tps_step,
        "timed_steps": len(st), "tokens_per_sec": tps, "tokens_per_sec_mean": tps_step * len(st) / sum(st),
        "mfu": mfu, "fitted_mfu": fitted_mfu(plan, tps),
        "predicted_tokens_per_sec": plan.throughput.tokens_per_sec, "predicted_mfu": plan.throughput.mfu,
        "predicted_effective_mfu": plan.throughput.effective_mfu,
        "tokens_per_sec_error": rel_err(plan.throughput.tokens_per_sec, tps),
        "predicted_allocated_bytes": pred_alloc, "predicted_reserved_bytes": pred_alloc + frag,
        "predicted_memory_bytes": plan.memory.per_gpu_bytes, "predicted_fits": plan.memory.fits,
        **{k: v for k, v in rec.items() if k != "step_seconds"}, "step_seconds": st,
    }
    for key, pred, meas in (("allocated_error", pred_alloc, rec["max_memory_allocated"]),
                            ("reserved_error", pred_alloc + frag, rec["max_memory_reserved"]),
                            ("device_used_error", plan.memory.per_gpu_bytes, rec["device_used_bytes"])):
        out[key] = rel_err(pred, meas) if meas else None
    if not math.isfinite(rec["final_loss"]):
        out["status"] = "nan loss"
    return out


def to_measurement(plan: Plan, row: dict[str, Any], device_name: str, date: str) -> Measurement:
    return measurement_of(plan, label=f"gpu_suite/{row['label']}", tokens_per_sec=row["tokens_per_sec"],
                          steps=row["timed_steps"], device=device_name, date=date,
                          max_memory_allocated=row["max_memory_allocated"],
                          max_memory_reserved=row["max_memory_reserved"])


def _gib(b: int | None) -> str:
    return "–" if b is None else f"{b / 2**30:.2f}"


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{x:+.1%}"


def markdown(result: dict[str, Any]) -> str:
    from planner.units import fmt_count

    lines = [f"# GPU suite: {result['device']} ({result['profile']}), {result['date']}", "",
             f"`{result['command']}` — torch {result['torch']}, CUDA {result['cuda']}, "
             f"{result['config']['warmup']} warm-up + {result['config']['steps']} timed steps per run, "
             f"seq {result['config']['seq_len']}, {result['config']['precision']}, compile "
             f"{'on' if result['config']['compile'] else 'off'}, synthetic tokens; wall {result['wall_seconds']:.0f} s.",
             "", "Errors are (predicted − measured) / measured. Memory in GiB.", "",
             "| model | params | optimizer | batch | status | tokens/s pred | tokens/s meas | err | MFU pred | MFU meas "
             "| alloc pred | alloc meas | err | reserved pred | reserved meas | err | device used pred | "
             "mem_get_info used | err | compile+1st step s |",
             "|---|---:|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in result["runs"]:
        if r["status"] != "ok":
            lines.append(f"| {r['model']} | {fmt_count(r['n_params'])} | {r['optimizer']} | {r['device_batch_size']} "
                         f"| {r['status']} |" + " – |" * 15)
            continue
        lines.append(
            f"| {r['model']} | {fmt_count(r['n_params'])} | {r['optimizer']} | {r['device_batch_size']} | ok "
            f"| {r['predicted_tokens_per_sec']:,.0f} | {r['tokens_per_sec']:,.0f} | {_pct(r['tokens_per_sec_error'])} "
            f"| {r['predicted_effective_mfu']:.1%} | {r['mfu']:.1%} "
            f"| {_gib(r['predicted_allocated_bytes'])} | {_gib(r['max_memory_allocated'])} | {_pct(r['allocated_error'])} "
            f"| {_gib(r['predicted_reserved_bytes'])} | {_gib(r['max_memory_reserved'])} | {_pct(r['reserved_error'])} "
            f"| {_gib(r['predicted_memory_bytes'])} | {_gib(r['device_used_bytes'])} | {_pct(r['device_used_error'])} "
            f"| {r['compile_and_first_step_s']:.1f} |")
    if result.get("calibrated_profile"):
        lines += ["", f"Calibrated profile: `{result['calibrated_profile']}` (planner.calibrate.calibrate_profile)."]
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cpu-tiny", action="store_true", help="tiny model on CPU, fp32, no compile, 1+2 steps (tests)")
    p.add_argument("--depths", default=",".join(map(str, DEFAULT_DEPTHS)), help="nanochat depths, comma-separated")
    p.add_argument("--optimizers", default=",".join(DEFAULT_OPTIMIZERS), help="adamw,muon")
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--max-batch", type=int, default=32, help="largest micro-batch to consider")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps (the first compiles)")
    p.add_argument("--steps", type=int, default=12, help="timed steps per run")
    p.add_argument("--probe-larger", action="store_true", help="also run 2x the planner's micro-batch (may OOM)")
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--profile", default=None, help="hardware profile name (default: from the GPU's name)")
    p.add_argument("--time-budget", type=float, default=DEFAULT_TIME_BUDGET_S, help="seconds for the whole suite")
    p.add_argument("--out-dir", default=None, help="default benchmarks/results (required with --cpu-tiny)")
    return p.parse_args(argv)


def _ints(text: str, flag: str) -> list[int]:
    try:
        vals = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise PlanError(flag, f"cannot read {text!r}", "give comma-separated integers, e.g. 8,12,16") from None
    if not vals or min(vals) < 1:
        raise PlanError(flag, f"needs positive integers, got {text!r}")
    return vals


def main(argv: list[str] | None = None) -> int:
    t_start = time.perf_counter()
    a = parse_args(argv)
    try:
        return _main(a, t_start, sys.argv[1:] if argv is None else argv)
    except PlanError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def _main(a: argparse.Namespace, t_start: float, argv: list[str]) -> int:
    if a.cpu_tiny and not a.out_dir:
        raise PlanError("--out-dir", "is required with --cpu-tiny", "give a temporary directory")
    optimizers = [o.strip() for o in a.optimizers.split(",") if o.strip()]
    if not optimizers or any(o not in DEFAULT_OPTIMIZERS for o in optimizers):
        raise PlanError("--optimizers", f"got {a.optimizers!r}", "use adamw, muon or adamw,muon")
    if a.steps < 1 or a.warmup < 1:
        raise PlanError("--steps/--warmup", "need at least 1 warm-up and 1 timed step")
    import torch

    if a.cpu_tiny:
        device, device_name = torch.device("cpu"), "cpu"
        prof = find_profile(a.profile or "CPU")
        specs = [preset("tiny")]
        precision, compile_, max_batch = "fp32", False, min(a.max_batch, 4)
        warmup, steps = 1, 2
    else:
        if not torch.cuda.is_available():
            raise PlanError("GPU", "CUDA is not available here", "run on a GPU machine, or use --cpu-tiny")
        device = torch.device("cuda", 0)
        cuda_setup(device)
        device_name = torch.cuda.get_device_name(device)
        prof = find_profile(a.profile) if a.profile else profile_for_device(device_name)
        specs = [nanochat(d, seq_len=a.seq_len) for d in _ints(a.depths, "--depths")]
        precision, compile_, max_batch = "bf16-autocast", not a.no_compile, a.max_batch
        warmup, steps = a.warmup, a.steps
    date = dt.date.today().isoformat()
    out_dir = Path(a.out_dir) if a.out_dir else REPO / "benchmarks" / "results"
    stem = f"{prof.name}-{date}"

    grid: list[tuple[ModelSpec, str, int | None, str]] = [(s, o, None, "") for o in optimizers for s in specs]
    rows: list[dict[str, Any]] = []
    measurements: list[Measurement] = []
    first_steps: list[tuple[float, int]] = []     # (compile + first step seconds, layers) of finished runs
    while grid:
        spec, opt, batch, note = grid.pop(0)
        plan = plan_point(spec, prof, opt, precision=precision, compile=compile_, max_batch=max_batch,
                          steps=warmup + steps, batch=batch)
        b = plan.training.device_batch_size
        label = f"{plan.model.name}-{opt}-b{b}"
        head = {"label": label, "model": plan.model.name, "n_params": plan.model.n_params, "optimizer": opt,
                "device_batch_size": b, "predicted_fits": plan.memory.fits,
                "predicted_tokens_per_sec": plan.throughput.tokens_per_sec, "note": note}
        if not plan.memory.fits and batch is None:
            rows.append({**head, "status": "does not fit (planner)"})
            continue
        # compile time grows with depth (the whole model is traced): scale the worst seen per layer
        guess = (max(f * spec.n_layer / layers for f, layers in first_steps) if first_steps
                 else (FIRST_COMPILE_GUESS_S if compile_ else 0.0))
        expected = guess + 2.0 * (warmup + steps) * plan.throughput.step_seconds
        elapsed = time.perf_counter() - t_start
        if elapsed + expected > a.time_budget:
            rows.append({**head, "status": f"skipped: time budget ({elapsed:.0f} s used, ~{expected:.0f} s needed)"})
            continue
        print(f"[{elapsed:6.1f} s] {label}: predicted {plan.throughput.tokens_per_sec:,.0f} tok/s ...", flush=True)
        rec, failure = None, ""
        try:
            rec = run_point(plan, device, warmup, steps)
        except torch.OutOfMemoryError:
            failure = "OOM"           # clean up below, once the traceback no longer holds the model
        except Exception as e:  # noqa: BLE001  (one failing configuration must not lose the others)
            failure = f"error: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
        if rec is None:
            _cleanup(torch, device.type == "cuda")
            rows.append({**head, "status": failure})
            print(f"           {label}: {failure}", flush=True)
            continue
        row = {**summarise(plan, rec, label), "note": note}
        row.setdefault("status", "ok")
        rows.append(row)
        first_steps.append((rec["compile_and_first_step_s"], spec.n_layer))
        print(f"           {label}: {row['tokens_per_sec']:,.0f} tok/s, MFU {row['mfu']:.1%}, "
              f"first step {rec['compile_and_first_step_s']:.1f} s", flush=True)
        if row["status"] == "ok":
            measurements.append(to_measurement(plan, row, device_name, date))
        if a.probe_larger and batch is None:
            grid.insert(0, (spec, opt, 2 * b, "probe: twice the planner's micro-batch"))

    cal_path = None
    if measurements:
        non_alloc = [r["non_allocator_bytes"] for r in rows if r.get("status") == "ok" and r.get("non_allocator_bytes")]
        prof_cal = calibrate_profile(prof, measurements, today=date,
                                     non_allocator_bytes=int(statistics.median(non_alloc)) if non_alloc else None)
        cal_path = out_dir / f"{stem}.profile.yaml"
        write_profile(prof_cal, cal_path, f"Calibrated by benchmarks/gpu_suite.py on {date} on {device_name}")
    result = {
        "suite": "benchmarks/gpu_suite.py", "command": " ".join(["python", "benchmarks/gpu_suite.py", *argv]),
        "device": device_name, "profile": prof.name, "date": date, "torch": torch.__version__,
        "cuda": torch.version.cuda, "config": {"seq_len": specs[0].seq_len, "precision": precision, "compile": compile_,
                                               "warmup": warmup, "steps": steps, "max_batch": max_batch,
                                               "strategy": "ddp (1 GPU: no wrapper, as the runner)",
                                               "time_budget_s": a.time_budget},
        "wall_seconds": time.perf_counter() - t_start, "runs": rows,
        "calibrated_profile": str(cal_path) if cal_path else None,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out_dir / f"{stem}.json", json.dumps(result, indent=2) + "\n")
    atomic_write_text(out_dir / f"{stem}.md", markdown(result))
    print(f"wrote {out_dir / (stem + '.json')}, {stem}.md" + (f", {cal_path.name}" if cal_path else "")
          + f" in {result['wall_seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(Path.home() / ".cache" / "nanoplan-inductor"))
    sys.exit(main())
