"""Step time and tokens/s: FLOPs at an MFU, memory traffic at HBM bandwidth, launches, communication.

One optimizer step of `grad_accum` micro-steps takes (docs/throughput.md has every constant and its source):

    step = compute + optimizer + micro-step costs + exposed communication

- compute: tokens × hardware FLOPs/token ÷ (GPUs × MFU × peak). FLOPs/token is the PaLM model-FLOPs
  count (counts.flops_per_token); activation checkpointing re-runs the forward (+1/3), and the chunked
  loss re-runs the head's forward (`loss_recompute_flops_per_token`).
- optimizer (once per step, per GPU): fused AdamW is bound by memory bandwidth: it reads parameter,
  gradient, exp_avg and exp_avg_sq and writes parameter, exp_avg and exp_avg_sq (7 element-sized
  accesses per parameter) at HBM_EFFICIENCY × the profile's `hbm_tb_s`. torch.optim.Muon (hidden
  matrices) runs MUON_NS_STEPS Newton–Schulz iterations per matrix, each three matmuls
  (`newton_schulz_flops`), at the same MFU as the model, plus its element-wise passes and launches.
  Gradient clipping (the runner's default grad_clip 1.0) reads the gradients once for the norm and
  once more to scale them in place.
- micro-step costs (per micro-step, so bigger micro-batches pay them fewer times): every micro-step
  after the first adds its gradients into the accumulated ones in place (autograd's AccumulateGrad:
  read both, write one); FSDP2 (zero2/fsdp) also copies the all-gathered parameters out of the flat
  buffer and the gradients into the reduce-scatter buffer; and each micro-step launches its kernels
  (an assumed count per block, per loss chunk and per micro-step, × LAUNCH_SECONDS, GPU profiles only).
- communication, as runner/parallel.py does it (ring collectives move (n−1)/n of the tensor through
  each GPU's link per all-gather or reduce-scatter, twice that per all-reduce; Patarasuk & Yuan 2009):
  - ddp: one all-reduce of the gradients (weight dtype), on the last micro-step (no_sync on the others),
    hidden behind that micro-step's backward (2/3 of its compute);
  - zero1: the same all-reduce, plus ZeroRedundancyOptimizer's broadcast of each rank's updated
    parameters after the optimizer step, which nothing hides;
  - zero2 / fsdp (FSDP2): every micro-step all-gathers the parameters (bf16 with the CUDA
    mixed-precision policy under bf16 autocast, else the weight dtype) and reduce-scatters the
    gradients (weight dtype); fsdp gathers again for the backward. This traffic hides behind each
    micro-step's forward and backward.
  Within a node the link is NVLink/PCIe (`intra_node_gb_s`); across nodes the per-GPU network
  (`inter_node_gb_s`) is the bottleneck. Hidden traffic overlaps compute with efficiency OVERLAP.

Only compute and the Newton–Schulz matmuls scale with 1/MFU; everything else is fixed by bytes,
bandwidth and launch counts. planner/calibrate.py inverts exactly this (`step_seconds_at`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from planner.counts import flops_per_token, matrix_params, n_params
from planner.memory_terms import StepConfig, precision_bytes
from planner.profiles import Hardware
from planner.spec import ModelSpec

OVERLAP = 0.8            # assumption: fraction of the last backward that can hide communication
LINK_EFFICIENCY = 0.8    # assumption: achieved / nominal link bandwidth for large NCCL rings
HBM_EFFICIENCY = 0.9     # achieved / nominal HBM bandwidth: device-to-device copies measured at 3.0 of 3.35 TB/s
                         # on H100 and 4.3 of 4.8 TB/s on H200 (docs/sources.md §4)
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
KERNELS_PER_LAYER_RECOMPUTE = 10  # assumption: the forward re-run by activation checkpointing
KERNELS_PER_MICRO_STEP = 20       # assumption: input copy, embedding, final norm, loss and their backward
KERNELS_PER_LOSS_CHUNK = 6        # assumption: head matmul, fused loss, their recompute and backward, per chunk
MUON_KERNELS_PER_MATRIX = 9 + 3 * MUON_NS_STEPS   # _single_tensor_muon: 9 element-wise ops + 3 matmuls per step


@dataclass(frozen=True)
class Throughput:
    mfu: float
    peak_flops_per_gpu: float
    flops_per_token: int
    tokens_per_step: int
    compute_seconds: float          # forward + backward + recompute FLOPs at the MFU
    comm_seconds: float
    exposed_comm_seconds: float
    step_seconds: float
    optimizer_seconds: float = 0.0  # optimizer step + gradient clipping (includes optimizer_matmul_seconds)
    optimizer_matmul_seconds: float = 0.0   # Muon's Newton–Schulz matmuls at the MFU
    micro_step_seconds: float = 0.0  # the step's per-micro-step costs (accumulation, FSDP copies, launches)
    loss_recompute_seconds: float = 0.0     # the part of compute_seconds that re-runs the chunked loss's head

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
    micro_bytes: float = 0.0     # every micro-step, behind its forward and backward (zero2, fsdp)
    exposed_bytes: float = 0.0   # after the optimizer step, never hidden (zero1's broadcast)

    def total(self, grad_accum: int) -> float:
        return self.step_bytes + self.micro_bytes * grad_accum + self.exposed_bytes


def comm_model(cfg: StepConfig, num_gpus: int, gpu: bool = True) -> CommModel:
    """The data-parallel traffic of `cfg`'s strategy over `num_gpus` (see the module docstring)."""
    if num_gpus <= 1:
        return CommModel()
    P = n_params(cfg.spec)
    w = precision_bytes(cfg.precision)[0]
    r = (num_gpus - 1) / num_gpus
    if cfg.strategy in ("ddp", "zero1"):
        return CommModel(step_bytes=2 * r * P * w, exposed_bytes=r * P * w if cfg.strategy == "zero1" else 0.0)
    gathers = 2 if cfg.strategy == "fsdp" else 1
    return CommModel(micro_bytes=r * P * (gathers * _gathered_bytes(cfg.precision, gpu) + w))


def _gathered_bytes(precision: str, gpu: bool) -> int:
    """Bytes per all-gathered parameter under FSDP2 (bf16 with the runner's CUDA mixed-precision policy)."""
    return 2 if (gpu and precision == "bf16-autocast") else precision_bytes(precision)[0]  # type: ignore[arg-type]


def exposed_seconds(cm: CommModel, bytes_per_s: float, compute: float, grad_accum: int) -> float:
    """Communication time the step cannot hide: compute is the whole step's compute time."""
    if bytes_per_s <= 0:
        return 0.0
    out = cm.exposed_bytes / bytes_per_s
    if cm.step_bytes:
        out += max(0.0, cm.step_bytes / bytes_per_s - OVERLAP * compute / grad_accum * (2.0 / 3.0))
    if cm.micro_bytes:
        out += max(0.0, cm.micro_bytes * grad_accum / bytes_per_s - OVERLAP * compute)
    return out


def link_bytes_per_s(hw: Hardware) -> float:
    """Achieved per-GPU bandwidth of the data-parallel collectives (network across nodes)."""
    prof = hw.profile
    return (prof.inter_node_gb_s if hw.nodes > 1 else prof.intra_node_gb_s) * 1e9 * LINK_EFFICIENCY


def hbm_bytes_per_s(hw: Hardware) -> float:
    """Achieved memory bandwidth of one GPU for streaming element-wise kernels."""
    return hw.profile.hbm_tb_s * 1e12 * HBM_EFFICIENCY


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


def micro_step_seconds(c: StepCosts, grad_accum: int, micro_tokens: int, loss_chunk_tokens: int, ac: bool) -> float:
    """The step's per-micro-step costs: accumulation after the first micro-step, copies and launches on every one."""
    kernels = (KERNELS_PER_MICRO_STEP + c.n_layer * (KERNELS_PER_LAYER + (KERNELS_PER_LAYER_RECOMPUTE if ac else 0))
               + KERNELS_PER_LOSS_CHUNK * loss_chunks(micro_tokens, loss_chunk_tokens))
    return (grad_accum - 1) * c.accum_seconds + grad_accum * (c.micro_seconds + kernels * c.launch_seconds)


def step_seconds_at(tp: Throughput, cm: CommModel, bytes_per_s: float, grad_accum: int, mfu: float) -> float:
    """The step time of `tp` had it been estimated at another MFU (what calibrate inverts)."""
    scale = tp.mfu / mfu
    compute = tp.compute_seconds * scale
    exposed = exposed_seconds(cm, bytes_per_s, compute, grad_accum) if bytes_per_s > 0 else 0.0
    return compute + tp.optimizer_matmul_seconds * scale + tp.fixed_seconds + exposed


def estimate_throughput(cfg: StepConfig, hw: Hardware, mfu: float | None = None) -> Throughput:
    spec = cfg.spec
    g = hw.num_gpus
    prof = hw.profile
    precision = "fp32" if cfg.precision == "fp32" else "bf16"
    peak = prof.peak_flops(precision)
    f_tok = flops_per_token(spec)
    use_mfu = mfu if mfu is not None else prof.mfu_for(n_params(spec))
    micro_tokens = cfg.device_batch_size * spec.seq_len
    tokens = micro_tokens * g * cfg.grad_accum_steps
    hw_flops = float(f_tok)
    if cfg.activation_checkpointing:
        hw_flops += f_tok / 3.0
    recompute = loss_recompute_flops_per_token(spec, micro_tokens, cfg.loss_chunk_tokens)
    compute = tokens * (hw_flops + recompute) / (g * use_mfu * peak)
    gpu = prof.kind == "gpu"
    costs = step_costs(spec, cfg.precision, cfg.optimizer, cfg.strategy, g, hbm_bytes_per_s(hw), gpu)
    opt_matmul = costs.optimizer_flops / (use_mfu * peak)
    optimizer = opt_matmul + costs.optimizer_fixed
    micro = micro_step_seconds(costs, cfg.grad_accum_steps, micro_tokens, cfg.loss_chunk_tokens,
                               cfg.activation_checkpointing)
    bw = link_bytes_per_s(hw)
    cm = comm_model(cfg, g, gpu=gpu)
    comm = cm.total(cfg.grad_accum_steps) / bw if g > 1 else 0.0
    exposed = exposed_seconds(cm, bw, compute, cfg.grad_accum_steps) if g > 1 else 0.0
    return Throughput(mfu=use_mfu, peak_flops_per_gpu=peak, flops_per_token=f_tok, tokens_per_step=tokens,
                      compute_seconds=compute, comm_seconds=comm, exposed_comm_seconds=exposed,
                      step_seconds=compute + optimizer + micro + exposed, optimizer_seconds=optimizer,
                      optimizer_matmul_seconds=opt_matmul, micro_step_seconds=micro,
                      loss_recompute_seconds=tokens * recompute / (g * use_mfu * peak))
