"""torchrun target for tests/test_shard_state.py: the bytes one rank really holds per strategy.

Builds the runner's model and optimizer for a plan's strategy with runner.parallel.parallelize
(the runner's own path), runs one micro-step's forward and backward, counts the local bytes of
gradients, takes an optimizer step, then counts the local bytes of parameters and optimizer
state. DTensors count their local shard. Rank 0 writes {category: bytes} as JSON to argv[2].
"""

from __future__ import annotations

import gc
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from planner.plan import load_plan
from runner.model import GPT
from runner.parallel import is_dtensor, parallelize
from runner.step import build_optimizer


def local_bytes(t: torch.Tensor) -> int:
    t = t.to_local() if is_dtensor(t) else t
    return t.numel() * t.element_size()


def main() -> None:
    plan = load_plan(sys.argv[1])
    dist.init_process_group("gloo")
    tr, hyper, spec = plan.training, plan.request.hyper, plan.request.model
    torch.manual_seed(0)

    def make() -> GPT:
        return GPT(spec, loss_chunk_tokens=tr.loss_chunk_tokens, activation_checkpointing=tr.activation_checkpointing)

    def built() -> GPT:
        m = make()
        m.init_weights(hyper.seed)
        return m

    par = parallelize(tr.strategy, dist.get_world_size(), torch.device("cpu"), precision=tr.precision, compile=False,
                      build_model=built, make_meta=make, init=lambda m: m.init_weights(hyper.seed),
                      build_optimizer=lambda m: build_optimizer(m, tr.optimizer, hyper.lr, hyper.matrix_lr,
                                                                hyper.weight_decay, tuple(hyper.betas), "cpu"))
    x = torch.randint(0, spec.vocab_size, (tr.device_batch_size, spec.seq_len))
    par.model(x, x).backward()
    grads = sum(local_bytes(p.grad) for p in par.raw.parameters() if p.grad is not None)
    for o in par.opt.optimizers:
        o.step()
    params = sum(local_bytes(p) for p in par.raw.parameters())
    state = 0
    for o in par.opt.optimizers:
        inner = getattr(o, "optim", o)                   # ZeroRedundancyOptimizer holds its shard's optimizer
        for s in inner.state.values():
            state += sum(local_bytes(v) for v in s.values() if isinstance(v, torch.Tensor) and v.dim() > 0)
    out = torch.tensor([params, grads, state], dtype=torch.float64)
    dist.all_reduce(out, op=dist.ReduceOp.MAX)           # the largest rank (ZeRO splits whole tensors)
    if dist.get_rank() == 0:
        Path(sys.argv[2]).write_text(json.dumps(dict(zip(("parameters", "gradients", "optimizer_state"),
                                                         map(int, out.tolist()), strict=True))))
    # every rank done with its collectives, and the model's and optimizer's tensors gone, before the group is: a
    # gloo work object still holding a tensor at interpreter exit aborts the rank ("terminate called without an
    # active exception", exit -6; seen once under load on the zero1 case; pytorch/pytorch#179291 names the cause)
    dist.barrier()
    del par, x, out
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
