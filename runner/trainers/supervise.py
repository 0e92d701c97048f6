"""`nanoplan run PLAN` for a plan made for another trainer (nanochat, torchtitan, DeepSpeed): the budget
logic, written once. The trainer's own facts are its adapter's (runner/trainers/nanochat.py, ...).

The launch around it is the runner's (nanoplan/run.py): the run-dir lock, the launch ledger
(RUN_DIR/launches.json) and its heartbeat, all taken before anything is spawned. Then, per attempt:

1. read the run's records (runner/trainers/records.py): the newest complete checkpoint (unfinished ones
   are deleted), the GPU count that wrote it (refused when the trainer cannot reshard), and what earlier
   launches measured: step time, save time, start-up, exit;
2. choose the save cadence K (the plan's cadence in measured steps) and the step count E whose save lands
   before the deadline (runner/trainers/guard.py); E at or below the resume step: nothing to do;
3. spawn the keeper (runner/trainers/keeper.py), which runs the adapter's command with its output in
   RUN_DIR/trainer.log, holds the training lock and keeps the launch's heartbeat;
4. watch: each step line becomes a metrics.jsonl row and the progress display; each new complete
   checkpoint is timed (its save time); the guard stops the trainer (SIGKILL of its tree, through the
   keeper) as soon as its next save could not land before the deadline, so a save in progress is waited
   for and lost work is at most one save interval. A signal (Ctrl-C, SIGTERM, SIGHUP) stops it at once:
   the trainers save on no signal, so the work since the newest complete checkpoint is redone next time;
5. the trainer exits by itself at E (its last save landed): stop.json says total_steps or deadline. A
   crash after some progress is relaunched (--max-restarts times) from the newest complete checkpoint.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from planner.plan import Plan, plan_hash
from planner.startup import fixed_seconds
from runner.clock import _env_float, boottime, deadline_seconds
from runner.display import stop_summary, summary_lines
from runner.launcher import StopRequests, launch_env
from runner.metrics import MetricsLog, mfu
from runner.stop_record import record_stop
from runner.trainers.adapter import Adapter, Launch, clean
from runner.trainers.guard import EXIT_S, Guard
from runner.trainers.keeper import EXIT_STOPPED, die_with_parent, kill_tree
from runner.trainers.records import (
    LOG,
    Segments,
    check_plan,
    check_world,
    checkpoints,
    clean_unfinished,
    final_stop,
    measured,
    median_step,
    now_iso,
    read_info,
)
from runner.trainers.watch import LogTail, Progress

ENV_STARTUP = "NANOPLAN_TRAINER_STARTUP_S"   # the start-up a first launch assumes (seconds; docs/reliability.md)
POLL_S = 0.1
RELAUNCH = -1           # _attempt: the trainer was stopped right after a save, to relaunch it with measured figures


def startup_guess(plan: Plan) -> float:
    """A first launch's start-up before one is measured: NANOPLAN_TRAINER_STARTUP_S, else the plan's own (estimate
    --startup-seconds, or planner/startup.py's assumptions for its kind of machine: start-up and compile warm-up)."""
    set_ = _env_float(ENV_STARTUP, -1.0) if os.environ.get(ENV_STARTUP) else -1.0
    if set_ >= 0:
        return set_
    req = plan.request
    return fixed_seconds(req.profile.kind, 1, req.compile, req.startup_seconds)   # one node: multi-node is refused


def stop_keeper(keeper: subprocess.Popen) -> None:
    """SIGTERM the keeper, which kills the trainer's tree and exits; after 20 s, kill it and the tree ourselves."""
    keeper.send_signal(signal.SIGTERM)
    try:
        keeper.wait(timeout=20)
    except subprocess.TimeoutExpired:
        keeper.kill()
        kill_tree(keeper.pid)
        keeper.wait()


class Supervisor:
    """One `nanoplan run` of another trainer's plan. `t0`: the launch's start (CLOCK_BOOTTIME seconds)."""

    def __init__(self, plan: Plan, plan_path: str, run_dir: Path, adapter: Adapter, trainer_dir: Path | None, *,
                 launch_id: str, t0: float, carried_s: float, stops: StopRequests | None, force: bool = False,
                 resume: bool = False, max_restarts: int = 3, tensorboard: bool = False,
                 say: Callable[[str], None] = print, show_command: Callable[[list[str]], None] | None = None) -> None:
        self.plan, self.plan_path, self.run_dir, self.a = plan, plan_path, run_dir, adapter
        self.trainer_dir, self.launch_id, self.t0, self.carried = trainer_dir, launch_id, t0, carried_s
        self.stops, self.force, self.resume, self.max_restarts = stops, force, resume, max_restarts
        self.tensorboard, self.say, self.show_command = tensorboard, say, show_command
        req = plan.request
        self.deadline = deadline_seconds(req.hours, req.budget_usd, plan.budget.usd_per_hour)
        self.signals: list[str] = []
        self.guessed = True             # the launch's step count and cadence came from the plan and assumptions
        self.calibrated = False         # a relaunch with measured figures was made

    def age(self) -> float:
        return max(0.0, boottime() - self.t0)

    # ------------------------------------------------------------------ deciding a launch
    def decide(self) -> tuple[Launch | None, Guard, str | None]:
        """(the next launch, its guard, why nothing is to be done); refuses bad records (PlanError)."""
        info = read_info(self.run_dir)
        ck = checkpoints(self.a, self.run_dir, self.plan, info)
        check_world(self.a, ck, self.plan, self.run_dir)
        check_plan(info, plan_hash(self.plan), ck, self.run_dir, self.force)
        m = measured(info)
        s = self.plan.schedule
        kind = "gpu" if self.plan.request.profile.kind == "gpu" else "cpu"
        guard = Guard(self.deadline, self.carried, step_s=m.step_s or self.plan.throughput.step_seconds,
                      save_s=m.save_s or Guard.save_fallback(s.checkpoint_bytes,
                                                             self.plan.request.profile.storage_bytes_per_s()[0]),
                      startup_s=m.startup_s if m.startup_s is not None else startup_guess(self.plan),
                      exit_s=m.exit_s if m.exit_s is not None else EXIT_S[kind], save_measured=m.save_s is not None)
        self.guessed = None in (m.step_s, m.save_s, m.startup_s)
        start = ck.newest or 0
        done = final_stop(info, ck.newest)
        if done is not None:
            why = "reached its step count" if done["ended"] == "total_steps" else "stopped at its deadline"
            return None, guard, f"{self.run_dir} {why} at step {ck.newest:,}"
        if start >= s.total_steps:
            return None, guard, f"{self.run_dir} holds the checkpoint of its last step ({start:,})"
        every = guard.save_every(s.checkpoint_every_minutes * 60.0)
        end = guard.end_step(self.age(), start, s.total_steps, every)
        if end <= start:
            need = (f"a start-up ({guard.startup_s:,.1f} s{'' if m.startup_s else ', assumed'}), one step and a save "
                    f"({guard.save_s:,.1f} s{'' if m.save_s else ', assumed'}) do not fit")
            if not self.carried and ck.newest is None:
                from planner.errors import PlanError

                raise PlanError(self.plan_path, f"its budget ({self.deadline or 0:,.1f} s) is too short for "
                                f"{self.a.name}: {need}", f"plan a longer run (or set {ENV_STARTUP} to the start-up "
                                "you know it has)")
            return None, guard, (f"the budget of {self.run_dir} is spent: {self.carried:,.1f} s of its "
                                 f"{self.deadline or 0:,.1f} s were used before this launch, which has taken "
                                 f"{self.age():,.1f} s; {need}")
        launch = Launch(self.plan, self.run_dir, self.trainer_dir, end_step=end, save_every=every,
                        resume_step=ck.newest)
        return launch, guard, None

    def dry_run(self) -> tuple[list[str] | None, str]:
        """The command the next launch would run (None: nothing to do), and a line saying why."""
        launch, _, why = self.decide()
        if launch is None:
            return None, f"nothing to do: {why}"
        return self.a.command(launch), self._about(launch)

    def _about(self, launch: Launch) -> str:
        total = self.plan.schedule.total_steps
        end = f"stops at step {launch.end_step:,}" + ("" if launch.end_step == total else f" of {total:,} (deadline)")
        res = f"resumes from step {launch.resume_step:,}" if launch.resume_step else "starts fresh"
        return f"# {self.a.name} {res}, {end}, saves every {launch.save_every:,} steps"

    # ------------------------------------------------------------------ running
    def run(self) -> int:
        """Launch attempts until the run stops; the exit code of `nanoplan run` (4: a run file not written)."""
        from runner.launcher import io_problem

        try:
            return self._run()
        except OSError as e:
            self.say(f"error: {io_problem(e.filename or self.run_dir, e)} (free disk space or fix the run dir, then "
                     "run the same command)")
            return 4

    def _run(self) -> int:
        if self.tensorboard:      # torch's SummaryWriter: imported now (seconds), not in the watch loop, which times lines
            import torch.utils.tensorboard  # noqa: F401, PLC0415
        attempts = 0
        while True:
            if self.signals:          # between two attempts (a restart, a relaunch): nothing more starts
                newest = checkpoints(self.a, self.run_dir, self.plan, read_info(self.run_dir)).newest or 0
                self.say(f"nanoplan run: got {self.signals[0]}; {self.a.name} is not relaunched; newest complete "
                         f"checkpoint: step {newest:,}")
                self._stop_record("signal", newest, newest, None, 0)
                return 0
            info = read_info(self.run_dir)
            ck = checkpoints(self.a, self.run_dir, self.plan, info)
            check_world(self.a, ck, self.plan, self.run_dir)
            for line in clean_unfinished(self.a, self.run_dir, ck):
                self.say(line)
            launch, guard, why = self.decide()
            if launch is None:
                self.say(f"nothing to do: {why}; nothing was started")
                return 0
            code = self._attempt(launch, guard, attempts, restart=attempts < self.max_restarts)
            if code == RELAUNCH:
                self.calibrated = True
                continue
            if code is not None:
                return code
            attempts += 1
            self.say(f"nanoplan run: restarting {self.a.name} from its newest complete checkpoint "
                     f"(restart {attempts} of {self.max_restarts})")

    def _attempt(self, launch: Launch, guard: Guard, attempt: int, restart: bool) -> int | None:
        """One launch of the trainer: the exit code to end with, or None to restart it (a crash after progress)."""
        a, plan = self.a, self.plan
        a.prepare(launch)
        cmd = a.command(launch)
        log = self.run_dir / LOG
        with open(log, "ab") as f:
            f.write(f"==> {now_iso()} nanoplan run {self.launch_id[:8]} attempt {attempt}: "
                    f"{' '.join(cmd)}\n".encode())
            offset = f.tell()
        seg = Segments(self.run_dir, {"plan_hash": plan_hash(plan), "plan_path": self.plan_path,
                                      "world_size": launch.world, "trainer": a.name,
                                      "checkpoint_dir": str(a.checkpoint_dir(self.run_dir))},
                       {"job": self.launch_id, "attempt": attempt, "resumed_from_step": launch.resume_step,
                        "world_size": launch.world, "carried_hours": (self.carried + self.age()) / 3600,
                        "end_step": launch.end_step, "save_every": launch.save_every, "ended": "killed"})
        if self.show_command is not None:
            self.show_command(cmd)
        self.say(self._about(launch) + f"; its output: {log}")
        env = {**launch_env(plan, run_dir=self.run_dir), **a.env(launch), "PYTHONUNBUFFERED": "1",
               "NANOPLAN_LAUNCH_ID": self.launch_id, "NANOPLAN_LAUNCH_T0": repr(self.t0),
               "NANOPLAN_LAUNCH_PID": str(os.getpid())}
        cwd = str(launch.trainer_dir or Path.cwd())
        if self.stops is not None:
            self.stops.on_signal = self.signals.append
        keeper = subprocess.Popen([sys.executable, "-m", "runner.trainers.keeper", str(self.run_dir), str(log), cwd,
                                   "--", *cmd], env=env, stdin=subprocess.DEVNULL, start_new_session=True,
                                  preexec_fn=die_with_parent(signal.SIGTERM))  # noqa: PLW1509 - only prctl
        watch = _Watch(self, launch, guard, seg, LogTail(log, offset), calibrate=self.guessed and not self.calibrated)
        try:
            reason = watch.loop(keeper)
        finally:
            if keeper.poll() is None:
                stop_keeper(keeper)
            watch.close()
        return self._ended(launch, watch, reason, keeper.returncode, restart)

    def _ended(self, launch: Launch, w: _Watch, reason: str, rc: int, restart: bool) -> int | None:
        """Record how the attempt ended; the exit code, or None to restart."""
        total = self.plan.schedule.total_steps
        if reason == "exited":
            if rc == 0 and w.saved >= launch.end_step:
                reason = "total_steps" if launch.end_step == total else "deadline"
                if w.saved_at is not None:
                    w.seg.update(exit_seconds=round(time.monotonic() - w.saved_at, 3))
            else:
                reason = "ended" if rc == 0 else "killed" if rc == EXIT_STOPPED else "crash"
        w.seg.update(ended=reason, last_step=w.done, last_saved=w.saved)
        if reason == "relaunch":
            return RELAUNCH
        if reason == "crash":
            newest = f"step {w.saved:,}" if w.saved else "none"
            self.say(f"error: {self.a.name} exited with code {rc} at step {w.done:,}; its newest complete checkpoint "
                     f"is {newest}; its last lines ({self.run_dir / LOG}):")
            for x in w.tail[-12:]:
                self.say(f"  {x}")
            if restart and w.done > (launch.resume_step or 0) and not self.signals:
                return None
        elif reason == "ended":
            self.say(f"warning: {self.a.name} exited by itself at step {w.done:,}, before its step count "
                     f"{launch.end_step:,} (see {self.run_dir / LOG})")
        self._stop_record(reason, w.saved, w.done, w.loss, rc)
        return 0 if reason in ("total_steps", "deadline", "signal", "ended") else rc or 1

    def _stop_record(self, reason: str, saved: int, done: int, loss: float | None, rc: int) -> None:
        plan = self.plan
        hours = (self.carried + self.age()) / 3600
        s = stop_summary(plan, steps=saved, tokens=saved * plan.schedule.tokens_per_step, hours=hours,
                         usd=hours * plan.budget.usd_per_hour, loss=loss, val_loss=None)
        ok = record_stop(self.run_dir, {"reason": reason, "step": saved, "steps_done": done, "trainer": self.a.name,
                                        "exit_code": rc, "job": self.launch_id, "signals": self.signals,
                                        "elapsed_hours": hours, "time": now_iso(), "summary": s})
        if ok is not True:
            self.say(f"warning: {ok}")
        if reason in ("total_steps", "deadline", "signal"):
            for line in summary_lines(s):
                self.say(line)


class _Watch:
    """One attempt's watch loop: step lines, checkpoints, the guard, signals."""

    def __init__(self, sup: Supervisor, launch: Launch, guard: Guard, seg: Segments, tail: LogTail,
                 calibrate: bool) -> None:
        self.sup, self.launch, self.guard, self.seg, self.log = sup, launch, guard, seg, tail
        self.calibrate = calibrate
        self.t_spawn = time.monotonic()
        self.done = self.saved = launch.resume_step or 0
        self.line_at: dict[int, float] = {}
        self.first_line: float | None = None
        self.first_done: int | None = None      # the step of the first line
        self.saving_s = 0.0                     # seconds of this launch's saves since then
        self.saved_at: float | None = None
        self.loss: float | None = None
        self.intervals: list[float] = []
        self.tail: list[str] = []
        p = sup.plan
        self.metrics = MetricsLog(sup.run_dir, tensorboard=sup.tensorboard or None)
        self.progress = Progress(sup.a.name, p.throughput.tokens_per_sec,
                                 p.budget.usd if p.budget.usd_per_hour > 0 else None).__enter__()
        self._next_check = 0.0
        self.relaunch: tuple[int, int] | None = None

    def close(self) -> None:
        self.metrics.close()
        self.progress.__exit__(None, None, None)

    def loop(self, keeper: subprocess.Popen) -> str:
        """Watch until the keeper exits ("exited") or the trainer is stopped ("deadline", "signal", "relaunch")."""
        while True:
            self._read()
            self._check_saves()
            if self.sup.signals:
                self._stop(keeper, f"got {self.sup.signals[0]}; stopping {self.sup.a.name} now (it saves on no signal)")
                return "signal"
            if keeper.poll() is not None:
                self._read()
                self._check_saves(force=True)
                return "exited"
            age = self.sup.age()
            starting = None if self.first_line is not None else time.monotonic() - self.t_spawn
            if self.guard.must_stop(age, done=self.done, saved=self.saved, every=self.launch.save_every,
                                    end=self.launch.end_step, starting_s=starting):
                self._stop(keeper, "its next save could not land before the deadline; stopped "
                           f"{self.sup.a.name} at step {self.done:,}")
                return "deadline"
            if self.relaunch is not None:
                g = self.guard
                self._stop(keeper, f"measured {g.startup_s:.3g} s of start-up, {g.per_step:.3g} s a step and "
                           f"{g.save_s:.3g} s a save, which change its step count or cadence: relaunching "
                           f"{self.sup.a.name} with them")
                return "relaunch"
            time.sleep(POLL_S)

    def _stop(self, keeper: subprocess.Popen, why: str) -> None:
        stop_keeper(keeper)
        self._check_saves(force=True)
        lost = f"; steps {self.saved + 1:,}-{self.done:,} are redone next time" if self.done > self.saved else ""
        self.sup.say(f"nanoplan run: {why}; newest complete checkpoint: step {self.saved:,}{lost}")

    def _read(self) -> None:
        """New step lines, all timed at this read: lines that came together (a slow read) share their interval."""
        events = []
        for raw in self.log.lines():
            line = clean(raw)
            self.tail = (self.tail + [line])[-40:]
            ev = self.sup.a.parse(line, self.launch.world)
            if ev is not None and ev.step > (events[-1].step if events else self.done):
                events.append(ev)
        if not events:
            return
        now = time.monotonic()
        if self.first_line is None:
            self.first_line = now
            self.guard.startup_s = now - self.t_spawn
            self.seg.update(startup_seconds=round(now - self.t_spawn, 3))
        prev, k = self.line_at.get(self.done), self.launch.save_every
        last = events[-1].step
        interval = (now - prev) / (last - self.done) if prev is not None else None
        resume = self.launch.resume_step or 0
        if interval is not None and not any(s % k == 0 and s > resume for s in range(self.done, last)):
            self.guard.observe_step(interval)       # not across a save: the guard counts saves on their own
            self.intervals.append(interval)
        for ev in events:
            self._row(ev.step, ev.step - self.done, ev.loss, ev.tokens_per_sec, ev.lr, interval)
            self.done, self.line_at[ev.step] = ev.step, now
        if self.first_done is None:
            self.first_done = events[0].step
        elif last - self.first_done >= 3:     # the mean over the launch: pauses between steps in, saves out
            self.guard.mean_s = max(0.0, now - self.first_line - self.saving_s) / (last - self.first_done)
        if self.intervals and len(self.intervals) % 10 == 1:
            self.seg.update(step_seconds=round(median_step(self.intervals) or 0, 6) or None,
                            mean_step_seconds=round(self.guard.mean_s, 6) or None)

    def _row(self, step: int, delta: int, loss: float | None, tps: float | None, lr: float | None,
             interval: float | None) -> None:
        """One metrics.jsonl row (and the progress display) for a step line."""
        sup, p = self.sup, self.sup.plan
        if loss is not None:
            self.loss = loss
        tokens = p.schedule.tokens_per_step
        if tps is None and interval:
            tps = tokens / interval
        age = sup.age()
        hours = (sup.carried + age) / 3600
        row: dict[str, Any] = {
            "step": step, "total_steps": p.schedule.total_steps, "end_step": self.launch.end_step,
            "save_every": self.launch.save_every, "loss": loss, "lr": lr, "tokens_per_sec": tps,
            "mfu": mfu(tps, p.model.flops_per_token, self.launch.world, p.throughput.peak_flops_per_gpu) if tps else None,
            "step_seconds": interval, "elapsed_hours": hours, "usd_spent": hours * p.budget.usd_per_hour,
            "tokens_seen": step * tokens, "segment": self.seg.number, "world_size": self.launch.world,
            "device": "cpu" if p.request.profile.kind == "cpu" else "cuda", "compiled": p.request.compile,
            "trainer": sup.a.name, "saved": self.saved,
            "seconds_to_stop": self.guard.seconds_to_end(age, step, self.launch.end_step, self.launch.save_every)}
        self.metrics.write(row)
        self.progress.update(row, tokens * delta, interval * delta if interval else 0.0)

    def _check_saves(self, force: bool = False) -> None:
        """Each save that completed since the last look, timed from its step's line to the moment its files are
        all there; looked for every poll while one is due, else every second."""
        now = time.monotonic()
        k, end = self.launch.save_every, self.launch.end_step
        due = self.done >= end > self.saved or (self.done // k) * k > self.saved
        if not force and not due and now < self._next_check:
            return
        self._next_check = now + 1.0
        a, run_dir = self.sup.a, self.sup.run_dir
        for s in (s for s in a.steps(run_dir) if self.saved < s <= self.done):
            if a.problem(run_dir, s, self.launch.world) is not None:
                continue
            took = now - self.line_at[s] if s in self.line_at else None
            if took is not None:
                self.guard.observe_save(took)
                self.saving_s += took
            self.saved, self.saved_at = s, now
            self.seg.update(last_saved=s, step_seconds=round(median_step(self.intervals) or 0, 6) or None,
                            mean_step_seconds=round(self.guard.mean_s, 6) or None,
                            save_seconds=max(self.seg.seg.get("save_seconds") or 0.0, round(took or 0.0, 3)) or None)
            self.progress.say(f"saved step {s:,}" + (f" ({took:.1f} s)" if took is not None else ""))
            if self.calibrate and s < end and self.first_line is not None:
                self.calibrate = False       # once: right after the first save, with this launch's figures
                self.relaunch = self.guard.relaunch(self.sup.age(), saved=s, end=end, every=k,
                                                    total=self.sup.plan.schedule.total_steps,
                                                    cadence_s=self.sup.plan.schedule.checkpoint_every_minutes * 60)


__all__ = ["EXIT_STOPPED", "Supervisor", "startup_guess"]
