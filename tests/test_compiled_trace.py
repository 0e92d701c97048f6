"""The compiled step: the CPU capture of what torch.compile saves, and the analytic compiled model."""

import shutil
from pathlib import Path

import pytest

from planner.memory import estimate
from planner.memory_compiled import saved_bytes
from planner.memory_terms import StepConfig, model_bytes
from planner.spec import ModelSpec, style_spec

torch = pytest.importorskip("torch")

from runner.compiled_trace import capture_compiled  # noqa: E402

VOCAB = {"nanochat": 4096, "gpt2": 4096, "llama": 4096}


@pytest.mark.parametrize("style,prec,chunk,ckpt", [
    ("nanochat", "bf16-autocast", 0, False),
    ("llama", "bf16-autocast", 256, False),
    ("gpt2", "fp32", 0, True),
    ("gpt2", "fp32", 0, False),      # a weighted norm in fp32 saves its input and its output
])
def test_analytic_compiled_model_matches_the_capture(style: str, prec: str, chunk: int, ckpt: bool) -> None:
    spec = style_spec(style, 3, 256, VOCAB[style])
    cfg = StepConfig(spec=spec, device_batch_size=2, precision=prec, loss_chunk_tokens=chunk,
                     activation_checkpointing=ckpt, compile=True, dp=8)
    cap = capture_compiled(cfg)
    model = saved_bytes(model_bytes(spec, prec, "adamw"), 2 * 256, ckpt, chunk)
    assert model == pytest.approx(cap.saved_bytes, rel=0.03)
    traced = estimate(cfg, compiled_saved=(cap.saved_bytes, None)).allocated_peak
    assert estimate(cfg).allocated_peak == pytest.approx(traced, rel=0.03)
    # and the compiled step saves less than the eager one the planner used to assume
    assert estimate(cfg).allocated_peak < estimate(StepConfig(**{**cfg.__dict__, "compile": False})).allocated_peak


def test_a_view_of_the_qkv_buffer_keeps_the_whole_buffer() -> None:
    spec = style_spec("gpt2", 2, 256, 4096)
    cap = capture_compiled(StepConfig(spec=spec, device_batch_size=2, compile=True))
    qkv = [b for name, owner, b in cap.by_base if owner == "block 1" and b == 2 * 512 * 3 * spec.d_model]
    assert qkv, cap.by_base          # the fused qkv output, 6·d bytes per token, counted once


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None,
                    reason="a real inductor run on CPU needs a C++ compiler (no cc or gcc on PATH)")
def test_capture_equals_a_real_cpu_inductor_run() -> None:
    """Bytes held from forward to backward, from the profiler's allocator events, equal the capture."""
    import torch._functorch.config as fconfig
    import torch._inductor.config as iconfig
    from torch.profiler import ProfilerActivity, profile

    from runner.model import GPT

    spec = ModelSpec(style="nanochat", n_layer=2, d_model=256, n_head=2, n_kv_head=2, d_ff=1024, vocab_size=2048,
                     seq_len=1024, mlp="relu2", norm="rmsnorm_noweight", pos="rotary", tied=False, bias=False,
                     qk_norm=True, logit_softcap=15.0)
    cfg = StepConfig(spec=spec, device_batch_size=2, compile=True)
    cap = capture_compiled(cfg, kernels="cpu")       # a CPU run has CPU semantics: compare like with like
    torch._dynamo.reset()
    model = GPT(spec)
    model.init_weights()
    x = torch.randint(0, spec.vocab_size, (2, spec.seq_len))
    with iconfig.patch(fx_graph_cache=False), fconfig.patch(enable_autograd_cache=False):
        compiled = torch.compile(model, backend="inductor", fullgraph=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            compiled(x, x).backward()                # compile and warm up
        model.zero_grad(set_to_none=True)
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = compiled(x, x)
    held = sum(e.self_cpu_memory_usage for e in prof.key_averages())
    torch._dynamo.reset()
    assert held - loss.untyped_storage().nbytes() == pytest.approx(cap.saved_bytes, rel=0.001, abs=64)


def test_validate_trace_uses_the_compiled_capture(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from nanoplan.cli import app
    from planner.validate import validate_paths
    from runner.trace import trace_memory

    out = tmp_path / "p.json"
    r = CliRunner().invoke(app, ["estimate", "--gpu", "8xH100", "--depth", "2", "--seq-len", "256",
                                 "--total-batch-tokens", "16384", "--steps", "10", "--out", str(out)])
    assert r.exit_code == 0, r.output
    (check,) = validate_paths([str(out)], tracer=trace_memory)
    assert check.trace_note.startswith("compiled:") and abs(check.trace_error) < 0.03
    r = CliRunner().invoke(app, ["estimate", "--gpu", "8xH100", "--depth", "2", "--seq-len", "256", "--no-compile",
                                 "--total-batch-tokens", "16384", "--steps", "10", "--out", str(out)])
    assert r.exit_code == 0, r.output
    (check,) = validate_paths([str(out)], tracer=trace_memory)
    assert not check.trace_note.startswith("compiled")
