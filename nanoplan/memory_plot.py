"""`estimate --plot memory.png`: per-GPU memory over one training step, as stacked bars by phase.

The numbers come from the planner (planner/step_phases.py, `StepMemory.as_dict()`); this module only
draws them and imports no planner module. matplotlib is imported when a chart is drawn (nanoplan/png.py),
never at start-up (`estimate` without --plot does not pay for it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

GiB = 2**30
MiB = 2**20

# part -> (legend label, colour); bottom to top
PARTS: tuple[tuple[str, str, str], ...] = (
    ("parameters", "parameters", "#4c72b0"),
    ("buffers", "buffers", "#8172b3"),
    ("gradients", "gradients", "#55a868"),
    ("optimizer_state", "optimizer state", "#937860"),
    ("activations", "activations (saved for backward)", "#dd8452"),
    ("loss_temporaries", "loss temporaries (logits, softmax)", "#c44e52"),
    ("temporaries", "other temporaries", "#da8bc3"),
)
OVERHEAD = ("reserved: CUDA context, NCCL, fragmentation", "#bbbbbb")


def figure(data: dict[str, Any]) -> Any:
    """The chart as a matplotlib Figure; the caller saves and closes it."""
    from nanoplan.png import pyplot  # noqa: PLC0415

    plt = pyplot()      # the one-line error when matplotlib is missing
    import textwrap  # noqa: PLC0415

    phases = data["phases"]
    xs = list(range(len(phases)))
    over_b = sum(data["overhead"].values())
    totals_b = [sum(p["parts"].values()) + over_b for p in phases]
    unit, div = ("GiB", GiB) if max(totals_b) >= GiB else ("MiB", MiB)
    totals = [t / div for t in totals_b]
    over = over_b / div
    usable, limit = data["usable_bytes"] / div, data["limit_bytes"] / div
    peak_total = max(totals)
    # capacity far above the step (a tiny model, a CPU's RAM): the bars keep the height, the capacity a note
    lines_shown = usable <= 3 * peak_total
    top = (max(peak_total, usable) if lines_shown else peak_total) * 1.08
    fig, ax = plt.subplots(figsize=(9.6, 5.6), dpi=120)
    bottom = [0.0] * len(phases)
    at_peak = max(xs, key=lambda i: totals[i])
    for key, name, colour in PARTS:
        heights = [p["parts"].get(key, 0) / div for p in phases]
        if max(heights) < 0.0005 * peak_total:          # nothing to see (buffers, mostly)
            continue
        # the legend gives each part's size at the peak: a thin part is still read off the chart
        ax.bar(xs, heights, 0.62, bottom=bottom, color=colour, zorder=2, label=f"{name}: {heights[at_peak]:,.2f}")
        for x, b, h in zip(xs, bottom, heights, strict=True):
            if h >= 0.07 * top:        # room for its size inside the bar
                ax.text(x, b + h / 2, f"{h:,.1f}", ha="center", va="center", fontsize=9, color="white", zorder=4)
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    if over > 0:
        ax.bar(xs, [over] * len(phases), 0.62, bottom=bottom, color=OVERHEAD[1], label=f"{OVERHEAD[0]}: {over:,.2f}",
               zorder=2, hatch="//", edgecolor="white", linewidth=0)
    ax.set_ylim(0, top)
    # the capacity lines, labelled in the right margin (never over a bar): usable above its line, the fit
    # limit below its own
    if lines_shown:
        ax.axhline(usable, color="black", linewidth=1.2, zorder=3)
        ax.annotate(f"usable {usable:,.1f} {unit}", (1.0, usable), xycoords=("axes fraction", "data"),
                    xytext=(4, 1), textcoords="offset points", ha="left", va="bottom", fontsize=9,
                    annotation_clip=False)
        if limit < usable:
            ax.axhline(limit, color="black", linewidth=1, linestyle="--", zorder=3)
            ax.annotate(f"fit limit {limit:,.1f} {unit}\n(less the headroom)", (1.0, limit),
                        xycoords=("axes fraction", "data"), xytext=(4, -1), textcoords="offset points", ha="left",
                        va="top", fontsize=9, annotation_clip=False)
    else:
        ax.annotate(f"capacity off the chart:\nusable {usable:,.1f} {unit},\nfit limit {limit:,.1f} {unit}\n"
                    f"({usable / peak_total:,.0f}× the peak)", (1.0, 1.0), xycoords="axes fraction", xytext=(4, 0),
                    textcoords="offset points", ha="left", va="top", fontsize=9, annotation_clip=False)
    peak = data.get("peak_phase")
    ax.set_xticks(xs, [f"{p['label']}\n{t:,.1f} {unit}" + ("\n(peak)" if p["label"] == peak else "")
                       for p, t in zip(phases, totals, strict=True)])
    ax.set_xlim(-0.6, len(phases) - 0.4)
    ax.set_ylabel(f"{unit} per GPU")
    ax.set_xlabel("phase of one training step (each bar: that phase's peak)")
    ax.grid(axis="y", color="#e5e5e5", zorder=0)
    ax.set_axisbelow(True)
    title = textwrap.fill(data["title"], 100) + "".join(f"\n{n}" for n in data.get("notes", []))
    ax.set_title(title, fontsize=10, loc="left")
    ax.legend(loc="lower left", bbox_to_anchor=(1.01, 0.0), fontsize=9, frameon=False, borderaxespad=0,
              title=f"{unit} at the peak ({phases[at_peak]['label']})", title_fontsize=9, alignment="left")
    fig.tight_layout()
    return fig


def draw(data: dict[str, Any], path: str | Path) -> Path:
    """Write the chart to `path` (PNG, written to a temp file and renamed)."""
    from nanoplan.png import save_png  # noqa: PLC0415

    return save_png(figure(data), path, data=data)
