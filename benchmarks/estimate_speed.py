"""Time `nanoplan estimate` against its bare dependencies, side by side, and the model maths per call.

Usage: python benchmarks/estimate_speed.py [--repeats 7]

Targets:
- issue 28: `nanoplan estimate --gpu 8xH100 --budget 1000` (the model search), bytecode cached as an installed
  copy has it, at most 1.5x its floor: the bare imports of its dependencies plus building the plan's own
  pydantic models (`import planner.plan`), bytecode cached too; cold processes, medians of CPU time (the
  machine is shared: wall time moves with its load, CPU time much less), interleaved in one run so that
  both see the same load. The pydantic models stay.
- issue 20 (superseded): at most 1.8x the bare imports alone, which the floor itself is ~1.9x of;
- issues 2 and 12: `estimate ... --depth 20` and the search each under 0.5 s wall, no torch import.

Two rows put the search in context:
- "bare + 1 pydantic model": the bare imports plus one pydantic model class with one constrained field,
  validated once. The bare line imports pydantic's package only (its models load lazily); every command
  that builds a plan pays for this much at least.
- "bare + the plan's models, bc": the bare imports plus `import planner.plan`, which builds the plan's,
  profiles' and model spec's pydantic models (bytecode cached): the floor of any command that writes a
  validated plan.json, before any search.
- "estimate (search), bytecode": the same command with the project's bytecode cached, as an installed copy
  has it (pip compiles it). With PYTHONDONTWRITEBYTECODE set, as on the shared development machine, every
  start compiles the project's sources again, while the bare imports' libraries have their bytecode.
  The cache lives in a temporary directory (PYTHONPYCACHEPREFIX) and is filled by the warm-up round.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time

BARE_IMPORTS = "import typer, rich.console, rich.table, pydantic, yaml"
BARE = [sys.executable, "-c", BARE_IMPORTS]
ONE_MODEL = [sys.executable, "-c", BARE_IMPORTS + "\nclass M(pydantic.BaseModel):\n    x: int = pydantic.Field(gt=0)\n"
             "M(x=1)"]
# the floor of any command that writes a validated plan: the bare imports plus the planner's pydantic models
# (plan, request, profiles, spec), built as `nanoplan estimate` builds them, with the project's bytecode cached
PLAN_MODELS = [sys.executable, "-c", BARE_IMPORTS + "\nimport planner.plan"]
TARGET_RATIO = 1.5        # × the floor ("bare + the plan's models, bc"), CPU medians, both bytecode cached
FLOOR = "bare + the plan's models, bc"


def estimate_cmd(out: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "nanoplan", "estimate", "--gpu", "8xH100", "--budget", "1000", "--out", out, *extra]


def timed(cmd: list[str] | tuple[list[str], dict[str, str]]) -> tuple[float, float]:
    """(wall seconds, CPU seconds user+sys) of one cold process; `cmd` may carry its own environment."""
    cmd, env = cmd if isinstance(cmd, tuple) else (cmd, dict(os.environ))
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, env={**env, "COLUMNS": "80"})
    wall = time.perf_counter() - t
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime


def side_by_side(repeats: int, cmds: dict[str, list[str] | tuple[list[str], dict[str, str]]]
                 ) -> dict[str, tuple[list[float], list[float]]]:
    """Each command once per round, in turn, `repeats` rounds (plus one warm-up round, not counted)."""
    out: dict[str, tuple[list[float], list[float]]] = {k: ([], []) for k in cmds}
    for i in range(repeats + 1):
        for name, cmd in cmds.items():
            wall, cpu = timed(cmd)
            if i:
                out[name][0].append(wall)
                out[name][1].append(cpu)
    return out


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
    ap.add_argument("--repeats", type=int, default=7)
    a = ap.parse_args()
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "plan.json")
        cached = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        cached["PYTHONPYCACHEPREFIX"] = os.path.join(tmp, "pycache")
        res = side_by_side(a.repeats, {"bare imports": BARE, "bare + 1 pydantic model": ONE_MODEL,
                                       "bare + the plan's models, bc": (PLAN_MODELS, cached),
                                       "estimate (search)": estimate_cmd(out),
                                       "estimate --depth 20": estimate_cmd(out, "--depth", "20"),
                                       "estimate (search), bytecode": (estimate_cmd(out), cached)})
    load1 = os.getloadavg()
    med = {k: (statistics.median(w), statistics.median(c)) for k, (w, c) in res.items()}
    print(f"{datetime.date.today()}, {platform.machine()} {platform.system()}, {os.cpu_count()} CPUs, Python "
          f"{platform.python_version()}; load average {load0[0]:.2f} before, {load1[0]:.2f} after; "
          f"PYTHONDONTWRITEBYTECODE={os.environ.get('PYTHONDONTWRITEBYTECODE', '(unset)')}")
    print(f"cold processes, medians of {a.repeats}, interleaved")
    print(f"{'command':<30}{'wall s':>8}{'CPU s':>8}{'× bare (CPU)':>14}{'× floor (CPU)':>15}")
    bc, fc = med["bare imports"][1], med[FLOOR][1]
    for k, (w, c) in med.items():
        print(f"{k:<30}{w:8.3f}{c:8.3f}{c / bc:14.2f}{c / fc:15.2f}")
    ratios = sorted(c / f for c, f in zip(res["estimate (search), bytecode"][1], res[FLOOR][1], strict=True))
    ratio = med["estimate (search), bytecode"][1] / fc
    print(f"estimate (search), bytecode: {ratio:.2f}x the floor (CPU medians; round by round {ratios[0]:.2f} to "
          f"{ratios[-1]:.2f}); target <= {TARGET_RATIO}x: {'met' if ratio <= TARGET_RATIO else 'NOT met'}")
    per = model_maths(20_000)
    print(f"model maths (n_params + flops_per_token + memory estimate): {per * 1e6:.1f} us per model")


if __name__ == "__main__":
    main()
