"""A committed GPU kit result against what the planner predicts today (docs/gpu.md).

    python benchmarks/gpu_kit_compare.py benchmarks/results/gpu/<date>-<profile>[/gpu_kit.json] [--json]

For every compiled and eager step the kit measured, the plan is rebuilt with today's planner for the same
configuration (the result's profile, the model, micro-batch, precision and compile, AdamW, grad accum 1:
benchmarks/gpu_kit_parts.py's Kit.step_point), and its tokens/s and memory are set against the measurement,
next to what the planner predicted on the day. A planner change that moves a prediction shows here. Errors are
(predicted − measured) / measured. Runs here: no GPU, no torch.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "benchmarks"
for _p in (str(REPO), str(BENCH)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from gpu_kit_parts import Kit  # noqa: E402

FIELDS = (  # (name, prediction then, prediction now (a Plan attribute path), measured)
    ("tokens/s", "predicted_tokens_per_sec", "throughput.tokens_per_sec", "tokens_per_sec"),
    ("allocated", "predicted_allocated_bytes", "allocated", "max_memory_allocated"),
    ("reserved", "predicted_reserved_bytes", "reserved", "max_memory_reserved"),
    ("device used", "predicted_memory_bytes", "memory.per_gpu_bytes", "device_used_bytes"),
)


def _now(plan: Any, path: str) -> float:
    mem = plan.memory
    alloc = mem.per_gpu_bytes - sum(mem.overhead.values())        # as benchmarks/gpu_suite.py summarise()
    if path == "allocated":
        return alloc
    if path == "reserved":
        return alloc + mem.overhead.get("fragmentation", 0)
    obj: Any = plan
    for part in path.split("."):
        obj = getattr(obj, part)
    return float(obj)


def compare(result: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per measured step and quantity: then, now, measured, and the two errors."""
    kit = Kit(result["config"], deadline=float("inf"))
    rows = []
    for t in result["tasks"]:
        kind, _, name = t["task"].partition(":")
        rec = t.get("result") or {}
        if kind not in ("compiled", "eager") or not rec.get("tokens_per_sec"):
            continue
        m = re.fullmatch(r"d(\d+)", name)
        plan = kit.step_point(int(m[1]) if m else None, compiled=bool(rec.get("compile")),
                              batch=int(rec["device_batch_size"]))
        for label, then_key, now_path, meas_key in FIELDS:
            meas, then, now = rec.get(meas_key), rec.get(then_key), _now(plan, now_path)
            rows.append({"task": t["task"], "model": rec.get("model"), "batch": rec["device_batch_size"],
                         "compile": bool(rec.get("compile")), "quantity": label, "predicted_then": then,
                         "predicted_now": now, "measured": meas,
                         "error_then": (then - meas) / meas if meas and then is not None else None,
                         "error_now": (now - meas) / meas if meas else None})
    return rows


def _fmt(label: str, v: Any) -> str:
    if not isinstance(v, int | float):
        return "–"
    return f"{v:,.0f}" if label == "tokens/s" else f"{v / 2**30:.2f} GiB"


def _pct(x: Any) -> str:
    return "–" if x is None else f"{x:+.1%}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("result", help="a results folder (benchmarks/results/gpu/...) or its gpu_kit.json")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    a = p.parse_args(argv)
    path = Path(a.result)
    path = path / "gpu_kit.json" if path.is_dir() else path
    try:
        result = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        print(f"error: {path}: cannot be read as the kit's JSON ({e})", file=sys.stderr)
        print("hint: give a folder that scripts/gpu_kit.sh run wrote, or its gpu_kit.json", file=sys.stderr)
        return 2
    rows = compare(result)
    if a.json:
        print(json.dumps(rows, indent=2))
        return 0
    dev = ((result.get("env") or {}).get("device") or {}).get("name") or "CPU"
    print(f"{path}: {dev}, {result['date']}, profile {result['config'].get('profile') or 'CPU'}")
    print(f"{'step':<14} {'quantity':<12} {'measured':>12} {'then':>12} {'err':>8} {'now':>12} {'err':>8}")
    for r in rows:
        q = r["quantity"]
        print(f"{r['task']:<14} {q:<12} {_fmt(q, r['measured']):>12} {_fmt(q, r['predicted_then']):>12} "
              f"{_pct(r['error_then']):>8} {_fmt(q, r['predicted_now']):>12} {_pct(r['error_now']):>8}")
    if not rows:
        print("no measured step in this result")
    return 0


if __name__ == "__main__":
    sys.exit(main())
