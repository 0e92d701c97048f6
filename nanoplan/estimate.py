"""`nanoplan estimate`, `nanoplan profiles` and `nanoplan schema`.

No `from __future__ import annotations` here: typer reads the 48 options' annotations, and as strings it
would compile each one again at every start (5 ms of the command's start-up; benchmarks/estimate_speed.py).
"""

import gc
import json
from typing import Annotated, Optional

import typer
from rich.console import Console

from nanoplan.cli import app
from nanoplan.common import (
    DEFAULT_BATCH_TOKENS,
    FLAG,
    batch_tokens,
    check_run_dir,
    check_vocab,
    examples,
    price_of,
    resolve_data,
    resolve_model,
    resolve_profile,
    writable_target,
)
from planner.counts import n_params
from planner.errors import PlanError
from planner.memory import DEFAULT_LOSS_CHUNK_TOKENS
from planner.plan import Plan
from planner.report import EXPLAIN_HINT, print_plan, print_summary, verdict, wrap_fields
from planner.spec import ModelSpec
from planner.units import parse_count, parse_hours, parse_money
from planner.writes import write_output

Opt = typer.Option
LENGTH, MODEL, BATCH, HARDWARE, SEARCH, OUTPUT = ("Length and data", "Model", "Batch and memory",
                                                  "Hardware and price", "Search", "Output")
TRAINER = "Trainer"


@app.command(help="Plan one training run: model, memory, batch, throughput, hours, tokens and dollars. With no "
             "model given (--depth, --preset or dims) it searches model size and settings. Exit 0 with a plan; 1 when "
             "the model you pinned does not fit (the plan is still written, fits: false); 2 on bad input.",
             epilog=examples(
    ("nanoplan estimate --budget 100", "the best model $100 buys on 8×H100; writes plan.json"),
    ("nanoplan estimate --gpu 4xA100 --hours 12 --depth 20", "a given model for 12 hours on 4×A100"),
    ("nanoplan estimate --budget 1k --dataset-tokens 3B --objective value", "data-limited, cheapest within 0.5%"),
    ("nanoplan estimate --gpu 2x8xH100 --budget 5000 --price 24/h/node", "your own price, per 8-GPU node"),
))
def estimate(
    budget: Annotated[Optional[str], Opt(metavar="USD", rich_help_panel=LENGTH,
                                         help="Dollar budget: 1000, 1,000, 1k or '$1000'")] = None,
    hours: Annotated[Optional[str], Opt(metavar="H", rich_help_panel=LENGTH,
                                        help="Wall-clock length instead: 12, 1.5h, 90m")] = None,
    steps: Annotated[Optional[str], Opt(metavar="N", rich_help_panel=LENGTH,
                                        help="Optimizer steps instead: 5000, 20k")] = None,
    dataset_tokens: Annotated[Optional[str], Opt(metavar="N", rich_help_panel=LENGTH,
                                                 help="Unique tokens in your dataset: 350M, 3B (the run stops at "
                                                      "--max-epochs of them, 4 by default)")] = None,
    data: Annotated[Optional[str], Opt(metavar="DIR", rich_help_panel=LENGTH,
                                       help="DATA_DIR from nanoplan prepare-data (tokens, vocab)")] = None,
    max_epochs: Annotated[Optional[float], Opt(metavar="E", rich_help_panel=LENGTH,
                                               help="Stop after this many epochs of the data (default 4 with a dataset: Muennighoff "
                                                    "et al. 2023; past 4, repeats lose value)")] = None,
    startup_seconds: Annotated[Optional[float], Opt(metavar="S", rich_help_panel=LENGTH,
                                                    help="Seconds a launch takes before its first step (start-up, "
                                                         "compile), as you measured it (default: 60+120 on a GPU, "
                                                         "5(+20 compiled) on a CPU, assumed)")] = None,
    depth: Annotated[Optional[int], Opt(metavar="N", rich_help_panel=MODEL,
                                        help="nanochat-style depth, d_model = 64·depth (default: search)")] = None,
    preset: Annotated[Optional[str], Opt(metavar="NAME", rich_help_panel=MODEL,
                                         help="Named model: tiny, d20, d32, gpt2, gpt2-xl, llama3.2-1b, ...")] = None,
    style: Annotated[Optional[str], Opt(metavar="NAME", rich_help_panel=MODEL,
                                        help="Family: nanochat, gpt2, llama")] = None,
    n_layer: Annotated[Optional[int], Opt(metavar="N", rich_help_panel=MODEL, help="Explicit dims: layers")] = None,
    d_model: Annotated[Optional[int], Opt(metavar="N", rich_help_panel=MODEL, help="Explicit dims: width")] = None,
    n_head: Annotated[Optional[int], Opt(metavar="N", rich_help_panel=MODEL, help="Explicit dims: heads")] = None,
    n_kv_head: Annotated[Optional[int], Opt(metavar="N", rich_help_panel=MODEL,
                                            help="Explicit dims: key/value heads (GQA)")] = None,
    d_ff: Annotated[Optional[int], Opt(metavar="N", rich_help_panel=MODEL, help="Explicit dims: MLP width")] = None,
    vocab_size: Annotated[Optional[int], Opt(metavar="N", rich_help_panel=MODEL,
                                             help="Vocabulary (default: the style's, or --data's)")] = None,
    seq_len: Annotated[Optional[int], Opt(metavar="T", rich_help_panel=MODEL, help="Sequence length")] = None,
    device_batch_size: Annotated[Optional[int], Opt(metavar="B", rich_help_panel=BATCH,
                                                    help="Micro-batch per GPU (default: largest that fits)")] = None,
    total_batch_tokens_: Annotated[Optional[str], Opt("--total-batch-tokens", metavar="N", rich_help_panel=BATCH,
                                                     help="Tokens per optimizer step: 524288, 512Ki, 1M (default "
                                                          "524,288; nanochat: its own rule from --depth)")] = None,
    total_batch_seqs: Annotated[Optional[str], Opt(metavar="N", rich_help_panel=BATCH,
                                                   help="The batch in sequences of --seq-len tokens instead: 256")] = None,
    strategy: Annotated[Optional[str], Opt(metavar="S", rich_help_panel=BATCH,
                                           help="ddp | zero1 | zero2 | fsdp (default: simplest that fits); hsdp: "
                                                "planned, not run (docs/scale-out.md)")] = None,
    tp: Annotated[int, Opt("--tp", metavar="N", rich_help_panel=BATCH,
                           help="Tensor-parallel degree, within a node: planned, not run (docs/scale-out.md)")] = 1,
    activation_checkpointing: Annotated[bool, Opt("--activation-checkpointing", metavar=FLAG, rich_help_panel=BATCH,
                                                  help="Recompute activations in the backward pass (default: only "
                                                       "when needed to fit; the --no- form forbids it)")] = False,
    no_activation_checkpointing: Annotated[bool, Opt("--no-activation-checkpointing", hidden=True)] = False,
    precision: Annotated[Optional[str], Opt(metavar="P", rich_help_panel=BATCH,
                                            help="bf16-autocast | bf16 | fp32 (CPU: fp32)")] = None,
    optimizer: Annotated[Optional[str], Opt(metavar="NAME", rich_help_panel=BATCH,
                                            help="adamw | muon (default: adamw; a --trainer's own)")] = None,
    loss_chunk_tokens: Annotated[int, Opt(metavar="N", rich_help_panel=BATCH,
                                          help="Tokens per chunk of the loss (0: whole batch)")] = DEFAULT_LOSS_CHUNK_TOKENS,
    compile: Annotated[bool, Opt("--compile", metavar=FLAG, rich_help_panel=BATCH,
                                 help="torch.compile (default: on for GPUs, off for CPU; --no-compile: off)")] = False,
    no_compile: Annotated[bool, Opt("--no-compile", hidden=True)] = False,
    headroom: Annotated[float, Opt(metavar="F", rich_help_panel=BATCH,
                                   help="Memory kept free beyond the fragmentation, a fraction of the GPU")] = 0.0,
    gpu: Annotated[str, Opt("--gpu", "--gpus", metavar="SPEC", rich_help_panel=HARDWARE,
                            help="GPUs: H100, 8xH100, 8x A100, 2x8xH100 (nodes×GPUs×type), 2xCPU")] = "8xH100",
    provider: Annotated[Optional[str], Opt(metavar="NAME", rich_help_panel=HARDWARE,
                                           help="Whose price: modal, aws, lambda, runpod, ... "
                                                "(nanoplan profiles)")] = None,
    price: Annotated[Optional[str], Opt(metavar="USD", rich_help_panel=HARDWARE,
                                        help="Your price per GPU-hour (3.95), or per node-hour: 24/h/node")] = None,
    price_per_node: Annotated[Optional[str], Opt(metavar="USD", rich_help_panel=HARDWARE,
                                                 help="Your price per node-hour (a node: the GPUs per node of "
                                                      "--gpu)")] = None,
    profile: Annotated[Optional[str], Opt(metavar="FILE", rich_help_panel=HARDWARE,
                                          help="Your own hardware profile YAML")] = None,
    mfu: Annotated[Optional[float], Opt(metavar="F", rich_help_panel=HARDWARE,
                                        help="Override the profile's model FLOPs utilisation")] = None,
    spot: Annotated[bool, Opt("--spot", metavar=FLAG, rich_help_panel=HARDWARE,
                              help="Spot GPUs: the spot price, expected and P90 cost over interruptions, the "
                                   "checkpoint cadence that minimises lost time (docs/spot.md)")] = False,
    mtbi: Annotated[Optional[str], Opt(metavar="H", rich_help_panel=HARDWARE,
                                       help="With --spot: mean time between interruptions of one node, 6h, "
                                            "90m (default: the profile's)")] = None,
    objective: Annotated[str, Opt(metavar="NAME", rich_help_panel=SEARCH,
                                  help="loss | value | max-model | throughput | chinchilla")] = "loss",
    top: Annotated[Optional[int], Opt(metavar="N", rich_help_panel=SEARCH,
                                      help="Runners-up to show (default: 3; with --explain 5)")] = None,
    out: Annotated[Optional[str], Opt(metavar="FILE", rich_help_panel=OUTPUT,
                                      help="Write the plan here (default: plan.json; with --json only if given)")] = None,
    explain_: Annotated[bool, Opt("--explain", metavar=FLAG, rich_help_panel=OUTPUT,
                                  help="The full breakdown: why this plan, model, memory, throughput, budget")] = False,
    json_out: Annotated[bool, Opt("--json", metavar=FLAG, rich_help_panel=OUTPUT,
                                  help="Print the plan as JSON instead of tables")] = False,
    wide: Annotated[bool, Opt("--wide", metavar=FLAG, rich_help_panel=OUTPUT,
                              help="Show every column of the runners-up, however wide")] = False,
    plot: Annotated[Optional[str], Opt(metavar="PNG", rich_help_panel=OUTPUT,
                                       help="Also draw memory per GPU over one training step, by phase and part, "
                                            "against the capacity, to this PNG (needs matplotlib)")] = None,
    run_dir: Annotated[str, Opt(metavar="DIR", rich_help_panel=OUTPUT,
                                help="Run directory for nanoplan run")] = "runs/latest",
    checkpoint_every_minutes: Annotated[Optional[float], Opt(metavar="MIN", rich_help_panel=OUTPUT,
                                                             help="Checkpoint cadence in minutes (default: 60; "
                                                                  "with --spot the optimum)")] = None,
    keep_last: Annotated[int, Opt(metavar="N", rich_help_panel=OUTPUT, help="Checkpoints kept (plus the best)")] = 3,
    trainer: Annotated[str, Opt(metavar="NAME", rich_help_panel=TRAINER,
                                help="Whose training step to plan: nanoplan (this runner) | nanochat | torchtitan | "
                                     "deepspeed (docs/trainers.md)")] = "nanoplan",
    trainer_version: Annotated[Optional[str], Opt(metavar="V", rich_help_panel=TRAINER,
                                                  help="The trainer's version: nanochat 2025-10 | 2025-11 | 2026-07, "
                                                       "torchtitan 0.2 | 0.3, deepspeed 0.19 (default: the newest)")] = None,
    ac_mode: Annotated[Optional[str], Opt(metavar="MODE", rich_help_panel=TRAINER,
                                          help="torchtitan's activation checkpointing: none | selective-op | full")] = None,
    fp8: Annotated[bool, Opt("--fp8", metavar=FLAG, rich_help_panel=TRAINER,
                             help="nanochat's FP8 matmuls (--fp8; H100 or newer)")] = False,
) -> None:
    """Plan one training run (the help text is in the decorator)."""
    if activation_checkpointing and no_activation_checkpointing:
        raise PlanError("--no-activation-checkpointing", "conflicts with --activation-checkpointing", "give one")
    ac = True if activation_checkpointing else False if no_activation_checkpointing else None
    if compile and no_compile:
        raise PlanError("--no-compile", "conflicts with --compile", "give one")
    compiled = True if compile else False if no_compile else None
    if plot is not None and not plot.lower().endswith(".png"):
        raise PlanError("--plot", f"{plot!r} is not a .png path", "e.g. --plot memory.png")
    if plot is not None and trainer != "nanoplan":
        raise PlanError("--plot", f"draws nanoplan's runner step, not {trainer}'s", "drop --plot or --trainer")
    budget_usd = parse_money(budget, "--budget") if budget is not None else None
    hours_h = parse_hours(hours, "--hours") if hours is not None else None
    n_steps = parse_count(steps, "--steps") if steps is not None else None
    usd, per = price_of(price, price_per_node)
    prof = resolve_profile(gpu, profile)
    if usd is not None and per == "node":
        from planner.profiles import parse_gpu_spec  # noqa: PLC0415

        usd = usd / parse_gpu_spec(gpu, profile=prof).gpus_per_node   # PlanRequest.price is per GPU-hour
    meta, ds_tokens = resolve_data(data, dataset_tokens)
    check_vocab(vocab_size, meta, data)
    check_run_dir(run_dir)
    if max_epochs is None and ds_tokens:   # one rule for searched and pinned models: the search's fresh-data cap
        from planner.candidates import FRESH_EPOCHS  # noqa: PLC0415

        max_epochs = FRESH_EPOCHS
    n_top = top if top is not None else 5 if explain_ else 1 if spot else 3   # --spot: its own 6 lines follow
    vocab = vocab_size or (meta.vocab_size if meta else None)
    if trainer != "nanoplan":
        spec = trainer_model(trainer, trainer_version, depth=depth, preset=preset, seq_len=seq_len, vocab=vocab)
    else:
        spec = None
    if fp8 and trainer == "nanoplan":
        raise PlanError("--fp8", "nanoplan's runner trains in bf16", "give --trainer nanochat, or drop --fp8")
    if spec is None:
        spec = resolve_model(depth=depth, preset_name=preset, style=style, n_layer=n_layer, d_model=d_model,
                             n_head=n_head, n_kv_head=n_kv_head, d_ff=d_ff, vocab_size=vocab, seq_len=seq_len)
    default_batch = DEFAULT_BATCH_TOKENS
    if total_batch_tokens_ is None and total_batch_seqs is None and trainer != "nanoplan":
        from planner.trainers import default_total_batch  # noqa: PLC0415  (a trainer's own rule: nanochat 2026-07)

        default_batch = default_total_batch(trainer, trainer_version, spec, DEFAULT_BATCH_TOKENS)
    is_cpu = prof.kind == "cpu"
    total_batch_tokens = batch_tokens(total_batch_tokens_, total_batch_seqs,
                                      spec.seq_len if spec is not None else seq_len or 2048, default_batch)
    default_length = spec is not None and budget_usd is None and hours_h is None and n_steps is None
    if default_length:   # a model but no length: the trainer's own rule, else Chinchilla's 20 tokens/param
        n_steps, why_length = default_steps(spec, trainer, trainer_version, total_batch_tokens)
    base = dict(
        gpu=gpu, profile=prof, provider=provider, price=usd, device_batch_size=device_batch_size,
        total_batch_tokens=total_batch_tokens, precision=precision or ("fp32" if is_cpu else "bf16-autocast"),
        optimizer=optimizer or "adamw", strategy=strategy or "ddp", activation_checkpointing=bool(ac),
        loss_chunk_tokens=loss_chunk_tokens, compile=(not is_cpu) if compiled is None else compiled,
        budget_usd=budget_usd, hours=hours_h, steps=n_steps, dataset_tokens=ds_tokens, max_epochs=max_epochs,
        startup_seconds=startup_seconds,
        data_dir=data, checkpoint_every_minutes=60.0 if checkpoint_every_minutes is None else checkpoint_every_minutes,
        keep_last=keep_last,
        headroom=headroom, mfu=mfu, run_dir=run_dir, spot=_spot_request(spot, mtbi, checkpoint_every_minutes),
        fp8=fp8,
        tp=tp,
    )
    write_to = out if (out or json_out) else "plan.json"
    plan_path = write_to or "plan.json"
    if write_to:
        writable_target(write_to)     # a directory or a missing chain of folders: one line, before any planning
    console = Console(emoji=False)     # no ':name:' emoji in plans; rich's emoji table costs 3 ms to load
    if n_layer is not None and style is None and trainer == "nanoplan" and not json_out:
        console.print(f"! no --style: nanochat family assumed (vocab {spec.vocab_size:,}); add --style gpt2 or llama",
                      style="yellow", highlight=False, soft_wrap=True)
    if default_length and not json_out:
        console.print(f"No --budget/--hours/--steps: {why_length}: {n_steps:,} steps", style="dim", highlight=False,
                      soft_wrap=False)
    if trainer != "nanoplan" and spot:
        raise PlanError("--spot", "plans nanoplan's runner on spot GPUs", "drop --trainer, or --spot")
    if trainer != "nanoplan":
        plan = _trainer_plan(trainer, trainer_version, spec, base, plan_path, console if not json_out else None,
                             user={"strategy": strategy, "optimizer": optimizer, "precision": precision,
                                   "compile": compiled, "activation_checkpointing": ac, "ac_mode": ac_mode})
    elif ac_mode is not None:
        raise PlanError("--ac-mode", "is torchtitan's activation-checkpoint mode", "give --trainer torchtitan, or use "
                        "--activation-checkpointing")
    elif trainer_version is not None:
        raise PlanError("--trainer-version", "names a version of another trainer", "give --trainer too")
    elif spec is None and spot:
        from planner.spot_search import spot_search_cli  # noqa: PLC0415

        plan = spot_search_cli(base, objective=objective, top=n_top, seq_len=seq_len, vocab_size=vocab,
                               style=style, plan_path=plan_path, console=None if json_out else console, wide=wide,
                               explain=explain_)
    elif spec is None:
        from planner.selection import search_cli  # noqa: PLC0415

        plan = search_cli(base, objective=objective, top=n_top, seq_len=seq_len, vocab_size=vocab,
                          style=style, plan_path=plan_path, console=None if json_out else console, wide=wide,
                          explain=explain_)
    else:
        from planner.fit import fit_model  # noqa: PLC0415

        plan, why, _ = fit_model(spec, base, strategy=strategy, ac=ac, plan_path=plan_path)
        if why and explain_ and not json_out:
            from rich.panel import Panel  # noqa: PLC0415

            console.print(Panel("\n".join(f"• {x}" for x in why), title=f"How {plan.model.name} fits" if plan.memory.fits
                                else f"{plan.model.name} does not fit",
                                title_align="left"))
    wrote = []
    if plot is not None:     # drawn before the plan is written; said just above the verdict, the last line
        _plot_memory(plan, plot)
        wrote.append(f"wrote {plot} (memory per GPU over one step)")
    _emit(plan, write_to, json_out, console, explain_, wrote)
    if not plan.memory.fits:
        raise typer.Exit(1)


def trainer_model(trainer: str, version: str | None, *, depth: int | None, preset: str | None, seq_len: int | None,
                  vocab: int | None) -> ModelSpec | None:
    """The trainer's own model for --depth or --preset (`Trainer.model_for`); None: the usual flags."""
    from planner.plan import TrainerRef  # noqa: PLC0415
    from planner.trainers import TRAINERS, trainer_for  # noqa: PLC0415

    if trainer not in TRAINERS:
        raise PlanError("--trainer", f"unknown trainer {trainer!r}", f"choose one of {', '.join(TRAINERS)}")
    tr = trainer_for(TrainerRef(name=trainer))  # type: ignore[arg-type]
    assert tr is not None
    return tr.model_for(tr.version(version).key, depth=depth, preset=preset, seq_len=seq_len, vocab=vocab)


def _trainer_plan(trainer: str, version: str | None, spec: ModelSpec | None, base: dict, plan_path: str,
                  console: Console | None, user: dict) -> Plan:
    from planner.trainer_fit import plan_for_trainer  # noqa: PLC0415

    if spec is None:
        from planner.plan import TrainerRef  # noqa: PLC0415
        from planner.trainers import trainer_for  # noqa: PLC0415

        tr = trainer_for(TrainerRef(name=trainer))  # type: ignore[arg-type]
        assert tr is not None                        # trainer_model checked the name
        raise PlanError("--trainer", f"{trainer} plans a model you name; nanoplan searches models only for its own "
                        "runner", tr.model_hint)
    plan, why = plan_for_trainer(trainer, version, spec, base, user, plan_path=plan_path)
    if why and console is not None:
        from rich.panel import Panel  # noqa: PLC0415

        console.print(Panel("\n".join(f"• {x}" for x in why), title=f"{plan.model.name} with {trainer}",
                            title_align="left"))
    return plan


def _plot_memory(plan: Plan, path: str) -> None:
    """--plot: the planner walks the step phase by phase (planner/step_phases.py); nanoplan/memory_plot.py draws."""
    from nanoplan.memory_plot import draw  # noqa: PLC0415  (matplotlib only now)
    from planner.step_phases import step_memory  # noqa: PLC0415

    draw(step_memory(plan).as_dict(), path)


def default_steps(spec: ModelSpec, trainer: str, version: str | None, total_batch_tokens: int) -> tuple[int, str]:
    """(steps, why) of a run given a model and no length: the trainer's own default (nanochat's base_train.py),
    else Chinchilla's 20 tokens per parameter, counting the parameters the plan counts (its tokens/param)."""
    from planner.plan import TrainerRef  # noqa: PLC0415
    from planner.trainers import chinchilla_steps, trainer_for  # noqa: PLC0415

    tr = trainer_for(TrainerRef(name=trainer, version=version)) if trainer != "nanoplan" else None  # type: ignore[arg-type]
    if tr is None:
        return chinchilla_steps(n_params(spec), total_batch_tokens)
    ref = TrainerRef(name=trainer, version=tr.version(version).key)  # type: ignore[arg-type]
    return tr.default_steps(spec, ref, total_batch_tokens)


def _spot_request(spot: bool, mtbi: str | None, minutes: float | None) -> object:
    """--spot's request (None without --spot; --mtbi alone is an error)."""
    if not spot:
        if mtbi is not None:
            raise PlanError("--mtbi", "applies to spot GPUs only", "add --spot, or drop --mtbi")
        return None
    from planner.plan import SpotRequest  # noqa: PLC0415

    return SpotRequest(mtbi_hours=parse_hours(mtbi, "--mtbi") if mtbi is not None else None,
                       checkpoint_every_minutes=minutes)


def _emit(plan: Plan, out: str | None, json_out: bool, console: Console, explain: bool = False,
          wrote: list[str] | None = None) -> None:
    if json_out:
        typer.echo(plan.model_dump_json(indent=2))
    elif explain:
        print_plan(plan, console)
    elif plan.spot is not None:
        from planner.spot_report import restated  # noqa: PLC0415

        print_summary(plan, console, restated(plan))
    else:
        print_summary(plan, console)
    if out:
        write_output(out, plan.model_dump_json(indent=2) + "\n")   # one write path: exit 4 on a failed write
    if plan.spot is not None and not json_out:
        from planner.build import build_plan  # noqa: PLC0415
        from planner.spot_report import spot_lines  # noqa: PLC0415

        req = plan.request
        alt = None if req.price is not None else build_plan(req.model_copy(update={"spot": None}))
        for line in spot_lines(plan, alt):
            console.print(line, highlight=False, soft_wrap=True)
    if not json_out and not explain:
        console.print(EXPLAIN_HINT, style="dim", highlight=False)
    for line in [] if json_out else wrote or []:
        console.print(line, highlight=False, soft_wrap=True)
    if not json_out:
        # piped: one line, so `| tail -1` gets all of it; a terminal: broken between fields, never mid-number
        line = verdict(plan, out)
        for part in wrap_fields(line, console.width) if console.is_terminal else [line]:
            console.print(part, style="bold" if plan.memory.fits else "bold red", highlight=False, soft_wrap=True)


@app.command(epilog=examples(("nanoplan profiles", "every GPU type, its figures and prices"),
                             ("nanoplan profiles --wide", "every column, however narrow the terminal"),
                             ("nanoplan estimate --gpu 8xL40S --budget 100", "then plan on one of them")))
def profiles(
    wide: Annotated[bool, Opt("--wide", metavar=FLAG, help="Every column, however wide the table")] = False,
) -> None:
    """List the built-in hardware profiles and their prices."""
    from planner.profiles import builtin_profiles  # noqa: PLC0415
    from planner.tables import Col, fit_table, hidden_note, print_table  # noqa: PLC0415

    console = Console()
    cols = [Col("name", 0, "left"), Col("memory", 0), Col("BF16 TFLOP/s", 0), Col("HBM TB/s", 2),
            Col("link GB/s", 3), Col("MFU", 1), Col("usable", 4), Col("price", 0, "left")]
    rows = []
    for p in builtin_profiles().values():
        d = p.price()
        others = len(p.prices) - 1
        rows.append([p.name, f"{p.memory_gb:g} GB", f"{p.bf16_tflops:g}", f"{p.hbm_tb_s:g}",
                     f"{p.intra_node_gb_s:g}/{p.inter_node_gb_s:g}", f"{p.default_mfu:.2f}",
                     f"{p.usable_bytes / 2**30:.1f} GiB",
                     f"${d.usd_per_gpu_hour:.2f} {d.provider} ({d.date})" + (f" +{others}" if others else "")])
    table = fit_table(cols, rows, None if wide else console.width,
                      title="Hardware profiles (dense peaks; price per GPU-hour, the default provider's)")
    print_table(console, table)
    if note := hidden_note(cols, table):
        console.print(note, highlight=False)
    console.print("+N: more providers (--provider NAME). Every figure's source: hardware_profiles/*.yaml and "
                  "docs/hardware.md.", highlight=False)


@app.command(epilog=examples(("nanoplan schema > plan.schema.json", "the JSON schema of plan.json"),
                             ("nanoplan schema | python -m json.tool | less", "read it")))
def schema() -> None:
    """Print the JSON schema of plan.json."""
    typer.echo(json.dumps(Plan.model_json_schema(), indent=2))


__all__ = ["estimate", "profiles", "schema", "PlanError"]

# A planning command lives for a fraction of a second and makes little cyclic garbage. The objects its imports
# built (typer's, rich's, pydantic's schemas: ~10^5) move out of the collector's way, so each collection scans
# only what the command itself makes: 8-10% of `estimate`'s CPU time (benchmarks/results/estimate_speed.md).
gc.freeze()
