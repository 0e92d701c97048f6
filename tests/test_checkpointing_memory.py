"""What real runs use, in the runner and the planner (issue 25 item 4), against the runner's own trace and counts.

- checkpointing every k-th block and op-level (torchtitan's selective "op" policy, torch.utils.checkpoint with
  create_selective_checkpoint_contexts) run in runner/model.py; the planner's peak is held against a
  FakeTensorMode + MemTracker trace of that step (runner/trace.py);
- tied embeddings for every style: the runner's model has the planner's parameter count, one V×d table fewer.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from planner.counts import flops_per_token, n_params
from planner.memory import allocated_peak, estimate
from planner.memory_terms import StepConfig
from planner.spec import style_spec
from runner.model import build_meta_model
from runner.trace import trace_memory

CASES = [("nanochat", "fp32"), ("llama", "fp32"), ("gpt2", "bf16-autocast")]


@pytest.mark.parametrize("style,precision", CASES)
def test_every_kth_block_checkpointed_matches_the_trace(style: str, precision: str) -> None:
    base = StepConfig(spec=style_spec(style, 4, 256, 512), device_batch_size=4, precision=precision,
                      loss_chunk_tokens=0, activation_checkpointing=True)
    for every in (2, 3):
        cfg = replace(base, ac_every=every)
        traced = trace_memory(cfg).peak_bytes
        assert estimate(cfg).allocated_peak == allocated_peak(cfg)
        assert estimate(cfg).allocated_peak == pytest.approx(traced, rel=0.055), every


@pytest.mark.parametrize("style,precision", CASES)
def test_op_level_checkpointing_is_bounded_by_the_trace(style: str, precision: str) -> None:
    """The op-level policy keeps qkv's and fc's outputs and attention's: between full checkpointing and none,
    and the planner's peak is at most 8% above the runner's traced one, never below it."""
    base = StepConfig(spec=style_spec(style, 4, 256, 512), device_batch_size=4, precision=precision,
                      loss_chunk_tokens=0)
    full = trace_memory(replace(base, activation_checkpointing=True)).peak_bytes
    none = trace_memory(base).peak_bytes
    cfg = replace(base, activation_checkpointing=True, ac_policy="selective-op")
    traced = trace_memory(cfg).peak_bytes
    assert full < traced < none
    planned = estimate(cfg).allocated_peak
    assert planned == allocated_peak(cfg)
    assert traced <= planned <= traced * 1.08


@pytest.mark.parametrize("style", ["nanochat", "gpt2", "llama"])
def test_tied_embeddings_for_every_style(style: str) -> None:
    tied, untied = (style_spec(style, 4, 256, 1000, tied=t) for t in (True, False))
    assert tied.tied and not untied.tied
    V, d = 1000, tied.d_model
    assert n_params(untied) - n_params(tied) == V * d
    for spec in (tied, untied):
        model = build_meta_model(spec)
        assert sum(p.numel() for p in model.parameters()) == n_params(spec)
    assert flops_per_token(tied) == flops_per_token(untied)      # the head's matmul runs either way
