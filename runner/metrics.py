"""RUN_DIR/metrics.jsonl (one JSON object per optimizer step), run_info.json, and (optionally, see
runner/tensorboard_log.py) TensorBoard.

Keys of every metrics line (other tools read them; keep the names):
step, total_steps, loss, lr, grad_norm, tokens_per_sec, mfu, step_seconds, elapsed_hours,
usd_spent, tokens_seen, epoch, max_memory_allocated, max_memory_reserved (null on CPU),
world_size, device, compiled, segment; plus val_loss on evaluation steps.

`segment` counts launches of the run (0 for the first, +1 per resume). A resumed run appends;
steps after the checkpoint it resumed from appear again with a higher segment, so readers
should keep the last line of each step.

Reading them back (read_metrics, read_run_info) validates every line and field; see
runner/runfiles.py for what a bad line or file does.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from planner.errors import DuplicateKeyError, PlanError, strict_json_loads
from planner.plan import atomic_write_text
from planner.throughput import measured_mfu
from runner.runfiles import MetricsRow, RunInfo, problem_of, read_json_file
from runner.tensorboard_log import open_log

METRICS = "metrics.jsonl"
RUN_INFO = "run_info.json"
STOP = "stop.json"


def mfu(tokens_per_sec: float, flops_per_token: float, world_size: int, peak_flops_per_gpu: float) -> float:
    """Model FLOPs utilisation: achieved model FLOP/s over the peak of all devices, at most 1 (one above means
    the profile's peak is wrong; planner.throughput.measured_mfu, calibrate flags it)."""
    return measured_mfu(tokens_per_sec, flops_per_token, world_size, peak_flops_per_gpu)[0]


MAX_LINE_WARNINGS = 3
_LITERALS = ("true", "false", "null", "NaN", "Infinity", "-Infinity")


def _torn(text: str, e: json.JSONDecodeError) -> bool:
    """Whether an unparseable line is a JSON object cut short (a kill mid-write), not a corrupt one."""
    if not text.startswith("{"):
        return False
    rest = text[e.pos:].rstrip()
    return (not rest or e.msg.startswith("Unterminated string") or any(lit.startswith(rest) for lit in _LITERALS)
            or re.fullmatch(r"[-+0-9.eE]+", rest) is not None)


def _stderr_warning(msg: str) -> None:
    print(f"warning: {msg}", file=sys.stderr, flush=True)


def read_metrics(run_dir: str | Path, warn: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Every valid line of metrics.jsonl, in order.

    A torn line (a JSON object cut short by a kill; a resumed run appends after it) is skipped
    silently. Any other bad line (not JSON, duplicate keys, a wrong type or NaN in a known field)
    is skipped with a warning naming file:line and the field (the first few are named, then a count).
    """
    warn = warn or _stderr_warning
    p = Path(run_dir) / METRICS
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        return []
    out: list[dict[str, Any]] = []
    bad: list[str] = []
    for i, raw in enumerate(data.split(b"\n"), 1):
        if not raw.strip():
            continue
        where = f"{p}:{i}"
        try:
            text = raw.decode("utf-8")
            row = strict_json_loads(text)
        except UnicodeDecodeError:
            bad.append(f"{where}: is not UTF-8 text")
            continue
        except json.JSONDecodeError as e:
            if not _torn(text, e):
                bad.append(f"{where}: is not valid JSON ({e.msg} at column {e.colno})")
            continue
        except DuplicateKeyError as e:
            bad.append(f"{where}: {e}")
            continue
        except (ValueError, RecursionError) as e:
            bad.append(f"{where}: is not a metrics line ({str(e).splitlines()[0][:80]})")
            continue
        problem = problem_of(MetricsRow, row, where)[1]
        if problem is not None:
            bad.append(problem)
            continue
        out.append(row)
    for msg in bad[:MAX_LINE_WARNINGS]:
        warn(f"{msg}; line skipped")
    if len(bad) > MAX_LINE_WARNINGS:
        warn(f"{p}: {len(bad) - MAX_LINE_WARNINGS} more bad lines skipped")
    return out


def read_run_info(run_dir: str | Path) -> dict[str, Any] | None:
    """RUN_DIR/run_info.json, validated (None when absent). A bad one raises PlanError naming the file and
    field: it carries the budget spent by earlier launches, so it is not silently dropped."""
    p = Path(run_dir) / RUN_INFO
    data, problem = read_json_file(p)
    if problem is None and data is not None:
        problem = problem_of(RunInfo, data, str(p))[1]
    if problem is not None:
        raise PlanError(str(p), problem.removeprefix(f"{p}: "),
                        f"fix that field, or move {RUN_INFO} aside (the hours in the checkpoints and "
                        "metrics.jsonl still count)")
    return data


def last_by_step(rows: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """The last line written for each step (later segments win)."""
    return {int(r["step"]): r for r in rows}


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


class MetricsLog:
    """Appends metrics lines (rank 0 only); mirrors them to TensorBoard when asked for (tensorboard None:
    NANOPLAN_TENSORBOARD=1) and installed."""

    def __init__(self, run_dir: str | Path, enabled: bool = True, tensorboard: bool | None = None,
                 fail: tuple[int, int] | None = None) -> None:
        self.enabled = enabled
        self.path = Path(run_dir) / METRICS
        self._f: TextIO | None = None
        self._tb: Any = None
        self._fail = fail          # (errno, n): the n-th line fails (a fault injected by a test)
        self._lines = 0
        if not enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        torn = self.path.exists() and self.path.stat().st_size > 0 and not self.path.read_bytes().endswith(b"\n")
        self._f = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
        if torn:
            self._f.write("\n")
        self._tb = open_log(run_dir, tensorboard)

    def write(self, row: dict[str, Any]) -> None:
        """Append one line and flush it. An OSError (disk full) propagates; the caller stops the run."""
        if not self.enabled or self._f is None:
            return
        row = {k: _clean(v) for k, v in row.items()}
        self._lines += 1
        if self._fail is not None and self._lines == self._fail[1]:
            raise OSError(self._fail[0], os.strerror(self._fail[0]), str(self.path))
        self._f.write(json.dumps(row) + "\n")
        self._f.flush()
        if self._tb is not None:
            self._tb.write(row)

    def close(self) -> None:
        if self._f is not None:
            self._f.flush()
            os.fsync(self._f.fileno())
            self._f.close()
            self._f = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def write_json(path: Path, data: dict[str, Any]) -> None:
    atomic_write_text(path, json.dumps(data, indent=2) + "\n")


def update_run_info(run_dir: str | Path, base: dict[str, Any], segment: dict[str, Any]) -> int:
    """Create or extend RUN_DIR/run_info.json with this launch; returns the segment number."""
    p = Path(run_dir) / RUN_INFO
    info = read_run_info(run_dir) or {**base, "segments": []}
    info.update({k: v for k, v in base.items() if k != "start_time"})
    info.setdefault("start_time", base.get("start_time"))
    n = len(info.get("segments", []))
    info.setdefault("segments", []).append({"segment": n, **segment})
    write_json(p, info)
    return n
