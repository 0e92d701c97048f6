"""The search on spot GPUs: models ranked on the training the budget buys after the interruptions.

planner.selection ranks models at equal spend from a price per hour. On spot GPUs part of every paid
hour goes to lost work, restarts and checkpoint writes, so the search is run twice: once at the
spot price, which gives a winner whose spot plan (planner/spot_plan.py) says what fraction of the
cap its steps fill at the plan's quantile; then at the spot price divided by that fraction, so
that every candidate's length is the training that fits within the cap. The winner's plan is then
built from the real request (the spot price, the budget as the cap, the Monte-Carlo's steps).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from planner.build import build_plan
from planner.candidates import Candidate, Length, SearchResult
from planner.errors import PlanError
from planner.explain import nothing_fits
from planner.plan import Plan
from planner.profiles import Hardware
from planner.selection import request_for, search, settings_from
from planner.spec import ModelSpec
from planner.spot_plan import spot_cluster


def _cap_scale(c: Candidate, result: SearchResult) -> float:
    """A candidate that the objective made shorter than the full length (--objective value, a dataset's
    stop) keeps that share of the cap."""
    if result.length.steps is not None or result.run_hours <= 0:
        return 1.0
    return min(1.0, c.hours / result.run_hours)


def spot_plan_for(c: Candidate, result: SearchResult, base: dict[str, Any], plan_path: str = "plan.json") -> Plan:
    """The spot plan of candidate `c`: the budget or hours stay the cap (scaled for a shorter choice)."""
    scale = _cap_scale(c, result)
    req = dict(base)
    if scale < 1.0 - 1e-9:
        if req.get("budget_usd") is not None:
            req["budget_usd"] = req["budget_usd"] * scale
        elif req.get("hours") is not None:
            req["hours"] = req["hours"] * scale
    return build_plan(request_for(c, req), plan_path=plan_path)


def best_spot_plan(result: SearchResult, base: dict[str, Any], plan_path: str = "plan.json") -> Plan:
    for c in result.ranked[:50]:
        plan = spot_plan_for(c, result, base, plan_path)
        if plan.memory.fits:
            return plan
    raise nothing_fits(result)


def useful_fraction(plan: Plan) -> float:
    """The share of the cap that the plan's steps fill with training (at the plan's quantile)."""
    sp = plan.spot
    if sp is None or sp.cap_hours is None:
        return 1.0
    return max(1e-3, min(1.0, plan.schedule.total_steps * plan.throughput.step_seconds / (sp.cap_hours * 3600)))


def spot_search(models: list[ModelSpec], hw: Hardware, base: dict[str, Any], *, objective: str = "loss",
                device_batch: int | None = None, plan_path: str = "plan.json") -> tuple[SearchResult, Plan]:
    """Search on spot GPUs (see the module docstring); `hw` is the cluster at its spot price."""
    length = Length(budget_usd=base.get("budget_usd"), hours=base.get("hours"), steps=base.get("steps"))
    settings = settings_from(base)
    first = search(models, hw, length, settings, objective=objective, device_batch=device_batch)
    if first.best is None:
        raise nothing_fits(first)
    frac = useful_fraction(best_spot_plan(first, base))
    if length.steps is not None or frac >= 1.0:
        return first, best_spot_plan(first, base, plan_path)
    if length.budget_usd is not None:
        hw2 = hw.model_copy(update={"usd_per_gpu_hour": hw.usd_per_gpu_hour / frac})
        second = search(models, hw2, length, settings, objective=objective, device_batch=device_batch)
    else:
        second = search(models, hw, replace(length, hours=length.hours * frac),   # type: ignore[operator]
                        settings, objective=objective, device_batch=device_batch)
    if second.best is None:
        raise nothing_fits(second)
    return second, best_spot_plan(second, base, plan_path)


def spot_search_cli(base: dict[str, Any], *, objective: str = "loss", top: int = 5, seq_len: int | None = None,
                    vocab_size: int | None = None, style: str | None = None, plan_path: str = "plan.json",
                    console: Any = None, wide: bool = False, explain: bool = False) -> Plan:
    """`nanoplan estimate --spot` with no model: search, print the runners-up and reasons, return the plan."""
    from planner.candidates import depth_ladder  # noqa: PLC0415
    from planner.explain import explain as why  # noqa: PLC0415
    from planner.explain import runners_up_table  # noqa: PLC0415

    if top < 0:
        raise PlanError("--top", f"must be >= 0, got {top}")
    hw = spot_cluster(base["gpu"], base["profile"], base.get("provider"), base.get("price"))
    models = depth_ladder(style or "nanochat", seq_len=seq_len or 2048, vocab_size=vocab_size)
    result, plan = spot_search(models, hw, {k: v for k, v in base.items() if k != "model"}, objective=objective,
                               device_batch=base.get("device_batch_size"), plan_path=plan_path)
    if console is not None:
        from rich.panel import Panel  # noqa: PLC0415

        from planner.tables import print_table  # noqa: PLC0415

        console.print(f"Spot: ranked on the training that fits in {useful_fraction(plan):.0%} of the cap after "
                      "interruptions", style="dim", highlight=False)
        print_table(console, runners_up_table(result, top, None if wide else console.width))
        if explain:
            console.print(Panel("\n".join(f"• {x}" for x in why(result)), title=f"Why {plan.model.name}",
                                title_align="left"))
    return plan
