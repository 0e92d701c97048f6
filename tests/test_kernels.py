"""planner/kernels.py: which attention kernel a step runs and how fast, each factor against its cited figures; and
the trainers' speed hook (issue 29: the compiled-Hopper bias and nanochat's own step)."""

from __future__ import annotations

import pytest

from planner.build import build_plan
from planner.compute_model import compute_terms
from planner.kernels import (
    HOPPER_SPEEDUP,
    SEQ_CURVE,
    StepSoftware,
    kernel_speedup,
    runner_software,
    seq_len_factor,
    window_span,
)
from planner.plan import PlanRequest, TrainerRef
from planner.profiles import find_profile
from planner.trainers.nanochat import NANOCHAT, model_spec


def _fwd_bwd(f: float, b: float) -> float:
    return 1 / (2 / 7 / f + 5 / 7 / b)      # backward 2.5x the forward's FLOPs: 5/7 of them


def test_kernel_speedups_are_the_cited_figures() -> None:
    # FA3 paper (arXiv:2407.08608) Fig. 5/6, H100 SXM5, head dim 128, 2k: FA2 298/291, cuDNN 484/465, FA3 521/501
    assert kernel_speedup("cudnn", "hopper") == pytest.approx(_fwd_bwd(484, 465) / _fwd_bwd(298, 291), rel=1e-12)
    assert kernel_speedup("fa3", "hopper") == pytest.approx(_fwd_bwd(521, 501) / _fwd_bwd(298, 291), rel=1e-12)
    assert 1.55 < HOPPER_SPEEDUP["cudnn"] < 1.65 and 1.68 < HOPPER_SPEEDUP["fa3"] < 1.78
    assert kernel_speedup("cudnn", "blackwell") == HOPPER_SPEEDUP["cudnn"]
    assert kernel_speedup("fa3", "blackwell") == 1.0       # FA3 is Hopper-only: no measured speed-up elsewhere
    for arch in ("ampere", "ada"):
        assert kernel_speedup("cudnn", arch) == kernel_speedup("fa3", arch) == kernel_speedup("fa2", arch) == 1.0
    assert kernel_speedup("fa1", "ampere") == 0.5          # FA2 paper: "around 2x faster than FlashAttention"
    assert kernel_speedup("triton-fa1", "hopper", triton=0.61) == 0.61   # the fitted value, passed in
    assert 1 / 2.5 <= kernel_speedup("triton-fa1", "ampere") <= 1 / 1.3   # inside the FA2 paper's range


def test_sequence_length_curve_follows_fa2_on_h100() -> None:
    assert SEQ_CURVE[16384] == 1.0
    assert SEQ_CURVE[2048] == pytest.approx(_fwd_bwd(298, 291) / _fwd_bwd(335, 322), rel=1e-12)
    assert seq_len_factor(256) == SEQ_CURVE[512] and seq_len_factor(131072) == 1.0     # the end values beyond
    assert seq_len_factor(2048) == SEQ_CURVE[2048]
    assert SEQ_CURVE[2048] < seq_len_factor(2896) < SEQ_CURVE[4096]                   # between the points
    xs = [seq_len_factor(t) for t in (512, 768, 1024, 2048, 3000, 4096, 8192, 16384)]
    assert xs == sorted(xs)


def test_window_span() -> None:
    assert window_span([2048] * 4, 2048) == 1.0                  # full causal
    assert window_span([512], 2048) == pytest.approx(0.4375)     # w - w²/2T over T/2, w = T/4
    assert window_span([1024], 2048) == pytest.approx(0.75)
    assert window_span([], 2048) == 1.0


def test_runner_runs_cudnn_on_hopper_and_blackwell_fa2_elsewhere() -> None:
    assert runner_software(find_profile("H100")).attention == "cudnn"
    assert runner_software(find_profile("B200")).attention == "cudnn"
    assert runner_software(find_profile("A100")).attention == "fa2"
    assert runner_software(find_profile("RTX-4090")).attention == "fa2"


def test_a_faster_kernel_and_shorter_windows_shorten_attention_only() -> None:
    spec, prof = model_spec("2025-10", 20), find_profile("H100")
    fa2 = compute_terms(spec, prof, precision="bf16-autocast", compiled=True, ac=False, software=StepSoftware("fa2"))
    fa3 = compute_terms(spec, prof, precision="bf16-autocast", compiled=True, ac=False, software=StepSoftware("fa3"))
    half = compute_terms(spec, prof, precision="bf16-autocast", compiled=True, ac=False,
                         software=StepSoftware("fa2", attention_span=0.5))
    assert fa3.attention == pytest.approx(fa2.attention / HOPPER_SPEEDUP["fa3"], rel=1e-12)
    assert half.attention == pytest.approx(fa2.attention / 2, rel=1e-12)
    assert fa2.matmul == fa3.matmul == half.matmul and fa2.elementwise == fa3.elementwise == half.elementwise


def test_nanochat_says_which_attention_it_runs() -> None:
    h100, a100, b200 = find_profile("H100"), find_profile("A100"), find_profile("B200")
    first = TrainerRef(name="nanochat", version="2025-10")
    current = TrainerRef(name="nanochat", version="2026-07")
    d20 = model_spec("2025-10", 20)
    assert NANOCHAT.step_software(d20, first, h100) == StepSoftware("fa2")     # torch 2.8.0 SDPA: FA2
    d24 = model_spec("2026-07", 24)
    # SSSL: 18 short layers of T/4 and 6 long ones (the last is always long): (18 x 0.4375 + 6) / 24
    sw = NANOCHAT.step_software(d24, current, h100)
    assert sw.attention == "fa3" and sw.attention_span == pytest.approx((18 * 0.4375 + 6) / 24)
    # elsewhere SDPA (kernels-community/flash-attn3 on Ampere only if the hub has a build: not counted on), where the
    # plan's window pattern is L (the export's choice): full causal spans
    assert NANOCHAT.step_software(d24, current, a100) == StepSoftware("fa2")
    assert NANOCHAT.step_software(d24, current, b200) == StepSoftware("fa2")
    forced = current.model_copy(update={"window_pattern": "SSSL"})              # SSSL under SDPA: a full mask each
    blackwell = NANOCHAT.step_software(d24, forced, b200)
    assert blackwell.attention == "fa2" and blackwell.attention_span == pytest.approx((18 * 2 + 6) / 24)


def test_a_nanochat_plan_runs_its_own_attention_kernel() -> None:
    """`--trainer nanochat` plans time the step with nanochat's kernel, not the runner's: the 2026-07 version's FA3
    with sliding windows is faster than the same model under the runner's cuDNN attention over full causal spans."""
    prof = find_profile("H100")
    spec = model_spec("2026-07", 24)
    base = dict(gpu="8xH100", profile=prof, model=spec, optimizer="muon", strategy="zero1", loss_chunk_tokens=0,
                budget_usd=100.0)
    plan = build_plan(PlanRequest(**base, trainer=TrainerRef(name="nanochat", version="2026-07")))
    runner = build_plan(PlanRequest(**base))
    assert plan.throughput.tokens_per_sec > runner.throughput.tokens_per_sec * 1.02
