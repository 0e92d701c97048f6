"""A spot plan's price, length and cadence: planner/spot.py's model applied to a PlanRequest (for build_plan).

What the plan records so that the runner keeps the budget promise on spot GPUs:

- the spot price as the plan's price, so the runner's deadline is the budget at that price (runner/clock.py);
- the steps that finish within that deadline in `quantile` of the Monte-Carlo's runs, so the LR schedule
  ends at the projected finish; a run hit harder than that stops at the deadline with its warmdown
  re-laid (runner/schedule.py);
- the Young/Daly checkpoint cadence as schedule.checkpoint_every_minutes;
- the whole analysis in `plan.spot` (SpotPlan).
"""

from __future__ import annotations

import math

from planner.errors import PlanError
from planner.plan import PlanRequest, SpotPlan
from planner.profiles import RANGES, Hardware, HardwareProfile, Price, SpotPrice, parse_gpu_spec
from planner.spot import (
    MAX_INTERRUPTIONS,
    Costs,
    expected_paid_s,
    interval_s,
    mc_trials,
    outcome,
    restart_parts,
    work_within,
    young_daly_s,
)
from planner.throughput import Throughput

ON_DEMAND_CADENCE_S = 3600.0     # an on-demand plan's default: checkpoint hourly
MTBI_FROM_CLI = "--mtbi on the command line"


def _spot_entry(req: PlanRequest) -> tuple[Price, SpotPrice] | None:
    """The provider's on-demand and spot prices (None when --price gives the spot price and no profile
    entry matches)."""
    try:
        return req.profile.spot_price(req.provider)
    except PlanError:
        if req.price is not None:
            return None
        raise


def spot_cluster(gpu: str, profile: HardwareProfile, provider: str | None = None, price: float | None = None, *,
                 option: str = "--gpu") -> Hardware:
    """The cluster at its spot price: `price` when given (yours), else the provider's spot price."""
    base = parse_gpu_spec(gpu, profile=profile, provider=provider, price=price, option=option)
    if price is not None:
        return base.model_copy(update={"provider": f"{base.provider} spot"})
    od, sp = profile.spot_price(provider)
    return base.model_copy(update={"provider": f"{od.provider} spot", "usd_per_gpu_hour": sp.usd_per_gpu_hour,
                                   "price_date": sp.date, "price_source": sp.source})


def spot_hardware(req: PlanRequest) -> Hardware:
    return spot_cluster(req.gpu, req.profile, req.provider, req.price)


def _mtbi(req: PlanRequest) -> tuple[float, str]:
    assert req.spot is not None
    if req.spot.mtbi_hours is not None:
        hi = RANGES["mtbi_hours"][1]                 # a profile's ceiling; its floor (0.1 h) is for GPU nodes:
        if req.spot.mtbi_hours > hi:                 # the flag is held to the run's own restart (costs_of)
            raise PlanError("--mtbi", f"{req.spot.mtbi_hours:g} h is more than {hi:g} h between interruptions",
                            "e.g. --mtbi 6h")
        return req.spot.mtbi_hours, MTBI_FROM_CLI
    entry = _spot_entry(req)
    if entry is None:
        raise PlanError("--mtbi", f"no interruption rate is known for {req.profile.name} at your --price",
                        "give the mean time between interruptions, e.g. --mtbi 6h")
    return entry[1].mtbi_hours, entry[1].mtbi_source


def costs_of(req: PlanRequest, hw: Hardware, tp: Throughput, checkpoint_bytes: int) -> tuple[Costs, dict[str, float]]:
    """C, R and M of this plan (seconds), and R's parts."""
    bps, _ = req.profile.storage_bytes_per_s()
    parts = restart_parts(kind=req.profile.kind, nodes=hw.nodes, compile=req.compile, step_s=tp.step_seconds,
                          checkpoint_bytes=checkpoint_bytes, storage_bytes_per_s=bps)
    restart = sum(parts.values())
    mtbi_h, _ = _mtbi(req)
    if mtbi_h * 3600.0 / hw.nodes <= restart:        # --mtbi 1e-9 never answered (issue 30 #4)
        raise PlanError("--mtbi", f"{mtbi_h:g} h between interruptions ({mtbi_h * 3600.0 / hw.nodes:.3g} s for the "
                        f"{hw.spec} cluster) is not longer than one restart of this run ({restart:.3g} s: start-up, "
                        "checkpoint load, compile); it would never get past its start-up", "e.g. --mtbi 6h")
    # the MTBI is one node's: a run on N nodes stops when any of them is interrupted, N times as often
    return Costs(step_s=tp.step_seconds, write_s=checkpoint_bytes / bps, restart_s=restart,
                 first_s=restart - parts["checkpoint_load"], mtbi_s=mtbi_h * 3600.0 / hw.nodes), parts


def _interruptions(req: PlanRequest, usd_per_hour: float, tp: Throughput, tau_s: float, c: Costs) -> float:
    """How often one run is expected to be interrupted (its cap, or Daly's expected time for --steps, over the
    MTBI); PlanError past MAX_INTERRUPTIONS: no Monte-Carlo of it would end in reasonable time, nor the run."""
    if req.steps is not None:
        paid_s = expected_paid_s(req.steps * tp.step_seconds, tau_s, c)
    elif req.hours is not None:
        paid_s = req.hours * 3600.0
    else:
        paid_s = (req.budget_usd or 0.0) / usd_per_hour * 3600.0 if usd_per_hour > 0 else 0.0
    n = paid_s / c.mtbi_s
    if n > MAX_INTERRUPTIONS:
        what = "--steps" if req.steps is not None else "--hours" if req.hours is not None else "--budget"
        count = "more than the run could ever finish" if math.isinf(n) else f"about {n:,.0f} times"
        raise PlanError("--mtbi", f"at {c.mtbi_s / 3600:g} h between interruptions (of the {req.gpu} cluster) this "
                        f"run would be interrupted {count}; nanoplan models at most {MAX_INTERRUPTIONS:,}",
                        f"check --mtbi, or plan a shorter run ({what})")
    return n


def spot_length(req: PlanRequest, hw: Hardware, tp: Throughput,
                checkpoint_bytes: int) -> tuple[int, float, str, SpotPlan]:
    """(steps, hours, limited_by, SpotPlan) of a spot plan. Hours are the cap (budget or --hours, paid
    hours) or, for a plan set by --steps or an epoch cap, the expected paid hours."""
    sr = req.spot
    assert sr is not None
    usd_per_hour = hw.num_gpus * hw.usd_per_gpu_hour
    c, parts = costs_of(req, hw, tp, checkpoint_bytes)
    optimum = float(f"{interval_s(c) / 60.0:.2g}") * 60.0   # 2 figures: the expected time is flat near the optimum
    tau = sr.checkpoint_every_minutes * 60.0 if sr.checkpoint_every_minutes is not None else optimum
    mc = {"quantile_": sr.quantile, "trials": mc_trials(sr.trials, _interruptions(req, usd_per_hour, tp, tau, c)),
          "seed": sr.seed}
    cap_s: float | None = None
    if req.steps is not None:
        steps, limited = req.steps, "steps"
    else:
        if req.hours is not None:
            cap_s, limited = req.hours * 3600.0, "hours"
        else:
            if usd_per_hour <= 0:
                raise PlanError("--budget", f"the price of {hw.spec} is $0/h, so a dollar budget sets no length",
                                "give --price USD_PER_GPU_HOUR, --hours H or --steps N")
            cap_s, limited = req.budget_usd / usd_per_hour * 3600.0, "budget"  # type: ignore[operator]
        steps = max(1, math.floor(work_within(cap_s, tau, c, **mc) / tp.step_seconds))
    if req.max_epochs is not None and req.dataset_tokens:
        cap = max(1, math.floor(req.max_epochs * req.dataset_tokens / tp.tokens_per_step))
        if steps > cap:
            steps, limited = cap, "epochs"
    work = steps * tp.step_seconds
    out = outcome(work, tau, c, cap_s=cap_s, **mc)
    hours = cap_s / 3600.0 if cap_s is not None and limited in ("budget", "hours") else out.expected_s / 3600.0
    entry = _spot_entry(req)
    od_price = entry[0].usd_per_gpu_hour if entry is not None and req.price is None else None
    od_s = c.first_s + work + math.ceil(work / ON_DEMAND_CADENCE_S) * c.write_s
    mtbi_h, mtbi_src = _mtbi(req)
    bps, bps_src = req.profile.storage_bytes_per_s()
    sp = SpotPlan(
        provider=hw.provider, usd_per_gpu_hour=hw.usd_per_gpu_hour, price_date=hw.price_date,
        price_source=hw.price_source, on_demand_usd_per_gpu_hour=od_price, mtbi_hours=mtbi_h, mtbi_source=mtbi_src,
        storage_bytes_per_s=bps, storage_source=bps_src, write_seconds=c.write_s, restart_seconds=c.restart_s,
        restart_parts=parts, optimum_minutes=max(young_daly_s(c.write_s, c.mtbi_s), 1e-9) / 60.0,
        checkpoint_every_minutes=tau / 60.0, cadence="request" if sr.checkpoint_every_minutes is not None else "young-daly",
        expected_interruptions=out.interruptions, expected_lost_minutes=out.lost_per_interruption_s / 60.0,
        expected_hours=out.expected_s / 3600.0, p90_hours=out.p_s / 3600.0,
        expected_usd=out.expected_s / 3600.0 * usd_per_hour, p90_usd=out.p_s / 3600.0 * usd_per_hour,
        finish_probability=out.finish_probability, cap_hours=None if cap_s is None else cap_s / 3600.0,
        on_demand_hours=od_s / 3600.0,
        on_demand_usd=None if od_price is None else od_s / 3600.0 * hw.num_gpus * od_price,
        quantile=sr.quantile, trials=mc["trials"], seed=sr.seed,
    )
    return steps, hours, limited, sp


def spot_warnings(req: PlanRequest, sp: SpotPlan) -> list[str]:
    out = []
    if sp.mtbi_source.startswith("assumption"):
        out.append(f"spot: the mean time between interruptions, {sp.mtbi_hours:g} h, is an assumption "
                   "(no provider publishes one); give your own with --mtbi")
    if sp.on_demand_usd is not None and sp.expected_usd > sp.on_demand_usd:
        out.append(f"spot: expected ${sp.expected_usd:,.0f} is more than the same steps on demand "
                   f"(${sp.on_demand_usd:,.0f}): the interruptions cost more than the discount saves")
    cheaper = [p for p in req.profile.prices if p.usd_per_gpu_hour < sp.usd_per_gpu_hour]
    if req.price is None and cheaper:
        best = min(cheaper, key=lambda p: p.usd_per_gpu_hour)
        out.append(f"spot: {best.provider} on demand (${best.usd_per_gpu_hour:.2f}/GPU-h) costs less than this spot "
                   f"price (${sp.usd_per_gpu_hour:.2f})")     # one line at 80 columns (issue 28)
    return out
