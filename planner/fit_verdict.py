"""Does a step fit in a GPU's memory? Three answers, from the allocated peak and a margin measured on public runs.

    capacity = usable bytes × (1 − headroom) − CUDA context − NCCL buffers (several GPUs)
    margin   = profile `overheads.fragmentation` × the allocated peak

- fits: the allocated peak plus the margin is within capacity. The search and the planner's own choices (micro-batch,
  strategy, checkpointing) take only these.
- tight: the allocations are within capacity, but not with the margin: a warning, never a refusal. Public runs
  ran here (nanochat's d20 at micro-batch 32 on 80 GB, 73.7 GiB allocated; llm-foundry's MPT-1B at micro-batch 10 on
  A100-40GB) and one went out of memory in another environment (nanochat issue 443). The warning names what
  rescues it: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, where the trainer does not set it itself, then a
  smaller micro-batch, checkpointing or sharding.
- does not fit: the allocated peak alone is over capacity; no allocator setting helps. The only refusal.

Exit codes follow (docs/memory.md): `estimate` and `validate` exit 0 for fits and tight (tight prints its warning),
1 for does not fit, 2 for bad input.

The margin is what the CUDA caching allocator holds beyond the allocations (max_memory_reserved − allocated) plus
the planner's own error on trainers that are not nanoplan's runner: benchmarks/fit_memory.py fits it on the
calibration rows of benchmarks/public_runs that publish max_memory_reserved (mean + 2 sd of reserved / allocated − 1).
Those rows are torchtitan runs of December 2024 (9dec370), whose launcher run_llama_train.sh sets
PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True" (line 22; since a5e57e4, 2024-10-22), so it is the margin *with*
expandable segments; without them PyTorch's allocator may split fixed segments into slivers it cannot reuse
("expandable_segments ... does not create as many slivers of unusable memory", PyTorch, CUDA semantics:
https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf).

Per-trainer allocator defaults (`Allocator`, each trainer's `allocator` in planner/trainers/): nanochat's
base_train.py and torchtitan's run_train.sh set expandable segments themselves, DeepSpeed 0.19.8 and nanoplan's
runner do not. They decide the advice (set it, or it is set already) and, through each trainer's memory, whether
the default micro-batch may be tight (planner/build.py choose_batch). `headroom` is the user's extra margin
(PlanRequest.headroom, 0 by default): the margin is already counted, so a default headroom would count it twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from planner.profiles import Hardware
from planner.units import fmt_bytes

Verdict = Literal["fits", "tight", "does not fit"]
DEFAULT_HEADROOM = 0.0   # the user's extra margin, a fraction of usable memory: the fragmentation is counted already
ALLOC_CONF = "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
ALLOC_DOCS = "https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf"
ROOM = "a smaller micro-batch, activation checkpointing or a sharded strategy"


@dataclass(frozen=True)
class Allocator:
    """How a trainer configures PyTorch's CUDA caching allocator: `sets` says where it turns expandable segments on
    itself ("" when it does not)."""

    trainer: str
    sets: str = ""


RUNNER_ALLOCATOR = Allocator("nanoplan's runner")   # runner/ sets no PYTORCH_CUDA_ALLOC_CONF


@dataclass(frozen=True)
class FitVerdict:
    verdict: Verdict
    allocated: int        # bytes: the allocated peak per GPU
    reserved: int         # bytes: allocated × (1 + margin), what the allocator may hold
    capacity: int         # bytes: usable × (1 − headroom) − context − NCCL
    reason: str           # one sentence with the numbers
    advice: str = ""      # what to change (tight and does not fit)

    @property
    def runs(self) -> bool:
        """Not refused: fits or tight (plan.memory.fits; exit code 0)."""
        return self.verdict != "does not fit"

    def warning(self) -> str:
        """The plan's warning line ('' when it fits)."""
        return "" if self.verdict == "fits" else f"{self.verdict}: {self.reason}; {self.advice}"


def capacity_bytes(hw: Hardware, headroom: float = 0.0) -> int:
    """What the allocator can use per GPU: usable memory less the headroom, the CUDA context and NCCL's buffers."""
    prof = hw.profile
    cap = prof.usable_bytes * (1.0 - headroom)
    if prof.kind == "gpu":
        cap -= prof.overheads.cuda_context_bytes + (prof.overheads.nccl_bytes if hw.num_gpus > 1 else 0)
    return int(cap)


def fragmentation(hw: Hardware) -> float:
    return hw.profile.overheads.fragmentation if hw.profile.kind == "gpu" else 0.0


def tight_advice(alloc: Allocator) -> str:
    """What rescues a tight step: the allocator setting where the trainer does not set it itself, then room."""
    if alloc.sets:
        return (f"it may run out of memory within the planner's margin; {alloc.trainer} already sets "
                f"expandable_segments:True ({alloc.sets}), so make room with {ROOM}")
    return (f"it may run out of memory through fragmentation: set {ALLOC_CONF} (PyTorch's allocator then grows one "
            f"segment instead of leaving unusable slivers; docs/memory.md), or make room with {ROOM}")


def verdict_for(allocated: int, hw: Hardware, headroom: float = 0.0,
                allocator: Allocator = RUNNER_ALLOCATOR) -> FitVerdict:
    """fits / tight / does not fit for an allocated peak on `hw` (module docstring)."""
    cap = capacity_bytes(hw, headroom)
    frag = fragmentation(hw)
    reserved = int(allocated * (1.0 + frag))
    where = f"{fmt_bytes(allocated)} allocated"
    if reserved <= cap:
        return FitVerdict("fits", allocated, reserved, cap,
                          f"{where}, {fmt_bytes(reserved)} with the {frag:.0%} margin, within {fmt_bytes(cap)}")
    if allocated <= cap:
        return FitVerdict("tight", allocated, reserved, cap,
                          f"{where} fits {fmt_bytes(cap)}, but with the {frag:.0%} margin it needs {fmt_bytes(reserved)}",
                          tight_advice(allocator))
    return FitVerdict("does not fit", allocated, reserved, cap, f"{where} > {fmt_bytes(cap)} usable",
                      "use a smaller micro-batch, activation checkpointing, a sharded strategy (zero1/zero2/fsdp), "
                      "more GPUs or a GPU with more memory")
