"""Per-GPU memory of one runner training step: the public entry, which picks the eager or the compiled model.

`estimate` walks the step for one configuration and returns a breakdown. `allocated_peak`
returns the same peak from cached per-model profiles (every count is linear in N), for the search.
Both walk the eager step (planner/memory_eager.py) or, with `compile` on, the compiled one
(planner/memory_compiled.py), over the vocabulary of planner/memory_terms.py (`StepConfig`,
`MemoryEstimate`, the model's bytes, sharding).

Data parallelism: ddp and zero1 hold one rank's DDP state (gradient_as_bucket_view: a persistent
bucket; under no_sync, fresh gradients beside it). zero2 and fsdp (FSDP2) have no bucket: every
micro-step reduce-scatters into sharded gradients, so they count one sharded copy, never the
bucket's second one. Optimizer state (zero1+), gradients (zero2, fsdp) and parameters (fsdp) are
divided by dp, plus what sharding holds beyond even shares (sharded_extra: fsdp's two gathered
layers, zero2's gathered parameters beside its shard). Under bf16 autocast FSDP2 gathers bf16
weights (memory_terms.fsdp_mixed_precision): no autocast weight copy is cached or saved. An analytic
division; tests/test_shard_state.py checks the runner's real per-rank state.

Checkpointing variants (planner/checkpointing.py): every k-th block, as the step with every block's
saved tensors less what each checkpointed block drops (never below the all-checkpointed step);
op-level (selective-op), as the all-checkpointed step plus what each block keeps beyond its input. The
peak is inside the top block's backward, just after it re-ran its forward, so a checkpointed top block
saves nothing then. Checked against the runner's own trace (tests/test_checkpointing_memory.py).

HSDP is walked as fsdp over its shard group, and tensor parallelism divides every moment of the walk by t, plus
what it leaves whole without sequence parallelism (planner/memory_parallel.py): planned, not run.

Not modelled (the profile's overhead terms; assumptions until measured on a GPU): CUDA
context, NCCL buffers, cuBLAS and flash-attention workspaces, allocator fragmentation.
"""

from __future__ import annotations

import math
from dataclasses import replace
from functools import partial
from typing import Any

from planner.checkpointing import cfg_checkpointed, sac_kept_per_token
from planner.memory_compiled import block_per_token, weight_copies
from planner.memory_compiled import profile as compiled_profile
from planner.memory_compiled import step_walk as compiled_walk
from planner.memory_eager import layer_saved
from planner.memory_eager import profile as eager_profile
from planner.memory_eager import step_walk as eager_walk
from planner.memory_parallel import ACTIVATION_PHASES, data_parallel_view, replicated_bytes, tp_breakdown, tp_peak
from planner.memory_terms import (
    MemoryEstimate,
    ModelBytes,
    StepConfig,
    fsdp_mixed_precision,
    grad_shard,
    model_bytes,
    shard_breakdown,
    state_cut,
)

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
    DDP (ddp, zero1: gradient_as_bucket_view, as runner/train.py wraps it) holds one copy in its bucket
    for the whole run. Under no_sync (every micro-step but the last) autograd keeps fresh gradients
    beside it; the synced micro-step copies them into the bucket and frees them as it goes. With
    two micro-steps the first (bucket + growing fresh grads) or the synced one (two copies,
    shrinking) peaks; with three or more a middle one (two copies throughout) does. zero2 and fsdp
    have no bucket: FSDP2 reduce-scatters each micro-step into the sharded gradients (as one GPU).
    """
    ddp, accum = cfg.dp > 1 and cfg.strategy in ("ddp", "zero1"), cfg.grad_accum_steps
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


def _model(cfg: StepConfig) -> ModelBytes:
    return model_bytes(cfg.spec, cfg.precision, cfg.optimizer, fsdp_mixed_precision(cfg))


def _variant(cfg: StepConfig) -> tuple[str, int]:
    """How the checkpointing is walked: ("plain", 0) for none or every block in full; ("sac", bytes its blocks keep
    beyond their inputs); ("every", bytes the checkpointed blocks drop against keeping everything)."""
    if not cfg.activation_checkpointing:
        return "plain", 0
    m = _model(cfg)
    N = cfg.device_batch_size * cfg.spec.seq_len
    n_ck = cfg_checkpointed(cfg)
    if cfg.ac_policy != "selective-op" and n_ck >= cfg.spec.n_layer:
        return "plain", 0
    # the peak is inside the top block's backward, which has just re-run its forward: when the top block is
    # checkpointed it holds what it would have saved, so one checkpointed block fewer counts
    n_ck -= 1 if cfg.spec.n_layer % max(1, cfg.ac_every) == 0 else 0
    if cfg.ac_policy == "selective-op":
        return "sac", n_ck * sac_kept_per_token(m.D) * N
    D = m.D
    per_block = (block_per_token(D) * N + weight_copies(D)) if cfg.compile else layer_saved(D, N)
    return "every", n_ck * (per_block - D.r * D.d * N)


def _full_ckpt(cfg: StepConfig) -> StepConfig:
    return replace(cfg, ac_policy="full", ac_every=1)


_SAC_PHASES = ACTIVATION_PHASES   # the kept tensors live until their block's backward


def estimate(cfg: StepConfig, overheads: dict[str, int] | None = None,
             fragmentation: float = 0.0, compiled_saved: tuple[int, int | None] | None = None) -> MemoryEstimate:
    """Per-GPU peak bytes of a steady-state training step (see the module docstring).

    compiled_saved (compile on): measured (all saved bytes, one block's) to walk instead of the
    model's own counts; runner.trace uses it for the traced compiled step.
    """
    cfg = data_parallel_view(cfg)
    kind, extra = _variant(cfg)
    rep = _replicated(cfg)
    if kind == "plain":
        phases, best = _walk_all(cfg, compiled_saved, rep=rep)
    elif kind == "sac":
        phases, best = _walk_all(_full_ckpt(cfg), compiled_saved, add=extra, rep=rep)
    else:
        phases, best = _walk_all(replace(cfg, activation_checkpointing=False), compiled_saved, add=-extra, rep=rep)
        full_phases, full_best = _walk_all(_full_ckpt(cfg), compiled_saved, rep=rep)
        phases = {p: max(v, full_phases.get(p, 0)) for p, v in phases.items()}
        if full_best[0] > best[0]:
            best = full_best
    allocated, peak_phase, breakdown = best
    over = dict(overheads or {})
    if fragmentation:
        over["fragmentation"] = int(allocated * fragmentation)
    return MemoryEstimate(breakdown=breakdown, phases=phases, peak_phase=peak_phase,
                          allocated_peak=allocated, overhead=over)


def phase_breakdowns(cfg: StepConfig) -> dict[str, dict[str, int]]:
    """Each phase's breakdown (BREAKDOWN_KEYS) at that phase's peak, walked exactly as `estimate` walks the step:
    each one adds up to `estimate(cfg).phases[phase]` (what `estimate --plot` draws)."""
    cfg = data_parallel_view(cfg)
    kind, extra = _variant(cfg)
    rep = _replicated(cfg)
    by_phase: dict[str, dict[str, int]] = {}
    if kind == "plain":
        _walk_all(cfg, None, by_phase=by_phase, rep=rep)
    elif kind == "sac":
        _walk_all(_full_ckpt(cfg), None, add=extra, by_phase=by_phase, rep=rep)
    else:
        _walk_all(replace(cfg, activation_checkpointing=False), None, add=-extra, by_phase=by_phase, rep=rep)
        _walk_all(_full_ckpt(cfg), None, by_phase=by_phase, rep=rep)
    return by_phase


def _replicated(cfg: StepConfig) -> int:
    """Activation bytes tensor parallelism without sequence parallelism leaves whole (planner/memory_parallel.py)."""
    return replicated_bytes(cfg, _model(cfg).D, cfg.device_batch_size * cfg.spec.seq_len) if cfg.tp > 1 else 0


def _walk_all(cfg: StepConfig, compiled_saved: tuple[int, int | None] | None, add: int = 0,
              by_phase: dict[str, dict[str, int]] | None = None,
              rep: int = 0) -> tuple[dict[str, int], tuple[int, str, dict[str, int]]]:
    """Every scenario's walk: each phase's total and the peak (total, phase, breakdown); `add` bytes of
    activations join the phases in which a block's saved tensors are alive. `by_phase`, when given, keeps
    each phase's largest breakdown (a larger one already there is kept). Under tensor parallelism (cfg.tp) each
    moment is divided by t, plus `rep` replicated activation bytes while the blocks' saved tensors are alive."""
    spec = cfg.spec
    m = _model(cfg)
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
            if add and phase in _SAC_PHASES:
                breakdown["activations"] = max(0, breakdown["activations"] + add)
            if cfg.strategy != "ddp" and dp > 1:
                breakdown = shard_breakdown(breakdown, cfg.strategy, dp, spec, m.D.w, m.D.mp)
            if cfg.tp > 1:
                breakdown = tp_breakdown(breakdown, cfg.tp, rep if phase in _SAC_PHASES else 0)
            total = sum(breakdown.values())
            phases[phase] = max(phases.get(phase, 0), total)
            if by_phase is not None and total > sum(by_phase.get(phase, {}).values(), -1):
                by_phase[phase] = breakdown
            if total > best[0]:
                best = (total, phase, breakdown)
    return phases, best


def allocated_peak(cfg: StepConfig) -> int:
    """`estimate(cfg).allocated_peak`, fast: per-model profiles are cached, so a search that
    varies micro-batch, strategy and checkpointing pays a few microseconds per candidate."""
    cfg = data_parallel_view(cfg)
    kind, extra = _variant(cfg)
    rep = _replicated(cfg)
    if kind == "sac":
        return _peak(_full_ckpt(cfg), extra, rep)
    if kind == "every":
        return max(_peak(_full_ckpt(cfg), 0, rep), _peak(replace(cfg, activation_checkpointing=False), -extra, rep))
    return _peak(cfg, 0, rep)


def _peak(cfg: StepConfig, add: int = 0, rep: int = 0) -> int:
    spec = cfg.spec
    m = _model(cfg)
    N = cfg.device_batch_size * spec.seq_len
    chunk, n_chunks = _chunking(cfg)
    shard = grad_shard(cfg)
    best_act = best_other = 0       # the peak while the blocks' saved tensors are alive, and at the other moments
    for base_grads, mode in _scenarios(cfg, m.params):
        profile = (compiled_profile(m, cfg.activation_checkpointing, chunk, n_chunks == 2, mode, base_grads // shard, shard)
                   if cfg.compile else
                   eager_profile(spec, cfg.precision, cfg.optimizer, cfg.activation_checkpointing, chunk,
                                 n_chunks == 2, mode, base_grads // shard, shard, m.D.mp))
        for phase, lines in profile:
            act = phase in _SAC_PHASES
            plus = add if act else 0
            for a0, b0 in lines:
                v = a0 + b0 * N + plus
                if act and v > best_act:
                    best_act = v
                elif not act and v > best_other:
                    best_other = v
    cut = state_cut(m, cfg.strategy, max(1, cfg.dp), m.D.w, spec, m.D.mp)
    return tp_peak(best_act - cut, best_other - cut, cfg.tp, rep)
