"""The worker among its ranks (torchrun's environment): its device and process group, broadcasts
from rank 0, the launch's common start, and the gradient accumulation the world size implies.

nccl on CUDA, gloo on CPU; one process without torchrun is a world of one.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from planner.errors import PlanError
from planner.plan import Plan
from runner.clock import Clock


@dataclass
class Dist:
    rank: int
    local_rank: int
    world_size: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def on(self) -> bool:
        return self.world_size > 1


def setup_dist(plan: Plan, force: bool) -> Dist:
    """Device and process group: nccl on CUDA, gloo on CPU (torchrun's env, or one process)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    gpu_plan = plan.request.profile.kind == "gpu"
    if gpu_plan and torch.cuda.is_available():
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
    elif gpu_plan and not force:
        raise PlanError("plan", "is for GPUs but CUDA is not available here", "run it on a GPU machine, or --force to run on CPU")
    else:
        device = torch.device("cpu")
    if world > 1:
        if device.type == "cuda":
            dist.init_process_group("nccl", device_id=device)
        else:
            dist.init_process_group("gloo")
    return Dist(rank, local, world, device)


def start_at_oldest(d: Dist, clock: Clock) -> None:
    """Every rank's clock starts at the oldest node's launch: a node that waited in the rendezvous was paid for."""
    if d.on:
        age = torch.tensor([clock.real()], dtype=torch.float64, device=d.device)
        dist.all_reduce(age, op=dist.ReduceOp.MAX)
        clock.start_earlier(float(age.item()))


def broadcast(obj: Any, d: Dist) -> Any:
    """Rank 0's `obj` on every rank (a collective)."""
    if not d.on:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def grad_accum_for(plan: Plan, world: int, force: bool) -> int:
    from planner.parallelism import RUNNER_HINT, runner_problem  # noqa: PLC0415

    if (no_run := runner_problem(plan.request)) is not None:     # hsdp or tensor parallelism: planned, not run
        raise PlanError("--plan", no_run, RUNNER_HINT)
    tr = plan.training
    if world == plan.hardware.num_gpus:
        return tr.grad_accum_steps
    if not force:
        raise PlanError("WORLD_SIZE", f"{world} processes but the plan is for {plan.hardware.num_gpus}",
                        "launch with nanoplan run, or --force to rescale gradient accumulation")
    per = tr.device_batch_size * tr.seq_len * world
    if tr.total_batch_tokens % per:
        raise PlanError("WORLD_SIZE", f"total batch {tr.total_batch_tokens:,} is not a multiple of {per:,} "
                        f"for {world} processes", "launch with the plan's process count")
    return tr.total_batch_tokens // per
