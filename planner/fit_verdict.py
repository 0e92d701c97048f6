"""Does a step fit in a GPU's memory? Three answers, from the allocated peak and calibrated allocator overheads.

    capacity = usable bytes × (1 − headroom) − CUDA context − NCCL buffers (several GPUs)

- fits: the allocated peak plus the caching allocator's fragmentation (profile `overheads.fragmentation`, a
  fraction of the peak) is within capacity;
- tight: the allocations themselves are within capacity, but not with fragmentation: the run may go out of memory
  through fragmentation. PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True lets the allocator grow segments
  instead of leaving holes; a smaller micro-batch, checkpointing or sharding makes room;
- does not fit: the allocated peak alone is over capacity; no allocator setting helps.

The fragmentation is calibrated on public runs: benchmarks/fit_memory.py takes the calibration rows of
benchmarks/public_runs whose max_memory_reserved is published and the planner's allocated peak for each, and
keeps the upper quartile of reserved / allocated − 1 (it includes the planner's own error on trainers that are not
nanoplan's runner). `headroom` is the user's extra margin (PlanRequest.headroom, 0 by default): the
fragmentation is already counted, so a default headroom would count it twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from planner.profiles import Hardware
from planner.units import fmt_bytes

Verdict = Literal["fits", "tight", "does not fit"]
DEFAULT_HEADROOM = 0.0   # the user's extra margin, a fraction of usable memory: the fragmentation is counted already
ALLOC_CONF = "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"


@dataclass(frozen=True)
class FitVerdict:
    verdict: Verdict
    allocated: int        # bytes: the allocated peak per GPU
    reserved: int         # bytes: allocated × (1 + fragmentation), what the caching allocator may hold
    capacity: int         # bytes: usable × (1 − headroom) − context − NCCL
    reason: str           # one sentence with the numbers
    advice: str = ""      # what to change (tight and does not fit)


def capacity_bytes(hw: Hardware, headroom: float = 0.0) -> int:
    """What the allocator can use per GPU: usable memory less the headroom, the CUDA context and NCCL's buffers."""
    prof = hw.profile
    cap = prof.usable_bytes * (1.0 - headroom)
    if prof.kind == "gpu":
        cap -= prof.overheads.cuda_context_bytes + (prof.overheads.nccl_bytes if hw.num_gpus > 1 else 0)
    return int(cap)


def fragmentation(hw: Hardware) -> float:
    return hw.profile.overheads.fragmentation if hw.profile.kind == "gpu" else 0.0


def verdict_for(allocated: int, hw: Hardware, headroom: float = 0.0) -> FitVerdict:
    """fits / tight / does not fit for an allocated peak on `hw` (module docstring)."""
    cap = capacity_bytes(hw, headroom)
    frag = fragmentation(hw)
    reserved = int(allocated * (1.0 + frag))
    where = f"{fmt_bytes(allocated)} allocated"
    if reserved <= cap:
        return FitVerdict("fits", allocated, reserved, cap,
                          f"{where}, {fmt_bytes(reserved)} with {frag:.0%} fragmentation, within {fmt_bytes(cap)}")
    if allocated <= cap:
        return FitVerdict("tight", allocated, reserved, cap,
                          f"{where} fits {fmt_bytes(cap)}, but with {frag:.0%} fragmentation it needs {fmt_bytes(reserved)}",
                          f"it may run out of memory through fragmentation: set {ALLOC_CONF}, or make room with a "
                          "smaller micro-batch, activation checkpointing or a sharded strategy")
    return FitVerdict("does not fit", allocated, reserved, cap, f"{where} > {fmt_bytes(cap)} usable",
                      "use a smaller micro-batch, activation checkpointing, a sharded strategy (zero1/zero2/fsdp), "
                      "more GPUs or a GPU with more memory")
