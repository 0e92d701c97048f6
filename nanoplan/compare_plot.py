"""`compare --plot chart.png`: cost against time to the reference job, one point per configuration, with
the Pareto front. The numbers come from the planner (planner/compare.py); this module only draws them.
matplotlib is imported when a chart is drawn, never at start-up."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nanoplan.png import pyplot, save_png
from planner.compare import Comparison, pareto, prices_used, ref_label
from planner.errors import PlanError


def plot(cmp: Comparison, path: str | Path) -> Path:
    """Draw the chart and write it to `path` (PNG, temp file then rename), with its data's fingerprint."""
    return save_png(figure(cmp), path, data=chart_data(cmp))


def chart_data(cmp: Comparison) -> dict[str, Any]:
    """What the chart draws: the title's job and prices, each point, its marks and whether its speed is proven."""
    return {"ref": ref_label(cmp), "prices": prices_used(cmp), "objective": cmp.objective,
            "points": [{"gpu": r.gpu, "hours": round(float(r.ref_hours), 6), "usd": round(float(r.ref_usd or 0), 4),
                        "marks": ("★" if r.is_best else "") + ("$" if r.is_cheapest else "") + ("»" if r.is_fastest else ""),
                        "unproven": r.unproven, "would_take": r.would_take}
                       for r in cmp.rows if r.ref_hours is not None]}


def _place_labels(ax: Any, fig: Any, pts: list[tuple[float, float]], labels: list[str]) -> None:
    """Put each label next to its point where it overlaps no other label, point or the frame (greedy)."""
    renderer = fig.canvas.get_renderer()
    frame = ax.get_window_extent(renderer)
    marks = [ax.transData.transform(p) for p in pts]
    legend = ax.get_legend()
    placed: list[Any] = [legend.get_window_extent(renderer)] if legend is not None else []
    offsets = [(dx * k, dy * k) for k in (1, 1.8, 2.8, 4) for dx, dy in
               ((7, 7), (7, -7), (-7, 7), (-7, -7), (9, 0), (-9, 0), (0, 10), (0, -10))]
    for (x, y), text in sorted(zip(pts, labels, strict=True), key=lambda t: -t[0][1]):
        best = None
        for dx, dy in offsets:
            ha = "left" if dx > 0 else "right" if dx < 0 else "center"
            va = "bottom" if dy > 0 else "top" if dy < 0 else "center"
            ann = ax.annotate(text, (x, y), textcoords="offset points", xytext=(dx, dy), fontsize=8, ha=ha, va=va)
            box = ann.get_window_extent(renderer).expanded(1.04, 1.12)
            inside = (box.x0 >= frame.x0 and box.x1 <= frame.x1 and box.y0 >= frame.y0 and box.y1 <= frame.y1)
            hits = sum(box.overlaps(o) for o in placed) + sum(
                box.x0 - 6 <= mx <= box.x1 + 6 and box.y0 - 6 <= my <= box.y1 + 6 for mx, my in marks)
            score = hits * 10 + (0 if inside else 5)
            if best is None or score < best[0]:
                if best is not None:
                    best[1].remove()
                best = (score, ann, box)
            else:
                ann.remove()
            if score == 0:
                break
        placed.append(best[2])  # type: ignore[index]


def _marks(marks: str) -> str:
    """'★$»' -> 'best, cheapest, fastest'."""
    return ", ".join({"★": "best", "$": "cheapest", "»": "fastest"}[m] for m in marks)


def figure(cmp: Comparison) -> Any:
    """The chart as a matplotlib Figure (labels placed); the caller saves and closes it."""
    plt = pyplot()      # the one-line error when matplotlib is missing
    rows = [r for r in cmp.rows if r.ref_hours is not None]
    if not rows:
        raise PlanError("--plot", "no configuration can train the reference job, so there is nothing to plot")
    pts = [(float(r.ref_hours), float(r.ref_usd)) for r in rows]  # type: ignore[arg-type]
    proven = [i for i, r in enumerate(rows) if not r.unproven] or list(range(len(rows)))
    front = [proven[i] for i in pareto([pts[i] for i in proven])]   # unproven speeds are not on the front
    unproven = [i for i in range(len(rows)) if i not in proven]
    fig, ax = plt.subplots(figsize=(8.4, 5.4), dpi=120)
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator  # noqa: PLC0415

    ax.set_xscale("log")
    xs = [x for x, _ in pts]
    lo, hi_x = min(xs) / 1.5, max(xs) * 2.2
    nice = [m * 10**e for e in range(-3, 7) for m in (1, 2, 5)]
    ax.set_xlim(lo, hi_x)
    ax.xaxis.set_major_locator(FixedLocator([v for v in nice if lo <= v <= hi_x]))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"${v:,.0f}"))
    hi = max(y for _, y in pts)
    ax.set_ylim(0, hi * 1.3 if hi > 0 else 1)
    if len(front) >= 2:
        fx = sorted(front, key=lambda i: pts[i][0])
        ax.step([pts[i][0] for i in fx], [pts[i][1] for i in fx], where="post", color="tab:blue", alpha=0.6,
                zorder=2, label="Pareto front: no configuration is both faster and cheaper")
    others = [i for i in proven if not rows[i].is_best]
    on_front = [i for i in others if i in front and len(front) >= 2]
    off = [i for i in others if i not in on_front]
    if unproven:
        ax.scatter([pts[i][0] for i in unproven], [pts[i][1] for i in unproven], s=60, facecolors="none",
                   edgecolors="tab:red", linewidths=1.5, zorder=3,
                   label="speed unproven (*): off its public runs, so not marked")
    if on_front:
        ax.scatter([pts[i][0] for i in on_front], [pts[i][1] for i in on_front], s=60, color="tab:blue", zorder=3,
                   label="on the Pareto front")
    if off:
        ax.scatter([pts[i][0] for i in off], [pts[i][1] for i in off], s=60, color="tab:gray", zorder=3,
                   label="other configurations")
    star = [i for i in range(len(rows)) if rows[i].is_best]
    ax.scatter([pts[i][0] for i in star], [pts[i][1] for i in star], s=170, marker="*", color="tab:green", zorder=4,
               label=f"best by '{cmp.objective}'" + (" (the only Pareto point: faster and cheaper than all)"
                                                     if len(front) == 1 and front[0] in star else ""))
    labels = []
    for r in rows:
        tags = [t for t, f in (("best", r.is_best), ("cheapest", r.is_cheapest), ("fastest", r.is_fastest)) if f]
        if r.unproven:
            tags = [f"speed unproven{': would be ' + _marks(r.would_take) if r.would_take else ''}"]
        labels.append(r.gpu + (" *" if r.unproven else "") + (f" ({', '.join(tags)})" if tags else ""))
    ax.set_xlabel("hours to train the reference job (log scale)")
    ax.set_ylabel("cost of the reference job")
    ax.set_title(f"Cost vs time to train {ref_label(cmp)}, {prices_used(cmp)}\n(each configuration with its "
                 f"fastest fitting settings)", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    _place_labels(ax, fig, pts, labels)
    return fig
