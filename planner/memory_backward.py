"""The step's backward kernel by kernel, as allocations and frees: what both memory models replay.

Each function walks one piece of the runner's backward (runner/model.py, runner/step.py) as the
eager autograd engine runs it with CUDA kernel semantics: a linear layer, a norm, a whole block,
the loss with the head and the final norm (chunked or not), the input embeddings. It allocates
and frees on a walk (planner/memory_terms.py: `Walk` for the exact peak and its kinds,
`LevelRecorder` for the fast path) and accumulates gradients by micro-step mode (`_grad`).
planner/memory_eager.py replays them as they are; planner/memory_compiled.py replays them with
saved activations held to their block's end. Notation as in planner/memory_eager.py.
"""

from __future__ import annotations

from typing import Any

from planner.memory_terms import F32, I64, Dims, Walk, rope_casts

# --------------------------------------------------------------------------- gradients, linear layers and norms

def _rb(D: Dims) -> bool:
    """A bf16 residual under autocast: norms upcast it (a copy, cast back in backward)."""
    return D.ac and D.r != D.nx


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


def linear_bw(D: Dims, k: Walk, n_in: int, n_out: int, N: int, *, x_cast: bool, x_free: bool,
              g_free: bool, mode: str, bias: bool | None = None, g_kind: str = "temporaries",
              hold: bool = False, block: bool = True) -> None:
    """Backward of y = x Wᵀ (+ b) for N rows, with the incoming grad (a·n_out·N) alive. A block's linear under
    FSDP2 mixed precision (D.mp) saved no weight copy: its bf16 weight is FSDP's gather (block=False: the head)."""
    a, W = D.a, n_in * n_out
    copy = not (D.mp and block)
    bias = D.bias if bias is None else bias
    x_kind = "activations"
    if D.ac:
        k.alloc(a * W)                      # mm: grad of the bf16 weight copy
        k.alloc(a * n_in * N)               # mm: grad of the input
        if g_free:
            k.free(a * n_out * N, g_kind)   # the incoming grad
        if copy:
            k.free(a * W, "activations")    # the saved bf16 weight copy
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


def norm_bw(D: Dims, k: Walk, n: int, rows: int, *, weighted: bool, g_bytes: int, x_bytes: int,
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


def _resid_norm_bw(D: Dims, k: Any, N: Any, mode: str) -> None:
    """Backward of a norm over the residual stream (norm1, norm2, norm_f), its output's grad alive.

    Its input is the residual itself, or (a bf16 residual under autocast) an fp32 copy, whose
    ToCopyBackward casts the input's grad back to bf16."""
    nx, d = D.nx, D.d
    norm_bw(D, k, d, N, weighted=D.norm_w, g_bytes=nx, x_bytes=nx, x_saved=nx * d * N, mode=mode)
    if _rb(D):
        k.alloc(D.r * d * N)
        k.free(nx * d * N)


# --------------------------------------------------------------------------- a block

def block_bw(D: Dims, k: Walk, N: int, mode: str) -> None:
    """One block's backward, from the grad of its output (r·d·N) to the grad of its input."""
    a, r, d, f, q, kv = D.a, D.r, D.d, D.f, D.q, D.kv
    ac, rb = D.ac, _rb(D)
    cast = ac and not rb                    # an fp32 residual: the branch's grad is a bf16 copy
    # ---- MLP branch: x_out = x_mid + proj(act(fc(norm2(x_mid))))
    if cast:
        k.alloc(a * d * N)                  # AddBackward: the branch's grad, cast to its bf16 output
    if D.mlp == "relu2":
        linear_bw(D, k, f, d, N, x_cast=ac, x_free=True, g_free=cast, mode=mode)
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
        linear_bw(D, k, f, d, N, x_cast=False, x_free=True, g_free=cast, mode=mode)
        k.alloc(a * f * N)                  # gelu_backward
        k.free(a * f * N)
        k.free(a * f * N, "activations")    # the saved fc output
        fc_out = f
    else:
        linear_bw(D, k, f, d, N, x_cast=False, x_free=True, g_free=cast, mode=mode)
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
    linear_bw(D, k, d, fc_out, N, x_cast=ac, x_free=True, g_free=True, mode=mode)
    _resid_norm_bw(D, k, N, mode)
    k.alloc(r * d * N)                      # the residual grad accumulates the norm2 branch
    k.free(2 * r * d * N)
    # ---- attention branch: x_mid = x_in + proj(sdpa(rope/qknorm(qkv(norm1(x_in)))))
    if cast:
        k.alloc(a * d * N)
    linear_bw(D, k, q, d, N, x_cast=False, x_free=False, g_free=cast, mode=mode)
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
                norm_bw(D, k, D.hd, heads * N, weighted=False, g_bytes=F32, x_bytes=F32,
                        x_saved=F32 * n * N, mode=mode)
                k.alloc(a * n * N)          # ToCopyBackward of the fp32 upcast
                k.free(F32 * n * N)
            else:                           # saved input: the rotary output, or a view of qkv
                norm_bw(D, k, D.hd, heads * N, weighted=False, g_bytes=a, x_bytes=a,
                        x_saved=a * n * N if D.rotary else 0, mode=mode)
        if D.rotary:                        # apply_rotary backward: slices, products, cat
            k.alloc(2 * a * n * N)
            k.free(2 * a * n * N)
    if D.rotary:
        k.free(rope_casts(D), "activations")
    k.alloc(a * (q + 2 * kv) * N)           # cat: grad of the qkv output
    k.free(a * (q + 2 * kv) * N)
    linear_bw(D, k, d, q + 2 * kv, N, x_cast=ac, x_free=True, g_free=True, mode=mode)
    _resid_norm_bw(D, k, N, mode)
    k.alloc(r * d * N)                      # the residual grad accumulates the norm1 branch
    k.free(2 * r * d * N)


# --------------------------------------------------------------------------- loss, head and embeddings

def _loss_ce_bw(D: Dims, k: Walk, n: int) -> None:
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


def _loss_full_bw(D: Dims, k: Walk, N: int, mode: str) -> None:
    """Unchunked loss backward, then the head matmul's (its input: norm_f's output, a bf16 copy
    under autocast). A tied head's grad waits in the engine's buffer for the embedding's."""
    _loss_ce_bw(D, k, N)
    linear_bw(D, k, D.d, D.V, N, x_cast=D.ac, x_free=True, g_free=True, mode=mode, bias=False,
              g_kind="loss_temporaries", hold=D.tied, block=False)


def _loss_chunk_bw(D: Dims, k: Walk, c: int, N: int, first: bool, mode: str, frees_rows: int = 0) -> None:
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


def loss_head_bw(D: Dims, k: Any, N: Any, head: Any, mode: str, chunk: int, n_chunks: int,
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


def embedding_bw(D: Dims, e: Any, N: Any, mode: str) -> None:
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
