"""Builds the torchrun command for a plan and runs it, turning a signalled stop into exit 0.

torchrun itself exits non-zero when it is signalled, even when every worker checkpointed and
exited 0. So `nanoplan run` starts torchrun in its own session and, on SIGTERM/SIGINT, sends
SIGTERM to the training workers (torchrun's children) once. They finish the step, write a
checkpoint and exit 0, and torchrun then exits 0 as well. If torchrun was signalled
directly too, RUN_DIR/stop.json (reason "signal", written by this launch) still makes the
exit code 0. Plain Python: no torch import.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from planner.launch import DEFAULT_MAX_RESTARTS, torchrun_command
from planner.plan import Plan
from runner.metrics import STOP, read_json

SHUTDOWN_MIN_S = 60


def build_command(plan: Plan, plan_path: str, run_dir: str, *, nnodes: int | None = None, node_rank: int = 0,
                  rdzv_endpoint: str | None = None, max_restarts: int = DEFAULT_MAX_RESTARTS,
                  data: str | None = None, resume: bool = False, force: bool = False) -> list[str]:
    """`python -m torch.distributed.run ... -m runner.train --plan P --run-dir D [...]` for this plan."""
    extra: list[str] = []
    if data:
        extra += ["--data", data]
    if resume:
        extra.append("--resume")
    if force:
        extra.append("--force")
    return torchrun_command(plan_path, plan.hardware.gpus_per_node, run_dir, nnodes=nnodes or plan.hardware.nodes,
                            node_rank=node_rank, rdzv_endpoint=rdzv_endpoint, max_restarts=max_restarts,
                            python=sys.executable, extra=extra)


def shutdown_timeout_s(plan: Plan) -> int:
    """Seconds torchrun waits for signalled workers: one step plus a slow (50 MB/s) checkpoint write, ×3."""
    s = plan.schedule
    return max(SHUTDOWN_MIN_S, math.ceil(3 * (plan.throughput.step_seconds + s.checkpoint_bytes / 50e6)))


def launch_env(plan: Plan, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment torchrun runs in.

    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: with the agent's shared TCPStore (torch's default),
    workers restarted by --max-restarts find the previous round's process-group keys in the
    store and try to connect to dead peers (pytorch/pytorch#135712; reproduced here with torch
    2.13 and gloo). The documented opt-out gives each round a fresh store.
    """
    env = dict(os.environ if base is None else base)
    env.setdefault("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", str(shutdown_timeout_s(plan)))
    env.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    if plan.request.profile.kind == "cpu":
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // plan.hardware.gpus_per_node)))
    return env


def wait_gone(pids: list[int], timeout_s: float) -> None:
    """Wait until none of `pids` is alive (or timeout_s passes)."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end and any(_alive(pid) for pid in pids):
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    """Running: not gone, and not a zombie that a container's init never reaps."""
    if Path("/proc/self").exists():
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except (OSError, IndexError):
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def child_pids(pid: int) -> list[int]:
    """Direct children of `pid` (Linux /proc), empty where unavailable."""
    out: list[int] = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            text = (task / "children").read_text().split()
            out += [int(x) for x in text]
    except OSError:
        return []
    return out


ENV_STATUS = "NANOPLAN_STATUS_FILE"   # runner.train.report_exit writes {"exit_code", "error"} there


def run_torchrun(cmd: list[str], env: dict[str, str], run_dir: str | Path) -> int:
    """Run torchrun to completion; forward the first SIGTERM/SIGINT to its workers. Returns the exit code.

    Workers that stop on purpose with an error (bad input, NaN loss, failed checkpoint write)
    exit 0, so that torchrun neither restarts them nor prints a traceback, and leave their real
    exit code in the status file; that code is returned here.
    """
    fd, status = tempfile.mkstemp(prefix="nanoplan-status-", suffix=".json")
    os.close(fd)
    try:
        rc = _run_torchrun(cmd, {**env, ENV_STATUS: status}, run_dir)
        if rc == 0:
            rc = int((read_json(Path(status)) or {}).get("exit_code") or 0)
        return rc
    finally:
        Path(status).unlink(missing_ok=True)


def _run_torchrun(cmd: list[str], env: dict[str, str], run_dir: str | Path) -> int:
    started = time.time()
    proc = subprocess.Popen(cmd, env=env, start_new_session=True)
    state: dict[str, Any] = {"signalled": 0, "workers": []}

    def forward(signum: int, frame: Any) -> None:
        state["signalled"] += 1
        if state["signalled"] > 1:
            print("nanoplan run: already stopping, waiting for the checkpoint "
                  f"(kill -9 {proc.pid} to abort)", file=sys.stderr, flush=True)
            return
        workers = state["workers"] = child_pids(proc.pid)
        print(f"nanoplan run: got {signal.Signals(signum).name}; asking {len(workers) or 'the'} worker(s) "
              "to finish the step and checkpoint", file=sys.stderr, flush=True)
        targets = workers or [proc.pid]
        for pid in targets:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    old = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        while True:
            try:
                rc = proc.wait()
                break
            except KeyboardInterrupt:  # pragma: no cover - the handler replaces SIGINT
                continue
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    if state["signalled"]:
        # torchrun's agent can die of repeated signals while its workers still write the final
        # checkpoint (they are not killed): wait for them before reading stop.json.
        wait_gone(state["workers"], float(env.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", SHUTDOWN_MIN_S)))
    if rc != 0 and state["signalled"]:
        stop = read_json(Path(run_dir) / STOP)
        stop_file = Path(run_dir) / STOP
        if stop and stop.get("reason") == "signal" and stop_file.stat().st_mtime >= started:
            return 0
    return rc
