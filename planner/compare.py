"""`nanoplan compare`: the best run on each GPU configuration, side by side.

Each configuration gets its own search (planner.search) at the same budget or hours. The
best row by the objective sets a reference job (its model and total tokens); every row is
then also timed and priced on that job with its fastest fitting settings, which gives the
"cheapest" and "fastest to a fixed token count" highlights and the cost-vs-time chart.
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from planner.errors import PlanError
from planner.profiles import Hardware, parse_gpu_spec
from planner.search import Candidate, Length, Settings, objective_key, search
from planner.spec import ModelSpec
from planner.units import GiB, fmt_count

DEFAULT_GPUS = ("8xB200", "8xH200", "8xH100", "8xA100", "4xH100", "4xA100", "H100", "2x8xH100")
FORMATS = ("table", "csv", "markdown", "json")


@dataclass
class Row:
    """One GPU configuration: its best candidate (or why there is none) and the reference job."""

    gpu: str
    hw: Hardware | None
    best: Candidate | None
    note: str = ""
    ref_hours: float | None = None
    ref_usd: float | None = None
    is_best: bool = False
    is_cheapest: bool = False
    is_fastest: bool = False


@dataclass
class Comparison:
    rows: list[Row]
    objective: str
    length: Length
    settings: Settings
    ref_model: ModelSpec | None
    ref_tokens: int | None
    evaluated: int
    seconds: float


def _hardware(gpu: str, provider: str | None) -> tuple[Hardware, str]:
    """Parse a GPU spec; fall back to the profile's default price where `provider` has none."""
    hw = parse_gpu_spec(gpu)
    if provider is None:
        return hw, ""
    if any(p.provider.lower() == provider.lower() for p in hw.profile.prices):
        return parse_gpu_spec(gpu, provider=provider), ""
    return hw, f"no {provider} price; {hw.provider}'s used"


def compare(gpus: Sequence[str], models: Sequence[ModelSpec], length: Length, settings: Settings = Settings(), *,
            objective: str = "loss", provider: str | None = None) -> Comparison:
    """Search each configuration; mark the best, the cheapest and the fastest to the reference job."""
    import time  # noqa: PLC0415

    t0 = time.perf_counter()
    if not gpus:
        raise PlanError("--gpus", "no GPU configurations given", f"e.g. --gpus {','.join(DEFAULT_GPUS[:3])}")
    parsed = [(g, *_hardware(g, provider)) for g in gpus]   # bad specs fail here, before any search
    if provider is not None and all(note for _, _, note in parsed):
        raise PlanError("--provider", f"none of {', '.join(gpus)} has a {provider!r} price",
                        "see nanoplan profiles for the providers of each GPU")
    rows: list[Row] = []
    evaluated = 0
    for _gpu, hw, note in parsed:
        try:
            res = search(models, hw, length, settings, objective=objective)
        except PlanError as e:
            rows.append(Row(gpu=hw.spec, hw=hw, best=None, note=f"{e.problem}"))
            continue
        evaluated += res.evaluated
        if res.best is None:
            rows.append(Row(gpu=hw.spec, hw=hw, best=None, note="nothing fits" + (f"; {note}" if note else "")))
        else:
            rows.append(Row(gpu=hw.spec, hw=hw, best=res.best, note=note))
    found = [r for r in rows if r.best is not None]
    ref_model = ref_tokens = None
    if found:
        top = min(found, key=lambda r: objective_key(objective, r.best))  # type: ignore[arg-type]
        top.is_best = True
        ref_model, ref_tokens = top.best.spec, top.best.tokens  # type: ignore[union-attr]
        for r in rows:
            if r.hw is None:
                continue
            try:
                fast = search([ref_model], r.hw, length, settings, objective="throughput")
            except PlanError:
                continue
            evaluated += fast.evaluated
            if fast.best is not None:
                r.ref_hours = ref_tokens / fast.best.tokens_per_sec / 3600
                r.ref_usd = r.ref_hours * r.hw.num_gpus * r.hw.usd_per_gpu_hour
        timed = [r for r in rows if r.ref_hours is not None]
        if timed:
            min(timed, key=lambda r: (r.ref_usd, r.ref_hours)).is_cheapest = True
            min(timed, key=lambda r: (r.ref_hours, r.ref_usd)).is_fastest = True
    return Comparison(rows=rows, objective=objective, length=length, settings=settings, ref_model=ref_model,
                      ref_tokens=ref_tokens, evaluated=evaluated, seconds=time.perf_counter() - t0)


# ---------------------------------------------------------------- data frame


def records(cmp: Comparison) -> list[dict[str, Any]]:
    """One flat dict per row, raw numbers (None where a row has no plan)."""
    out = []
    for r in cmp.rows:
        hw, c = r.hw, r.best
        d: dict[str, Any] = {
            "gpu": r.gpu,
            "gpu_type": hw.profile.name if hw else None,
            "num_gpus": hw.num_gpus if hw else None,
            "nodes": hw.nodes if hw else None,
            "gpu_memory_gb": hw.profile.memory_gb if hw else None,
            "bf16_tflops": hw.profile.bf16_tflops if hw else None,
            "provider": hw.provider if hw else None,
            "usd_per_gpu_hour": hw.usd_per_gpu_hour if hw else None,
            "usd_per_hour": hw.num_gpus * hw.usd_per_gpu_hour if hw else None,
            "model": c.name if c else None,
            "n_params": c.n_params if c else None,
            "device_batch": c.device_batch if c else None,
            "grad_accum": c.grad_accum if c else None,
            "strategy": c.strategy if c else None,
            "activation_checkpointing": c.activation_checkpointing if c else None,
            "vram_gib": round(c.mem_bytes / GiB, 3) if c else None,
            "capacity_gib": round(hw.profile.usable_bytes * (1 - cmp.settings.headroom) / GiB, 3) if hw else None,
            "tokens_per_sec": round(c.tokens_per_sec, 1) if c else None,
            "hours": round(c.hours, 4) if c else None,
            "tokens": c.tokens if c else None,
            "tokens_per_param": round(c.tokens_per_param, 3) if c else None,
            "epochs": round(c.epochs, 3) if c and c.epochs is not None else None,
            "loss": round(c.loss, 4) if c else None,
            "usd": round(c.usd, 2) if c else None,
            "ref_hours": round(r.ref_hours, 4) if r.ref_hours is not None else None,
            "ref_usd": round(r.ref_usd, 2) if r.ref_usd is not None else None,
            "best": r.is_best,
            "cheapest": r.is_cheapest,
            "fastest": r.is_fastest,
            "note": r.note,
        }
        out.append(d)
    return out


def frame(cmp: Comparison) -> Any:
    """The comparison as a pandas DataFrame (one row per configuration)."""
    import pandas as pd  # noqa: PLC0415

    return pd.DataFrame.from_records(records(cmp))


def to_csv(cmp: Comparison) -> str:
    return frame(cmp).to_csv(index=False)


def to_json(cmp: Comparison) -> str:
    return frame(cmp).to_json(orient="records", indent=2)


def to_markdown(cmp: Comparison) -> str:
    """A GitHub pipe table of the display columns (pandas formats; no tabulate needed)."""
    df = display_frame(cmp)
    cols = list(df.columns)
    left = {"", "GPUs", "GPU spec", "price", "model", "strategy"}
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" if c in left else "---:" for c in cols) + "|"]
    for _, row in df.iterrows():
        lines.append("| " + " | ".join(str(row[c]).replace("|", "\\|") for c in cols) + " |")
    return "\n".join(lines) + "\n" + caption(cmp) + "\n"


# ---------------------------------------------------------------- display


def _ref_label(cmp: Comparison) -> str:
    if cmp.ref_model is None or cmp.ref_tokens is None:
        return "reference job"
    return f"{cmp.ref_model.name} on {fmt_count(cmp.ref_tokens)} tokens"


def caption(cmp: Comparison) -> str:
    length = (f"${cmp.length.budget_usd:,.0f} budget" if cmp.length.budget_usd is not None else
              f"{cmp.length.hours:g} h" if cmp.length.hours is not None else f"{cmp.length.steps:,} steps")
    return (f"★ best by objective '{cmp.objective}' at {length}; $ cheapest and » fastest to train the reference "
            f"job ({_ref_label(cmp)}) with each configuration's fastest settings. "
            f"{cmp.evaluated:,} candidates searched in {cmp.seconds * 1000:.0f} ms.")


def display_rows(cmp: Comparison) -> list[dict[str, str]]:
    out = []
    ds = cmp.settings.dataset_tokens
    for r in cmp.rows:
        hw, c = r.hw, r.best
        mark = ("★" if r.is_best else "") + ("$" if r.is_cheapest else "") + ("»" if r.is_fastest else "")
        d = {
            "": mark,
            "GPUs": r.gpu,
            "GPU spec": f"{hw.profile.memory_gb:g} GB, {hw.profile.bf16_tflops:g} TF" if hw else "-",
            "price": f"${hw.num_gpus * hw.usd_per_gpu_hour:,.2f}/h {hw.provider}" if hw else "-",
        }
        if c is None:
            d.update({k: "-" for k in ("model", "micro×acc", "strategy", "VRAM/GPU", "tokens/s", "hours", "tokens",
                                       "epochs", "loss", "cost")})
            d["model"] = r.note or "nothing fits"
        else:
            cap = hw.profile.usable_bytes * (1 - cmp.settings.headroom) / GiB  # type: ignore[union-attr]
            d.update({
                "model": f"{c.name} ({fmt_count(c.n_params)})",
                "micro×acc": f"{c.device_batch}×{c.grad_accum}",
                "strategy": c.settings_label,
                "VRAM/GPU": f"{c.mem_bytes / GiB:.1f}/{cap:.1f} GiB",
                "tokens/s": f"{c.tokens_per_sec:,.0f}",
                "hours": f"{c.hours:.1f}",
                "tokens": fmt_count(c.tokens),
                "epochs": f"{c.epochs:.1f}" if ds and c.epochs is not None else "-",
                "loss": f"{c.loss:.3f}",
                "cost": f"${c.usd:,.0f}",
            })
        d["ref h"] = f"{r.ref_hours:.1f}" if r.ref_hours is not None else "-"
        d["ref $"] = f"${r.ref_usd:,.0f}" if r.ref_usd is not None else "-"
        if c is not None and r.note:
            d["GPUs"] += " *"
        out.append(d)
    return out


def display_frame(cmp: Comparison) -> Any:
    import pandas as pd  # noqa: PLC0415

    return pd.DataFrame.from_records(display_rows(cmp))


def rich_table(cmp: Comparison) -> Any:
    from rich.table import Table  # noqa: PLC0415

    rows = display_rows(cmp)
    t = Table(title=f"Best run per GPU configuration (objective: {cmp.objective})", title_justify="left",
              caption=caption(cmp), caption_justify="left")
    for col in rows[0]:
        t.add_column(col, justify="left" if col in ("", "GPUs", "GPU spec", "price", "model", "strategy") else "right",
                     no_wrap=col in ("GPUs", "model"))
    for r, d in zip(cmp.rows, rows, strict=True):
        cells = list(d.values())
        keys = list(d)
        if r.is_cheapest:
            cells[keys.index("ref $")] = f"[bold cyan]{d['ref $']}[/]"
        if r.is_fastest:
            cells[keys.index("ref h")] = f"[bold magenta]{d['ref h']}[/]"
        style = "bold green" if r.is_best else ("dim" if r.best is None else None)
        t.add_row(*cells, style=style)
    notes = [f"{r.gpu}: {r.note}" for r in cmp.rows if r.best is not None and r.note]
    if notes:
        t.caption = t.caption + " * " + "; ".join(notes)  # type: ignore[operator]
    return t


# ---------------------------------------------------------------- chart


def pareto(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats on both time and cost (sorted by time)."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], points[i][1]))
    front, best_cost = [], math.inf
    for i in order:
        if points[i][1] < best_cost:
            front.append(i)
            best_cost = points[i][1]
    return front


def plot(cmp: Comparison, path: str | Path) -> Path:
    """Cost against time to the reference job, labelled, with the Pareto front; PNG via matplotlib."""
    try:
        import matplotlib  # noqa: PLC0415

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        raise PlanError("--plot", "matplotlib is not installed",
                        "pip install 'nanoplan[plot]' (or pip install matplotlib), or drop --plot") from None
    rows = [r for r in cmp.rows if r.ref_hours is not None]
    if not rows:
        raise PlanError("--plot", "no configuration can train the reference job, so there is nothing to plot")
    pts = [(r.ref_hours, r.ref_usd) for r in rows]
    front = set(pareto(pts))  # type: ignore[arg-type]
    fig, ax = plt.subplots(figsize=(8, 5.2), dpi=120)
    by_x = sorted(range(len(rows)), key=lambda i: pts[i][0])
    for k, i in enumerate(by_x):
        r, (x, y) = rows[i], pts[i]
        ax.scatter([x], [y], s=150 if r.is_best else 60, marker="*" if r.is_best else "o",
                   color="tab:green" if r.is_best else ("tab:blue" if i in front else "tab:gray"), zorder=3)
        tags = [t for t, f in (("best", r.is_best), ("cheapest", r.is_cheapest), ("fastest", r.is_fastest)) if f]
        label = r.gpu + (f"\n({', '.join(tags)})" if tags else "")
        ax.annotate(label, (x, y), textcoords="offset points", xytext=(6, 6 if k % 2 == 0 else -16), fontsize=8,
                    va="bottom" if k % 2 == 0 else "top")
    fx = sorted(front, key=lambda i: pts[i][0])
    ax.step([pts[i][0] for i in fx], [pts[i][1] for i in fx], where="post", color="tab:blue", alpha=0.5,
            label="Pareto front (no config is both faster and cheaper)")
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator  # noqa: PLC0415

    ax.set_xscale("log")
    xs = [x for x, _ in pts]
    lo, hi_x = min(xs) / 1.3, max(xs) * 1.6
    nice = [m * 10**e for e in range(-2, 6) for m in (1, 2, 5)]
    ax.set_xlim(lo, hi_x)
    ax.xaxis.set_major_locator(FixedLocator([v for v in nice if lo <= v <= hi_x]))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"${v:,.0f}"))
    hi = max(y for _, y in pts)
    ax.set_ylim(0, hi * 1.15 if hi > 0 else 1)
    ax.set_xlabel("hours to train the reference job (log scale)")
    ax.set_ylabel("cost of the reference job")
    ax.set_title(f"Cost vs time to train {_ref_label(cmp)}\n(each configuration with its fastest fitting settings; "
                 f"best by '{cmp.objective}' starred)", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    os.close(fd)
    try:
        fig.savefig(tmp, format="png")
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)   # mkstemp makes 0600; give the chart normal file permissions
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    finally:
        plt.close(fig)
    return p
