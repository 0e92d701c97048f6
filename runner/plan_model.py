"""The plan's model on this rank: built from the seed, then wrapped with its optimizer for the plan's
data-parallel strategy (runner/parallel.py: ddp, zero1, zero2, fsdp) and compiled when planned.
"""

from __future__ import annotations

import torch

from planner.plan import Plan
from runner.model import GPT
from runner.parallel import Parallel, parallelize
from runner.step import build_optimizer


def build_model(plan: Plan, device: torch.device) -> GPT:
    """The plan's GPT on `device`, initialised identically on every rank from the seed."""
    tr = plan.training
    with torch.device("meta"):
        model = GPT(plan.request.model, loss_chunk_tokens=tr.loss_chunk_tokens,
                    activation_checkpointing=tr.activation_checkpointing)
    model.to_empty(device=device)
    if tr.precision == "bf16":
        for p in model.parameters():
            p.data = p.data.to(torch.bfloat16)
    model.init_weights(plan.request.hyper.seed)
    return model


def wrap_model(plan: Plan, world_size: int, device: torch.device) -> Parallel:
    """The model and its optimizer, wrapped for the plan's strategy on `world_size` ranks."""
    tr, hyper = plan.training, plan.request.hyper
    return parallelize(
        tr.strategy, world_size, device, precision=tr.precision, compile=bool(tr.compile),
        build_model=lambda: build_model(plan, device), init=lambda m: m.init_weights(hyper.seed),
        make_meta=lambda: GPT(plan.request.model, loss_chunk_tokens=tr.loss_chunk_tokens,
                              activation_checkpointing=tr.activation_checkpointing),
        build_optimizer=lambda m: build_optimizer(m, tr.optimizer, hyper.lr, hyper.matrix_lr, hyper.weight_decay,
                                                  tuple(hyper.betas), device.type))
