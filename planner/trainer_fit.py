"""Plan a given model for another trainer's step (`nanoplan estimate --trainer NAME`).

The trainer (planner/trainers/) maps the user's choices onto request fields and refuses what it cannot
express (PlanError, exit 2). The plan is then built as any other (planner.build.build_plan, whose memory,
counts and launch come from the trainer). What is left open is tried in the trainer's own terms: the
largest micro-batch that fits (build_plan), torchtitan's full checkpointing when selective does not fit,
DeepSpeed's ZeRO stages from the fewest partitions up (`Trainer.fallbacks`). When nothing fits, the sentences say
why, with numbers, and, for a trainer with a ladder of its own models (nanochat's depths:
`Trainer.smaller_models`), the largest that does fit. No trainer is named here: each says its own part.
"""

from __future__ import annotations

from typing import Any

from planner.build import build_plan, hardware_of
from planner.plan import Plan, PlanRequest, TrainerRef
from planner.profiles import parse_gpu_spec
from planner.trainers import Trainer, refuse_first, trainer_for
from planner.units import fmt_bytes


def _request(tr: Trainer, version: str, spec: Any, base: dict[str, Any], user: dict[str, Any]) -> PlanRequest:
    gpus = parse_gpu_spec(base["gpu"], profile=base.get("profile"))
    fields = tr.request_fields(user, gpus.num_gpus, version, profile=gpus.profile)
    req = PlanRequest.model_validate({**base, **fields, "model": spec})
    hw = hardware_of(req)
    refuse_first(tr.problems(req, hw.num_gpus, hw.nodes, hw.profile.kind), tr.name, version)
    return req


def plan_for_trainer(name: str, version: str | None, spec: Any, base: dict[str, Any], user: dict[str, Any],
                     plan_path: str = "plan.json") -> tuple[Plan, list[str]]:
    """The plan of `spec` under trainer `name`, and sentences on how it was chosen or why it does not fit.

    `base`: the request fields the CLI built (length, hardware, batch, ...); `user`: what the user chose
    of strategy, optimizer, precision, compile, activation_checkpointing and ac_mode (None: open).
    """
    tr = trainer_for(TrainerRef(name=name))   # type: ignore[arg-type]
    assert tr is not None
    v = tr.version(version).key
    req = _request(tr, v, spec, base, user)
    plan = build_plan(req, plan_path=plan_path)
    if plan.memory.fits:
        return plan, []
    tried = [plan]
    for alt in tr.fallbacks(user):
        alt_plan = build_plan(_request(tr, v, spec, base, {**user, **alt}), plan_path=plan_path)
        tried.append(alt_plan)
        if alt_plan.memory.fits:
            t = alt_plan.training
            fits = "fits, tightly," if alt_plan.memory.verdict == "tight" else "fits"
            return alt_plan, [f"{tr.plan_label(plan.request)} does not fit ({fmt_bytes(plan.memory.per_gpu_bytes)} "
                              f"per GPU at micro-batch {plan.training.device_batch_size}); "
                              f"{tr.plan_label(alt_plan.request)} {fits} at micro-batch "
                              f"{t.device_batch_size} × {t.grad_accum_steps} accumulation "
                              f"({fmt_bytes(alt_plan.memory.per_gpu_bytes)} of {fmt_bytes(alt_plan.memory.capacity_bytes)})."]
    best = min(tried, key=lambda p: p.memory.per_gpu_bytes)
    return best, why_not(best, tr, base, user, v, plan_path)


def why_not(plan: Plan, tr: Trainer, base: dict[str, Any], user: dict[str, Any], version: str,
            plan_path: str) -> list[str]:
    """Why nothing fits: the state alone against the capacity, the trainer's own reason a smaller micro-batch
    cannot help (`Trainer.no_fit_note`), and the largest of its own smaller models that fits (`smaller_models`)."""
    m = plan.memory
    b = m.breakdown
    state = b["parameters"] + b["gradients"] + b["optimizer_state"]
    out = [f"{plan.model.name} ({plan.model.n_params / 1e9:.2f}B params) does not fit with {tr.name} {version} on "
           f"{plan.hardware.spec}: {fmt_bytes(m.per_gpu_bytes)} per GPU at micro-batch {plan.training.device_batch_size} "
           f"> {fmt_bytes(m.capacity_bytes)} usable; weights, gradients and optimizer state alone are "
           f"{fmt_bytes(state)} at its {m.peak_phase}."]
    if tr.no_fit_note:
        out.append(tr.no_fit_note)
    label = largest_that_fits(plan, tr, base, user, version, plan_path)
    if label:
        out.append(f"The largest {tr.name} model below it that fits here is {label}.")
    return out


def largest_that_fits(plan: Plan, tr: Trainer, base: dict[str, Any], user: dict[str, Any], version: str,
                      plan_path: str) -> str | None:
    """The label of the largest of the trainer's smaller models that fits (micro-batch free), or None."""
    free = {k: v for k, v in base.items() if k != "device_batch_size"}
    for label, spec in tr.smaller_models(plan.request.model, version):
        try:
            p = build_plan(_request(tr, version, spec, free, user), plan_path=plan_path)
        except ValueError:
            continue
        if p.memory.fits:
            return label
    return None
