"""The torchrun command line that `nanoplan run` executes (pure Python, no torch import)."""

from __future__ import annotations

import sys

DEFAULT_MAX_RESTARTS = 3
DEFAULT_RDZV_PORT = 29500


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
