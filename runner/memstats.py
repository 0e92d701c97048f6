"""CUDA memory readings of a finished measurement (benchmarks/gpu_suite.py, runner/probe_worker.py)."""

from __future__ import annotations

from typing import Any

import torch

KEYS = ("max_memory_allocated", "max_memory_reserved", "mem_get_info_free", "mem_get_info_total",
        "device_used_bytes", "non_allocator_bytes")


def cuda_memory(device: torch.device) -> dict[str, Any]:
    """Peak allocated/reserved (torch's caching allocator), mem_get_info, and the device memory
    outside the allocator (CUDA context, cuBLAS/NCCL buffers): used − reserved. None on CPU."""
    if device.type != "cuda":
        return dict.fromkeys(KEYS)
    free, total = torch.cuda.mem_get_info(device)
    return {"max_memory_allocated": torch.cuda.max_memory_allocated(device),
            "max_memory_reserved": torch.cuda.max_memory_reserved(device),
            "mem_get_info_free": free, "mem_get_info_total": total, "device_used_bytes": total - free,
            "non_allocator_bytes": total - free - torch.cuda.memory_reserved(device)}


def peak_over_ranks(readings: list[dict[str, Any]]) -> dict[str, Any]:
    """Per key, the largest reading of any rank (None where no rank has one)."""
    out: dict[str, Any] = {}
    for k in KEYS:
        vals = [r[k] for r in readings if r.get(k) is not None]
        out[k] = max(vals) if vals else None
    if out["mem_get_info_free"] is not None:      # the tightest rank's free memory, not the largest
        out["mem_get_info_free"] = min(r["mem_get_info_free"] for r in readings if r.get("mem_get_info_free") is not None)
    return out
