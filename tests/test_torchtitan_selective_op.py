"""torchtitan's op-level selective checkpointing (`--ac-mode selective-op`, its default): the plan records what runs
(checkpointing on, policy selective-op) and the step pays for what the policy recomputes.

Independent reference: torchtitan 0.3.0's SelectiveAC (torchtitan/distributed/activation_checkpoint.py) counts a
block's matmuls in forward order and recomputes every second one (`mm_count % 2 == 0`), saving attention and the
others; its Llama block calls wq, wk, wv, attention, wo, then w2(silu(w1(x)) * w3(x)). Under a flat MFU the extra
compute is exactly those matmuls' forward FLOPs (2 per weight per token) at MFU × peak.
"""

from __future__ import annotations

import pytest

from planner.plan import load_plan
from tests.conftest import nanoplan_cli

MFU = 0.4


def plan(mode: str, capsys, tmp_path):
    code, out, err = nanoplan_cli(["estimate", "--trainer", "torchtitan", "--preset", "8B", "--gpu", "8xH100",
                                   "--ac-mode", mode, "--device-batch-size", "1", "--steps", "10", "--mfu", str(MFU),
                                   "--out", f"{mode}.json"], capsys, tmp_path)
    assert code == 0, err
    return load_plan(tmp_path / f"{mode}.json")


def test_selective_op_is_recorded_and_its_recompute_charged(capsys, tmp_path) -> None:
    none, sel, full = (plan(m, capsys, tmp_path) for m in ("none", "selective-op", "full"))
    assert (none.training.activation_checkpointing, none.training.ac_policy) == (False, "full")
    assert (sel.training.activation_checkpointing, sel.training.ac_policy) == (True, "selective-op")
    assert (full.training.activation_checkpointing, full.training.ac_policy) == (True, "full")
    s = sel.request.model
    d, f, q, kv = s.d_model, s.d_ff, s.n_head * s.head_dim, s.n_kv_head * s.head_dim
    forward_order = [d * q, d * kv, d * kv, q * d, d * f, d * f, f * d]       # wq wk wv wo w1 w3 w2
    recomputed = sum(w for i, w in enumerate(forward_order, start=1) if i % 2 == 0)   # wk, wo, w3
    assert recomputed == d * kv + q * d + d * f
    per_gpu_tokens = sel.schedule.tokens_per_step / sel.hardware.num_gpus
    extra = per_gpu_tokens * s.n_layer * 2 * recomputed / (MFU * sel.throughput.peak_flops_per_gpu)
    assert sel.throughput.compute_seconds - none.throughput.compute_seconds == pytest.approx(extra, rel=1e-9)
    assert none.throughput.compute_seconds < sel.throughput.compute_seconds < full.throughput.compute_seconds
    assert full.memory.per_gpu_bytes < sel.memory.per_gpu_bytes < none.memory.per_gpu_bytes
