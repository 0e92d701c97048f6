"""`nanoplan compare`: the best run on each GPU configuration, as a table, csv, markdown or json."""

from __future__ import annotations

from typing import Annotated, Optional

import typer
from rich.console import Console

from planner.cli import app
from planner.cli.common import resolve_model
from planner.errors import PlanError
from planner.units import parse_count

Opt = typer.Option


@app.command()
def compare(
    budget: Annotated[Optional[float], Opt(help="Dollar budget per configuration")] = None,
    hours: Annotated[Optional[float], Opt(help="Compare at a fixed number of hours instead of a budget")] = None,
    gpus: Annotated[str, Opt(help="Comma-separated GPU specs (nodes x GPUs x type allowed: 2x8xH100)")] =
        "8xB200,8xH200,8xH100,8xA100,4xH100,4xA100,H100,2x8xH100",
    depth: Annotated[Optional[int], Opt(help="Fix the model: nanochat-style depth (default: search)")] = None,
    preset: Annotated[Optional[str], Opt(help="Fix the model: a named preset (default: search)")] = None,
    style: Annotated[Optional[str], Opt(help="Family of the searched depths: nanochat, gpt2, llama")] = None,
    vocab_size: Annotated[Optional[int], Opt(help="Vocabulary size (default: the style's)")] = None,
    seq_len: Annotated[Optional[int], Opt(help="Sequence length T")] = None,
    total_batch_tokens: Annotated[int, Opt(help="Tokens per optimizer step")] = 524_288,
    objective: Annotated[str, Opt(help="loss | max-model | throughput | chinchilla")] = "loss",
    dataset_tokens: Annotated[Optional[str], Opt(help="Dataset size in tokens: 350M, 1.2B, 5e9")] = None,
    provider: Annotated[Optional[str], Opt(help="Price provider where a GPU has one (else its default)")] = None,
    headroom: Annotated[float, Opt(help="Memory headroom fraction")] = 0.05,
    format: Annotated[str, Opt("--format", help="table | csv | markdown | json")] = "table",
    plot: Annotated[Optional[str], Opt(help="Write the cost-vs-time Pareto chart to this PNG (needs matplotlib)")] = None,
) -> None:
    """The best run for a budget (or hours) on each GPU configuration, side by side."""
    from planner.compare import FORMATS  # noqa: PLC0415
    from planner.compare import compare as run_compare  # noqa: PLC0415
    from planner.search import OBJECTIVES, Length, Settings, depth_ladder  # noqa: PLC0415

    if format not in FORMATS:
        raise PlanError("--format", f"unknown format {format!r}", f"choose one of {', '.join(FORMATS)}")
    if objective not in OBJECTIVES:
        raise PlanError("--objective", f"unknown objective {objective!r}", f"choose one of {', '.join(OBJECTIVES)}")
    if not 0 <= headroom < 1:
        raise PlanError("--headroom", f"must be in [0, 1), got {headroom}")
    if plot is not None and not plot.lower().endswith(".png"):
        raise PlanError("--plot", f"{plot!r} is not a .png path", "e.g. --plot compare.png")
    if seq_len is not None and seq_len <= 0:
        raise PlanError("--seq-len", f"must be a positive integer, got {seq_len}")
    if total_batch_tokens <= 0:
        raise PlanError("--total-batch-tokens", f"must be a positive integer, got {total_batch_tokens}")
    length = Length(budget_usd=budget, hours=hours)
    spec = resolve_model(depth=depth, preset_name=preset, style=style, n_layer=None, d_model=None, n_head=None,
                         n_kv_head=None, d_ff=None, vocab_size=vocab_size, seq_len=seq_len)
    models = [spec] if spec is not None else depth_ladder(style or "nanochat", seq_len=seq_len or 2048,
                                                          vocab_size=vocab_size)
    settings = Settings(total_batch_tokens=total_batch_tokens, headroom=headroom,
                        dataset_tokens=parse_count(dataset_tokens, "--dataset-tokens") if dataset_tokens else None)
    gpu_list = [g.strip() for g in gpus.split(",") if g.strip()]
    cmp = run_compare(gpu_list, models, length, settings, objective=objective, provider=provider)
    if plot is not None:
        from planner.compare import plot as draw  # noqa: PLC0415

        draw(cmp, plot)
    if format == "table":
        from planner.compare import rich_table  # noqa: PLC0415

        console = Console()
        console.print(rich_table(cmp))
        if plot is not None:
            console.print(f"[green]wrote {plot}[/green]")
        return
    from planner.compare import to_csv, to_json, to_markdown  # noqa: PLC0415

    text = {"csv": to_csv, "json": to_json, "markdown": to_markdown}[format](cmp)
    typer.echo(text.rstrip("\n"))
