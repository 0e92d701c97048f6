"""Step time and tokens/s from FLOPs, MFU, peak and the gradient-communication time.

Model:
- compute time per optimizer step = tokens × FLOPs/token ÷ (GPUs × MFU × peak), where
  FLOPs/token is the PaLM model-FLOPs count (counts.flops_per_token). Activation
  checkpointing recomputes the forward (+1/3 of the hardware work), and the chunked loss
  recomputes the head's forward (2·V·d per token); both slow the step at the same MFU.
- communication per optimizer step: a ring all-reduce moves 2·(n−1)/n of the gradient
  bytes through each GPU's link (Patarasuk & Yuan 2009). zero1/zero2 use reduce-scatter +
  all-gather (same volume); fsdp also all-gathers the parameters for forward and backward
  (1.5× the volume). Within a node the link is NVLink/PCIe (`intra_node_gb_s`); across
  nodes the per-GPU network (`inter_node_gb_s`) is the bottleneck.
- overlap assumption: gradients are reduced in buckets during the backward of the last
  micro-step (no_sync on the others), so communication hides behind that backward (2/3
  of a micro-step's compute) with efficiency OVERLAP; the rest is exposed.
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


def comm_bytes_per_gpu(cfg: StepConfig, num_gpus: int) -> float:
    if num_gpus <= 1:
        return 0.0
    grad_dtype = 2 if cfg.strategy == "fsdp" and cfg.precision != "fp32" else _bytes(cfg.precision)[0]
    ring = 2 * (num_gpus - 1) / num_gpus * n_params(cfg.spec) * grad_dtype
    return ring * (1.5 if cfg.strategy == "fsdp" else 1.0)


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
    bw = (prof.inter_node_gb_s if hw.nodes > 1 else prof.intra_node_gb_s) * 1e9 * LINK_EFFICIENCY
    comm = comm_bytes_per_gpu(cfg, g) / bw if g > 1 else 0.0
    last_backward = compute / cfg.grad_accum_steps * (2.0 / 3.0)
    exposed = max(0.0, comm - OVERLAP * last_backward)
    return Throughput(mfu=use_mfu, peak_flops_per_gpu=peak, flops_per_token=f_tok, tokens_per_step=tokens,
                      compute_seconds=compute, comm_seconds=comm, exposed_comm_seconds=exposed,
                      step_seconds=compute + exposed)
