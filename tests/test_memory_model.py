"""Memory model shape: monotonic in batch and depth, peak at backward start, strategy sharding."""

from planner.build import build_plan
from planner.memory import estimate
from planner.memory_terms import StepConfig
from planner.plan import PlanRequest
from planner.profiles import find_profile
from planner.spec import nanochat


def test_monotonic_in_batch_and_depth() -> None:
    prev = 0
    for b in (1, 2, 4, 8, 16, 32):
        t = estimate(StepConfig(spec=nanochat(12), device_batch_size=b)).allocated_peak
        assert t > prev
        prev = t
    prev = 0
    for depth in (4, 8, 12, 20, 32):
        t = estimate(StepConfig(spec=nanochat(depth), device_batch_size=8)).allocated_peak
        assert t > prev
        prev = t


def test_peak_is_backward_start_not_a_plain_sum() -> None:
    e = estimate(StepConfig(spec=nanochat(20), device_batch_size=32, loss_chunk_tokens=0))
    assert e.peak_phase == "backward_start"
    assert e.breakdown["gradients"] == 0  # dp=1, no accumulation: grads do not exist yet
    # fp32 logits of B32/T2048/V65536 are 16 GiB; the loss holds several such tensors.
    assert e.breakdown["loss_temporaries"] >= 2 * 16 * 2**30


def test_sharding_divides_states() -> None:
    base = dict(spec=nanochat(20), device_batch_size=4, dp=8)
    ddp = estimate(StepConfig(**base, strategy="ddp")).breakdown
    z1 = estimate(StepConfig(**base, strategy="zero1")).breakdown
    fsdp = estimate(StepConfig(**base, strategy="fsdp")).breakdown
    assert z1["optimizer_state"] * 8 == ddp["optimizer_state"]
    assert fsdp["parameters"] * 8 == ddp["parameters"]


def test_d64_does_not_fit_ddp_on_80gb() -> None:
    # docs/sources.md §1: 12.9B params with AdamW under DDP is ~206 GB per GPU.
    p = build_plan(PlanRequest(gpu="8xH100", profile=find_profile("H100"), model=nanochat(64),
                               device_batch_size=1, hours=1))
    assert not p.memory.fits
    assert p.memory.breakdown["parameters"] + p.memory.breakdown["optimizer_state"] > 150e9
