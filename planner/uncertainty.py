"""How sure a plan's speed is: P10–P90 bands from the step-time model's held-out errors on public runs.

The committed data (planner/speed_errors.py, written by benchmarks/speed_errors.py) holds, for every public run with
a measured speed, an error no constant was fitted to: log(predicted / measured tokens/s). A plan's band comes from
the runs most like it:

1. the same GPU family (`FAMILY`: A100s together, H100 SXM with H200); a GPU with no family (PCIe and NVL cards,
   Ada, consumer cards, B200 with 2 runs) gets no band: the plan says there are no comparable public runs;
2. then, while at least MIN_RUNS runs remain, the same trainer (nanochat, torchtitan; nanoplan's runner and
   DeepSpeed have no public runs of their own and take every trainer's), compiled or not, single or multi-node
   (`LEVELS`, most specific first).

With n errors e₍₁₎ ≤ … ≤ e₍ₙ₎ of that group, measured / predicted tokens/s lies between exp(−e₍0.9(n+1)₎) and
exp(−e₍0.1(n+1)₎), a fractional rank read between its two neighbours (Hyndman and Fan's type 6 quantile; ranks
clamped to 1…n). A new run of the same kind falls below the k-th of n exchangeable errors with probability
k/(n+1), so this band holds it 80% of the time on average: a P10–P90 band. The split-conformal version (rounding
the ranks outwards, to ⌊0.1(n+1)⌋ and ⌈0.9(n+1)⌉) promises *at least* 80%, and with the 10 to 20 runs a group
has it is a P5–P95 band in all but name (n = 17: the group's minimum and maximum, 16/18 = 89%). The chance a plan
finishes its tokens within its budget is the share of those runs the model did not predict too fast (measured ≥
predicted).
benchmarks/public_runs.py checks the bands on the held-out runs, each against a band built without it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from planner.plan import Plan, UncertaintyPlan
from planner.profiles import Hardware
from planner.speed_errors import ROWS

Q_LO, Q_HI = 0.1, 0.9
MIN_RUNS = 8           # fewer runs than this make no band: with 7, P10 and P90 are the min and max (6/8)
FAMILY = {"A100-40GB": "A100", "A100-80GB": "A100", "H100-SXM": "H100/H200", "H200": "H100/H200", "B200": "B200"}


@dataclass(frozen=True, slots=True)
class Run:
    id: str
    gpu: str
    architecture: str
    trainer: str
    compiled: bool
    multi_node: bool
    split: str
    log_error: float


RUNS: tuple[Run, ...] = tuple(Run(*r) for r in ROWS)
TRAINERS_WITH_RUNS = frozenset(r.trainer for r in RUNS)   # a plan's trainer that has public runs of its own


@dataclass(frozen=True, slots=True)
class Kind:
    """What makes a public run like a plan."""

    family: str | None        # FAMILY of the GPU profile (None: no public runs of that kind of GPU)
    trainer: str | None       # a planner trainer with its own public runs, else None (any trainer)
    compiled: bool
    multi_node: bool


@dataclass(frozen=True, slots=True)
class Band:
    """Measured / predicted tokens/s at P10 and P90, and P(measured ≥ predicted), from `runs` public runs."""

    lo: float
    hi: float
    finish: float
    runs: int
    basis: str                # "14 public runs on H100/H200, compiled, 1 node"


LEVELS = (("trainer", "compiled", "multi_node"), ("trainer", "compiled"), ("trainer",),
          ("compiled", "multi_node"), ("compiled",), ())


def kind_of(gpu_profile: str, trainer: str | None, compiled: bool, nodes: int) -> Kind:
    return Kind(family=FAMILY.get(gpu_profile), trainer=trainer if trainer in TRAINERS_WITH_RUNS else None,
                compiled=compiled, multi_node=nodes > 1)


def similar_runs(kind: Kind, runs: Sequence[Run] = RUNS) -> tuple[list[Run], tuple[str, ...]]:
    """The runs most like `kind` (module docstring) and the keys they share with it beyond the GPU family."""
    fam = [r for r in runs if FAMILY.get(r.gpu) == kind.family] if kind.family else []
    for keys in LEVELS:
        if "trainer" in keys and kind.trainer is None:
            continue
        got = [r for r in fam if all(getattr(r, k) == getattr(kind, k) for k in keys)]
        if len(got) >= MIN_RUNS:
            return got, keys
    return fam, ()


def _words(kind: Kind, keys: tuple[str, ...], n: int) -> str:
    parts = [f"{n} public runs on {kind.family}"]
    if "trainer" in keys:
        parts.append(f"{kind.trainer}")
    if "compiled" in keys:
        parts.append("compiled" if kind.compiled else "eager")
    if "multi_node" in keys:
        parts.append("multi-node" if kind.multi_node else "1 node")
    return ", ".join(parts)


def rank_quantile(sorted_errors: Sequence[float], q: float) -> float:
    """The q-quantile of sorted values at the fractional rank q·(n+1), read linearly between its neighbours and
    clamped to the smallest and largest (type 6; module docstring)."""
    n = len(sorted_errors)
    r = min(max(q * (n + 1), 1.0), float(n))
    k = int(r)
    lo, hi = sorted_errors[k - 1], sorted_errors[min(k, n - 1)]
    return lo + (r - k) * (hi - lo)


def band_from(errors: Sequence[float]) -> tuple[float, float, float]:
    """(lo, hi, finish) of measured / predicted from log errors: their type-6 P10 and P90 (module docstring)."""
    e = sorted(errors)
    n = len(e)
    finish = (sum(1 for x in e if x < 0) + 0.5 * sum(1 for x in e if x == 0)) / n
    return math.exp(-rank_quantile(e, Q_HI)), math.exp(-rank_quantile(e, Q_LO)), finish


def band_for(kind: Kind, runs: Sequence[Run] = RUNS) -> Band | None:
    """The P10–P90 band of a plan of this kind, or None where there are fewer than MIN_RUNS comparable runs."""
    got, keys = similar_runs(kind, runs)
    if len(got) < MIN_RUNS:
        return None
    lo, hi, finish = band_from([r.log_error for r in got])
    return Band(lo=lo, hi=hi, finish=finish, runs=len(got), basis=_words(kind, keys, len(got)))


def no_band_words(kind: Kind, gpu_profile: str, runs: Sequence[Run] = RUNS) -> str:
    """Why a plan has no band: 'no public runs on RTX-4090 to compare with' / 'only 2 public runs on B200'."""
    n = len([r for r in runs if FAMILY.get(r.gpu) == kind.family]) if kind.family else 0
    if n == 0:
        return f"no public runs on {gpu_profile} to compare with"
    return f"only {n} public run{'s' if n != 1 else ''} on {kind.family}, too few for a band"


# ---------------------------------------------------------------- a plan's figures


def plan_uncertainty(*, gpu_profile: str, kind_gpu: bool, trainer: str | None, compiled: bool, nodes: int,
                     flat_mfu: bool, tokens_per_sec: float, hours: float, usd_per_hour: float, total_tokens: int,
                     tokens_per_step: int, limited_by: str) -> UncertaintyPlan:
    """The P10–P90 of a plan's tokens/s and of whichever of hours, tokens and dollars its length rule leaves open:
    under a budget or --hours the run stops on time and trains fewer or more tokens; under --steps or an epoch cap
    it trains its tokens and takes longer or shorter."""
    kind = kind_of(gpu_profile, trainer, compiled, nodes)
    if kind_gpu and flat_mfu:
        return UncertaintyPlan(basis="speed from a flat MFU (--mfu or a calibrated profile): no public-run band",
                               runs=0)
    band = band_for(kind) if kind_gpu else None
    if band is None:
        return UncertaintyPlan(basis=no_band_words(kind, gpu_profile), runs=0)
    tps = (tokens_per_sec * band.lo, tokens_per_sec * band.hi)
    if limited_by in ("steps", "epochs"):
        h = (hours / band.hi, hours / band.lo)
        return UncertaintyPlan(basis=band.basis, runs=band.runs, tokens_per_sec=tps, hours=h,
                               usd=(h[0] * usd_per_hour, h[1] * usd_per_hour), finish_probability=band.finish)
    whole = lambda x: int(x // tokens_per_step) * tokens_per_step  # noqa: E731   (whole optimizer steps)
    return UncertaintyPlan(basis=band.basis, runs=band.runs, tokens_per_sec=tps,
                           tokens=(whole(total_tokens * band.lo), whole(total_tokens * band.hi)),
                           finish_probability=band.finish)


def span(lo_hi: tuple[float, float] | None, fmt: Callable[[float], str]) -> str:
    """'240k–290k' for a (P10, P90) pair in a figure's own format, '' for None."""
    return f"{fmt(lo_hi[0])}–{fmt(lo_hi[1])}" if lo_hi else ""


def _count(x: float) -> str:
    from planner.units import fmt_count  # noqa: PLC0415

    return fmt_count(x)


def _hours(h: float) -> str:
    """Hours as a number (the caller adds ' h'), under an hour as minutes: one decimal below 10 minutes."""
    if h >= 1:
        return f"{h:.1f}"
    m = h * 60
    return f"{m:.1f} min" if m < 10 else f"{m:.0f} min"


def hours_span(lo: float, hi: float) -> str:
    """'28.1–34.0 h', '3.1–3.4 min', '50 min–1.2 h': the unit once where both ends share it."""
    if lo >= 1:
        return f"{lo:.1f}–{hi:.1f} h"
    if hi < 1:
        d = 1 if hi * 60 < 10 else 0
        return f"{lo * 60:.{d}f}–{hi * 60:.{d}f} min"
    return f"{_hours(lo)}–{hi:.1f} h"


def _usd(x: float) -> str:
    return f"${x:,.0f}" if x >= 10 else f"${x:,.2f}"


def inner(u: UncertaintyPlan | None, figure: str) -> str:
    """'P10–P90 240k–290k' for a printed figure ('tokens_per_sec', 'tokens', 'hours', 'usd'); '' where the
    figure has no band."""
    if u is None:
        return ""
    if figure == "hours":
        s = hours_span(*u.hours) if u.hours else ""
    else:
        s = span(getattr(u, figure), {"tokens_per_sec": _count, "tokens": _count, "usd": _usd}[figure])
    return f"P10–P90 {s}" if s else ""


def suffix(u: UncertaintyPlan | None, figure: str) -> str:
    """' (P10–P90 240k–290k)' to follow a printed figure; '' where it has no band."""
    s = inner(u, figure)
    return f" ({s})" if s else ""


def odds_words(u: UncertaintyPlan | None, limited_by: str, total_tokens: int) -> str:
    """The line that says how sure the plan is: its chance to finish and where the band comes from, or why
    there is none."""
    if u is None:
        return "no band (a plan written before issue 29)"
    if u.finish_probability is None:
        return u.basis
    what = {"budget": f"train all {_count(total_tokens)} tokens in the budget",
            "hours": f"train all {_count(total_tokens)} tokens in the hours",
            }.get(limited_by, "finish in the planned hours")
    return f"{u.finish_probability:.0%} likely to {what} ({u.runs} similar runs)"


def relative_words(u: UncertaintyPlan | None, tokens_per_sec: float) -> str:
    """'-16%/+15%' of a figure at P10/P90 (what compare's and the ranking's one-line note print), '-' for none."""
    if u is None or u.tokens_per_sec is None or tokens_per_sec <= 0:
        return "-"
    lo, hi = (x / tokens_per_sec - 1 for x in u.tokens_per_sec)
    return f"{lo:+.0%}/{hi:+.0%}"


def hardware_band(hw: Hardware, *, trainer: str | None, compiled: bool, mfu: float | None = None) -> Band | None:
    """The band of runs of this kind on this hardware (None: no band; `band_note` says why)."""
    prof = hw.profile
    if prof.kind != "gpu" or mfu is not None or prof.mfu_curve or prof.speed is None:
        return None
    return band_for(kind_of(prof.name, trainer, compiled, hw.nodes))


def band_note(hw: Hardware, *, trainer: str | None, compiled: bool, by_steps: bool, mfu: float | None = None) -> str:
    """One line for a table of runs on this hardware: the P10–P90 of every tok/s and tokens figure (hours and cost
    under --steps) relative to the printed one, and where it comes from; or why there is none."""
    prof = hw.profile
    band = hardware_band(hw, trainer=trainer, compiled=compiled, mfu=mfu)
    if band is None:
        if prof.kind == "gpu" and (mfu is not None or prof.mfu_curve or prof.speed is None):
            return "speed from a flat MFU: no P10–P90 band"
        return no_band_words(kind_of(prof.name, trainer, compiled, hw.nodes), prof.name) + ": no P10–P90 band"
    if by_steps:
        return (f"P10–P90: tok/s {band.lo - 1:+.0%}/{band.hi - 1:+.0%}, hours and cost {1 / band.hi - 1:+.0%}/"
                f"{1 / band.lo - 1:+.0%} ({band.basis})")
    return f"P10–P90 tok/s, tokens {band.lo - 1:+.0%}/{band.hi - 1:+.0%}: {band.basis}"


def relative_span(band: Band | None, by_steps: bool) -> str:
    """'-19/+16%': a table row's varying figure at P10/P90 relative to the printed one: tokens under a budget or
    hours, hours and cost under --steps (slower runs take longer); '-' without a band."""
    if band is None:
        return "-"
    lo, hi = (1 / band.hi - 1, 1 / band.lo - 1) if by_steps else (band.lo - 1, band.hi - 1)
    return f"{lo * 100:+.0f}/{hi * 100:+.0f}%"


def band_bounds(band: Band | None, value: float | None, invert: bool = False) -> tuple[float, float] | None:
    """(P10, P90) of a figure: value × the band (value ÷ it for hours and dollars, which shrink as speed grows)."""
    if band is None or value is None:
        return None
    return (value / band.hi, value / band.lo) if invert else (value * band.lo, value * band.hi)


def plan_line(plan: Plan) -> str:
    """A plan's speed-driven figures with their P10–P90 and its odds, on one line (nanoplan validate)."""
    u, tp, b, s = plan.uncertainty, plan.throughput, plan.budget, plan.schedule
    return (f"{tp.tokens_per_sec:,.0f} tokens/s{suffix(u, 'tokens_per_sec')}, {_count(s.total_tokens)} tokens"
            f"{suffix(u, 'tokens')}, {_hours(b.hours)}{' h' if b.hours >= 1 else ''}{suffix(u, 'hours')}, "
            f"{_usd(b.usd)}{suffix(u, 'usd')}; {odds_words(u, b.limited_by, s.total_tokens)}")
