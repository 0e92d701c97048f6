"""The `nanoplan` command: a thin skin over the planner and the runner.

Each sub-command lives in its own module, imported only when that command runs (COMMANDS), so
`nanoplan estimate` loads the planner and nothing else; torch is imported only by the commands
that run or trace a model (run, probe, prepare-data, export-model, validate --trace).

Errors of every kind leave through main(): one `error:` line and a `hint:` line where there
is a fix (planner.errors), exit code 2 for bad input.
"""

from __future__ import annotations

import difflib
import importlib
import os
import sys

import typer
from pydantic import ValidationError
from typer.core import TyperCommand, TyperGroup

try:   # typer >= 0.20 carries its own copy of click
    from typer._click import exceptions as cx
except ImportError:  # pragma: no cover - older typer uses click itself
    from click import exceptions as cx  # type: ignore[no-redef]

from planner import __version__
from planner.errors import PlanError, WriteFailed, cli_one_line, error_lines

# nanoplan uses no pydantic plugins, and looking for them reads every installed distribution's metadata when
# the first model class is built (the commands' modules build them, after this line): 6 ms warm, 33 ms from
# a cold disk cache, with 188 distributions. PYDANTIC_DISABLE_PLUGINS= (empty) turns plugins back on.
os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")


def _no_flag_types(params: list) -> list:
    """On/off flags take no value, so --help shows none for them (typer would show <bool>); an argument's
    name is its metavar (PLAN.json), so --help shows no Python type beside it (typer would show <str>)."""
    for p in params:
        if getattr(p, "is_flag", False) and p.metavar is None:
            p.metavar = ""
        if getattr(p, "param_type_name", "") == "argument":
            p.display_type_rich = _no_type      # the type column of typer's rich help
            p._usage_display_name = _usage_name(p)
    return params


def _no_type(ctx: object = None) -> None:
    return None


def _usage_name(p):  # type: ignore[no-untyped-def]
    """The argument in the usage line as click writes it: PLAN.json, [PLAN.json], FILE... (typer 0.29 writes
    {PLAN.json} and adds a second '...' to a metavar that has one)."""
    name = p.metavar or (p.name or "ARG").upper()
    if p.nargs != 1 and not name.endswith("..."):
        name += "..."
    return lambda: name if p.required else f"[{name}]"


class _Command(TyperCommand):
    def get_params(self, ctx):  # type: ignore[no-untyped-def]
        return _no_flag_types(super().get_params(ctx))


# command name -> the module that defines it; importing a module registers its commands on `app`.
COMMANDS: dict[str, str] = {
    "estimate": "nanoplan.estimate", "compare": "nanoplan.compare", "validate": "nanoplan.validate",
    "profiles": "nanoplan.estimate", "schema": "nanoplan.estimate", "prepare-data": "nanoplan.data",
    "probe": "nanoplan.probe", "run": "nanoplan.run", "export": "nanoplan.export",
    "export-model": "nanoplan.export_model", "calibrate": "nanoplan.calibrate", "sample": "nanoplan.sample",
}


class _Group(TyperGroup):
    """The top-level group: lists every command, imports a command's module only when it is asked for."""

    def get_params(self, ctx):  # type: ignore[no-untyped-def]
        return _no_flag_types(super().get_params(ctx))

    def list_commands(self, ctx):  # type: ignore[no-untyped-def]
        return list(COMMANDS)

    def get_command(self, ctx, cmd_name):  # type: ignore[no-untyped-def]
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            importlib.import_module(COMMANDS[cmd_name])
            for info in app.registered_commands:
                name = info.name or typer.main.get_command_name(info.callback.__name__)  # type: ignore[union-attr]
                if name not in self.commands:
                    info.cls = _Command if info.cls in (None, TyperCommand) else info.cls
                    self.add_command(typer.main.get_command_from_info(
                        info, pretty_exceptions_short=app.pretty_exceptions_short,
                        rich_markup_mode=app.rich_markup_mode), name)
        return self.commands.get(cmd_name)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"nanoplan {__version__}")
        raise typer.Exit()


app = typer.Typer(
    name="nanoplan", cls=_Group, no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
    rich_markup_mode="rich", context_settings={"help_option_names": ["-h", "--help"]},
    help="Plan, cost and run GPT pre-training on rented GPUs.",
    epilog="[bold]Start here[/bold]\n"
           "  nanoplan estimate --budget 100            the best run for $100 on 8×H100\n"
           "  nanoplan compare --budget 1000            the same on every kind of GPU\n"
           "  nanoplan run plan.json --dry-run          the command that runs the plan",
)

@app.callback()
def _root(version: bool = typer.Option(False, "--version", "-V", callback=_version, is_eager=True,
                                       help="Print the version and exit.")) -> None:
    """Plan, cost and run GPT pre-training on rented GPUs."""


def fail(msg: str, code: int = 2, hint: str = "") -> typer.Exit:
    """Print the error (and hint) lines to stderr and return the Exit to raise."""
    _echo(error_lines(msg, hint))
    return typer.Exit(code)


def _echo(lines: list[str]) -> None:
    for line in lines:
        echo_err(line)


def echo_err(line: str) -> None:
    """One error, hint or warning line on stderr. On a terminal a long one wraps between words at its width
    (continuation lines indented), never inside a path or a number; in a pipe or a file it stays one line,
    for grep and the tests."""
    import textwrap  # noqa: PLC0415

    try:
        width = os.get_terminal_size(sys.stderr.fileno()).columns if sys.stderr.isatty() else 0
    except (AttributeError, OSError, ValueError):
        width = 0
    if width >= 40 and len(line) > width:
        line = "\n".join(textwrap.wrap(line, width, subsequent_indent="  ", break_long_words=False,
                                       break_on_hyphens=False))
    typer.echo(line, err=True)


def _usage_lines(e: cx.UsageError) -> list[str]:
    """click's usage errors in our shape: what was wrong, then how to see the options."""
    ctx = e.ctx
    where = f"{ctx.command_path} --help" if ctx is not None else "nanoplan --help"
    if isinstance(e, cx.NoSuchOption):
        known = [o for p in (ctx.command.params if ctx else []) for o in (*p.opts, *p.secondary_opts)
                 if o.startswith("--")]
        near = e.possibilities or difflib.get_close_matches(e.option_name, known, n=1, cutoff=0.6)
        hint = f"did you mean {' or '.join(sorted(near)[:2])}? (see {where})" if near else f"see {where}"
        return error_lines(f"{e.option_name}: no such option for {ctx.command_path if ctx else 'nanoplan'}", hint)
    if isinstance(e, cx.BadParameter) and e.param is not None:
        longs = [o for o in e.param.opts if o.startswith("--")]
        name = longs[0] if longs else (e.param.metavar or (e.param.name or "argument").upper())
        if isinstance(e, cx.MissingParameter):
            return error_lines(f"{name}: missing", f"see {where}")
        return error_lines(f"{name}: {e.message[0].lower() + e.message[1:]}", f"see {where}")
    msg = e.format_message()
    extra = msg.partition("extra argument")[2].strip(" s()")
    if extra.lower() in ("true", "false", "yes", "no", "on", "off", "1", "0"):
        return error_lines(f"unexpected value {extra!r}", f"on/off flags take no value: give the flag alone, or leave "
                           f"it out (see {where})")
    if msg.startswith("No such command"):
        cmds = ctx.command.list_commands(ctx) if ctx and isinstance(ctx.command, TyperGroup) else []
        bad = msg.split("'")[1] if "'" in msg else ""
        near = difflib.get_close_matches(bad, cmds, n=1)
        return error_lines(f"{bad!r} is not a nanoplan command",
                           f"did you mean nanoplan {near[0]}?" if near else "see nanoplan --help")
    return error_lines(msg[0].lower() + msg[1:] if msg else "bad usage", f"see {where}")


def main() -> None:
    code: int = 0
    try:
        rv = app(standalone_mode=False)
        code = rv if isinstance(rv, int) else 0
    except PlanError as e:
        _echo(e.lines())
        code = 2
    except ValidationError as e:
        _echo(error_lines(cli_one_line(e)))
        code = 2
    except WriteFailed as e:          # a file the command writes (planner/writes.py): one line, exit 4
        _echo(error_lines(str(e)))
        code = e.exit_code
    except cx.NoArgsIsHelpError as e:
        typer.echo(e.ctx.get_help())
        code = 0
    except cx.UsageError as e:
        _echo(_usage_lines(e))
        code = 2
    except cx.ClickException as e:
        _echo(error_lines(e.format_message()))
        code = e.exit_code
    except (getattr(cx, "Abort", typer.Abort), typer.Abort):
        _echo(error_lines("interrupted"))
        code = 130
    except ModuleNotFoundError as e:     # an optional package (torch, matplotlib, tokenizers...) not installed
        from nanoplan.extras import missing  # noqa: PLC0415

        err = missing(e.name, _command_words())
        if err is None:
            raise
        _echo(err.lines())
        code = 2
    sys.exit(code)


def _command_words() -> str:
    """The command, and the flag that needs an optional package, as typed: 'validate --trace', 'prepare-data'."""
    args = sys.argv[1:]
    name = next((a for a in args if a in COMMANDS), "nanoplan")
    flags = [a.split("=")[0] for a in args if a.split("=")[0] in ("--trace", "--plot", "--tensorboard")][:1]
    return " ".join([name, *flags])
