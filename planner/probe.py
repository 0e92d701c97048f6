"""`nanoplan probe`'s decisions, without torch: the configurations to try, what a trial measured
against what the planner predicted, the configuration to keep, and the corrected plan.

- Trials: the plan's own configuration, the next smaller and the next bigger micro-batch that
  divide its batch (`planner.build.batch_choices`), and activation checkpointing off when the plan
  has it on. Each trial is the plan itself with that micro-batch and checkpointing and a few steps
  (`trial_plan`), so its predictions are the planner's.
- Fit: on CUDA a trial fits when its peak device use (max_memory_reserved plus the memory outside
  torch's allocator, from mem_get_info) stays under the device's memory less the plan's headroom.
  Without CUDA readings (CPU) the memory model decides. A trial that ran out of memory does not fit.
- Choice: the fastest measured trial that fits; the plan's own configuration stays unless another
  is more than MIN_GAIN faster (timing noise).
- Correction: the measurement of the chosen trial is folded into a calibrated profile with
  `planner.calibrate.calibrate_profile` (its MFU reproduces the measured tokens/s), and the plan
  is rebuilt on it with that configuration. The probe's time is charged to the run: an
  hours-limited plan keeps the hours left after the probe, a budget-limited one the dollars left;
  a step-limited plan keeps its steps (the probe's cost comes on top, and the table says so).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from planner.build import batch_choices, build_plan
from planner.calibrate import Measurement, calibrate_profile, fitted_mfu, rel_err
from planner.errors import PlanError
from planner.plan import Plan, PlanRequest
from planner.profiles import HardwareProfile
from planner.throughput import measured_mfu
from planner.units import fmt_bytes, fmt_count, fmt_duration

MIN_GAIN = 0.02      # assumption: a config must beat the plan's own by 2% to replace it (step-time noise)
PROBED_SUFFIX = "-probed"   # the calibrated profile's name: the built-in name with this suffix
PHASE_STEPS = 2      # steps after the timed ones, timed by phase (with device syncs between phases)
OK, NO_FIT, TIMED_OUT, FAILED, SKIPPED = "ok", "does not fit", "timed out", "failed", "skipped"


@dataclass(frozen=True)
class TrialConfig:
    role: str                  # plan | smaller | bigger | ckpt off (activation checkpointing off)
    device_batch_size: int
    activation_checkpointing: bool

    @property
    def label(self) -> str:
        return trial_label(self.device_batch_size, self.activation_checkpointing)


def trial_label(device_batch_size: int, activation_checkpointing: bool) -> str:
    """b8 (no checkpointing) or b8-ac: names a trial, its directory and a fault selector."""
    return f"b{device_batch_size}" + ("-ac" if activation_checkpointing else "")


def neighbours(plan: Plan) -> list[TrialConfig]:
    """The plan's configuration first, then its neighbours."""
    tr = plan.training
    b, ac = tr.device_batch_size, tr.activation_checkpointing
    choices = batch_choices(tr.total_batch_tokens, tr.seq_len, plan.hardware.num_gpus)
    out = [TrialConfig("plan", b, ac)]
    smaller = [c for c in choices if c < b]
    bigger = [c for c in choices if c > b]
    if smaller:
        out.append(TrialConfig("smaller", max(smaller), ac))
    if bigger:
        out.append(TrialConfig("bigger", min(bigger), ac))
    if ac:
        out.append(TrialConfig("ckpt off", b, False))
    return out


def trial_plan(plan: Plan, cfg: TrialConfig, steps: int, plan_path: str = "plan.json") -> Plan:
    """The plan with the trial's micro-batch and checkpointing, `steps` long, without validation."""
    req = plan.request.model_dump()
    req.update(device_batch_size=cfg.device_batch_size, activation_checkpointing=cfg.activation_checkpointing,
               steps=steps, hours=None, budget_usd=None, max_epochs=None,
               hyper={**req["hyper"], "val_every_steps": 0, "patience_evals": 0})
    return build_plan(PlanRequest.model_validate(req), plan_path=plan_path)


# ---------------------------------------------------------------------------- one trial's record


def predicted(tplan: Plan) -> dict[str, Any]:
    tp, mem = tplan.throughput, tplan.memory
    return {"tokens_per_sec": tp.tokens_per_sec, "mfu": tp.effective_mfu, "step_seconds": tp.step_seconds,
            "memory_bytes": mem.per_gpu_bytes, "allocated_bytes": mem.per_gpu_bytes - sum(mem.overhead.values()),
            "fits": mem.fits}


def peak_device_bytes(memory: dict[str, Any]) -> int | None:
    """Peak device use: max_memory_reserved + the memory outside the allocator (None without CUDA readings)."""
    res, extra = memory.get("max_memory_reserved"), memory.get("non_allocator_bytes")
    if res is None or extra is None:
        return None
    return int(res) + max(0, int(extra))


def trial_record(cfg: TrialConfig, tplan: Plan, status: str, raw: dict[str, Any] | None, seconds: float,
                 note: str = "") -> dict[str, Any]:
    """What the trial measured next to what the planner predicted, for probe.json."""
    rec: dict[str, Any] = {
        "label": cfg.label, "role": cfg.role, "device_batch_size": cfg.device_batch_size,
        "grad_accum_steps": tplan.training.grad_accum_steps, "activation_checkpointing": cfg.activation_checkpointing,
        "status": status, "seconds": seconds, "note": note, "predicted": predicted(tplan), "measured": None,
        "error": None, "fits_with_headroom": False if status == NO_FIT else None, "fit_basis": None,
    }
    mem = (raw or {}).get("memory") or {}
    if status == NO_FIT:
        rec["measured"] = {**mem} if mem else None
        rec["fit_basis"] = "ran out of memory"
    if status != OK or raw is None:
        return rec
    steps = [float(s) for s in raw["step_seconds"]]
    tps = tplan.schedule.tokens_per_step / statistics.median(steps)
    world = tplan.hardware.num_gpus
    mfu = measured_mfu(tps, tplan.model.flops_per_token, world, tplan.throughput.peak_flops_per_gpu)[0]
    peak = peak_device_bytes(mem)
    headroom = tplan.request.headroom
    if peak is not None:
        total = mem.get("mem_get_info_total") or tplan.request.profile.usable_bytes
        cap = int(min(total, tplan.request.profile.usable_bytes) * (1 - headroom))
        rec["fits_with_headroom"] = peak <= cap
        rec["fit_basis"] = (f"measured: peak reserved + memory outside the allocator {fmt_bytes(peak)} "
                            f"{'<=' if peak <= cap else '>'} {fmt_bytes(cap)} ({headroom:.0%} headroom)")
    else:
        rec["fits_with_headroom"] = tplan.memory.fits
        rec["fit_basis"] = "memory model (no CUDA memory readings on this device)"
    rec["measured"] = {
        "tokens_per_sec": tps, "mfu": mfu, "fitted_mfu": fitted_mfu(tplan, tps),
        "step_seconds_median": statistics.median(steps), "step_seconds": steps,
        "warmup_step_seconds": raw.get("warmup_step_seconds"), "setup_seconds": raw.get("setup_seconds"),
        "phases": raw.get("phases"), "final_loss": raw.get("final_loss"), **mem, "peak_device_bytes": peak,
    }
    p = rec["predicted"]
    rec["error"] = {"tokens_per_sec": rel_err(p["tokens_per_sec"], tps), "mfu": rel_err(p["mfu"], mfu),
                    "memory": rel_err(p["memory_bytes"], peak) if peak else None,
                    "allocated": (rel_err(p["allocated_bytes"], mem["max_memory_allocated"])
                                  if mem.get("max_memory_allocated") else None)}
    return rec


def measurement_of(tplan: Plan, *, label: str, tokens_per_sec: float, steps: int, device: str, date: str,
                   max_memory_allocated: int | None = None, max_memory_reserved: int | None = None,
                   first_step_used: int = 0) -> Measurement:
    """A short measured run of `tplan` as planner.calibrate's Measurement (the probe and benchmarks/gpu_suite.py)."""
    return Measurement(
        run_dir=label, model=tplan.model.name, n_params=tplan.model.n_params, num_gpus=tplan.hardware.num_gpus,
        nodes=tplan.hardware.nodes, device=device, date=date, compiled=tplan.training.compile, steps_logged=steps,
        steps_used=steps, first_step_used=first_step_used, tokens_per_sec=tokens_per_sec,
        mfu=measured_mfu(tokens_per_sec, tplan.model.flops_per_token, tplan.hardware.num_gpus,
                         tplan.throughput.peak_flops_per_gpu)[0],
        fitted_mfu=fitted_mfu(tplan, tokens_per_sec), max_memory_allocated=max_memory_allocated,
        max_memory_reserved=max_memory_reserved, predicted_tokens_per_sec=tplan.throughput.tokens_per_sec,
        predicted_mfu=tplan.throughput.mfu, predicted_effective_mfu=tplan.throughput.effective_mfu,
        predicted_memory_bytes=tplan.memory.per_gpu_bytes,
        predicted_allocated_bytes=tplan.memory.per_gpu_bytes - sum(tplan.memory.overhead.values()), plan=tplan,
    )


# ---------------------------------------------------------------------------- choice and correction


def choose(records: list[dict[str, Any]]) -> tuple[dict[str, Any] | None, str]:
    """(the record to keep, why), or (None, why not)."""
    ok = [r for r in records if r["status"] == OK and r["fits_with_headroom"]]
    if not ok:
        seen = ", ".join(f"{r['label']} {r['status']}" + (" (over the headroom)" if r["status"] == OK else "")
                         for r in records)
        return None, f"no trial ran and fit with headroom ({seen})"
    best = max(ok, key=lambda r: r["measured"]["tokens_per_sec"])
    own = next((r for r in ok if r["role"] == "plan"), None)
    tps = best["measured"]["tokens_per_sec"]
    if own is not None and best is not own and tps <= own["measured"]["tokens_per_sec"] * (1 + MIN_GAIN):
        return own, (f"{own['label']} (the plan's): {best['label']} is within {MIN_GAIN:.0%} of it, "
                     "not worth a change")
    why = "the fastest measured that fits" if best is not own else "the plan's, and the fastest measured that fits"
    return best, f"{best['label']}: {why} ({tps:,.0f} tokens/s)"


def probe_cost(cost_s: float, plan: Plan) -> dict[str, float]:
    h = cost_s / 3600.0
    return {"seconds": cost_s, "hours": h, "usd": h * plan.budget.usd_per_hour}


def corrected_length(plan: Plan, cost_s: float) -> tuple[dict[str, Any], str]:
    """The request fields that set the corrected plan's length, and a sentence on what the probe cost."""
    req, c = plan.request, probe_cost(cost_s, plan)
    if req.hours is not None:
        left = req.hours - c["hours"]
        if left <= 0:
            raise PlanError("probe", f"took {fmt_duration(cost_s)}, the plan's whole {fmt_duration(req.hours * 3600)}",
                            "give the plan more hours, or probe with fewer --steps or a shorter --timeout")
        return {"hours": left}, (f"charged to the budget: {fmt_duration(req.hours * 3600)} − "
                                 f"{fmt_duration(cost_s)} probe = {fmt_duration(left * 3600)} left")
    if req.budget_usd is not None:
        left = req.budget_usd - c["usd"]
        if left <= 0:
            raise PlanError("probe", f"cost ${c['usd']:,.2f}, the plan's whole ${req.budget_usd:,.2f}",
                            "give the plan a bigger budget, or probe with fewer --steps or a shorter --timeout")
        return {"budget_usd": left}, (f"charged to the budget: ${req.budget_usd:,.2f} − ${c['usd']:,.2f} probe "
                                      f"= ${left:,.2f} left")
    return {}, (f"not charged: the plan's length is {req.steps:,} steps (--steps); the probe's "
                f"{fmt_duration(cost_s)} (${c['usd']:,.2f}) come on top")


def replan(plan: Plan, chosen: Plan, m: Measurement, cost_s: float, *, plan_path: str, today: str,
           non_allocator_bytes: int | None = None) -> tuple[Plan, HardwareProfile, str]:
    """(the corrected plan, its calibrated profile, the sentence on the probe's cost)."""
    base = plan.request.profile
    profile = calibrate_profile(base, [m], today=today, non_allocator_bytes=non_allocator_bytes)
    name = base.name if base.name.endswith(PROBED_SUFFIX) else base.name + PROBED_SUFFIX
    profile = HardwareProfile.model_validate({**profile.model_dump(), "name": name})   # not the built-in's figures
    length, note = corrected_length(plan, cost_s)
    req = plan.request.model_dump()
    req.update(profile=profile.model_dump(), mfu=None, device_batch_size=chosen.training.device_batch_size,
               activation_checkpointing=chosen.training.activation_checkpointing, **length)
    return build_plan(PlanRequest.model_validate(req), plan_path=plan_path), profile, note


def plan_summary(plan: Plan) -> dict[str, Any]:
    tr, tp, s, b = plan.training, plan.throughput, plan.schedule, plan.budget
    return {"device_batch_size": tr.device_batch_size, "grad_accum_steps": tr.grad_accum_steps,
            "activation_checkpointing": tr.activation_checkpointing, "strategy": tr.strategy,
            "tokens_per_sec": tp.tokens_per_sec, "mfu": tp.effective_mfu, "step_seconds": tp.step_seconds,
            "memory_bytes": plan.memory.per_gpu_bytes, "hours": b.hours, "usd": b.usd, "limited_by": b.limited_by,
            "steps": s.total_steps, "tokens": s.total_tokens, "epochs": s.epochs,
            "checkpoint_every_steps": s.checkpoint_every_steps, "checkpoint_every_minutes": s.checkpoint_every_minutes}


def before_after(before: Plan, after: Plan, chosen: dict[str, Any]) -> list[tuple[str, str, str]]:
    """Rows (what, before, after) of the table `nanoplan probe` prints."""
    b, a = plan_summary(before), plan_summary(after)
    meas = chosen["measured"]

    def cfg(s: dict[str, Any]) -> str:
        return (f"{s['device_batch_size']} × {s['grad_accum_steps']}, {s['strategy']}, "
                f"{'AC' if s['activation_checkpointing'] else 'no AC'}")

    def pct(x: float, y: float) -> str:
        return f" ({x / y - 1:+.0%})" if y else ""

    mem_after = (f"{fmt_bytes(meas['peak_device_bytes'])} measured" if meas.get("peak_device_bytes")
                 else f"{fmt_bytes(a['memory_bytes'])} (model, unmeasured)")

    def tokens(s: dict[str, Any]) -> str:
        return fmt_count(s["tokens"]) + ("" if s["epochs"] is None else f", {s['epochs']:.2f} epochs")

    def every(s: dict[str, Any]) -> str:
        return f"{s['checkpoint_every_steps']:,} steps ({fmt_duration(s['checkpoint_every_minutes'] * 60)})"

    # one screen (80×24 with the trials): the settings in one row, tokens/s with its MFU, durations in words
    return [
        ("micro-batch × accum", cfg(b), cfg(a)),
        ("tokens/s (MFU)", f"{b['tokens_per_sec']:,.0f} ({b['mfu']:.1%}) assumed",
         f"{a['tokens_per_sec']:,.0f} ({a['mfu']:.1%}) measured" + pct(a["tokens_per_sec"], b["tokens_per_sec"])),
        ("peak memory per GPU", f"{fmt_bytes(b['memory_bytes'])} (model)", mem_after),
        ("length", fmt_duration(b["hours"] * 3600), fmt_duration(a["hours"] * 3600)),
        ("steps", f"{b['steps']:,}", f"{a['steps']:,}" + pct(a["steps"], b["steps"])),
        ("tokens", tokens(b), tokens(a)),
        ("checkpoint every", every(b), every(a)),
        ("cost", f"${b['usd']:,.2f}", f"${a['usd']:,.2f}"),
    ]
