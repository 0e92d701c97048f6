"""Step time and tokens/s: compute by term, the optimizer and the micro-steps at HBM bandwidth, communication.

One optimizer step of `grad_accum` micro-steps takes (docs/throughput.md has every constant and its source):

    step = compute + optimizer + micro-step costs + exposed communication

- compute (planner/compute_model.py): per token, matmul FLOPs at the GPU's achievable matmul rate (a cited MAMF
  measurement × a fitted efficiency; FP8 for the blocks' linears where the plan asks and the GPU has it),
  causal flash attention at its own efficiency, and the element-wise and norm work at HBM bandwidth (eager or
  compiled traffic), with what activation checkpointing re-runs (every block, every k-th, or op-level).
  A calibrated profile (`mfu_curve`, from `nanoplan calibrate`), an explicit --mfu, or a profile without a `speed`
  section (CPU, user profiles) replaces this by the flat rule tokens × FLOPs ÷ (GPUs × MFU × peak); that is how
  `nanoplan probe` and `calibrate` correct the prior on the user's own machine.
- optimizer (once per step, per GPU): fused AdamW is bound by memory bandwidth: it reads parameter,
  gradient, exp_avg and exp_avg_sq and writes parameter, exp_avg and exp_avg_sq (7 element-sized
  accesses per parameter) at HBM_EFFICIENCY × the profile's `hbm_tb_s`. torch.optim.Muon (hidden
  matrices) runs MUON_NS_STEPS Newton–Schulz iterations per matrix, each three matmuls
  (`newton_schulz_flops`), at the matmul rate, plus its element-wise passes and launches.
  Gradient clipping (the runner's default grad_clip 1.0) reads the gradients once for the norm and
  once more to scale them in place.
- micro-step costs (per micro-step, so bigger micro-batches pay them fewer times): every micro-step
  after the first adds its gradients into the accumulated ones in place (autograd's AccumulateGrad:
  read both, write one); FSDP2 (zero2/fsdp) also copies the all-gathered parameters out of the flat
  buffer and the gradients into the reduce-scatter buffer; and each micro-step launches its kernels
  (an assumed count per block, eager or compiled, per loss chunk and per micro-step, × LAUNCH_SECONDS, GPUs only).
- communication (ring collectives move (n−1)/n of the tensor through each GPU's link per all-gather or
  reduce-scatter, twice that per all-reduce; Patarasuk & Yuan 2009), gradients in the dtype really reduced
  (`StepConfig.reduce_dtype`, else the weight dtype, as runner/parallel.py):
  - ddp: one all-reduce of the gradients on the last micro-step (no_sync on the others), as DDP's buckets
    overlap it with that micro-step's backward (2/3 of its compute); only that backward can hide it;
  - zero1: the same all-reduce, plus ZeroRedundancyOptimizer's broadcast of each rank's updated
    parameters inside the optimizer step, which nothing hides;
  - zero2 / fsdp (FSDP2): every micro-step all-gathers the parameters (bf16 under the CUDA mixed-precision
    policy, 1 byte with FP8 all-gather, else the weight dtype) and reduce-scatters the gradients; fsdp
    gathers again for the backward. FSDP's prefetch overlaps this traffic with each micro-step's compute.
  Hidden traffic overlaps compute with the fitted `overlap`. Within a node the link is NVLink/PCIe
  (`intra_node_gb_s`). Across nodes a ring crosses each node's network once per hop, and NCCL spreads its
  channels over every NIC of the node, so a GPU's share of the ring runs at min(intra-node, GPUs per node ×
  `inter_node_gb_s`). Achieved bandwidth is the fitted `link_efficiency` of nominal, applied once.

The fitted constants are in planner/speed_constants.py; planner/calibrate.py inverts `step_seconds_at`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from planner.checkpointing import checkpointed_blocks, recompute_flops_per_token, recompute_policy
from planner.compute_model import ComputeTerms, StepVariant, compute_terms, hbm_rate, matmul_rate
from planner.counts import flops_per_token, matrix_params, n_params
from planner.kernels import StepSoftware
from planner.memory_terms import StepConfig, precision_bytes
from planner.profiles import Hardware, HardwareProfile
from planner.spec import ModelSpec
from planner.speed_constants import DEFAULT, SpeedConstants

OVERLAP = DEFAULT.overlap                  # fraction of compute that hides communication (speed_constants.py)
LINK_EFFICIENCY = DEFAULT.link_efficiency  # achieved / nominal link bandwidth (speed_constants.py)
ADAMW_ACCESSES = 7       # torch._fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, ...) (torch/optim/adam.py):
                         # reads p, g, m, v and updates p, m, v in place (amsgrad off); state in the param dtype
CLIP_ACCESSES = 3        # clip_grad_norm_: the norm reads each gradient, _foreach_mul_ reads and writes it
                         # (torch/nn/utils/clip_grad.py multiplies even when the coefficient clamps to 1)
ACCUM_ACCESSES = 3       # AccumulateGrad's in-place `grad += new` on micro-steps after the first: 2 reads, 1 write
MUON_NS_STEPS = 5        # torch.optim.Muon default ns_steps (torch/optim/_muon.py DEFAULT_NS_STEPS); the runner
                         # (runner/step.py) does not override it
MUON_ACCESSES = 10       # per element, in param-dtype units, of _single_tensor_muon's element-wise passes:
MUON_BF16_BYTES = 10     # lerp_ (3), lerp (3), mul_ (2), add_ (2) in the param dtype, plus 10 bf16 bytes for the
                         # cast, norm, div_ and the update read by add_ (torch/optim/_muon.py)
LAUNCH_SECONDS = 2e-6    # assumption to calibrate: GPU time lost per kernel launch in a steady stream of launches
                         # ("each launch takes on the order of microseconds", Modal GPU glossary, CUDA Graph)
KERNELS_PER_LAYER = 30   # assumption: one compiled block forward + backward: 12 GEMMs, 2-4 attention kernels and
                         # about 14 fused element-wise/norm kernels
KERNELS_PER_LAYER_EAGER = 80      # assumption: the same block eager, one kernel per op (about 25 forward, 55 backward)
KERNELS_PER_LAYER_RECOMPUTE = 10  # assumption: the forward re-run by activation checkpointing
KERNELS_PER_MICRO_STEP = 20       # assumption: input copy, embedding, final norm, loss and their backward
KERNELS_PER_LOSS_CHUNK = 6        # assumption: head matmul, fused loss, their recompute and backward, per chunk
MUON_KERNELS_PER_MATRIX = 9 + 3 * MUON_NS_STEPS   # _single_tensor_muon: 9 element-wise ops + 3 matmuls per step


@dataclass(frozen=True)
class Throughput:
    mfu: float                      # the flat MFU that gives this compute time (the planner's prior, or --mfu)
    peak_flops_per_gpu: float
    flops_per_token: int
    tokens_per_step: int
    compute_seconds: float          # forward + backward + recompute (matmuls, attention, element-wise)
    comm_seconds: float
    exposed_comm_seconds: float
    step_seconds: float
    optimizer_seconds: float = 0.0  # optimizer step + gradient clipping (includes optimizer_matmul_seconds)
    optimizer_matmul_seconds: float = 0.0   # Muon's Newton–Schulz matmuls at the matmul rate
    micro_step_seconds: float = 0.0  # the step's per-micro-step costs (accumulation, FSDP copies, launches)
    loss_recompute_seconds: float = 0.0     # the part of compute_seconds that re-runs the chunked loss's head
    matmul_seconds: float = 0.0     # compute_seconds by term (0 under a flat MFU)
    attention_seconds: float = 0.0
    elementwise_seconds: float = 0.0

    @property
    def tokens_per_sec(self) -> float:
        return self.tokens_per_step / self.step_seconds

    @property
    def fixed_seconds(self) -> float:
        """The part of the step that does not scale with 1/MFU (exposed communication aside)."""
        return self.optimizer_seconds - self.optimizer_matmul_seconds + self.micro_step_seconds


@dataclass(frozen=True)
class CommModel:
    """Bytes one GPU moves per optimizer step, by when they can overlap compute."""

    step_bytes: float = 0.0      # once per step, behind the last micro-step's backward (ddp, zero1)
    micro_bytes: float = 0.0     # every micro-step, behind its compute (zero2, fsdp)
    exposed_bytes: float = 0.0   # inside the optimizer step, never hidden (zero1's broadcast)

    def total(self, grad_accum: int) -> float:
        return self.step_bytes + self.micro_bytes * grad_accum + self.exposed_bytes


def reduce_bytes(cfg: StepConfig) -> int:
    """Bytes per gradient element as reduced: the plan's reduce dtype, else the weight dtype (the runner)."""
    if cfg.reduce_dtype is not None:
        return 2 if cfg.reduce_dtype == "bf16" else 4
    return precision_bytes(cfg.precision)[0]


def comm_model(cfg: StepConfig, num_gpus: int, gpu: bool = True) -> CommModel:
    """The data-parallel traffic of `cfg`'s strategy over `num_gpus` (see the module docstring)."""
    if num_gpus <= 1:
        return CommModel()
    P = n_params(cfg.spec)
    w = precision_bytes(cfg.precision)[0]
    g = reduce_bytes(cfg)
    r = (num_gpus - 1) / num_gpus
    if cfg.strategy in ("ddp", "zero1"):
        return CommModel(step_bytes=2 * r * P * g, exposed_bytes=r * P * w if cfg.strategy == "zero1" else 0.0)
    gathers = 2 if cfg.strategy == "fsdp" else 1
    return CommModel(micro_bytes=r * P * (gathers * _gathered_bytes(cfg.precision, gpu, cfg.fp8) + g))


def _gathered_bytes(precision: str, gpu: bool, fp8: bool = False) -> int:
    """Bytes per all-gathered parameter under FSDP2: bf16 with the runner's CUDA mixed-precision policy, 1 with
    FP8 all-gather (torchao's float8 FSDP all-gather, what FP8 runs use with FSDP), else the weight dtype."""
    if gpu and fp8:
        return 1
    return 2 if (gpu and precision == "bf16-autocast") else precision_bytes(precision)[0]  # type: ignore[arg-type]


# ------------------------------------------------------------------ HSDP and tensor parallelism (planned, not run)


def dp_comm(cfg: StepConfig, gpu: bool = True) -> CommModel:
    """The data-parallel traffic under tensor parallelism: `comm_model` over the cfg.dp data-parallel ranks
    (GPUs / tp), each rank holding 1/tp of every parameter, so every byte ÷ tp."""
    t = max(1, cfg.tp)
    cm = comm_model(cfg, cfg.dp, gpu)
    return CommModel(step_bytes=cm.step_bytes / t, micro_bytes=cm.micro_bytes / t, exposed_bytes=cm.exposed_bytes / t)


def hsdp_comm(cfg: StepConfig, hw: Hardware, gpu: bool = True, k: SpeedConstants = DEFAULT) -> tuple[CommModel, float]:
    """HSDP's traffic per GPU and the rate it is counted at (planner/memory_parallel.py has the layout).

    Within a shard group of s = cfg.hsdp_shard GPUs (one node's, ÷ tp; NVLink): fsdp's all-gathers and
    reduce-scatter on every micro-step, (s−1)/s of the 1/tp parameter share. Across the R = dp / s replicas: an
    all-reduce of the reduce-scattered gradient shard, 2·(R−1)/R of P/(tp·s) elements in the reduce dtype, on
    every micro-step too (FSDP2 all-reduces on each backward unless `set_requires_all_reduce(False)`, which
    torchtitan 0.3.0 does not call), over each GPU's own NIC (`inter_node_gb_s` is per GPU). The network bytes are
    returned scaled to the NVLink rate, so fsdp's overlap model applies to the sum unchanged."""
    prof = hw.profile
    t, s = max(1, cfg.tp), max(1, cfg.hsdp_shard)
    replicas = max(1, cfg.dp // s)
    intra = comm_model(replace(cfg, strategy="fsdp"), s, gpu).micro_bytes / t
    inter = 2.0 * (replicas - 1) / replicas * n_params(cfg.spec) / (t * s) * reduce_bytes(cfg)
    rate = prof.intra_node_gb_s * 1e9 * k.link_efficiency
    network = prof.inter_node_gb_s * 1e9 * k.link_efficiency
    return CommModel(micro_bytes=intra + (inter * rate / network if inter else 0.0)), rate


TP_COLLECTIVES_PER_BLOCK = 4      # Korthikanti et al. 2022 §4.2.2: four all-reduces per layer in forward + backward
TP_COLLECTIVES_PER_RECOMPUTE = 2  # a re-run forward repeats its two (the attention and MLP outputs)
TP_COLLECTIVES_OUTSIDE = 2        # the embedding's output and the head's input (vocab-parallel, torchtitan's plan)


def tensor_parallel_bytes(spec: ModelSpec, micro_tokens: int, t: int, act_bytes: int, n_recomputed: int) -> float:
    """Bytes one GPU moves per micro-step for Megatron tensor parallelism of degree t.

    Each block's forward all-reduces the outputs of its row-parallel attention and MLP projections and the backward
    the gradients of its column-parallel inputs: four all-reduces of a (tokens × d) activation per block
    (Korthikanti et al. 2022, arXiv 2205.05198, §4.2.2; with sequence parallelism each is an all-gather plus a
    reduce-scatter, the same bytes). A ring all-reduce moves 2·(t−1)/t of the tensor through each GPU."""
    if t <= 1:
        return 0.0
    n = TP_COLLECTIVES_PER_BLOCK * spec.n_layer + TP_COLLECTIVES_PER_RECOMPUTE * n_recomputed + TP_COLLECTIVES_OUTSIDE
    return n * 2.0 * (t - 1) / t * micro_tokens * spec.d_model * act_bytes


def tensor_parallel_seconds(spec: ModelSpec, hw: Hardware, micro_tokens: int, grad_accum: int, t: int,
                            act_bytes: int, n_recomputed: int, k: SpeedConstants = DEFAULT) -> float:
    """Exposed seconds of tensor-parallel traffic per step: every micro-step's collectives over NVLink (tp stays in a
    node), none hidden: each waits for the matmul before it and the next matmul waits for it (torchtitan's
    async tensor parallelism, which overlaps them, is off by default: enable_async_tensor_parallel = False)."""
    if t <= 1:
        return 0.0
    rate = hw.profile.intra_node_gb_s * 1e9 * k.link_efficiency
    return grad_accum * tensor_parallel_bytes(spec, micro_tokens, t, act_bytes, n_recomputed) / rate


def exposed_seconds(cm: CommModel, bytes_per_s: float, compute: float, grad_accum: int,
                    overlap: float = OVERLAP) -> float:
    """Communication time the step cannot hide: compute is the whole step's compute time."""
    if bytes_per_s <= 0:
        return 0.0
    out = cm.exposed_bytes / bytes_per_s
    if cm.step_bytes:
        out += _hidden_behind(cm.step_bytes / bytes_per_s, compute / grad_accum * (2.0 / 3.0), overlap)
    if cm.micro_bytes:
        out += _hidden_behind(cm.micro_bytes * grad_accum / bytes_per_s, compute, overlap)
    return out


def _hidden_behind(comm: float, window: float, overlap: float) -> float:
    """Exposed seconds of `comm` seconds of collectives run beside `window` seconds of compute: what exceeds the
    window, plus (1 - overlap) of the overlapped part (NCCL kernels take SMs and memory bandwidth from the
    compute they run beside, so overlapped communication is not free)."""
    return max(0.0, comm - window) + (1.0 - overlap) * min(comm, window)


def link_bytes_per_s(hw: Hardware, k: SpeedConstants = DEFAULT) -> float:
    """Achieved per-GPU bandwidth of the data-parallel ring collectives (module docstring)."""
    prof = hw.profile
    nominal = prof.intra_node_gb_s
    if hw.nodes > 1:
        nominal = min(prof.intra_node_gb_s, hw.gpus_per_node * prof.inter_node_gb_s)
    return nominal * 1e9 * k.link_efficiency


def hbm_bytes_per_s(hw: Hardware) -> float:
    """Achieved memory bandwidth of one GPU for streaming element-wise kernels."""
    return hbm_rate(hw.profile)


# ------------------------------------------------------------------ the loss, the optimizer, the micro-steps


def loss_recompute_flops_per_token(spec: ModelSpec, micro_tokens: int, loss_chunk_tokens: int) -> float:
    """Extra FLOPs per token of the chunked loss: each chunk runs under activation checkpointing
    (runner/model.py), so its backward re-runs the head's forward, 2·V·d per token. One chunk
    (micro-batch tokens <= loss_chunk_tokens) is computed directly and recomputes nothing."""
    if loss_chunk_tokens and loss_chunk_tokens < micro_tokens:
        return 2.0 * spec.vocab_size * spec.d_model
    return 0.0


def loss_chunks(micro_tokens: int, loss_chunk_tokens: int) -> int:
    """Checkpointed loss chunks per micro-step (0 when the loss is computed in one piece)."""
    if loss_chunk_tokens and loss_chunk_tokens < micro_tokens:
        return math.ceil(micro_tokens / loss_chunk_tokens)
    return 0


def hidden_matrix_shapes(spec: ModelSpec) -> tuple[tuple[int, int], ...]:
    """(out, in) of the 2-D block projections Muon optimises in one layer, as runner/model.py builds them."""
    q, kv = spec.n_head * spec.head_dim, spec.n_kv_head * spec.head_dim
    n_in = 2 if spec.mlp == "swiglu" else 1
    return ((q + 2 * kv, spec.d_model), (spec.d_model, q), (n_in * spec.d_ff, spec.d_model), (spec.d_model, spec.d_ff))


def newton_schulz_flops(rows: int, cols: int, steps: int = MUON_NS_STEPS) -> int:
    """FLOPs of torch.optim.Muon's orthogonalisation of one rows×cols matrix (torch/optim/_muon.py).

    With X of shape s×l (s = min, l = max: Muon transposes a tall matrix), each iteration computes
    A = X·Xᵀ (2·s·s·l), B = b·A + c·A·A (2·s³) and X = a·X + B·X (2·s·s·l).
    """
    s, l_ = min(rows, cols), max(rows, cols)
    return steps * (4 * s * s * l_ + 2 * s ** 3)


@dataclass(frozen=True, slots=True)
class StepCosts:
    """The MFU-independent parts of one (model, precision, optimizer, strategy, GPUs) step, per GPU."""

    optimizer_flops: float       # Muon Newton–Schulz FLOPs per GPU per step (run at the MFU)
    optimizer_fixed: float       # seconds: optimizer and clipping memory traffic, Muon's launches
    accum_seconds: float         # each micro-step after the first: in-place gradient accumulation
    micro_seconds: float         # every micro-step: FSDP2 copy-in/out traffic
    launch_seconds: float        # per kernel launch (0 on CPU profiles: eager CPU ops are inside the MFU)
    n_layer: int


def step_costs(spec: ModelSpec, precision: str, optimizer: str, strategy: str, dp: int, hbm_bytes_s: float,
               gpu: bool) -> StepCosts:
    """Per-GPU optimizer and per-micro-step costs (module docstring; docs/throughput.md)."""
    w = precision_bytes(precision)[0]  # type: ignore[arg-type]   # parameters, gradients and optimizer state
    P = n_params(spec)
    if dp <= 1:
        strategy = "ddp"   # one GPU: nothing to shard or gather (as comm_model)
    sharded = strategy in ("zero1", "zero2", "fsdp")           # optimizer state and step on 1/dp of the params
    grads_sharded = strategy in ("zero2", "fsdp")              # gradients are DTensor shards
    opt_share = 1.0 / dp if sharded else 1.0
    grad_share = 1.0 / dp if grads_sharded else 1.0
    if optimizer == "muon":
        M = matrix_params(spec)
        ns = spec.n_layer * sum(newton_schulz_flops(r, c) for r, c in hidden_matrix_shapes(spec))
        # zero1: ZeroRedundancyOptimizer steps whole matrices, 1/dp of them per rank. zero2/fsdp: the
        # matmuls of DTensor shards are redistributed; assumed to run whole on every rank (memory_terms.py also
        # holds whole-matrix Muon temporaries there).
        opt_flops = ns / dp if strategy == "zero1" else float(ns)
        opt_bytes = (ADAMW_ACCESSES * w * (P - M) + (MUON_ACCESSES * w + MUON_BF16_BYTES) * M) * opt_share
        n_mats = 4 * spec.n_layer / (dp if strategy == "zero1" else 1)
        opt_launches = MUON_KERNELS_PER_MATRIX * n_mats
    else:
        opt_flops = 0.0
        opt_bytes = ADAMW_ACCESSES * w * P * opt_share
        opt_launches = 0.0   # a handful of multi-tensor launches: negligible
    opt_bytes += CLIP_ACCESSES * w * P * grad_share
    launch = LAUNCH_SECONDS if gpu else 0.0
    micro_bytes = 0.0
    if grads_sharded:   # FSDP2: all-gather copy-out (read + write per gather), reduce-scatter copy-in (read + write)
        gathers = 2 if strategy == "fsdp" else 1
        micro_bytes = 2.0 * gathers * _gathered_bytes(precision, gpu) * P + 2.0 * w * P
    return StepCosts(optimizer_flops=opt_flops, optimizer_fixed=opt_bytes / hbm_bytes_s + opt_launches * launch,
                     accum_seconds=ACCUM_ACCESSES * w * P * grad_share / hbm_bytes_s,
                     micro_seconds=micro_bytes / hbm_bytes_s, launch_seconds=launch, n_layer=spec.n_layer)


def micro_step_seconds(c: StepCosts, grad_accum: int, micro_tokens: int, loss_chunk_tokens: int, ac: bool,
                       compiled: bool = True, n_checkpointed: int | None = None) -> float:
    """The step's per-micro-step costs: accumulation after the first micro-step, copies and launches on every one."""
    n_ck = c.n_layer if (ac and n_checkpointed is None) else (n_checkpointed or 0)
    per_layer = KERNELS_PER_LAYER if compiled else KERNELS_PER_LAYER_EAGER
    kernels = (KERNELS_PER_MICRO_STEP + c.n_layer * per_layer + n_ck * KERNELS_PER_LAYER_RECOMPUTE
               + KERNELS_PER_LOSS_CHUNK * loss_chunks(micro_tokens, loss_chunk_tokens))
    return (grad_accum - 1) * c.accum_seconds + grad_accum * (c.micro_seconds + kernels * c.launch_seconds)


def step_seconds_at(tp: Throughput, cm: CommModel, bytes_per_s: float, grad_accum: int, mfu: float,
                    overlap: float = OVERLAP) -> float:
    """The step time of `tp` had it been estimated at another flat MFU (what calibrate inverts)."""
    scale = tp.mfu / mfu
    compute = tp.compute_seconds * scale
    exposed = exposed_seconds(cm, bytes_per_s, compute, grad_accum, overlap) if bytes_per_s > 0 else 0.0
    return compute + tp.optimizer_matmul_seconds * scale + tp.fixed_seconds + exposed


MFU_OVER_PEAK_NOTE = ("measured MFU above 100%: the profile's peak is below what this device did (or the PaLM FLOPs "
                      "count the causal attention's masked half); shown as 100%, measure the peak and fix the profile")


def measured_mfu(tokens_per_sec: float, flops_per_token: float, gpus: int, peak_flops_per_gpu: float) -> tuple[float, bool]:
    """(model FLOPs utilisation clamped to 1, whether it was above 1). Never print an MFU above 100%: one above
    is a wrong peak in the profile (or the PaLM count of a long causal attention), flagged by the second value."""
    raw = tokens_per_sec * flops_per_token / (gpus * peak_flops_per_gpu)
    return min(1.0, raw), raw > 1.0


def flat_mfu(prof: HardwareProfile, n: int, mfu: float | None) -> float | None:
    """The flat MFU that replaces the compute model, or None: an explicit --mfu, a calibrated curve, or a profile
    without a speed section (CPU, user profiles) use the flat rule."""
    if mfu is not None:
        return mfu
    if prof.mfu_curve or prof.speed is None:
        return prof.mfu_for(n)
    return None


def peak_for(prof: HardwareProfile, precision: str, fp8: bool) -> float:
    """The peak MFU is counted against: the FP8 peak when the blocks' matmuls run in FP8, else bf16 (or fp32)."""
    if fp8 and prof.fp8_tflops and prof.kind == "gpu":
        return prof.fp8_tflops * 1e12
    return prof.peak_flops("fp32" if precision == "fp32" else "bf16")


class StepModel:
    """Step time of one (model, hardware, settings, strategy) at any micro-batch and checkpointing: what
    `estimate_throughput` reports and what the search evaluates for every candidate (the same code)."""

    def __init__(self, spec: ModelSpec, hw: Hardware, *, precision: str, optimizer: str, strategy: str,
                 compiled: bool, loss_chunk_tokens: int, tokens_per_step: int, mfu: float | None = None,
                 fp8: bool = False, reduce_dtype: str | None = None, ac_every: int = 1, ac_policy: str = "full",
                 k: SpeedConstants = DEFAULT, variant: StepVariant | None = None, tp: int = 1,
                 hsdp_shard: int = 0, software: StepSoftware | None = None) -> None:
        prof = hw.profile
        self.spec, self.hw, self.k = spec, hw, k
        self.variant = variant          # another trainer's step (compute_model.StepVariant); None: the runner's
        self.software = software         # the trainer's attention kernel and span (planner/kernels.py); None: runner
        self.g = hw.num_gpus
        self.gpu = prof.kind == "gpu"
        self.fp8 = bool(fp8 and self.gpu and prof.speed is not None and prof.speed.fp8_matmul_tflops)
        self.precision, self.compiled, self.chunk = precision, compiled, loss_chunk_tokens
        self.tokens = tokens_per_step
        self.ac_every, self.ac_policy = ac_every, ac_policy
        self.peak = peak_for(prof, precision, self.fp8)
        self.flat = flat_mfu(prof, n_params(spec), mfu)
        self._terms: dict[bool, ComputeTerms] = {}
        self.tp, self.optimizer = max(1, tp), optimizer
        self.costs = step_costs(spec, precision, optimizer, strategy, self.g, hbm_bytes_per_s(hw), self.gpu)
        # the chunked loss's head recompute runs at the matmul rate (the flat rule: MFU × peak)
        self.mm_rate = self.flat * self.peak if self.flat is not None else matmul_rate(prof, precision, False, k)
        cfg = StepConfig(spec=spec, device_batch_size=1, dp=self.g, precision=precision,  # type: ignore[arg-type]
                         strategy=strategy, fp8=self.fp8, reduce_dtype=reduce_dtype)  # type: ignore[arg-type]
        self.cm = comm_model(cfg, self.g, gpu=self.gpu)
        self.bw = link_bytes_per_s(hw, k) if self.g > 1 else 0.0
        if self.tp > 1 or strategy == "hsdp":     # planned, not run: per-GPU shares and the hybrid traffic
            self._hybrid(replace(cfg, dp=self.g // self.tp, tp=self.tp, hsdp_shard=hsdp_shard), hbm_bytes_per_s(hw))

    def _hybrid(self, cfg: StepConfig, hbm: float) -> None:
        """Costs and traffic of HSDP / tensor parallelism: the optimizer and micro-step costs of the data-parallel
        layout (hsdp: fsdp over its shard group) on 1/tp of the parameters; dp_comm or hsdp_comm."""
        shard = cfg.hsdp_shard if cfg.strategy == "hsdp" else cfg.dp
        c = step_costs(self.spec, self.precision, self.optimizer, "fsdp" if cfg.strategy == "hsdp" else cfg.strategy,
                       shard, hbm, self.gpu)
        t = self.tp
        self.costs = replace(c, optimizer_flops=c.optimizer_flops / t, optimizer_fixed=c.optimizer_fixed / t,
                             accum_seconds=c.accum_seconds / t, micro_seconds=c.micro_seconds / t)
        if cfg.strategy == "hsdp":
            self.cm, self.bw = hsdp_comm(cfg, self.hw, self.gpu, self.k)
        else:
            self.cm = dp_comm(cfg, self.gpu)

    def tp_seconds(self, b: int, accum: int, ac: bool) -> float:
        """Exposed tensor-parallel traffic of the step (tensor_parallel_seconds)."""
        if self.tp <= 1:
            return 0.0
        return tensor_parallel_seconds(self.spec, self.hw, b * self.spec.seq_len, accum, self.tp,
                                       precision_bytes(self.precision)[1],  # type: ignore[arg-type]
                                       checkpointed_blocks(self.spec.n_layer, ac, self.ac_every), self.k)

    def terms(self, ac: bool) -> ComputeTerms:
        t = self._terms.get(ac)
        if t is None:
            if self.flat is None:
                t = compute_terms(self.spec, self.hw.profile, precision=self.precision, compiled=self.compiled,  # type: ignore[arg-type]
                                  ac=ac, ac_every=self.ac_every, ac_policy=self.ac_policy, fp8=self.fp8, k=self.k,
                                  variant=self.variant, software=self.software)
            else:
                hw_flops = flops_per_token(self.spec) + recompute_flops_per_token(self.spec, ac, self.ac_every,
                                                                                  self.ac_policy)
                if self.variant is not None:
                    hw_flops += self.variant.palm_flops_delta(self.spec)
                t = ComputeTerms(matmul=0.0, attention=0.0, elementwise=0.0, hw_flops=hw_flops)
            self._terms[ac] = t
        return t

    def compute_seconds(self, b: int, ac: bool) -> tuple[float, float, ComputeTerms]:
        """(compute seconds of the step, of which the chunked loss's recompute, the per-token terms)."""
        t = self.terms(ac)
        per_gpu = self.tokens / self.g
        recompute = loss_recompute_flops_per_token(self.spec, b * self.spec.seq_len, self.chunk)
        loss_s = per_gpu * recompute / self.mm_rate
        if self.flat is not None:
            return per_gpu * t.hw_flops / (self.flat * self.peak) + loss_s, loss_s, t
        return per_gpu * t.total + loss_s, loss_s, t

    def effective_mfu(self, b: int, ac: bool, compute: float) -> float:
        """The flat MFU this compute time amounts to (model FLOPs + recompute over compute × peak)."""
        if self.flat is not None:
            return self.flat
        per_gpu = self.tokens / self.g
        recompute = loss_recompute_flops_per_token(self.spec, b * self.spec.seq_len, self.chunk)
        return min(1.0, per_gpu * (self.terms(ac).hw_flops + recompute) / (compute * self.peak))

    def optimizer_matmul_seconds(self, b: int, ac: bool, compute: float) -> float:
        """Muon's Newton–Schulz matmuls, at the step's effective MFU (so a flat MFU reproduces the prior exactly)."""
        if not self.costs.optimizer_flops:
            return 0.0
        return self.costs.optimizer_flops / (self.effective_mfu(b, ac, compute) * self.peak)

    def seconds(self, b: int, accum: int, ac: bool) -> float:
        compute = self.compute_seconds(b, ac)[0]
        step = compute + self.optimizer_matmul_seconds(b, ac, compute) + self.costs.optimizer_fixed
        step += micro_step_seconds(self.costs, accum, b * self.spec.seq_len, self.chunk, ac, self.compiled,
                                   checkpointed_blocks(self.spec.n_layer, ac, self.ac_every))
        if self.g > 1:
            step += exposed_seconds(self.cm, self.bw, compute, accum, self.k.overlap)
        return step + self.tp_seconds(b, accum, ac)


def estimate_throughput(cfg: StepConfig, hw: Hardware, mfu: float | None = None,
                        k: SpeedConstants = DEFAULT, variant: StepVariant | None = None,
                        software: StepSoftware | None = None) -> Throughput:
    """The step's time and tokens/s; `variant`: another trainer's step (compute_model.StepVariant), `software`: its
    attention kernel and span (planner/kernels.py); None for nanoplan's runner."""
    spec = cfg.spec
    g = hw.num_gpus
    micro_tokens = cfg.device_batch_size * spec.seq_len
    tokens = micro_tokens * (g // max(1, cfg.tp)) * cfg.grad_accum_steps     # a tensor-parallel group shares a micro-batch
    sm = StepModel(spec, hw, precision=cfg.precision, optimizer=cfg.optimizer, strategy=cfg.strategy,
                   compiled=cfg.compile, loss_chunk_tokens=cfg.loss_chunk_tokens, tokens_per_step=tokens, mfu=mfu,
                   fp8=cfg.fp8, reduce_dtype=cfg.reduce_dtype, ac_every=cfg.ac_every, ac_policy=recompute_policy(cfg), k=k,
                   variant=variant, tp=cfg.tp, hsdp_shard=cfg.hsdp_shard, software=software)
    compute, loss_s, t = sm.compute_seconds(cfg.device_batch_size, cfg.activation_checkpointing)
    step = sm.seconds(cfg.device_batch_size, cfg.grad_accum_steps, cfg.activation_checkpointing)
    micro = micro_step_seconds(sm.costs, cfg.grad_accum_steps, micro_tokens, cfg.loss_chunk_tokens,
                               cfg.activation_checkpointing, cfg.compile,
                               checkpointed_blocks(spec.n_layer, cfg.activation_checkpointing, cfg.ac_every))
    tp_s = sm.tp_seconds(cfg.device_batch_size, cfg.grad_accum_steps, cfg.activation_checkpointing)
    comm = (sm.cm.total(cfg.grad_accum_steps) / sm.bw if g > 1 else 0.0) + tp_s
    exposed = (exposed_seconds(sm.cm, sm.bw, compute, cfg.grad_accum_steps, k.overlap) if g > 1 else 0.0) + tp_s
    eff = sm.effective_mfu(cfg.device_batch_size, cfg.activation_checkpointing, compute)   # what calibrate scales
    opt_mm = sm.optimizer_matmul_seconds(cfg.device_batch_size, cfg.activation_checkpointing, compute)
    scale = tokens / g if sm.flat is None else 0.0
    fpt = flops_per_token(spec) + (variant.palm_flops_delta(spec) if variant is not None else 0)
    return Throughput(mfu=eff, peak_flops_per_gpu=sm.peak, flops_per_token=fpt, tokens_per_step=tokens,
                      compute_seconds=compute, comm_seconds=comm, exposed_comm_seconds=exposed,
                      step_seconds=step, optimizer_seconds=opt_mm + sm.costs.optimizer_fixed,
                      optimizer_matmul_seconds=opt_mm, micro_step_seconds=micro,
                      loss_recompute_seconds=loss_s, matmul_seconds=scale * t.matmul,
                      attention_seconds=scale * t.attention, elementwise_seconds=scale * t.elementwise)

