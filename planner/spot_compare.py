"""`nanoplan compare --spot`: each GPU configuration on spot GPUs, ranked on what the budget buys after the
interruptions (planner/spot_search.py), with expected and P90 cost and hours beside the same tokens on demand."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from planner.candidates import Length, Settings
from planner.errors import PlanError
from planner.plan import Plan, SpotRequest
from planner.profiles import parse_gpu_spec
from planner.ranking import objective_key
from planner.scaling import predicted_loss
from planner.spec import ModelSpec
from planner.spot_report import usd
from planner.spot_search import spot_search
from planner.units import fmt_count


@dataclass
class SpotRow:
    gpu: str
    plan: Plan | None
    key: tuple = ()
    note: str = ""


def _base(gpu: str, price: float | None, provider: str | None, length: Length, settings: Settings,
          spot: SpotRequest) -> dict[str, Any]:
    hw = parse_gpu_spec(gpu, option="--gpus", profile_hint=False)
    return {"gpu": gpu, "profile": hw.profile, "provider": provider, "price": price,
            "total_batch_tokens": settings.total_batch_tokens, "headroom": settings.headroom,
            "precision": settings.precision if hw.profile.kind == "gpu" else "fp32",
            "compile": hw.profile.kind == "gpu", "dataset_tokens": settings.dataset_tokens,
            "budget_usd": length.budget_usd, "hours": length.hours, "steps": length.steps, "spot": spot}


def _price_for(gpu: str, prices: dict[str, tuple[float, str]] | None) -> float | None:
    if not prices:
        return None
    hw = parse_gpu_spec(gpu, option="--gpus", profile_hint=False)
    mine = prices.get(hw.profile.name.lower()) or prices.get("*")
    if mine is None:
        return None
    return mine[0] / hw.gpus_per_node if mine[1] == "node" else mine[0]


def spot_compare(gpus: Sequence[str], models: Sequence[ModelSpec], length: Length, settings: Settings = Settings(),
                 *, objective: str = "loss", provider: str | None = None,
                 prices: dict[str, tuple[float, str]] | None = None,
                 spot: SpotRequest = SpotRequest()) -> tuple[list[SpotRow], float]:
    """One row per configuration (best first by the objective), and the seconds it took."""
    from planner.spot_plan import spot_cluster  # noqa: PLC0415

    t0 = time.perf_counter()
    if not gpus:
        raise PlanError("--gpus", "no GPU configurations given", "e.g. --gpus 8xH100,4xH100")
    rows: list[SpotRow] = []
    for gpu in gpus:
        base = _base(gpu, _price_for(gpu, prices), provider, length, settings, spot)
        try:
            hw = spot_cluster(gpu, base["profile"], provider, base["price"], option="--gpus")
            result, plan = spot_search(list(models), hw, base, objective=objective)
        except PlanError as e:
            rows.append(SpotRow(gpu=parse_gpu_spec(gpu, option="--gpus", profile_hint=False).spec, plan=None,
                                note=e.problem))
            continue
        s = plan.schedule
        loss = predicted_loss(plan.model.n_params, s.total_tokens, settings.dataset_tokens)
        key = (loss,) if objective in ("loss", "value") or result.best is None else objective_key(objective, result.best)
        rows.append(SpotRow(gpu=plan.hardware.spec, plan=plan, key=key))
    rows.sort(key=lambda r: (r.plan is None, r.key))
    return rows, time.perf_counter() - t0


def records(rows: list[SpotRow], dataset_tokens: int | None = None) -> list[dict[str, Any]]:
    out = []
    for r in rows:
        p, sp = r.plan, (r.plan.spot if r.plan is not None else None)
        out.append({
            "gpu": r.gpu, "model": p.model.name if p else None, "n_params": p.model.n_params if p else None,
            "tokens": p.schedule.total_tokens if p else None,
            "loss": round(predicted_loss(p.model.n_params, p.schedule.total_tokens, dataset_tokens), 4) if p else None,
            "provider": sp.provider if sp else None, "usd_per_gpu_hour": sp.usd_per_gpu_hour if sp else None,
            "mtbi_hours": sp.mtbi_hours if sp else None,
            "checkpoint_every_minutes": sp.checkpoint_every_minutes if sp else None,
            "expected_hours": round(sp.expected_hours, 3) if sp else None,
            "p90_hours": round(sp.p90_hours, 3) if sp else None,
            "expected_usd": round(sp.expected_usd, 2) if sp else None, "p90_usd": round(sp.p90_usd, 2) if sp else None,
            "finish_probability": sp.finish_probability if sp else None,
            "on_demand_usd": round(sp.on_demand_usd, 2) if sp and sp.on_demand_usd is not None else None,
            "on_demand_hours": round(sp.on_demand_hours, 3) if sp else None,
            "note": r.note,
        })
    return out


COLUMNS = (("", 0, True), ("GPUs", 0, True), ("model", 0, True), ("tokens", 0, False), ("exp h", 0, False),
           ("exp $", 0, False), ("P90 $", 0, False), ("loss", 0, False), ("P90 h", 2, False),
           ("on-demand $", 1, False), ("spot price", 3, True), ("every", 4, False))


def rich_table(rows: list[SpotRow], *, objective: str, length: Length, seconds: float, width: int | None,
               dataset_tokens: int | None = None) -> Any:
    from planner.tables import Col, fit_table, hidden_note  # noqa: PLC0415

    cols = [Col(n, p, "left" if left else "right") for n, p, left in COLUMNS]
    cells, styles = [], []
    for i, r in enumerate(rows):
        p = r.plan
        if p is None or p.spot is None:
            cells.append(["", r.gpu + " *"] + ["-"] * (len(cols) - 2))
            styles.append("dim")
            continue
        sp = p.spot
        cells.append(["★" if i == 0 else "", r.gpu, f"{p.model.name} ({fmt_count(p.model.n_params)})",
                      fmt_count(p.schedule.total_tokens), f"{sp.expected_hours:.1f}", usd(sp.expected_usd),
                      usd(sp.p90_usd), f"{predicted_loss(p.model.n_params, p.schedule.total_tokens, dataset_tokens):.3f}",
                      f"{sp.p90_hours:.1f}", usd(sp.on_demand_usd) if sp.on_demand_usd is not None else "-",
                      f"${p.hardware.num_gpus * sp.usd_per_gpu_hour:,.2f}/h {sp.provider.removesuffix(' spot')}",
                      f"{sp.checkpoint_every_minutes:g} min"])
        styles.append("bold green" if i == 0 else None)
    cap = (f"${length.budget_usd:,.0f} budget" if length.budget_usd is not None else
           f"{length.hours:g} h" if length.hours is not None else f"{length.steps:,} steps")
    caption = (f"★ best by '{objective}' on spot at {cap} (the cap), after interruptions; expected and P90 paid cost "
               f"and hours from a seeded Monte-Carlo; on-demand $: the same tokens at the provider's on-demand price. "
               f"{seconds * 1000:.0f} ms.")
    notes = "; ".join(f"{r.gpu}: {r.note or 'nothing fits'}" for r in rows if r.plan is None)
    if notes:
        caption += f" * {notes} (give --price)."
    t = fit_table(cols, cells, width, title=f"Best run per GPU configuration on spot (objective: {objective})",
                  styles=styles, caption=caption)
    if note := hidden_note(cols, t):
        t.caption = f"{t.caption} {note}"
    return t

