"""The torchrun command line that `nanoplan run` executes (pure Python, no torch import)."""

from __future__ import annotations

import shlex
import sys

DEFAULT_MAX_RESTARTS = 3
DEFAULT_RDZV_PORT = 29500
TORCHRUN_LOGS = "torchrun"             # RUN_DIR/torchrun: torchrun's per-launch log folders (never removed by it)


def torchrun_env(run_dir: str | None) -> dict[str, str]:
    """What every torchrun of a plan runs with (`nanoplan run`'s launch_env and the cluster exports alike):
    - TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: with the agent's shared rendezvous store (torch's default), workers
      restarted by --max-restarts find the previous round's process-group keys and connect to dead peers
      (pytorch/pytorch#135712; reproduced with torch 2.13 and gloo); the documented opt-out gives each round a
      fresh store;
    - with `run_dir`, PET_LOG_DIR (torchrun's --log-dir, read from the environment) = RUN_DIR/torchrun: its log
      folders (workers' error.json) there, not in the system's temp dir. Joined as text, not normalised: a job
      script shows the run dir exactly as the plan gives it."""
    env = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    if run_dir is not None:
        env["PET_LOG_DIR"] = f"{run_dir}/{TORCHRUN_LOGS}"
    return env


def torchrun_env_lines(run_dir: str) -> list[str]:
    """The shell lines a cluster job runs torchrun after, so it runs as `nanoplan run` runs it."""
    return ["# As `nanoplan run` runs torchrun: a fresh rendezvous store for each restart (pytorch/pytorch#135712),",
            "# and its log folders in the run dir, not in the node's temp dir.",
            *(f"export {k}={shlex.quote(v)}" for k, v in torchrun_env(run_dir).items())]


def torchrun_command(plan_path: str, nproc_per_node: int, run_dir: str, nnodes: int = 1,
                     node_rank: int | str = 0, rdzv_endpoint: str | None = None,
                     max_restarts: int = DEFAULT_MAX_RESTARTS, python: str | None = None,
                     extra: list[str] | None = None) -> list[str]:
    """`python -m torch.distributed.run ... -m runner.train --plan P --run-dir D`.

    One node uses --standalone; several use the c10d rendezvous at rdzv_endpoint.
    """
    cmd = [python or sys.executable, "-m", "torch.distributed.run"]
    if nnodes <= 1:
        cmd += ["--standalone", "--nnodes=1"]
    else:
        endpoint = rdzv_endpoint or f"$MASTER_ADDR:{DEFAULT_RDZV_PORT}"
        cmd += [f"--nnodes={nnodes}", f"--node-rank={node_rank}", "--rdzv-backend=c10d",
                f"--rdzv-endpoint={endpoint}", "--rdzv-id=nanoplan"]
    cmd += [f"--nproc-per-node={nproc_per_node}", f"--max-restarts={max_restarts}",
            "-m", "runner.train", "--plan", plan_path, "--run-dir", run_dir]
    return cmd + list(extra or [])
