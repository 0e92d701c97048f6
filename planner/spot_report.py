"""A spot plan in a few lines: price, cadence and why, expected and P90 cost, and the on-demand comparison."""

from __future__ import annotations

from planner.plan import Plan
from planner.spot_plan import MTBI_FROM_CLI
from planner.units import fmt_bytes, fmt_count


def usd(x: float) -> str:
    return f"${x:,.0f}" if x >= 10 else f"${x:,.2f}"


def hrs(h: float) -> str:
    return f"{h:.1f} h" if h >= 1 else f"{h * 60:.0f} min" if h * 60 >= 1 else f"{h * 3600:.0f} s"


def minutes(m: float) -> str:
    return f"{m:.0f} min" if m >= 10 else f"{m:.1f} min" if m >= 1 else f"{m * 60:.0f} s"


def secs(s: float) -> str:
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.1f} min"


def spot_lines(plan: Plan, without_spot: Plan | None = None) -> list[str]:
    """Five short lines (80 columns) for `nanoplan estimate --spot`. `without_spot` is the same request planned
    on demand (the provider nanoplan uses without --spot), for the comparison."""
    sp = plan.spot
    if sp is None:
        return []
    prov = sp.provider.removesuffix(" spot")
    od = f"on demand ${sp.on_demand_usd_per_gpu_hour:.2f}, " if sp.on_demand_usd_per_gpu_hour is not None else ""
    per = " per node" if plan.hardware.nodes > 1 else ""
    mine = sp.mtbi_source == MTBI_FROM_CLI
    mtbi = f"MTBI {sp.mtbi_hours:g} h{per}" + (" (--mtbi)" if mine else " assumed (--mtbi)" if
                                         sp.mtbi_source.startswith("assumption") else "")
    lines = [f"Spot {prov} ${sp.usd_per_gpu_hour:.2f}/GPU-h ({od}{sp.price_date}), {mtbi}"]
    bw = f"{sp.storage_bytes_per_s / 1e9:g} GB/s" + (" assumed" if sp.storage_source.startswith("assumption") else "")
    why = (f"√(2·C·M), C {secs(sp.write_seconds)} ({fmt_bytes(plan.schedule.checkpoint_bytes)} at {bw}), "
           f"M {sp.mtbi_hours / plan.hardware.nodes:g} h")   # the run's: any node's interruption stops it
    if sp.cadence == "request":
        head = f"Checkpoint every {minutes(sp.checkpoint_every_minutes)} (yours; the optimum "
        why = f"{minutes(sp.optimum_minutes)} = {why})"
    else:
        head = f"Checkpoint every {minutes(sp.checkpoint_every_minutes)} = "
    lines.append(head + why)
    lines.append(f"  restart {secs(sp.restart_seconds)}; {sp.expected_interruptions:.1f} interruptions expected, "
                 f"{minutes(sp.expected_lost_minutes)} of work lost each")
    cap = (f"; P(finish) {sp.finish_probability:.0%}" if sp.cap_hours is not None else "")
    lines.append(f"on spot:   {usd(sp.expected_usd)} expected, {usd(sp.p90_usd)} at P{sp.quantile * 100:.0f}, "
                 f"{hrs(sp.expected_hours)} (P{sp.quantile * 100:.0f} {hrs(sp.p90_hours)}){cap}")
    parts = []
    if sp.on_demand_usd is not None:
        parts.append(f"{prov} {usd(sp.on_demand_usd)}, {hrs(sp.on_demand_hours)}, same "
                     f"{fmt_count(plan.schedule.total_tokens)} tokens")
    w = without_spot
    if w is not None and w.hardware.usd_per_gpu_hour > 0 and w.hardware.provider != prov:
        parts.append(f"{w.hardware.provider} {usd(w.budget.usd)}, {hrs(w.budget.hours)}, "
                     f"{fmt_count(w.schedule.total_tokens)}")
    if parts:
        lines.append("on demand: " + "; ".join(parts))
    return [piece for line in lines for piece in fold(line)]


def restated(plan: Plan) -> list[str]:
    """The plan's warnings that spot_lines already says (the assumed MTBI): printed once, in the spot lines."""
    sp = plan.spot
    if sp is None or not sp.mtbi_source.startswith("assumption"):
        return []
    return [w for w in plan.warnings if w.startswith("spot: the mean time between interruptions")]


def fold(line: str, width: int = 80) -> list[str]:
    """A line longer than `width` split after its last '; ' or ', ' that fits, the rest indented."""
    out = []
    while len(line) > width:
        cut = max(line.rfind("; ", 0, width), line.rfind(", ", 0, width))
        if cut <= 0:
            break
        out.append(line[:cut + 1])
        line = "  " + line[cut + 2:]
    return out + [line]
