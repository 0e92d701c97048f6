"""Per-GPU memory at each phase of one training step, part by part: what `estimate --plot` draws.

planner/memory.py keeps, for a plan, each phase's total and the breakdown at the peak only. This takes
every phase's breakdown from the same walk (`planner.memory.phase_breakdowns`), so a chart can show how
parameters, gradients, optimizer state, activations and the loss's temporaries rise and fall over forward, loss, backward and the optimizer step. Each phase's
total equals `plan.memory.phases[phase]` (tests/test_memory_plot.py checks it). The result is plain
data (`as_dict`): the drawing (nanoplan/memory_plot.py) imports no planner.

Only nanoplan's own runner step is walked here; plans for other trainers (planner/trainers/) model
their steps differently and are refused.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from planner.build import step_config
from planner.errors import PlanError
from planner.memory import phase_breakdowns
from planner.plan import Plan
from planner.units import fmt_count

# The walk's phases, in step order, with what a reader calls them.
PHASES: tuple[tuple[str, str], ...] = (
    ("forward_end", "forward"),
    ("backward_start", "loss"),
    ("backward_layers", "backward"),
    ("backward_end", "backward end"),
    ("optimizer_step", "optimizer"),
)
PARTS = ("parameters", "buffers", "gradients", "optimizer_state", "activations", "loss_temporaries", "temporaries")


@dataclass(frozen=True)
class PhaseMemory:
    """One phase's per-GPU bytes, by part (allocated), at that phase's peak."""

    phase: str
    label: str
    parts: dict[str, int]

    @property
    def allocated(self) -> int:
        return sum(self.parts.values())


@dataclass(frozen=True)
class StepMemory:
    """A plan's step, phase by phase, with what the GPU can hold."""

    title: str
    phases: list[PhaseMemory]
    overhead: dict[str, int]          # the profile's fixed terms and fragmentation (constant over the step)
    usable_bytes: int                 # what torch can allocate
    limit_bytes: int                  # usable less the plan's headroom: the fit line
    peak_phase: str
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """Plain data for the drawing: phases (label, parts), overhead, usable and limit bytes, title."""
        return {"title": self.title, "peak_phase": dict(PHASES).get(self.peak_phase, self.peak_phase),
                "phases": [{"label": p.label, "parts": dict(p.parts)} for p in self.phases],
                "overhead": dict(self.overhead), "usable_bytes": self.usable_bytes,
                "limit_bytes": self.limit_bytes, "notes": list(self.notes)}


def step_memory(plan: Plan) -> StepMemory:
    """Every phase's breakdown for the plan's step (nanoplan's runner; the plan's strategy and micro-batch)."""
    req = plan.request
    if req.trainer.name != "nanoplan":
        raise PlanError("--plot", f"draws nanoplan's runner step; this plan is for {req.trainer.name}'s",
                        "drop --plot, or plan with --trainer nanoplan")
    cfg = step_config(req, plan.training.device_batch_size, plan.hardware.num_gpus)
    best = phase_breakdowns(cfg)                 # the walk of planner.memory.estimate, phase by phase
    phases = [PhaseMemory(p, label, {k: best[p].get(k, 0) for k in PARTS}) for p, label in PHASES if p in best]
    mem = plan.memory
    limit = int(mem.usable_bytes * (1 - mem.headroom))
    title = (f"{plan.model.name} ({fmt_count(plan.model.n_params)} params) on {plan.hardware.spec}: micro-batch "
             f"{plan.training.device_batch_size} × {cfg.spec.seq_len:,} tokens, {cfg.strategy}"
             + (", activation checkpointing" if cfg.activation_checkpointing else "")
             + (", compiled" if cfg.compile else ""))
    notes = [] if mem.fits else [f"does not fit: {mem.per_gpu_bytes / 2**30:.2f} GiB > {limit / 2**30:.2f} GiB"]
    return StepMemory(title=title, phases=phases, overhead=dict(mem.overhead), usable_bytes=mem.usable_bytes,
                      limit_bytes=limit, peak_phase=mem.peak_phase, notes=notes)
