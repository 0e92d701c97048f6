"""Time the plan search (pure Python, in-process, after imports).

Usage: python benchmarks/search_speed.py [--repeats 7]
Target (issue 5): a search of at least 10,000 candidates in under 0.2 s.

Cases:
- stress: 1xH100, T=1024, nanochat depths 1..160 (odd depths without a valid rotary shape are
  skipped), every divisor micro-batch × 4 strategies × checkpointing off/on: > 10,000 candidates.
- stress-all-fit: the same with the H100 profile's memory set to 1 EB, so every candidate is
  kept, ranked and costed (the worst case per candidate).
- estimate: the default `nanoplan estimate --gpu 8xH100 --budget 1000` search (d2..d64 step 2).
- compare: the default `nanoplan compare --budget 1000` (8 configurations plus the reference job).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable


def timed(fn: Callable[[], int], repeats: int) -> tuple[int, list[float], list[float]]:
    """(candidates, wall seconds, CPU seconds) per repeat; CPU time is steadier on a shared machine."""
    fn()  # warm caches (profiles, imports)
    walls, cpus, n = [], [], 0
    for _ in range(repeats):
        t, c = time.perf_counter(), time.process_time()
        n = fn()
        walls.append(time.perf_counter() - t)
        cpus.append(time.process_time() - c)
    return n, walls, cpus


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=7)
    a = ap.parse_args()

    from planner.candidates import Length, depth_ladder
    from planner.compare import DEFAULT_GPUS, compare
    from planner.profiles import parse_gpu_spec
    from planner.selection import search

    stress_models = depth_ladder(depths=range(1, 161), seq_len=1024)
    h100 = parse_gpu_spec("H100")
    roomy = parse_gpu_spec("H100", profile=h100.profile.model_copy(update={"usable_bytes": 10**18}))
    h100x8 = parse_gpu_spec("8xH100")
    default_models = depth_ladder()
    cases = {
        "stress (1xH100, T=1024, d1..d160)": lambda: search(stress_models, h100, Length(budget_usd=1000)).evaluated,
        "stress-all-fit (same, unbounded memory)": lambda: search(stress_models, roomy,
                                                                  Length(budget_usd=1000)).evaluated,
        "estimate default (8xH100, d2..d64)": lambda: search(default_models, h100x8, Length(budget_usd=1000)).evaluated,
        "compare default (8 configs)": lambda: compare(DEFAULT_GPUS, default_models, Length(budget_usd=1000)).evaluated,
    }
    for name, fn in cases.items():
        n, walls, cpus = timed(fn, a.repeats)
        med = statistics.median(walls)
        print(f"{name}: {n:,} candidates in median {med:.4f} s (min {min(walls):.4f}, max {max(walls):.4f}, "
              f"n={a.repeats}); {med / n * 1e6:.2f} us/candidate; CPU median {statistics.median(cpus):.4f} s, "
              f"min {min(cpus):.4f} s")
    print("target: >= 10,000 candidates in < 0.2 s")


if __name__ == "__main__":
    main()
