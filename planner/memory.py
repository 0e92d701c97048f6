"""Per-GPU memory model of one runner training step, with a breakdown and a timeline.

The peak is taken over the phases of a steady-state step (the second one, when the
optimizer state exists), not as a plain sum:

- forward end / backward start: params + optimizer state + persistent grads + autocast's
  bf16 weight copies + all saved activations + the loss's saved tensors and its backward
  temporaries. This is usually the peak (DESIGN.md s3).
- optimizer step: params + grads + optimizer state + the optimizer's temporaries.

Saved-activation byte counts follow the operations of runner/model.py (one term per saved
tensor, see `layer_activation_bytes`); tests/test_trace_accuracy.py holds them against a
MemTracker trace of the real step. Fixed overheads (CUDA context, NCCL, fragmentation) come
from the profile and are assumptions until calibrated on a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from planner.counts import matmul_params, matrix_params, n_params
from planner.spec import ModelSpec

Precision = Literal["bf16-autocast", "bf16", "fp32"]
Optimizer = Literal["adamw", "muon"]
Strategy = Literal["ddp", "zero1", "zero2", "fsdp"]
STRATEGIES: tuple[Strategy, ...] = ("ddp", "zero1", "zero2", "fsdp")


@dataclass(frozen=True)
class StepConfig:
    """What the runner does in one step; everything the memory model depends on."""

    spec: ModelSpec
    device_batch_size: int
    grad_accum_steps: int = 1
    dp: int = 1
    precision: Precision = "bf16-autocast"
    optimizer: Optimizer = "adamw"
    strategy: Strategy = "ddp"
    activation_checkpointing: bool = False
    loss_chunk_tokens: int = 0


@dataclass
class MemoryEstimate:
    """Bytes per GPU. `breakdown` is at the peak phase; `phases` gives each phase's total."""

    breakdown: dict[str, int]
    phases: dict[str, int]
    peak_phase: str
    allocated_peak: int
    overhead: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return self.allocated_peak + sum(self.overhead.values())


def _bytes(precision: Precision) -> tuple[int, int, int]:
    """(weight bytes, matmul activation bytes, residual-stream bytes)."""
    if precision == "bf16-autocast":
        return 4, 2, 4
    if precision == "bf16":
        return 2, 2, 2
    return 4, 4, 4


def layer_activation_bytes(spec: ModelSpec, precision: Precision) -> int:
    """Saved bytes per token for one block in eager mode, from runner/model.py's ops."""
    _, a, r = _bytes(precision)
    d, hd = spec.d_model, spec.head_dim
    q, kv = spec.n_head * hd, spec.n_kv_head * hd
    total = 0
    # attention sub-block
    total += r * d                    # norm1 saves its input (the residual stream)
    total += a * d                    # qkv linear saves its (cast) input
    total += a * (q + 2 * kv)         # qkv output buffer, kept alive by the v view used in SDPA
    if spec.pos == "rotary":
        total += a * (q + kv)         # rotated q, k (cat outputs)
    if spec.qk_norm:
        total += r * (q + kv)         # rms_norm output (fp32 under autocast), cast again for SDPA
        total += a * (q + kv)
    total += a * q + 4 * spec.n_head  # SDPA output and logsumexp
    total += a * q                    # proj input (contiguous copy of the attention output)
    # MLP sub-block
    total += r * d + a * d            # norm2 input, fc cast input
    total += (4 if spec.mlp == "swiglu" else 2) * a * spec.d_ff
    if spec.norm == "layernorm":
        total += 2 * 8                # mean and rstd per token, two norms
    return total


def loss_bytes(spec: ModelSpec, tokens: int, chunk: int, precision: Precision) -> tuple[int, int]:
    """(saved bytes at forward end, extra temporaries at the start of backward)."""
    _, a, r = _bytes(precision)
    V = spec.vocab_size
    per_tok_saved = 4 * V * (2 if spec.logit_softcap else 1)   # tanh out + log_softmax out (fp32)
    per_tok_grad = 4 * V * 2                                  # two fp32 grads in flight
    if chunk <= 0 or chunk >= tokens:
        return tokens * per_tok_saved, tokens * per_tok_grad
    # chunked: only the chunk inputs are saved; backward recomputes one chunk at a time
    return 0, chunk * (per_tok_saved + per_tok_grad + a * V)


def estimate(cfg: StepConfig, overheads: dict[str, int] | None = None,
             fragmentation: float = 0.0) -> MemoryEstimate:
    """Per-GPU peak bytes of a steady-state training step."""
    spec = cfg.spec
    w, a, r = _bytes(cfg.precision)
    P = n_params(spec)
    shard_params = cfg.strategy == "fsdp"
    shard_grads = cfg.strategy in ("zero2", "fsdp")
    shard_opt = cfg.strategy in ("zero1", "zero2", "fsdp")
    dp = max(1, cfg.dp)

    params = P * w // (dp if shard_params else 1)
    grads = P * w // (dp if shard_grads else 1)
    if cfg.optimizer == "adamw":
        opt_elems = 2 * P
    else:
        M = matrix_params(spec)
        opt_elems = M + 2 * (P - M)     # Muon momentum for matrices, AdamW m and v for the rest
    opt = opt_elems * w // (dp if shard_opt else 1)

    tokens = cfg.device_batch_size * spec.seq_len
    L = spec.n_layer
    layer = layer_activation_bytes(spec, cfg.precision) * tokens
    block_input = r * spec.d_model * tokens
    if cfg.activation_checkpointing:
        acts = L * block_input + layer      # block inputs, plus one block recomputed in backward
    else:
        acts = L * layer
    acts += r * spec.d_model * tokens       # final norm input
    loss_saved, loss_tmp = loss_bytes(spec, tokens, cfg.loss_chunk_tokens, cfg.precision)
    cast_cache = 2 * matmul_params(spec) if cfg.precision == "bf16-autocast" else 0
    if shard_params:
        cast_cache //= dp
        # two gathered layers in flight (current and prefetched), at compute precision
        per_layer = (P - spec.vocab_size * spec.d_model * (1 if spec.tied else 2)) // max(L, 1)
        gathered = 2 * per_layer * a
    else:
        gathered = 0

    grads_persist = grads if (cfg.grad_accum_steps > 1 or (dp > 1 and cfg.strategy == "ddp")) else 0
    fwd_end = params + opt + grads_persist + cast_cache + acts + loss_saved + gathered
    bwd_start = fwd_end + loss_tmp
    step = params + grads + opt
    phases = {"forward_end": fwd_end, "backward_start": bwd_start, "optimizer_step": step}
    peak_phase = max(phases, key=lambda k: phases[k])
    if peak_phase == "optimizer_step":
        breakdown = {"parameters": params, "gradients": grads, "optimizer_state": opt,
                     "activations": 0, "loss_temporaries": 0, "step_temporaries": 0}
    else:
        breakdown = {"parameters": params, "gradients": grads_persist, "optimizer_state": opt,
                     "activations": acts, "loss_temporaries": loss_saved + loss_tmp,
                     "step_temporaries": cast_cache + gathered}
    allocated = phases[peak_phase]
    over = dict(overheads or {})
    if fragmentation:
        over["fragmentation"] = int(allocated * fragmentation)
    return MemoryEstimate(breakdown=breakdown, phases=phases, peak_phase=peak_phase,
                          allocated_peak=allocated, overhead=over)
