"""The speed model's terms (planner/compute_model.py, planner/throughput.py), each against an independent number.

- matmuls: 6 FLOPs per matmul weight per token (PaLM appendix B) at the profile's cited MAMF × the fitted
  efficiency; FP8 only for the blocks' linears and only where the GPU has FP8;
- attention: causal flash attention's FLOPs, forward 2·T·q per token and layer (half of 4·T·q under the mask) and
  backward 2.5× the forward (FlashAttention-2, Dao 2023, §3: the backward recomputes the scores), at the kernel's
  cited rate (planner/kernels.py: FA3 paper figures for cuDNN, FA3 and the sequence-length curve);
- element-wise work: the bytes the memory model says a block saves, at the profile's HBM bandwidth;
- activation checkpointing re-runs what the policy leaves out (planner/checkpointing.py);
- multi-node rings run at min(NVLink, GPUs per node × NIC);
- MFU is never printed above 100%.
"""

from __future__ import annotations

import pytest

from planner.checkpointing import checkpointed_blocks, recompute_flops_per_token, recomputed_matmul_params
from planner.compute_model import HBM_EFFICIENCY, compute_terms, loss_bytes_per_token
from planner.counts import matmul_params, matrix_params
from planner.kernels import StepSoftware
from planner.memory_compiled import block_per_token
from planner.memory_eager import layer_activation_bytes
from planner.memory_terms import StepConfig, dims
from planner.profiles import find_profile, parse_gpu_spec
from planner.spec import llama, nanochat
from planner.speed_constants import DEFAULT
from planner.throughput import estimate_throughput, link_bytes_per_s, measured_mfu


def test_matmul_attention_and_elementwise_terms() -> None:
    spec, prof = nanochat(20), find_profile("H100")
    t = compute_terms(spec, prof, precision="bf16-autocast", compiled=False, ac=False)
    rate = 794.5e12 * DEFAULT.matmul_efficiency                     # MAMF of H100 SXM (ml-engineering table)
    assert t.matmul == pytest.approx(6 * matmul_params(spec) / rate, rel=1e-12)
    q, T, L = 1280, 2048, 20
    attn = L * (2 * T * q + 2.5 * 2 * T * q)                         # causal forward + 2.5 x backward
    # the runner on H100 runs cuDNN's attention (torch 2.13): FA3 paper Fig. 5/6 at 2k, FA2 298/291 and cuDNN 484/465
    # TFLOP/s forward/backward, FA2 at 2k is 0.90 of its 16k rate (335 TFLOP/s is FA2's long-sequence H100 figure)
    fwd_bwd = lambda f, b: 1 / (2 / 7 / f + 5 / 7 / b)  # noqa: E731
    cudnn_2k = 335e12 * fwd_bwd(484, 465) / fwd_bwd(335, 322)
    assert t.attention == pytest.approx(attn / (cudnn_2k * DEFAULT.attention_efficiency), rel=1e-12)
    fa2 = compute_terms(spec, prof, precision="bf16-autocast", compiled=False, ac=False,
                        software=StepSoftware(attention="fa2"))
    assert fa2.attention == pytest.approx(attn / (335e12 * fwd_bwd(298, 291) / fwd_bwd(335, 322)
                                                  * DEFAULT.attention_efficiency), rel=1e-12)
    hbm = 3.35e12 * HBM_EFFICIENCY
    elem = DEFAULT.elementwise * L * layer_activation_bytes(spec, "bf16-autocast") + \
        loss_bytes_per_token(spec, "bf16-autocast", False)
    assert t.elementwise == pytest.approx(elem / hbm, rel=1e-12)
    c = compute_terms(spec, prof, precision="bf16-autocast", compiled=True, ac=False)
    per_block = block_per_token(dims(spec, "bf16-autocast"))
    assert per_block < layer_activation_bytes(spec, "bf16-autocast")  # fused kernels keep fewer intermediates
    celem = DEFAULT.elementwise_compiled * L * per_block + loss_bytes_per_token(spec, "bf16-autocast", True)
    assert c.elementwise == pytest.approx(celem / hbm, rel=1e-12)    # the compiled step's own fitted factor
    assert c.elementwise < t.elementwise and c.matmul == t.matmul


def test_a_trainers_loss_kernel_and_norm_precision_are_priced_as_it_runs_them() -> None:
    """StepSoftware.fused_loss and low_precision_norms (planner/kernels.py), from the bytes by hand: MPT-1B (GPT-2
    style, LayerNorm, vocabulary 50,368) eager with llm-foundry's fused cross-entropy moves 4 bf16 accesses per logit
    instead of eager's 3 bf16 + 8 fp32, and with its bf16 LayerNorm saves each block's two norm inputs in 2 bytes
    instead of autocast's fp32 copy; a compiled step with an eager loss (torchtitan before 2025-04-02) pays eager's."""
    from planner.spec import ModelSpec

    spec = ModelSpec(style="gpt2", n_layer=24, d_model=2048, n_head=16, n_kv_head=16, d_ff=8192, vocab_size=50368,
                     seq_len=2048, mlp="gelu", norm="layernorm", pos="learned", tied=True, bias=True)
    prof, V, d, L = find_profile("H100"), 50368, 2048, 24
    hbm = 3.35e12 * HBM_EFFICIENCY
    kw = {"precision": "bf16-autocast", "ac": False}
    eager = compute_terms(spec, prof, compiled=False, **kw, software=StepSoftware())
    fused = compute_terms(spec, prof, compiled=False, **kw, software=StepSoftware(fused_loss=True))
    assert eager.elementwise - fused.elementwise == pytest.approx(((3 * 2 + 8 * 4) - 4 * 2) * V / hbm, rel=1e-12)
    lp = compute_terms(spec, prof, compiled=False, **kw, software=StepSoftware(fused_loss=True, low_precision_norms=True))
    assert fused.elementwise - lp.elementwise == pytest.approx(DEFAULT.elementwise * L * 2 * (4 - 2) * d / hbm,
                                                               rel=1e-12)
    assert (lp.matmul, lp.attention) == (eager.matmul, eager.attention)
    comp = compute_terms(spec, prof, compiled=True, **kw)
    comp_eager_loss = compute_terms(spec, prof, compiled=True, **kw, software=StepSoftware(fused_loss=False))
    assert comp_eager_loss.elementwise - comp.elementwise == pytest.approx(((3 * 2 + 8 * 4) - 4 * 2) * V / hbm,
                                                                           rel=1e-12)
    # compiled blocks save no fp32 norm copies: the flag changes nothing there
    assert compute_terms(spec, prof, compiled=True, **kw,
                         software=StepSoftware(low_precision_norms=True)).elementwise == comp.elementwise


def test_fp8_runs_the_blocks_linears_at_the_fp8_rate_where_the_gpu_has_it() -> None:
    spec = llama(32, 4096, 32, 8, 14336, seq_len=8192, vocab_size=128256)
    h100, a100 = find_profile("H100"), find_profile("A100")
    bf = compute_terms(spec, h100, precision="bf16-autocast", compiled=True, ac=False)
    f8 = compute_terms(spec, h100, precision="bf16-autocast", compiled=True, ac=False, fp8=True)
    eff = DEFAULT.matmul_efficiency
    blocks, head = 6 * matrix_params(spec), 6 * (matmul_params(spec) - matrix_params(spec))
    assert f8.matmul == pytest.approx(head / (794.5e12 * eff) + blocks / (1402.6e12 * eff), rel=1e-12)
    assert f8.attention == bf.attention and f8.elementwise > bf.elementwise    # the casts cost HBM traffic
    assert a100.speed.fp8_matmul_tflops is None          # Ampere has no FP8: the plan's fp8 asks for nothing
    cfg = StepConfig(spec=spec, device_batch_size=1, dp=8, strategy="fsdp", compile=True, fp8=True)
    plain = StepConfig(spec=spec, device_batch_size=1, dp=8, strategy="fsdp", compile=True)
    hw = parse_gpu_spec("8xA100")
    assert estimate_throughput(cfg, hw).step_seconds == estimate_throughput(plain, hw).step_seconds


def test_checkpointing_recomputes_what_its_policy_drops() -> None:
    spec = llama(32, 4096, 32, 8, 14336, seq_len=8192, vocab_size=128256)
    d, q, kv, f, T = 4096, 4096, 1024, 14336, 8192
    full_block = d * (q + 2 * kv) + q * d + 3 * d * f
    assert recomputed_matmul_params(spec, "full") == full_block
    assert recomputed_matmul_params(spec, "selective-op") == q * d + f * d   # 2nd and 4th matmul of the block
    assert recompute_flops_per_token(spec, True) == 32 * (2 * full_block + 4 * T * q)
    assert recompute_flops_per_token(spec, True, policy="selective-op") == 32 * 2 * (q * d + f * d)
    assert checkpointed_blocks(32, True, 2) == 16 and recompute_flops_per_token(spec, True, 2) == \
        16 * (2 * full_block + 4 * T * q)
    prof = find_profile("A100")
    none, sel, full = (compute_terms(spec, prof, precision="bf16-autocast", compiled=False, ac=ac, ac_policy=p)
                       for ac, p in ((False, "full"), (True, "selective-op"), (True, "full")))
    assert none.total < sel.total < full.total
    assert sel.attention == none.attention < full.attention        # selective-op saves attention's output


def test_rings_across_nodes_use_every_nic() -> None:
    one, two = parse_gpu_spec("8xH100"), parse_gpu_spec("2x8xH100")
    assert link_bytes_per_s(one) == pytest.approx(450e9 * DEFAULT.link_efficiency)
    assert link_bytes_per_s(two) == pytest.approx(min(450, 8 * 50) * 1e9 * DEFAULT.link_efficiency)
    a100 = parse_gpu_spec("4x8xA100")
    assert link_bytes_per_s(a100) == pytest.approx(min(300, 8 * 25) * 1e9 * DEFAULT.link_efficiency)


def test_measured_mfu_never_shows_above_100_percent() -> None:
    from runner.metrics import mfu

    assert measured_mfu(1000.0, 1e9, 1, 1e12) == (1.0, False)
    assert measured_mfu(3000.0, 1e9, 1, 1e12) == (1.0, True)
    assert mfu(3000.0, 1e9, 1, 1e12) == 1.0
    assert measured_mfu(500.0, 1e9, 2, 1e12) == (0.25, False)


def test_cpu_profile_peak_is_the_measured_one() -> None:
    """hardware_profiles/CPU.yaml records the 2-core CI machine's matmul peak (benchmarks/cpu_peak.py), not a
    per-thread guess below what the runner reaches: the runner's tiny step did 35-40 GFLOP/s on one thread."""
    cpu = find_profile("CPU")
    assert cpu.fp32_tflops == 0.19 and cpu.bf16_tflops == 0.42
    assert "2026-11-25" in cpu.sources["fp32_tflops"] and "172-194 GFLOP/s" in cpu.sources["fp32_tflops"]
    # the fastest step measured (d4, 67 GFLOP/s) is well under the peak: MFU 35%, not the 288% of the old 0.075
    assert cpu.peak_flops("fp32") == 0.19e12 and 67e9 / cpu.peak_flops("fp32") < 0.4
