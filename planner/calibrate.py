"""Measured runs -> steady-state numbers -> a calibrated hardware profile (no torch).

`nanoplan calibrate` reads each run's RUN_DIR/metrics.jsonl (one JSON line per optimizer
step, written by runner/train.py) and the plan the run executed (run_info.json's plan_path,
else RUN_DIR/plan.json; its hash should match run_info.json's plan_hash), and:

- keeps the steady-state steps: the last line of each step (a resume re-logs steps); per
  launch it drops the first max(--skip-steps, 10%) steps (warm-up and torch.compile); then
  every step that ran an evaluation (val_loss present);
- measures tokens/s as the median of the kept steps' tokens_per_sec (robust to the odd slow
  step), model-FLOPs MFU = tokens/s × FLOPs/token ÷ (GPUs × peak), and the peak of
  max_memory_allocated / max_memory_reserved;
- fits the MFU the planner needs to predict that tokens/s exactly (`fitted_mfu`: it inverts
  throughput.py's step time, in which only the compute and Muon's Newton–Schulz matmuls scale
  with 1/MFU; the optimizer's memory traffic, the per-micro-step costs and the communication
  are fixed by bytes, bandwidths and launch counts);
- writes a profile derived from the base one: one MfuPoint per distinct model size (from its
  runs on the fewest GPUs), default_mfu = median of the points, an effective link bandwidth
  when a model ran on one GPU and on several, and the fragmentation overhead
  max_memory_reserved / max_memory_allocated - 1 when the runs report CUDA memory.
"""
from __future__ import annotations

import datetime as _dt
import json
import math
import re
import statistics
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from planner.build import build_plan, hardware_of, step_config
from planner.errors import PlanError, echo, strict_json_loads
from planner.plan import Plan, atomic_write_text, doc_sha, load_plan, plan_hash, trained_fields
from planner.profiles import HardwareProfile, MfuPoint, Overheads
from planner.throughput import (
    LINK_EFFICIENCY,
    MFU_OVER_PEAK_NOTE,
    CommModel,
    Throughput,
    comm_model,
    estimate_throughput,
    exposed_seconds,
    link_bytes_per_s,
    measured_mfu,
    step_seconds_at,
)

METRICS = "metrics.jsonl"
RUN_INFO = "run_info.json"
MIN_STEADY_STEPS = 3          # fewer kept steps than this is not a measurement
WARMUP_FRACTION = 0.10        # always drop at least the first 10% of the logged steps
DEFAULT_SKIP_STEPS = 5        # ... and at least this many (compile happens in the first steps)
REQUIRED_KEYS = ("step", "tokens_per_sec", "world_size")


@dataclass(frozen=True)
class Measurement:
    """One run's steady-state numbers next to its plan's predictions."""

    run_dir: str
    model: str
    n_params: int
    num_gpus: int
    nodes: int
    device: str
    date: str
    compiled: bool | None
    steps_logged: int
    steps_used: int
    first_step_used: int
    tokens_per_sec: float            # measured, median over the kept steps (all ranks together)
    mfu: float                       # measured, model FLOPs: tokens/s × FLOPs/token ÷ (GPUs × peak)
    fitted_mfu: float                # the planner MFU that reproduces the measured tokens/s (plan's comm model)
    max_memory_allocated: int | None
    max_memory_reserved: int | None
    predicted_tokens_per_sec: float
    predicted_mfu: float             # plan.throughput.mfu (the planner's assumption)
    predicted_effective_mfu: float   # plan.throughput.effective_mfu (model FLOPs, comparable to mfu)
    predicted_memory_bytes: int      # plan.memory.per_gpu_bytes (allocated peak + overheads)
    predicted_allocated_bytes: int   # the memory model's allocated peak, without overheads
    plan: Plan = field(repr=False, compare=False)
    warnings: tuple[str, ...] = ()

    @property
    def fragmentation(self) -> float | None:
        """max_memory_reserved / max_memory_allocated - 1 (CUDA caching allocator), or None."""
        if not self.max_memory_allocated or self.max_memory_reserved is None:
            return None
        return max(0.0, self.max_memory_reserved / self.max_memory_allocated - 1.0)

    @property
    def measured_memory_bytes(self) -> int | None:
        return self.max_memory_reserved or self.max_memory_allocated

    def to_json(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "plan"}
        d["warnings"] = list(self.warnings)
        d["fragmentation"] = self.fragmentation
        d["tokens_per_sec_error"] = rel_err(self.predicted_tokens_per_sec, self.tokens_per_sec)
        d["mfu_error"] = rel_err(self.predicted_effective_mfu, self.mfu)
        mem = self.measured_memory_bytes
        d["memory_error"] = rel_err(self.predicted_memory_bytes, mem) if mem else None
        return d


def rel_err(predicted: float, measured: float) -> float:
    """(predicted - measured) / measured."""
    return (predicted - measured) / measured


# ---------------------------------------------------------------------------- reading


def _check_row(row: Any, where: str) -> dict[str, Any]:
    if not isinstance(row, dict):
        raise PlanError(where, "is not a JSON object", "each line must be one JSON object")
    missing = [k for k in REQUIRED_KEYS if k not in row]
    if missing:
        raise PlanError(where, f"has no {', '.join(missing)}", "write it with nanoplan run")
    if row.get("segment", 0) is None:
        del row["segment"]      # as if absent: one launch
    for k, low in (("step", 0), ("world_size", 1), ("segment", 0)):
        v = row.get(k, low)     # segment: absent in old logs (one launch)
        if not isinstance(v, int) or isinstance(v, bool) or v < low:
            raise PlanError(f"{where}: field '{k}'", f"must be an integer >= {low}, got {echo(v, 80)}")
    tps = row["tokens_per_sec"]
    if not isinstance(tps, (int, float)) or isinstance(tps, bool) or not math.isfinite(tps) or tps < 0:
        raise PlanError(f"{where}: field 'tokens_per_sec'", f"must be a finite number >= 0, got {tps!r}")
    return row


MAX_LINE_BYTES = 1 << 20     # a metrics line is ~300 bytes; a longer "line" is a sparse or NUL-filled region
READ_CHUNK = 1 << 20


def _lines(f: Any) -> Iterator[tuple[int, bytes | None]]:
    """(number, bytes) of each newline-terminated line of a binary file, read MAX_LINE_BYTES at a time: a
    longer line is (number, None) and never held whole (a 2 GB sparse file took 4.2 GB of RAM). The last,
    unterminated line (a run still writing it) is left out."""
    buf, n, over = b"", 0, False
    while chunk := f.read(READ_CHUNK):
        parts = (buf + chunk).split(b"\n")
        buf = parts.pop()
        for part in parts:
            n += 1
            yield n, None if over else part
            over = False
        if len(buf) > MAX_LINE_BYTES:
            buf, over = b"", True


def read_metrics(path: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """(rows, notes) of a metrics.jsonl, read a chunk at a time.

    Skipped with a note: the unterminated last line of a run still writing, a torn line left by a killed
    launch (the next launch starts a new line with a higher `segment`), a line that is not UTF-8 text
    (as `nanoplan run` skips it), and a "line" longer than MAX_LINE_BYTES or of NUL bytes only (a sparse
    or crash-filled region). Any other malformed line is an error.
    """
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed below
    except FileNotFoundError:
        raise PlanError(str(path), "does not exist",
                        "give a run directory written by nanoplan run (it holds metrics.jsonl)") from None
    except OSError as e:
        raise PlanError(str(path), f"cannot read: {e.strerror or e}", "give a readable metrics.jsonl") from None
    parsed: list[tuple[int, dict[str, Any] | None, str, bool]] = []
    skipped: dict[str, list[int]] = {}
    with f:
        try:
            for i, raw in _lines(f):
                why = ("are longer than a metrics line" if raw is None else "hold NUL bytes only"
                       if raw.strip(b"\0 \t\r") == b"" and raw.count(b"\0") else None)
                if why is None and raw is not None and raw.strip():
                    try:
                        line = raw.decode("utf-8")
                    except UnicodeDecodeError:
                        why = "are not UTF-8 text"
                    else:
                        try:
                            data = strict_json_loads(line)
                        except json.JSONDecodeError as e:
                            parsed.append((i, None, e.msg, line.lstrip().startswith("{")))
                        except (ValueError, RecursionError) as e:   # a 5,000-digit number, nesting past the stack
                            parsed.append((i, None, str(e).split(";")[0][:80], False))
                        else:
                            parsed.append((i, _check_row(data, f"{path}:{i}"), "", False))
                if why is not None:
                    skipped.setdefault(why, []).append(i)
        except OSError as e:
            raise PlanError(str(path), f"cannot read: {e.strerror or e}", "give a readable metrics.jsonl") from None
    rows: list[dict[str, Any]] = []
    notes = [f"{path}: skipped {len(ns):,} line(s) that {why} (line {', '.join(f'{n:,}' for n in ns[:3])}"
             f"{', ...' if len(ns) > 3 else ''})" for why, ns in skipped.items()]
    for k, (i, row, msg, obj) in enumerate(parsed):
        if row is not None:
            rows.append(row)
            continue
        nxt = next((r for _, r, _, _ in parsed[k + 1:] if r is not None), None)
        before = rows[-1].get("segment", 0) if rows else -1
        if obj and (nxt is None or nxt.get("segment", 0) > before):
            notes.append(f"{path}:{i}: skipped a torn line left by a killed launch")
            continue
        raise PlanError(f"{path}:{i}", f"is not valid JSON ({msg})",
                        "remove the line or re-run; each line must be one JSON object")
    if not rows:
        raise PlanError(str(path), "has no complete step lines", "let the run log a few steps first")
    return rows, notes


def _resolve_plan(run_dir: Path, info: dict[str, Any]) -> Path:
    """The plan a run executed: run_info.json's plan_path when it still exists, else RUN_DIR/plan.json."""
    cands: list[Path] = []
    raw = info.get("plan_path")
    if isinstance(raw, str) and raw:
        p = Path(raw)
        cands += [p] if p.is_absolute() else [run_dir / p, p]
    cands.append(run_dir / "plan.json")
    for c in cands:
        if c.is_file():
            return c
    raise PlanError(str(run_dir), "has no plan.json and run_info.json's plan_path is not readable",
                    "copy the run's plan.json into the run directory")


def file_hash(path: Path) -> str:
    """plan_hash's recipe applied to the plan file as stored, so that fields a newer schema adds
    (with defaults) do not change the hash of a plan written before them."""
    return doc_sha(trained_fields(json.loads(path.read_text(encoding="utf-8"))))


def _check_plan(plan: Plan, path: Path, info: dict[str, Any], rows: list[dict[str, Any]]) -> list[str]:
    """The plan must be the one the run executed: its tokens per step must match the log (error);
    a hash different from run_info.json's plan_hash is a warning."""
    for r in rows:
        seen, step = r.get("tokens_seen"), r["step"]
        if isinstance(seen, int) and step > 0 and seen != step * plan.schedule.tokens_per_step:
            raise PlanError(str(path), f"is not the plan this run executed: it has {plan.schedule.tokens_per_step:,} "
                            f"tokens per step, the run logged tokens_seen {seen:,} at step {step}",
                            "restore the run's own plan.json")
    want = info.get("plan_hash")
    if isinstance(want, str) and want and want not in (plan_hash(plan), file_hash(path)):
        return [f"{path}: hash {plan_hash(plan)[:12]} differs from run_info.json's {want[:12]}; "
                "check that this is the plan the run executed"]
    return []


def read_run_info(run_dir: Path) -> dict[str, Any]:
    p = run_dir / RUN_INFO
    if not p.exists():
        return {}
    try:
        data = strict_json_loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise PlanError(str(p), f"is not valid JSON ({getattr(e, 'msg', e)})", "restore it or delete it") from None
    except (ValueError, RecursionError) as e:   # a duplicate key, a 5,000-digit number, nesting past the stack
        raise PlanError(str(p), f"is not valid JSON ({str(e).split(';')[0][:120]})", "restore it or delete it") from None
    if not isinstance(data, dict):
        raise PlanError(str(p), "must hold a JSON object", "restore it or delete it")
    return data


def last_per_step(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One line per step, sorted: a resumed run re-logs steps and its later lines win."""
    by_step: dict[int, dict[str, Any]] = {}
    for r in rows:
        by_step[r["step"]] = r
    return [by_step[k] for k in sorted(by_step)]


def steady_rows(rows: list[dict[str, Any]], skip_steps: int) -> tuple[list[dict[str, Any]], int]:
    """(kept rows, rows skipped as warm-up).

    Per launch (`segment`; each resume compiles again), drop the first max(skip_steps, 10%)
    steps; then drop every evaluation step (val_loss present) and any step with no throughput.
    """
    segments: dict[Any, list[dict[str, Any]]] = {}
    for r in last_per_step(rows):
        segments.setdefault(r.get("segment", 0), []).append(r)
    kept: list[dict[str, Any]] = []
    skipped = 0
    for seg in segments.values():
        n_skip = max(skip_steps, math.ceil(WARMUP_FRACTION * len(seg)))
        skipped += min(n_skip, len(seg))
        kept += [r for r in seg[n_skip:] if r.get("val_loss") is None and r["tokens_per_sec"] > 0]
    return sorted(kept, key=lambda r: r["step"]), skipped


def _peak(rows: list[dict[str, Any]], key: str) -> int | None:
    vals = [r.get(key) for r in rows]
    nums = [int(v) for v in vals if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0]
    return max(nums) if nums else None


def _run_date(run_dir: Path, info: dict[str, Any]) -> str:
    for k in ("started_at", "start_time", "date", "created_at"):
        v = info.get(k)
        if isinstance(v, str) and len(v) >= 10:
            return v[:10]
    mtime = (run_dir / METRICS).stat().st_mtime
    return _dt.datetime.fromtimestamp(mtime, tz=_dt.timezone.utc).date().isoformat()


def _plan_step(plan: Plan, mfu: float | None = None) -> tuple[Throughput, CommModel, float, int]:
    """The planner's step-time terms for the plan's configuration at `mfu` (default: the plan's), its
    communication model, link bytes/s (0 on one GPU) and grad-accumulation steps (planner.throughput)."""
    req = plan.request
    hw = hardware_of(req)
    cfg = step_config(req, plan.training.device_batch_size, hw.num_gpus)
    tp = estimate_throughput(cfg, hw, mfu=plan.throughput.mfu if mfu is None else mfu)
    bw = link_bytes_per_s(hw) if hw.num_gpus > 1 else 0.0
    return tp, comm_model(cfg, hw.num_gpus, gpu=req.profile.kind == "gpu"), bw, cfg.grad_accum_steps


def _solve_decreasing(f: Callable[[float], float], target: float, lo: float, hi: float) -> float:
    """x in [lo, hi] with f(x) = target for a continuous non-increasing f (bisection in log space)."""
    for _ in range(200):
        mid = math.sqrt(lo * hi)
        if f(mid) > target:
            lo = mid
        else:
            hi = mid
    return math.sqrt(lo * hi)


MIN_MFU = 1e-9


def fitted_mfu(plan: Plan, tokens_per_sec: float) -> float:
    """The MFU at which the planner's step-time model gives `tokens_per_sec` for this plan.

    throughput.step_seconds_at(mfu) = compute/mfu-scaled + Newton–Schulz/mfu-scaled + fixed + exposed
    communication falls as the MFU rises (exposure falls at most as fast as compute rises); solve it
    for the measured step. A step shorter than the model allows even at MFU 1 gives 1.0.
    """
    step = plan.schedule.tokens_per_step / tokens_per_sec
    tp, cm, bw, accum = _plan_step(plan)
    at = lambda m: step_seconds_at(tp, cm, bw, accum, m)  # noqa: E731
    if at(1.0) >= step:
        return 1.0
    return _solve_decreasing(at, step, MIN_MFU, 1.0)


def measure_run(run_dir: str | Path, skip_steps: int = DEFAULT_SKIP_STEPS) -> Measurement:
    """Steady-state numbers of one run directory against its plan's predictions."""
    d = Path(run_dir)
    if not d.is_dir():
        raise PlanError(str(d), "is not a directory", "give run directories written by nanoplan run")
    rows, notes = read_metrics(d / METRICS)
    info = read_run_info(d)
    plan_path = _resolve_plan(d, info)
    plan = load_plan(plan_path)
    logged = last_per_step(rows)
    sizes = {r["world_size"] for r in logged}
    if len(sizes) != 1:
        raise PlanError(str(d / METRICS), f"mixes world sizes {sorted(sizes)}", "calibrate each configuration's run separately")
    ws = sizes.pop()
    if ws != plan.hardware.num_gpus:
        raise PlanError(str(d / METRICS), f"ran on {ws} processes but its plan is for {plan.hardware.num_gpus} GPUs",
                        "compare a run with the plan of its own configuration")
    warnings = notes + _check_plan(plan, plan_path, info, logged)
    kept, n_skip = steady_rows(rows, skip_steps)
    if len(kept) < MIN_STEADY_STEPS:
        raise PlanError(str(d / METRICS), f"has {len(logged)} steps; after dropping {n_skip} warm-up steps and the eval "
                        f"steps only {len(kept)} remain (need {MIN_STEADY_STEPS})",
                        "run more steps or lower --skip-steps")
    tps = statistics.median(float(r["tokens_per_sec"]) for r in kept)
    mfu, over = measured_mfu(tps, plan.model.flops_per_token, ws, plan.throughput.peak_flops_per_gpu)
    if over:
        warnings = [*warnings, MFU_OVER_PEAK_NOTE]
    compiled = {r.get("compiled") for r in kept}
    device = str(info.get("device_name") or info.get("device") or kept[-1].get("device") or "unknown")
    return Measurement(
        run_dir=str(d), model=plan.model.name, n_params=plan.model.n_params, num_gpus=ws,
        nodes=plan.hardware.nodes, device=device,
        date=_run_date(d, info), compiled=compiled.pop() if len(compiled) == 1 else None,
        steps_logged=len(logged), steps_used=len(kept), first_step_used=kept[0]["step"],
        tokens_per_sec=tps, mfu=mfu, fitted_mfu=fitted_mfu(plan, tps),
        max_memory_allocated=_peak(kept, "max_memory_allocated"),
        max_memory_reserved=_peak(kept, "max_memory_reserved"),
        predicted_tokens_per_sec=plan.throughput.tokens_per_sec, predicted_mfu=plan.throughput.mfu,
        predicted_effective_mfu=plan.throughput.effective_mfu,
        predicted_memory_bytes=plan.memory.per_gpu_bytes,
        predicted_allocated_bytes=plan.memory.per_gpu_bytes - sum(plan.memory.overhead.values()), plan=plan,
        warnings=tuple(warnings),
    )


def base_profile_of(run_dirs: list[str | Path]) -> HardwareProfile:
    """The hardware profile the runs were planned with (all runs must agree)."""
    profs = {}
    for d in run_dirs:
        info = read_run_info(Path(d))
        plan = load_plan(_resolve_plan(Path(d), info))
        profs[plan.request.profile.name] = plan.request.profile
    if len(profs) != 1:
        raise PlanError("RUN_DIR", f"the runs were planned for different hardware ({', '.join(sorted(profs))})",
                        "calibrate one GPU type at a time")
    return next(iter(profs.values()))


# ---------------------------------------------------------------------------- fitting


def _peak_ratio(base: HardwareProfile, plan: Plan) -> float:
    """plan peak ÷ base peak: converts an MFU against the plan's profile into one against `base`."""
    prec = "fp32" if plan.training.precision == "fp32" else "bf16"
    return plan.throughput.peak_flops_per_gpu / base.peak_flops(prec)


def fit_mfu_curve(base: HardwareProfile, runs: list[Measurement]) -> list[MfuPoint]:
    """One MfuPoint per model size: the median fitted MFU of its runs on the fewest GPUs.

    Runs on one GPU have no communication, so they measure compute alone; when a model only
    has multi-GPU runs, its MFU absorbs whatever the planner's communication model misses.
    """
    by_size: dict[int, list[Measurement]] = {}
    for m in runs:
        by_size.setdefault(m.n_params, []).append(m)
    out = []
    for n, ms in sorted(by_size.items()):
        fewest = min(m.num_gpus for m in ms)
        vals = [min(1.0, m.fitted_mfu * _peak_ratio(base, m.plan)) for m in ms if m.num_gpus == fewest]
        out.append(MfuPoint(n_params=n, mfu=round(statistics.median(vals), 6)))
    return out


def implied_link_gb_s(m: Measurement, mfu_base: float, base: HardwareProfile) -> float | None:
    """Nominal link GB/s (before throughput.LINK_EFFICIENCY) that explains a multi-GPU run's step time.

    With compute fixed by the model's single-GPU MFU, what the measured step holds beyond the
    planner's compute, optimizer and per-micro-step terms is exposed communication
    (throughput.exposed_seconds, which falls as the link gets faster): solve it for the bandwidth.
    None when the run has no communication or the step leaves none exposed (the link is then not
    the limit).
    """
    plan = m.plan
    if m.num_gpus <= 1 or plan.throughput.comm_seconds <= 0:
        return None
    tp, cm, _, accum = _plan_step(plan, mfu=min(1.0, mfu_base / _peak_ratio(base, plan)))
    step = plan.schedule.tokens_per_step / m.tokens_per_sec
    exposed = step - (tp.step_seconds - tp.exposed_comm_seconds)
    if exposed <= 0 or exposed_seconds(cm, 1e30, tp.compute_seconds, accum) >= exposed:
        return None
    bw = _solve_decreasing(lambda b: exposed_seconds(cm, b, tp.compute_seconds, accum), exposed, 1e-3, 1e18)
    return bw / 1e9 / LINK_EFFICIENCY


def calibrate_profile(base: HardwareProfile, runs: list[Measurement], today: str | None = None,
                      non_allocator_bytes: int | None = None) -> HardwareProfile:
    """A copy of `base` with the MFU curve, default MFU, link bandwidth and overheads fitted to `runs`.

    - mfu_curve: `fit_mfu_curve`; default_mfu: the median of its points.
    - intra_node_gb_s / inter_node_gb_s: when a model has runs on one GPU and on several, the
      median `implied_link_gb_s` of the multi-GPU runs (single-node runs set intra, multi-node inter).
    - overheads.fragmentation: median max_memory_reserved / max_memory_allocated - 1 (CUDA runs).
    - overheads.cuda_context_bytes: `non_allocator_bytes` (device memory in use outside torch's
      caching allocator, from torch.cuda.mem_get_info in the GPU suite); metrics.jsonl does not
      carry it, so `nanoplan calibrate` keeps the base assumption.
    """
    if not runs:
        raise PlanError("RUN_DIR", "no runs to calibrate from", "give at least one run directory")
    today = today or _dt.date.today().isoformat()
    curve = fit_mfu_curve(base, runs)
    default = round(statistics.median(p.mfu for p in curve), 6)
    devices = sorted({m.device for m in runs})
    dates = sorted({m.date for m in runs})
    where = f"{', '.join(devices)}, runs dated {dates[0]}{'..' + dates[-1] if len(dates) > 1 else ''}"
    names = ", ".join(Path(m.run_dir).name for m in runs)
    upd: dict[str, Any] = {}
    sources = dict(base.sources)

    single = {p.n_params: p.mfu for p in curve
              if any(m.n_params == p.n_params and m.num_gpus == 1 for m in runs)}
    for key, multi_node in (("intra_node_gb_s", False), ("inter_node_gb_s", True)):
        links = [g for m in runs if m.n_params in single and (m.nodes > 1) == multi_node
                 if (g := implied_link_gb_s(m, single[m.n_params], base)) is not None]
        if links:
            upd[key] = float(f"{statistics.median(links):.6g}")
            sources[key] = (f"calibrated {today}: effective bandwidth that explains the step time of {len(links)} "
                            f"multi-GPU run(s) beyond their single-GPU compute ({where}); nominal was "
                            f"{getattr(base, key):g} ({base.sources.get(key, 'unsourced')})")

    frags = [f for f in (m.fragmentation for m in runs) if f is not None]
    notes = []
    over: dict[str, Any] = {}
    if frags:
        over["fragmentation"] = round(min(1.0, statistics.median(frags)), 6)
        notes.append(f"fragmentation measured (median max_memory_reserved/max_memory_allocated - 1 over "
                     f"{len(frags)} runs on {where}, calibrated {today})")
    else:
        notes.append("fragmentation kept from the base profile: the runs report no CUDA memory (assumption)")
    if non_allocator_bytes is not None:
        over["cuda_context_bytes"] = int(non_allocator_bytes)
        notes.append(f"cuda_context_bytes measured as torch.cuda.mem_get_info used minus memory_reserved on {where}")
    else:
        notes.append("cuda_context_bytes kept from the base profile (assumption)")
    notes.append("nccl_bytes kept from the base profile (assumption)")
    overheads = Overheads(**{**base.overheads.model_dump(exclude={"source"}), **over}, source="; ".join(notes))

    sources["default_mfu"] = (f"calibrated {today}: median of the fitted MFU per model size from "
                              f"{len(runs)} run(s) ({names}) on {where}")
    sources["mfu_curve"] = (f"calibrated {today} with nanoplan calibrate: planner MFU that reproduces the measured "
                            f"steady-state tokens/s, median per model size over its runs on the fewest GPUs; "
                            f"runs {names} on {where}")
    sources["overheads"] = overheads.source
    desc = _CALIBRATED.sub("", base.description).strip()
    desc = f"{desc} [calibrated {today} from {len(runs)} run(s) on {', '.join(devices)}]".strip()
    return HardwareProfile.model_validate({
        **base.model_dump(), **upd, "description": desc, "mfu_curve": [p.model_dump() for p in curve],
        "default_mfu": default, "overheads": overheads.model_dump(), "sources": sources,
    })


_CALIBRATED = re.compile(r"\s*\[calibrated [^\]]*\]")


def repredict(m: Measurement, profile: HardwareProfile) -> Plan:
    """The run's plan rebuilt on `profile` (same batch; the profile's MFU, not a --mfu override)."""
    req = m.plan.request.model_copy(update={
        "profile": profile, "mfu": None, "device_batch_size": m.plan.training.device_batch_size})
    return build_plan(req, plan_path="plan.json")


def profile_yaml(profile: HardwareProfile, header: str = "") -> str:
    data = profile.model_dump(mode="json")
    head = "".join(f"# {line}\n" for line in header.splitlines())
    return head + yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=120)


def write_profile(profile: HardwareProfile, path: str | Path, header: str = "",
                  option: str | None = None) -> HardwareProfile:
    """Atomically write the profile YAML, then read the text back through the normal loader. `option` (the user's
    --out): through the one write path (planner/writes.py: exit 4 on a failed write); without it an OSError
    propagates (the probe reports its own files)."""
    from planner.profiles import _load_yaml_profile  # noqa: PLC0415

    text = profile_yaml(profile, header)
    if option is None:
        atomic_write_text(path, text)
    else:
        from planner.writes import write_output  # noqa: PLC0415

        write_output(path, text, option)
    return _load_yaml_profile(text, str(path))
