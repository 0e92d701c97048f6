"""Per-GPU memory of one runner training step: the public entry, which picks the eager or the compiled model.

`estimate` walks the step for one configuration and returns a breakdown. `allocated_peak`
returns the same peak from cached per-model profiles (every count is linear in N), for the search.
Both walk the eager step (planner/memory_eager.py) or, with `compile` on, the compiled one
(planner/memory_compiled.py), over the vocabulary of planner/memory_terms.py (`StepConfig`,
`MemoryEstimate`, the model's bytes, sharding).

Data parallelism: one rank's DDP state (gradient_as_bucket_view: a persistent bucket; under
no_sync, fresh gradients beside it). zero1/zero2/fsdp: the DDP-state step with optimizer state
(zero1+), gradients (zero2, fsdp) and parameters (fsdp) divided by dp, plus what sharding
holds beyond even shares (sharded_extra: fsdp's two gathered layers, zero2's gathered
parameters beside its shard). An analytic division; tests/test_shard_state.py checks the
runner's real per-rank state.

Not modelled (the profile's overhead terms; assumptions until measured on a GPU): CUDA
context, NCCL buffers, cuBLAS and flash-attention workspaces, allocator fragmentation.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any

from planner.memory_compiled import profile as compiled_profile
from planner.memory_compiled import step_walk as compiled_walk
from planner.memory_eager import profile as eager_profile
from planner.memory_eager import step_walk as eager_walk
from planner.memory_terms import MemoryEstimate, StepConfig, grad_shard, model_bytes, shard_breakdown, state_cut

# Tokens per chunk of the runner's chunked loss, by default. Each chunk holds about four fp32
# (chunk × vocab) tensors at its backward's peak (`_loss_chunk_bw` in planner/memory_backward.py):
# 1 GiB at V=65,536, where 4096 held 4 GiB. The total recompute FLOPs do not depend on the chunk;
# each chunk adds a few kernel launches (planner/throughput.py KERNELS_PER_LOSS_CHUNK), +0.1% of a
# d20 B32 step.
DEFAULT_LOSS_CHUNK_TOKENS = 1024

BREAKDOWN_KEYS = ("parameters", "buffers", "gradients", "optimizer_state", "activations",
                  "loss_temporaries", "temporaries")


def _scenarios(cfg: StepConfig, grads: int) -> tuple[tuple[int, str], ...]:
    """The micro-steps that can peak: (gradient bytes alive before the backward, grad mode).

    dp=1 without accumulation: backward makes the gradients (fresh), so they grow as it goes.
    With accumulation a later micro-step adds into gradients that already exist, never lower.
    DDP (gradient_as_bucket_view, as runner/train.py wraps it) holds one copy in its bucket for
    the whole run. Under no_sync (every micro-step but the last) autograd keeps fresh gradients
    beside it; the synced micro-step copies them into the bucket and frees them as it goes. With
    two micro-steps the first (bucket + growing fresh grads) or the synced one (two copies,
    shrinking) peaks; with three or more a middle one (two copies throughout) does.
    """
    ddp, accum = cfg.dp > 1, cfg.grad_accum_steps
    if not ddp:
        return ((0, "fresh"),) if accum <= 1 else ((grads, "add"),)
    if accum <= 1:
        return ((grads, "add"),)
    if accum == 2:
        return ((grads, "fresh"), (2 * grads, "sync"))
    return ((2 * grads, "add"),)


def _chunking(cfg: StepConfig) -> tuple[int, int]:
    N = cfg.device_batch_size * cfg.spec.seq_len
    chunk = cfg.loss_chunk_tokens if 0 < cfg.loss_chunk_tokens < N else 0
    return chunk, (math.ceil(N / chunk) if chunk else 0)


def estimate(cfg: StepConfig, overheads: dict[str, int] | None = None,
             fragmentation: float = 0.0, compiled_saved: tuple[int, int | None] | None = None) -> MemoryEstimate:
    """Per-GPU peak bytes of a steady-state training step (see the module docstring).

    compiled_saved (compile on): measured (all saved bytes, one block's) to walk instead of the
    model's own counts; runner.trace uses it for the traced compiled step.
    """
    spec = cfg.spec
    m = model_bytes(spec, cfg.precision, cfg.optimizer)
    N = cfg.device_batch_size * spec.seq_len
    chunk, n_chunks = _chunking(cfg)
    dp = max(1, cfg.dp)
    phases: dict[str, int] = {}
    best: tuple[int, str, dict[str, int]] = (-1, "", {})
    shard = grad_shard(cfg)
    if cfg.compile:
        walk: Any = partial(compiled_walk, saved=compiled_saved)
    else:
        walk = eager_walk
    for base_grads, mode in _scenarios(cfg, m.params):
        moments = walk(m, N, cfg.activation_checkpointing, chunk, n_chunks, mode, base_grads // shard, shard)
        for phase, (level, kinds) in moments.items():
            breakdown = {key: int(kinds.get(key, 0)) for key in BREAKDOWN_KEYS}
            breakdown["temporaries"] += level - sum(breakdown.values())
            if cfg.strategy != "ddp" and dp > 1:
                breakdown = shard_breakdown(breakdown, cfg.strategy, dp, spec, m.D.w)
            total = sum(breakdown.values())
            phases[phase] = max(phases.get(phase, 0), total)
            if total > best[0]:
                best = (total, phase, breakdown)
    allocated, peak_phase, breakdown = best
    over = dict(overheads or {})
    if fragmentation:
        over["fragmentation"] = int(allocated * fragmentation)
    return MemoryEstimate(breakdown=breakdown, phases=phases, peak_phase=peak_phase,
                          allocated_peak=allocated, overhead=over)


def allocated_peak(cfg: StepConfig) -> int:
    """`estimate(cfg).allocated_peak`, fast: per-model profiles are cached, so a search that
    varies micro-batch, strategy and checkpointing pays a few microseconds per candidate."""
    spec = cfg.spec
    m = model_bytes(spec, cfg.precision, cfg.optimizer)
    N = cfg.device_batch_size * spec.seq_len
    chunk, n_chunks = _chunking(cfg)
    shard = grad_shard(cfg)
    best = 0
    for base_grads, mode in _scenarios(cfg, m.params):
        profile = (compiled_profile(m, cfg.activation_checkpointing, chunk, n_chunks == 2, mode, base_grads // shard, shard)
                   if cfg.compile else
                   eager_profile(spec, cfg.precision, cfg.optimizer, cfg.activation_checkpointing, chunk,
                                 n_chunks == 2, mode, base_grads // shard, shard))
        for _phase, lines in profile:
            for a0, b0 in lines:
                v = a0 + b0 * N
                if v > best:
                    best = v
    return best - state_cut(m, cfg.strategy, max(1, cfg.dp), m.D.w, spec)
