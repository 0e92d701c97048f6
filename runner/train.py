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
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import math
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from planner.errors import PlanError
from planner.plan import Plan, load_plan, plan_doc, plan_hash
from runner import ledger
from runner.checkpoint import CheckpointWriteError, save_checkpoint, set_rng_state
from runner.checkpoint_layout import BEST, complete_steps, list_steps, step_dir
from runner.checkpoint_meta import RESUME_HINT, resume_mismatch, train_hash, verify
from runner.checkpoint_retention import best_problem, latest_good, retain, set_aside, update_best
from runner.clock import (
    ENV_LAUNCH_ID,
    BudgetGuard,
    Clock,
    deadline_seconds,
    launch_first_segment,
    restart_carried_s,
)
from runner.data import TrainBatches, ValBatches, data_fingerprints, fingerprint_change, load_data
from runner.display import Display, stop_summary
from runner.elastic import restart_count
from runner.faults import Faults
from runner.launcher import ENV_STOP_FILE, io_problem
from runner.metrics import (
    METRICS,
    RUN_INFO,
    STOP,
    MetricsLog,
    mfu,
    read_metrics,
    read_run_info,
    update_run_info,
    write_json,
)
from runner.model import GPT
from runner.parallel import full_value, parallelize
from runner.preflight import check_data, check_run_dir_contained, resolve_data_dir
from runner.runlock import TRAIN_LOCK, RunDirBusy, RunLock
from runner.schedule import DeadlineSchedule, lr_multiplier  # noqa: F401  (lr_multiplier: re-exported)
from runner.step import autocast, build_optimizer, train_step
from runner.torch_files import load_torch

EXIT_OK, EXIT_USAGE, EXIT_NAN, EXIT_WRITE = 0, 2, 3, 4


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


class RunWriteError(Exception):
    """A run file other than a checkpoint could not be written (disk full, I/O error): exit 4."""


class Signals:
    """SIGTERM/SIGINT/SIGHUP only set a flag: the loop finishes the step, checkpoints, and exits 0.

    install() also takes over what arrived before it (runner.EARLY_SIGNALS, caught while torch
    was imported) and a stop that `nanoplan run` asked for before this worker could hear it
    (the file NANOPLAN_STOP_FILE names, holding the signal's name): none is lost.
    """

    def __init__(self) -> None:
        self.count = 0
        self.names: list[str] = []

    def install(self) -> None:
        import runner

        for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(s, self._handle)
        for name in runner.EARLY_SIGNALS:
            self._note(name)
        runner.EARLY_SIGNALS.clear()
        stop = os.environ.get(ENV_STOP_FILE)      # read after the handlers are in place: no gap
        if stop:
            try:
                self._note(Path(stop).read_text().strip()[:20] or "SIGTERM")
            except OSError:
                pass

    def _note(self, name: str) -> None:
        self.count += 1
        self.names.append(name)

    def _handle(self, signum: int, frame: Any) -> None:
        self._note(signal.Signals(signum).name)


def grad_accum_for(plan: Plan, world: int, force: bool) -> int:
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


def build_model(plan: Plan, device: torch.device) -> GPT:
    """The plan's GPT on `device`, initialised identically on every rank from the seed."""
    tr = plan.training
    with torch.device("meta"):
        model = GPT(plan.request.model, loss_chunk_tokens=tr.loss_chunk_tokens,
                    activation_checkpointing=tr.activation_checkpointing)
    model.to_empty(device=device)
    if tr.precision == "bf16":
        for p in model.parameters():
            p.data = p.data.to(torch.bfloat16)
    model.init_weights(plan.request.hyper.seed)
    return model


EXACT_FINGERPRINT_MAX_BYTES = 1 << 30


@torch.no_grad()
def replica_fingerprint(model: nn.Module) -> tuple[str, str]:
    """(kind, sha256) of the parameters, equal on every DDP replica.

    Up to 1 GiB of parameters: the raw bytes of every tensor ("bytes", bit-exact). Above: the
    (sum, sum of squares) of every tensor in float64 ("sums"), cheap on the device.
    """
    params = [p.detach() for p in model.parameters()]
    h = hashlib.sha256()
    if sum(p.numel() * p.element_size() for p in params) <= EXACT_FINGERPRINT_MAX_BYTES:
        for p in params:
            h.update(p.contiguous().view(torch.uint8).cpu().numpy().tobytes())
        return "bytes", h.hexdigest()
    parts = []
    for p in params:
        x = p.reshape(-1)
        parts += [torch.sum(x, dtype=torch.float64), torch.dot(x, x).to(torch.float64)]
    h.update(torch.stack(parts).cpu().numpy().tobytes())
    return "sums", h.hexdigest()


def launch_job() -> str | None:
    """What identifies this torchrun job across its restarts: `nanoplan run`'s launch id, else torchrun's run id."""
    return os.environ.get(ENV_LAUNCH_ID) or os.environ.get("TORCHELASTIC_RUN_ID") or None


def _launch_carry_h(run_dir: Path, phash: str) -> tuple[float | None, float, float]:
    """(hours this launch carried in, if known; hours the run dir's launch records add up to;
    real seconds of the launch's start-up that its first attempt counted 1:1).

    A launch of `nanoplan run` has its record in launches.json (runner/ledger.py). A torchrun
    restart without one carries what its launch's first attempt did (run_info.json segments).
    The clock counts from the launch's start, so nothing else of this launch is added here.
    """
    job = os.environ.get(ENV_LAUNCH_ID)
    recs = ledger.read_ledger(run_dir)
    live = ledger.live_record(run_dir, recs)      # this launch, recorded by node rank 0's launcher
    own = next((r for r in recs if job and r["id"] == job), None) or live
    total_h = ledger.ledger_total_s(recs, phash, skip={job, live["id"] if live else None}) / 3600.0
    segs = (read_run_info(run_dir) or {}).get("segments") or []
    segs = segs if isinstance(segs, list) else []
    s = restart_carried_s(segs, launch_job(), restart_count())
    first = launch_first_segment(segs, launch_job(), restart_count())
    try:
        first_age = max(0.0, float((first or {}).get("launch_age_s") or 0.0))
    except (TypeError, ValueError):
        first_age = 0.0
    first_age = first_age if math.isfinite(first_age) else 0.0
    if own is not None:
        return float(own["carried_s"]) / 3600.0, total_h, first_age
    return (None if s is None else s / 3600.0), total_h, first_age


def _decide_resume(plan: Plan, phash: str, run_dir: Path, resume: bool, force: bool,
                   log: Any, clock: Clock, data_dir: Path | None = None,
                   data_fp: dict[str, Any] | None = None) -> dict[str, Any]:
    """Rank 0: which checkpoint to resume from (or an error to raise on every rank), and the
    hours already spent before this launch ("carried_hours").

    A first attempt carries the most that any record says: the checkpoint's hours, the
    metrics logged after it, and the launch records (launches.json: launches killed before
    any worker wrote a line count too). A torchrun restart carries what its launch carried in:
    its clock already counts from the launch's start (the crash and the restart included).
    """
    try:
        steps = list_steps(run_dir)
        restarted = restart_count() > 0
        launch_h, ledger_h, first_age = _launch_carry_h(run_dir, phash)
        if restarted and launch_h is not None:   # + everything since the launch began: the clock restarts at 0
            # the first attempt's start-up counted 1:1, the rest of the launch × the scale (a test hook)
            age = clock.launch_age
            restart_h = (launch_h * 3600.0 + min(first_age, age) + max(0.0, age - first_age) * clock.scale) / 3600.0
        else:
            restart_h = max(launch_h or 0.0, ledger_h)
        if (bad_best := best_problem(run_dir)) is not None:
            log(f"warning: {bad_best}; ignored (rewritten at the next checkpoint with a validation loss)")
        if not complete_steps(run_dir):     # nothing, or only writes killed before meta.json
            if resume and not restarted:
                raise PlanError("--resume", f"{run_dir} has no checkpoint to resume from", "drop --resume to start a new run")
            for s in steps:
                set_aside(run_dir, s)
                log(f"removed step_{s:08d}: a checkpoint write that did not finish (no meta.json)")
            return {"step": None, "carried_hours": restart_h}
        found = latest_good(run_dir, log)
        if found is None:
            if not force:
                newest = list_steps(run_dir)[-1]
                why = verify(step_dir(run_dir, newest))[1]
                raise PlanError("--run-dir", f"{run_dir} holds checkpoints but none is intact "
                                f"(the newest, step_{newest:08d}: {why})",
                                "use another --run-dir, or --force to start from scratch here")
            log("no intact checkpoint; starting from scratch (--force)")
            return {"step": None, "carried_hours": restart_h}
        step, meta = found
        for bad in [s for s in steps if s > step]:
            moved = set_aside(run_dir, bad)
            if moved is not None:
                log(f"moved the damaged checkpoint step_{bad:08d} to {moved}")
        mismatch = resume_mismatch(meta, plan)
        if mismatch:
            if not force:
                raise PlanError("--run-dir", f"checkpoint step_{step:08d} was made by a different plan{mismatch}",
                                RESUME_HINT)
            log(f"resuming from a checkpoint of a different plan (--force){mismatch}")
        changed = fingerprint_change((meta.get("data") or {}).get("fingerprint"), data_dir or Path("."), data_fp or {})
        if changed:
            if not force:
                raise PlanError(changed[0], f"{changed[1]} (checkpoint step_{step:08d})",
                                "restore the data the run was trained on, or --force to resume on this data")
            log(f"warning: {changed[0]}: {changed[1]}; resuming on it anyway (--force)")
        if restarted and launch_h is not None:
            meta["carried_hours"] = restart_h
        else:
            rows = read_metrics(run_dir, warn=lambda m: log(f"warning: {m}"))
            logged_h = max((r.get("elapsed_hours") or 0.0 for r in rows), default=0.0)
            meta["carried_hours"] = max(float(meta.get("elapsed_hours", 0.0)), float(logged_h), restart_h)
        return {"step": step, "meta": meta, "carried_hours": meta["carried_hours"]}
    except PlanError as e:
        return {"error": [e.field, e.problem, e.fix]}


def _bcast(obj: Any, d: Dist) -> Any:
    if not d.on:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


class Trainer:
    """State of one training process: model, optimizer, data, clock, and the loop."""

    def __init__(self, args: argparse.Namespace, clock: Clock) -> None:
        self.args = args
        self.clock = clock
        self.signals = Signals()
        self.signals.install()
        self.plan = load_plan(args.plan)
        self.phash = plan_hash(self.plan)
        self.d = setup_dist(self.plan, args.force)
        if self.d.on:    # the oldest node's launch: a node that waited in the rendezvous was paid for
            age = torch.tensor([self.clock.real()], dtype=torch.float64, device=self.d.device)
            dist.all_reduce(age, op=dist.ReduceOp.MAX)
            self.clock.start_earlier(float(age.item()))
        self.run_dir = Path(args.run_dir)
        self.faults = Faults.from_env()
        self.lock: RunLock | None = None
        self.pending_write: str | None = None   # rank 0: a failed write, shared at the next step's all-reduce
        self.write_error: str | None = None
        self.ckpt_write_failed = False
        self.display = Display(enabled=self.d.is_main, budget_usd=self.plan.budget.usd if self.plan.budget.usd_per_hour > 0 else None,
                               planned_tokens_per_sec=self.plan.throughput.tokens_per_sec)

    def log(self, msg: str) -> None:
        if self.d.is_main:
            self.display.log(msg)

    # ------------------------------------------------------------------ set-up

    def setup(self) -> None:
        plan, d, hyper, tr = self.plan, self.d, self.plan.request.hyper, self.plan.training
        self.device_type = d.device.type
        self.precision = tr.precision
        self.accum = grad_accum_for(plan, d.world_size, self.args.force)
        self.tokens_per_step = tr.device_batch_size * tr.seq_len * self.accum * d.world_size
        self.total_steps = plan.schedule.total_steps
        data_dir = resolve_data_dir(plan, self.args.data, self.args.plan)
        check_data(plan, data_dir)
        self.data_dir = data_dir
        _, train_tok, val_tok = load_data(data_dir)
        self.train = TrainBatches(train_tok, tr.seq_len, tr.device_batch_size, self.accum, d.rank, d.world_size,
                                  hyper.seed, d.device)
        self.val = ValBatches(val_tok, tr.seq_len, tr.device_batch_size, d.rank, d.world_size, hyper.val_tokens, d.device)
        self.val_every = hyper.val_every_steps if self.val.enabled else 0
        if hyper.val_every_steps and not self.val.enabled:
            self.log(f"warning: {data_dir}/val.bin is too small for one window; validation is off")
        escape = check_run_dir_contained(self.run_dir)
        if escape:
            raise PlanError("--run-dir", escape, "remove the link, or pass the real directory as --run-dir")
        busy: list[str] | None = None
        if d.is_main:
            try:
                self.run_dir.mkdir(parents=True, exist_ok=True)
                self.lock = RunLock.acquire(self.run_dir, TRAIN_LOCK, "a training worker")
            except RunDirBusy as e:
                busy = ["--run-dir", str(e), f"wait for that run to end, or stop it (kill -TERM {e.pid} on {e.host}); "
                        "two runs on one run dir would corrupt each other"]
            except OSError as e:
                busy = ["--run-dir", f"{self.run_dir} cannot be created or locked ({e.strerror or e})",
                        "pick another --run-dir"]
        busy = _bcast(busy, d)     # before anything reads, writes or cleans the run dir
        if busy:
            raise PlanError(*busy)

        torch.manual_seed(hyper.seed)
        if self.device_type == "cuda":
            torch.set_float32_matmul_precision("high")   # TF32 for any fp32 matmul left outside autocast
        self.compiled = bool(tr.compile)
        # the model, wrapped for the plan's strategy (runner/parallel.py: ddp, zero1, zero2, fsdp)
        self.par = parallelize(
            tr.strategy, d.world_size, d.device, precision=tr.precision, compile=self.compiled,
            build_model=lambda: build_model(plan, d.device), init=lambda m: m.init_weights(hyper.seed),
            make_meta=lambda: GPT(plan.request.model, loss_chunk_tokens=tr.loss_chunk_tokens,
                                  activation_checkpointing=tr.activation_checkpointing),
            build_optimizer=lambda m: build_optimizer(m, tr.optimizer, hyper.lr, hyper.matrix_lr, hyper.weight_decay,
                                                      tuple(hyper.betas), self.device_type))
        self.raw, self.fwd, self.model, self.opt = self.par.raw, self.par.fwd, self.par.model, self.par.opt
        self.data_fp = data_fingerprints(data_dir) if d.is_main else None
        decision = _bcast(_decide_resume(plan, self.phash, self.run_dir, self.args.resume, self.args.force, self.log,
                                         self.clock, data_dir, self.data_fp) if d.is_main else None, d)
        if "error" in decision:
            raise PlanError(*decision["error"])
        self.start_step = decision["step"] or 0
        self.resume_meta: dict[str, Any] = decision.get("meta") or {}
        ckdir = step_dir(self.run_dir, self.start_step) if decision["step"] is not None else None
        if ckdir is not None:
            self.par.check_format(ckdir)
            try:
                self.par.load_model(ckdir, d.device)
            except PlanError:
                raise                    # refused by torch.load(weights_only=True): it says so itself
            except (RuntimeError, KeyError, TypeError, ValueError) as e:
                raise PlanError(str(ckdir / "model.pt"), f"does not fit this plan's model ({_first_line(e)})",
                                "it is not this plan's checkpoint; use another --run-dir") from None

        # the warmdown follows the deadline (runner/schedule.py); resumed from the checkpoint's projection
        self.sched = DeadlineSchedule.resume(self.resume_meta.get("schedule"), self.total_steps, hyper.warmup_steps,
                                             hyper.warmdown_frac, hyper.decay)
        self.scheds = [torch.optim.lr_scheduler.LambdaLR(o, lambda s: self.sched.multiplier(s)) for o in self.opt.optimizers]
        if ckdir is not None:
            ostate = load_torch(ckdir / "optim_rank0.pt", d.device)
            try:
                if not isinstance(ostate, dict):
                    raise TypeError(f"it holds a {type(ostate).__name__}, not a dict")
                self.par.load_optimizer(ckdir, ostate)
                for s, st in zip(self.scheds, ostate["schedulers"], strict=True):
                    s.load_state_dict(st)
            except PlanError:
                raise                    # a refused DCP .metadata (runner/dcp.py)
            except (RuntimeError, KeyError, TypeError, ValueError, IndexError) as e:
                raise PlanError(str(ckdir / "optim_rank0.pt"), f"does not fit this plan's optimizer ({_first_line(e)})",
                                "it is not this plan's checkpoint; use another --run-dir") from None
            rng = ckdir / f"rng_rank{d.rank}.pt"
            if rng.exists():
                try:
                    set_rng_state(load_torch(rng))
                except PlanError:
                    raise
                except (RuntimeError, KeyError, TypeError, ValueError, IndexError) as e:
                    raise PlanError(str(rng), f"is not an RNG state ({_first_line(e)})",
                                    "it is not this plan's checkpoint; use another --run-dir") from None
            old_data = (self.resume_meta.get("data") or {}).get("data_dir")
            if old_data and Path(old_data).resolve() != data_dir.resolve():
                self.log(f"warning: the checkpoint was trained on {old_data}, this launch reads {data_dir}")
            self.log(f"resumed from {ckdir} (step {self.start_step}, "
                     f"{self.resume_meta['carried_hours'] * 60:.2f} min and "
                     f"${self.resume_meta['carried_hours'] * plan.budget.usd_per_hour:.2f} carried)")

        carried_h = float(decision.get("carried_hours") or 0.0)
        b = plan.budget
        if ckdir is None and carried_h > 0:
            self.log(f"no checkpoint to resume from: starting over, with {carried_h * 60:.2f} min and "
                     f"${carried_h * b.usd_per_hour:.2f} carried from earlier launches")
        self.usd_per_hour = b.usd_per_hour
        self.guard = BudgetGuard(deadline_seconds(plan.request.hours, plan.request.budget_usd, b.usd_per_hour),
                                 carried_s=carried_h * 3600.0, ckpt_bytes=plan.schedule.checkpoint_bytes)
        if self.resume_meta.get("write_seconds") is not None:
            self.guard.observe_checkpoint(float(self.resume_meta["write_seconds"]))
        self.guard.observe_eval(float(self.resume_meta.get("eval_seconds") or 0.0))
        self.ckpt_every_s = plan.schedule.checkpoint_every_minutes * 60.0
        self.last_ckpt_total = self.guard.total(0.0)
        patience = self.resume_meta.get("patience") or {}
        self.best_val = patience.get("best_val_loss")
        self.evals_since_best = int(patience.get("evals_since_best") or 0)
        self.last_val: tuple[int, float] | None = None
        self.last_loss: float | None = None
        self.nth_write = 0
        self.device_name = torch.cuda.get_device_name(d.device) if self.device_type == "cuda" else "cpu"
        seg: int | str = 0
        if d.is_main:
            now = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
            try:
                if (fail := self.faults.file_errno("run_info", 1)) is not None:
                    raise OSError(fail, os.strerror(fail), str(self.run_dir / RUN_INFO))
                seg = update_run_info(self.run_dir, {
                    "plan_hash": self.phash, "plan_path": str(Path(self.args.plan).resolve()),
                    "device": self.device_name, "torch_version": torch.__version__, "world_size": d.world_size,
                    "start_time": now, "data_dir": str(data_dir), "data_fingerprint": self.data_fp,
                }, {"start_time": now, "resumed_from_step": decision["step"], "world_size": d.world_size,
                    "restart_count": restart_count(), "device": self.device_name, "job": launch_job(),
                    "clock_start_unix": self.clock.start_unix, "carried_hours": carried_h,
                    "launch_age_s": self.clock.age})
            except OSError as e:
                seg = io_problem(self.run_dir / RUN_INFO, e)
        seg = _bcast(seg, d)
        if isinstance(seg, str):
            raise RunWriteError(f"{seg}; stopped before the first step (free disk space or fix the run dir, "
                                "then run the same command to resume)")
        self.segment = seg

    # ------------------------------------------------------------------ pieces of the loop

    def total_s(self) -> float:
        """Budget seconds of the whole run so far (carried + this launch)."""
        return self.guard.total(self.clock.budget())

    @torch.no_grad()
    def evaluate(self) -> float:
        t0 = self.clock.budget()
        self.fwd.eval()
        total = torch.zeros((), device=self.d.device, dtype=torch.float32)
        for x, y in self.val:
            with autocast(self.device_type, self.precision):
                total += self.fwd(x, y).float()
        self.fwd.train()
        if self.d.on:
            dist.all_reduce(total)
        val = total.item() / (self.val.n_batches * self.d.world_size)
        self.guard.observe_eval(self.clock.budget() - t0)
        return val

    def _note_val(self, step: int, val: float) -> None:
        self.last_val = (step, val)
        if self.best_val is None or val < self.best_val:
            self.best_val, self.evals_since_best = val, 0
        else:
            self.evals_since_best += 1

    def checkpoint(self, step: int) -> Path:
        """Write a checkpoint of `step` (collective). Runs a validation pass first when enabled
        (for best.json; it does not count towards the patience rule, which sees scheduled evals only)."""
        if self.val_every and (self.last_val is None or self.last_val[0] != step):
            self.last_val = (step, self.evaluate())
        val = self.last_val[1] if self.last_val and self.last_val[0] == step else None
        kind, mine = self.par.fingerprint() or replica_fingerprint(self.raw)   # "shards" under zero2/fsdp
        prints = [mine]
        if self.d.on:
            prints = [None] * self.d.world_size
            dist.all_gather_object(prints, mine)
        agree = len(set(prints)) == 1 if kind != "shards" else None   # sharded ranks hold different bytes
        if agree is False:
            self.log(f"warning: the {self.d.world_size} replicas' parameters differ at step {step}: {prints}")
        self.nth_write += 1
        t0 = self.clock.budget()
        hyper, tr = self.plan.request.hyper, self.plan.training

        def meta() -> dict[str, Any]:
            total = self.total_s()
            return {
                "total_steps": self.total_steps, "elapsed_hours": total / 3600.0,
                "usd_spent": total / 3600.0 * self.usd_per_hour, "plan_hash": self.phash,
                "train_hash": train_hash(self.plan), "plan": plan_doc(self.plan),
                "data": {"position": "step", "step": step, "seed": hyper.seed, "world_size": self.d.world_size,
                         "device_batch_size": tr.device_batch_size, "grad_accum_steps": self.accum,
                         "seq_len": tr.seq_len, "data_dir": str(self.data_dir),
                         "fingerprint": self.data_fp},
                "val_loss": val, "patience": {"best_val_loss": self.best_val, "evals_since_best": self.evals_since_best},
                "write_seconds": max(self.guard.ckpt_s or 0.0, self.clock.budget() - t0), "eval_seconds": self.guard.eval_s,
                "tokens_seen": step * self.tokens_per_step, "segment": self.segment,
                "replicas": {"agree": agree, "kind": kind, "fingerprints": prints},
                "time": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                "torch_version": torch.__version__, "schedule": self.sched.state(),
            }

        self.par.before_checkpoint()   # zero1: gather the optimizer state on rank 0 (collective)
        path = save_checkpoint(
            self.run_dir, step, rank=self.d.rank, world_size=self.d.world_size,
            model_state=self.raw.state_dict, optim_state=lambda: {
                **self.par.optimizer_file_state(), "schedulers": [s.state_dict() for s in self.scheds]},
            shards=self.par.write_shards if self.par.sharded_checkpoint else None,
            meta=meta, faults=self.faults, nth_write=self.nth_write, slow_write=self.clock.simulate_slow_write,
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

    def _flags(self, loss: torch.Tensor, gnorm: torch.Tensor, step: int) -> list[float]:
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
                              float(self.pending_write is not None)], dtype=torch.float64)
        vec = torch.cat([loss.detach().double().reshape(1), gnorm.detach().double().reshape(1).to(loss.device),
                         flags.to(loss.device)])   # float64: the projected step is exact
        if self.d.on:
            dist.all_reduce(vec)
        return vec.tolist()

    def _memory(self) -> tuple[int | None, int | None]:
        if self.device_type != "cuda":
            return None, None
        return torch.cuda.max_memory_allocated(self.d.device), torch.cuda.max_memory_reserved(self.d.device)

    # ------------------------------------------------------------------ the loop

    def run(self) -> int:
        plan, d, hyper = self.plan, self.d, self.plan.request.hyper
        step = self.start_step
        self.last_ckpt_step = step if self.resume_meta else -1
        try:
            metrics = MetricsLog(self.run_dir, enabled=d.is_main, fail=self.faults.file_fault("metrics"))
        except OSError as e:
            self.note_write_error(io_problem(self.run_dir / METRICS, e))
            metrics = MetricsLog(self.run_dir, enabled=False)
        peak = plan.throughput.peak_flops_per_gpu
        reason: str | None = None
        if step >= self.total_steps:
            reason = "total_steps"
        elif step >= self.sched.total or self.guard.should_stop(self.clock.budget()):
            reason = "deadline"
        if reason:
            self.log(f"nothing to do: {reason} already reached at step {step}")
        prev_real, prev_budget = self.clock.real(), self.clock.budget()
        with self.display:
            while reason is None:
                lr = self.opt.param_groups[0]["lr"]
                loss_t, gnorm_t = train_step(self.model, self.opt, self.train.micro_batches(step), self.accum,
                                             self.precision, self.device_type, hyper.grad_clip)
                gnorm_t = full_value(gnorm_t)   # a DTensor under zero2/fsdp
                step += 1
                self.faults.after_step(step, d.rank)
                (loss_sum, gnorm_sum, want_ckpt, want_stop, got_signal, projected,
                 write_failed) = self._flags(loss_t, gnorm_t, step)
                self.sched.apply(step, int(projected))
                if (note := self.sched.announcement(step)) is not None:
                    self.log(note)
                for s in self.scheds:           # the LR of the next step, on the (re)projected schedule
                    s.step()
                real, budget = self.clock.real(), self.clock.budget()
                step_real = real - prev_real
                self.guard.observe_step(budget - prev_budget)
                loss = loss_sum / d.world_size
                val = None
                if self.val_every and step % self.val_every == 0:
                    val = self.evaluate()
                    self._note_val(step, val)
                total_h = self.total_s() / 3600.0
                alloc, reserved = self._memory()
                tps = self.tokens_per_step / step_real if step_real > 0 else 0.0
                row: dict[str, Any] = {
                    "step": step, "total_steps": self.total_steps, "loss": loss, "lr": lr,
                    "grad_norm": gnorm_sum / d.world_size, "tokens_per_sec": tps,
                    "mfu": mfu(tps, plan.model.flops_per_token, d.world_size, peak), "step_seconds": step_real,
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
                if not math.isfinite(loss):
                    reason = "nan"
                elif write_failed:
                    reason = "write_error"      # a run file could not be written (rank 0, at an earlier step)
                elif got_signal:
                    reason = "signal"
                elif want_stop:
                    reason = "deadline"
                elif step >= self.sched.total:   # the plan's count, or the deadline's projection of it
                    reason = "total_steps" if self.sched.total >= self.total_steps else "deadline"
                elif hyper.patience_evals and self.evals_since_best >= hyper.patience_evals:
                    reason = "patience"
                elif want_ckpt and self._checkpoint_or_stop(step) is None:
                    reason = "write_error"
                prev_real, prev_budget = self.clock.real(), self.clock.budget()
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
        try:
            metrics.close()
        except OSError as e:
            self.note_write_error(io_problem(metrics.path, e))
        if self.pending_write is not None and reason != "nan":
            reason = "write_error"      # rank 0 only (a write after the last all-reduce): its exit code counts
        total_h = self.total_s() / 3600.0
        code = {"nan": EXIT_NAN, "write_error": EXIT_WRITE}.get(str(reason), EXIT_OK)
        error = None
        if reason == "nan":
            error = ("the loss is not finite; stopped without a checkpoint "
                     "(lower request.hyper.lr in the plan, or check the data)")
        elif reason == "write_error":
            good = complete_steps(self.run_dir)
            kept = f"step_{good[-1]:08d} is the last checkpoint" if good else "there is no checkpoint yet"
            error = (f"{self.write_error}; stopped at step {step}, {kept} "
                     "(free disk space or fix the run dir, then run the same command to resume)")
        self.error = error
        summary = stop_summary(plan, steps=step, tokens=step * self.tokens_per_step, hours=total_h,
                               usd=total_h * self.usd_per_hour, loss=self.last_loss,
                               val_loss=self.last_val[1] if self.last_val else None)
        if d.is_main:
            stopped = record_stop(self.run_dir, {
                "reason": reason, "step": step, "total_steps": self.total_steps,
                "checkpoint": str(final) if final else None, "elapsed_hours": total_h,
                "usd_spent": total_h * self.usd_per_hour, "segment": self.segment, "job": launch_job(),
                "signals": self.signals.names, "exit_code": code, "error": error,
                "time": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "summary": summary,
            })
            if stopped is not True and code == EXIT_OK:
                code, error = EXIT_WRITE, f"{stopped}; the run itself stopped cleanly ({reason} at step {step})"
                self.error = error
            where = f"; checkpoint {final}" if final else ""
            self.log(f"stopped: {reason} at step {step}/{self.total_steps}, {total_h * 60:.2f} min, "
                     f"${total_h * self.usd_per_hour:.2f}{where}")
            self.display.summary(summary)
            if error:
                print(f"error: {error}", file=sys.stderr, flush=True)
        return code

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


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return (text.splitlines()[0] if text else type(e).__name__)[:200]


def record_stop(run_dir: Path, data: dict[str, Any]) -> bool | str:
    """Write RUN_DIR/stop.json; True, or the problem when that fails too (a full or broken disk)."""
    try:
        write_json(run_dir / STOP, data)
        return True
    except OSError as e:
        return io_problem(run_dir / STOP, e)


ENV_STATUS = "NANOPLAN_STATUS_FILE"
DELIBERATE = (EXIT_USAGE, EXIT_NAN, EXIT_WRITE)


def report_exit(code: int, error: str | None = None) -> int:
    """The process's exit code.

    When `nanoplan run` launched this worker it sets NANOPLAN_STATUS_FILE (one per node):
    local rank 0 writes {"exit_code", "error"} there, and a deliberate failure (bad input, a
    NaN loss, a failed checkpoint write) exits 0. A non-zero exit would make torchrun restart
    into the same failure (--max-restarts) and print its ChildFailedError report; nanoplan run
    exits with the recorded code instead. Without the variable (plain torchrun) the code is
    returned as is.
    """
    status = os.environ.get(ENV_STATUS)
    if not status:
        return code
    if int(os.environ.get("LOCAL_RANK", "0")) == 0:
        try:
            write_json(Path(status), {"exit_code": code, "error": error})
        except OSError:
            return code
    return EXIT_OK if code in DELIBERATE else code


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m runner.train", description=__doc__.splitlines()[0])
    p.add_argument("--plan", required=True, help="plan.json from nanoplan estimate")
    p.add_argument("--run-dir", required=True, help="checkpoints, metrics.jsonl, run_info.json")
    p.add_argument("--data", default=None, help="data directory (default: the plan's data_dir)")
    p.add_argument("--resume", action="store_true", help="require a checkpoint to resume from")
    p.add_argument("--force", action="store_true", help="resume a checkpoint of another plan; run a GPU plan on CPU")
    return p.parse_args(argv)


class HangupSafe:
    """A text stream that drops output once writing to it fails (a closed terminal gives EIO), so that
    a worker whose terminal went away (SIGHUP of `nanoplan run`) still finishes its step and checkpoint."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.broken = False

    def write(self, text: str) -> int:
        if not self.broken:
            try:
                return int(self._inner.write(text))
            except (OSError, ValueError):
                self.broken = True
        return len(text)

    def flush(self) -> None:
        if not self.broken:
            try:
                self._inner.flush()
            except (OSError, ValueError):
                self.broken = True

    def isatty(self) -> bool:
        try:
            return not self.broken and bool(self._inner.isatty())
        except (OSError, ValueError):
            return False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


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
                                             "error": str(e), "job": launch_job(), "signals": [],
                                             "time": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")})
            print(f"error: {e}", file=sys.stderr, flush=True)
        return report_exit(EXIT_WRITE, str(e))
    finally:
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    sys.stdout, sys.stderr = HangupSafe(sys.stdout), HangupSafe(sys.stderr)   # type: ignore[assignment]
    sys.exit(main())
