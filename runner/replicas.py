"""Whether the data-parallel replicas still hold the same parameters: a fingerprint per rank, compared
at every checkpoint and recorded in its meta.json ("replicas").
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

EXACT_FINGERPRINT_MAX_BYTES = 1 << 30


@torch.no_grad()
def replica_fingerprint(model: nn.Module) -> tuple[str, str]:
    """(kind, sha256) of the parameters, equal on every DDP replica.

    Up to 1 GiB of parameters: the raw bytes of every tensor ("bytes", bit-exact). Above: the
    (sum, sum of squares) of every tensor in float64 ("sums"), cheap on the device.
    """
    params = [p.detach() for p in model.parameters()]
    h = hashlib.sha256()
    if sum(p.numel() * p.element_size() for p in params) <= EXACT_FINGERPRINT_MAX_BYTES:
        for p in params:
            h.update(p.contiguous().view(torch.uint8).cpu().numpy().tobytes())
        return "bytes", h.hexdigest()
    parts = []
    for p in params:
        x = p.reshape(-1)
        parts += [torch.sum(x, dtype=torch.float64), torch.dot(x, x).to(torch.float64)]
    h.update(torch.stack(parts).cpu().numpy().tobytes())
    return "sums", h.hexdigest()


def compare_replicas(own: tuple[str, str] | None, raw: nn.Module, world_size: int) -> dict[str, Any]:
    """{"agree", "kind", "fingerprints"} over every rank (a collective when world_size > 1).

    `own` is the strategy's own fingerprint ("shards" under zero2/fsdp: sharded ranks hold
    different bytes, so "agree" is None); without one, replica_fingerprint(raw).
    """
    kind, mine = own or replica_fingerprint(raw)
    prints = [mine]
    if world_size > 1:
        prints = [None] * world_size
        dist.all_gather_object(prints, mine)
    agree = len(set(prints)) == 1 if kind != "shards" else None
    return {"agree": agree, "kind": kind, "fingerprints": prints}
