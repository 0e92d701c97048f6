"""The validation loss: the mean of the model's loss over this rank's validation windows and every rank,
under the training step's autocast."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from planner.memory_terms import Precision
from runner.data import ValBatches
from runner.step import autocast


@torch.no_grad()
def val_loss(fwd: nn.Module, val: ValBatches, device: torch.device, precision: Precision, world_size: int) -> float:
    """The mean validation loss over every rank (a collective when world_size > 1); `fwd` is left in train mode."""
    fwd.eval()
    total = torch.zeros((), device=device, dtype=torch.float32)
    for x, y in val:
        with autocast(device.type, precision):
            total += fwd(x, y).float()
    fwd.train()
    if world_size > 1:
        dist.all_reduce(total)
    return total.item() / (val.n_batches * world_size)
