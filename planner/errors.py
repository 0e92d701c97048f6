"""User-facing errors, in one style everywhere.

Code raises PlanError(field, problem, fix). The CLI renders it (and click's usage errors, and
pydantic's) as one `error:` line naming the field and the problem, plus one `hint:` line
with the fix when there is one, on stderr, with exit code 2 (render_error). Rich boxes are
for results only.
"""

from __future__ import annotations


class PlanError(ValueError):
    """Bad input from the user: the field, what is wrong with it, and the fix."""

    def __init__(self, field: str, problem: str, fix: str = "") -> None:
        self.field = field
        self.problem = problem
        self.fix = fix
        msg = f"{field}: {problem}"
        if fix:
            msg += f" ({fix})"
        super().__init__(msg)

    def lines(self) -> list[str]:
        """['error: FIELD: PROBLEM', 'hint: FIX'] (no hint line without a fix)."""
        return error_lines(f"{self.field}: {self.problem}" if self.field else self.problem, self.fix)


def error_lines(message: str, hint: str = "") -> list[str]:
    """The CLI's error shape: one `error:` line, then a `hint:` line where there is a fix."""
    first = " ".join(message.split("\n"))
    return [f"error: {first}"] + ([f"hint: {' '.join(hint.split(chr(10)))}"] if hint else [])


def pydantic_one_line(exc: Exception, source: str = "") -> str:
    """Condense a pydantic ValidationError into one line naming the first bad field."""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        errs = errors()
        if errs:
            e = errs[0]
            loc = ".".join(str(p) for p in e.get("loc", ())) or "(root)"
            msg = str(e.get("msg", "invalid")).replace("\n", " ").removeprefix("Value error, ")
            more = f" (+{len(errs) - 1} more)" if len(errs) > 1 else ""
            prefix = f"{source}: " if source else ""
            return f"{prefix}field '{loc}': {msg}{more}"
    return (f"{source}: " if source else "") + str(exc).splitlines()[0]


# Plan-request fields as the CLI spells them.
CLI_FLAGS = {"budget_usd": "--budget", "model": "model dims"}


def cli_one_line(exc: Exception) -> str:
    """pydantic error -> 'option --hours: must be greater than 0' for request fields."""
    errs = exc.errors() if hasattr(exc, "errors") else []  # type: ignore[attr-defined]
    if errs:
        e = errs[0]
        loc = [str(p) for p in e.get("loc", ())]
        msg = str(e.get("msg", "invalid")).replace("\n", " ").removeprefix("Value error, ")
        if not loc:
            return msg
        head = CLI_FLAGS.get(loc[0], "--" + loc[0].replace("_", "-"))
        return f"{head}{'.' + '.'.join(loc[1:]) if len(loc) > 1 else ''}: {msg}"
    return str(exc).splitlines()[0]
