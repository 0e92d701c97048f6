"""Two "nodes" on loopback: `nanoplan run --nnodes 2 --node-rank R --rdzv-endpoint 127.0.0.1:PORT`.

Each node is its own `nanoplan run` (its own torchrun agent) with one CPU worker, and they meet
through torchrun's c10d rendezvous. The plan comes from `nanoplan estimate --gpu 2x1xCPU`. The
worker of global rank 1 dies after step 12. Its agent restarts it, the other agent joins the
new rendezvous round, and both workers resume from the last checkpoint. Checked:
- 20 steps with gloo, and the loss falls;
- the ranks stay in sync: every checkpoint's meta.json holds both ranks' parameter
  fingerprints (sha256 of the raw bytes), and they are equal;
- the steps run again after the resume repeat the first attempt's losses exactly;
- the whole run equals a one-node `torchrun --standalone --nproc-per-node=2` run of the same
  plan bit for bit: losses at every step and the final parameters.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runner.checkpoint_layout import complete_steps, step_dir
from runner.checkpoint_meta import read_meta, verify
from runner.launcher import child_pids
from runner.metrics import read_metrics
from tests.conftest import REPO, runner_env, torchrun

pytestmark = pytest.mark.slow

STEPS = 20
CRASH_AFTER = 12


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tree(pid: int) -> list[int]:
    out = []
    for c in child_pids(pid):
        out += _tree(c) + [c]
    return out


def _kill(proc: subprocess.Popen) -> None:
    """SIGKILL a `nanoplan run`, its torchrun (own session) and the workers, children first."""
    for pid in [*_tree(proc.pid), proc.pid]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture(scope="module")
def plan(tmp_path_factory: pytest.TempPathFactory, tiny_data: Path) -> Path:
    path = tmp_path_factory.mktemp("mn") / "plan.json"
    r = subprocess.run([sys.executable, "-m", "nanoplan", "estimate", "--gpu", "2x1xCPU", "--preset", "tiny",
                        "--steps", str(STEPS), "--total-batch-tokens", "1024", "--data", str(tiny_data),
                        "--checkpoint-every-minutes", "0.003", "--keep-last", "100", "--out", str(path)],
                       capture_output=True, text=True, timeout=60, cwd=REPO)
    assert r.returncode == 0, r.stderr
    hw = json.loads(path.read_text())["hardware"]
    assert (hw["spec"], hw["nodes"], hw["gpus_per_node"], hw["num_gpus"]) == ("2x1xCPU", 2, 1, 2)
    return path


@pytest.fixture(scope="module")
def two_nodes(plan: Path) -> Path:
    run = plan.parent / "run"
    port = free_port()
    env = runner_env(NANOPLAN_FAULT=f"step:{CRASH_AFTER}", NANOPLAN_FAULT_RANK="1")
    procs = []
    for node in (0, 1):
        cmd = [sys.executable, "-m", "nanoplan", "run", str(plan), "--run-dir", str(run), "--nnodes", "2",
               "--node-rank", str(node), "--rdzv-endpoint", f"127.0.0.1:{port}", "--max-restarts", "1"]
        procs.append(subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    deadline = time.monotonic() + 150
    try:
        outs = [p.communicate(timeout=max(1.0, deadline - time.monotonic()))[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                _kill(p)
                p.wait(timeout=30)
    for p, out in zip(procs, outs, strict=True):
        assert p.returncode == 0, out[-3000:]
    assert any(f"--nnodes=2 --node-rank={n} --rdzv-backend=c10d --rdzv-endpoint=127.0.0.1:{port}" in out
               for n, out in enumerate(outs))
    return run


def test_two_nodes_train_in_sync_and_resume(two_nodes: Path) -> None:
    run = two_nodes
    info = json.loads((run / "run_info.json").read_text())
    assert info["world_size"] == 2 and len(info["segments"]) == 2
    start = info["segments"][1]["resumed_from_step"]
    assert start is not None and 1 <= start < CRASH_AFTER
    rows = read_metrics(run)
    first = {x["step"]: x for x in rows if x["segment"] == 0}
    resumed = [x for x in rows if x["segment"] == 1]
    assert max(first) == CRASH_AFTER - 1            # rank 1 died after step 12, before it was logged
    assert [x["step"] for x in resumed] == list(range(start + 1, STEPS + 1))
    again = [x for x in resumed if x["step"] in first]
    # a step ran twice unless the clock's checkpoint fell on the last logged step (then nothing repeats; every
    # step's loss is still held against the one-node run in test_two_nodes_equal_one_node)
    assert again or start == CRASH_AFTER - 1, "no step ran both before and after the resume"
    for x in again:
        assert (x["loss"], x["grad_norm"]) == (first[x["step"]]["loss"], first[x["step"]]["grad_norm"]), x["step"]
    assert resumed[-1]["loss"] < first[1]["loss"] - 0.5
    steps = complete_steps(run)
    assert steps[-1] == STEPS and start in steps
    for s in steps:
        meta = read_meta(step_dir(run, s))
        assert verify(step_dir(run, s)) == (True, "ok")
        rep = meta["replicas"]
        assert rep["kind"] == "bytes" and rep["agree"] is True and len(rep["fingerprints"]) == 2
        assert meta["world_size"] == 2
    assert json.loads((run / "stop.json").read_text())["reason"] == "total_steps"


def test_two_nodes_equal_one_node(plan: Path, two_nodes: Path) -> None:
    one = plan.parent / "one_node"
    r = torchrun(plan, one, 2)
    assert r.returncode == 0, r.stderr[-3000:]
    a = {x["step"]: x for x in read_metrics(two_nodes)}     # the last line of each step
    b = {x["step"]: x for x in read_metrics(one)}
    assert sorted(a) == sorted(b) == list(range(1, STEPS + 1))
    assert [a[s]["loss"] for s in a] == [b[s]["loss"] for s in a]
    final = [read_meta(step_dir(d, STEPS))["replicas"]["fingerprints"] for d in (two_nodes, one)]
    assert final[0] == final[1]
