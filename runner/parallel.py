"""The data-parallel strategies of a plan, with torch's own parts: ddp, zero1, zero2, fsdp.

- ``ddp``: ``DistributedDataParallel(gradient_as_bucket_view=True)``; ``no_sync`` on all but the
  last micro-step of gradient accumulation.
- ``zero1``: the same DDP, plus ``torch.distributed.optim.ZeroRedundancyOptimizer`` around each
  optimizer of the group. Each rank keeps the optimizer state of its own share of the
  parameters, steps them, and broadcasts the updated parameters. With ``--optimizer muon``,
  Muon (hidden matrices) and AdamW (the rest) get one ZeroRedundancyOptimizer each. ZeRO
  partitions whole parameters, so Muon's orthogonalisation still sees every matrix whole.
- ``zero2`` and ``fsdp``: FSDP2 ``fully_shard`` on every block, then on the root. Parameters,
  gradients and optimizer state are sharded across ranks as DTensors. ``fsdp`` uses
  ``reshard_after_forward=True`` (ZeRO-3): a block's parameters are all-gathered for its forward,
  freed, and gathered again for its backward. ``zero2`` uses ``reshard_after_forward=False``
  (FSDP1's SHARD_GRAD_OP, the ZeRO-2 layout). Parameters gathered in the forward stay until that
  block's backward. Gradients are reduce-scattered and optimizer state is sharded. At rest the
  parameters are sharded too, which ZeRO-2 proper does not do.
  This costs no extra communication: one all-gather per micro-step, as ZeRO-2 needs anyway.
  Gradient accumulation reduce-scatters on every micro-step, so the accumulated gradients stay
  sharded (1/dp), as planner.memory assumes. ``set_requires_gradient_sync(False)`` would hold a
  full unsharded fp32 gradient on every rank until the last micro-step. That is 4 bytes per
  parameter, 48 GiB for the 12.9B depth-64 model, and the plan's memory would no longer hold.
- Sharded models are built on the meta device, sharded, then materialised and initialised shard by
  shard. ``GPT.init_weights`` runs under DTensor's ``implicit_replication``, so each rank keeps its
  slice of the same seeded full tensor. The weights are bit-identical to a DDP run's, and no rank
  ever holds the whole model.
- Mixed precision: on CUDA with bf16 autocast, FSDP2 gets
  ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``. The gathered parameters are
  bf16, the sharded masters, gradients and optimizer state stay fp32, and autocast still runs
  the step. CPU plans stay fp32.
- Activation checkpointing is the model's own: ``torch.utils.checkpoint`` (non-reentrant) around
  each block call, so a recomputed block re-runs its FSDP pre-forward hook (it gathers again).
- ``torch.compile`` (GPU plans): ddp and zero1 compile the whole model, as before. zero2 and fsdp
  compile each block in place before sharding it (``Module.compile``), so parameter names do not
  change.
"""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from runner.step import OptimizerGroup

STRATEGIES = ("ddp", "zero1", "zero2", "fsdp")
FSDP_STRATEGIES = ("zero2", "fsdp")


def sharded_checkpoint(strategy: str) -> bool:
    """zero2 and fsdp checkpoint with DCP (runner/dcp.py); ddp and zero1 write model.pt + optim_rank0.pt."""
    return strategy in FSDP_STRATEGIES


def is_dtensor(t: Any) -> bool:
    return type(t).__name__ == "DTensor" or hasattr(t, "_local_tensor")


def full_value(t: torch.Tensor) -> torch.Tensor:
    """A plain tensor from a DTensor (a grad norm from clip_grad_norm_ under FSDP2), else t."""
    return t.full_tensor() if is_dtensor(t) else t


@dataclass
class Parallel:
    """The wrapped model and optimizer of one rank.

    raw: the GPT (FSDP-managed under zero2/fsdp), for state dicts and fingerprints;
    fwd: what evaluation calls (no DDP wrapper); model: what train_step calls; opt: the optimizers.
    """

    strategy: str
    world_size: int
    raw: nn.Module
    fwd: nn.Module
    model: nn.Module
    opt: OptimizerGroup

    @property
    def shards_params(self) -> bool:
        return self.strategy in FSDP_STRATEGIES and self.world_size > 1

    @property
    def sharded_checkpoint(self) -> bool:
        return sharded_checkpoint(self.strategy)

    @property
    def zero1(self) -> bool:
        return self.strategy == "zero1" and self.world_size > 1

    def before_checkpoint(self) -> None:
        """Collective, on every rank before a checkpoint: zero1 gathers the optimizer state on
        rank 0 (in host memory, ZeroRedundancyOptimizer.consolidate_state_dict)."""
        if self.zero1:
            for o in self.opt.optimizers:
                o.consolidate_state_dict(to=0)  # type: ignore[attr-defined]

    def optimizer_file_state(self) -> dict[str, Any]:
        """What rank 0 writes to optim_rank0.pt besides the schedulers: the whole optimizer state
        (ddp; zero1 after before_checkpoint), or nothing (DCP holds it)."""
        if self.sharded_checkpoint:
            return {}
        return {"optimizer": self.opt.state_dict()}

    def write_shards(self, path: Path) -> dict[str, dict[str, Any]]:
        """Collective: this rank's part of the DCP checkpoint under path/dcp, with checksums."""
        from runner.dcp import save_shards

        rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        return save_shards(path, self.raw, self.opt.optimizers, rank)

    def check_format(self, ckdir: Path) -> None:
        """Refuse a checkpoint whose format this strategy cannot read (a PlanError, one line)."""
        from planner.errors import PlanError
        from runner.dcp import has_shards

        if self.sharded_checkpoint and not has_shards(ckdir):
            raise PlanError("--run-dir", f"{ckdir.name} was written by a ddp/zero1 run (model.pt); this "
                            f"{self.strategy} run reads sharded DCP checkpoints",
                            "resume with the plan that wrote it, or start in another --run-dir")
        if self.zero1 and has_shards(ckdir):
            raise PlanError("--run-dir", f"{ckdir.name} is a sharded DCP checkpoint (zero2/fsdp); zero1's "
                            "ZeroRedundancyOptimizer reads model.pt + optim_rank0.pt",
                            "resume with the plan that wrote it, or start in another --run-dir")

    def load_model(self, ckdir: Path, device: torch.device, check: Callable[[Any], None] | None = None) -> None:
        """model.pt into the model (ddp, zero1), after `check` (which raises) has seen it; DCP checkpoints
        load in load_optimizer, with the optimizer."""
        from runner.dcp import has_shards
        from runner.torch_files import load_torch

        if not has_shards(ckdir):
            state = load_torch(ckdir / "model.pt", device)
            if check is not None:
                check(state)
            self.raw.load_state_dict(state)

    def load_optimizer(self, ckdir: Path, ostate: dict[str, Any]) -> None:
        """The optimizer state: optim_rank0.pt's (ddp, zero1), or model and optimizer from DCP shards."""
        from runner.dcp import has_shards, load_shards

        if has_shards(ckdir):
            load_shards(ckdir, self.raw, self.opt.optimizers)
        else:
            self.opt.load_state_dict(ostate["optimizer"])

    def fingerprint(self) -> tuple[str, str] | None:
        """(\"shards\", sha256 of this rank's local shards) for sharded parameters, else None
        (the caller fingerprints replicas, which must agree)."""
        if not self.shards_params:
            return None
        self.reshard()
        h = hashlib.sha256()
        with torch.no_grad():
            for p in self.raw.parameters():
                t = p.to_local() if is_dtensor(p) else p
                # a copy: .numpy() makes a storage non-resizable, and FSDP2 resizes its own storages
                h.update(t.detach().to("cpu", copy=True).contiguous().view(torch.uint8).numpy().tobytes())
        return "shards", h.hexdigest()

    def reshard(self) -> None:
        """Free parameters FSDP2 still holds gathered (zero2 keeps them after a no-grad evaluation)."""
        if not self.shards_params:
            return
        from torch.distributed.fsdp import FSDPModule

        for m in self.raw.modules():
            if isinstance(m, FSDPModule):
                m.reshard()


def zero_redundancy(group: OptimizerGroup) -> OptimizerGroup:
    """Each optimizer of the group rebuilt as a ZeroRedundancyOptimizer with its own settings."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    out = []
    for o in group.optimizers:
        accepted = inspect.signature(type(o).__init__).parameters
        kwargs = {k: v for k, v in o.defaults.items() if k in accepted}
        params = [p for g in o.param_groups for p in g["params"]]
        out.append(ZeroRedundancyOptimizer(params, optimizer_class=type(o), **kwargs))
    return OptimizerGroup(out)


def fsdp_mixed_precision(device: torch.device, precision: str) -> Any:
    """bf16 compute, fp32 reduction on CUDA with bf16 autocast; None (fp32 throughout, or
    parameters already bf16) otherwise."""
    if device.type != "cuda" or precision != "bf16-autocast":
        return None
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)


def shard_model(model: nn.Module, strategy: str, device: torch.device, precision: str, compile_blocks: bool) -> None:
    """fully_shard every block, then the root (in place), on a 1-D mesh over all ranks."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    kw: dict[str, Any] = {"mesh": mesh, "reshard_after_forward": strategy == "fsdp"}
    mp = fsdp_mixed_precision(device, precision)
    if mp is not None:
        kw["mp_policy"] = mp
    for block in model.blocks:  # type: ignore[union-attr]
        if compile_blocks:
            block.compile()
        fully_shard(block, **kw)
    fully_shard(model, **kw)


def build_sharded(make: Callable[[], nn.Module], init: Callable[[nn.Module], None], strategy: str,
                  device: torch.device, precision: str, compile_blocks: bool) -> nn.Module:
    """Build on meta (make), shard, materialise on `device`, then initialise each shard (init)."""
    from torch.distributed.tensor.experimental import implicit_replication

    with torch.device("meta"):
        model = make()
    if precision == "bf16":                       # parameters only, as runner/train.py build_model
        for p in model.parameters():
            p.data = p.data.to(torch.bfloat16)
    shard_model(model, strategy, device, precision, compile_blocks)
    model.to_empty(device=device)
    with implicit_replication():  # seeded full tensors copied into each rank's shard
        init(model)
    return model


def parallelize(strategy: str, world_size: int, device: torch.device, *, precision: str, compile: bool,
                build_model: Callable[[], nn.Module], make_meta: Callable[[], nn.Module],
                init: Callable[[nn.Module], None],
                build_optimizer: Callable[[nn.Module], OptimizerGroup]) -> Parallel:
    """The plan's model, wrapped for `strategy`, and its optimizer.

    build_model: the materialised, initialised model (ddp, zero1, one process);
    make_meta + init: construction and initialisation, for zero2/fsdp's meta-device path.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}")
    if world_size > 1 and strategy in FSDP_STRATEGIES:
        raw = build_sharded(make_meta, init, strategy, device, precision, compile_blocks=compile)
        return Parallel(strategy, world_size, raw, raw, raw, build_optimizer(raw))
    from torch.nn.parallel import DistributedDataParallel as DDP

    raw = build_model()
    fwd = torch.compile(raw) if compile else raw
    model = fwd
    if world_size > 1:
        model = DDP(fwd, device_ids=[device.index] if device.type == "cuda" else None, gradient_as_bucket_view=True)
    opt = build_optimizer(raw)
    if world_size > 1 and strategy == "zero1":
        opt = zero_redundancy(opt)
    return Parallel(strategy, world_size, raw, fwd, model, opt)
