"""Make a given model fit: pick the strategy and activation checkpointing when the user did not.

`nanoplan estimate --depth 64` names the model but not how to hold it. The default is the
simplest setting, ddp without checkpointing at the largest micro-batch that fits; on several
GPUs (not CPU profiles), where that fits, zero1 takes its place when zero1's modelled step time is within
SETTINGS_TOL (1%) of ddp's at the same micro-batch (it holds 1/dp of the optimizer state; its
parameter broadcast is its only extra cost). When ddp does not fit, this module tries every
strategy (ddp, zero1, zero2, fsdp) × checkpointing (off, on) × micro-batch the user left open, keeps those that fit the memory model, and picks
the one with the most tokens for the length (ties go to the simpler setting, as in the
search). It returns the plan and a few sentences, with numbers, that say why.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from planner.build import build_plan, hardware_of, memory_of, step_config
from planner.candidates import Candidate, SearchResult
from planner.explain import min_memory, why_settings, zero1_sentence
from planner.memory_terms import STRATEGIES
from planner.plan import Plan, PlanRequest
from planner.precision_choice import CITE
from planner.profiles import Hardware
from planner.ranking import SETTINGS_TOL, zero1_first
from planner.selection import length_from, request_for, search, settings_from
from planner.spec import ModelSpec
from planner.throughput import estimate_throughput
from planner.units import fmt_bytes, fmt_count


def comfortable(plan: Plan) -> bool:
    """The verdict "fits" (margin included): what the planner's own choices keep. A tight plan is not refused
    (plan.memory.fits), but the planner does not choose one while a setting that fits exists."""
    return plan.memory.verdict == "fits" if plan.memory.verdict is not None else plan.memory.fits


def fit_model(spec: ModelSpec, base: dict[str, Any], *, strategy: str | None, ac: bool | None,
              plan_path: str = "plan.json") -> tuple[Plan, list[str], SearchResult | None]:
    """The plan for `spec`, plus why its strategy/checkpointing were chosen (empty if nothing changed).

    `strategy`/`ac` are the user's choices, None when left open (then `base`'s simplest
    setting, the CLI's ddp without checkpointing, stands). That setting is kept when it fits;
    otherwise the open dimensions are searched.
    """
    pinned = {k: v for k, v in (("strategy", strategy), ("activation_checkpointing", ac)) if v is not None}
    plan = build_plan(PlanRequest.model_validate({**base, **pinned, "model": spec}), plan_path=plan_path)
    if plan.request.tp > 1 or plan.request.strategy == "hsdp":   # planned as asked: the search runs the runner's
        return plan, [], None                                     # strategies only (planner/parallelism.py)
    if strategy is None and base.get("device_batch_size") is None and comfortable(plan):
        faster = fastest_setting(spec, base, plan, ac, plan_path)
        if faster is not None:
            return faster
    if strategy is None and comfortable(plan):
        sharded = zero1_default(spec, {**base, **pinned}, plan_path)
        if sharded is not None:
            return sharded[0], [sharded[1]], None
    if comfortable(plan) or (strategy is not None and ac is not None):
        return plan, [], None
    hw = hardware_of(plan.request)
    result = search([spec], hw, length_from(base), settings_from(base), objective="throughput",
                    strategies=(strategy,) if strategy else STRATEGIES,
                    ac_options=(ac,) if ac is not None else (False, True),
                    device_batch=base.get("device_batch_size"))
    for c in result.ranked[:20]:
        chosen = build_plan(request_for(c, {k: v for k, v in base.items() if k != "model"}), plan_path=plan_path)
        if comfortable(chosen):
            return chosen, explain_fit(result, c, plan), result
    if plan.memory.fits:     # tight, and nothing open fits with the margin: kept, with its warning
        return plan, [f"{spec.name} is tight with {plan.training.strategy} at micro-batch "
                      f"{plan.training.device_batch_size}, and no setting left open fits with the margin: "
                      "kept, with the warning below."], result
    return plan, nothing_fits_with(spec, base, hw, plan, strategy, ac), result


def fastest_setting(spec: ModelSpec, base: dict[str, Any], simple: Plan, ac: bool | None,
                    plan_path: str) -> tuple[Plan, list[str], SearchResult] | None:
    """With strategy and micro-batch open: the search's choice (the fastest fitting setting, ties within
    SETTINGS_TOL to the simplest) when it is not the simple plan and is faster; else None."""
    hw = hardware_of(simple.request)
    result = search([spec], hw, length_from(base), settings_from(base), objective="throughput",
                    ac_options=(ac,) if ac is not None else (False, True))
    best, t = result.best, simple.training
    if best is None or (best.strategy, best.activation_checkpointing, best.device_batch) == \
            (t.strategy, t.activation_checkpointing, t.device_batch_size):
        return None
    setting = {"strategy": best.strategy, "activation_checkpointing": best.activation_checkpointing,
               "device_batch_size": best.device_batch}     # the user's length stands (no search cap)
    chosen = build_plan(PlanRequest.model_validate({**base, **setting, "model": spec}), plan_path=plan_path)
    if not comfortable(chosen) or chosen.throughput.step_seconds >= simple.throughput.step_seconds:
        return None
    return chosen, why_settings(result, best), result


def zero1_default(spec: ModelSpec, base: dict[str, Any], plan_path: str) -> tuple[Plan, str] | None:
    """zero1's plan and why, on several GPUs where it fits and costs at most SETTINGS_TOL of step time
    against ddp at the same micro-batch; else None (ddp stays the default)."""
    req = PlanRequest.model_validate({**base, "model": spec, "strategy": "zero1"})
    hw = hardware_of(req)
    if not zero1_first(hw):
        return None
    plan = build_plan(req, plan_path=plan_path)
    if not comfortable(plan):
        return None
    ddp_req = req.model_copy(update={"strategy": "ddp"})
    cfg = step_config(ddp_req, plan.training.device_batch_size, hw.num_gpus)
    ddp_step = estimate_throughput(cfg, hw, mfu=req.mfu).step_seconds
    cost = plan.throughput.step_seconds / ddp_step - 1
    if cost > SETTINGS_TOL:
        return None
    ddp_mem = memory_of(cfg, hw)
    return plan, zero1_sentence(hw.num_gpus, ddp_mem.breakdown["optimizer_state"],
                                plan.memory.breakdown["optimizer_state"], cost, ddp_mem.total,
                                plan.memory.per_gpu_bytes)


def nothing_fits_with(spec: ModelSpec, base: dict[str, Any], hw: Hardware, simplest: Plan, strategy: str | None,
                      ac: bool | None) -> list[str]:
    """When the user's pinned choice leaves nothing that fits: say what would."""
    pinned = ", ".join(x for x in (f"--strategy {strategy}" if strategy else "",
                                   "" if ac is None else f"--{'' if ac else 'no-'}activation-checkpointing") if x)
    b = base.get("device_batch_size")
    mem = fmt_bytes(simplest.memory.per_gpu_bytes)
    how = pinned or "any strategy or checkpointing"
    head = (f"{spec.name} does not fit with {how} at micro-batch {b}, the only one tried (--device-batch-size): "
            f"{mem} per GPU." if b is not None else
            f"{spec.name} does not fit with {how} at any micro-batch: {mem} per GPU even at micro-batch "
            f"{simplest.training.device_batch_size}.")
    free = search([spec], hw, length_from(base), settings_from(base), objective="throughput",
                  device_batch=base.get("device_batch_size"))
    if free.best is None:
        return [head, "No strategy or checkpointing makes it fit here: use more or bigger GPUs or a smaller model.",
                *pure_bf16_fits(spec, base, hw)]
    c = free.best
    drop = " and ".join(x for x in (pinned, "--device-batch-size" if b is not None and c.device_batch != b else "") if x)
    return [head, f"{c.settings_label} at micro-batch {c.device_batch} would fit ({fmt_bytes(c.mem_bytes)} per GPU): "
                  f"drop {drop or 'the pinned settings'} to let nanoplan choose."]


def pure_bf16_fits(spec: ModelSpec, base: dict[str, Any], hw: Hardware) -> list[str]:
    """Under bf16 autocast, when nothing fits: whether pure bf16 would, and why it is not chosen (planner.precision_choice)."""
    if base.get("precision", "bf16-autocast") != "bf16-autocast":
        return []
    pure = search([spec], hw, length_from(base), replace(settings_from(base), precision="bf16"),
                  objective="throughput", device_batch=base.get("device_batch_size"))
    if pure.best is None:
        return []
    c = pure.best
    return [f"Pure bf16 (--precision bf16) would fit, {c.settings_label} at micro-batch {c.device_batch} "
            f"({fmt_bytes(c.mem_bytes)} per GPU), but with no fp32 master weights AdamW's small updates round away "
            f"({CITE}); nanoplan does not choose it for you."]


def explain_fit(result: SearchResult, best: Candidate, simplest: Plan) -> list[str]:
    """Sentences: why the simple setting fails, what was chosen, and what it costs."""
    cap = fmt_bytes(result.capacity)
    b_min = result.micro_batches[-1]
    tr = simplest.training
    label = tr.strategy + (" + checkpointing" if tr.activation_checkpointing else "")
    out = [f"{best.name} ({fmt_count(best.n_params)} params) does not fit with {label}: "
           f"{fmt_bytes(simplest.memory.per_gpu_bytes)} per GPU at micro-batch {tr.device_batch_size} "
           f"> {cap} usable."]
    ranked = result.ranked
    ddp_fits = any(c.strategy == "ddp" for c in ranked)
    if not ddp_fits and "ddp" in result.strategies:
        ac_ = True in result.ac_options     # checkpointing, unless the user turned it off
        need = min_memory(best.spec, result, "ddp", ac_)
        out.append(f"ddp does not fit at all: even at micro-batch {b_min}{' with checkpointing' if ac_ else ''} it "
                   f"needs {fmt_bytes(need)} per GPU (every GPU holds the whole model, gradients and AdamW state).")
    out.append(f"Chosen: {best.settings_label} at micro-batch {best.device_batch} × {best.grad_accum} accumulation, "
               f"{fmt_bytes(best.mem_bytes)} of {cap} per GPU, {fmt_count(best.tokens_per_sec)} tokens/s, "
               f"{fmt_count(best.tokens)} tokens in {best.hours:.1f} h for ${best.usd:,.0f}.")
    fitting, failing = [], []
    for st in result.strategies:
        for ac in result.ac_options:
            name = st + ("+AC" if ac else "")
            if (st, ac) == (best.strategy, best.activation_checkpointing) or \
                    (st == tr.strategy and ac == tr.activation_checkpointing) or (st == "ddp" and not ddp_fits):
                continue
            alt = [c for c in ranked if c.strategy == st and c.activation_checkpointing == ac]
            if alt:
                a = alt[0]
                fitting.append(f"{name} at micro-batch {a.device_batch} ({fmt_bytes(a.mem_bytes)}, "
                               f"{a.tokens_per_sec / best.tokens_per_sec - 1:+.1%} tokens/s)")
            else:
                failing.append(f"{name} {fmt_bytes(min_memory(best.spec, result, st, ac))}")
    if fitting:
        out.append("Also fit, but slower or more complex: " + "; ".join(fitting) + ".")
    if failing:
        out.append(f"Do not fit even at micro-batch {b_min}: " + ", ".join(failing) + ".")
    return out
