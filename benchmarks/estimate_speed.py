"""Time `nanoplan estimate` (cold process, wall clock) and the model maths (per call).

Usage: python benchmarks/estimate_speed.py [--repeats 5]
Target (issue 2): estimate --gpu 8xH100 --budget 1000 --depth 20 under 0.5 s wall, no torch import.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time


def cold_estimate(repeats: int) -> list[float]:
    cmd = [sys.executable, "-m", "planner.cli", "estimate", "--gpu", "8xH100", "--budget", "1000", "--depth", "20"]
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        out.append(time.perf_counter() - t)
    return out


def model_maths(n: int) -> float:
    from planner.counts import flops_per_token, n_params
    from planner.memory import StepConfig, estimate
    from planner.spec import nanochat

    specs = [nanochat(d) for d in range(2, 66, 2)]
    t = time.perf_counter()
    for i in range(n):
        s = specs[i % len(specs)]
        n_params(s)
        flops_per_token(s)
        estimate(StepConfig(spec=s, device_batch_size=8))
    return (time.perf_counter() - t) / n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    walls = cold_estimate(a.repeats)
    per = model_maths(20_000)
    print(f"estimate --gpu 8xH100 --budget 1000 --depth 20: median {statistics.median(walls):.3f} s wall "
          f"(min {min(walls):.3f}, max {max(walls):.3f}, n={a.repeats}; target < 0.5 s)")
    print(f"model maths (n_params + flops_per_token + memory estimate): {per * 1e6:.1f} us per model")


if __name__ == "__main__":
    main()
