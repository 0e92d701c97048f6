"""One trial of `nanoplan probe`, the torchrun target:
``python -m runner.probe_worker --plan TRIAL.json --run-dir DIR --data DATA --warmup W --steps S``.

It sets the run up exactly as `nanoplan run` does (runner.train.Trainer.setup: the process group,
the model wrapped for the plan's strategy and compiled as planned, the optimizer, the LR scheduler,
the plan's data), then takes W warm-up steps (the first compiles), S timed steps and PHASE_STEPS
steps timed by phase, each with the runner's own runner.step.train_step and one host sync. No
checkpoint, no validation.

- DIR/result.json (rank 0): the step times, the phases (data; forward+backward with DDP's
  overlapped all-reduce and the gradient clip; optimizer; the rest: zero_grad, scheduler and the
  host sync), the peak of every rank's CUDA memory (runner/memstats.py) and the last loss.
- torch.OutOfMemoryError: the rank writes DIR/oom_rank{r}.json and exits EXIT_OOM at once; torchrun
  then stops the other ranks, which wait in a collective.
- DIR/pid_rank{r}: written first, so that the probe can kill this process after a time-out even
  when torchrun is gone. The worker also dies with its torchrun (PR_SET_PDEATHSIG) and ends itself
  at the trial's deadline (runner.probe_trial.hold_trial_worker), so no trial outlives a killed probe.

Fault hook for tests (runner/probe.py parses it): NANOPLAN_PROBE_FAULT=oom:SEL or hang:SEL
(comma-separated) raises torch.OutOfMemoryError, or blocks, inside the first step on rank 0 (from
the micro-batch iterator that train_step consumes) when SEL is the trial's micro-batch (8), its
label (b8, b8-ac) or *.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from planner.errors import PlanError
from planner.plan import atomic_write_text
from planner.probe import PHASE_STEPS, trial_label
from runner.clock import Clock
from runner.memstats import cuda_memory, peak_over_ranks
from runner.parallel import full_value
from runner.probe import ENV_PROBE_FAULT, fault_for, parse_faults
from runner.probe_trial import hold_trial_worker
from runner.step import train_step
from runner.train import Trainer

EXIT_OOM = 3
RESULT = "result.json"


def _faulty(batches: Iterator[Any], kind: str) -> Iterator[Any]:
    if kind == "oom":
        raise torch.OutOfMemoryError(f"CUDA out of memory (injected by {ENV_PROBE_FAULT})")
    time.sleep(10**6)                       # "hang": the probe's time box must end it
    yield from batches


class PhaseClock:
    """Times one step by phase, with a device sync at each boundary (used only on the phase steps)."""

    def __init__(self, sync: Callable[[], None]) -> None:
        self.sync = sync
        self.data_s = 0.0
        self.opt_start: float | None = None
        self.opt_end: float | None = None

    def batches(self, it: Iterator[Any]) -> Iterator[Any]:
        while True:
            self.sync()
            t0 = time.perf_counter()
            try:
                item = next(it)
            except StopIteration:
                return
            self.sync()
            self.data_s += time.perf_counter() - t0
            yield item

    @contextlib.contextmanager
    def optimizer_hooks(self) -> Iterator[None]:
        def pre(*_: Any) -> None:
            if self.opt_start is None:
                self.sync()
                self.opt_start = time.perf_counter()

        def post(*_: Any) -> None:
            self.sync()
            self.opt_end = time.perf_counter()

        h1 = register_optimizer_step_pre_hook(pre)
        h2 = register_optimizer_step_post_hook(post)
        try:
            yield
        finally:
            h1.remove()
            h2.remove()


def measure(t: Trainer, warmup: int, steps: int, fault: str | None) -> dict[str, Any]:
    """Run the trial's steps with the runner's pieces; times in real seconds."""
    hyper, d = t.plan.request.hyper, t.d
    cuda = d.device.type == "cuda"

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(d.device)

    times: list[float] = []
    phases: list[dict[str, float]] = []
    loss = float("nan")
    for i in range(warmup + steps + PHASE_STEPS):
        batches: Iterator[Any] = t.train.micro_batches(i)
        if fault and i == 0 and d.rank == 0:
            batches = _faulty(batches, fault)
        pc = PhaseClock(sync) if i >= warmup + steps else None
        if pc is not None:
            batches = pc.batches(batches)
            sync()
        t0 = time.perf_counter()
        with pc.optimizer_hooks() if pc is not None else contextlib.nullcontext():
            loss_t, gnorm_t = train_step(t.model, t.opt, batches, t.accum, t.precision, t.device_type, hyper.grad_clip)
        gnorm_t = full_value(gnorm_t)
        for s in t.scheds:
            s.step()
        vec = torch.stack([loss_t.detach().float(), gnorm_t.detach().float().to(loss_t.device)])
        if d.on:
            dist.all_reduce(vec)
        loss = vec.tolist()[0] / d.world_size            # the step's one host sync, as in the runner
        end = time.perf_counter()
        if pc is None:
            times.append(end - t0)
        elif pc.opt_start is not None and pc.opt_end is not None:
            phases.append({"data": pc.data_s, "forward_backward": pc.opt_start - t0 - pc.data_s,
                           "optimizer": pc.opt_end - pc.opt_start, "rest": end - pc.opt_end})
    mean_phases = {k: sum(p[k] for p in phases) / len(phases) for k in phases[0]} if phases else None
    return {"warmup_step_seconds": times[:warmup], "step_seconds": times[warmup:], "phases": mean_phases,
            "final_loss": loss}


def _write(path: Path, data: dict[str, Any]) -> None:
    atomic_write_text(path, json.dumps(data, indent=2) + "\n")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m runner.probe_worker", description=__doc__.splitlines()[0])
    p.add_argument("--plan", required=True)
    p.add_argument("--run-dir", required=True)
    p.add_argument("--data", default=None)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--force", action="store_true")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    started = time.perf_counter()
    hold_trial_worker()          # dies with its torchrun, and at the trial's deadline
    a = parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    out = Path(a.run_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"pid_rank{rank}").write_text(str(os.getpid()))
    device: torch.device | None = None
    try:
        args = argparse.Namespace(plan=a.plan, run_dir=a.run_dir, data=a.data, resume=False, force=a.force)
        trainer = Trainer(args, Clock())
        for s in (signal.SIGTERM, signal.SIGINT):      # a trial ends when the probe or torchrun says so
            signal.signal(s, signal.SIG_DFL)
        device = trainer.d.device
        trainer.setup()
        tr = trainer.plan.training
        fault = fault_for(parse_faults(os.environ.get(ENV_PROBE_FAULT, "")), tr.device_batch_size,
                          trial_label(tr.device_batch_size, tr.activation_checkpointing))
        setup_s = time.perf_counter() - started
        rec = measure(trainer, a.warmup, a.steps, fault)
        mems = [cuda_memory(device)]
        if trainer.d.on:
            mems = [None] * trainer.d.world_size
            dist.all_gather_object(mems, cuda_memory(device))
        if rank == 0:
            _write(out / RESULT, {
                "status": "ok", "world_size": trainer.d.world_size, "device": trainer.device_name,
                "torch": torch.__version__, "cuda": torch.version.cuda, "setup_seconds": setup_s, **rec,
                "memory": peak_over_ranks(mems),
            })
        return 0
    except torch.OutOfMemoryError as e:
        mem = cuda_memory(device) if device is not None else {}
        _write(out / f"oom_rank{rank}.json", {"status": "does not fit", "rank": rank,
                                              "error": (str(e).strip().splitlines() or ["out of memory"])[0][:300],
                                              "memory": mem})
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(EXIT_OOM)       # no collective clean-up: the other ranks are stuck in one
    except PlanError as e:
        if rank == 0:
            print(f"error: {e}", file=sys.stderr, flush=True)
        return 2
    finally:
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
