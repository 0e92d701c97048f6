"""The compute of one token's forward and backward on one GPU, term by term (planner/throughput.py adds the rest).

    seconds per token = matmul FLOPs / matmul rate + attention FLOPs / attention rate + element-wise bytes / HBM

- matmul FLOPs: 6·N_matmul (PaLM, counts.matmul_params: the blocks' projections and the head), plus what
  activation checkpointing re-runs (planner/checkpointing.py) and the chunked loss's head recompute. The rate is
  the GPU's achievable dense matmul rate (profile `speed.matmul_tflops`: the MAMF, a cited measurement) ×
  `matmul_efficiency`. With `fp8` the blocks' linears run at `speed.fp8_matmul_tflops` (torchao Float8Linear
  converts the blocks' nn.Linear; the output head stays bf16, as torchtitan's float8 filter does). fp32 plans run
  at TF32: the same efficiency against tf32_tflops.
- attention FLOPs: what causal flash attention computes, 7·T·q per token and layer (forward 2·T·q, half of the
  4·T·q score and value matmuls under the causal mask; backward 2.5 × forward: it recomputes the scores), plus
  the forward again in a fully checkpointed block; sliding windows scale it by their span (planner/kernels.py).
  Rate: the GPU's flash-attention rate (profile `speed.attention_tflops`, cited: FlashAttention-2's published
  forward + backward TFLOP/s) × the kernel the software runs, relative to FA2 (planner/kernels.py: cited, e.g.
  cuDNN 1.6× and FlashAttention-3 1.73× on Hopper) × `attention_efficiency`.
- element-wise work (norms, activations, residual adds, rotary, casts, the loss): memory-bound, at the profile's
  HBM bandwidth × HBM_EFFICIENCY. A block moves `elementwise` (eager) or `elementwise_compiled` (torch.compile's
  fused kernels, fitted apart) bytes per byte it saves for backward (memory_eager.layer_activation_bytes,
  memory_compiled.block_per_token): the saved tensors are what its kernels write, and read back in backward. The
  loss's logit-wide passes are counted directly (`loss_bytes_per_token`); FP8's casts too (`fp8_cast_bytes`).

Constants: planner/speed_constants.py (fitted on benchmarks/public_runs calibration rows).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from planner.checkpointing import checkpointed_blocks, recompute_attention_share, recomputed_matmul_params
from planner.counts import matmul_params, matrix_params
from planner.kernels import StepSoftware, kernel_speedup, runner_software, seq_len_factor
from planner.memory_compiled import block_per_token
from planner.memory_eager import layer_activation_bytes
from planner.memory_terms import F32, Precision, dims, precision_bytes
from planner.profiles import HardwareProfile
from planner.spec import ModelSpec
from planner.speed_constants import DEFAULT, SpeedConstants

HBM_EFFICIENCY = 0.9     # achieved / nominal HBM bandwidth: device-to-device copies measured at 3.0 of 3.35 TB/s
                         # on H100 and 4.3 of 4.8 TB/s on H200 (docs/sources.md §4)
UNALIGNED_HEAD_SLOWDOWN = 2.0   # the output head's GEMMs when the vocabulary is not a multiple of 8 (odd leading
                                # dimensions take cuBLAS's slow, non-tensor-core-aligned path): karpathy/nanoGPT@77e7e04c
                                # "padding 50257 -> 50304 ... about 25% faster ... the last layer ... consuming about 40%
                                # of latency": the head went from 0.4 to 0.2 of the old step, 2x
HEAD_ALIGN = 8                  # elements: bf16 tensor-core GEMMs want dimensions that are multiples of 8
FP8_CAST_BYTES_EAGER = 6     # per element of a linear's input and of its output grad: amax (read 2), cast (read 2,
FP8_CAST_BYTES_COMPILED = 4  # write 1), transposed fp8 copy for the weight grad (write 1); compiled, the amax is
                             # fused into the producing kernel (torchao float8 tensorwise recipe)


@dataclass(frozen=True, slots=True)
class StepVariant:
    """Where another trainer's step computes differently from the runner's (planner/trainers/ supplies it;
    None: the runner's step). `attention_keys`: the keys each layer's queries attend (sliding windows, as
    nanochat's `--window-pattern`; () for the full sequence in every layer), for the PaLM count of FLOPs; the time
    they save is the attention span of the trainer's StepSoftware (planner/kernels.py). `fp8_head`: with FP8, the output head's
    three matmuls run in FP8 too, and cast their input and output widths (nanochat converts lm_head; torchtitan's
    float8 filter keeps it bf16, the runner's assumption). `matmul_constant`: the planner.speed_constants field that
    scales the trainer's matmul time, fitted on its own public rows (nanochat's: `nanochat_matmul`); "" for none."""

    attention_keys: tuple[int, ...] = ()
    fp8_head: bool = False
    matmul_constant: str = ""

    def matmul_time(self, k: SpeedConstants) -> float:
        """The trainer's matmul time relative to the model's (its fitted SpeedConstants field; 1 without one)."""
        return float(getattr(k, self.matmul_constant)) if self.matmul_constant else 1.0

    def palm_keys(self, spec: ModelSpec) -> int:
        """Σ over layers of min(window, seq_len): the PaLM count's keys (n_layer·seq_len without windows)."""
        if not self.attention_keys:
            return spec.n_layer * spec.seq_len
        return sum(min(w, spec.seq_len) for w in self.attention_keys)

    def palm_flops_delta(self, spec: ModelSpec) -> int:
        """What the windows take off the PaLM count of FLOPs per token (planner.counts.flops_per_token): ≤ 0."""
        q = spec.n_head * spec.head_dim
        return 12 * q * (self.palm_keys(spec) - spec.n_layer * spec.seq_len)


@dataclass(frozen=True, slots=True)
class ComputeTerms:
    """Seconds per token on one GPU, by term (recompute included)."""

    matmul: float
    attention: float
    elementwise: float
    hw_flops: float          # FLOPs per token the GPU executes in the PaLM count (model FLOPs + recompute)

    @property
    def total(self) -> float:
        return self.matmul + self.attention + self.elementwise


def hbm_rate(prof: HardwareProfile) -> float:
    """Achieved memory bandwidth of one GPU for streaming element-wise kernels, bytes/s."""
    return prof.hbm_tb_s * 1e12 * HBM_EFFICIENCY


def matmul_rate(prof: HardwareProfile, precision: str, fp8: bool = False, k: SpeedConstants = DEFAULT) -> float:
    """FLOP/s the step's matmuls reach: the profile's achievable rate × matmul_efficiency."""
    if prof.speed is None:
        raise ValueError(f"{prof.name} has no speed section")
    eff = k.matmul_efficiency_ampere if prof.speed.architecture == "ampere" else k.matmul_efficiency
    if fp8 and prof.speed.fp8_matmul_tflops:
        return prof.speed.fp8_matmul_tflops * 1e12 * eff
    base = prof.speed.matmul_tflops * 1e12 * eff
    if precision == "fp32":
        return base * prof.tf32_tflops / prof.bf16_tflops
    return base


def attention_rate(prof: HardwareProfile, software: StepSoftware, seq_len: int, k: SpeedConstants = DEFAULT) -> float:
    """FLOP/s causal attention reaches: the GPU's FlashAttention-2 rate × the kernel's cited speed-up × the cited
    sequence-length curve × the fitted attention_efficiency."""
    if prof.speed is None:
        raise ValueError(f"{prof.name} has no speed section")
    speedup = kernel_speedup(software.attention, prof.speed.architecture, k.triton_attention)
    return prof.speed.attention_tflops * 1e12 * speedup * seq_len_factor(seq_len) * k.attention_efficiency


def elementwise_factor(compiled: bool, k: SpeedConstants = DEFAULT) -> float:
    """HBM bytes of a block's element-wise kernels per byte it saves: eager, or torch.compile's fused kernels."""
    return k.elementwise_compiled if compiled else k.elementwise


def loss_bytes_per_token(spec: ModelSpec, precision: Precision, compiled: bool) -> float:
    """HBM bytes of the loss's logit-wide element-wise passes, forward and backward, per token.

    Eager (runner/model.py head_loss): bf16 logits → .float() → [softcap: ÷, tanh, ×] → log_softmax → nll, and
    their backward: 3 activation-width and 8 fp32 accesses per logit, plus 16 fp32 ones for the softcap's three
    ops. Compiled: one fused forward and one fused backward pass, reading the logits twice and writing their grad
    (4 activation-width accesses)."""
    a = precision_bytes(precision)[1]
    V = spec.vocab_size
    if compiled:
        return 4.0 * a * V
    return float(V * (3 * a + 8 * F32 + (16 * F32 if spec.logit_softcap is not None else 0)))


def linear_widths(spec: ModelSpec) -> int:
    """Σ (input width + output width) over one block's linears (fused qkv, attention projection, fc, MLP projection)."""
    q, kv = spec.n_head * spec.head_dim, spec.n_kv_head * spec.head_dim
    n_in = 2 if spec.mlp == "swiglu" else 1
    d, f = spec.d_model, spec.d_ff
    return (d + q + 2 * kv) + (q + d) + (d + n_in * f) + (f + d)


def gemm_io_bytes(spec: ModelSpec, a: int) -> float:
    """Bytes per token the GEMMs read and write besides their weights: each linear reads its input row and writes
    its output row in the forward; the backward's two GEMMs read the output grad and write the input grad, and
    read the input and the output grad (3 × a × (in + out) per linear; the head too)."""
    return 3.0 * a * (spec.n_layer * linear_widths(spec) + spec.d_model + spec.vocab_size)


def fp8_cast_bytes(spec: ModelSpec, compiled: bool) -> float:
    """Bytes per token of FP8 casts for the blocks' linears: per element of each input and output width."""
    return float(spec.n_layer * linear_widths(spec) * (FP8_CAST_BYTES_COMPILED if compiled else FP8_CAST_BYTES_EAGER))


@lru_cache(maxsize=8192)
def _block_elementwise_bytes(spec: ModelSpec, precision: Precision, compiled: bool, low_precision_norms: bool = False
                             ) -> int:
    """Bytes one block saves per token: the basis of its element-wise traffic. `low_precision_norms`: an eager
    block's norms save their input in the autocast dtype, not autocast's fp32 copy (StepSoftware)."""
    if compiled:
        return block_per_token(dims(spec, precision))
    eager = layer_activation_bytes(spec, precision)
    if low_precision_norms:    # the two norms' saved inputs (memory_eager: 2·nx·d) at the autocast width
        D = dims(spec, precision)
        eager -= 2 * max(0, D.nx - D.a) * D.d
    return eager


def compute_terms(spec: ModelSpec, prof: HardwareProfile, *, precision: Precision, compiled: bool, ac: bool,
                  ac_every: int = 1, ac_policy: str = "full", fp8: bool = False,
                  k: SpeedConstants = DEFAULT, variant: StepVariant | None = None,
                  software: StepSoftware | None = None) -> ComputeTerms:
    """Seconds per token of one GPU's forward and backward (module docstring), without the chunked loss's
    recompute (throughput.loss_recompute_flops_per_token, added per micro-batch). `variant`: another trainer's
    step (StepVariant: the keys its PaLM count takes, an FP8 head), None for the runner's. `software`: the attention
    kernel and span the trainer runs (planner/kernels.py; None: nanoplan's runner); the span is what its sliding
    windows take off the attention time."""
    sw = software or runner_software(prof)
    L, T = spec.n_layer, spec.seq_len
    v = variant or StepVariant()
    q = spec.n_head * spec.head_dim
    n_ck = checkpointed_blocks(L, ac, ac_every)
    re_mm = 2.0 * n_ck * recomputed_matmul_params(spec, ac_policy) if n_ck else 0.0
    head_mm = 6.0 * (matmul_params(spec) - matrix_params(spec))           # the output head (bf16 under fp8)
    if spec.vocab_size % HEAD_ALIGN:
        head_mm *= UNALIGNED_HEAD_SLOWDOWN
    block_mm = 6.0 * matrix_params(spec) + re_mm
    mm_s = (head_mm / matmul_rate(prof, precision, fp8 and v.fp8_head, k)
            + block_mm / matmul_rate(prof, precision, fp8, k))
    attn_flops = (L * 7.0 * T * q + n_ck * recompute_attention_share(ac, ac_policy) * 2.0 * T * q) * sw.attention_span
    attn_s = attn_flops / attention_rate(prof, sw, T, k)
    per_block = _block_elementwise_bytes(spec, precision, compiled, sw.low_precision_norms)
    elem = elementwise_factor(compiled, k) * per_block * (L + n_ck / 3.0)   # a re-run forward: ~1/3 of a block's traffic
    elem += loss_bytes_per_token(spec, precision, compiled if sw.fused_loss is None else sw.fused_loss)
    if fp8:
        elem += fp8_cast_bytes(spec, compiled)
        if v.fp8_head:
            elem += (spec.d_model + spec.vocab_size) * (FP8_CAST_BYTES_COMPILED if compiled else FP8_CAST_BYTES_EAGER)
    elem_s = elem / hbm_rate(prof)
    palm_attn = 12.0 * L * q * T if not v.attention_keys else 12.0 * q * v.palm_keys(spec)
    hw = 6.0 * matmul_params(spec) + re_mm + palm_attn + (n_ck * recompute_attention_share(ac, ac_policy)
                                                           * 4.0 * T * q)
    return ComputeTerms(matmul=mm_s * v.matmul_time(k), attention=attn_s, elementwise=elem_s, hw_flops=hw)
