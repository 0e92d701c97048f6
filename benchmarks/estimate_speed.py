"""Time `nanoplan estimate` (cold process, wall clock) and the model maths (per call).

Usage: python benchmarks/estimate_speed.py [--repeats 5]
Target (issues 2 and 12): `estimate --gpu 8xH100 --budget 1000 --depth 20` and the model search
`estimate --gpu 8xH100 --budget 1000` (no model: d2..d64, its runners-up table and why panel) each
under 0.5 s wall, no torch import.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import time


def cold_estimate(repeats: int, *extra: str) -> tuple[list[float], list[float]]:
    """(wall seconds, CPU seconds user+sys) per cold run; CPU time is steadier on a shared machine."""
    cmd = [sys.executable, "-m", "nanoplan", "estimate", "--gpu", "8xH100", "--budget", "1000", *extra]
    walls, cpus = [], []
    for _ in range(repeats):
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        walls.append(time.perf_counter() - t)
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime)
    return walls, cpus


def model_maths(n: int) -> float:
    from planner.counts import flops_per_token, n_params
    from planner.memory import estimate
    from planner.memory_terms import StepConfig
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
    for extra in (("--depth", "20"), ()):
        walls, cpus = cold_estimate(a.repeats, *extra)
        print(f"estimate --gpu 8xH100 --budget 1000{' ' if extra else ''}{' '.join(extra)}: median "
              f"{statistics.median(walls):.3f} s wall (min {min(walls):.3f}, max {max(walls):.3f}), median "
              f"{statistics.median(cpus):.3f} s CPU, n={a.repeats}; target < 0.5 s")
    per = model_maths(20_000)
    print(f"model maths (n_params + flops_per_token + memory estimate): {per * 1e6:.1f} us per model")


if __name__ == "__main__":
    main()
