"""`nanoplan sample RUN_DIR`: what the model learned, as a few continuations of a prompt (runner/sample.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from nanoplan.cli import app
from nanoplan.common import examples
from planner.errors import PlanError

Opt = typer.Option


@app.command(epilog=examples(
    ("nanoplan sample runs/latest", "3 continuations of a newline from the best checkpoint"),
    ("nanoplan sample runs/latest --prompt 'Once upon a time' -n 1 --tokens 300", "one longer sample of a prompt"),
    ("nanoplan sample runs/latest --checkpoint last --temperature 0", "the newest checkpoint, most likely tokens"),
))
def sample(
    run_dir: Annotated[str, typer.Argument(metavar="RUN_DIR", help="Run directory of nanoplan run")],
    prompt: Annotated[str, Opt(metavar="TEXT", help="Text to continue")] = "\n",
    num_samples: Annotated[int, Opt("--num-samples", "-n", metavar="N", help="How many samples")] = 3,
    tokens: Annotated[int, Opt(metavar="N", help="New tokens per sample")] = 200,
    temperature: Annotated[float, Opt(metavar="T", help="Sampling temperature (0: the most likely token)")] = 0.8,
    top_k: Annotated[int, Opt(metavar="K", help="Sample among the K most likely tokens (0: all)")] = 200,
    checkpoint: Annotated[str, Opt(metavar="best|last|STEP", help="Which checkpoint: the lowest validation loss, "
                                                                  "the newest, or a step")] = "best",
    seed: Annotated[int, Opt(metavar="N", help="Random seed (the same seed prints the same text)")] = 1337,
    data: Annotated[Optional[str], Opt(metavar="DIR", help="Prepared data whose tokenizer to use (default: the "
                                                            "one the run trained on)")] = None,
) -> None:
    """Sample text from a run's checkpoint, with the run's own tokenizer."""
    from nanoplan.extras import require  # noqa: PLC0415

    require("torch", "sample")
    for name, value, low in (("--num-samples", num_samples, 1), ("--tokens", tokens, 1), ("--top-k", top_k, 0)):
        if value < low:
            raise PlanError(name, f"must be at least {low}, got {value}")
    if not temperature >= 0 or temperature == float("inf"):
        raise PlanError("--temperature", f"must be a finite number >= 0, got {temperature}")
    from runner.sample import sample as run_sample  # noqa: PLC0415

    res = run_sample(Path(run_dir), prompt=prompt, num_samples=num_samples, new_tokens=tokens,
                     temperature=temperature, top_k=top_k or None, which=checkpoint, seed=seed, data=data)
    val = f", val loss {res.val_loss:.4f}" if res.val_loss is not None else ""
    what = {"best": "the best checkpoint", "last": "the newest checkpoint", "step": "checkpoint"}[res.which]
    typer.echo(f"{what}: step {res.step:,}{val}; {res.tokenizer} tokenizer; temperature {temperature:g}, "
               f"top-k {top_k or 'all'}, seed {seed}")
    for i, text in enumerate(res.texts, 1):
        typer.echo(f"──── sample {i} of {len(res.texts)} " + "─" * 20)
        typer.echo(printable(text))


def printable(text: str) -> str:
    """The text with control and format characters (escape sequences, bidi controls) shown as \\xNN / \\uNNNN, so
    a young model's output cannot drive the terminal; newlines and tabs stay."""
    import unicodedata  # noqa: PLC0415

    return "".join(ch if ch in "\n\t" or not unicodedata.category(ch).startswith("C")
                   else ch.encode("unicode_escape").decode("ascii") for ch in text)
