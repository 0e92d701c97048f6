"""Activation checkpointing as real runs use it: every block, every k-th block, or op-level (selective).

Three settings of a StepConfig (`activation_checkpointing`, `ac_every`, `ac_policy`):

- full, every block (`ac_every` 1): each block keeps its input and re-runs its forward in the backward
  (torch.utils.checkpoint around the block, runner/model.py).
- every k-th block (`ac_every` k): L // k blocks are checkpointed, the others keep everything (torchtitan's
  selective "layer" option with ac_freq = k; torchtitan/models/llama/parallelize_llama.py).
- op-level (`ac_policy` "selective-op"): torch.utils.checkpoint with a policy (`create_selective_checkpoint_contexts`)
  that saves the outputs of every other matmul of the block and of attention and recomputes the rest, as
  torchtitan's default "op" mode does (`_save_list` = {mm, flash/efficient SDPA, ...}; "Saves output of all compute
  ops, except every second mm"). On the runner's block (fused qkv, attention projection, fc, MLP projection) the
  matmuls counted 1 and 3, qkv and fc, are saved; the attention and MLP projections (2 and 4) are recomputed.

Here: how many blocks are checkpointed, the FLOPs the recompute adds, and the bytes an op-level checkpointed block
keeps beyond its input (memory_eager / memory_compiled add them).
"""

from __future__ import annotations

from planner.memory_terms import F32, Dims, StepConfig
from planner.spec import ModelSpec


def checkpointed_blocks(n_layer: int, on: bool, every: int = 1) -> int:
    """Blocks under checkpoint: every k-th (torchtitan: layer ids k, 2k, ...), all with k = 1, none when off."""
    if not on:
        return 0
    return n_layer // max(1, every)


def cfg_checkpointed(cfg: StepConfig) -> int:
    return checkpointed_blocks(cfg.spec.n_layer, cfg.activation_checkpointing, cfg.ac_every)


def recomputed_matmul_params(spec: ModelSpec, policy: str) -> int:
    """Per checkpointed block: the matmul weights whose forward the backward re-runs. full: all of them;
    selective-op: the attention and MLP output projections (the 2nd and 4th matmul of the runner's block)."""
    q = spec.n_head * spec.head_dim
    kv = spec.n_kv_head * spec.head_dim
    n_in = 2 if spec.mlp == "swiglu" else 1
    if policy == "selective-op":
        return q * spec.d_model + spec.d_ff * spec.d_model
    return spec.d_model * (q + 2 * kv) + q * spec.d_model + (n_in + 1) * spec.d_model * spec.d_ff


def recompute_flops_per_token(spec: ModelSpec, on: bool, every: int = 1, policy: str = "full") -> float:
    """Extra forward FLOPs per token the checkpointed blocks re-run: 2 FLOPs per recomputed matmul weight, plus
    (full policy only) attention's forward, 4·T·q in the PaLM count (counts.attention_flops_per_token / 3)."""
    n = checkpointed_blocks(spec.n_layer, on, every)
    if not n:
        return 0.0
    per_block = 2.0 * recomputed_matmul_params(spec, policy)
    if policy != "selective-op":
        per_block += 4.0 * spec.n_head * spec.head_dim * spec.seq_len
    return n * per_block


def recompute_attention_share(on: bool, policy: str) -> float:
    """Fraction of a checkpointed block's attention forward that is re-run (selective-op saves SDPA's output)."""
    return 0.0 if (not on or policy == "selective-op") else 1.0


def sac_kept_per_token(D: Dims) -> int:
    """Bytes per token an op-level checkpointed block keeps beyond its input: the qkv and fc outputs (the saved
    matmuls) and attention's output and logsumexp (flash attention)."""
    n_in = 2 if D.mlp == "swiglu" else 1
    return D.a * (D.q + 2 * D.kv) + D.a * n_in * D.f + D.a * D.q + F32 * D.H
