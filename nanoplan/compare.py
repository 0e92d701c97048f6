"""`nanoplan compare`: the best run on each GPU configuration, as a table, csv, markdown or json."""

from __future__ import annotations

from typing import Annotated, Optional

import typer
from rich.console import Console

from nanoplan.cli import app
from nanoplan.common import FLAG, batch_tokens, examples, resolve_model
from planner.errors import PlanError
from planner.units import parse_count, parse_hours, parse_money

Opt = typer.Option
DEFAULT_GPUS = "8xB200,8xH200,8xH100,8xA100,4xH100,4xA100,H100,2x8xH100"


@app.command(help="The best run for a budget (or hours, or steps) on each GPU configuration, side by side. The table keeps "
                  "the columns that fit the terminal (--wide for all); --format gives csv, markdown or json.",
             epilog=examples(
                 ("nanoplan compare --budget 1000", "the default GPU line-up at $1,000"),
                 ("nanoplan compare --budget 1k --provider runpod --plot compare.png", "RunPod prices, and a chart"),
                 ("nanoplan compare --hours 24 --gpus 8xH100,8xL40S,8xRTX-4090 --depth 20", "one model, 24 hours"),
                 ("nanoplan compare --steps 5k --preset gpt2 --price H100=2.49 --format csv",
                  "one model for 5,000 steps, your own H100 price, as CSV"),
             ))
def compare(
    budget: Annotated[Optional[str], Opt(metavar="USD", help="Dollar budget per configuration: 1000, 1k")] = None,
    hours: Annotated[Optional[str], Opt(metavar="H", help="Compare at a fixed number of hours instead: 24, 90m")] = None,
    steps: Annotated[Optional[str], Opt(metavar="N", help="Compare at a fixed number of optimizer steps instead: "
                                                           "5000, 20k")] = None,
    gpus: Annotated[str, Opt("--gpus", "--gpu", metavar="SPECS", show_default=False,
                             help="Comma-separated GPU configurations, nodes×GPUs×type (default: "
                                  + ", ".join(DEFAULT_GPUS.split(",")) + ")")] = DEFAULT_GPUS,
    provider: Annotated[Optional[str], Opt(metavar="NAME", help="Whose prices, where a GPU has them (else its "
                                                                 "default): modal, aws, lambda, runpod")] = None,
    price: Annotated[Optional[str], Opt(metavar="USD", help="Your price per GPU-hour for every configuration "
                                                             "(2.5), or per type: H100=2.49,B200=5.99; "
                                                             "24/h/node for a node")] = None,
    depth: Annotated[Optional[int], Opt(metavar="N", help="Fix the model: nanochat-style depth (default: "
                                                           "search)")] = None,
    preset: Annotated[Optional[str], Opt(metavar="NAME", help="Fix the model: a named preset (default: search)")] = None,
    style: Annotated[Optional[str], Opt(metavar="NAME", help="Family of the searched depths: nanochat, gpt2, "
                                                              "llama")] = None,
    vocab_size: Annotated[Optional[int], Opt(metavar="N", help="Vocabulary size (default: the style's)")] = None,
    seq_len: Annotated[Optional[int], Opt(metavar="T", help="Sequence length")] = None,
    total_batch_tokens_: Annotated[Optional[str], Opt("--total-batch-tokens", metavar="N",
                                                     help="Tokens per optimizer step: 524288, 512Ki, 1M (default "
                                                          "524,288)")] = None,
    total_batch_seqs: Annotated[Optional[str], Opt(metavar="N", help="The batch in sequences of --seq-len tokens "
                                                                      "instead: 256")] = None,
    objective: Annotated[str, Opt(metavar="NAME", help="loss | value | max-model | throughput | "
                                                        "chinchilla")] = "loss",
    dataset_tokens: Annotated[Optional[str], Opt(metavar="N", help="Unique tokens in your dataset: 350M, 3B")] = None,
    headroom: Annotated[float, Opt(metavar="F", help="Memory kept free beyond the fragmentation, a fraction of the GPU")] = 0.0,
    format: Annotated[str, Opt("--format", metavar="FMT", help="table | csv | markdown | json")] = "table",
    wide: Annotated[bool, Opt("--wide", metavar=FLAG, help="Every column, however wide the table")] = False,
    plot: Annotated[Optional[str], Opt(metavar="PNG", help="Also draw cost against time to this PNG (needs "
                                                            "matplotlib)")] = None,
    spot: Annotated[bool, Opt("--spot", metavar=FLAG, help="Spot GPUs: rank on what the budget buys after "
                                                            "interruptions; expected and P90 cost (docs/spot.md)")] = False,
    mtbi: Annotated[Optional[str], Opt(metavar="H", help="With --spot: mean time between interruptions of one "
                                                          "node, 6h (default: each profile's)")] = None,
) -> None:
    """The best run for a budget (or hours) on each GPU configuration (help text in the decorator)."""
    from planner.candidates import Length, Settings, depth_ladder  # noqa: PLC0415
    from planner.compare import FORMATS, parse_prices  # noqa: PLC0415
    from planner.compare import compare as run_compare  # noqa: PLC0415
    from planner.ranking import OBJECTIVES  # noqa: PLC0415

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
    given = [n for n, v in (("--budget", budget), ("--hours", hours), ("--steps", steps)) if v is not None]
    if len(given) != 1:
        raise PlanError(given[1] if given else "--budget",
                        "give exactly one of --budget, --hours or --steps" + (f", not {' and '.join(given)}" if given else ""),
                        "e.g. nanoplan compare --budget 1000")
    length = Length(budget_usd=parse_money(budget, "--budget") if budget is not None else None,
                    hours=parse_hours(hours, "--hours") if hours is not None else None,
                    steps=parse_count(steps, "--steps") if steps is not None else None)
    spec = resolve_model(depth=depth, preset_name=preset, style=style, n_layer=None, d_model=None, n_head=None,
                         n_kv_head=None, d_ff=None, vocab_size=vocab_size, seq_len=seq_len)
    models = [spec] if spec is not None else depth_ladder(style or "nanochat", seq_len=seq_len or 2048,
                                                          vocab_size=vocab_size)
    total_batch_tokens = batch_tokens(total_batch_tokens_, total_batch_seqs, models[0].seq_len)
    settings = Settings(total_batch_tokens=total_batch_tokens, headroom=headroom,
                        dataset_tokens=parse_count(dataset_tokens, "--dataset-tokens") if dataset_tokens else None)
    gpu_list = [g.strip() for g in gpus.split(",") if g.strip()]
    if spot or mtbi is not None:
        _compare_spot(gpu_list, models, length, settings, objective=objective, provider=provider,
                      prices=parse_prices(price), mtbi=mtbi, spot=spot, fmt=format, wide=wide, plot=plot)
        return
    cmp = run_compare(gpu_list, models, length, settings, objective=objective, provider=provider,
                      prices=parse_prices(price))
    if plot is not None:
        from nanoplan.compare_plot import plot as draw  # noqa: PLC0415

        draw(cmp, plot)
    if format == "table":
        from planner.compare import rich_table  # noqa: PLC0415
        from planner.tables import print_table  # noqa: PLC0415

        console = Console()
        print_table(console, rich_table(cmp, None if wide else console.width))
        if plot is not None:
            console.print(f"[green]wrote {plot}[/green]")
        return
    from planner.compare import to_csv, to_json, to_markdown  # noqa: PLC0415

    text = {"csv": to_csv, "json": to_json, "markdown": to_markdown}[format](cmp)
    typer.echo(text.rstrip("\n"))


def _compare_spot(gpu_list: list[str], models: list, length: object, settings: object, *, objective: str,
                  provider: str | None, prices: dict | None, mtbi: str | None, spot: bool, fmt: str, wide: bool,
                  plot: str | None) -> None:
    """compare --spot: planner/spot_compare.py."""
    from planner.plan import SpotRequest  # noqa: PLC0415
    from planner.spot_compare import records, rich_table, spot_compare  # noqa: PLC0415

    if not spot:
        raise PlanError("--mtbi", "applies to spot GPUs only", "add --spot, or drop --mtbi")
    if plot is not None:
        raise PlanError("--plot", "is not drawn for --spot", "drop --plot, or compare on demand")
    req = SpotRequest(mtbi_hours=parse_hours(mtbi, "--mtbi") if mtbi is not None else None)
    rows, seconds = spot_compare(gpu_list, models, length, settings, objective=objective, provider=provider,  # type: ignore[arg-type]
                                 prices=prices, spot=req)
    ds = getattr(settings, "dataset_tokens", None)
    if fmt == "table":
        from planner.tables import print_table  # noqa: PLC0415

        console = Console()
        print_table(console, rich_table(rows, objective=objective, length=length, seconds=seconds,  # type: ignore[arg-type]
                                        width=None if wide else console.width, dataset_tokens=ds))
        return
    import pandas as pd  # noqa: PLC0415

    recs = records(rows, ds)
    df = pd.DataFrame.from_records(recs)
    if fmt == "markdown":
        head = "| " + " | ".join(recs[0]) + " |"
        body = ["| " + " | ".join("" if v is None else str(v) for v in r.values()) + " |" for r in recs]
        text = "\n".join([head, "|" + "---|" * len(recs[0]), *body])
    else:
        text = df.to_csv(index=False) if fmt == "csv" else df.to_json(orient="records", indent=2)
    typer.echo(text.rstrip("\n"))
