"""Parse human numbers such as 350M, 1.2B, 5e9 and 16GiB."""

from __future__ import annotations

import math
import re

from planner.errors import PlanError

_SUFFIX = {"": 1, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12, "ki": 2**10, "mi": 2**20, "gi": 2**30}
_NUM = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([kmbgt]?|[kmg]i)\s*$", re.IGNORECASE)

GiB = 1024**3
MiB = 1024**2


def _refuse_negative(text: str, field: str) -> None:
    """'-5', '$-5', '-$5', '-1.5h': a number below zero is refused as such (not as unreadable), in one line."""
    t = text.strip().replace(" ", "").removeprefix("$")
    if t[:1] in ("-", "\u2212") and re.match(r"^\$?[0-9.]", t[1:]):
        raise PlanError(field, f"must be positive, got {text.strip()!r}")


def parse_count(text: str | float | int, field: str = "value") -> int:
    """'350M' -> 350_000_000; '1.2B' -> 1_200_000_000; '5e9' -> 5_000_000_000; '512Ki' -> 524_288 (binary)."""
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        _refuse_negative(str(text), field)
        m = _NUM.match(str(text).replace("_", "").replace(",", ""))
        if not m:
            raise PlanError(field, f"cannot read {text!r} as a count", "use e.g. 350M, 1.2B, 5e9 or 512Ki (524,288)")
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


def fmt_duration(seconds: float) -> str:
    """A duration as people read it: '0.35 s', '42 s', '3.2 min', '5.1 h', '2.5 d' (never '7.353e-05 h')."""
    s = abs(seconds)
    if s < 10:
        return f"{seconds:.2g} s" if s < 1 else f"{seconds:.1f} s"
    if s < 90:
        return f"{seconds:.0f} s"
    if s < 5400:
        return f"{seconds / 60:.1f} min"
    if s < 72 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def plural(n: int, word: str, words: str | None = None) -> str:
    """'1 GPU', '8 GPUs', '1 accumulation step', '4 accumulation steps'."""
    return f"{n:,} {word if n == 1 else words or word + 's'}"


def fmt_bytes(n: float) -> str:
    """Bytes in GiB (or MiB below 1 GiB)."""
    if abs(n) >= GiB:
        return f"{n / GiB:.2f} GiB"
    return f"{n / MiB:.1f} MiB"


# ---------------------------------------------------------------- money, prices and durations as people type them

_DOLLARS = re.compile(r"^(?P<num>[0-9][0-9,_]*(?:\.[0-9]*)?|\.[0-9]+)(?P<suf>[km]?)$", re.IGNORECASE)
_GROUPED = re.compile(r"^[0-9]{1,3}(?:,[0-9]{3})+(?:\.[0-9]*)?$")


def _shell_ate_dollar(text: str) -> bool:
    """'$1000' unquoted reaches us as '000' ($1 is an empty shell variable): digits with a leading zero."""
    t = text.strip().replace(",", "")
    return len(t) >= 2 and t.isdigit() and t[0] == "0"


def parse_money(text: str | float | int, field: str = "--budget") -> float:
    """US dollars as people type them: '1000', '1,000', '1k', '$1000', '$1.5k', '2.5M', '1000 USD'."""
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        raw = str(text)
        if _shell_ate_dollar(raw) or not raw.strip():
            was = "$1" + raw.strip()
            raise PlanError(field, f"{raw!r} looks like a dollar amount the shell cut: unquoted, '{was}' reaches "
                            f"nanoplan as {raw.strip()!r} ($1 is a shell variable)",
                            f"quote it ({field} '{was}') or leave out the $ ({field} {was[1:]})")
        _refuse_negative(raw, field)
        t = raw.strip().lower().removesuffix("usd").strip().removeprefix("$").removeprefix("usd").strip()
        m = _DOLLARS.match(t)
        if not m or ("," in m.group("num") and not _GROUPED.match(m.group("num").replace("_", ""))):
            raise PlanError(field, f"cannot read {raw!r} as dollars", "use e.g. 1000, 1,000, 1k or '$1000'")
        value = float(m.group("num").replace(",", "").replace("_", "")) * {"": 1, "k": 1e3, "m": 1e6}[m.group("suf")]
    if not math.isfinite(value) or value <= 0:
        raise PlanError(field, f"must be a positive amount of dollars, got {text!r}")
    return value


_PER = {"h": "hour", "hr": "hour", "hour": "hour", "hours": "hour", "gpu": "gpu", "gpus": "gpu", "node": "node",
        "nodes": "node", "gpu-h": "gpu hour", "gpu-hr": "gpu hour", "gpu-hour": "gpu hour", "gpuh": "gpu hour",
        "node-h": "node hour", "node-hr": "node hour", "node-hour": "node hour"}


def parse_price(text: str | float, field: str = "--price") -> tuple[float, str]:
    """A price and what it is per: '3.95' or '$3.95/h' or '3.95/gpu/h' -> (3.95, 'gpu'); '24/h/node' -> (24, 'node')."""
    if isinstance(text, (int, float)):
        return parse_money(text, field), "gpu"
    raw = str(text)
    head, *units = [p.strip() for p in raw.strip().split("/")]
    words: set[str] = set()
    for u in units:
        w = _PER.get(u.lower())
        if w is None:
            raise PlanError(field, f"cannot read {raw!r}: unknown unit {u!r}",
                            "write USD per GPU-hour (3.95, 3.95/h) or per node-hour (24/h/node)")
        words.update(w.split())
    if "gpu" in words and "node" in words:
        raise PlanError(field, f"{raw!r} is both per GPU and per node", "write 3.95/h/gpu or 24/h/node")
    try:
        free = float(head.strip().removeprefix("$")) == 0
    except ValueError:
        free = False
    value = 0.0 if free else parse_money(head, field)
    return value, "node" if "node" in words else "gpu"


_DURATION = re.compile(r"^([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*(h|hr|hrs|hours?|m|min|mins|minutes?|d|days?)?$",
                       re.IGNORECASE)


def parse_hours(text: str | float, field: str = "--hours") -> float:
    """Wall-clock hours: '12', '1.5h', '90m', '90min', '2d'."""
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        _refuse_negative(str(text), field)
        m = _DURATION.match(str(text).strip())
        if not m:
            raise PlanError(field, f"cannot read {text!r} as a duration", "use e.g. 12, 1.5h, 90m or 2d")
        unit = (m.group(2) or "h").lower()
        value = float(m.group(1)) * (1 / 60 if unit.startswith("m") else 24 if unit.startswith("d") else 1)
    if not math.isfinite(value) or value <= 0:
        raise PlanError(field, f"must be a positive number of hours, got {text!r}")
    return value
