"""The torchrun target: ``python -m runner.train --plan PLAN --run-dir DIR [--resume] [--force] [--data DIR]``.

One process per GPU (or per CPU "GPU" with gloo). It trains the plan's model with DDP, logs
metrics each step, checkpoints every plan.schedule.checkpoint_every_minutes of wall clock,
stops before the plan's budget runs out (leaving time for the final checkpoint), at
total_steps, on validation patience, or on SIGTERM/SIGINT/SIGHUP or a stop request of
`nanoplan run` (after a checkpoint, exit 0), and resumes from the newest intact checkpoint of
RUN_DIR. The rank-0 worker holds RUN_DIR's training lock (runner/runlock.py) from before it
reads or cleans the run dir until it exits. A failed write of any run file (metrics.jsonl,
run_info.json, best.json, stop.json, a checkpoint) stops the run with exit code 4 and one line.

Per step there is one host sync: a single all-reduce of [loss, grad norm, checkpoint flag,
stop flag, signal flag] whose flags rank 0 sets from its clock, so all ranks agree on when
to checkpoint and stop.

The Trainer wires components that live in modules of their own: the step (runner/step.py), the
ranks (runner/distributed.py), the model (runner/plan_model.py), resuming (runner/resume.py), the
checkpoint write and retention (runner/checkpoint.py, runner/checkpoint_retention.py), the clock
and budget guard (runner/clock.py), signals (runner/signals.py), the stop record and exit codes
(runner/stop_record.py), and the console (runner/console.py, runner/display.py).
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import os
import sys
from pathlib import Path
from typing import Any, NamedTuple

import torch
import torch.distributed as dist

from planner.errors import PlanError
from planner.plan import load_plan, plan_doc, plan_hash
from runner.checkpoint import CheckpointWriteError, save_checkpoint
from runner.checkpoint_layout import BEST, step_dir
from runner.checkpoint_meta import train_hash
from runner.checkpoint_retention import retain, update_best
from runner.clock import BudgetGuard, Clock, deadline_seconds
from runner.console import HangupSafe
from runner.data import TrainBatches, ValBatches, data_fingerprints, load_data
from runner.display import Display, stop_summary
from runner.distributed import broadcast, grad_accum_for, setup_dist, start_at_oldest
from runner.elastic import launch_job, restart_count
from runner.evaluate import val_loss
from runner.faults import Faults
from runner.launcher import io_problem
from runner.ledger import Heartbeat, worker_heartbeat
from runner.metrics import METRICS, RUN_INFO, MetricsLog, mfu, update_run_info
from runner.parallel import full_value
from runner.patience import Patience
from runner.plan_model import wrap_model
from runner.preflight import check_data, check_run_dir_contained, resolve_data_dir
from runner.replicas import compare_replicas
from runner.resume import decide_resume, restore_model, restore_training_state
from runner.runlock import TRAIN_LOCK, RunDirBusy, RunLock
from runner.schedule import DeadlineSchedule
from runner.signals import Signals
from runner.step import train_step
from runner.stop_record import EXIT_OK, EXIT_USAGE, EXIT_WRITE, exit_code, record_stop, report_exit, stop_error


class RunWriteError(Exception):
    """A run file other than a checkpoint could not be written (disk full, I/O error): exit 4."""


class StepSync(NamedTuple):
    """What the step's one all-reduce returns: loss and grad norm summed over the ranks, and rank 0's flags."""

    loss_sum: float
    gnorm_sum: float
    want_ckpt: float
    want_stop: float
    got_signal: float
    projected: float        # the step count the deadline projects (exact in float64)
    write_failed: float
    bad_data: float         # some rank read a token id outside the vocab (runner/data.py)


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


class Trainer:
    """State of one training process: model, optimizer, data, clock, and the loop."""

    def __init__(self, args: argparse.Namespace, clock: Clock) -> None:
        self.args = args
        self.clock = clock
        self.signals = Signals()
        self.signals.install()
        self.plan = load_plan(args.plan)
        other = self.plan.request.trainer.name
        if other != "nanoplan":       # a plan of another trainer's step: nanoplan run supervises that trainer
            raise PlanError(args.plan, f"plans {other}'s training step, not nanoplan's runner",
                            f"run it with: nanoplan run {args.plan} (it runs {other} under the plan's budget)")
        self.hyper = self.plan.request.hyper
        self.phash = plan_hash(self.plan)
        self.d = setup_dist(self.plan, args.force)
        start_at_oldest(self.d, self.clock)
        self.run_dir = Path(args.run_dir)
        self.faults = Faults.from_env()
        self.lock: RunLock | None = None
        self.alive: Heartbeat | None = None      # rank 0: this launch's time, kept even if its launcher dies
        self.pending_write: str | None = None   # rank 0: a failed write, shared at the next step's all-reduce
        self.write_error: str | None = None
        self.ckpt_write_failed = False
        self.error: str | None = None
        self.display = Display(enabled=self.d.is_main, budget_usd=self.plan.budget.usd if self.plan.budget.usd_per_hour > 0 else None,
                               planned_tokens_per_sec=self.plan.throughput.tokens_per_sec)

    def log(self, msg: str) -> None:
        if self.d.is_main:
            self.display.log(msg)

    # ------------------------------------------------------------------ set-up

    def setup(self) -> None:
        """What the loop needs, in the order the run dir allows: the data, the run dir's lock (before anything
        reads or cleans it), the wrapped model, the resumed state and LR schedule, the budget, run_info.json."""
        plan, d, tr = self.plan, self.d, self.plan.training
        self.device_type, self.precision = d.device.type, tr.precision
        self.accum = grad_accum_for(plan, d.world_size, self.args.force)
        self.tokens_per_step = tr.device_batch_size * tr.seq_len * self.accum * d.world_size
        self.total_steps = plan.schedule.total_steps
        self._open_data()
        self._lock_run_dir()
        torch.manual_seed(self.hyper.seed)
        if self.device_type == "cuda":
            torch.set_float32_matmul_precision("high")   # TF32 for any fp32 matmul left outside autocast
        self.compiled = bool(tr.compile)
        self.par = wrap_model(plan, d.world_size, d.device)    # ddp, zero1, zero2 or fsdp (runner/parallel.py)
        self.raw, self.fwd, self.model, self.opt = self.par.raw, self.par.fwd, self.par.model, self.par.opt
        self.data_fp = data_fingerprints(self.data_dir) if d.is_main else None
        resumed_from, carried_h = self._resume()
        self._start_budget(carried_h)
        self.patience = Patience.from_meta(self.resume_meta)
        self.last_val: tuple[int, float] | None = None
        self.last_loss: float | None = None
        self.nth_write = 0
        self.device_name = torch.cuda.get_device_name(d.device) if self.device_type == "cuda" else "cpu"
        self.segment = self._record_start(resumed_from, carried_h)

    def _open_data(self) -> None:
        """The plan's data, checked, as this rank's training and validation batches."""
        plan, d, hyper, tr = self.plan, self.d, self.hyper, self.plan.training
        self.data_dir = resolve_data_dir(plan, self.args.data, self.args.plan)
        check_data(plan, self.data_dir)
        meta, train_tok, val_tok = load_data(self.data_dir)
        self.train = TrainBatches(train_tok, tr.seq_len, tr.device_batch_size, self.accum, d.rank, d.world_size,
                                  hyper.seed, d.device, vocab_size=meta.vocab_size, path=self.data_dir / "train.bin")
        self.val = ValBatches(val_tok, tr.seq_len, tr.device_batch_size, d.rank, d.world_size, hyper.val_tokens, d.device,
                              vocab_size=meta.vocab_size, path=self.data_dir / "val.bin")
        self.val_every = hyper.val_every_steps if self.val.enabled else 0
        if hyper.val_every_steps and not self.val.enabled:
            self.log(f"warning: {self.data_dir}/val.bin is too small for one window; validation is off")

    def _lock_run_dir(self) -> None:
        """Rank 0 takes RUN_DIR's training lock; every rank learns whether it could."""
        escape = check_run_dir_contained(self.run_dir)
        if escape:
            raise PlanError("--run-dir", escape, "remove the link, or pass the real directory as --run-dir")
        busy: list[str] | None = None
        if self.d.is_main:
            try:
                self.run_dir.mkdir(parents=True, exist_ok=True)
                self.lock = RunLock.acquire(self.run_dir, TRAIN_LOCK, "a training worker")
                self.alive = worker_heartbeat(self.run_dir)
            except RunDirBusy as e:
                busy = ["--run-dir", str(e), f"wait for that run to end, or stop it (kill -TERM {e.pid} on {e.host}); "
                        "two runs on one run dir would corrupt each other"]
            except OSError as e:
                busy = ["--run-dir", f"{self.run_dir} cannot be created or locked ({e.strerror or e})",
                        "pick another --run-dir"]
        busy = broadcast(busy, self.d)     # before anything reads, writes or cleans the run dir
        if busy:
            raise PlanError(*busy)

    def _resume(self) -> tuple[int | None, float]:
        """Rank 0's resume decision on every rank, the checkpoint's state loaded, and the LR schedule.
        Returns (the step resumed from, or None; the hours carried from earlier launches)."""
        plan, d, hyper = self.plan, self.d, self.hyper
        decision = broadcast(decide_resume(plan, self.phash, self.run_dir, self.args.resume, self.args.force, self.log,
                                           self.clock, self.data_dir, self.data_fp) if d.is_main else None, d)
        if "error" in decision:
            raise PlanError(*decision["error"])
        self.start_step = decision["step"] or 0
        self.resume_meta: dict[str, Any] = decision.get("meta") or {}
        ckdir = step_dir(self.run_dir, self.start_step) if decision["step"] is not None else None
        if ckdir is not None:
            restore_model(self.par, ckdir, d.device)
        # the warmdown follows the deadline (runner/schedule.py); resumed from the checkpoint's projection
        self.sched = DeadlineSchedule.resume(self.resume_meta.get("schedule"), self.total_steps, hyper.warmup_steps,
                                             hyper.warmdown_frac, hyper.decay)
        self.scheds = [torch.optim.lr_scheduler.LambdaLR(o, lambda s: self.sched.multiplier(s)) for o in self.opt.optimizers]
        carried_h = float(decision.get("carried_hours") or 0.0)
        if ckdir is not None:
            restore_training_state(self.par, self.scheds, ckdir, d.rank, d.device)
            old_data = (self.resume_meta.get("data") or {}).get("data_dir")
            if old_data and Path(old_data).resolve() != self.data_dir.resolve():
                self.log(f"warning: the checkpoint was trained on {old_data}, this launch reads {self.data_dir}")
            self.log(f"resumed from {ckdir} (step {self.start_step}, "
                     f"{self.resume_meta['carried_hours'] * 60:.2f} min and "
                     f"${self.resume_meta['carried_hours'] * plan.budget.usd_per_hour:.2f} carried)")
        elif carried_h > 0:
            self.log(f"no checkpoint to resume from: starting over, with {carried_h * 60:.2f} min and "
                     f"${carried_h * plan.budget.usd_per_hour:.2f} carried from earlier launches")
        return decision["step"], carried_h

    def _start_budget(self, carried_h: float) -> None:
        """The budget guard (what is left of the deadline) and the checkpoint cadence."""
        plan, b = self.plan, self.plan.budget
        self.usd_per_hour = b.usd_per_hour
        self.guard = BudgetGuard(deadline_seconds(plan.request.hours, plan.request.budget_usd, b.usd_per_hour),
                                 carried_s=carried_h * 3600.0, ckpt_bytes=plan.schedule.checkpoint_bytes)
        if self.resume_meta.get("write_seconds") is not None:
            self.guard.observe_checkpoint(float(self.resume_meta["write_seconds"]))
        self.guard.observe_eval(float(self.resume_meta.get("eval_seconds") or 0.0))
        self.ckpt_every_s = plan.schedule.checkpoint_every_minutes * 60.0
        self.last_ckpt_total = self.guard.total(0.0)

    def _record_start(self, resumed_from: int | None, carried_h: float) -> int:
        """Rank 0 adds this launch's segment to run_info.json; every rank gets its number."""
        d = self.d
        seg: int | str = 0
        if d.is_main:
            now = _now()
            try:
                if (fail := self.faults.file_errno("run_info", 1)) is not None:
                    raise OSError(fail, os.strerror(fail), str(self.run_dir / RUN_INFO))
                seg = update_run_info(self.run_dir, {
                    "plan_hash": self.phash, "plan_path": str(Path(self.args.plan).resolve()),
                    "device": self.device_name, "torch_version": torch.__version__, "world_size": d.world_size,
                    "start_time": now, "data_dir": str(self.data_dir), "data_fingerprint": self.data_fp,
                }, {"start_time": now, "resumed_from_step": resumed_from, "world_size": d.world_size,
                    "restart_count": restart_count(), "device": self.device_name, "job": launch_job(),
                    "clock_start_unix": self.clock.start_unix, "carried_hours": carried_h,
                    "launch_age_s": self.clock.age})
            except OSError as e:
                seg = io_problem(self.run_dir / RUN_INFO, e)
        seg = broadcast(seg, d)
        if isinstance(seg, str):
            raise RunWriteError(f"{seg}; stopped before the first step (free disk space or fix the run dir, "
                                "then run the same command to resume)")
        return seg

    # ------------------------------------------------------------------ the loop

    def run(self) -> int:
        """The training loop: step, one host sync, log, maybe evaluate, maybe checkpoint, maybe stop.
        Returns the exit code (runner/stop_record.py)."""
        d, step = self.d, self.start_step
        self.last_ckpt_step = step if self.resume_meta else -1
        metrics = self._open_metrics()
        reason = self._nothing_to_do(step)
        prev_real, prev_budget = self.clock.real(), self.clock.budget()
        with self.display:
            while reason is None:
                lr = self.opt.param_groups[0]["lr"]
                # the micro-batches: forward under autocast, backward, clip, optimizer step, zero grads
                loss_t, gnorm_t = train_step(self.model, self.opt, self.train.micro_batches(step), self.accum,
                                             self.precision, self.device_type, self.hyper.grad_clip)
                gnorm_t = full_value(gnorm_t)   # a DTensor under zero2/fsdp
                step += 1
                self.faults.after_step(step, d.rank)
                sync = self._sync(loss_t, gnorm_t, step)       # the one host sync: loss, norm, rank 0's flags
                self._next_lr(step, int(sync.projected))
                real, budget = self.clock.real(), self.clock.budget()
                self.guard.observe_step(budget - prev_budget)
                loss = sync.loss_sum / d.world_size
                val = None
                if self.val_every and step % self.val_every == 0:
                    val = self.evaluate()
                    self.last_val = (step, val)
                    self.patience.note(val)
                reason = self._stop_reason(step, loss, sync)
                if val is None and self._checkpoint_follows(step, reason, sync):
                    val = self.checkpoint_val(step)     # logged with the step, as the scheduled ones are
                self._log_step(metrics, step, lr, loss, sync.gnorm_sum / d.world_size, real - prev_real, val)
                if reason is None and sync.want_ckpt and self._checkpoint_or_stop(step) is None:
                    reason = "write_error"
                prev_real, prev_budget = self.clock.real(), self.clock.budget()
            final, reason = self._final_checkpoint(step, reason)
            self.display.finish(reason, str(final) if final else None)   # no countdown left on screen
        self._close_metrics(metrics)
        return self._finish(step, reason, final)

    # ------------------------------------------------------------------ pieces of the loop

    def total_s(self) -> float:
        """Budget seconds of the whole run so far (carried + this launch)."""
        return self.guard.total(self.clock.budget())

    def _open_metrics(self) -> MetricsLog:
        try:
            return MetricsLog(self.run_dir, enabled=self.d.is_main, fail=self.faults.file_fault("metrics"))
        except OSError as e:
            self.note_write_error(io_problem(self.run_dir / METRICS, e))
            return MetricsLog(self.run_dir, enabled=False)

    def _nothing_to_do(self, step: int) -> str | None:
        """The stop reason when a resumed run has already reached its end, else None."""
        reason: str | None = None
        if step >= self.total_steps:
            reason = "total_steps"
        elif step >= self.sched.total or self.guard.should_stop(self.clock.budget()):
            reason = "deadline"
        if reason:
            self.log(f"nothing to do: {reason} already reached at step {step}")
        return reason

    def _sync(self, loss: torch.Tensor, gnorm: torch.Tensor, step: int) -> StepSync:
        """The step's one all-reduce: loss, grad norm, and rank 0's checkpoint, stop, signal, projection and
        write-failure flags, so that every rank agrees on when to checkpoint and stop."""
        want_ckpt = want_stop = projected = 0.0
        if self.d.is_main:
            projected = float(self.sched.propose(step, self.total_s(), self.guard, ckpt_every_s=self.ckpt_every_s,
                                                 last_ckpt_s=self.last_ckpt_total, val_every=self.val_every))
            probe = step == self.start_step + 1 and self.guard.ckpt_s is None  # measure the write early
            want_ckpt = float(probe or self.total_s() - self.last_ckpt_total >= self.ckpt_every_s)
            eval_due = bool(self.val_every) and step % self.val_every == 0
            want_stop = float(self.guard.should_stop(self.clock.budget(), checkpoint_due=bool(want_ckpt),
                                                     eval_due=eval_due))
        flags = torch.tensor([want_ckpt, want_stop, float(self.signals.count > 0), projected,
                              float(self.pending_write is not None), float(self.train.problem is not None)],
                             dtype=torch.float64)
        vec = torch.cat([loss.detach().double().reshape(1), gnorm.detach().double().reshape(1).to(loss.device),
                         flags.to(loss.device)])   # float64: the projected step is exact
        if self.d.on:
            dist.all_reduce(vec)
        sync = StepSync(*vec.tolist())
        if sync.bad_data:
            raise self.train.shared_problem()    # on every rank at once: exit 2, no torchrun restart
        return sync

    def _next_lr(self, step: int, projected: int) -> None:
        """The LR of the next step, on the (re)projected schedule."""
        self.sched.apply(step, projected)
        if (note := self.sched.announcement(step)) is not None:
            self.log(note)
        for s in self.scheds:
            s.step()

    def evaluate(self) -> float:
        """The validation loss (collective); its time is part of what the budget guard expects."""
        t0 = self.clock.budget()
        val = val_loss(self.fwd, self.val, self.d.device, self.precision, self.d.world_size)
        self.guard.observe_eval(self.clock.budget() - t0)
        return val

    def _checkpoint_follows(self, step: int, reason: str | None, sync: StepSync) -> bool:
        """Whether this step ends with a checkpoint (its cadence, or the run's end) whose validation pass
        runs first: then the pass runs before the step's metrics row, so the row (and TensorBoard) has it."""
        if not self.val_every:
            return False
        if reason is None:
            return bool(sync.want_ckpt)
        return reason != "nan" and not self.ckpt_write_failed and step > self.start_step

    def checkpoint_val(self, step: int) -> float:
        """The validation pass a checkpoint of `step` runs (for best.json); not counted by the patience rule,
        which sees the scheduled passes only."""
        if self.last_val is None or self.last_val[0] != step:
            self.last_val = (step, self.evaluate())
        return self.last_val[1]

    def _log_step(self, metrics: MetricsLog, step: int, lr: float, loss: float, gnorm: float, step_real: float,
                  val: float | None) -> None:
        """One metrics.jsonl row (rank 0) and the console's line."""
        plan, d = self.plan, self.d
        total_h = self.total_s() / 3600.0
        alloc, reserved = self._memory()
        tps = self.tokens_per_step / step_real if step_real > 0 else 0.0
        row: dict[str, Any] = {
            "step": step, "total_steps": self.total_steps, "loss": loss, "lr": lr,
            "grad_norm": gnorm, "tokens_per_sec": tps,
            "mfu": mfu(tps, plan.model.flops_per_token, d.world_size, plan.throughput.peak_flops_per_gpu),
            "step_seconds": step_real,
            "elapsed_hours": total_h, "usd_spent": total_h * self.usd_per_hour,
            "tokens_seen": step * self.tokens_per_step, "epoch": self.train.epoch_of(step),
            "max_memory_allocated": alloc, "max_memory_reserved": reserved,
            "world_size": d.world_size, "device": self.device_name, "compiled": self.compiled,
            "segment": self.segment, "projected_steps": self.sched.total,
            "projected_tokens": self.sched.total * self.tokens_per_step,
        }
        if val is not None:
            row["val_loss"] = val
        try:
            metrics.write(row)
        except OSError as e:
            self.note_write_error(io_problem(metrics.path, e))
            metrics.enabled = False
        self.last_loss = loss
        self.display.update({**row, "seconds_to_stop": self.guard.seconds_to_stop(self.clock.budget()),
                             "seconds_to_checkpoint": self.last_ckpt_total + self.ckpt_every_s - self.total_s()})

    def _memory(self) -> tuple[int | None, int | None]:
        if self.device_type != "cuda":
            return None, None
        return torch.cuda.max_memory_allocated(self.d.device), torch.cuda.max_memory_reserved(self.d.device)

    def _stop_reason(self, step: int, loss: float, sync: StepSync) -> str | None:
        """Why the run stops after this step, or None to go on (before its scheduled checkpoint, if any)."""
        if not math.isfinite(loss):
            return "nan"
        if sync.write_failed:
            return "write_error"        # a run file could not be written (rank 0, at an earlier step)
        if sync.got_signal:
            return "signal"
        if sync.want_stop:
            return "deadline"
        if step >= self.sched.total:    # the plan's count, or the deadline's projection of it
            return "total_steps" if self.sched.total >= self.total_steps else "deadline"
        if self.patience.exhausted(self.hyper.patience_evals):
            return "patience"
        return None

    # ------------------------------------------------------------------ checkpoints

    def checkpoint(self, step: int) -> Path:
        """Write a checkpoint of `step` (collective). Runs a validation pass first when enabled
        (for best.json; it does not count towards the patience rule, which sees scheduled evals only)."""
        val = self.checkpoint_val(step) if self.val_every else None
        replicas = compare_replicas(self.par.fingerprint(), self.raw, self.d.world_size)  # "shards" under zero2/fsdp
        if replicas["agree"] is False:
            self.log(f"warning: the {self.d.world_size} replicas' parameters differ at step {step}: "
                     f"{replicas['fingerprints']}")
        self.nth_write += 1
        t0 = self.clock.budget()
        self.par.before_checkpoint()   # zero1: gather the optimizer state on rank 0 (collective)
        path = save_checkpoint(
            self.run_dir, step, rank=self.d.rank, world_size=self.d.world_size,
            model_state=self.raw.state_dict, optim_state=lambda: {
                **self.par.optimizer_file_state(), "schedulers": [s.state_dict() for s in self.scheds]},
            shards=self.par.write_shards if self.par.sharded_checkpoint else None,
            meta=lambda: self._meta(step, val, t0, replicas), faults=self.faults, nth_write=self.nth_write,
            slow_write=self.clock.simulate_slow_write,
        )
        if self.d.is_main:
            try:
                update_best(self.run_dir, step, val)
            except OSError as e:
                self.note_write_error(io_problem(self.run_dir / BEST, e))
            retain(self.run_dir, self.plan.schedule.keep_last)
        self.guard.observe_checkpoint(self.clock.budget() - t0)   # retention (it verifies) is part of the cost
        self.last_ckpt_total = self.total_s()
        self.last_ckpt_step = step
        return path

    def _meta(self, step: int, val: float | None, t0: float, replicas: dict[str, Any]) -> dict[str, Any]:
        """meta.json's fields, taken on rank 0 just before it is written (so write_seconds includes the write)."""
        hyper, tr = self.hyper, self.plan.training
        total = self.total_s()
        return {
            "total_steps": self.total_steps, "elapsed_hours": total / 3600.0,
            "usd_spent": total / 3600.0 * self.usd_per_hour, "plan_hash": self.phash,
            "train_hash": train_hash(self.plan), "plan": plan_doc(self.plan),
            "data": {"position": "step", "step": step, "seed": hyper.seed, "world_size": self.d.world_size,
                     "device_batch_size": tr.device_batch_size, "grad_accum_steps": self.accum,
                     "seq_len": tr.seq_len, "data_dir": str(self.data_dir),
                     "fingerprint": self.data_fp},
            "val_loss": val, "patience": self.patience.state(),
            "write_seconds": max(self.guard.ckpt_s or 0.0, self.clock.budget() - t0), "eval_seconds": self.guard.eval_s,
            "tokens_seen": step * self.tokens_per_step, "segment": self.segment, "replicas": replicas,
            "time": _now(), "torch_version": torch.__version__, "schedule": self.sched.state(),
        }

    def _checkpoint_or_stop(self, step: int) -> Path | None:
        """self.checkpoint(step), or None after a failed write (disk full, I/O error): the run then
        stops, keeping the checkpoints it has; the first failure's message is kept for the stop line."""
        try:
            return self.checkpoint(step)
        except CheckpointWriteError as e:
            self.write_error = self.write_error or str(e)
            self.ckpt_write_failed = True
            return None

    def note_write_error(self, problem: str) -> None:
        """Rank 0: a run file could not be written. The run stops at the next step's all-reduce
        (every rank learns it there), still writing a final checkpoint if it can."""
        self.write_error = self.write_error or problem
        self.pending_write = self.pending_write or problem

    # ------------------------------------------------------------------ the end

    def _final_checkpoint(self, step: int, reason: str | None) -> tuple[Path | None, str | None]:
        """The checkpoint the run ends with (written now unless this step has one), and the reason after it."""
        if self.signals.names:
            self.log(f"got {self.signals.names[0]}: stopping after step {step} with a checkpoint")
        final = None
        # after a failed metrics/run_info/best.json write the checkpoint is still tried: it keeps the work
        may_write = reason != "nan" and not self.ckpt_write_failed
        if may_write and step > self.start_step and self.last_ckpt_step != step:
            final = self._checkpoint_or_stop(step)
            reason = reason if final is not None else "write_error"
        elif may_write and self.last_ckpt_step == step and step > self.start_step:
            final = step_dir(self.run_dir, step)
        return final, reason

    def _close_metrics(self, metrics: MetricsLog) -> None:
        try:
            metrics.close()
        except OSError as e:
            self.note_write_error(io_problem(metrics.path, e))

    def _finish(self, step: int, reason: str | None, final: Path | None) -> int:
        """stop.json, the stop line and the summary (rank 0); returns the exit code."""
        if self.pending_write is not None and reason != "nan":
            reason = "write_error"      # rank 0 only (a write after the last all-reduce): its exit code counts
        total_h = self.total_s() / 3600.0
        code = exit_code(reason)
        self.error = stop_error(reason, step, self.write_error, self.run_dir, self.start_step if self.resume_meta else None)
        summary = stop_summary(self.plan, steps=step, tokens=step * self.tokens_per_step, hours=total_h,
                               usd=total_h * self.usd_per_hour, loss=self.last_loss,
                               val_loss=self.last_val[1] if self.last_val else None)
        if self.d.is_main:
            stopped = record_stop(self.run_dir, {
                "reason": reason, "step": step, "total_steps": self.total_steps,
                "checkpoint": str(final) if final else None, "elapsed_hours": total_h,
                "usd_spent": total_h * self.usd_per_hour, "segment": self.segment, "job": launch_job(),
                "signals": self.signals.names, "exit_code": code, "error": self.error,
                "time": _now(), "summary": summary,
            })
            if stopped is not True and code == EXIT_OK:
                code, self.error = EXIT_WRITE, f"{stopped}; the run itself stopped cleanly ({reason} at step {step})"
            where = f"; checkpoint {final}" if final else ""
            self.log(f"stopped: {reason} at step {step}/{self.total_steps}, {total_h * 60:.2f} min, "
                     f"${total_h * self.usd_per_hour:.2f}{where}")
            self.display.summary(summary)
            if self.error:
                print(f"error: {self.error}", file=sys.stderr, flush=True)
        return code


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m runner.train", description=__doc__.splitlines()[0])
    p.add_argument("--plan", required=True, help="plan.json from nanoplan estimate")
    p.add_argument("--run-dir", required=True, help="checkpoints, metrics.jsonl, run_info.json")
    p.add_argument("--data", default=None, help="data directory (default: the plan's data_dir)")
    p.add_argument("--resume", action="store_true", help="require a checkpoint to resume from")
    p.add_argument("--force", action="store_true", help="resume a checkpoint of another plan; run a GPU plan on CPU")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    clock = Clock.from_env()
    trainer = None
    is_main = int(os.environ.get("RANK", "0")) == 0
    try:
        trainer = Trainer(args, clock)
        trainer.setup()
        code = trainer.run()
        return report_exit(code, trainer.error)
    except PlanError as e:
        if is_main:
            print(f"error: {e}", file=sys.stderr, flush=True)
        return report_exit(EXIT_USAGE, str(e))
    except RunWriteError as e:
        if is_main:
            record_stop(Path(args.run_dir), {"reason": "write_error", "step": None, "exit_code": EXIT_WRITE,
                                             "error": str(e), "job": launch_job(), "signals": [], "time": _now()})
            print(f"error: {e}", file=sys.stderr, flush=True)
        return report_exit(EXIT_WRITE, str(e))
    finally:
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
        if trainer is not None and trainer.alive is not None:
            trainer.alive.stop()        # the exact end of this launch's time, last


def exit_now(code: int) -> None:
    """Exit without the interpreter's module teardown (1-2 s with torch loaded, after the launch's time
    was last recorded: runner/ledger.py): flush, run the atexit handlers (torch's own), then os._exit."""
    import atexit

    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except (OSError, ValueError):
            pass
    atexit._run_exitfuncs()
    os._exit(code)


if __name__ == "__main__":
    sys.stdout, sys.stderr = HangupSafe(sys.stdout), HangupSafe(sys.stderr)   # type: ignore[assignment]
    exit_now(main())
