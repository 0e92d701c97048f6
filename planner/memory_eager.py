"""Per-GPU memory of the runner's eager step (no torch.compile), calibrated against traces of the real step.

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

`step_walk` walks the step for one configuration: each phase's peak and its kinds. `profile`
gives each phase's peak as lines in N, cached per model, for `allocated_peak`. The backward's
kernels are in planner/memory_backward.py, the shared terms in planner/memory_terms.py; the
compiled step's model is planner/memory_compiled.py, and planner/memory.py picks between them.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from planner.memory_backward import block_bw, embedding_bw, loss_head_bw
from planner.memory_terms import (
    F32,
    I64,
    Dims,
    LevelRecorder,
    Line,
    ModelBytes,
    Optimizer,
    Precision,
    Walk,
    after_layers,
    block_weights,
    dims,
    envelope_and_net,
    layers_peak,
    model_bytes,
    phase_envelopes,
    rope_casts,
    shift_lines,
    to_line,
)
from planner.spec import ModelSpec

# --------------------------------------------------------------------------- saved activations

def _stats(D: Dims) -> int:
    """Per-row statistics a norm saves: rstd (RMSNorm) or mean and rstd (LayerNorm), fp32."""
    return 2 * F32 if D.ln else F32


def _qk_saved(D: Dims) -> int:
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


def _mlp_saved(D: Dims) -> int:
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
    return _layer_per_token(dims(spec, precision))


def _layer_per_token(D: Dims) -> int:
    a, d = D.a, D.d
    return (2 * D.nx * d                  # norm1/norm2 inputs: the residuals, or their fp32 copies under autocast
            + 2 * _stats(D)               # norm1, norm2 statistics
            + 2 * a * d                   # norm outputs as qkv and fc take them (bf16 casts)
            + a * (D.q + 2 * D.kv)        # qkv output: v, a view, keeps the whole buffer alive
            + _qk_saved(D)
            + a * D.q + F32 * D.H         # attention output and logsumexp (flash attention)
            + _mlp_saved(D))


def _recomputed(D: Dims, N: Any) -> Any:
    """What a checkpointed block's recomputed forward saves beyond the checkpoint's saved input:
    everything, less that input when norm1 saves the residual itself (no fp32 copy)."""
    return _layer_saved(D, N) - (D.r * D.d * N if D.nx == D.r else 0)


def layer_saved(D: Dims, N: int) -> int:
    """One block's saved bytes for N tokens (with its per-layer constants): what checkpointing it drops, and
    its input besides."""
    return _layer_saved(D, N)


def _layer_saved(D: Dims, N: int) -> int:
    """One block's saved bytes for N tokens, with its per-layer constants."""
    casts = 2 * block_weights(D) if (D.ac and not D.mp) else 0   # bf16 weight copies (autocast cache, saved by mm)
    return _layer_per_token(D) * N + rope_casts(D) + casts


# --------------------------------------------------------------------------- the step

def _loss_fw_peak(D: Dims, n: int) -> int:
    """Logit-sized bytes alive at the loss forward's peak for n rows (its saved ones included).

    logits (bf16) -> .float() -> [÷cap -> tanh -> ×cap] -> log_softmax: with the softcap, three
    fp32 tensors are alive at tanh and at ×cap (logits, tanh, product) and again at log_softmax.
    """
    return F32 * n * D.V * (3 if D.softcap else 2)


def _saved(m: ModelBytes, N: Any, ckpt: bool, chunk: int) -> tuple[Any, Any, Any]:
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


def _forward_extra(m: ModelBytes, N: Any, ckpt: bool, chunk: int) -> tuple[Any, Any]:
    """(loss logits, other) alive at the loss forward's peak beyond what is saved."""
    D = m.D
    a, d, V = D.a, D.d, D.V
    cache = m.L * 2 * block_weights(D) if (ckpt and D.ac and not D.mp) else 0   # autocast's cache, under checkpointing
    if chunk:                                              # the cached bf16 weight copy (the rows' copy
        other = a * V * d if D.ac else 0                   # is freed once the chunk's matmul has run)
    else:                                                  # norm_f output, a local until forward returns
        other = D.nx * d * N
    return _loss_fw_peak(D, chunk or N), cache + other


def step_walk(m: ModelBytes, N: int, ckpt: bool, chunk: int, n_chunks: int, mode: str,
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
    k = Walk(level0, kinds0, shard)
    loss_head_bw(D, k, N, head, mode, chunk, n_chunks, N - (n_chunks - 1) * chunk if chunk else 0)
    out["backward_start"] = (k.peak, k.at_peak)
    # blocks: walk one (they are identical); the stack's top and bottom follow by linearity
    b = Walk(0, {}, shard)
    if ckpt:
        b.alloc(_recomputed(D, N), "activations")   # the block's forward, recomputed
    block_bw(D, b, N, mode)
    if ckpt and D.nx != D.r:
        b.free(D.r * D.d * N, "activations")        # the checkpoint's saved input, once its backward ends
    out["backward_layers"] = layers_peak(k, b, L)
    e = Walk(*after_layers(k, b, L), shard)
    embedding_bw(D, e, N, mode)
    out["backward_end"] = (e.peak, e.at_peak)
    # optimizer step: parameters, gradients (the DDP bucket), state, the step's temporaries
    inputs = 2 * I64 * N
    grads = m.params // shard
    out["optimizer_step"] = (sum(fixed.values()) + grads + inputs + m.muon,
                             {**fixed, "gradients": grads, "activations": inputs, "temporaries": m.muon})
    return out


# --------------------------------------------------------------------------- the fast path (lines in N: planner/memory_terms.py)

@lru_cache(maxsize=4096)
def _block_part(D: Dims, mode: str, shard: int) -> tuple[tuple[Line, ...], Line]:
    """One block's backward from level 0: the envelope of its steps, and its net change."""
    rec = LevelRecorder(shard)
    block_bw(D, rec, 1j, mode)
    return envelope_and_net(rec)


@lru_cache(maxsize=4096)
def _loss_part(m: ModelBytes, mode: str, chunk: int, n_chunks_is_2: bool, shard: int) -> tuple[tuple[Line, ...], Line]:
    """The loss, head and norm_f backward from level 0: envelope and net change."""
    rec = LevelRecorder(shard)
    head = _saved(m, 1j, False, chunk)[1]
    # the chunk processed first is given a full chunk: an upper bound the next chunk dominates
    loss_head_bw(m.D, rec, 1j, head, mode, chunk, 2 if n_chunks_is_2 else 3, chunk)
    return envelope_and_net(rec)


@lru_cache(maxsize=4096)
def _embedding_part(D: Dims, mode: str, shard: int) -> tuple[tuple[Line, ...], Line]:
    rec = LevelRecorder(shard)
    embedding_bw(D, rec, 1j, mode)
    return envelope_and_net(rec)


@lru_cache(maxsize=16384)
def profile(spec: ModelSpec, precision: Precision, optimizer: Optimizer, ckpt: bool, chunk: int,
            n_chunks_is_2: bool, mode: str, base_grads: int, shard: int,
            mp: bool = False) -> tuple[tuple[str, tuple[Line, ...]], ...]:
    """Each phase's peak as an upper envelope of lines in N (DDP-state, gradients sharded)."""
    m = model_bytes(spec, precision, optimizer, mp)
    D = m.D
    fixed = m.params + m.buffers + m.optimizer_state
    acts, _head, loss = _saved(m, 1j, ckpt, chunk)
    level0 = to_line(fixed + base_grads + acts + loss)
    fw_loss, fw_other = _forward_extra(m, 1j, ckpt, chunk)
    forward = to_line(fixed + base_grads + acts + fw_loss + fw_other)
    loss_env, loss_net = _loss_part(m, mode, chunk, n_chunks_is_2, shard)
    top = (level0[0] + loss_net[0], level0[1] + loss_net[1])
    block_env, delta = _block_part(D, mode, shard)
    if ckpt:                                 # each block's forward is recomputed before its backward
        re = to_line(_recomputed(D, 1j))
        block_env = tuple(shift_lines(block_env, re))
        delta = (delta[0] + re[0], delta[1] + re[1] - (D.r * D.d if D.nx != D.r else 0))
    return phase_envelopes(m, shard, forward, level0, loss_env, top, block_env, delta,
                           _embedding_part(D, mode, shard)[0])
