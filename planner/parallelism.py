"""HSDP and tensor parallelism in a plan: the degrees, what each trainer can express, and nanoplan's runner's refusal.

`--strategy hsdp` shards within a node and replicates across nodes (FSDP2 on a 2-D DeviceMesh); `--tp t` splits
every block's matmuls over t GPUs of a node (Megatron-style, with sequence parallelism unless
`sequence_parallel: false`). The planner models both: memory in planner/memory_parallel.py, speed in
planner/throughput.py (`hsdp_comm`, `tensor_parallel_seconds`). nanoplan's runner runs ddp, zero1, zero2 and fsdp
only (runner/parallel.py); a plan with hsdp or tp is for export and comparison with the trainers that run them
(torchtitan: `--parallelism.data_parallel_replicate_degree`, `data_parallel_shard_degree`,
`tensor_parallel_degree`, `enable_sequence_parallel`).

Degrees: data-parallel dp = GPUs / tp (a tensor-parallel group shares each micro-batch); under hsdp the shard group
is the GPUs of one node / tp and the replicas are the nodes. tp divides the GPUs of a node (its collectives run on
every block's critical path, over NVLink), and the heads, key/value heads and MLP width (each GPU holds whole heads).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from planner.errors import PlanError
from planner.plan import PlanRequest
from planner.profiles import Hardware

if TYPE_CHECKING:      # a type only: planner/trainers/launch_files.py imports this module's degrees
    from planner.trainers import Trainer

RUNNER_STRATEGIES = ("ddp", "zero1", "zero2", "fsdp")     # runner/parallel.py STRATEGIES


def data_parallel_degree(num_gpus: int, tp: int) -> int:
    """Data-parallel ranks: the GPUs over the tensor-parallel degree."""
    return num_gpus // max(1, tp)


def hsdp_shard(strategy: str, gpus_per_node: int, tp: int) -> int:
    """HSDP's shard group: the GPUs of one node over the tensor-parallel degree; 0 for other strategies."""
    return gpus_per_node // max(1, tp) if strategy == "hsdp" else 0


def check_parallelism(req: PlanRequest, hw: Hardware, trainer: Trainer | None) -> None:
    """Refuse (PlanError, exit 2) a tensor-parallel degree or HSDP that the GPUs, the model or the trainer cannot
    express. `trainer` None: nanoplan's runner, which plans them for comparison but does not run them
    (`runner_problem`)."""
    tp, strategy, spec = req.tp, req.strategy, req.model
    if tp == 1 and strategy != "hsdp":
        return
    if trainer is not None and not trainer.hybrid_parallel:
        raise PlanError("--tp" if tp > 1 else "--strategy", f"{trainer.name} does not run "
                        f"{'tensor parallelism' if tp > 1 else 'hsdp'}", "plan it with --trainer torchtitan or "
                        "nanoplan (planned, for comparison)")
    if hw.gpus_per_node % tp:
        raise PlanError("--tp", f"{tp} does not divide the {hw.gpus_per_node} GPUs of a node of {hw.spec} (tensor "
                        "parallelism stays within a node: its collectives run on every block's critical path)",
                        f"use a divisor of {hw.gpus_per_node}")
    for name, n in (("heads", spec.n_head), ("key/value heads", spec.n_kv_head), ("MLP width", spec.d_ff)):
        if n % tp:
            raise PlanError("--tp", f"{tp} does not divide the model's {n} {name} (each GPU holds whole heads and an "
                            "even share of the MLP)", f"use a divisor of {n}")


def runner_problem(req: PlanRequest) -> str | None:
    """Why nanoplan's runner cannot run this plan (hsdp or tensor parallelism), or None."""
    tp, strategy = req.tp, req.strategy
    if strategy not in RUNNER_STRATEGIES or tp > 1:
        what = " and ".join(x for x in ("hsdp" if strategy == "hsdp" else "", f"tensor parallelism {tp}" if tp > 1
                                        else "") if x)
        return (f"nanoplan's runner runs ddp, zero1, zero2 and fsdp only; this plan's {what} is planned for export and "
                "comparison with a trainer that runs it")
    return None


RUNNER_HINT = "plan it with --trainer torchtitan to export its launch line, or with --strategy fsdp and --tp 1 to run it here"
