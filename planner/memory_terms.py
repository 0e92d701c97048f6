"""The vocabulary the memory models share: what a step is, the bytes it counts in, and how a walk records it.

Both models of the step, the eager one (planner/memory_eager.py) and the compiled one
(planner/memory_compiled.py), speak in these terms, and planner/memory.py picks between them:

- the step: `StepConfig` (and its `Precision`, `Optimizer`, `Strategy`) and the result, `MemoryEstimate`;
- byte sizes: `F32`, `I64`, `precision_bytes`, `residual_bytes`;
- the model's dimensions and byte widths (`Dims`) and its fixed bytes: parameters, buffers,
  optimizer state, Muon's temporaries (`ModelBytes`, cached per spec, precision and optimizer);
- sharding (zero1, zero2, fsdp): what is divided by dp and what a rank holds beyond even shares;
- records of a walk: `Walk` (a level, its peak and its kinds, for `estimate`) and `LevelRecorder`
  (levels as lines in N, for the cached fast path), and the helpers that assemble each phase's peak
  from one walk of the loss, one block and the embedding.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Literal

from planner.counts import attn_weight_params, mlp_weight_params, n_params, norm_params, param_counts
from planner.spec import ModelSpec

Precision = Literal["bf16-autocast", "bf16", "fp32"]
Optimizer = Literal["adamw", "muon"]
Strategy = Literal["ddp", "zero1", "zero2", "fsdp", "hsdp"]   # hsdp: planned, not run (planner/memory_parallel.py)
AcPolicy = Literal["full", "selective-op"]
ReduceDtype = Literal["fp32", "bf16"]
STRATEGIES: tuple[Strategy, ...] = ("ddp", "zero1", "zero2", "fsdp")    # what the runner runs, and the search tries

F32 = 4          # fp32 bytes: losses, rstd/mean statistics, autocast's fp32 ops
I64 = 8          # token ids


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
    # with activation_checkpointing: what a checkpointed block keeps. "full": its input only, the forward is re-run;
    # "selective-op": torchtitan's op-level policy (torch.utils.checkpoint with a policy): the outputs of every
    # other matmul and of attention are saved, the rest is recomputed (planner.checkpointing).
    ac_policy: AcPolicy = "full"
    ac_every: int = 1           # checkpoint every k-th block (1: every block; torchtitan's selective "layer" is 2)
    fp8: bool = False           # FP8 matmuls in the blocks' linears (torchao Float8Linear); modelled, not run
    reduce_dtype: ReduceDtype | None = None   # dtype gradients are reduced in; None: the weight dtype (the runner)
    # q, k, v (and SwiGLU's gate and up) as separate linears, as torchtitan's Llama block has them; the runner fuses
    # them. Only which matmuls op-level checkpointing recomputes depends on it (planner.checkpointing).
    separate_projections: bool = False
    # tensor parallelism (Megatron-style, planner/memory_parallel.py): the degree t, and whether the sequence-parallel
    # variant shards the norms' and residual's activations too. dp is then the data-parallel degree, GPUs / t.
    tp: int = 1
    sequence_parallel: bool = True
    # hsdp: the shard group (FSDP within it), the other dp / hsdp_shard groups replicate; 0 for other strategies
    hsdp_shard: int = 0


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


def precision_bytes(precision: Precision) -> tuple[int, int, int]:
    """(weight bytes, matmul activation bytes, residual-stream bytes)."""
    if precision == "bf16-autocast":
        return 4, 2, 2       # fp32 master weights; bf16 matmuls and residual stream (runner/model.py)
    if precision == "bf16":
        return 2, 2, 2
    return 4, 4, 4


def residual_bytes(precision: Precision) -> int:
    """Bytes per element of the residual stream between blocks: the one input every residual
    term of the memory model (eager in planner/memory_eager.py, compiled in planner/memory_compiled.py)
    reads, as `Dims.r`."""
    return precision_bytes(precision)[2]


@dataclass(frozen=True)
class Dims:
    """The model's dimensions and byte widths every term reads (notation: planner/memory_eager.py)."""

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
    mp: bool = False    # weights reach the blocks as FSDP2's bf16 gathers: no autocast copies are cached or saved


def fsdp_mixed_precision(cfg: StepConfig) -> bool:
    """zero2/fsdp over several GPUs under bf16 autocast: the runner gives FSDP2 MixedPrecisionPolicy(param_dtype=
    bf16) on CUDA (runner/parallel.py), so a block's weights are gathered in bf16 and used as they are: no fp32
    weight is cast per matmul, nothing is cached or saved for it. (CPU plans are fp32.)"""
    return cfg.precision == "bf16-autocast" and cfg.strategy in ("zero2", "fsdp") and cfg.dp > 1


def dims(spec: ModelSpec, precision: Precision, mp: bool = False) -> Dims:
    w, a, r = precision_bytes(precision)
    return Dims(
        d=spec.d_model, f=spec.d_ff, q=spec.n_head * spec.head_dim, kv=spec.n_kv_head * spec.head_dim,
        H=spec.n_head, KV=spec.n_kv_head, hd=spec.head_dim, T=spec.seq_len, V=spec.vocab_size,
        w=w, a=a, r=r, nx=F32 if precision == "bf16-autocast" else r, ac=precision == "bf16-autocast",
        mlp=spec.mlp, ln=spec.norm == "layernorm",
        norm_w=spec.norm != "rmsnorm_noweight", rotary=spec.pos == "rotary", qk_norm=spec.qk_norm,
        softcap=spec.logit_softcap is not None, tied=spec.tied, bias=spec.bias,
        learned_pos=spec.pos == "learned", mp=mp and precision == "bf16-autocast",
    )


def rope_casts(D: Dims) -> int:
    """apply_rotary casts cos and sin to q's dtype, for q and for k: 4 × T·hd/2 per layer."""
    return 2 * D.T * D.hd * D.a if D.rotary and D.a != F32 else 0


def block_weights(D: Dims) -> int:
    """Elements of one block's matmul weights (qkv, attention projection, MLP)."""
    n_in = 2 if D.mlp == "swiglu" else 1
    return D.d * (D.q + 2 * D.kv) + D.q * D.d + (n_in + 1) * D.d * D.f


# --------------------------------------------------------------------------- the model's fixed bytes

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


def _muon_temporaries(D: Dims) -> int:
    """Largest Muon step temporaries over the hidden matrices (m×n, s = min(m, n)): the Nesterov
    update (param dtype), its bf16 copy and the Newton-Schulz iterate, gram and update (bf16)."""
    n_in = 2 if D.mlp == "swiglu" else 1
    shapes = ((D.q + 2 * D.kv, D.d), (D.d, D.q), (n_in * D.f, D.d), (D.d, D.f))
    return max(D.w * m * n + 4 * m * n + 4 * min(m, n) ** 2 for m, n in shapes)


@dataclass(frozen=True)
class ModelBytes:
    """What the step's memory needs from the spec, precision and optimizer (cached)."""

    D: Dims
    L: int
    params: int
    buffers: int
    optimizer_state: int
    muon: int


@lru_cache(maxsize=4096)
def model_bytes(spec: ModelSpec, precision: Precision, optimizer: Optimizer, mp: bool = False) -> ModelBytes:
    D = dims(spec, precision, mp)
    P = n_params(spec)
    return ModelBytes(D=D, L=spec.n_layer, params=P * D.w, buffers=4 * D.T * D.hd if D.rotary else 0,
                      optimizer_state=_optimizer_state(spec, optimizer, D.w),
                      muon=_muon_temporaries(D) if optimizer == "muon" else 0)


# --------------------------------------------------------------------------- sharding

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
def sharded_extra(strategy: str, spec: ModelSpec, w: int, dp: int, mp: bool = False) -> tuple[str, int]:
    """(category, bytes) a sharded rank holds beyond its even shares during the step.

    fsdp (FSDP2, reshard_after_forward=True) gathers two layers ahead of use: temporaries.
    zero2 (FSDP2, reshard_after_forward=False, runner/parallel.py) keeps every gathered layer
    from its forward to its backward, beside its own parameter shard: the full parameters plus
    1/dp. Gathered copies are at the weight width w, or bf16 (2 bytes) under FSDP2's mixed precision
    (`mp`, fsdp_mixed_precision): then zero2 holds its fp32 shard plus every layer in bf16
    (tests/test_shard_state.py measures the fp32 CPU case).
    """
    g = 2 if mp else w
    if strategy == "fsdp":
        return "temporaries", fsdp_gathered_bytes(spec, g)
    if strategy == "zero2" and dp > 1:
        P = n_params(spec)
        return "parameters", (P * w // dp if not mp else P * g + P * w // dp - P * w)
    return "temporaries", 0


def shard_breakdown(breakdown: dict[str, int], strategy: str, dp: int, spec: ModelSpec, w: int,
                    mp: bool = False) -> dict[str, int]:
    """Divide optimizer state (zero1+) and parameters (fsdp) by dp and add what sharding holds
    beyond even shares (`sharded_extra`; gradients are sharded while walking the step, see `_grad` in planner/memory_backward.py)."""
    out = dict(breakdown)
    for key in SHARDED[strategy]:
        if key != "gradients":
            out[key] = out[key] // dp
    key, extra = sharded_extra(strategy, spec, w, dp, mp)
    out[key] += extra
    return out


def grad_shard(cfg: StepConfig) -> int:
    """The degree gradients are sharded over: dp for zero2 and fsdp, else 1."""
    return max(1, cfg.dp) if cfg.strategy in ("zero2", "fsdp") else 1


def state_cut(m: ModelBytes, strategy: str, dp: int, w: int, spec: ModelSpec, mp: bool = False) -> int:
    """Bytes sharding removes from optimizer state (zero1+) and parameters (fsdp), minus the
    two layers FSDP keeps gathered; gradients are sharded inside the walk."""
    if strategy == "ddp" or dp <= 1:
        return 0
    cut = m.optimizer_state - m.optimizer_state // dp
    if strategy == "fsdp":
        cut += m.params - m.params // dp
    return cut - sharded_extra(strategy, spec, w, dp, mp)[1]


# --------------------------------------------------------------------------- records of a walk

class Walk:
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


# --------------------------------------------------------------------------- lines in N (the fast path)
#
# Every byte count of a walk is linear in N (tokens per micro-batch) once the model, precision,
# optimizer, checkpointing and chunk layout are fixed. The fast path replays each part of the
# backward once with N = 1j (the imaginary part collects the per-token bytes), keeps the upper
# envelope of the resulting lines, and caches it, so a search pays a few lines per candidate.

Line = tuple[int, int]               # (bytes at N = 0, bytes per token)


class LevelRecorder:
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


def to_line(z: Any) -> Line:
    z = complex(z)
    return (round(z.real), round(z.imag))


def upper_envelope(lines: list[Line]) -> tuple[Line, ...]:
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


def shift_lines(lines: tuple[Line, ...], by: Line) -> list[Line]:
    return [(a0 + by[0], b0 + by[1]) for a0, b0 in lines]


def envelope_and_net(walk: Any) -> tuple[tuple[Line, ...], Line]:
    """A recorded part of the walk: the upper envelope of its levels, and its net change."""
    return upper_envelope([to_line(z) for z in walk.steps]), to_line(walk.level)


def phase_envelopes(m: ModelBytes, shard: int, forward: Line, level0: Line, loss_env: tuple[Line, ...], top: Line,
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
        ("backward_start", upper_envelope([level0, *shift_lines(loss_env, level0)])),
        ("backward_layers", upper_envelope(shift_lines(block_env, top) + shift_lines(block_env, bottom))),
        ("backward_end", upper_envelope([end, *shift_lines(emb_env, end)])),
        ("optimizer_step", (to_line(fixed + m.params // shard + 2 * I64 * 1j + m.muon),)),
    )
