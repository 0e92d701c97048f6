"""The GPT that nanoplan trains: exactly the family planner/spec.py describes.

Parameter count equals planner.counts.n_params(spec) for every valid spec (tested).
Attention is F.scaled_dot_product_attention(is_causal=True), so FlashAttention is used on
CUDA. The loss can be computed in token chunks under activation checkpointing, so the fp32
logits of the whole batch are never materialised at once (`loss_chunk_tokens`). Activation checkpointing
(torch.utils.checkpoint) covers every block, or every k-th (`ac_every`), in full or op-level with a policy
(`ac_policy="selective-op"`: torchtitan's default, `create_selective_checkpoint_contexts`). Any style may tie
its output head to the input embedding (`spec.tied`). FP8 matmuls are planned (planner/compute_model.py), not run:
torchao's Float8Linear needs a GPU with FP8 tensor cores (SM89+), which no test machine here has.

Under bf16 autocast the residual stream is bf16, as in nanochat: the embedding's output is cast
once, and every block adds bf16 branch outputs to a bf16 stream. Norms still run in fp32 (CUDA
autocast), and the loss, the softmax and the optimizer's master weights stay fp32
(docs/numerics.md). `bf16_residual=False` keeps the fp32 stream (the earlier behaviour).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from planner.spec import ModelSpec


class WeightlessRMSNorm(nn.Module):
    """RMSNorm with no learnable scale (nanochat)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.size(-1),))


def make_norm(spec: ModelSpec) -> nn.Module:
    if spec.norm == "rmsnorm_noweight":
        return WeightlessRMSNorm()
    if spec.norm == "rmsnorm":
        return nn.RMSNorm(spec.d_model)
    return nn.LayerNorm(spec.d_model, bias=True)


def rotary_tables(seq_len: int, head_dim: int, base: float = 10000.0,
                  device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim))
    t = torch.arange(seq_len, dtype=torch.float32, device=device)
    freqs = torch.outer(t, inv)
    return freqs.cos(), freqs.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (B, T, H, D). Rotate the two halves of the head dimension."""
    d = x.size(-1) // 2
    x1, x2 = x[..., :d], x[..., d:]
    cos = cos[None, : x.size(1), None, :].to(x.dtype)
    sin = sin[None, : x.size(1), None, :].to(x.dtype)
    return torch.cat((x1 * cos + x2 * sin, x2 * cos - x1 * sin), dim=-1)


class Attention(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.spec = spec
        hd = spec.head_dim
        self.qkv = nn.Linear(spec.d_model, (spec.n_head + 2 * spec.n_kv_head) * hd, bias=spec.bias)
        self.proj = nn.Linear(spec.n_head * hd, spec.d_model, bias=spec.bias)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
        s = self.spec
        B, T, _ = x.shape
        hd = s.head_dim
        q, k, v = self.qkv(x).split([s.n_head * hd, s.n_kv_head * hd, s.n_kv_head * hd], dim=-1)
        q = q.view(B, T, s.n_head, hd)
        k = k.view(B, T, s.n_kv_head, hd)
        v = v.view(B, T, s.n_kv_head, hd)
        if rope is not None:
            q, k = apply_rotary(q, *rope), apply_rotary(k, *rope)
        if s.qk_norm:
            q, k = F.rms_norm(q, (hd,)), F.rms_norm(k, (hd,))
        y = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
            is_causal=True, enable_gqa=s.n_kv_head != s.n_head,
        )
        return self.proj(y.transpose(1, 2).reshape(B, T, s.n_head * hd))


class MLP(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.kind = spec.mlp
        n_in = 2 if spec.mlp == "swiglu" else 1
        self.fc = nn.Linear(spec.d_model, n_in * spec.d_ff, bias=spec.bias)
        self.proj = nn.Linear(spec.d_ff, spec.d_model, bias=spec.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        if self.kind == "relu2":
            h = F.relu(h).square()
        elif self.kind == "gelu":
            h = F.gelu(h, approximate="tanh")
        else:
            gate, up = h.chunk(2, dim=-1)
            h = F.silu(gate) * up
        return self.proj(h)


class Block(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.norm1 = make_norm(spec)
        self.attn = Attention(spec)
        self.norm2 = make_norm(spec)
        self.mlp = MLP(spec)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), rope)
        return x + self.mlp(self.norm2(x))


def head_loss(x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
              softcap: float | None) -> torch.Tensor:
    """Summed cross-entropy of logits = x @ weightᵀ (softcapped in fp32)."""
    logits = F.linear(x, weight).float()
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    return F.cross_entropy(logits, targets, ignore_index=-1, reduction="sum")


def _save_every_other_matmul() -> Any:
    """A selective-checkpoint policy as torchtitan's "op" mode: save the outputs of attention and of every other
    matmul (the 1st and 3rd of a block: qkv and fc), recompute the rest (planner/checkpointing.py)."""
    import torch.utils.checkpoint as cp

    aten = torch.ops.aten
    matmuls = {aten.mm.default, aten.addmm.default}
    attention = {op for name in ("_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
                                 "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_cudnn_attention")
                 if hasattr(aten, name) for op in (getattr(aten, name).default,)}
    counts = {"forward": 0, "recompute": 0}

    def policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> Any:
        if op in attention:
            return cp.CheckpointPolicy.MUST_SAVE
        if op in matmuls:
            key = "recompute" if ctx.is_recompute else "forward"
            counts[key] += 1
            if counts[key] % 2 == 1:
                return cp.CheckpointPolicy.MUST_SAVE
        return cp.CheckpointPolicy.PREFER_RECOMPUTE

    return cp.create_selective_checkpoint_contexts(policy)


class GPT(nn.Module):
    def __init__(self, spec: ModelSpec, loss_chunk_tokens: int = 0,
                 activation_checkpointing: bool = False, bf16_residual: bool = True,
                 ac_every: int = 1, ac_policy: str = "full") -> None:
        super().__init__()
        self.spec = spec
        self.loss_chunk_tokens = loss_chunk_tokens
        self.activation_checkpointing = activation_checkpointing
        self.ac_every = max(1, ac_every)      # checkpoint blocks k, 2k, ... (1-based), as torchtitan's ac_freq
        self.ac_policy = ac_policy            # "full", or "selective-op": planner/checkpointing.py
        self.bf16_residual = bf16_residual
        self.wte = nn.Embedding(spec.vocab_size, spec.d_model)
        self.wpe = nn.Embedding(spec.seq_len, spec.d_model) if spec.pos == "learned" else None
        self.blocks = nn.ModuleList(Block(spec) for _ in range(spec.n_layer))
        self.norm_f = make_norm(spec)
        self.lm_head = None if spec.tied else nn.Linear(spec.d_model, spec.vocab_size, bias=False)
        if spec.pos == "rotary":
            cos, sin = rotary_tables(spec.seq_len, spec.head_dim)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)

    @property
    def head_weight(self) -> torch.Tensor:
        return self.wte.weight if self.lm_head is None else self.lm_head.weight

    @torch.no_grad()
    def init_weights(self, seed: int = 0) -> None:
        """GPT-2 style init: N(0, 0.02), output projections scaled by 1/sqrt(2L), zeros for biases."""
        gen = torch.Generator(device="cpu").manual_seed(seed)
        std_out = 0.02 / (2 * self.spec.n_layer) ** 0.5
        for name, p in self.named_parameters():
            if p.dim() < 2:
                p.copy_(torch.ones_like(p) if name.endswith("weight") else torch.zeros_like(p))
                continue
            std = std_out if name.endswith("proj.weight") else 0.02
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float32).to(p.dtype) * std)
        if self.spec.pos == "rotary":
            cos, sin = rotary_tables(self.spec.seq_len, self.spec.head_dim, device=self.rope_cos.device)
            self.rope_cos.copy_(cos)
            self.rope_sin.copy_(sin)

    def hidden(self, idx: torch.Tensor) -> torch.Tensor:
        """Final normalised hidden states (B, T, d)."""
        x = self.wte(idx)
        if self.wpe is not None:
            x = x + self.wpe(torch.arange(idx.size(1), device=idx.device))
        dev = x.device.type
        if (self.bf16_residual and x.dtype == torch.float32 and dev in ("cuda", "cpu") and torch.is_autocast_enabled(dev)
                and torch.get_autocast_dtype(dev) == torch.bfloat16):
            x = x.to(torch.bfloat16)           # the residual stream is bf16 under bf16 autocast
        rope = (self.rope_cos, self.rope_sin) if self.spec.pos == "rotary" else None
        for i, block in enumerate(self.blocks, 1):
            if self.activation_checkpointing and self.training and i % self.ac_every == 0:
                if self.ac_policy == "selective-op":
                    x = checkpoint(block, x, rope, use_reentrant=False, context_fn=_save_every_other_matmul)
                else:
                    x = checkpoint(block, x, rope, use_reentrant=False)
            else:
                x = block(x, rope)
        return self.norm_f(x)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (B, T, V) when targets is None, else the mean cross-entropy loss."""
        x = self.hidden(idx)
        w = self.head_weight
        softcap = self.spec.logit_softcap
        if targets is None:
            logits = F.linear(x, w).float()
            return softcap * torch.tanh(logits / softcap) if softcap else logits
        x2, t2 = x.reshape(-1, x.size(-1)), targets.reshape(-1)
        n = x2.size(0)
        chunk = self.loss_chunk_tokens
        if chunk <= 0 or chunk >= n:
            total = head_loss(x2, w, t2, softcap)
        else:
            total = x2.new_zeros((), dtype=torch.float32)
            for s in range(0, n, chunk):
                total = total + checkpoint(head_loss, x2[s:s + chunk], w, t2[s:s + chunk], softcap,
                                           use_reentrant=False)
        return total / (t2 != -1).sum().clamp(min=1)


def build_meta_model(spec: ModelSpec, loss_chunk_tokens: int = 0, activation_checkpointing: bool = False,
                     ac_every: int = 1, ac_policy: str = "full") -> nn.Module:
    """The runner's GPT on the meta device: shapes only, no memory."""
    with torch.device("meta"):
        return GPT(spec, loss_chunk_tokens=loss_chunk_tokens, activation_checkpointing=activation_checkpointing,
                   ac_every=ac_every, ac_policy=ac_policy)
