"""`nanoplan prepare-data`: text files -> DATA_DIR/train.bin, val.bin, meta.json (numpy, no torch)."""

from __future__ import annotations

from contextlib import ExitStack
from typing import Annotated, Callable, List, Optional

import typer
from rich.console import Console

from nanoplan.cli import app
from nanoplan.common import examples

Opt = typer.Option


def _rich_progress(stack: ExitStack, console: Console) -> Callable[[str, int, int], None] | None:
    """A bytes-processed progress bar on stderr, or None when stderr is not a terminal."""
    if not console.is_terminal:
        return None
    from rich.progress import (  # noqa: PLC0415
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    bar = stack.enter_context(Progress(TextColumn("{task.description:>9}"), BarColumn(), DownloadColumn(),
                                       TransferSpeedColumn(), TimeRemainingColumn(), console=console))
    tasks: dict[str, int] = {}

    def update(phase: str, n: int, total: int) -> None:
        if phase not in tasks:
            tasks[phase] = bar.add_task(phase, total=total)
        bar.update(tasks[phase], advance=n)  # type: ignore[arg-type]

    return update


@app.command("prepare-data", epilog=examples(
    ("nanoplan prepare-data examples/tiny/text.txt --out data/tiny", "bytes as tokens (vocab 256)"),
    ("nanoplan prepare-data a.txt --out data/bpe --tokenizer bpe --vocab-size 8192", "train a BPE here"),
    ("nanoplan estimate --data data/bpe --budget 100", "plan on it: token count and vocab from meta.json"),
))
def prepare_data(
    inputs: Annotated[List[str], typer.Argument(help="Text files to tokenise, in order", metavar="FILE...", show_default=False)],
    out: Annotated[str, Opt("--out", metavar="DATA_DIR", help="DATA_DIR to write train.bin, val.bin, meta.json into")],
    tokenizer: Annotated[str, Opt(metavar="NAME", help="byte (vocab 256) | char (alphabet of the data) | bpe (trained here)")] = "byte",
    vocab_size: Annotated[Optional[int], Opt(metavar="N", help="bpe only: target vocabulary size (default 8192)")] = None,
    val_fraction: Annotated[float, Opt(metavar="F", help="Validation share: the tail of every 4 MiB block of each input")] = 0.01,
    chunk_mb: Annotated[float, Opt(metavar="MB", help="Read chunk size in MiB")] = 4.0,
) -> None:
    """Tokenise text files into uint16/uint32 token files for `nanoplan run` and `estimate --data`."""
    from planner.errors import PlanError  # noqa: PLC0415
    from runner.prepare import prepare_data as run_prepare  # noqa: PLC0415

    if not chunk_mb > 0:
        raise PlanError("--chunk-mb", f"must be positive, got {chunk_mb}")
    err = Console(stderr=True)
    with ExitStack() as stack:
        res = run_prepare(inputs, out, tokenizer=tokenizer, vocab_size=vocab_size, val_fraction=val_fraction,
                          chunk_bytes=max(1, int(chunk_mb * 2**20)), progress=_rich_progress(stack, err))
    from rich.filesize import decimal  # noqa: PLC0415

    m = res.meta
    nbytes = m.source_bytes or 0
    console = Console(highlight=False)
    if res.removed_stale[0]:
        err.print(f"note: removed {res.removed_stale[0]} temporary file(s) ({decimal(res.removed_stale[1])}) left in "
                  f"{out} by a prepare-data that was killed", highlight=False, soft_wrap=True)
    console.print(f"tokenizer {m.tokenizer}, vocab {m.vocab_size:,}, dtype {m.dtype}")
    console.print(f"train {m.train_tokens:,} tokens, val {m.val_tokens:,} tokens "
                  f"({m.val_tokens / max(1, m.train_tokens + m.val_tokens):.2%}) from {len(m.sources)} file(s)")
    console.print(f"{decimal(nbytes)} in {res.seconds:.2f} s ({decimal(int(nbytes / max(res.seconds, 1e-9)))}/s; "
                  f"encode pass {res.encode_seconds:.2f} s)")
    console.print(f"[green]wrote {', '.join(str(f) for f in res.files)}[/green]", soft_wrap=True)
