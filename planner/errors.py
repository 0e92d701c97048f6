"""User-facing errors, in one style everywhere.

Code raises PlanError(field, problem, fix). The CLI renders it (and click's usage errors, and
pydantic's) as one `error:` line naming the field and the problem, plus one `hint:` line
with the fix when there is one, on stderr, with exit code 2 (render_error). Rich boxes are
for results only.
"""

from __future__ import annotations

import json
import unicodedata
from typing import Any

from pydantic import BaseModel

MAX_ECHO = 300          # characters of a user's value quoted back in an error (a 100 MB string is not echoed whole)
MAX_LINE = 1000         # an error or hint line longer than this is cut in the middle


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


class WriteFailed(Exception):
    """A file a command writes could not be written (disk full, I/O error, permission): str() is the one line,
    exit 4 (planner/writes.py)."""

    exit_code = 4


def error_lines(message: str, hint: str = "") -> list[str]:
    """The CLI's error shape: one `error:` line, then a `hint:` line where there is a fix."""
    first = clip(" ".join(message.split("\n")), MAX_LINE)
    return [f"error: {first}"] + ([f"hint: {clip(' '.join(hint.split(chr(10))), MAX_LINE)}"] if hint else [])


def clip(text: str, limit: int = MAX_ECHO) -> str:
    """`text` cut to about `limit` characters: head ... [N characters cut] ... tail."""
    if len(text) <= limit:
        return text
    keep = max(8, limit // 2 - 20)
    return f"{text[:keep]}...[{len(text) - 2 * keep:,} characters cut]...{text[-keep:]}"


def echo(value: Any, limit: int = MAX_ECHO) -> str:
    """repr(value) for an error message, clipped (a huge string is not echoed whole, nor copied)."""
    if isinstance(value, str) and len(value) > limit:
        keep = max(8, limit // 2 - 30)
        return f"{value[:keep]!r}...[{len(value):,} characters in all]...{value[-keep:]!r}"
    return clip(repr(value), limit)


# Characters that change what a reader sees without being seen themselves: the bidi marks, embeddings, overrides
# and isolates of "Trojan Source" (CVE-2021-42574: U+061C, U+200E/F, U+202A-202E, U+2066-2069), the zero-width
# space, joiners and word joiner (U+200B-200D, U+2060), the invisible operators (U+2061-2064) and the BOM (U+FEFF).
INVISIBLE = frozenset([0x061C, *range(0x200B, 0x2010), *range(0x202A, 0x202F), *range(0x2060, 0x2070), 0xFEFF])


def control_char(text: str) -> tuple[int, str] | None:
    """(index, 'U+000A') of the first control character in `text` (C0, DEL, C1, U+2028/2029), or of the first
    invisible one (INVISIBLE: bidi and zero-width, e.g. 'U+202E RIGHT-TO-LEFT OVERRIDE'), or None."""
    for i, c in enumerate(text):
        o = ord(c)
        if o < 0x20 or 0x7F <= o <= 0x9F or o in (0x2028, 0x2029):
            return i, f"U+{o:04X}"
        if o in INVISIBLE:
            return i, f"U+{o:04X} {unicodedata.name(c, 'invisible')}"
    return None


def find_control(value: Any, path: str = "") -> tuple[str, int, str] | None:
    """The first string inside `value` (str, list, tuple, dict keys and values, pydantic models) that holds a
    control character: (dotted path inside value, index, code point), or None."""
    if isinstance(value, str):
        hit = control_char(value)
        return (path, *hit) if hit else None
    if isinstance(value, (list, tuple)):
        items: Any = ((f"{path}.{i}" if path else str(i), v) for i, v in enumerate(value))
    elif isinstance(value, dict):
        items = []
        for k, v in value.items():
            key_path = f"{path}.{k}" if path else str(k)
            if isinstance(k, str) and control_char(k):
                return (f"{path} (a key)" if path else "(a key)", *control_char(k))  # type: ignore[misc]
            items.append((key_path, v))
    elif isinstance(value, BaseModel):
        items = ((f"{path}.{k}" if path else k, getattr(value, k)) for k in type(value).model_fields)
    else:
        return None
    for sub, v in items:
        found = find_control(v, sub)
        if found:
            return found
    return None


class DuplicateKeyError(ValueError):
    """A JSON object names the same key twice (json.loads would keep the last one silently)."""


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise DuplicateKeyError(f"the key {echo(k, 80)} appears twice in one object")
        out[k] = v
    return out


def strict_json_loads(text: str | bytes) -> Any:
    """json.loads that refuses duplicate keys (DuplicateKeyError, a ValueError)."""
    return json.loads(text, object_pairs_hook=_no_duplicates)


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
