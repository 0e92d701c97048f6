"""Option parsing shared by estimate and compare: model choice, hardware, lengths."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from planner.errors import PlanError
from planner.profiles import HardwareProfile, load_profile_file, parse_gpu_spec
from planner.spec import ModelSpec, preset, style_spec
from planner.units import parse_count

if TYPE_CHECKING:
    from planner.datameta import DataMeta


def resolve_model(*, depth: int | None, preset_name: str | None, style: str | None,
                  n_layer: int | None, d_model: int | None, n_head: int | None, n_kv_head: int | None,
                  d_ff: int | None, vocab_size: int | None, seq_len: int | None) -> ModelSpec | None:
    """The model the user asked for, or None when the search should choose it."""
    given = [n for n, v in (("--depth", depth), ("--preset", preset_name), ("--n-layer", n_layer)) if v is not None]
    if len(given) > 1:
        raise PlanError(given[1], f"conflicts with {given[0]}", "give one of --depth, --preset or explicit dims")
    if depth is not None:
        if depth <= 0:
            raise PlanError("--depth", f"must be a positive integer, got {depth}")
        base = style_spec(style or "nanochat", depth, seq_len or 2048, vocab_size or 65536)  # type: ignore[arg-type]
        return base
    if preset_name is not None:
        base = preset(preset_name)
        upd = {k: v for k, v in (("seq_len", seq_len), ("vocab_size", vocab_size)) if v is not None}
        return ModelSpec.model_validate({**base.model_dump(), **upd}) if upd else base
    if n_layer is not None:
        if d_model is None or n_head is None:
            raise PlanError("--d-model/--n-head", "explicit dims need --n-layer, --d-model and --n-head",
                            "or use --depth N / --preset NAME")
        ref = style_spec(style or "nanochat", 1, seq_len or 2048, vocab_size or 65536)  # type: ignore[arg-type]
        d_ff_default = ref.d_ff // ref.d_model * d_model if ref.mlp != "swiglu" else None
        from planner.spec import llama_ff
        return ModelSpec.model_validate({
            **ref.model_dump(), "style": style or "custom", "n_layer": n_layer, "d_model": d_model,
            "n_head": n_head, "n_kv_head": n_kv_head or n_head,
            "d_ff": d_ff or d_ff_default or llama_ff(d_model),
        })
    return None


def resolve_profile(gpu: str, profile_file: str | None) -> HardwareProfile:
    if profile_file:
        return load_profile_file(profile_file)
    return parse_gpu_spec(gpu).profile


def resolve_data(data: str | None, dataset_tokens: str | None) -> tuple[DataMeta | None, int | None]:
    meta = None
    if data:
        from planner.datameta import load_data_meta  # noqa: PLC0415  (a pydantic model: only with --data)

        meta = load_data_meta(data)
    toks = parse_count(dataset_tokens, "--dataset-tokens") if dataset_tokens else None
    if meta is not None and toks is None:
        toks = meta.train_tokens or None
    return meta, toks


DEFAULT_BATCH_TOKENS = 524_288   # 2**19 tokens per optimizer step: nanochat's default total batch


def batch_tokens(tokens: str | None, seqs: str | None, seq_len: int, default: int = DEFAULT_BATCH_TOKENS) -> int:
    """--total-batch-tokens (524288, 512Ki, 1M) or --total-batch-seqs (256: sequences of seq_len tokens), one of
    them; `default` without either (524,288 tokens, or the trainer's own rule)."""
    if tokens is not None and seqs is not None:
        raise PlanError("--total-batch-seqs", "conflicts with --total-batch-tokens",
                        "give the batch once: in tokens, or in sequences")
    if seqs is not None:
        return parse_count(seqs, "--total-batch-seqs") * seq_len
    return parse_count(tokens, "--total-batch-tokens") if tokens is not None else default


def at_least(*options: tuple[str, int | None, int]) -> None:
    """Each (flag, value, least) given: value >= least, else the one-line error (None: not given)."""
    for flag, value, least in options:
        if value is not None and value < least:
            raise PlanError(flag, f"must be at least {least}, got {value}")


def check_run_dir(run_dir: str) -> None:
    """--run-dir of estimate: the plan file records it, and `nanoplan run` refuses a plan whose run dir is not
    relative (planner.plan.run_dir_problem): refuse it here, before a plan is written."""
    from planner.plan import run_dir_problem  # noqa: PLC0415

    if (why := run_dir_problem(run_dir)) is not None:
        raise PlanError("--run-dir", why, "give a path under this directory (runs/NAME), or keep the default and "
                        f"give `nanoplan run plan.json --run-dir {run_dir}` when you run it")


def check_vocab(vocab_size: int | None, meta: DataMeta | None, data: str | None) -> None:
    """--vocab-size against --data's: a model with fewer token ids than the data's tokenizer cannot embed its
    tokens, and `nanoplan run` refuses it; a larger one (padding, e.g. to a multiple of 64) is allowed."""
    if vocab_size is not None and meta is not None and vocab_size < meta.vocab_size:
        raise PlanError("--vocab-size", f"{vocab_size:,} is smaller than the vocab of {data} ({meta.vocab_size:,} "
                        "token ids): the model could not embed its tokens", f"drop --vocab-size (--data sets "
                        f"{meta.vocab_size:,}), or give one >= {meta.vocab_size:,}")


# ---------------------------------------------------------------- help text shared by the commands

FLAG = ""   # metavar for on/off flags: help shows no value type (a flag takes no value)


def examples(*rows: tuple[str, str]) -> str:
    """A command's help epilog: 'Examples', then each command with what it does on the next line."""
    from rich.markup import escape  # noqa: PLC0415

    out = ["[bold]Examples[/bold]"]
    for cmd, what in rows:
        out.append(f"  [dim]# {escape(what)}[/dim]\n  {escape(cmd)}")
    return "\n".join(out)


def price_of(price: str | None, price_per_node: str | None) -> tuple[float | None, str]:
    """--price / --price-per-node -> (USD per GPU- or node-hour, 'gpu'|'node')."""
    from planner.errors import PlanError  # noqa: PLC0415
    from planner.units import parse_price  # noqa: PLC0415

    if price is not None and price_per_node is not None:
        raise PlanError("--price-per-node", "conflicts with --price", "give one: --price USD per GPU-hour, or "
                        "--price-per-node USD per node-hour (or --price 24/h/node)")
    if price_per_node is not None:
        return parse_price(price_per_node, "--price-per-node")[0], "node"
    if price is not None:
        return parse_price(price, "--price")
    return None, "gpu"


def writable_target(path: str, option: str = "--out") -> bool:
    """Check a file target before anything is computed (planner.writes.check_target: a directory or a missing
    chain of folders is a PlanError); True. A device such as /dev/null is written to directly (it discards)."""
    from planner.writes import check_target  # noqa: PLC0415

    return check_target(path, option)


def output_width(stream: object) -> int | None:
    """Columns to wrap long lines at: $COLUMNS when set, else the terminal's when `stream` is one, else None
    (a pipe or a file: lines stay whole, for grep)."""
    import os  # noqa: PLC0415

    cols = os.environ.get("COLUMNS", "")
    if cols.isdigit() and int(cols) > 0:
        return int(cols)
    try:
        if stream.isatty():  # type: ignore[attr-defined]
            return os.get_terminal_size(stream.fileno()).columns  # type: ignore[attr-defined]
    except (AttributeError, OSError, ValueError):
        pass
    return None


def wrap_command(prefix: str, words: list[str], width: int | None, indent: str = "    ") -> str:
    """`prefix` and a shell command, wrapped at `width` columns with ` \\` continuations, so it can still be
    pasted into a shell: never inside a word (a file name, a number), and an option stays with its value.
    width None: one line."""
    import shlex  # noqa: PLC0415

    if width is None:
        return prefix + shlex.join(words)
    units: list[str] = []
    quoted = [shlex.quote(w) for w in words]
    for i, q in enumerate(quoted):
        if units and units[-1].startswith("-") and "=" not in units[-1] and " " not in units[-1] \
                and not q.startswith("-") and i > 0:
            units[-1] += " " + q                     # --plan plan.json, -m runner.train
        else:
            units.append(q)
    lines: list[str] = []
    cur = prefix + (units[0] if units else "")
    for u in units[1:]:
        if len(cur) + 1 + len(u) + 2 > width:     # room for " \"
            lines.append(cur + " \\")
            cur = indent + u
        else:
            cur = f"{cur} {u}"
    lines.append(cur)
    return "\n".join(lines)


def check_run_args(plan: Any, plan_path: str, run_dir: str | None, max_restarts: int) -> None:
    """`nanoplan run`'s checks shared by every trainer: --max-restarts, and the plan's own run dir when no
    --run-dir is given (runner.preflight.check_plan_run_dir)."""
    from planner.errors import PlanError  # noqa: PLC0415

    if max_restarts < 0:
        raise PlanError("--max-restarts", f"must be >= 0, got {max_restarts}")
    if run_dir is None:
        from runner.preflight import check_plan_run_dir  # noqa: PLC0415

        bad = check_plan_run_dir(plan.launch.run_dir)
        if bad:
            raise PlanError(f"{plan_path}: field 'launch.run_dir'", bad,
                            f"pass --run-dir {plan.launch.run_dir} to use it anyway")


def check_rederived(plan: Any, plan_path: str, force: bool) -> None:
    """`nanoplan run`'s re-derivation, shared by every trainer: a warning when the plan's derived numbers differ from
    today's planner, and a refusal (unless --force) when the re-derived plan no longer fits."""
    import typer  # noqa: PLC0415

    from planner.build import rederive  # noqa: PLC0415

    fresh, stale = rederive(plan, plan_path)
    if stale:
        typer.echo(f"warning: {len(stale)} derived number(s) in {plan_path} differ from a fresh derivation "
                   f"(first: {stale[0]}); `nanoplan validate {plan_path}` lists them", err=True)
        if not fresh.memory.fits and not force:
            raise PlanError(plan_path, "no longer fits in memory when re-derived",
                            "re-plan with nanoplan estimate, or --force")


def record_launch(launch: Any, **start: Any) -> None:
    """Record a launch before anything is spawned (runner.launcher.Launch.start); a failed write is one line, exit 4."""
    import typer  # noqa: PLC0415

    from runner.launcher import LaunchWriteError  # noqa: PLC0415

    try:
        launch.start(**start)
    except LaunchWriteError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(4) from None
