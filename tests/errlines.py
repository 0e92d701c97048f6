"""The CLI's error shape, for tests: one `error:` line, then at most one `hint:` line (planner.errors)."""

from __future__ import annotations


def error_and_hint(err: str) -> tuple[str, str]:
    """(the error line, the hint or '') of a failed command's stderr; asserts the shape."""
    lines = [x for x in err.splitlines() if x.strip()]
    assert lines and lines[0].startswith("error: "), err
    assert "Traceback" not in err, err
    assert len(lines) == 1 or (len(lines) == 2 and lines[1].startswith("hint: ")), err
    return lines[0], lines[1].removeprefix("hint: ") if len(lines) == 2 else ""


def as_one_line(err: str) -> str:
    """The error and its hint as one string, 'error: FIELD: PROBLEM (HINT)', to compare with whole messages."""
    line, hint = error_and_hint(err)
    return f"{line} ({hint})" if hint else line
