"""Exact parameter counts and training FLOPs for a ModelSpec (pure Python).

Conventions:
- Parameters are counted module by module exactly as runner/model.py builds them.
- N_matmul counts every weight that takes part in a matmul per token: the attention and MLP
  projections and the output head (also when tied). It excludes the input embedding
  tables, norms and biases.
- Training FLOPs per token = 6·N_matmul + 12·L·(n_head·head_dim)·T (PaLM, Chowdhery et al.
  2022, appendix B). The attention term counts the QKᵀ and AV matmuls for forward (2·2)
  and backward (2·4) over the full T×T score matrix: no saving is taken for the causal
  mask, matching what FlopCounterMode counts for SDPA. One multiply-add is 2 FLOPs.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.spec import ModelSpec


@dataclass(frozen=True)
class ParamCounts:
    embeddings: int
    attention: int
    mlp: int
    norms: int
    head: int

    @property
    def total(self) -> int:
        return self.embeddings + self.attention + self.mlp + self.norms + self.head

    def as_dict(self) -> dict[str, int]:
        return {"embeddings": self.embeddings, "attention": self.attention, "mlp": self.mlp,
                "norms": self.norms, "head": self.head, "total": self.total}


def norm_params(spec: ModelSpec) -> int:
    """Parameters in one norm layer."""
    return {"rmsnorm_noweight": 0, "rmsnorm": spec.d_model, "layernorm": 2 * spec.d_model}[spec.norm]


def attn_weight_params(spec: ModelSpec) -> int:
    """Matmul weights of one attention block: fused qkv plus output projection."""
    q = spec.n_head * spec.head_dim
    kv = spec.n_kv_head * spec.head_dim
    return spec.d_model * (q + 2 * kv) + q * spec.d_model


def mlp_weight_params(spec: ModelSpec) -> int:
    n_in = 2 if spec.mlp == "swiglu" else 1
    return (n_in + 1) * spec.d_model * spec.d_ff


def param_counts(spec: ModelSpec) -> ParamCounts:
    d, L = spec.d_model, spec.n_layer
    q = spec.n_head * spec.head_dim
    kv = spec.n_kv_head * spec.head_dim
    emb = spec.vocab_size * d + (spec.seq_len * d if spec.pos == "learned" else 0)
    attn = attn_weight_params(spec) + ((q + 2 * kv + d) if spec.bias else 0)
    n_in = 2 if spec.mlp == "swiglu" else 1
    mlp = mlp_weight_params(spec) + ((n_in * spec.d_ff + d) if spec.bias else 0)
    norms = (2 * L + 1) * norm_params(spec)
    head = 0 if spec.tied else spec.vocab_size * d
    return ParamCounts(embeddings=emb, attention=L * attn, mlp=L * mlp, norms=norms, head=head)


def n_params(spec: ModelSpec) -> int:
    return param_counts(spec).total


def matmul_params(spec: ModelSpec) -> int:
    """N_matmul: block projections plus the output head (counted even when tied)."""
    return spec.n_layer * (attn_weight_params(spec) + mlp_weight_params(spec)) + spec.vocab_size * spec.d_model


def matrix_params(spec: ModelSpec) -> int:
    """Parameters of the 2-D hidden matrices that Muon optimises (block projections only)."""
    return spec.n_layer * (attn_weight_params(spec) + mlp_weight_params(spec))


def attention_flops_per_token(spec: ModelSpec) -> int:
    return 12 * spec.n_layer * spec.n_head * spec.head_dim * spec.seq_len


def flops_per_token(spec: ModelSpec) -> int:
    """Training FLOPs per token (forward + backward), PaLM convention."""
    return 6 * matmul_params(spec) + attention_flops_per_token(spec)
