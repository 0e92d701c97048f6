"""`nanoplan estimate`, `nanoplan profiles` and `nanoplan schema`."""

from __future__ import annotations

import json
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from planner.cli import app
from planner.cli.common import resolve_data, resolve_model, resolve_profile
from planner.errors import PlanError
from planner.fit import fit_model
from planner.plan import Plan, save_plan
from planner.report import print_plan
from planner.units import parse_count

Opt = typer.Option


@app.command()
def estimate(
    gpu: Annotated[str, Opt(help="GPU spec: H100, 4xH100, 8xH100-PCIe, 8xA100-40GB, 2x8xH100, 2xCPU")] = "8xH100",
    budget: Annotated[Optional[float], Opt(help="Dollar budget; sets the length")] = None,
    hours: Annotated[Optional[float], Opt(help="Wall-clock hours; sets the length")] = None,
    steps: Annotated[Optional[int], Opt(help="Optimizer steps; sets the length")] = None,
    depth: Annotated[Optional[int], Opt(help="nanochat-style depth (d_model = 64·depth)")] = None,
    preset: Annotated[Optional[str], Opt(help="Named model: tiny, d20, d32, gpt2, gpt2-xl, llama3.2-1b, ...")] = None,
    style: Annotated[Optional[str], Opt(help="Family for --depth or explicit dims: nanochat, gpt2, llama")] = None,
    n_layer: Annotated[Optional[int], Opt(help="Explicit dims: layers")] = None,
    d_model: Annotated[Optional[int], Opt(help="Explicit dims: width")] = None,
    n_head: Annotated[Optional[int], Opt(help="Explicit dims: attention heads")] = None,
    n_kv_head: Annotated[Optional[int], Opt(help="Explicit dims: key/value heads (GQA)")] = None,
    d_ff: Annotated[Optional[int], Opt(help="Explicit dims: MLP width")] = None,
    vocab_size: Annotated[Optional[int], Opt(help="Vocabulary size (default: the style's, or --data's)")] = None,
    seq_len: Annotated[Optional[int], Opt(help="Sequence length T")] = None,
    device_batch_size: Annotated[Optional[int], Opt(help="Micro-batch per GPU (default: largest that fits)")] = None,
    total_batch_tokens: Annotated[int, Opt(help="Tokens per optimizer step")] = 524_288,
    strategy: Annotated[Optional[str], Opt(help="ddp | zero1 | zero2 | fsdp (default: ddp, or the simplest that fits)")] = None,
    activation_checkpointing: Annotated[Optional[bool], Opt("--activation-checkpointing/--no-activation-checkpointing",
                                                            help="default: off, or on when needed to fit")] = None,
    precision: Annotated[Optional[str], Opt(help="bf16-autocast | bf16 | fp32 (CPU default fp32)")] = None,
    optimizer: Annotated[str, Opt(help="adamw | muon")] = "adamw",
    loss_chunk_tokens: Annotated[int, Opt(help="Tokens per chunk of the chunked loss (0 = whole batch)")] = 4096,
    compile: Annotated[Optional[bool], Opt("--compile/--no-compile", help="torch.compile (default: on for GPUs)")] = None,
    dataset_tokens: Annotated[Optional[str], Opt(help="Dataset size in tokens: 350M, 1.2B, 5e9")] = None,
    max_epochs: Annotated[Optional[float], Opt(help="Stop at this many epochs of the dataset (search default: 4)")] = None,
    data: Annotated[Optional[str], Opt(help="DATA_DIR from nanoplan prepare-data (token count, vocab)")] = None,
    provider: Annotated[Optional[str], Opt(help="Price provider (see nanoplan profiles)")] = None,
    price: Annotated[Optional[float], Opt(help="Override: USD per GPU-hour")] = None,
    profile: Annotated[Optional[str], Opt(help="Your own hardware profile YAML")] = None,
    checkpoint_every_minutes: Annotated[float, Opt(help="Checkpoint cadence in minutes (fractions allowed)")] = 60.0,
    keep_last: Annotated[int, Opt(help="Checkpoints kept (plus the best)")] = 3,
    headroom: Annotated[float, Opt(help="Memory headroom fraction")] = 0.05,
    mfu: Annotated[Optional[float], Opt(help="Override the profile's MFU")] = None,
    objective: Annotated[str, Opt(help="When no model is given: loss | max-model | throughput | chinchilla")] = "loss",
    top: Annotated[int, Opt(help="Runners-up to show when searching")] = 5,
    run_dir: Annotated[str, Opt(help="Run directory for nanoplan run")] = "runs/latest",
    out: Annotated[Optional[str], Opt(help="Write plan.json here")] = None,
    json_out: Annotated[bool, Opt("--json", help="Print the plan as JSON")] = False,
) -> None:
    """Plan one training run: parameters, VRAM, batch, throughput, hours, tokens, dollars."""
    prof = resolve_profile(gpu, profile)
    meta, ds_tokens = resolve_data(data, dataset_tokens)
    vocab = vocab_size or (meta.vocab_size if meta else None)
    spec = resolve_model(depth=depth, preset_name=preset, style=style, n_layer=n_layer, d_model=d_model,
                         n_head=n_head, n_kv_head=n_kv_head, d_ff=d_ff, vocab_size=vocab, seq_len=seq_len)
    is_cpu = prof.kind == "cpu"
    base = dict(
        gpu=gpu, profile=prof, provider=provider, price=price, device_batch_size=device_batch_size,
        total_batch_tokens=total_batch_tokens, precision=precision or ("fp32" if is_cpu else "bf16-autocast"),
        optimizer=optimizer, strategy=strategy or "ddp", activation_checkpointing=bool(activation_checkpointing),
        loss_chunk_tokens=loss_chunk_tokens, compile=(not is_cpu) if compile is None else compile,
        budget_usd=budget, hours=hours, steps=steps, dataset_tokens=ds_tokens, max_epochs=max_epochs,
        data_dir=data, checkpoint_every_minutes=checkpoint_every_minutes, keep_last=keep_last,
        headroom=headroom, mfu=mfu, run_dir=run_dir,
    )
    plan_path = out or "plan.json"
    console = Console()
    if spec is None:
        from planner.search import search_cli  # noqa: PLC0415

        plan = search_cli(base, objective=objective, top=top, seq_len=seq_len, vocab_size=vocab,
                          style=style, plan_path=plan_path, console=None if json_out else console)
    else:
        plan, why, _ = fit_model(spec, base, strategy=strategy, ac=activation_checkpointing, plan_path=plan_path)
        if why and not json_out:
            from rich.panel import Panel  # noqa: PLC0415

            console.print(Panel("\n".join(f"• {x}" for x in why), title=f"How {plan.model.name} fits" if plan.memory.fits
                                else f"{plan.model.name} does not fit",
                                title_align="left"))
    _emit(plan, out, json_out, console)


def _emit(plan: Plan, out: str | None, json_out: bool, console: Console) -> None:
    if json_out:
        typer.echo(plan.model_dump_json(indent=2))
    else:
        print_plan(plan, console)
    if out:
        save_plan(plan, out)
        if not json_out:
            console.print(f"[green]wrote {out}[/green]")


@app.command()
def profiles() -> None:
    """List the built-in hardware profiles and their prices."""
    from planner.profiles import builtin_profiles  # noqa: PLC0415

    t = Table(title="Hardware profiles (dense peaks; prices per GPU-hour)")
    for col in ("name", "memory", "usable", "HBM TB/s", "BF16 TFLOP/s", "link GB/s", "MFU", "prices"):
        t.add_column(col)
    for p in builtin_profiles().values():
        prices = ", ".join(f"{x.provider} ${x.usd_per_gpu_hour:.2f} ({x.date})" +
                           ("*" if x.provider == p.default_provider else "") for x in p.prices)
        t.add_row(p.name, f"{p.memory_gb:g} GB", f"{p.usable_bytes / 2**30:.1f} GiB", f"{p.hbm_tb_s:g}",
                  f"{p.bf16_tflops:g}", f"{p.intra_node_gb_s:g}/{p.inter_node_gb_s:g}", f"{p.default_mfu:.2f}", prices)
    Console().print(t)
    Console().print("* default provider. Sources: each YAML in hardware_profiles/ names one per figure.")


@app.command()
def schema() -> None:
    """Print the JSON schema of plan.json."""
    typer.echo(json.dumps(Plan.model_json_schema(), indent=2))


def parse_tokens(text: str) -> int:
    return parse_count(text, "--dataset-tokens")


__all__ = ["estimate", "profiles", "schema", "PlanError"]
