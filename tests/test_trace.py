"""runner.trace: meta parameter counts, FLOPs three ways, and the trace machinery itself.

The memory trace is checked against independent references: a real CPU run of the same steps
(byte for byte), a real DDP on a fake process group (the emulated bucket state), and torch's
own rms_norm (the CUDA fused-kernel emulation's numbers).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

from planner.counts import flops_per_token, n_params
from planner.memory_terms import StepConfig
from planner.spec import PRESETS, llama, style_spec
from runner.cuda_emulation import cuda_semantics
from runner.trace import _categories, meta_param_count, run_traced_steps, trace_flops

SPECS = [
    PRESETS["tiny"], PRESETS["gpt2"], PRESETS["llama3.2-1b"], PRESETS["d20"],
    style_spec("llama", 8, 256, 512),                       # GQA: 4 heads, 1 kv head
    llama(2, 128, 4, 2, seq_len=64, vocab_size=300, tied=True),
]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_meta_param_count_is_exact(spec) -> None:
    assert meta_param_count(spec) == n_params(spec)


def test_meta_param_count_known_models() -> None:
    # published counts (HF gpt2 124,439,808; nanochat d20 560,988,160)
    assert meta_param_count(PRESETS["gpt2"]) == 124_439_808
    assert meta_param_count(PRESETS["d20"]) == 560_988_160


@pytest.mark.parametrize("spec", [style_spec("nanochat", 4, 128, 512), style_spec("gpt2", 2, 128, 512),
                                  style_spec("llama", 8, 128, 512)], ids=lambda s: s.name)
def test_flops_three_ways(spec) -> None:
    f = trace_flops(spec, batch=2)
    assert f.tokens == 2 * spec.seq_len
    assert f.analytic_per_token == flops_per_token(spec)
    assert abs(f.flop_counter_error) < 0.01            # the target; in fact exact
    assert f.flop_counter_per_token == f.analytic_per_token
    # fvcore: forward multiply-adds ×2 (FLOPs) ×3 (forward + backward); it also counts
    # LayerNorm elementwise work, so GPT-2 is a little above the matmul-only count
    assert f.fvcore_per_token is not None and abs(f.fvcore_error) < 0.01
    if spec.norm != "layernorm":
        assert f.fvcore_per_token == f.analytic_per_token
    assert f.fvcore_forward_macs * 6 == pytest.approx(f.fvcore_per_token * f.tokens)


def test_fused_rms_norm_emulation_matches_torch() -> None:
    torch.manual_seed(0)
    for weighted in (False, True):
        x = torch.randn(3, 5, 16, dtype=torch.float64, requires_grad=True)
        w = torch.randn(16, dtype=torch.float64, requires_grad=True) if weighted else None
        g = torch.randn(3, 5, 16, dtype=torch.float64)
        ins = [x] + ([w] if weighted else [])
        ref = F.rms_norm(x, (16,), w, 1e-6)
        ref_grads = torch.autograd.grad(ref, ins, g)
        with cuda_semantics():
            out = F.rms_norm(x, (16,), w, 1e-6)
            assert type(out.grad_fn).__name__ == "FusedRMSNormBackward"
            assert len(out.grad_fn.saved_tensors) == 3       # input, rstd, weight: what the CUDA kernel keeps
        grads = torch.autograd.grad(out, ins, g)
        torch.testing.assert_close(out, ref)
        for a, b in zip(grads, ref_grads, strict=True):
            torch.testing.assert_close(a, b)
    assert F.rms_norm.__module__ == "torch.nn.functional"     # restored on exit


def test_cuda_autocast_policy_for_square() -> None:
    h = torch.randn(4, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        lin = torch.nn.functional.linear(h, torch.randn(8, 8))
        assert F.relu(lin).square().dtype == torch.bfloat16       # CPU autocast leaves pow in bf16
        with cuda_semantics():
            assert F.relu(lin).square().dtype == torch.float32    # CUDA autocast runs pow in fp32
            assert F.rms_norm(lin, (8,)).dtype == torch.float32   # and rms_norm


CASES = [
    (PRESETS["tiny"], "fp32", 0, False, "adamw"),
    (style_spec("llama", 2, 32, 256), "fp32", 16, True, "muon"),
    (style_spec("gpt2", 2, 32, 256), "bf16-autocast", 0, False, "adamw"),
    (style_spec("nanochat", 2, 32, 256), "bf16", 16, False, "muon"),
]


@pytest.mark.parametrize("spec,precision,chunk,ckpt,opt", CASES, ids=lambda v: getattr(v, "name", str(v)))
def test_fake_trace_equals_real_cpu_run(spec, precision, chunk, ckpt, opt) -> None:
    """FakeTensorMode + MemTracker sees exactly what a real run of the same steps allocates."""
    torch.manual_seed(0)
    cfg = StepConfig(spec=spec, device_batch_size=2, precision=precision, loss_chunk_tokens=chunk,
                     activation_checkpointing=ckpt, optimizer=opt, grad_accum_steps=2)
    for kernels in ("cpu", "cuda"):
        peaks = []
        for fake in (True, False):
            mt = run_traced_steps(cfg, kernels=kernels, fake=fake)
            peaks.append(sum(_categories(next(iter(mt.get_tracker_snapshot("peak").values()))).values()))
        if kernels == "cpu" and spec.norm == "layernorm" and precision == "bf16-autocast":
            # CPU autocast runs layer_norm on the bf16 residual in bf16; torch's fake kernel gives its
            # mean/rstd bf16 where the real CPU kernel makes them fp32: 2 bytes × 2 per row per norm
            rows = cfg.device_batch_size * spec.seq_len
            assert 0 < peaks[1] - peaks[0] <= 2 * 2 * rows * (2 * spec.n_layer + 1), peaks
            continue
        assert peaks[0] == peaks[1] > 0


DDP_CHECK = textwrap.dedent("""
    import torch, torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from planner.memory_terms import StepConfig
    from planner.spec import PRESETS
    from runner.trace import _categories, run_traced_steps
    torch.set_num_threads(1)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)

    def noop_allreduce(state, bucket):
        fut = torch.futures.Future()
        fut.set_result(bucket.buffer())
        return fut

    def real_ddp(m):
        d = torch.nn.parallel.DistributedDataParallel(m, gradient_as_bucket_view=True)
        d.register_comm_hook(None, noop_allreduce)
        return d

    for accum in (1, 2, 3):
        cfg = StepConfig(spec=PRESETS["tiny"], device_batch_size=2, dp=4, grad_accum_steps=accum, precision="fp32")
        got = []
        for wrap in (None, real_ddp):
            mt = run_traced_steps(cfg, kernels="cpu", fake=False, wrap=wrap)
            got.append(sum(_categories(next(iter(mt.get_tracker_snapshot("peak").values()))).values()))
        print(accum, got[0], got[1])
        assert got[0] == got[1], (accum, got)
    print("ok")
""")


def test_emulated_ddp_state_equals_real_ddp() -> None:
    """One rank's DDP(gradient_as_bucket_view=True) state: the emulation vs torch's reducer."""
    out = subprocess.run([sys.executable, "-c", DDP_CHECK], capture_output=True, text=True, timeout=300,
                         env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("ok")
