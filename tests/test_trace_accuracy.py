"""The analytic memory model against traces of the runner's real step (small grid, CI time).

benchmarks/memory_accuracy.py runs the big grid (depth 4-32, batch 1-32, seq 256-4096).
"""

from __future__ import annotations

import random

import pytest

from planner.memory import allocated_peak, estimate
from planner.memory_eager import layer_activation_bytes
from planner.memory_terms import StepConfig
from planner.spec import style_spec
from runner.trace import trace_memory

TOLERANCE = 0.03   # the target; benchmarks/results/memory_accuracy.md has the measured errors

# (style, depth, seq, vocab, batch, chunk, precision, checkpointing, optimizer, accum, dp, strategy)
GRID = [
    ("nanochat", 3, 128, 2048, 2, 0, "bf16-autocast", False, "adamw", 1, 1, "ddp"),
    ("nanochat", 4, 128, 2048, 4, 128, "bf16-autocast", True, "muon", 2, 2, "ddp"),
    ("nanochat", 2, 64, 4096, 1, 0, "fp32", False, "adamw", 1, 1, "ddp"),
    ("gpt2", 3, 128, 1024, 2, 0, "bf16-autocast", False, "adamw", 2, 1, "ddp"),
    ("gpt2", 2, 64, 2048, 1, 0, "fp32", True, "muon", 1, 1, "ddp"),          # tied head, embedding peak
    ("gpt2", 4, 128, 512, 2, 100, "bf16", False, "adamw", 3, 2, "ddp"),
    ("llama", 8, 64, 512, 2, 64, "bf16-autocast", False, "muon", 1, 1, "ddp"),   # GQA
    ("llama", 3, 128, 1024, 2, 0, "fp32", True, "adamw", 2, 2, "ddp"),
    # zero2/fsdp in fp32, as CPU plans run them: under bf16 autocast the runner gives FSDP2 bf16 gathers on CUDA
    # (no autocast weight copies, planner.memory_terms.fsdp_mixed_precision), which a CPU trace cannot emulate
    ("llama", 4, 128, 2048, 2, 128, "fp32", False, "adamw", 1, 4, "zero2"),
    ("nanochat", 3, 128, 1024, 2, 0, "fp32", False, "adamw", 2, 4, "fsdp"),
    ("gpt2", 3, 128, 1024, 2, 0, "bf16-autocast", True, "muon", 2, 4, "zero1"),
]


def _cfg(row: tuple) -> StepConfig:
    style, depth, seq, vocab, b, chunk, prec, ckpt, opt, accum, dp, strategy = row
    return StepConfig(spec=style_spec(style, depth, seq, vocab), device_batch_size=b, grad_accum_steps=accum, dp=dp,
                      precision=prec, optimizer=opt, strategy=strategy, activation_checkpointing=ckpt,
                      loss_chunk_tokens=chunk)


@pytest.mark.parametrize("row", GRID, ids=lambda r: "-".join(map(str, r)))
def test_analytic_peak_within_3_percent_of_trace(row: tuple) -> None:
    cfg = _cfg(row)
    t = trace_memory(cfg)
    e = estimate(cfg)
    assert abs(e.allocated_peak / t.peak_bytes - 1) < TOLERANCE, (e.allocated_peak, t.peak_bytes, t.breakdown)
    assert e.breakdown["parameters"] == t.breakdown["parameters"]      # the same weights, counted independently
    if cfg.strategy == "ddp" and t.peak_phase != "optimizer":   # MemTracker files step temporaries as state
        assert e.breakdown["optimizer_state"] == t.breakdown["optimizer_state"]


@pytest.mark.parametrize("compile_,seed", [(False, 0), (True, 1)], ids=["eager", "compiled"])
def test_fast_path_equals_estimate(compile_: bool, seed: int) -> None:
    """allocated_peak (cached linear profiles, used by the search) is estimate's number exactly, for the eager
    step and for the compiled one (GPU plans), whose fast path shares its walk's parts between settings."""
    rng = random.Random(seed)
    for _ in range(400):
        cfg = StepConfig(
            spec=style_spec(rng.choice(["nanochat", "gpt2", "llama"]), rng.choice([2, 8, 20, 32]),
                            rng.choice([256, 2048]), rng.choice([512, 50257, 65536])),
            device_batch_size=rng.choice([1, 3, 8, 32]), grad_accum_steps=rng.choice([1, 2, 3]),
            dp=rng.choice([1, 8]), precision=rng.choice(["bf16-autocast", "bf16", "fp32"]),
            optimizer=rng.choice(["adamw", "muon"]), strategy=rng.choice(["ddp", "zero1", "zero2", "fsdp"]),
            activation_checkpointing=rng.random() < 0.5, loss_chunk_tokens=rng.choice([0, 1000, 4096]),
            compile=compile_)
        assert allocated_peak(cfg) == estimate(cfg).allocated_peak, cfg


def test_layer_bytes_per_token_nanochat() -> None:
    # bf16-autocast, CUDA semantics: 64·d bytes per token for a nanochat block (d = 64·depth,
    # f = 4d): residuals 8d, norm casts 4d, qkv 6d, qk-norm fp32 inputs 8d and bf16 copies 4d,
    # attention output 2d, ReLU² 32d (relu 2f, fp32 square input 4f, bf16 copy 2f) + per-row stats
    spec = style_spec("nanochat", 20, 2048, 65536)
    d, H = spec.d_model, spec.n_head
    assert layer_activation_bytes(spec, "bf16-autocast") == 64 * d + 2 * 4 + 4 * 2 * H + 4 * H


def test_breakdown_sums_to_peak() -> None:
    for row in GRID:
        e = estimate(_cfg(row))
        assert sum(e.breakdown.values()) == e.allocated_peak
        assert e.phases[e.peak_phase] == e.allocated_peak == max(e.phases.values())
