"""Step time and tokens/s from FLOPs, MFU, peak and the gradient-communication time.

Model:
- compute time per optimizer step = tokens × FLOPs/token ÷ (GPUs × MFU × peak), where
  FLOPs/token is the PaLM model-FLOPs count (counts.flops_per_token). Activation
  checkpointing recomputes the forward (+1/3 of the hardware work), and the chunked loss
  recomputes the head's forward (2·V·d per token); both slow the step at the same MFU.
- communication per optimizer step, as runner/parallel.py does it (ring collectives move
  (n−1)/n of the tensor through each GPU's link per all-gather or reduce-scatter, twice that
  per all-reduce; Patarasuk & Yuan 2009):
  - ddp: one all-reduce of the gradients (weight dtype), on the last micro-step (no_sync on
    the others), hidden behind that micro-step's backward (2/3 of its compute);
  - zero1: the same all-reduce, plus ZeroRedundancyOptimizer's broadcast of each rank's
    updated parameters after the optimizer step, which nothing hides;
  - zero2 / fsdp (FSDP2): every micro-step all-gathers the parameters (bf16 with the CUDA
    mixed-precision policy under bf16 autocast, else the weight dtype) and reduce-scatters
    the gradients (weight dtype); fsdp gathers again for the backward. This traffic hides
    behind each micro-step's forward and backward.
  Within a node the link is NVLink/PCIe (`intra_node_gb_s`); across nodes the per-GPU network
  (`inter_node_gb_s`) is the bottleneck.
- overlap assumption: hidden traffic overlaps compute with efficiency OVERLAP; the rest is
  exposed and adds to the step.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.counts import flops_per_token, n_params
from planner.memory import StepConfig, _bytes
from planner.profiles import Hardware

OVERLAP = 0.8   # assumption: fraction of the last backward that can hide communication
LINK_EFFICIENCY = 0.8  # assumption: achieved / nominal link bandwidth for large NCCL rings


@dataclass(frozen=True)
class Throughput:
    mfu: float
    peak_flops_per_gpu: float
    flops_per_token: int
    tokens_per_step: int
    compute_seconds: float
    comm_seconds: float
    exposed_comm_seconds: float
    step_seconds: float

    @property
    def tokens_per_sec(self) -> float:
        return self.tokens_per_step / self.step_seconds


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
    w = _bytes(cfg.precision)[0]
    r = (num_gpus - 1) / num_gpus
    if cfg.strategy in ("ddp", "zero1"):
        return CommModel(step_bytes=2 * r * P * w, exposed_bytes=r * P * w if cfg.strategy == "zero1" else 0.0)
    gathered = 2 if (gpu and cfg.precision == "bf16-autocast") else w
    gathers = 2 if cfg.strategy == "fsdp" else 1
    return CommModel(micro_bytes=r * P * (gathers * gathered + w))


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


def estimate_throughput(cfg: StepConfig, hw: Hardware, mfu: float | None = None) -> Throughput:
    spec = cfg.spec
    g = hw.num_gpus
    prof = hw.profile
    precision = "fp32" if cfg.precision == "fp32" else "bf16"
    peak = prof.peak_flops(precision)
    f_tok = flops_per_token(spec)
    use_mfu = mfu if mfu is not None else prof.mfu_for(n_params(spec))
    micro_tokens = cfg.device_batch_size * spec.seq_len * g
    tokens = micro_tokens * cfg.grad_accum_steps
    hw_flops = float(f_tok)
    if cfg.activation_checkpointing:
        hw_flops += (f_tok - 0) / 3.0
    if cfg.loss_chunk_tokens and cfg.loss_chunk_tokens < cfg.device_batch_size * spec.seq_len:
        hw_flops += 2.0 * spec.vocab_size * spec.d_model
    compute = tokens * hw_flops / (g * use_mfu * peak)
    bw = link_bytes_per_s(hw)
    cm = comm_model(cfg, g, gpu=prof.kind == "gpu")
    comm = cm.total(cfg.grad_accum_steps) / bw if g > 1 else 0.0
    exposed = exposed_seconds(cm, bw, compute, cfg.grad_accum_steps) if g > 1 else 0.0
    return Throughput(mfu=use_mfu, peak_flops_per_gpu=peak, flops_per_token=f_tok, tokens_per_step=tokens,
                      compute_seconds=compute, comm_seconds=comm, exposed_comm_seconds=exposed,
                      step_seconds=compute + exposed)
