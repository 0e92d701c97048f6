"""The step-time model's new terms (planner/throughput.py), each against an independent count.

- per-micro-step costs make tokens/s rise with the micro-batch at a fixed total batch;
- fused AdamW's step is its bytes (7 accesses per parameter) over the achieved HBM bandwidth;
- Muon's Newton–Schulz FLOPs equal FlopCounterMode's count of torch.optim.Muon's own iteration;
- the MFU default falls with model size as the sourced sweep does;
- calibrate.fitted_mfu inverts the model exactly, whatever the terms.
"""

from __future__ import annotations

import inspect
import math

import pytest

from planner import throughput as tput
from planner.build import build_plan
from planner.calibrate import fitted_mfu
from planner.counts import matrix_params, n_params
from planner.memory_terms import StepConfig
from planner.plan import PlanRequest
from planner.profiles import SIZE_MFU_POINTS, find_profile, parse_gpu_spec, size_factor
from planner.spec import nanochat
from planner.throughput import estimate_throughput, hidden_matrix_shapes, newton_schulz_flops

H100_HBM = 3.35e12 * 0.9      # H100-SXM hbm_tb_s × HBM_EFFICIENCY (measured copy 3.0 of 3.35 TB/s)


def cfg(depth: int = 20, b: int = 8, g: int = 8, **kw) -> StepConfig:
    kw.setdefault("grad_accum_steps", 524_288 // (b * 2048 * g))
    return StepConfig(spec=nanochat(depth), device_batch_size=b, dp=g, **kw)


# ------------------------------------------------------------------ micro-batches


@pytest.mark.parametrize("strategy", ["ddp", "zero1", "zero2", "fsdp"])
def test_tokens_per_sec_rises_with_micro_batch(strategy: str) -> None:
    """Fixed 524,288-token batch, no loss chunking: fewer, bigger micro-steps are strictly faster."""
    hw = parse_gpu_spec("8xH100")
    tps = [estimate_throughput(cfg(b=b, strategy=strategy, loss_chunk_tokens=0), hw).tokens_per_sec
           for b in (1, 2, 4, 8, 16, 32)]
    assert all(a < b for a, b in zip(tps, tps[1:], strict=False)), tps


def test_without_per_micro_step_costs_micro_batch_does_not_matter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tput, "LAUNCH_SECONDS", 0.0)
    monkeypatch.setattr(tput, "ACCUM_ACCESSES", 0)
    hw = parse_gpu_spec("H100")    # one GPU: no communication, whose exposure also depends on the micro-step
    steps = {estimate_throughput(cfg(b=b, g=1, loss_chunk_tokens=0), hw).step_seconds for b in (1, 4, 32)}
    assert max(steps) == pytest.approx(min(steps), rel=1e-12)


def test_micro_step_costs_are_the_accumulation_bytes_and_launches() -> None:
    """ddp, 16 micro-steps: 15 in-place adds of fp32 gradients (read 2, write 1) and 16 × the launches."""
    hw = parse_gpu_spec("8xH100")
    tp = estimate_throughput(cfg(depth=20, b=2, loss_chunk_tokens=0), hw)
    P = n_params(nanochat(20))
    launches = 16 * (20 + 20 * 80) * 2e-6      # per micro-step: 20 + 80 per eager block, 2 µs each (assumptions)
    assert tp.micro_step_seconds == pytest.approx(15 * 3 * 4 * P / H100_HBM + launches, rel=1e-12)


def test_loss_recompute_is_the_heads_forward_only_when_chunked() -> None:
    spec = nanochat(20)
    assert tput.loss_recompute_flops_per_token(spec, 4096, 4096) == 0.0
    assert tput.loss_recompute_flops_per_token(spec, 8192, 4096) == 2 * 65536 * 1280
    assert tput.loss_recompute_flops_per_token(spec, 8192, 0) == 0.0
    hw = parse_gpu_spec("8xH100")
    one, two = (estimate_throughput(cfg(b=b, loss_chunk_tokens=4096), hw) for b in (2, 4))
    assert one.loss_recompute_seconds == 0 and two.loss_recompute_seconds > 0
    assert two.compute_seconds - one.compute_seconds == pytest.approx(two.loss_recompute_seconds, rel=1e-9)


# ------------------------------------------------------------------ the optimizer step


@pytest.mark.parametrize("precision,w", [("bf16-autocast", 4), ("bf16", 2), ("fp32", 4)])
def test_adamw_step_is_bytes_over_bandwidth(precision: str, w: int) -> None:
    """Fused AdamW reads p, g, m, v and writes p, m, v; clipping reads g twice and writes it once."""
    P = n_params(nanochat(12))
    one = estimate_throughput(cfg(depth=12, g=1, precision=precision), parse_gpu_spec("H100"))
    assert one.optimizer_seconds == pytest.approx((7 + 3) * w * P / H100_HBM, rel=1e-12)
    assert one.optimizer_matmul_seconds == 0
    # zero1 steps 1/8 of the parameters per rank; the gradients it clips are whole (DDP)
    z1 = estimate_throughput(cfg(depth=12, precision=precision, strategy="zero1"), parse_gpu_spec("8xH100"))
    assert z1.optimizer_seconds == pytest.approx((7 * w * P / 8 + 3 * w * P) / H100_HBM, rel=1e-12)
    fs = estimate_throughput(cfg(depth=12, precision=precision, strategy="fsdp"), parse_gpu_spec("8xH100"))
    assert fs.optimizer_seconds == pytest.approx((7 + 3) * w * P / 8 / H100_HBM, rel=1e-12)


def test_muon_newton_schulz_flops_match_torch() -> None:
    """FlopCounterMode over torch.optim.Muon's own orthogonalisation, at its default ns_steps."""
    torch = pytest.importorskip("torch")
    from torch.optim._muon import DEFAULT_A, DEFAULT_B, DEFAULT_C, EPS, _zeropower_via_newtonschulz
    from torch.utils.flop_counter import FlopCounterMode

    default_steps = inspect.signature(torch.optim.Muon.__init__).parameters["ns_steps"].default
    assert default_steps == tput.MUON_NS_STEPS == 5
    for shape in [(96, 32), (32, 96), (64, 64), (3 * 48, 48)]:
        with FlopCounterMode(display=False) as fc:
            _zeropower_via_newtonschulz(torch.randn(*shape), (DEFAULT_A, DEFAULT_B, DEFAULT_C), default_steps, EPS)
        assert fc.get_total_flops() == newton_schulz_flops(*shape), shape
    # by hand: s = min, l = max; per iteration X·Xᵀ (2s²l), A·A (2s³), B·X (2s²l)
    assert newton_schulz_flops(4992, 1664) == 5 * (2 * 1664**2 * 4992 + 2 * 1664**3 + 2 * 1664**2 * 4992)


def test_muon_step_time() -> None:
    """Newton–Schulz at the MFU on every rank (ddp) or 1/dp of the matrices (zero1), plus element-wise passes."""
    spec = nanochat(20)
    hw = parse_gpu_spec("8xH100")
    ns = 20 * sum(newton_schulz_flops(r, c) for r, c in hidden_matrix_shapes(spec))
    assert [s for s in hidden_matrix_shapes(spec)] == [(3 * 1280, 1280), (1280, 1280), (4 * 1280, 1280), (1280, 4 * 1280)]
    ddp = estimate_throughput(cfg(optimizer="muon"), hw)
    z1 = estimate_throughput(cfg(optimizer="muon", strategy="zero1"), hw)
    peak = 989e12 * ddp.mfu
    assert ddp.optimizer_matmul_seconds == pytest.approx(ns / peak, rel=1e-12)
    assert z1.optimizer_matmul_seconds == pytest.approx(ns / 8 / peak, rel=1e-12)
    P, M = n_params(spec), matrix_params(spec)
    elementwise = (7 * 4 * (P - M) + (10 * 4 + 10) * M + 3 * 4 * P) / H100_HBM
    launches = 80 * 24 * 2e-6                  # 4 matrices × 20 layers, 24 kernels each
    assert ddp.optimizer_seconds == pytest.approx(ns / peak + elementwise + launches, rel=1e-12)
    adamw = estimate_throughput(cfg(), hw)
    assert ddp.step_seconds > adamw.step_seconds > 0


# ------------------------------------------------------------------ MFU by model size


def test_mfu_default_falls_with_model_size() -> None:
    h100 = find_profile("H100")
    sizes = [61_000_000] + [n_params(nanochat(d)) for d in (8, 20, 26, 32)]
    mfus = [h100.mfu_for(n) for n in sizes]
    assert mfus == sorted(mfus) and mfus[0] < mfus[-1]
    assert h100.mfu_for(61_000_000) == pytest.approx(0.42 * 0.4479 / 0.5986, rel=1e-12)   # 125m's ratio, held flat
    assert h100.mfu_for(61_000_000) < 0.8 * h100.mfu_for(n_params(nanochat(26)))   # not d26's MFU any more
    # the sweep's own points, relative to its 1b row, and flat beyond its ends
    for n, mfu in SIZE_MFU_POINTS:
        assert size_factor(n) == pytest.approx(mfu / 0.5986, rel=1e-12)
    assert size_factor(10**6) == size_factor(125_311_488) and size_factor(10**12) == size_factor(6_658_859_008)
    # between points: log-linear
    a, b = SIZE_MFU_POINTS[1], SIZE_MFU_POINTS[2]
    mid = int(math.sqrt(a[0] * b[0]))
    assert size_factor(mid) == pytest.approx((a[1] + b[1]) / 2 / 0.5986, rel=1e-6)


def test_calibrated_curve_and_cpu_profiles_keep_their_mfu() -> None:
    cpu = find_profile("CPU")
    assert cpu.mfu_for(10**5) == cpu.mfu_for(10**9) == cpu.default_mfu
    data = find_profile("H100").model_dump()
    data["mfu_curve"] = [{"n_params": 10**8, "mfu": 0.2}, {"n_params": 10**9, "mfu": 0.5}]
    curve = type(cpu).model_validate(data)
    assert curve.mfu_for(10**8) == 0.2 and curve.mfu_for(10**10) == 0.5


# ------------------------------------------------------------------ calibration inverts the model exactly


@pytest.mark.parametrize("gpu,strategy,optimizer,b,ac", [
    ("8xH100", "ddp", "adamw", 4, False),
    ("8xH100", "zero1", "muon", 8, False),
    ("8xH100", "zero2", "muon", 2, True),
    ("2x8xH100", "fsdp", "adamw", 2, False),
    ("1xA100", "ddp", "muon", 16, False),
])
@pytest.mark.parametrize("ratio", [0.6, 1.0, 1.3])
def test_fitted_mfu_reproduces_the_measured_speed(gpu: str, strategy: str, optimizer: str, b: int, ac: bool,
                                                  ratio: float) -> None:
    prof = parse_gpu_spec(gpu).profile
    req = PlanRequest(gpu=gpu, profile=prof, model=nanochat(16), hours=1.0, strategy=strategy, optimizer=optimizer,
                      device_batch_size=b, activation_checkpointing=ac)
    plan = build_plan(req)
    measured = plan.throughput.tokens_per_sec * ratio
    mfu = fitted_mfu(plan, measured)
    again = build_plan(req.model_copy(update={"mfu": mfu}))
    fastest = build_plan(req.model_copy(update={"mfu": 1.0})).throughput.tokens_per_sec
    if measured >= fastest:   # faster than the model allows even at MFU 1 (e.g. exposed inter-node traffic)
        assert mfu == 1.0 and again.throughput.tokens_per_sec == fastest
        return
    assert again.throughput.tokens_per_sec == pytest.approx(measured, rel=1e-9)
    if ratio == 1.0:
        assert mfu == pytest.approx(plan.throughput.mfu, rel=1e-9)


@pytest.mark.parametrize(("gpu", "optimizer", "strategy"), [("8xH100", "adamw", "fsdp"), ("8xH100", "muon", "zero1"),
                                                             ("1xA100-80GB", "adamw", "ddp")])
def test_plan_step_time_is_the_sum_of_its_parts(gpu: str, optimizer: str, strategy: str) -> None:
    """The plan records the optimizer and micro-step seconds, so its step time adds up (the report prints the sum)."""
    from planner.report import _step_time

    prof = find_profile(gpu.split("x", 1)[1])
    plan = build_plan(PlanRequest(gpu=gpu, profile=prof, model=nanochat(12), optimizer=optimizer, strategy=strategy,
                                  hours=1.0))
    tp = plan.throughput
    assert tp.optimizer_seconds > 0 and tp.micro_step_seconds > 0
    parts = tp.compute_seconds + tp.optimizer_seconds + tp.micro_step_seconds + tp.exposed_comm_seconds
    assert tp.step_seconds == pytest.approx(parts, rel=1e-12)
    assert f"{tp.optimizer_seconds:.3f}" in _step_time(tp)
