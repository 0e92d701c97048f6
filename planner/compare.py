"""`nanoplan compare`: the best run on each GPU configuration, side by side.

Each configuration gets its own search (planner.selection.search) at the same budget or hours. The
best row by the objective sets a reference job (its model and total tokens); every row is
then also timed and priced on that job with its fastest fitting settings, which gives the
"cheapest" and "fastest to a fixed token count" highlights and the cost-vs-time chart.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from planner.candidates import Candidate, Length, Settings
from planner.errors import PlanError
from planner.profiles import Hardware, parse_gpu_spec, speed_off, speed_off_words
from planner.ranking import VALUE_TOL, launch_fixed_s, objective_key
from planner.selection import search
from planner.spec import ModelSpec
from planner.startup import paid_seconds
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
    unproven: bool = False        # its GPU's speed is off by more than SPEED_CHECK_TOL against public runs
    would_take: str = ""          # the marks (★$») it would take on its unproven speed, not given to it


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


def _hardware(gpu: str, provider: str | None, prices: dict[str, tuple[float, str]] | None = None
              ) -> tuple[Hardware, str]:
    """Parse a GPU spec with its price: yours (--price), the provider's, or the profile's default."""
    hw = parse_gpu_spec(gpu, option="--gpus", profile_hint=False)
    if prices:
        mine = prices.get(hw.profile.name.lower()) or prices.get("*")
        if mine is not None:
            return parse_gpu_spec(gpu, provider=provider, price=mine[0], price_per=mine[1], option="--gpus",
                                  profile_hint=False), ""
    if provider is None:
        return hw, ""
    if any(p.provider.lower() == provider.lower() for p in hw.profile.prices):
        return parse_gpu_spec(gpu, provider=provider, option="--gpus", profile_hint=False), ""
    return hw, f"no {provider} price; {hw.provider}'s used"


def parse_prices(text: str | None) -> dict[str, tuple[float, str]] | None:
    """--price for compare: '2.5' (every configuration) or 'H100=2.49,B200=5.99' (per GPU type; '/h/node' allowed)."""
    if text is None:
        return None
    from planner.profiles import find_profile  # noqa: PLC0415
    from planner.units import parse_price  # noqa: PLC0415

    out: dict[str, tuple[float, str]] = {}
    for part in (x.strip() for x in text.split(",") if x.strip()):
        name, eq, value = part.rpartition("=")
        if not eq:
            out["*"] = parse_price(part, "--price")
            continue
        prof = find_profile(name.strip(), "--price", profile_hint=False)
        out[prof.name.lower()] = parse_price(value, "--price")
    if not out:
        raise PlanError("--price", f"cannot read {text!r}", "use e.g. --price 2.5 or --price H100=2.49,B200=5.99")
    return out


def compare(gpus: Sequence[str], models: Sequence[ModelSpec], length: Length, settings: Settings = Settings(), *,
            objective: str = "loss", provider: str | None = None,
            prices: dict[str, tuple[float, str]] | None = None) -> Comparison:
    """Search each configuration; mark the best, the cheapest and the fastest to the reference job."""
    import time  # noqa: PLC0415

    t0 = time.perf_counter()
    if not gpus:
        raise PlanError("--gpus", "no GPU configurations given", f"e.g. --gpus {','.join(DEFAULT_GPUS[:3])}")
    parsed = [(g, *_hardware(g, provider, prices)) for g in gpus]   # bad specs fail here, before any search
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
        off = speed_off(hw.profile)
        if off is not None:     # planner.build warns in the plan; the table says it too
            note = "; ".join(x for x in (note, f"tokens/s {speed_off_words(off)}") if x)
        if res.best is None:
            rows.append(Row(gpu=hw.spec, hw=hw, best=None, note="nothing fits" + (f"; {note}" if note else "")))
        else:
            rows.append(Row(gpu=hw.spec, hw=hw, best=res.best, note=note, unproven=off is not None))
    found = [r for r in rows if r.best is not None]
    ref_model = ref_tokens = None
    if found:
        # an unproven row never takes a mark while a proven one can: its numbers rest on a speed the public
        # runs contradict (it keeps its row and '*', and the caption names the marks it would have taken)
        top = _top(_proven(found), objective)
        if (alt := _top(found, objective)) is not top:
            alt.would_take += "★"
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
            if fast.best is not None:   # the same launch as every plan: start-up and compile, then the steps
                steps = math.ceil(ref_tokens / settings.total_batch_tokens)
                r.ref_hours = paid_seconds(steps, fast.best.step_seconds, launch_fixed_s(fast)) / 3600
                r.ref_usd = r.ref_hours * r.hw.num_gpus * r.hw.usd_per_gpu_hour
        timed = [r for r in rows if r.ref_hours is not None]
        if timed:
            for mark, key in (("$", lambda r: (r.ref_usd, r.ref_hours)), ("»", lambda r: (r.ref_hours, r.ref_usd))):
                pick = min(_proven(timed), key=key)
                if (alt := min(timed, key=key)) is not pick:
                    alt.would_take += mark
                setattr(pick, "is_cheapest" if mark == "$" else "is_fastest", True)
    return Comparison(rows=rows, objective=objective, length=length, settings=settings, ref_model=ref_model,
                      ref_tokens=ref_tokens, evaluated=evaluated, seconds=time.perf_counter() - t0)


def _proven(rows: list[Row]) -> list[Row]:
    """The rows whose speed the public runs back, or all of them when none is."""
    return [r for r in rows if not r.unproven] or rows


def _top(rows: list[Row], objective: str) -> Row:
    """The best row by the objective (value: the cheapest within VALUE_TOL of the lowest loss)."""
    if objective == "value":
        floor = min(r.best.loss for r in rows)  # type: ignore[union-attr]
        return min((r for r in rows if r.best.loss <= floor * (1 + VALUE_TOL)),  # type: ignore[union-attr]
                   key=lambda r: (r.best.usd, r.best.loss))  # type: ignore[union-attr]
    return min(rows, key=lambda r: objective_key(objective, r.best))  # type: ignore[arg-type]


def unproven_note(cmp: Comparison) -> str:
    """The caption's word on marks withheld: '8xB200 would take ★$» on its unproven speed'."""
    held = [f"{r.gpu} would take {r.would_take}" for r in cmp.rows if r.would_take]
    if not held:
        return ""
    return (f"Not marked: {'; '.join(held)} on a speed its public runs do not back (*); marks go to rows whose "
            "speed they do.")


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
            **_band_fields(cmp, r),
            "ref_hours": round(r.ref_hours, 4) if r.ref_hours is not None else None,
            "ref_usd": round(r.ref_usd, 2) if r.ref_usd is not None else None,
            "best": r.is_best,
            "cheapest": r.is_cheapest,
            "fastest": r.is_fastest,
            "speed_unproven": r.unproven,
            "would_take": r.would_take,
            "note": r.note,
        }
        out.append(d)
    return out


def _band(cmp: Comparison, r: Row) -> Any:
    """The row's P10–P90 band (planner/uncertainty.py), or None."""
    from planner.uncertainty import hardware_band  # noqa: PLC0415

    if r.hw is None or r.best is None:
        return None
    compiled = r.hw.profile.kind == "gpu" if cmp.settings.compile is None else cmp.settings.compile
    return hardware_band(r.hw, trainer=None, compiled=compiled, mfu=cmp.settings.mfu)


def _band_fields(cmp: Comparison, r: Row) -> dict[str, Any]:
    """P10/P90 of the row's tokens/s and of its tokens, hours and dollars (those its length rule leaves open)."""
    from planner.uncertainty import band_bounds  # noqa: PLC0415

    b, c = _band(cmp, r), r.best
    steps = cmp.length.steps is not None
    out: dict[str, Any] = {"band_runs": b.runs if b else 0, "band_basis": b.basis if b else None}
    for name, value, inv, fixed in (("tokens_per_sec", c.tokens_per_sec if c else None, False, False),
                                    ("tokens", c.tokens if c else None, False, steps),
                                    ("hours", c.hours if c else None, True, not steps),
                                    ("usd", c.usd if c else None, True, not steps)):
        lo_hi = None if fixed else band_bounds(b, value, inv)
        out[f"{name}_p10"], out[f"{name}_p90"] = (round(lo_hi[0], 4), round(lo_hi[1], 4)) if lo_hi else (None, None)
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


def ref_label(cmp: Comparison) -> str:
    if cmp.ref_model is None or cmp.ref_tokens is None:
        return "reference job"
    return f"{cmp.ref_model.name} on {fmt_count(cmp.ref_tokens)} tokens"


def prices_used(cmp: Comparison) -> str:
    """Whose prices the rows use: 'modal prices (2026-01)', or the mix, most common first."""
    seen: dict[tuple[str, str], list[str]] = {}
    for r in cmp.rows:
        if r.hw is not None:
            seen.setdefault((r.hw.provider, r.hw.price_date), []).append(r.hw.profile.name)
    if not seen:
        return "no prices"
    order = sorted(seen.items(), key=lambda kv: -len(kv[1]))
    (prov, date), _ = order[0]
    head = f"{prov} prices" + (f" ({date})" if date not in ("user", "") else " (yours)")
    rest = [f"{p} for {', '.join(dict.fromkeys(names))}" for (p, _), names in order[1:]]
    return head + (f"; {'; '.join(rest)}" if rest else "")


def caption(cmp: Comparison) -> str:
    length = (f"${cmp.length.budget_usd:,.0f} budget" if cmp.length.budget_usd is not None else
              f"{cmp.length.hours:g} h" if cmp.length.hours is not None else f"{cmp.length.steps:,} steps")
    varying = "hours and cost" if cmp.length.steps is not None else "tokens"
    return (f"★ best by '{cmp.objective}' at {length}, {prices_used(cmp)}. $ cheapest and » fastest to train "
            f"{ref_label(cmp)} (ref $, ref h), each with its fastest settings. P10–P90: of {varying}, from the "
            f"model's held-out errors on similar public runs ('-': none comparable). {cmp.evaluated:,} candidates in "
            f"{cmp.seconds * 1000:.0f} ms." + notes(cmp))


def notes(cmp: Comparison) -> str:
    """The footnotes of rows marked '*' (a speed the public runs do not back, a price not the provider's),
    and the marks withheld from them."""
    rows = [f"{r.gpu}: {r.note}" for r in cmp.rows if r.best is not None and r.note]
    out = (" * " + "; ".join(rows) + ".") if rows else ""
    return out + (f" {held}" if (held := unproven_note(cmp)) else "")


# Display columns: (name, priority for fit_table, left-justified). Priority 0 always shows.
COLUMNS = (("", 0, True), ("GPUs", 0, True), ("model", 0, True), ("tokens", 0, False), ("hours", 0, False),
           ("cost", 0, False), ("loss", 0, False), ("P10–P90", 1, False), ("price", 1, True), ("ref h", 2, False),
           ("ref $", 2, False),
           ("tokens/s", 3, False), ("epochs", 3, False), ("strategy", 4, True), ("micro×acc", 5, False),
           ("VRAM/GPU", 5, False), ("GPU spec", 6, True))


def _usd(x: float) -> str:
    return f"${x:,.0f}" if x >= 10 else f"${x:,.2f}"


def display_rows(cmp: Comparison) -> list[dict[str, str]]:
    out = []
    ds = cmp.settings.dataset_tokens
    for r in cmp.rows:
        hw, c = r.hw, r.best
        mark = ("★" if r.is_best else "") + ("$" if r.is_cheapest else "") + ("»" if r.is_fastest else "")
        d = dict.fromkeys((name for name, _, _ in COLUMNS), "-")
        d[""] = mark
        d["GPUs"] = r.gpu + (" *" if c is not None and r.note else "")
        if hw is not None:
            d["GPU spec"] = f"{hw.profile.memory_gb:g} GB, {hw.profile.bf16_tflops:g} TF"
            d["price"] = f"${hw.num_gpus * hw.usd_per_gpu_hour:,.2f}/h {hw.provider}"
        if c is None:
            d["model"] = r.note or "nothing fits"
        else:
            cap = hw.profile.usable_bytes * (1 - cmp.settings.headroom) / GiB  # type: ignore[union-attr]
            d.update({
                "model": f"{c.name} ({fmt_count(c.n_params)})", "micro×acc": f"{c.device_batch}×{c.grad_accum}",
                "strategy": c.settings_label, "VRAM/GPU": f"{c.mem_bytes / GiB:.1f}/{cap:.1f} GiB",
                "tokens/s": f"{c.tokens_per_sec:,.0f}", "hours": f"{c.hours:.1f}", "tokens": fmt_count(c.tokens),
                "epochs": f"{c.epochs:.1f}" if ds and c.epochs is not None else "-", "loss": f"{c.loss:.3f}",
                "cost": _usd(c.usd),
            })
        if c is not None:
            from planner.uncertainty import relative_span  # noqa: PLC0415

            d["P10–P90"] = relative_span(_band(cmp, r), cmp.length.steps is not None)
        d["ref h"] = f"{r.ref_hours:.1f}" if r.ref_hours is not None else "-"
        d["ref $"] = _usd(r.ref_usd) if r.ref_usd is not None else "-"
        if not ds:
            del d["epochs"]
        out.append(d)
    return out


def display_frame(cmp: Comparison) -> Any:
    import pandas as pd  # noqa: PLC0415

    return pd.DataFrame.from_records(display_rows(cmp))


def rich_table(cmp: Comparison, width: int | None = None) -> Any:
    """The comparison as a table whose columns fit `width` (all of them when None: --wide)."""
    from planner.tables import Col, fit_table  # noqa: PLC0415

    rows = display_rows(cmp)
    names = list(rows[0])
    cols = [Col(n, p, "left" if left else "right") for n, p, left in COLUMNS if n in names]
    cells = []
    for r, d in zip(cmp.rows, rows, strict=True):
        row = [d[c.name] for c in cols]
        if r.is_cheapest and "ref $" in names:
            row[[c.name for c in cols].index("ref $")] = f"[bold cyan]{d['ref $']}[/]"
        if r.is_fastest and "ref h" in names:
            row[[c.name for c in cols].index("ref h")] = f"[bold magenta]{d['ref h']}[/]"
        cells.append(row)
    styles = ["bold green" if r.is_best else ("dim" if r.best is None else None) for r in cmp.rows]
    t = fit_table(cols, cells, width, title=f"Best run per GPU configuration (objective: {cmp.objective})",
                  styles=styles, caption=caption(cmp))
    from planner.tables import hidden_note  # noqa: PLC0415

    if note := hidden_note(cols, t):
        t.caption = f"{t.caption} {note}"
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
