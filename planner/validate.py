"""Check plan.json files: re-derive every number, check the fit, optionally trace the real step.

Used by `nanoplan validate` (and CI). Pure Python: a trace of the real step is passed in as
`tracer` (the CLI passes runner.trace.trace_memory), so the planner never imports the runner.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Protocol

from planner.build import hardware_of, memory_of, rederive, step_config, verdict_of
from planner.errors import PlanError
from planner.fit_verdict import DEFAULT_HEADROOM
from planner.memory_terms import StepConfig
from planner.plan import Plan, load_plan
from planner.profiles import builtin_profiles
from planner.trainers import trainer_for
from planner.uncertainty import plan_line
from planner.units import fmt_bytes

TRACE_TOLERANCE = 0.03          # analytic vs traced allocated peak (benchmarks/results/memory_accuracy.md)
PROFILE_MEMORY_FIELDS = ("memory_gb", "usable_bytes", "overheads")


class Traced(Protocol):
    """What a tracer returns (runner.trace.TracedMemory has these)."""

    peak_bytes: int
    seconds: float
    note: str


Tracer = Callable[[StepConfig], Traced]


@dataclass
class PlanCheck:
    """The verdict on one plan. Bytes are per GPU."""

    path: str
    name: str
    gpu: str
    fits: bool
    consistent: bool
    analytic_peak_bytes: int           # allocated peak of the re-derived step (comparable with the trace)
    per_gpu_bytes: int                 # + fixed overheads and fragmentation: what must fit
    capacity_bytes: int                # usable × (1 − headroom)
    headroom: float
    verdict: str = "fits"              # fits / tight / does not fit (planner.fit_verdict); fits is false only for the last
    traced_peak_bytes: int | None = None
    traced_per_gpu_bytes: int | None = None
    trace_error: float | None = None   # analytic / traced − 1
    trace_note: str = ""
    trace_seconds: float | None = None
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)   # tight: printed, not a failure
    # the re-derived plan's P10–P90 band (plan.json `uncertainty`) and its figures on one line (planner/uncertainty.py)
    uncertainty: dict[str, Any] | None = None
    band_line: str = ""

    @property
    def ok(self) -> bool:
        return self.fits and self.consistent and not self.problems

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def _profile_drift(plan: Plan) -> list[str]:
    """Memory figures of the plan's embedded profile that differ from the built-in profile."""
    prof = plan.request.profile
    builtin = builtin_profiles().get(prof.name)
    if builtin is None:
        return []
    out = []
    for f in PROFILE_MEMORY_FIELDS:
        mine, theirs = getattr(prof, f), getattr(builtin, f)
        if mine != theirs:
            out.append(f"request.profile.{f}: plan says {_plain(mine)!r}, built-in profile {prof.name} says "
                       f"{_plain(theirs)!r} (rebuild the plan, or give the edited profile a name of its own)")
    return out


def _plain(v: Any) -> Any:
    return v.model_dump() if hasattr(v, "model_dump") else v


def plan_step_config(plan: Plan) -> StepConfig:
    """The step the plan runs on each GPU (from its request and chosen micro-batch)."""
    hw = hardware_of(plan.request)
    return step_config(plan.request, plan.training.device_batch_size, hw.num_gpus)


def check_plan(plan: Plan, path: str, *, headroom: float = DEFAULT_HEADROOM, tracer: Tracer | None = None) -> PlanCheck:
    """Re-derive `plan`, check it fits with `headroom`, and with a `tracer` hold it against a trace."""
    try:
        fresh, problems = rederive(plan)
    except PlanError as e:
        raise PlanError(path, f"its request cannot be rebuilt: {e}", "regenerate it with nanoplan estimate --out") from None
    problems = [f"stale or edited: {p}" for p in problems] + _profile_drift(plan)
    hw = hardware_of(fresh.request)
    problems += trainer_problems(fresh, hw.num_gpus, hw.nodes, hw.profile.kind)
    consistent = not problems
    cfg = plan_step_config(fresh)
    mem = memory_of(cfg, hw, fresh.request.trainer)
    capacity = int(hw.profile.usable_bytes * (1.0 - headroom))
    v = verdict_of(fresh.request, mem, hw, headroom)
    warnings = [v.warning()] if v.verdict == "tight" else []
    if not v.runs:
        problems.append(f"does not fit: {v.reason} ({hw.profile.name}, {headroom:.0%} headroom); {v.advice}")
    check = PlanCheck(path=path, name=fresh.model.name, gpu=fresh.hardware.spec, fits=v.runs, consistent=consistent,
                      analytic_peak_bytes=mem.allocated_peak, per_gpu_bytes=mem.total, capacity_bytes=capacity,
                      headroom=headroom, verdict=v.verdict, problems=problems, warnings=warnings,
                      uncertainty=fresh.uncertainty.model_dump(mode="json") if fresh.uncertainty else None,
                      band_line=plan_line(fresh))
    if tracer is not None and trainer_for(fresh.request.trainer) is not None:
        check.trace_note = (f"not traced: --trace runs nanoplan's runner step, and this plan models "
                            f"{fresh.request.trainer.name}'s")
    elif tracer is not None:
        fixed = sum(x for k, x in mem.overhead.items() if k != "fragmentation")
        frag = hw.profile.overheads.fragmentation if "fragmentation" in mem.overhead else 0.0
        t = tracer(cfg)
        _add_trace(check, t, fixed, frag)
        traced = verdict_of(fresh.request, replace(mem, allocated_peak=t.peak_bytes), hw, headroom)
        if not traced.runs:
            check.fits = False
            check.verdict = traced.verdict
            check.problems.append(f"does not fit per the trace: {traced.reason}")
        elif traced.verdict == "tight" and check.verdict == "fits":
            check.warnings.append(f"tight per the trace: {traced.reason}; {traced.advice}")
    return check


def trainer_problems(plan: Plan, num_gpus: int, nodes: int, gpu_kind: str) -> list[str]:
    """What the plan's trainer cannot express (a plan edited by hand, or made by an older nanoplan)."""
    ref = plan.request.trainer
    tr = trainer_for(ref)
    if tr is None:
        return []
    try:
        v = tr.version(ref.version).key
    except PlanError as e:
        return [f"trainer: {e.problem}"]
    return [f"trainer {tr.name} {v}: {field}: {why}" for field, why, _ in tr.problems(plan.request, num_gpus, nodes,
                                                                                      gpu_kind)]


def _add_trace(check: PlanCheck, t: Traced, fixed: int, frag: float) -> None:
    """Compare with the traced step (check_plan then gives the traced peak its own verdict)."""
    check.traced_peak_bytes = t.peak_bytes
    check.trace_seconds = round(t.seconds, 2)
    check.trace_note = t.note
    check.trace_error = check.analytic_peak_bytes / t.peak_bytes - 1.0
    check.traced_per_gpu_bytes = t.peak_bytes + fixed + int(t.peak_bytes * frag)
    if abs(check.trace_error) > TRACE_TOLERANCE:
        check.problems.append(f"memory model off by {check.trace_error:+.1%} against the traced step "
                              f"({fmt_bytes(check.analytic_peak_bytes)} analytic vs {fmt_bytes(t.peak_bytes)} traced)")


def validate_paths(paths: list[str], *, headroom: float = DEFAULT_HEADROOM, tracer: Tracer | None = None) -> list[PlanCheck]:
    """Load every plan first (a malformed one raises PlanError: exit 2), then check each."""
    if not 0 <= headroom < 1:
        raise PlanError("--headroom", f"must be in [0, 1), got {headroom}")
    plans = [(str(p), load_plan(p)) for p in paths]
    return [check_plan(plan, p, headroom=headroom, tracer=tracer) for p, plan in plans]


def exit_code(checks: list[PlanCheck]) -> int:
    """0 when every plan fits or is tight (a warning) and is consistent; 1 when one does not fit or is inconsistent."""
    return 0 if all(c.ok for c in checks) else 1


__all__ = ["PlanCheck", "check_plan", "exit_code", "plan_step_config", "validate_paths"]
