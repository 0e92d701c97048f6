"""Rich tables for a plan: model, memory against capacity, throughput, budget, schedule, warnings."""

from __future__ import annotations

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from planner.plan import BudgetPlan, Plan, ThroughputPlan
from planner.trainers import strategy_label
from planner.uncertainty import inner, odds_words, suffix
from planner.units import fmt_bytes, fmt_count, fmt_duration, plural


def _step_time(tp: ThroughputPlan) -> str:
    """The step's parts, which add up to it; communication that overlaps compute is named apart."""
    parts = [f"compute {tp.compute_seconds:.3f}", f"optimizer {tp.optimizer_seconds:.3f}",
             f"micro-steps {tp.micro_step_seconds:.3f}", f"exposed comm {tp.exposed_comm_seconds:.3f}"]
    hidden = tp.comm_seconds - tp.exposed_comm_seconds
    tail = f"; {hidden:.3f} s of comm hidden under compute" if hidden > 5e-4 else ""
    return f"{tp.step_seconds:.3f} s = {' + '.join(parts)} s{tail}"


def _kv(title: str | None, rows: list[tuple[str, str]]) -> Table:
    t = Table(title=title, title_justify="left", show_header=False, box=None, pad_edge=False)
    t.add_column(style="bold cyan", no_wrap=True)
    t.add_column()
    for k, v in rows:
        t.add_row(k, v)
    return t


def _hours(h: float) -> str:
    return f"{h:.2f} h" if h >= 1 else f"{h * 60:.1f} min" if h * 60 >= 0.1 else f"{h * 3600:.1f} s"


def per_param(plan: Plan) -> str:
    """'tokens/param', or the trainer's own count where it has one: 'tokens/scaling param (435M)'."""
    from planner.trainers import trainer_for  # noqa: PLC0415

    tr = trainer_for(plan.request.trainer)
    if tr is None:
        return "tokens/param"
    n, name = tr.ratio_params(plan.request.model, plan.request.trainer)
    return "tokens/param" if name == "param" else f"tokens/{name} ({fmt_count(n)})"


def _startup(b: BudgetPlan) -> str:
    """'; 3.0 min of it start-up': the launch's start-up and compile warm-up, counted in the hours."""
    return f"; {fmt_duration(b.startup_seconds)} of it start-up" if b.startup_seconds else ""


def plan_tables(plan: Plan) -> Group:
    hw, m, tr, mem, tp, b, s = plan.hardware, plan.model, plan.training, plan.memory, plan.throughput, plan.budget, plan.schedule
    spec = plan.request.model
    g = m.params_by_group
    model = _kv("Model", [
        ("name", f"{m.name} ({spec.style}: L={spec.n_layer}, d={spec.d_model}, heads={spec.n_head}/{spec.n_kv_head} kv, "
                 f"d_ff={spec.d_ff}, V={spec.vocab_size:,}, T={spec.seq_len})"),
        ("parameters", f"{m.n_params:,} ({fmt_count(m.n_params)})"),
        ("  by group", ", ".join(f"{k} {fmt_count(v)}" for k, v in g.items() if k != "total")),
        ("matmul params", f"{m.matmul_params:,}"),
        ("FLOPs/token", f"{m.flops_per_token:.3e} (6·N_matmul + 12·L·d·T)"),
    ])
    cap = mem.capacity_bytes
    memt = Table(title=f"Memory per GPU (peak at {mem.peak_phase.replace('_', ' ')})", title_justify="left")
    memt.add_column("part", style="cyan")
    memt.add_column("bytes", justify="right")
    memt.add_column("share", justify="right")
    for k, v in {**mem.breakdown, **mem.overhead}.items():
        memt.add_row(k.replace("_", " "), fmt_bytes(v), f"{v / max(mem.per_gpu_bytes, 1):.0%}")
    style = "bold green" if mem.fits else "bold red"
    memt.add_row(Text("total", style=style), Text(fmt_bytes(mem.per_gpu_bytes), style=style),
                 Text(f"{mem.per_gpu_bytes / cap:.0%} of {fmt_bytes(cap)}", style=style))
    thr = _kv("Throughput", [
        ("GPUs", f"{hw.spec} ({plural(hw.num_gpus, 'GPU')}, {plural(hw.nodes, 'node')})"),
        ("batch", f"device batch {tr.device_batch_size} × seq {tr.seq_len} × {plural(hw.num_gpus, 'GPU')} × "
                  f"grad accum {tr.grad_accum_steps} = {s.tokens_per_step:,} tokens/step"),
        ("settings", f"{tr.precision}, {tr.optimizer}, {strategy_label(plan.request.trainer, tr.strategy)}, "
                     "activation checkpointing "
                     f"{'on' if tr.activation_checkpointing else 'off'}, compile {'on' if tr.compile else 'off'}"),
        ("tokens/s", f"{tp.tokens_per_sec:,.0f} ({_band(plan, 'tokens_per_sec')}MFU {tp.effective_mfu:.0%} over the "
                     f"whole step, which the hours come from; {tp.mfu:.0%} in its compute)"),
        ("odds", odds_words(plan.uncertainty, b.limited_by, s.total_tokens)),
        ("step time", _step_time(tp)),
    ])
    epochs = f"{s.epochs:.2f} over {fmt_count(s.dataset_tokens or 0)} tokens" if s.epochs is not None else "n/a (no --dataset-tokens)"
    bud = _kv("Budget and schedule", [
        ("price", f"${hw.usd_per_gpu_hour:.2f}/GPU-h from {hw.provider} ({hw.price_date}); ${b.usd_per_hour:.2f}/h"),
        ("length", f"{_hours(b.hours)}{suffix(plan.uncertainty, 'hours')}, ${b.usd:,.2f}"
                   f"{suffix(plan.uncertainty, 'usd')} (set by {b.limited_by}"
                   + (f": stops at {plan.request.max_epochs:g} epochs" if b.limited_by == "epochs" else "") + ")"
                   + _startup(b)),
        ("steps", f"{s.total_steps:,}"),
        ("tokens", f"{s.total_tokens:,} ({fmt_count(s.total_tokens)}{suffix(plan.uncertainty, 'tokens')}), "
                   f"{s.tokens_per_param:.1f} {per_param(plan)}"),
        ("epochs", epochs),
        ("checkpoints", f"every {s.checkpoint_every_minutes:g} min ≈ {s.checkpoint_every_steps:,} steps; "
                        f"{s.num_checkpoints} in all, {fmt_bytes(s.checkpoint_bytes)} each"),
        ("storage", f"{fmt_bytes(s.storage_bytes)} (keep last {s.keep_last} + best)"),
        ("launch", " ".join(plan.launch.command)),
    ])
    parts: list = [model, memt, thr, bud]
    if plan.warnings:
        parts.append(warning_lines(plan.warnings, title="Warnings"))
    return Group(*parts)


def warning_lines(lines: list[str], title: str | None = None) -> Table:
    """'! warning' lines whose wrapped continuations hang under the text, not under the '!'."""
    w = Table.grid(padding=(0, 1))
    if title:
        w.title, w.title_justify = title, "left"
    w.add_column(style="yellow", no_wrap=True)
    w.add_column(style="yellow")
    for x in lines:
        w.add_row("!", Text(x))
    return w


def print_plan(plan: Plan, console: Console | None = None) -> None:
    (console or Console()).print(plan_tables(plan))


def _usd(x: float) -> str:
    return f"${x:,.0f}" if x >= 10 else f"${x:,.2f}"


def _band(plan: Plan, figure: str) -> str:
    """'P10–P90 252k–360k, ' to open a figure's parentheses, '' without a band."""
    s = inner(plan.uncertainty, figure)
    return f"{s}, " if s else ""


def summary_rows(plan: Plan) -> list[tuple[str, str]]:
    """The answer on one screen: model and length, batch and settings, speed and cost, memory, disk."""
    hw, m, tr, mem, tp, b, s = (plan.hardware, plan.model, plan.training, plan.memory, plan.throughput, plan.budget,
                                plan.schedule)
    spec = plan.request.model
    epochs = f", {s.epochs:.2f} epochs of {fmt_count(s.dataset_tokens or 0)}" if s.epochs is not None else ""
    stop = f" (stops at {plan.request.max_epochs:g} epochs)" if b.limited_by == "epochs" else f" (set by {b.limited_by})"
    price = f"${hw.usd_per_gpu_hour:.2f}/GPU-h {hw.provider} ({hw.price_date})" if hw.usd_per_gpu_hour else "free"
    verdict_ = mem.verdict or ("fits" if mem.fits else "does not fit")
    ac = "checkpointing on" if tr.activation_checkpointing else "checkpointing off"
    return [
        ("model", f"{m.name} ({spec.style}), {fmt_count(m.n_params)} params"),
        ("tokens", f"{fmt_count(s.total_tokens)}{suffix(plan.uncertainty, 'tokens')} = "
                   f"{s.tokens_per_param:.1f} {per_param(plan)}{epochs}, {s.total_steps:,} steps"),
        ("batch", f"{tr.device_batch_size} × {tr.grad_accum_steps} accum × {plural(hw.num_gpus, 'GPU')} = "
                  f"{s.tokens_per_step:,} tokens/step; {strategy_label(plan.request.trainer, tr.strategy)}, {ac}"),
        ("speed", f"{tp.tokens_per_sec:,.0f} tokens/s ({_band(plan, 'tokens_per_sec')}MFU {tp.effective_mfu:.0%}), "
                  f"{_hours(b.hours)}{suffix(plan.uncertainty, 'hours')}{stop}"),
        ("cost", f"{_usd(b.usd)}{suffix(plan.uncertainty, 'usd')} at {price}"
                 + (f", {fmt_duration(b.startup_seconds)} start-up included" if b.startup_seconds else "")),
        ("odds", odds_words(plan.uncertainty, b.limited_by, s.total_tokens)),
        ("memory", f"{fmt_bytes(mem.per_gpu_bytes)} of {fmt_bytes(mem.capacity_bytes)} per GPU "
                   f"({mem.per_gpu_bytes / mem.capacity_bytes:.0%}): {verdict_}"),
        ("disk", f"{fmt_bytes(s.storage_bytes)} of checkpoints at peak (keep last {s.keep_last} + best + 1 "
                 "being written)"),
    ]


EXPLAIN_HINT = "--explain: the full breakdown (memory, throughput, budget, why this plan)"


def print_summary(plan: Plan, console: Console, said_below: list[str] | None = None) -> None:
    """The default view: the key numbers and the warnings (EXPLAIN_HINT follows); --explain prints plan_tables.
    `said_below`: warnings that lines printed after this one say (the spot lines), not repeated here."""
    console.print(_kv(None, summary_rows(plan)))   # values wrap between words, never inside a number
    if warns := [w for w in plan.warnings if w not in (said_below or [])]:
        console.print(warning_lines(warns))


def _gpus(spec: str) -> str:
    """'8xH100-SXM' -> '8×H100-SXM' for prose."""
    return spec.replace("x", "×", 2) if spec[:1].isdigit() else spec


def verdict(plan: Plan, written: str | None) -> str:
    """The one line printed last: model, batch, GPUs, time, money at the price used, tokens, where the plan went."""
    hw, b, tr, s, m = plan.hardware, plan.budget, plan.training, plan.schedule, plan.model
    where = f" → {written}" if written else " (not saved: add --out plan.json)"
    price = (f"${hw.usd_per_gpu_hour:,.2f}/GPU-h" + (f" {hw.provider}" if hw.provider not in ("custom", "local") else "")
             if hw.usd_per_gpu_hour else "free")
    if not plan.memory.fits:
        return (f"✗ {m.name} ({fmt_count(m.n_params)} params) does not fit on {_gpus(hw.spec)}: "
                f"{fmt_bytes(plan.memory.per_gpu_bytes)} per GPU > {fmt_bytes(plan.memory.capacity_bytes)}"
                f"{where} (fits: false)")
    usd = f"${b.usd:,.0f}" if b.usd >= 10 else f"${b.usd:,.2f}"
    hours = f"{b.hours:.1f} h" if b.hours >= 1 else _hours(b.hours)
    return (f"→ {m.name}, {fmt_count(m.n_params)} params, {tr.device_batch_size}×{tr.grad_accum_steps} on "
            f"{_gpus(hw.spec)}, {hours}, {usd} at {price}, {fmt_count(s.total_tokens)} tokens{where}")


def wrap_fields(line: str, width: int) -> list[str]:
    """`line` in lines of at most `width` cells, broken only between its fields (after ', ', before ' → '),
    never inside a number or a path; continuation lines are indented by two spaces."""
    import re  # noqa: PLC0415

    fields = [f for f in re.split(r"(?<=, )|(?= → )", line) if f]
    out: list[str] = []
    for f in fields:
        if out and Text(out[-1] + f.rstrip()).cell_len <= width:
            out[-1] = out[-1] + f
        else:
            out.append(f if not out else "  " + f.lstrip())
    return [x.rstrip() for x in out]
