"""Per-GPU memory model of one runner training step, calibrated against traces of the real step.

The model replays, tensor by tensor, the allocations and frees of the runner's step
(runner/model.py, runner/step.py) as runner/trace.py measures them with MemTracker under
FakeTensorMode, with CUDA kernel semantics (CUDA's autocast policy, fused rms_norm, flash
attention). Every byte count names the tensor it stands for. Notation: N tokens per
micro-batch (B·T), d width, f MLP width, q = n_head·head_dim, kv = n_kv_head·head_dim, V
vocabulary, H/KV head counts; a = bytes of matmul activations (2 under bf16, 4 in fp32),
w = bytes of parameters and gradients, r = bytes of the residual stream (`residual_bytes`: bf16
under bf16 autocast, as runner/model.py casts the embedding's output), nx = bytes of a norm's
input copy and output (fp32 under autocast: CUDA runs norms in fp32; else r).

The peak is the largest of these phases of a steady-state step (the optimizer state exists):

- forward_end: everything saved plus the loss forward's fp32 logit-sized tensors (and, with
  activation checkpointing under autocast, every layer's cached bf16 weight copies).
- backward_start: the loss's backward. Saved activations of every layer + the loss's saved
  logit-sized tensors + two more in flight (grads of nll_loss and log_softmax); with the
  chunked loss, one chunk recomputed plus the head and input gradients accumulated so far.
- backward_layers: inside a block's backward at the top (all activations alive) or bottom
  (all gradients made) of the stack; the block's transients come from walking its backward.
- backward_end: the embedding backward, when every gradient exists.
- optimizer_step: parameters + gradients + optimizer state + the optimizer's temporaries.

"params + grads + Adam + activations" is the wrong shape: at backward start the gradients do
not exist yet (unless accumulated or held in DDP's bucket).

Data parallelism: one rank's DDP state (gradient_as_bucket_view: a persistent bucket; under
no_sync, fresh gradients beside it). zero1/zero2/fsdp: the DDP-state step with optimizer state
(zero1+), gradients (zero2, fsdp) and parameters (fsdp) divided by dp, plus what sharding
holds beyond even shares (sharded_extra: fsdp's two gathered layers, zero2's gathered
parameters beside its shard). An analytic division; tests/test_shard_state.py checks the
runner's real per-rank state.

Not modelled (the profile's overhead terms; assumptions until measured on a GPU): CUDA
context, NCCL buffers, cuBLAS and flash-attention workspaces, allocator fragmentation.

`estimate` walks the step for one configuration and returns a breakdown. `allocated_peak`
returns the same peak from cached per-model profiles (every count is linear in N), for the search.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Literal

from planner.counts import attn_weight_params, mlp_weight_params, n_params, norm_params, param_counts
from planner.spec import ModelSpec

Precision = Literal["bf16-autocast", "bf16", "fp32"]
Optimizer = Literal["adamw", "muon"]
Strategy = Literal["ddp", "zero1", "zero2", "fsdp"]
STRATEGIES: tuple[Strategy, ...] = ("ddp", "zero1", "zero2", "fsdp")

F32 = 4          # fp32 bytes: losses, rstd/mean statistics, autocast's fp32 ops
I64 = 8          # token ids

# Tokens per chunk of the runner's chunked loss, by default. Each chunk holds about four fp32
# (chunk × vocab) tensors at its backward's peak (`_loss_chunk_bw`): 1 GiB at V=65,536, where 4096
# held 4 GiB. The total recompute FLOPs do not depend on the chunk; each chunk adds a few kernel
# launches (planner/throughput.py KERNELS_PER_LOSS_CHUNK), +0.1% of a d20 B32 step.
DEFAULT_LOSS_CHUNK_TOKENS = 1024

BREAKDOWN_KEYS = ("parameters", "buffers", "gradients", "optimizer_state", "activations",
                  "loss_temporaries", "temporaries")


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
    compile: bool = False       # torch.compile: planner.memory_compiled's model of the compiled step


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
        return 4, 2, 2       # fp32 master weights; bf16 matmuls and residual stream (runner/model.py)
    if precision == "bf16":
        return 2, 2, 2
    return 4, 4, 4


def residual_bytes(precision: Precision) -> int:
    """Bytes per element of the residual stream between blocks: the one input every residual
    term of the memory model (eager here, compiled in planner/memory_compiled.py) reads, as `_Dims.r`."""
    return _bytes(precision)[2]


@dataclass(frozen=True)
class _Dims:
    d: int
    f: int
    q: int
    kv: int
    H: int
    KV: int
    hd: int
    T: int
    V: int
    w: int
    a: int
    r: int              # residual stream bytes (residual_bytes)
    nx: int             # a norm's saved input copy and its output: fp32 under autocast, else r
    ac: bool            # bf16 autocast: fp32 weights cast to bf16 per matmul, cached and saved
    mlp: str
    ln: bool            # LayerNorm (mean + rstd) rather than RMSNorm (rstd)
    norm_w: bool        # the norm has a weight
    rotary: bool
    qk_norm: bool
    softcap: bool
    tied: bool
    bias: bool
    learned_pos: bool


def _dims(spec: ModelSpec, precision: Precision) -> _Dims:
    w, a, r = _bytes(precision)
    return _Dims(
        d=spec.d_model, f=spec.d_ff, q=spec.n_head * spec.head_dim, kv=spec.n_kv_head * spec.head_dim,
        H=spec.n_head, KV=spec.n_kv_head, hd=spec.head_dim, T=spec.seq_len, V=spec.vocab_size,
        w=w, a=a, r=r, nx=F32 if precision == "bf16-autocast" else r, ac=precision == "bf16-autocast",
        mlp=spec.mlp, ln=spec.norm == "layernorm",
        norm_w=spec.norm != "rmsnorm_noweight", rotary=spec.pos == "rotary", qk_norm=spec.qk_norm,
        softcap=spec.logit_softcap is not None, tied=spec.tied, bias=spec.bias,
        learned_pos=spec.pos == "learned",
    )


# --------------------------------------------------------------------------- saved activations

def _stats(D: _Dims) -> int:
    """Per-row statistics a norm saves: rstd (RMSNorm) or mean and rstd (LayerNorm), fp32."""
    return 2 * F32 if D.ln else F32


def _qk_saved(D: _Dims) -> int:
    """Bytes per token saved between the qkv projection and attention, for q and k."""
    qk = D.q + D.kv
    if D.qk_norm:
        # the norm's input: an fp32 copy under autocast (CUDA runs rms_norm in fp32), else the
        # rotary output (or a view of the qkv buffer); its rstd per head; its output as SDPA sees it
        inp = F32 if D.ac else (D.a if D.rotary else 0)
        return inp * qk + F32 * (D.H + D.KV) + D.a * qk
    if D.rotary:
        return D.a * qk          # rotated q and k (torch.cat outputs) saved by SDPA
    return 0                     # q and k are views of the qkv buffer


def _mlp_saved(D: _Dims) -> int:
    f, a = D.f, D.a
    if D.mlp == "relu2":
        # relu output (for relu's backward); square runs in fp32 under CUDA autocast (pow is on
        # its fp32 list), which saves an fp32 copy; the square as proj's input (bf16 cast)
        return a * f + (F32 * f if D.ac else 0) + a * f
    if D.mlp == "gelu":
        return 2 * a * f         # fc output (gelu's input), gelu output (proj's input)
    return 4 * a * f             # fc output (gate and up), silu output, product (proj's input)


def layer_activation_bytes(spec: ModelSpec, precision: Precision) -> int:
    """Bytes per token one block saves for backward (eager, no recompute), from runner/model.py.

    Per-layer constants (the rotary tables cast to bf16 and, under autocast, the bf16 weight
    copies) are not per token and are left out here; `estimate` adds them.
    """
    return _layer_per_token(_dims(spec, precision))


def _layer_per_token(D: _Dims) -> int:
    a, d = D.a, D.d
    return (2 * D.nx * d                  # norm1/norm2 inputs: the residuals, or their fp32 copies under autocast
            + 2 * _stats(D)               # norm1, norm2 statistics
            + 2 * a * d                   # norm outputs as qkv and fc take them (bf16 casts)
            + a * (D.q + 2 * D.kv)        # qkv output: v, a view, keeps the whole buffer alive
            + _qk_saved(D)
            + a * D.q + F32 * D.H         # attention output and logsumexp (flash attention)
            + _mlp_saved(D))


def _rope_casts(D: _Dims) -> int:
    """apply_rotary casts cos and sin to q's dtype, for q and for k: 4 × T·hd/2 per layer."""
    return 2 * D.T * D.hd * D.a if D.rotary and D.a != F32 else 0


def _block_weights(D: _Dims) -> int:
    n_in = 2 if D.mlp == "swiglu" else 1
    return D.d * (D.q + 2 * D.kv) + D.q * D.d + (n_in + 1) * D.d * D.f


def _recomputed(D: _Dims, N: Any) -> Any:
    """What a checkpointed block's recomputed forward saves beyond the checkpoint's saved input:
    everything, less that input when norm1 saves the residual itself (no fp32 copy)."""
    return _layer_saved(D, N) - (D.r * D.d * N if D.nx == D.r else 0)


def _rb(D: _Dims) -> bool:
    """A bf16 residual under autocast: norms upcast it (a copy, cast back in backward)."""
    return D.ac and D.r != D.nx


def _layer_saved(D: _Dims, N: int) -> int:
    """One block's saved bytes for N tokens, with its per-layer constants."""
    casts = 2 * _block_weights(D) if D.ac else 0      # bf16 weight copies (autocast cache, saved by mm)
    return _layer_per_token(D) * N + _rope_casts(D) + casts


# --------------------------------------------------------------------------- the backward walk

class _Walk:
    """A running allocation level with its peak; `kinds` (optional) splits the level by kind
    and is copied at each new peak. `shard`: the data-parallel degree gradients are sharded
    over (zero2, fsdp), else 1."""

    __slots__ = ("level", "peak", "kinds", "at_peak", "shard")

    def __init__(self, level: int, kinds: dict[str, int] | None = None, shard: int = 1) -> None:
        self.level = level
        self.peak = level
        self.kinds = dict(kinds) if kinds is not None else None
        self.at_peak = dict(kinds) if kinds is not None else {}
        self.shard = shard

    def alloc(self, n: int, kind: str = "temporaries") -> None:
        self.level += n
        if self.kinds is not None:
            self.kinds[kind] = self.kinds.get(kind, 0) + n
        if self.level > self.peak:
            self.peak = self.level
            if self.kinds is not None:
                self.at_peak = dict(self.kinds)

    def free(self, n: int, kind: str = "temporaries") -> None:
        self.level -= n
        if self.kinds is not None:
            self.kinds[kind] = self.kinds.get(kind, 0) - n

    def move(self, n: int, src: str, dst: str) -> None:
        if self.kinds is not None:
            self.kinds[src] = self.kinds.get(src, 0) - n
            self.kinds[dst] = self.kinds.get(dst, 0) + n


def _grad(k: Any, n: int, mode: str) -> None:
    """AccumulateGrad for a new gradient of n bytes (held as a temporary), by micro-step mode.

    fresh: it becomes .grad. add: it is added in place into the existing .grad and freed.
    sync (DDP's synced micro-step after no_sync ones): added in place, then DDP's hook copies
    .grad into its bucket view and frees the accumulated gradient as well. Sharded gradients
    (zero2, fsdp) keep 1/shard of it.
    """
    kept = n // k.shard
    if mode == "fresh":
        k.free(n - kept)
        k.move(kept, "temporaries", "gradients")
    else:
        k.free(n)
        if mode == "sync":
            k.free(kept, "gradients")


def _linear_bw(D: _Dims, k: _Walk, n_in: int, n_out: int, N: int, *, x_cast: bool, x_free: bool,
               g_free: bool, mode: str, bias: bool | None = None, g_kind: str = "temporaries",
               hold: bool = False) -> None:
    """Backward of y = x Wᵀ (+ b) for N rows, with the incoming grad (a·n_out·N) alive."""
    a, W = D.a, n_in * n_out
    bias = D.bias if bias is None else bias
    x_kind = "activations"
    if D.ac:
        k.alloc(a * W)                      # mm: grad of the bf16 weight copy
        k.alloc(a * n_in * N)               # mm: grad of the input
        if g_free:
            k.free(a * n_out * N, g_kind)   # the incoming grad
        k.free(a * W, "activations")        # the saved bf16 weight copy
        if x_free:
            k.free(a * n_in * N, x_kind)    # the saved input
        if x_cast:                          # ToCopyBackward: input grad back to fp32
            k.alloc(F32 * n_in * N)
            k.free(a * n_in * N)
        k.alloc(F32 * W)                    # ToCopyBackward: weight grad to fp32
        k.free(a * W)
    else:
        k.alloc(D.w * W)                    # grad of the weight
        k.alloc(a * n_in * N)               # grad of the input
        if g_free:
            k.free(a * n_out * N, g_kind)
        if x_free:
            k.free(a * n_in * N, x_kind)
    if not hold:                            # a tied weight's grad waits in the engine's buffer
        _grad(k, D.w * W, mode)
    if bias:
        k.alloc(D.w * n_out)                # bias grad (sum over rows)
        _grad(k, D.w * n_out, mode)


def _norm_bw(D: _Dims, k: _Walk, n: int, rows: int, *, weighted: bool, g_bytes: int, x_bytes: int,
             x_saved: int, mode: str) -> None:
    """Backward of a norm over `n` features for `rows` rows, with its incoming grad alive.

    g_bytes/x_bytes: element sizes of the incoming grad and of the input; x_saved: bytes of
    the saved input this frees (0 when it is a view of a tensor kept for something else).
    LayerNorm: native_layer_norm_backward writes dx (and dgamma, dbeta). RMSNorm: CUDA's fused
    kernel; the trace's emulation holds an fp32 x̂ (it becomes dx in place) and, when weighted
    or when the grad is bf16, an fp32 g·w while it computes dx.
    """
    if D.ln:
        k.alloc(x_bytes * n * rows)
        k.free(g_bytes * n * rows)
        k.free(x_saved + 2 * F32 * rows, "activations")
    else:
        extra = F32 * n * rows if (weighted or g_bytes != F32) else 0
        k.alloc(F32 * n * rows + extra)     # x̂ (becomes dx in place) and g·w
        if x_bytes != F32:
            k.alloc(x_bytes * n * rows)     # dx cast to the input's dtype
            k.free(F32 * n * rows)
        k.free(extra)
        k.free(g_bytes * n * rows)
        k.free(x_saved + F32 * rows, "activations")
    if weighted:
        nw = D.w * n * (2 if D.ln else 1)
        k.alloc(nw)
        _grad(k, nw, mode)


def _resid_norm_bw(D: _Dims, k: Any, N: Any, mode: str) -> None:
    """Backward of a norm over the residual stream (norm1, norm2, norm_f), its output's grad alive.

    Its input is the residual itself, or (a bf16 residual under autocast) an fp32 copy, whose
    ToCopyBackward casts the input's grad back to bf16."""
    nx, d = D.nx, D.d
    _norm_bw(D, k, d, N, weighted=D.norm_w, g_bytes=nx, x_bytes=nx, x_saved=nx * d * N, mode=mode)
    if _rb(D):
        k.alloc(D.r * d * N)
        k.free(nx * d * N)


def _block_bw(D: _Dims, k: _Walk, N: int, mode: str) -> None:
    """One block's backward, from the grad of its output (r·d·N) to the grad of its input."""
    a, r, d, f, q, kv = D.a, D.r, D.d, D.f, D.q, D.kv
    ac, rb = D.ac, _rb(D)
    cast = ac and not rb                    # an fp32 residual: the branch's grad is a bf16 copy
    # ---- MLP branch: x_out = x_mid + proj(act(fc(norm2(x_mid))))
    if cast:
        k.alloc(a * d * N)                  # AddBackward: the branch's grad, cast to its bf16 output
    if D.mlp == "relu2":
        _linear_bw(D, k, f, d, N, x_cast=ac, x_free=True, g_free=cast, mode=mode)
        if ac:                              # pow backward (fp32): grad·(2·x.pow(1)): three fp32 tensors
            k.alloc(F32 * f * N)
            k.alloc(F32 * f * N)
            k.alloc(F32 * f * N)
            k.free(2 * F32 * f * N)
            k.free(F32 * f * N)             # incoming grad
            k.free(F32 * f * N, "activations")  # the saved fp32 copy
            k.alloc(a * f * N)              # ToCopyBackward of the fp32 upcast
            k.free(F32 * f * N)
        else:
            k.alloc(a * f * N)
            k.alloc(a * f * N)
            k.alloc(a * f * N)
            k.free(2 * a * f * N)
            k.free(a * f * N)
        k.alloc(a * f * N)                  # threshold_backward (relu)
        k.free(a * f * N)
        k.free(a * f * N, "activations")    # the saved relu output
        fc_out = f
    elif D.mlp == "gelu":
        _linear_bw(D, k, f, d, N, x_cast=False, x_free=True, g_free=cast, mode=mode)
        k.alloc(a * f * N)                  # gelu_backward
        k.free(a * f * N)
        k.free(a * f * N, "activations")    # the saved fc output
        fc_out = f
    else:
        _linear_bw(D, k, f, d, N, x_cast=False, x_free=True, g_free=cast, mode=mode)
        k.alloc(a * f * N)                  # mul backward: grad of silu(gate)
        k.alloc(a * f * N)                  # mul backward: grad of up
        k.free(a * f * N)                   # incoming grad
        k.free(a * f * N, "activations")    # the saved silu output
        k.alloc(a * f * N)                  # silu_backward
        k.free(a * f * N)
        k.free(2 * a * f * N, "activations")  # the saved fc output (gate and up)
        k.alloc(2 * a * f * N)              # cat: grad of the fc output
        k.free(2 * a * f * N)
        fc_out = 2 * f
    _linear_bw(D, k, d, fc_out, N, x_cast=ac, x_free=True, g_free=True, mode=mode)
    _resid_norm_bw(D, k, N, mode)
    k.alloc(r * d * N)                      # the residual grad accumulates the norm2 branch
    k.free(2 * r * d * N)
    # ---- attention branch: x_mid = x_in + proj(sdpa(rope/qknorm(qkv(norm1(x_in)))))
    if cast:
        k.alloc(a * d * N)
    _linear_bw(D, k, q, d, N, x_cast=False, x_free=False, g_free=cast, mode=mode)
    k.alloc(a * (q + 2 * kv) * N)           # SDPA backward: dq, dk, dv
    k.free(a * q * N)                       # incoming grad
    k.free(a * q * N + F32 * D.H * N, "activations")  # saved output and logsumexp
    sdpa_qk = a * (q + kv) * N if (D.rotary or D.qk_norm) else 0
    k.free(sdpa_qk + a * (q + 2 * kv) * N, "activations")  # saved q, k; the qkv buffer (v's base)
    for n, heads in ((q, D.H), (kv, D.KV)):
        if D.qk_norm:
            if ac:
                k.alloc(F32 * n * N)        # ToCopyBackward: grad of SDPA's bf16 cast, to fp32
                k.free(a * n * N)
                _norm_bw(D, k, D.hd, heads * N, weighted=False, g_bytes=F32, x_bytes=F32,
                         x_saved=F32 * n * N, mode=mode)
                k.alloc(a * n * N)          # ToCopyBackward of the fp32 upcast
                k.free(F32 * n * N)
            else:                           # saved input: the rotary output, or a view of qkv
                _norm_bw(D, k, D.hd, heads * N, weighted=False, g_bytes=a, x_bytes=a,
                         x_saved=a * n * N if D.rotary else 0, mode=mode)
        if D.rotary:                        # apply_rotary backward: slices, products, cat
            k.alloc(2 * a * n * N)
            k.free(2 * a * n * N)
    if D.rotary:
        k.free(_rope_casts(D), "activations")
    k.alloc(a * (q + 2 * kv) * N)           # cat: grad of the qkv output
    k.free(a * (q + 2 * kv) * N)
    _linear_bw(D, k, d, q + 2 * kv, N, x_cast=ac, x_free=True, g_free=True, mode=mode)
    _resid_norm_bw(D, k, N, mode)
    k.alloc(r * d * N)                      # the residual grad accumulates the norm1 branch
    k.free(2 * r * d * N)


# --------------------------------------------------------------------------- loss and head

def _loss_fw_peak(D: _Dims, n: int) -> int:
    """Logit-sized bytes alive at the loss forward's peak for n rows (its saved ones included).

    logits (bf16) -> .float() -> [÷cap -> tanh -> ×cap] -> log_softmax: with the softcap, three
    fp32 tensors are alive at tanh and at ×cap (logits, tanh, product) and again at log_softmax.
    """
    return F32 * n * D.V * (3 if D.softcap else 2)


def _loss_ce_bw(D: _Dims, k: _Walk, n: int) -> None:
    """Cross-entropy (and softcap) backward for n rows, down to the grad of the matmul's logits.

    Its peak: the saved log_softmax (and tanh) outputs plus the grads of nll_loss and of
    log_softmax, all fp32 and logit-sized.
    """
    NV = n * D.V
    k.alloc(F32 * NV, "loss_temporaries")           # nll_loss_backward
    k.alloc(F32 * NV, "loss_temporaries")           # _log_softmax_backward_data
    k.free(2 * F32 * NV, "loss_temporaries")        # nll grad, saved log_softmax
    if D.softcap:
        k.alloc(F32 * NV, "loss_temporaries")       # × cap
        k.free(F32 * NV, "loss_temporaries")
        k.alloc(F32 * NV, "loss_temporaries")       # tanh_backward
        k.free(2 * F32 * NV, "loss_temporaries")    # incoming, saved tanh
        k.alloc(F32 * NV, "loss_temporaries")       # ÷ cap
        k.free(F32 * NV, "loss_temporaries")
    if D.a != F32:
        k.alloc(D.a * NV, "loss_temporaries")       # ToCopyBackward of .float()
        k.free(F32 * NV, "loss_temporaries")


def _loss_full_bw(D: _Dims, k: _Walk, N: int, mode: str) -> None:
    """Unchunked loss backward, then the head matmul's (its input: norm_f's output, a bf16 copy
    under autocast). A tied head's grad waits in the engine's buffer for the embedding's."""
    _loss_ce_bw(D, k, N)
    _linear_bw(D, k, D.d, D.V, N, x_cast=D.ac, x_free=True, g_free=True, mode=mode, bias=False,
               g_kind="loss_temporaries", hold=D.tied)


def _loss_chunk_bw(D: _Dims, k: _Walk, c: int, N: int, first: bool, mode: str, frees_rows: int = 0) -> None:
    """One chunk of the chunked loss: recompute (checkpoint), backward, accumulate head grads."""
    a, V, d = D.a, D.V, D.d
    cV = c * V
    W = V * d
    if D.ac:
        k.alloc(a * W, "activations")               # recomputed bf16 weight copy
        k.alloc(a * d * c, "activations")           # recomputed bf16 input rows
    if a != F32:
        k.alloc(a * cV, "loss_temporaries")         # logits
        k.alloc(F32 * cV, "loss_temporaries")       # .float()
        k.free(a * cV, "loss_temporaries")
    else:
        k.alloc(F32 * cV, "loss_temporaries")
    if D.softcap:
        k.alloc(F32 * cV, "loss_temporaries")       # ÷ cap
        k.alloc(F32 * cV, "loss_temporaries")       # tanh (saved)
        k.free(F32 * cV, "loss_temporaries")
        k.alloc(F32 * cV, "loss_temporaries")       # × cap
        k.free(F32 * cV, "loss_temporaries")
    k.alloc(F32 * cV, "loss_temporaries")           # log_softmax (saved)
    k.free(F32 * cV, "loss_temporaries")            # the logits, when head_loss returns
    _loss_ce_bw(D, k, c)
    # mm backward; the weight is shared by all chunks, so its grad accumulates across them
    Wg = a * W if D.ac else D.w * W
    k.alloc(Wg)
    k.alloc(a * d * c)
    k.free(a * cV, "loss_temporaries")
    if D.ac:
        k.free(a * d * c + a * W, "activations")
    k.free(frees_rows, "activations")               # the last chunk's rows were the last view of x2
    if not first:                                   # the engine adds each chunk's weight grad out of place
        k.alloc(Wg)
        k.free(2 * Wg)
    if D.ac:
        k.alloc(F32 * d * c)                        # ToCopyBackward: rows' grad to fp32
        k.free(a * d * c)
    k.alloc(D.nx * d * N)                           # slice_backward: a full (N, d) grad
    k.free((F32 if D.ac else a) * d * c)
    if not first:
        k.alloc(D.nx * d * N)                       # accumulated out of place
        k.free(2 * D.nx * d * N)


# --------------------------------------------------------------------------- the step

def _n_tensors(spec: ModelSpec) -> tuple[int, int]:
    """(parameter tensors, of which 2-D hidden matrices), as runner/model.py creates them."""
    norm_t = {"rmsnorm_noweight": 0, "rmsnorm": 1, "layernorm": 2}[spec.norm]
    per_layer = 4 + (4 if spec.bias else 0) + 2 * norm_t
    rest = 1 + (1 if spec.pos == "learned" else 0) + norm_t + (0 if spec.tied else 1)
    return spec.n_layer * per_layer + rest, 4 * spec.n_layer


def _optimizer_state(spec: ModelSpec, optimizer: Optimizer, w: int) -> int:
    """AdamW: exp_avg and exp_avg_sq (param dtype) and an fp32 step per tensor (fused);
    Muon: one momentum buffer per hidden matrix, AdamW for everything else."""
    P = n_params(spec)
    tensors, mats = _n_tensors(spec)
    if optimizer == "adamw":
        return 2 * P * w + F32 * tensors
    M = spec.n_layer * (attn_weight_params(spec) + mlp_weight_params(spec))
    return M * w + 2 * (P - M) * w + F32 * (tensors - mats)


def _muon_temporaries(D: _Dims) -> int:
    """Largest Muon step temporaries over the hidden matrices (m×n, s = min(m, n)): the Nesterov
    update (param dtype), its bf16 copy and the Newton-Schulz iterate, gram and update (bf16)."""
    n_in = 2 if D.mlp == "swiglu" else 1
    shapes = ((D.q + 2 * D.kv, D.d), (D.d, D.q), (n_in * D.f, D.d), (D.d, D.f))
    return max(D.w * m * n + 4 * m * n + 4 * min(m, n) ** 2 for m, n in shapes)


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


@dataclass(frozen=True)
class _Model:
    """What the step's memory needs from the spec, precision and optimizer (cached)."""

    D: _Dims
    L: int
    params: int
    buffers: int
    optimizer_state: int
    muon: int


@lru_cache(maxsize=4096)
def _model(spec: ModelSpec, precision: Precision, optimizer: Optimizer) -> _Model:
    D = _dims(spec, precision)
    P = n_params(spec)
    return _Model(D=D, L=spec.n_layer, params=P * D.w, buffers=4 * D.T * D.hd if D.rotary else 0,
                  optimizer_state=_optimizer_state(spec, optimizer, D.w),
                  muon=_muon_temporaries(D) if optimizer == "muon" else 0)


def _saved(m: _Model, N: Any, ckpt: bool, chunk: int) -> tuple[Any, Any, Any]:
    """(activations, head input kept for the head's backward, loss outputs) at forward end."""
    D, L = m.D, m.L
    r, d, a, V = D.r, D.d, D.a, D.V
    inputs = 2 * I64 * N                                   # token ids and targets
    blocks = L * (r * d * N if ckpt else _layer_saved(D, N))   # checkpointing keeps block inputs only
    tail = D.nx * d * N + _stats(D) * N                    # norm_f's input (last block output or its copy), stats
    tail += I64 * D.T if D.learned_pos else 0              # positions, saved for wpe's backward
    if chunk:
        head = D.nx * d * N                                # norm_f output, kept by the checkpointed chunks
        loss = 0
    else:
        head = a * d * N + (a * V * d if D.ac else 0)      # head input and its bf16 weight copy
        loss = F32 * N * V * (2 if D.softcap else 1)       # log_softmax (and tanh) outputs
    return inputs + blocks + tail + head, head, loss


def _forward_extra(m: _Model, N: Any, ckpt: bool, chunk: int) -> tuple[Any, Any]:
    """(loss logits, other) alive at the loss forward's peak beyond what is saved."""
    D = m.D
    a, d, V = D.a, D.d, D.V
    cache = m.L * 2 * _block_weights(D) if (ckpt and D.ac) else 0   # autocast's cache, under checkpointing
    if chunk:                                              # the cached bf16 weight copy (the rows' copy
        other = a * V * d if D.ac else 0                   # is freed once the chunk's matmul has run)
    else:                                                  # norm_f output, a local until forward returns
        other = D.nx * d * N
    return _loss_fw_peak(D, chunk or N), cache + other


def _loss_head_bw(D: _Dims, k: Any, N: Any, head: Any, mode: str, chunk: int, n_chunks: int,
                  first_chunk: Any) -> None:
    """Backward from the loss to the last block's output: loss (chunked or not), head, norm_f."""
    w, a, d, V = D.w, D.a, D.d, D.V
    if chunk:
        # chunks run last to first; the second stands for every later one (the first, no larger
        # and without the accumulated grads, never peaks higher). Without autocast the
        # recomputed matmul saves a view of norm_f's output, so the last chunk's matmul frees it.
        early = 0 if D.ac or n_chunks > 2 else head
        _loss_chunk_bw(D, k, first_chunk, N, True, mode)
        _loss_chunk_bw(D, k, chunk, N, False, mode, frees_rows=early)
        if D.ac:                                           # ToCopyBackward of the weight copy
            k.alloc(F32 * V * d)
            k.free(a * V * d)
        if not D.tied:                                     # a tied grad waits for the embedding's
            _grad(k, w * V * d, mode)
        k.free(head - early, "activations")
    else:
        _loss_full_bw(D, k, N, mode)
    _resid_norm_bw(D, k, N, mode)


def _embedding_bw(D: _Dims, e: Any, N: Any, mode: str) -> None:
    """Backward of the input embeddings, when every other gradient exists."""
    w, r, d, V, nx = D.w, D.r, D.d, D.V, D.nx
    if _rb(D):                                             # ToCopyBackward of the cast to bf16
        e.alloc(nx * d * N)
        e.free(r * d * N)
    if D.learned_pos:
        e.alloc(nx * D.T * d)                              # grad of wpe's output, summed over the batch
        e.alloc(w * D.T * d)                               # embedding_dense_backward for wpe
        e.free(nx * D.T * d)
        _grad(e, w * D.T * d, mode)
        e.free(I64 * D.T, "activations")
    e.alloc(w * V * d)                                     # embedding_dense_backward for wte
    e.free(nx * d * N)                                     # the incoming grad
    if D.tied:                                             # the engine adds it to the head's grad
        e.alloc(w * V * d)
        e.free(2 * w * V * d)
    _grad(e, w * V * d, mode)


def _step_walk(m: _Model, N: int, ckpt: bool, chunk: int, n_chunks: int, mode: str,
               base_grads: int, shard: int = 1) -> dict[str, tuple[int, dict[str, int]]]:
    """Replay one steady-state step for N tokens per micro-batch: each phase's peak and its kinds."""
    D, L = m.D, m.L
    fixed = {"parameters": m.params, "buffers": m.buffers, "optimizer_state": m.optimizer_state}
    acts, head, loss = _saved(m, N, ckpt, chunk)
    kinds0 = {**fixed, "gradients": base_grads, "activations": acts, "loss_temporaries": loss, "temporaries": 0}
    level0 = sum(kinds0.values())
    out: dict[str, tuple[int, dict[str, int]]] = {}
    fw_loss, fw_other = _forward_extra(m, N, ckpt, chunk)
    out["forward_end"] = (level0 - loss + fw_loss + fw_other,
                          {**kinds0, "loss_temporaries": fw_loss, "temporaries": fw_other})
    k = _Walk(level0, kinds0, shard)
    _loss_head_bw(D, k, N, head, mode, chunk, n_chunks, N - (n_chunks - 1) * chunk if chunk else 0)
    out["backward_start"] = (k.peak, k.at_peak)
    # blocks: walk one (they are identical); the stack's top and bottom follow by linearity
    b = _Walk(0, {}, shard)
    if ckpt:
        b.alloc(_recomputed(D, N), "activations")   # the block's forward, recomputed
    _block_bw(D, b, N, mode)
    if ckpt and D.nx != D.r:
        b.free(D.r * D.d * N, "activations")        # the checkpoint's saved input, once its backward ends
    out["backward_layers"] = layers_peak(k, b, L)
    e = _Walk(*after_layers(k, b, L), shard)
    _embedding_bw(D, e, N, mode)
    out["backward_end"] = (e.peak, e.at_peak)
    # optimizer step: parameters, gradients (the DDP bucket), state, the step's temporaries
    inputs = 2 * I64 * N
    grads = m.params // shard
    out["optimizer_step"] = (sum(fixed.values()) + grads + inputs + m.muon,
                             {**fixed, "gradients": grads, "activations": inputs, "temporaries": m.muon})
    return out


def _chunking(cfg: StepConfig) -> tuple[int, int]:
    N = cfg.device_batch_size * cfg.spec.seq_len
    chunk = cfg.loss_chunk_tokens if 0 < cfg.loss_chunk_tokens < N else 0
    return chunk, (math.ceil(N / chunk) if chunk else 0)


def _grad_shard(cfg: StepConfig) -> int:
    """The degree gradients are sharded over: dp for zero2 and fsdp, else 1."""
    return max(1, cfg.dp) if cfg.strategy in ("zero2", "fsdp") else 1


def _state_cut(m: _Model, strategy: str, dp: int, w: int, spec: ModelSpec) -> int:
    """Bytes sharding removes from optimizer state (zero1+) and parameters (fsdp), minus the
    two layers FSDP keeps gathered; gradients are sharded inside the walk."""
    if strategy == "ddp" or dp <= 1:
        return 0
    cut = m.optimizer_state - m.optimizer_state // dp
    if strategy == "fsdp":
        cut += m.params - m.params // dp
    return cut - sharded_extra(strategy, spec, w, dp)[1]


def layers_peak(k: Any, b: Any, L: int) -> tuple[int, dict[str, int]]:
    """The peak inside the blocks' backward: the walk `k` up to the first block's backward, then
    block walk `b` at the top (i = 0) or bottom (i = L - 1) of the stack; every count is linear."""
    best: tuple[int, dict[str, int]] = (-1, {})
    for i in (0, L - 1):
        lv = k.level + i * b.level + b.peak
        if lv > best[0]:
            keys = set(k.kinds or {}) | set(b.kinds or {}) | set(b.at_peak)
            best = (lv, {key: (k.kinds or {}).get(key, 0) + i * (b.kinds or {}).get(key, 0) + b.at_peak.get(key, 0)
                         for key in keys})
    return best


def after_layers(k: Any, b: Any, L: int) -> tuple[int, dict[str, int]]:
    """Level and kinds once all L blocks' backward has run."""
    return k.level + L * b.level, {key: (k.kinds or {}).get(key, 0) + L * (b.kinds or {}).get(key, 0)
                                   for key in set(k.kinds or {}) | set(b.kinds or {})}


def estimate(cfg: StepConfig, overheads: dict[str, int] | None = None,
             fragmentation: float = 0.0, compiled_saved: tuple[int, int | None] | None = None) -> MemoryEstimate:
    """Per-GPU peak bytes of a steady-state training step (see the module docstring).

    compiled_saved (compile on): measured (all saved bytes, one block's) to walk instead of the
    model's own counts; runner.trace uses it for the traced compiled step.
    """
    spec = cfg.spec
    m = _model(spec, cfg.precision, cfg.optimizer)
    N = cfg.device_batch_size * spec.seq_len
    chunk, n_chunks = _chunking(cfg)
    dp = max(1, cfg.dp)
    phases: dict[str, int] = {}
    best: tuple[int, str, dict[str, int]] = (-1, "", {})
    shard = _grad_shard(cfg)
    if cfg.compile:
        from functools import partial

        from planner.memory_compiled import step_walk as compiled_walk
        walk: Any = partial(compiled_walk, saved=compiled_saved)
    else:
        walk = _step_walk
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


# --------------------------------------------------------------------------- the fast path
#
# Every byte count above is linear in N (tokens per micro-batch) once the model, precision,
# optimizer, checkpointing and chunk layout are fixed. The fast path replays each part of the
# backward once with N = 1j (the imaginary part collects the per-token bytes), keeps the upper
# envelope of the resulting lines, and caches it, so a search pays a few lines per candidate.

Line = tuple[int, int]               # (bytes at N = 0, bytes per token)


class _Rec:
    """Records the level after each allocation; levels are complex (α + β·j, with N = 1j)."""

    __slots__ = ("level", "steps", "shard")

    def __init__(self, shard: int) -> None:
        self.level: Any = 0
        self.steps: list[Any] = []
        self.shard = shard

    def alloc(self, n: Any, kind: str = "temporaries") -> None:
        self.level += n
        self.steps.append(self.level)

    def free(self, n: Any, kind: str = "temporaries") -> None:
        self.level -= n

    def move(self, n: Any, src: str, dst: str) -> None:
        pass


def _line(z: Any) -> Line:
    z = complex(z)
    return (round(z.real), round(z.imag))


def _upper_envelope(lines: list[Line]) -> tuple[Line, ...]:
    """The lines that are the maximum for some N >= 1."""
    hull: list[Line] = []
    for ln in sorted(set(lines), key=lambda x: (x[1], x[0])):
        while hull and hull[-1][1] == ln[1]:
            hull.pop()                       # same slope: the later (larger intercept) wins
        while len(hull) >= 2:
            (a1, b1), (a2, b2) = hull[-2], hull[-1]
            # hull[-1] is useless if ln overtakes hull[-2] no later than hull[-1] does
            if (ln[0] - a1) * (b2 - b1) >= (a2 - a1) * (ln[1] - b1):
                hull.pop()
            else:
                break
        hull.append(ln)
    while len(hull) >= 2 and hull[0][0] + hull[0][1] <= hull[1][0] + hull[1][1]:
        hull.pop(0)                          # not the maximum anywhere at N >= 1
    return tuple(hull)


def _shift(lines: tuple[Line, ...], by: Line) -> list[Line]:
    return [(a0 + by[0], b0 + by[1]) for a0, b0 in lines]


def _part(walk: Any) -> tuple[tuple[Line, ...], Line]:
    return _upper_envelope([_line(z) for z in walk.steps]), _line(walk.level)


@lru_cache(maxsize=4096)
def _block_part(D: _Dims, mode: str, shard: int) -> tuple[tuple[Line, ...], Line]:
    """One block's backward from level 0: the envelope of its steps, and its net change."""
    rec = _Rec(shard)
    _block_bw(D, rec, 1j, mode)
    return _part(rec)


@lru_cache(maxsize=4096)
def _loss_part(m: _Model, mode: str, chunk: int, n_chunks_is_2: bool, shard: int) -> tuple[tuple[Line, ...], Line]:
    """The loss, head and norm_f backward from level 0: envelope and net change."""
    rec = _Rec(shard)
    head = _saved(m, 1j, False, chunk)[1]
    # the chunk processed first is given a full chunk: an upper bound the next chunk dominates
    _loss_head_bw(m.D, rec, 1j, head, mode, chunk, 2 if n_chunks_is_2 else 3, chunk)
    return _part(rec)


@lru_cache(maxsize=4096)
def _embedding_part(D: _Dims, mode: str, shard: int) -> tuple[tuple[Line, ...], Line]:
    rec = _Rec(shard)
    _embedding_bw(D, rec, 1j, mode)
    return _part(rec)


@lru_cache(maxsize=16384)
def _profile(spec: ModelSpec, precision: Precision, optimizer: Optimizer, ckpt: bool, chunk: int,
             n_chunks_is_2: bool, mode: str, base_grads: int, shard: int) -> tuple[tuple[str, tuple[Line, ...]], ...]:
    """Each phase's peak as an upper envelope of lines in N (DDP-state, gradients sharded)."""
    m = _model(spec, precision, optimizer)
    D = m.D
    fixed = m.params + m.buffers + m.optimizer_state
    acts, _head, loss = _saved(m, 1j, ckpt, chunk)
    level0 = _line(fixed + base_grads + acts + loss)
    fw_loss, fw_other = _forward_extra(m, 1j, ckpt, chunk)
    forward = _line(fixed + base_grads + acts + fw_loss + fw_other)
    loss_env, loss_net = _loss_part(m, mode, chunk, n_chunks_is_2, shard)
    top = (level0[0] + loss_net[0], level0[1] + loss_net[1])
    block_env, delta = _block_part(D, mode, shard)
    if ckpt:                                 # each block's forward is recomputed before its backward
        re = _line(_recomputed(D, 1j))
        block_env = tuple(_shift(block_env, re))
        delta = (delta[0] + re[0], delta[1] + re[1] - (D.r * D.d if D.nx != D.r else 0))
    return phase_envelopes(m, shard, forward, level0, loss_env, top, block_env, delta,
                           _embedding_part(D, mode, shard)[0])


def phase_envelopes(m: _Model, shard: int, forward: Line, level0: Line, loss_env: tuple[Line, ...], top: Line,
                    block_env: tuple[Line, ...], delta: Line,
                    emb_env: tuple[Line, ...]) -> tuple[tuple[str, tuple[Line, ...]], ...]:
    """Each phase's upper envelope from the walk's parts (eager or compiled): the loss's backward from
    level0, one block's backward at the top and bottom of the stack (each block nets `delta`), the
    embedding's backward after all L blocks, and the optimizer step."""
    L = m.L
    bottom = (top[0] + (L - 1) * delta[0], top[1] + (L - 1) * delta[1])
    end = (top[0] + L * delta[0], top[1] + L * delta[1])
    fixed = m.params + m.buffers + m.optimizer_state
    return (
        ("forward_end", (forward,)),
        ("backward_start", _upper_envelope([level0, *_shift(loss_env, level0)])),
        ("backward_layers", _upper_envelope(_shift(block_env, top) + _shift(block_env, bottom))),
        ("backward_end", _upper_envelope([end, *_shift(emb_env, end)])),
        ("optimizer_step", (_line(fixed + m.params // shard + 2 * I64 * 1j + m.muon),)),
    )


def allocated_peak(cfg: StepConfig) -> int:
    """`estimate(cfg).allocated_peak`, fast: per-model profiles are cached, so a search that
    varies micro-batch, strategy and checkpointing pays a few microseconds per candidate."""
    spec = cfg.spec
    m = _model(spec, cfg.precision, cfg.optimizer)
    N = cfg.device_batch_size * spec.seq_len
    chunk, n_chunks = _chunking(cfg)
    shard = _grad_shard(cfg)
    best = 0
    if cfg.compile:
        from planner.memory_compiled import profile as compiled_profile
    for base_grads, mode in _scenarios(cfg, m.params):
        profile = (compiled_profile(m, cfg.activation_checkpointing, chunk, n_chunks == 2, mode, base_grads // shard, shard)
                   if cfg.compile else
                   _profile(spec, cfg.precision, cfg.optimizer, cfg.activation_checkpointing, chunk,
                            n_chunks == 2, mode, base_grads // shard, shard))
        for _phase, lines in profile:
            for a0, b0 in lines:
                v = a0 + b0 * N
                if v > best:
                    best = v
    return best - _state_cut(m, cfg.strategy, max(1, cfg.dp), m.D.w, spec)


SHARDED: dict[str, tuple[str, ...]] = {
    "zero1": ("optimizer_state",),
    "zero2": ("optimizer_state", "gradients"),
    "fsdp": ("optimizer_state", "gradients", "parameters"),
}


def fsdp_gathered_bytes(spec: ModelSpec, w: int) -> int:
    """FSDP all-gathers a layer's parameters ahead of use: two layers unsharded at a time."""
    c = param_counts(spec)
    return 2 * ((c.attention + c.mlp) // max(spec.n_layer, 1) + 2 * norm_params(spec)) * w


@lru_cache(maxsize=4096)
def sharded_extra(strategy: str, spec: ModelSpec, w: int, dp: int) -> tuple[str, int]:
    """(category, bytes) a sharded rank holds beyond its even shares during the step.

    fsdp (FSDP2, reshard_after_forward=True) gathers two layers ahead of use: temporaries.
    zero2 (FSDP2, reshard_after_forward=False, runner/parallel.py) keeps every gathered layer
    from its forward to its backward, beside its own parameter shard: the full parameters plus
    1/dp. Gathered copies are counted at the weight width w; with bf16 mixed precision on CUDA
    FSDP2 gathers bf16, so this is conservative there (tests/test_shard_state.py).
    """
    if strategy == "fsdp":
        return "temporaries", fsdp_gathered_bytes(spec, w)
    if strategy == "zero2" and dp > 1:
        return "parameters", n_params(spec) * w // dp
    return "temporaries", 0


def shard_breakdown(breakdown: dict[str, int], strategy: str, dp: int, spec: ModelSpec, w: int) -> dict[str, int]:
    """Divide optimizer state (zero1+) and parameters (fsdp) by dp and add what sharding holds
    beyond even shares (`sharded_extra`; gradients are sharded while walking the step, see `_grad`)."""
    out = dict(breakdown)
    for key in SHARDED[strategy]:
        if key != "gradients":
            out[key] = out[key] // dp
    key, extra = sharded_extra(strategy, spec, w, dp)
    out[key] += extra
    return out
