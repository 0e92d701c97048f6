"""Parse human numbers such as 350M, 1.2B, 5e9 and 16GiB."""

from __future__ import annotations

import math
import re

from planner.errors import PlanError

_SUFFIX = {"": 1, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}
_NUM = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([kmbgt]?)\s*$", re.IGNORECASE)

GiB = 1024**3
MiB = 1024**2


def parse_count(text: str | float | int, field: str = "value") -> int:
    """'350M' -> 350_000_000; '1.2B' -> 1_200_000_000; '5e9' -> 5_000_000_000."""
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        m = _NUM.match(str(text).replace("_", "").replace(",", ""))
        if not m:
            raise PlanError(field, f"cannot read {text!r} as a count", "use e.g. 350M, 1.2B or 5e9")
        value = float(m.group(1)) * _SUFFIX[m.group(2).lower()]
    if not math.isfinite(value) or value <= 0:
        raise PlanError(field, f"must be a positive finite number, got {text!r}")
    return int(round(value))


def fmt_count(n: float) -> str:
    """1_879_048_192 -> '1.88B'."""
    for div, suf in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= div:
            return f"{n / div:.3g}{suf}"
    return f"{n:.3g}"


def fmt_bytes(n: float) -> str:
    """Bytes in GiB (or MiB below 1 GiB)."""
    if abs(n) >= GiB:
        return f"{n / GiB:.2f} GiB"
    return f"{n / MiB:.1f} MiB"
