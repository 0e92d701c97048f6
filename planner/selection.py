"""The plan search and its answer: rank the grid, build the winner's plan, and the CLI entry (pure Python).

`search` evaluates the grid (planner.candidates) and ranks what fits (planner.ranking);
`plan_for_best` rebuilds the winner with `build.build_plan`, which must fit; `search_cli` is
`nanoplan estimate` with no model: it prints the runners-up and the reasons (planner.explain).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from planner.build import build_plan
from planner.candidates import FRESH_EPOCHS, Candidate, Length, SearchResult, Settings, depth_ladder, evaluate
from planner.errors import PlanError
from planner.explain import explain as why
from planner.explain import nothing_fits, runners_up_table
from planner.fit_verdict import DEFAULT_HEADROOM
from planner.memory import DEFAULT_LOSS_CHUNK_TOKENS
from planner.memory_terms import STRATEGIES
from planner.plan import Plan, PlanRequest
from planner.precision_choice import pure_bf16_sentence
from planner.profiles import Hardware, parse_gpu_spec
from planner.ranking import (
    OBJECTIVES,
    SETTINGS_TOL,
    choose,
    epoch_cap_steps,
    launch_fixed_s,
    prefer_simpler,
    zero1_first,
)
from planner.spec import ModelSpec
from planner.startup import fixed_seconds, steps_within


def search(models: Sequence[ModelSpec], hw: Hardware, length: Length, settings: Settings = Settings(), *,
           objective: str = "loss", strategies: Sequence[str] = STRATEGIES,
           ac_options: Sequence[bool] = (False, True), device_batch: int | None = None,
           settings_tol: float = SETTINGS_TOL) -> SearchResult:
    """Evaluate every candidate on `hw`; return the fitting ones ranked by `objective`.

    settings_tol: within a model and run length, settings at most this much slower (relative step time)
    than the best one are ties, won by the simplest (`tie_break`); 0 ranks by the objective alone."""
    t0 = time.perf_counter()
    if objective not in OBJECTIVES:
        raise PlanError("--objective", f"unknown objective {objective!r}", f"choose one of {', '.join(OBJECTIVES)}")
    grid = evaluate(models, hw, length, settings, strategies, ac_options, device_batch)
    tb, usd_per_hour = settings.total_batch_tokens, grid.usd_per_hour
    run_hours = (length.hours if length.hours is not None else
                 length.budget_usd / usd_per_hour if length.budget_usd is not None else 0.0)
    compiled = hw.profile.kind == "gpu" if settings.compile is None else settings.compile   # SearchResult.compiled
    fixed_s = fixed_seconds(hw.profile.kind, hw.nodes, compiled,    # every run pays its launch (planner/startup.py)
                            settings.startup_seconds)
    spend_hours, ranked, size_cap = choose(grid.fitting, objective, length.steps, run_hours, tb,
                                           settings.dataset_tokens, epoch_cap_steps(settings), usd_per_hour, fixed_s)
    if settings_tol > 0:
        ranked = prefer_simpler(ranked, settings_tol, spend_hours if length.steps is None else None, zero1_first(hw),
                                fixed_s)
    return SearchResult(hw=hw, objective=objective, settings=settings, length=length, models=tuple(models),
                        micro_batches=grid.micro_batches, strategies=tuple(strategies), ac_options=tuple(ac_options),
                        ranked=ranked, evaluated=grid.evaluated, capacity=grid.capacity,
                        seconds=time.perf_counter() - t0, spend_hours=spend_hours, run_hours=run_hours,
                        size_cap=size_cap)


def request_for(c: Candidate, base: dict[str, Any]) -> PlanRequest:
    """The PlanRequest that reproduces candidate `c` (base: the other PlanRequest fields)."""
    extra = {"max_epochs": base.get("max_epochs") or FRESH_EPOCHS} if base.get("dataset_tokens") else {}
    return PlanRequest.model_validate({**base, **extra, "model": c.spec, "device_batch_size": c.device_batch,
                                       "strategy": c.strategy, "activation_checkpointing": c.activation_checkpointing})


def plan_for_best(result: SearchResult, base: dict[str, Any], plan_path: str = "plan.json") -> Plan:
    """Build the winner with build_plan; fall back down the ranking if it does not fit there."""
    for c in result.ranked[:50]:
        plan = build_plan(request_for(c, base), plan_path=plan_path)
        if plan.schedule.total_steps != c.steps:
            # the objective chose a shorter run than the budget or hours (value, or a dataset's stop): pin its steps
            short = {**base, "budget_usd": None, "hours": None, "steps": c.steps}
            plan = build_plan(request_for(c, short), plan_path=plan_path)
        if plan.memory.fits:
            return plan
    raise nothing_fits(result)


def settings_from(base: dict[str, Any]) -> Settings:
    return Settings(total_batch_tokens=base.get("total_batch_tokens", 524_288),
                    precision=base.get("precision", "bf16-autocast"), optimizer=base.get("optimizer", "adamw"),
                    loss_chunk_tokens=base.get("loss_chunk_tokens", DEFAULT_LOSS_CHUNK_TOKENS), headroom=base.get("headroom", DEFAULT_HEADROOM),
                    mfu=base.get("mfu"), dataset_tokens=base.get("dataset_tokens"),
                    max_epochs=base.get("max_epochs") or FRESH_EPOCHS, compile=base.get("compile"),
                    startup_seconds=base.get("startup_seconds"))


def length_from(base: dict[str, Any]) -> Length:
    """The run's length from PlanRequest fields (exactly one of budget_usd, hours, steps)."""
    return Length(budget_usd=base.get("budget_usd"), hours=base.get("hours"), steps=base.get("steps"))


def search_cli(base: dict[str, Any], *, objective: str = "loss", top: int = 5, seq_len: int | None = None,
               vocab_size: int | None = None, style: str | None = None, plan_path: str = "plan.json",
               console: Any = None, wide: bool = False, explain: bool = False) -> Plan:
    """`nanoplan estimate` with no model: search, print runners-up and reasons, return the plan."""
    if top < 0:
        raise PlanError("--top", f"must be >= 0, got {top}")
    if base.get("tp", 1) > 1 or base.get("strategy") == "hsdp":     # planner/parallelism.py: planned, not searched
        raise PlanError("--tp" if base.get("tp", 1) > 1 else "--strategy", "tensor parallelism and hsdp are planned "
                        "for a given model, not searched", "give the model: --depth, --preset or its dims")
    hw = parse_gpu_spec(base["gpu"], profile=base["profile"], provider=base.get("provider"), price=base.get("price"))
    models = depth_ladder(style or "nanochat", seq_len=seq_len or 2048, vocab_size=vocab_size)
    result = search(models, hw, length_from(base), settings_from(base), objective=objective,
                    device_batch=base.get("device_batch_size"))
    if result.best is None:
        raise nothing_fits(result)
    if result.length.steps is None:   # no model trains a step in the spend: say so for the fastest (build_plan)
        fastest = min(result.ranked, key=lambda c: c.step_seconds)
        if steps_within(result.spend_hours * 3600, fastest.step_seconds, launch_fixed_s(result)) < 1:
            build_plan(request_for(fastest, {k: v for k, v in base.items() if k != "model"}), plan_path=plan_path)
    plan = plan_for_best(result, {k: v for k, v in base.items() if k != "model"}, plan_path=plan_path)
    if console is not None:
        from planner.tables import print_table  # noqa: PLC0415

        print_table(console, runners_up_table(result, top, None if wide else console.width))
        if explain:
            from rich.panel import Panel  # noqa: PLC0415  (only --explain draws one)

            reasons = why(result) + [x for x in (pure_bf16_sentence(result),) if x]   # planner.precision_choice
            console.print(Panel("\n".join(f"• {x}" for x in reasons), title=f"Why {plan.model.name}",
                                title_align="left"))
    return plan
