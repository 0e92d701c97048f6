"""The GPT model family that nanoplan plans and the runner builds, plus named presets.

One decoder-only family, described by `ModelSpec`. `runner/model.py` builds exactly this
module tree; `planner/counts.py` counts it analytically. Styles:

- nanochat: d_model = 64·depth, head_dim 128, vocab 65536, untied, weightless RMSNorm,
  ReLU², rotary, QK-norm, logit softcap 15 (karpathy/nanochat, Oct-Dec 2025).
- gpt2: learned positions, LayerNorm with bias, GELU (tanh), tied, biases (Radford et al. 2019).
- llama: RMSNorm with weights, SwiGLU, GQA, untied, rotary (Touvron et al. 2023).
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from planner.errors import PlanError

Style = Literal["nanochat", "gpt2", "llama", "custom"]
MlpKind = Literal["relu2", "gelu", "swiglu"]
NormKind = Literal["rmsnorm_noweight", "rmsnorm", "layernorm"]
PosKind = Literal["rotary", "learned"]


class ModelSpec(BaseModel):
    """Shape and options of one GPT. Every field maps 1:1 onto runner/model.py."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    style: Style = "custom"
    n_layer: int = Field(gt=0, le=100_000)
    d_model: int = Field(gt=0, le=1_000_000)
    n_head: int = Field(gt=0, le=100_000)
    n_kv_head: int = Field(gt=0, le=100_000)
    d_ff: int = Field(gt=0, le=10_000_000)
    vocab_size: int = Field(gt=0, le=100_000_000)
    seq_len: int = Field(gt=0, le=10_000_000)
    mlp: MlpKind = "relu2"
    norm: NormKind = "rmsnorm_noweight"
    pos: PosKind = "rotary"
    tied: bool = False
    bias: bool = False
    qk_norm: bool = False
    logit_softcap: float | None = Field(default=None, gt=0, le=1000, allow_inf_nan=False, strict=True)   # 15, 30: a cap

    @model_validator(mode="after")
    def _check_shapes(self) -> ModelSpec:
        if self.d_model % self.n_head:
            raise ValueError(f"d_model {self.d_model} is not divisible by n_head {self.n_head}: pick n_head dividing d_model")
        if self.n_head % self.n_kv_head:
            raise ValueError(f"n_head {self.n_head} is not divisible by n_kv_head {self.n_kv_head}: pick n_kv_head dividing n_head")
        if self.pos == "rotary" and self.head_dim % 2:
            raise ValueError(f"rotary needs an even head_dim, got {self.head_dim}")
        return self

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head

    @property
    def name(self) -> str:
        if self.style == "nanochat":
            return f"d{self.n_layer}"
        return f"{self.style}-L{self.n_layer}-d{self.d_model}"


def nanochat_heads(d_model: int) -> int:
    """Smallest head count >= ceil(d/128) that divides d (head_dim 128 for even depths)."""
    h = max(1, math.ceil(d_model / 128))
    while d_model % h:
        h += 1
    return h


def nanochat(depth: int, seq_len: int = 2048, vocab_size: int = 65536, tied: bool = False) -> ModelSpec:
    """nanochat's depth-parameterised model: d_model = 64·depth, 4d ReLU² MLP (untied, as nanochat; `tied` shares
    the output head with the input embedding, as GPT-2 and modded-nanogpt's 2024 records do)."""
    if depth <= 0:
        raise PlanError("depth", f"must be a positive integer, got {depth}")
    d = 64 * depth
    h = nanochat_heads(d)
    return ModelSpec(
        style="nanochat", n_layer=depth, d_model=d, n_head=h, n_kv_head=h, d_ff=4 * d,
        vocab_size=vocab_size, seq_len=seq_len, mlp="relu2", norm="rmsnorm_noweight",
        pos="rotary", tied=tied, bias=False, qk_norm=True, logit_softcap=15.0,
    )


def gpt2(n_layer: int, d_model: int, n_head: int, seq_len: int = 1024,
         vocab_size: int = 50257, tied: bool = True) -> ModelSpec:
    return ModelSpec(
        style="gpt2", n_layer=n_layer, d_model=d_model, n_head=n_head, n_kv_head=n_head,
        d_ff=4 * d_model, vocab_size=vocab_size, seq_len=seq_len, mlp="gelu", norm="layernorm",
        pos="learned", tied=tied, bias=True,
    )


def llama_ff(d_model: int, multiple_of: int = 256) -> int:
    """Llama's SwiGLU width: 8/3·d rounded up to a multiple of 256 (Meta's reference code)."""
    hidden = int(2 * (4 * d_model) / 3)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


def llama(n_layer: int, d_model: int, n_head: int, n_kv_head: int, d_ff: int | None = None,
          seq_len: int = 2048, vocab_size: int = 32000, tied: bool = False) -> ModelSpec:
    return ModelSpec(
        style="llama", n_layer=n_layer, d_model=d_model, n_head=n_head, n_kv_head=n_kv_head,
        d_ff=d_ff or llama_ff(d_model), vocab_size=vocab_size, seq_len=seq_len, mlp="swiglu",
        norm="rmsnorm", pos="rotary", tied=tied, bias=False,
    )


def style_spec(style: Style, depth: int, seq_len: int, vocab_size: int, tied: bool | None = None) -> ModelSpec:
    """A depth-scaled member of a style (used by --depth and the search); `tied` overrides the style's own
    choice of sharing the output head with the input embedding (None: the style's)."""
    if style in ("nanochat", "custom"):
        return nanochat(depth, seq_len, vocab_size, tied=bool(tied))
    d = 64 * depth
    h = nanochat_heads(d)
    if style == "gpt2":
        return gpt2(depth, d, h, seq_len, vocab_size, tied=True if tied is None else tied)
    kv = max(1, h // 4) if h % 4 == 0 else h
    return llama(depth, d, h, kv, seq_len=seq_len, vocab_size=vocab_size, tied=bool(tied))


# Presets with published parameter counts (tests pin them).
PRESETS: dict[str, ModelSpec] = {
    "tiny": ModelSpec(style="nanochat", n_layer=2, d_model=64, n_head=2, n_kv_head=2, d_ff=256,
                      vocab_size=256, seq_len=64, qk_norm=True, logit_softcap=15.0),
    "d20": nanochat(20),
    "d26": nanochat(26),
    "d32": nanochat(32),
    "gpt2": gpt2(12, 768, 12),            # 124,439,808 (HF gpt2)
    "gpt2-medium": gpt2(24, 1024, 16),    # 354,823,168
    "gpt2-large": gpt2(36, 1280, 20),     # 774,030,080
    "gpt2-xl": gpt2(48, 1600, 25),        # 1,557,611,200
    "llama3.2-1b": llama(16, 2048, 32, 8, 8192, vocab_size=128256, tied=True),  # 1,235,814,400
    "llama3.1-8b": llama(32, 4096, 32, 8, 14336, vocab_size=128256),            # 8,030,261,248
}


def preset(name: str) -> ModelSpec:
    key = name.lower()
    if key in PRESETS:
        return PRESETS[key]
    if key.startswith("d") and key[1:].isdigit():
        return nanochat(int(key[1:]))
    raise PlanError("--preset", f"unknown preset {name!r}",
                    f"choose one of {', '.join(PRESETS)} or dN for nanochat depth N")
