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

Which matmuls the op-level policy recomputes depends on how the trainer's block lays out its linears: it counts the
block's matmuls in forward order and recomputes every second one. The runner fuses q, k and v into one linear and
SwiGLU's gate and up projections into one (runner/model.py): [qkv, proj, fc, mlp proj], so proj and mlp proj are
recomputed. torchtitan's Llama block calls wq, wk, wv, (attention), wo, then w2(silu(w1(x)) * w3(x)) (0.3.0
torchtitan/models/common/attention.py `self.wq(x), self.wk(x), self.wv(x)`, feed_forward.py), so its policy
(torchtitan/distributed/activation_checkpoint.py SelectiveAC: `mm_count % 2 == 0` -> PREFER_RECOMPUTE; attention and
the other matmuls MUST_SAVE) recomputes wk, wo and w3. `StepConfig.separate_projections` says which layout runs, and
`recompute_policy` turns it into the policy string the step-time model reads (SAC_SEPARATE for torchtitan's).

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


SAC_SEPARATE = "selective-op/separate"   # the op-level policy on a block of separate q, k, v (and gate, up) linears


def recompute_policy(cfg: StepConfig) -> str:
    """The checkpointing policy as the step-time model reads it: SAC_SEPARATE for the op-level policy on a block whose
    projections are separate linears (StepConfig.separate_projections: torchtitan's Llama), else cfg.ac_policy."""
    if cfg.ac_policy == "selective-op" and cfg.separate_projections:
        return SAC_SEPARATE
    return cfg.ac_policy


def block_matmuls(spec: ModelSpec, separate: bool = False) -> list[int]:
    """The weights of one block's matmuls in forward order: the runner's fused [qkv, proj, fc, mlp proj], or (separate)
    torchtitan's Llama [wq, wk, wv, wo, w1, w3, w2] (SwiGLU; a one-input MLP has no w3)."""
    d, f = spec.d_model, spec.d_ff
    q, kv = spec.n_head * spec.head_dim, spec.n_kv_head * spec.head_dim
    n_in = 2 if spec.mlp == "swiglu" else 1
    if not separate:
        return [d * (q + 2 * kv), q * d, n_in * d * f, f * d]
    return [d * q, d * kv, d * kv, q * d, d * f] + ([d * f] if n_in == 2 else []) + [f * d]


def recomputed_matmul_params(spec: ModelSpec, policy: str) -> int:
    """Per checkpointed block: the matmul weights whose forward the backward re-runs. full: all of them;
    selective-op: every second matmul in forward order (the runner: the attention and MLP output projections;
    SAC_SEPARATE, torchtitan: wk, wo and w3)."""
    if policy.startswith("selective-op"):
        return sum(block_matmuls(spec, policy == SAC_SEPARATE)[1::2])
    return sum(block_matmuls(spec))


def recompute_flops_per_token(spec: ModelSpec, on: bool, every: int = 1, policy: str = "full") -> float:
    """Extra forward FLOPs per token the checkpointed blocks re-run: 2 FLOPs per recomputed matmul weight, plus
    (full policy only) attention's forward, 4·T·q in the PaLM count (counts.attention_flops_per_token / 3)."""
    n = checkpointed_blocks(spec.n_layer, on, every)
    if not n:
        return 0.0
    per_block = 2.0 * recomputed_matmul_params(spec, policy)
    if not policy.startswith("selective-op"):
        per_block += 4.0 * spec.n_head * spec.head_dim * spec.seq_len
    return n * per_block


def recompute_attention_share(on: bool, policy: str) -> float:
    """Fraction of a checkpointed block's attention forward that is re-run (selective-op saves SDPA's output)."""
    return 0.0 if (not on or policy.startswith("selective-op")) else 1.0


def sac_kept_per_token(D: Dims) -> int:
    """Bytes per token an op-level checkpointed block keeps beyond its input: the qkv and fc outputs (the saved
    matmuls) and attention's output and logsumexp (flash attention)."""
    n_in = 2 if D.mlp == "swiglu" else 1
    return D.a * (D.q + 2 * D.kv) + D.a * n_in * D.f + D.a * D.q + F32 * D.H
