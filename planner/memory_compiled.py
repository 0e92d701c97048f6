"""Per-GPU memory of the runner's step under `torch.compile` (GPU plans compile; CPU plans do not).

What a compiled step keeps from forward to backward is decided by AOTAutograd's min-cut
partitioner, not by the eager autograd graph that planner/memory_eager.py replays. The partitioner
recomputes cheap elementwise work (fp32 upcasts, the loss's softmax) instead of saving it.
runner/compiled_trace.py reads its choice off on CPU. This module names every saved tensor it
reports, per token (notation as in planner/memory_eager.py: d width, f MLP width, q/kv projection
widths, H/KV heads, V vocabulary; a = matmul activation bytes, r = residual-stream bytes, the
one input a bf16 residual stream changes):

- each norm feeding a matmul: its normalised input in fp32, or with a bf16 stream the residual
  itself (r·d); the matmul input cast to bf16 (a·d, none in fp32); its rstd (fp32);
- attention: the fused qkv buffer (a·(q+2kv); v, a view of it, keeps it alive); rotated q and k
  (a·(q+kv)); with qk-norm their rstd per head and the normalised q, k as SDPA takes them;
  SDPA's output and logsumexp (flash attention);
- MLP: the fc output and the activation's output (ReLU²: the bf16 square, not eager's fp32
  copy; SwiGLU: the gate·up product);
- per layer, constant: the bf16 copies of its weights (autocast);
- the embedding, final norm, head input, and without loss chunking the bf16 logits and the
  loss's per-row statistics (not eager's fp32 log_softmax/tanh); the head's bf16 weight copy.

The first block under autocast: the partitioner keeps the embedding output and the attention
projection's output in place of the block's two fp32 normalised inputs (measured; with learned
positions it does not).

The backward is not knowable on CPU: inductor fuses kernels and reuses buffers. Two plausible
liveness walks differ by 3.7 GiB at d20 B32 (docs/sources.md §7). This model takes the conservative
one: no saved tensor of a block is freed before that block's backward ends, and the backward's
temporaries are those of the eager kernels (planner/memory_backward.py, unfused). The loss backward
holds the fp32 gradient of the logits beside its bf16 cast. See docs/memory.md.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from planner.memory_backward import block_bw, embedding_bw, linear_bw, loss_head_bw, norm_bw
from planner.memory_terms import (
    F32,
    I64,
    Dims,
    LevelRecorder,
    Line,
    ModelBytes,
    Walk,
    after_layers,
    block_weights,
    envelope_and_net,
    layers_peak,
    phase_envelopes,
    shift_lines,
    to_line,
    upper_envelope,
)

# --------------------------------------------------------------------------- saved tensors


def _norm_site(D: Dims) -> int:
    """Per token, a norm whose output feeds a matmul: normalised fp32 input (or the bf16
    residual) r·d, the matmul's input a·d (a bf16 cast; in fp32 only a weighted norm's output,
    γ·x̂ + β, differs from what the norm's backward recomputes from its input), the rstd."""
    return D.r * D.d + (D.a * D.d if D.a < F32 or D.norm_w else 0) + F32


def _attn_saved(D: Dims) -> int:
    a, qk = D.a, D.q + D.kv
    out = a * (D.q + 2 * D.kv)                      # the fused qkv buffer (v keeps it alive)
    if D.qk_norm:
        rotated = a * qk if (D.rotary and a < F32) else 0   # qk-norm input (fp32: recomputed)
        out += rotated + F32 * (D.H + D.KV) + a * qk  # + rstd per head + normalised q, k (SDPA's)
    elif D.rotary:
        out += a * qk                               # rotated q, k (SDPA's inputs)
    return out + a * D.q + F32 * D.H                # SDPA output and logsumexp


def _mlp_saved(D: Dims) -> int:
    if D.mlp == "swiglu":
        return 3 * D.a * D.f                        # fc output (gate, up), gate·up product
    return 2 * D.a * D.f                            # fc output, activation output (bf16 square / gelu)


def block_per_token(D: Dims) -> int:
    """Bytes per token one compiled block saves for backward."""
    return 2 * _norm_site(D) + _attn_saved(D) + _mlp_saved(D)


def _first_block_delta(D: Dims) -> int:
    """Per token: the first block under autocast keeps the embedding (r·d) and the attention
    projection's output (a·d) instead of its two normalised fp32 inputs (2·r·d)."""
    if D.ac and not D.learned_pos:
        return D.r * D.d + D.a * D.d - 2 * D.r * D.d
    if D.a < F32 and not D.ac:
        return D.r * D.d                            # bf16: the embedding, block 0's input residual
    return 0


def weight_copies(D: Dims) -> int:
    """One layer's constant bf16 weight copies (autocast)."""
    return D.a * block_weights(D) if (D.ac and not D.mp) else 0


def _ce_stats(D: Dims) -> int:
    """The compiled cross-entropy's per-row saved statistics (max, log-sum, mask)."""
    return 2 * F32 + (F32 + 1 if D.softcap else 0)


def saved_parts(m: ModelBytes, N: Any, ckpt: bool, chunk: int) -> dict[str, Any]:
    """The compiled step's saved bytes for N tokens, by part (graph inputs excluded)."""
    D, L = m.D, m.L
    d, V = D.d, D.V
    parts: dict[str, Any] = {}
    if ckpt:
        parts["blocks"] = L * D.r * d * N           # each block's input (the embedding for block 0)
        parts["weight_copies"] = 0
    else:
        parts["blocks"] = L * block_per_token(D) * N + _first_block_delta(D) * N
        parts["weight_copies"] = L * weight_copies(D)
    parts["positions"] = I64 * D.T if D.learned_pos else 0
    if chunk:
        parts["final_norm"] = (D.r * d + F32) * N  # the head rows, recomputed chunk by chunk
        parts["loss"] = 0
        parts["head_copy"] = 0
    else:
        parts["final_norm"] = ((D.a * d + F32) if ckpt else _norm_site(D)) * N
        parts["loss"] = (D.a * V + _ce_stats(D)) * N  # logits (matmul output) and row statistics
        parts["head_copy"] = D.a * V * d if D.ac else 0
    return parts


def saved_bytes(m: ModelBytes, N: Any, ckpt: bool, chunk: int) -> Any:
    return sum(saved_parts(m, N, ckpt, chunk).values())


# --------------------------------------------------------------------------- the conservative walk


def _held(n: Any, kind: str, pending: list[Any]) -> tuple[Any, str]:
    """What the eager kernels (planner.memory_backward) free, under the conservative compiled walk.

    A saved activation is held until its block's backward ends ('saved' frees it), so the eager
    walk's frees of saved tensors free nothing; what the walk itself allocated as activations
    (the chunked loss's recomputed rows and weight copy, `pending`) is freed as usual.
    """
    if kind == "activations":
        if pending and n == sum(pending):
            pending.clear()
            return n, "temporaries"
        return 0, kind
    return n, kind


class _HoldWalk(Walk):
    """A `Walk` (planner.memory_terms) with saved activations held (see `_held`)."""

    __slots__ = ("pending",)

    def __init__(self, level: int, kinds: dict[str, int] | None = None, shard: int = 1) -> None:
        super().__init__(level, kinds, shard)
        self.pending: list[Any] = []

    def alloc(self, n: int, kind: str = "temporaries") -> None:
        if kind == "activations":
            self.pending.append(n)
            kind = "temporaries"
        super().alloc(n, kind)

    def free(self, n: int, kind: str = "temporaries") -> None:
        n, kind = _held(n, kind, self.pending)
        if n:
            super().free(n, kind)


class _HoldRec(LevelRecorder):
    __slots__ = ("pending",)

    def __init__(self, shard: int) -> None:
        super().__init__(shard)
        self.pending: list[Any] = []

    def alloc(self, n: Any, kind: str = "temporaries") -> None:
        if kind == "activations":
            self.pending.append(n)
        super().alloc(n, kind)

    def free(self, n: Any, kind: str = "temporaries") -> None:
        n, kind = _held(n, kind, self.pending)
        super().free(n, kind)


def _block_saved(m: ModelBytes, N: Any) -> Any:
    return block_per_token(m.D) * N + weight_copies(m.D)


def _full_loss_bw(m: ModelBytes, k: Any, N: Any, mode: str) -> None:
    """Unchunked compiled loss backward: the fp32 grad of the logits beside its bf16 cast, then
    the head matmul's backward and the final norm's (saved tensors held)."""
    D = m.D
    NV = N * D.V
    k.alloc(F32 * NV, "loss_temporaries")
    if D.a < F32:
        k.alloc(D.a * NV, "loss_temporaries")
        k.free(F32 * NV, "loss_temporaries")
    linear_bw(D, k, D.d, D.V, N, x_cast=D.ac, x_free=False, g_free=True, mode=mode, bias=False,
              g_kind="loss_temporaries", hold=D.tied, block=False)
    norm_bw(D, k, D.d, N, weighted=D.norm_w, g_bytes=D.r, x_bytes=D.r, x_saved=0, mode=mode)


def _loss_bw(m: ModelBytes, k: Any, N: Any, mode: str, chunk: int, n_chunks: int, first_chunk: Any) -> None:
    parts = saved_parts(m, N, False, chunk)
    if chunk:   # the checkpointed chunks recompute as in eager; the head rows are the saved final norm
        loss_head_bw(m.D, k, N, parts["final_norm"], mode, chunk, n_chunks, first_chunk)
    else:
        _full_loss_bw(m, k, N, mode)
    k.free(parts["final_norm"] + parts["loss"] + parts["head_copy"], "saved")


def _loss_fw(m: ModelBytes, N: Any, chunk: int) -> Any:
    """Beyond the saved tensors, at the loss forward: one fp32 logit-sized buffer (unchunked),
    or a chunk's bf16 and fp32 logits and the head's bf16 weight copy (chunked)."""
    D = m.D
    if not chunk:
        return F32 * N * D.V
    return chunk * D.V * (D.a + F32 if D.a < F32 else F32) + (D.a * D.V * D.d if D.ac else 0)


def _block_walk(m: ModelBytes, k: Any, N: Any, mode: str, ckpt: bool, block: Any = None) -> None:
    saved = _block_saved(m, N) if block is None else block
    if ckpt:
        k.alloc(saved, "saved")                     # the block's forward, recomputed
    block_bw(m.D, k, N, mode)
    k.free(saved + (m.D.r * m.D.d * N if ckpt else 0), "saved")


def step_walk(m: ModelBytes, N: int, ckpt: bool, chunk: int, n_chunks: int, mode: str, base_grads: int,
              shard: int = 1, saved: tuple[int, int | None] | None = None) -> dict[str, tuple[int, dict[str, int]]]:
    """Each phase's peak and its kinds, for the compiled step (see the module docstring).

    saved: (all saved bytes, one block's saved bytes or None) measured by runner.compiled_trace,
    in place of this module's counts (the traced step: the capture in the same walk).
    """
    L = m.L
    fixed = {"parameters": m.params, "buffers": m.buffers, "optimizer_state": m.optimizer_state}
    acts = (saved_bytes(m, N, ckpt, chunk) if saved is None else saved[0]) + 2 * I64 * N
    kinds0 = {**fixed, "gradients": base_grads, "activations": acts, "loss_temporaries": 0, "temporaries": 0}
    level0 = sum(kinds0.values())
    out: dict[str, tuple[int, dict[str, int]]] = {}
    fw = _loss_fw(m, N, chunk)
    out["forward_end"] = (level0 + fw, {**kinds0, "loss_temporaries": fw})
    k = _HoldWalk(level0, kinds0, shard)
    _loss_bw(m, k, N, mode, chunk, n_chunks, N - (n_chunks - 1) * chunk if chunk else 0)
    out["backward_start"] = (k.peak, k.at_peak)
    b = _HoldWalk(0, {}, shard)
    _block_walk(m, b, N, mode, ckpt, None if saved is None else saved[1])
    out["backward_layers"] = layers_peak(k, b, L)
    e = _HoldWalk(*after_layers(k, b, L), shard)
    embedding_bw(m.D, e, N, mode)
    out["backward_end"] = (e.peak, e.at_peak)
    grads = m.params // shard
    out["optimizer_step"] = (sum(fixed.values()) + grads + 2 * I64 * N + m.muon,
                             {**fixed, "gradients": grads, "activations": 2 * I64 * N, "temporaries": m.muon})
    return {p: (lv, _fold(kinds)) for p, (lv, kinds) in out.items()}


def _fold(kinds: dict[str, int]) -> dict[str, int]:
    """'saved' (compiled saved tensors freed at once) is part of activations."""
    kinds = dict(kinds)
    kinds["activations"] = kinds.get("activations", 0) + kinds.pop("saved", 0)
    return kinds


# --------------------------------------------------------------------------- the fast path


@lru_cache(maxsize=4096)
def _loss_part(m: ModelBytes, mode: str, chunk: int, n_chunks_is_2: bool, shard: int) -> tuple[tuple[Line, ...], Line]:
    """The loss, head and final norm backward from level 0: envelope and net change (no checkpointing
    dependence, so the search's settings share it, as planner.memory_eager's parts)."""
    rec = _HoldRec(shard)
    _loss_bw(m, rec, 1j, mode, chunk, 2 if n_chunks_is_2 else 3, chunk)
    return envelope_and_net(rec)


@lru_cache(maxsize=4096)
def _block_part(m: ModelBytes, mode: str, ckpt: bool, shard: int) -> tuple[tuple[Line, ...], Line]:
    """One block's backward from level 0: the envelope of its steps, and its net change.

    With checkpointing the walk is the same backward on top of the block's recomputed forward
    (`_block_walk`): every level shifted by its saved bytes, which it then frees with the block's input."""
    if not ckpt:
        rec = _HoldRec(shard)
        _block_walk(m, rec, 1j, mode, False)
        return envelope_and_net(rec)
    env, net = _block_part(m, mode, False, shard)
    saved = to_line(_block_saved(m, 1j))
    return (upper_envelope([saved, *shift_lines(env, saved)]),
            (net[0] + saved[0], net[1] + saved[1] - m.D.r * m.D.d))


@lru_cache(maxsize=4096)
def _embedding_part(m: ModelBytes, mode: str, shard: int) -> tuple[Line, ...]:
    rec = _HoldRec(shard)
    embedding_bw(m.D, rec, 1j, mode)
    return envelope_and_net(rec)[0]


@lru_cache(maxsize=16384)
def profile(m: ModelBytes, ckpt: bool, chunk: int, n_chunks_is_2: bool, mode: str, base_grads: int,
            shard: int) -> tuple[tuple[str, tuple[Line, ...]], ...]:
    """Each phase's peak as an upper envelope of lines in N (as planner.memory_eager.profile)."""
    fixed = m.params + m.buffers + m.optimizer_state
    level0 = to_line(fixed + base_grads + saved_bytes(m, 1j, ckpt, chunk) + 2 * I64 * 1j)
    forward = to_line(fixed + base_grads + saved_bytes(m, 1j, ckpt, chunk) + 2 * I64 * 1j + _loss_fw(m, 1j, chunk))
    loss_env, loss_net = _loss_part(m, mode, chunk, n_chunks_is_2, shard)
    top = (level0[0] + loss_net[0], level0[1] + loss_net[1])
    block_env, delta = _block_part(m, mode, ckpt, shard)
    return phase_envelopes(m, shard, forward, level0, loss_env, top, block_env, delta,
                           _embedding_part(m, mode, shard))
