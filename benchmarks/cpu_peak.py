"""The CPU profile's peak, measured: a dense fp32 and bf16 matmul on this machine, and the runner's step.

Usage: python benchmarks/cpu_peak.py [--threads N]

Prints GFLOP/s of an n^3 matmul (best of 5 after 2 warm-ups, 2·n³ FLOPs) for n = 1024 and 2048 in fp32 and bf16,
then tokens/s and model FLOP/s of runner.step.train_step (fp32, AdamW, micro-batch 32) for the tiny preset and a
nanochat d4 with vocabulary 256 and sequence 256. hardware_profiles/CPU.yaml records the 2-core CI machine's
numbers (fp32_tflops, bf16_tflops, default_mfu) with the date.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from planner.counts import flops_per_token  # noqa: E402
from planner.spec import nanochat, preset  # noqa: E402
from runner.model import GPT  # noqa: E402
from runner.step import build_optimizer, train_step  # noqa: E402


def best_of(fn, warm: int = 2, reps: int = 5) -> float:
    for _ in range(warm):
        fn()
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    print(f"torch {torch.__version__}, {a.threads} thread(s)")
    for dt in (torch.float32, torch.bfloat16):
        for n in (1024, 2048):
            x, y = torch.randn(n, n, dtype=dt), torch.randn(n, n, dtype=dt)
            s = best_of(lambda x=x, y=y: x @ y)
            print(f"matmul {str(dt).removeprefix('torch.')} {n}^3: {2 * n**3 / s / 1e9:,.1f} GFLOP/s")
    for name, spec in (("tiny", preset("tiny")), ("d4 V256 T256", nanochat(4, seq_len=256, vocab_size=256))):
        model = GPT(spec, loss_chunk_tokens=1024)
        model.init_weights(0)
        opt = build_optimizer(model, "adamw", 1e-3, 0.02, 0.0, (0.9, 0.95), "cpu")
        x = torch.randint(0, spec.vocab_size, (32, spec.seq_len))
        batches = iter(lambda x=x: (x, x), None)
        s = best_of(lambda m=model, o=opt, it=batches: train_step(m, o, it, 1, "fp32", "cpu", 1.0), warm=3, reps=10)
        tps = 32 * spec.seq_len / s
        print(f"train_step {name}: {tps:,.0f} tokens/s, {tps * flops_per_token(spec) / 1e9:,.1f} GFLOP/s (PaLM count)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
