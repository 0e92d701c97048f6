"""The `nanoplan` command. Each sub-command lives in its own module; torch is imported
lazily, only by the commands that run or trace a model (run, prepare-data, validate --trace)."""

from __future__ import annotations

import sys

import typer
from pydantic import ValidationError

from planner.errors import PlanError, cli_one_line

app = typer.Typer(
    name="nanoplan", no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
    help="Plan, cost and run GPT pre-training on rented GPUs.",
)

# Registration: importing each module adds its commands to `app`.
from planner.cli import calibrate as _calibrate  # noqa: E402,F401
from planner.cli import compare as _compare  # noqa: E402,F401
from planner.cli import data as _data  # noqa: E402,F401
from planner.cli import estimate as _estimate  # noqa: E402,F401
from planner.cli import export as _export  # noqa: E402,F401
from planner.cli import export_model as _export_model  # noqa: E402,F401
from planner.cli import run as _run  # noqa: E402,F401
from planner.cli import validate as _validate  # noqa: E402,F401


def fail(msg: str, code: int = 2) -> typer.Exit:
    """Print one line to stderr and return the Exit to raise."""
    typer.echo(f"error: {msg}", err=True)
    return typer.Exit(code)


def main() -> None:
    try:
        app()
    except PlanError as e:
        typer.echo(f"error: {e}", err=True)
        sys.exit(2)
    except ValidationError as e:
        typer.echo(f"error: {cli_one_line(e)}", err=True)
        sys.exit(2)
