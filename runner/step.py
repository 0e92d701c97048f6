"""One training step, shared by the train loop (runner/train.py) and the trace (runner/trace.py).

Keeping the optimizer construction, autocast, loss and accumulation in one place is what
lets the memory trace measure exactly what the runner does.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import nn

from planner.memory_terms import Optimizer, Precision


class OptimizerGroup:
    """Several torch optimizers stepped together (Muon for matrices + AdamW for the rest)."""

    def __init__(self, optimizers: Sequence[torch.optim.Optimizer]) -> None:
        self.optimizers = list(optimizers)

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return [g for o in self.optimizers for g in o.param_groups]

    def step(self) -> None:
        for o in self.optimizers:
            o.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for o in self.optimizers:
            o.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return {"optimizers": [o.state_dict() for o in self.optimizers]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for o, s in zip(self.optimizers, state["optimizers"], strict=True):
            o.load_state_dict(s)


def is_hidden_matrix(name: str, p: torch.Tensor) -> bool:
    """The 2-D block projections that Muon optimises (not embeddings, head, norms or biases)."""
    return p.dim() == 2 and (name.startswith("blocks.") or ".blocks." in name)


def build_optimizer(model: nn.Module, kind: Optimizer, lr: float, matrix_lr: float, weight_decay: float,
                    betas: tuple[float, float], device_type: str) -> OptimizerGroup:
    """Fused AdamW (on CUDA and CPU), or torch.optim.Muon for hidden matrices + fused AdamW."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    adam_kw = dict(lr=lr, betas=betas, weight_decay=weight_decay, fused=True)
    if kind == "adamw":
        return OptimizerGroup([torch.optim.AdamW([p for _, p in named], **adam_kw)])
    mats = [p for n, p in named if is_hidden_matrix(n, p)]
    rest = [p for n, p in named if not is_hidden_matrix(n, p)]
    opts: list[torch.optim.Optimizer] = [torch.optim.Muon(mats, lr=matrix_lr, weight_decay=weight_decay,
                                                          adjust_lr_fn="match_rms_adamw")]
    if rest:
        opts.append(torch.optim.AdamW(rest, **adam_kw))
    return OptimizerGroup(opts)


def autocast(device_type: str, precision: Precision) -> contextlib.AbstractContextManager[Any]:
    if precision == "bf16-autocast":
        return torch.autocast(device_type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def param_dtype(precision: Precision) -> torch.dtype:
    return torch.bfloat16 if precision == "bf16" else torch.float32


def _no_sync(model: nn.Module, last: bool) -> contextlib.AbstractContextManager[Any]:
    if not last and hasattr(model, "no_sync"):
        return model.no_sync()
    return contextlib.nullcontext()


def train_step(model: nn.Module, opt: OptimizerGroup | Any, micro_batches: Iterator[tuple[torch.Tensor, torch.Tensor]],
               grad_accum: int, precision: Precision, device_type: str, grad_clip: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward/backward over grad_accum micro-batches, clip, step, zero grads.

    Returns (mean loss, grad norm) as tensors; the caller decides when to sync them to host.
    DDP's no_sync skips the all-reduce on all but the last micro-step.
    """
    total = torch.zeros((), device=next(model.parameters()).device, dtype=torch.float32)
    for i in range(grad_accum):
        x, y = next(micro_batches)
        with _no_sync(model, last=i == grad_accum - 1):
            with autocast(device_type, precision):
                loss = model(x, y)
            (loss / grad_accum).backward()
        total += loss.detach().float()
    if grad_clip > 0:
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    else:
        norm = torch.zeros((), device=total.device)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return total / grad_accum, norm
