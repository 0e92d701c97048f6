"""Memory of hybrid sharding (HSDP) and Megatron-style tensor parallelism (TP): planned, not run by nanoplan's runner.

**HSDP** (`--strategy hsdp`): FSDP2's `fully_shard(module, mesh=mesh)` over a 2-D DeviceMesh (replicate, shard), as
torchtitan builds it from `data_parallel_replicate_degree` × `data_parallel_shard_degree` (0.3.0
torchtitan/models/llama3/parallelize.py: `get_mesh(["dp_replicate", "fsdp"])`). Within a shard group (here the GPUs of
one node, ÷ tp) parameters, gradients and optimizer state are sharded as under fsdp; the groups replicate one another
and all-reduce their reduce-scattered gradient shards in place. Per GPU the memory is fsdp's over the shard group:
`data_parallel_view` maps the step onto it. (The traffic differs: planner/throughput.py `hsdp_comm`.)

**TP** (`--tp t`, Shoeybi et al. 2019; Korthikanti et al. 2022, arXiv 2205.05198): each block's attention and MLP run
their first linear column-parallel and their second row-parallel over t GPUs, so every weight of a block (and, as
torchtitan shards them, the embedding and the head) is held 1/t per GPU, with its gradient and optimizer state; the
t GPUs of a group process the same micro-batch. Korthikanti et al.'s activations per layer (their Table 2, with flash
attention dropping the 5as/h term) are s·b·h·(10 + 24/t) bytes without sequence parallelism and s·b·h·34/t with it:
the 24 inside the tensor-parallel region (q, k, v, attention, the MLP's hidden) split t ways, the 10 outside it (the
norms' inputs and outputs, which feed the column-parallel linears, and the dropout masks) do not, unless sequence
parallelism splits them along the sequence. nanoplan's own walk of the step is not GPT-2's, so it takes the same
shape from its own counts: with sequence parallelism every byte of the step is divided by t (`tp_breakdown`); without
it, the bytes a block saves outside the tensor-parallel region (`replicated_per_token`: each of its two norms'
saved input, the normalised output that the next linear reads, and the norm's statistics) stay whole. Small
replicated tensors (norm weights, rotary tables) are divided too: a slight under-count.
"""

from __future__ import annotations

from dataclasses import replace

from planner.checkpointing import cfg_checkpointed
from planner.memory_terms import F32, Dims, StepConfig

ACTIVATION_PHASES = ("forward_end", "backward_start", "backward_layers")   # when the blocks' saved tensors are alive


def data_parallel_view(cfg: StepConfig) -> StepConfig:
    """The step as the memory model walks it: hsdp is fsdp over its shard group (module docstring)."""
    if cfg.strategy != "hsdp":
        return cfg
    return replace(cfg, strategy="fsdp", dp=max(1, cfg.hsdp_shard or cfg.dp), hsdp_shard=0)


def param_shards(cfg: StepConfig) -> int:
    """GPUs a parameter and its optimizer state are split over when both are sharded together (FSDP2: fsdp, zero2;
    hsdp over its shard group; ddp and zero1 keep whole parameters), times the tensor-parallel degree."""
    shard = {"fsdp": cfg.dp, "zero2": cfg.dp, "hsdp": cfg.hsdp_shard}.get(cfg.strategy, 1)
    return max(1, shard) * max(1, cfg.tp)


def replicated_per_token(D: Dims, compiled: bool) -> int:
    """Bytes per token one block saves outside the tensor-parallel region: for each of its two norms, the saved input
    (the residual stream, or eager autocast's fp32 upcast), the normalised output the column-parallel linear reads,
    and the rstd/mean statistics."""
    stats = F32 * (2 if D.ln else 1)
    return 2 * ((D.r if compiled else D.nx) * D.d + D.a * D.d + stats)


def replicated_bytes(cfg: StepConfig, D: Dims, N: int) -> int:
    """Bytes per GPU that tensor parallelism without sequence parallelism does not divide, for N tokens per micro-batch:
    (1 − 1/t) of what the blocks save outside the tensor-parallel region (a checkpointed block keeps only its input,
    the residual stream, which is outside it). 0 with sequence parallelism or t = 1."""
    t = cfg.tp
    if t <= 1 or cfg.sequence_parallel:
        return 0
    n_ck = cfg_checkpointed(cfg)
    whole = (cfg.spec.n_layer - n_ck) * replicated_per_token(D, cfg.compile) + n_ck * D.r * D.d
    return whole * N * (t - 1) // t


def tp_breakdown(breakdown: dict[str, int], t: int, replicated: int) -> dict[str, int]:
    """One moment's breakdown per GPU under tensor parallelism: every part ÷ t (the remainder of the division kept in
    temporaries, so the total is exactly total // t), plus the replicated activations."""
    if t <= 1:
        return breakdown
    total = sum(breakdown.values())
    out = {k: v // t for k, v in breakdown.items()}
    out["temporaries"] += total // t - sum(out.values())
    out["activations"] += replicated
    return out


def tp_peak(peak_activation_phases: int, peak_other: int, t: int, replicated: int) -> int:
    """The allocated peak under tensor parallelism from the data-parallel walk's peaks (the moments when saved
    activations are alive, and the others): the same as the max of `tp_breakdown`'s totals over the moments."""
    if t <= 1:
        return max(peak_activation_phases, peak_other)
    return max(peak_activation_phases // t + replicated, peak_other // t)
