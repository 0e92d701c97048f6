"""The deadline-following LR schedule (runner/schedule.py): projection maths and re-anchoring."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import pytest

from runner.clock import BudgetGuard
from runner.schedule import (
    MIN_INTERVALS,
    SKIP_INTERVALS,
    DeadlineSchedule,
    Timing,
    lr_multiplier,
    overhead_s,
    project_final_step,
)


@dataclass
class Sim:
    """The trainer's loop in budget seconds: step, stop test, scheduled eval, periodic checkpoint."""

    deadline: float
    reserve: float
    step_s: float
    margin: float = 0.0
    every: float = 0.0
    ckpt_cost: float = 0.0
    val_every: int = 0
    eval_s: float = 0.0
    t: float = 0.0
    last: float = 0.0
    k: int = 0

    def advance(self) -> bool:
        """One iteration; True when the guard stops after this step."""
        self.t += self.step_s
        self.k += 1
        want_ckpt = self.every > 0 and self.t - self.last >= self.every
        if self.t + 2 * self.margin + self.reserve > self.deadline:
            return True
        if self.val_every and self.k % self.val_every == 0:
            self.t += self.eval_s
        if want_ckpt:
            self.t += self.ckpt_cost
            self.last = self.t
        return False

    def timing(self) -> Timing:
        return Timing(now_s=self.t, deadline_s=self.deadline, reserve_s=self.reserve, step_s=self.step_s,
                      margin_s=self.margin, ckpt_every_s=self.every, since_ckpt_s=self.t - self.last,
                      ckpt_cost_s=self.ckpt_cost, val_every=self.val_every, eval_s=self.eval_s)


def final_step(sim: Sim) -> int:
    while not sim.advance():
        pass
    return sim.k


def test_no_deadline_or_no_measurement_keeps_the_plan() -> None:
    t = Timing(now_s=10.0, deadline_s=None, reserve_s=1.0, step_s=1.0)
    assert project_final_step(5, 100, t) == 100
    assert project_final_step(5, 100, Timing(now_s=0.0, deadline_s=50.0, reserve_s=0.0, step_s=0.0)) == 100


def test_simple_projection_counts_the_steps_left() -> None:
    # 85 s left after the reserve: step 10 is done, steps 11..96 follow (the 86th is taken at 85 s in)
    t = Timing(now_s=10.0, deadline_s=100.0, reserve_s=5.0, step_s=1.0)
    assert project_final_step(10, 10_000, t) == 96
    assert project_final_step(10, 50, t) == 50                     # never beyond the plan's count
    assert project_final_step(10, 10_000, Timing(now_s=99.0, deadline_s=100.0, reserve_s=5.0, step_s=1.0)) == 10
    # the guard's two-step margin and the eval passes are paid for
    assert project_final_step(10, 10_000, Timing(now_s=10.0, deadline_s=100.0, reserve_s=5.0, step_s=1.0,
                                                  margin_s=1.0)) == 94
    assert overhead_s(10, 20, Timing(0, 100, 0, 1.0, val_every=10, eval_s=3.0)) == 6.0   # evals at 10 and 20


@pytest.mark.parametrize("step_s,margin,every,ckpt_cost,val_every,eval_s,at", [
    (1.0, 0.0, 0.0, 0.0, 0, 0.0, 5),
    (1.0, 1.2, 0.0, 0.0, 0, 0.0, 50),
    (0.7, 0.9, 60.0, 4.0, 0, 0.0, 20),
    (0.7, 0.9, 60.0, 4.0, 25, 2.5, 20),
    (2.3, 2.5, 300.0, 20.0, 100, 9.0, 300),
    (0.05, 0.06, 3.0, 0.4, 40, 0.3, 10),
])
def test_projection_matches_the_guard_it_models(step_s, margin, every, ckpt_cost, val_every, eval_s, at) -> None:
    """The projected step is where a simulation of the trainer's loop stops, within 1% (the checkpoint
    cadence is counted in whole intervals)."""
    kw = dict(deadline=3600.0, reserve=30.0, step_s=step_s, margin=margin, every=every, ckpt_cost=ckpt_cost,
              val_every=val_every, eval_s=eval_s)
    sim = Sim(**kw)
    for _ in range(at):
        assert not sim.advance()
    projected = project_final_step(sim.k, 10**9, sim.timing())
    actual = final_step(sim)
    assert abs(projected - actual) <= max(1, 0.01 * actual), (projected, actual)


def test_projection_is_deterministic_and_monotone_in_time_left() -> None:
    base = dict(deadline_s=1000.0, reserve_s=10.0, step_s=1.5, margin_s=1.5, ckpt_every_s=100.0, ckpt_cost_s=5.0,
                val_every=20, eval_s=2.0)
    outs = [project_final_step(40, 10**6, Timing(now_s=now, since_ckpt_s=now % 100, **base))
            for now in range(60, 990, 10)]
    again = [project_final_step(40, 10**6, Timing(now_s=now, since_ckpt_s=now % 100, **base))
             for now in range(60, 990, 10)]
    assert outs == again
    assert all(a >= b for a, b in itertools.pairwise(outs))


def mults(s: DeadlineSchedule, upto: int) -> list[float]:
    return [s.multiplier(k) for k in range(upto)]


def test_unprojected_schedule_is_the_plans() -> None:
    s = DeadlineSchedule(100, 10, 0.2, "linear")
    assert mults(s, 100) == [lr_multiplier(k, 100, 10, 0.2, "linear") for k in range(100)]


def test_projection_in_the_flat_phase_moves_the_warmdown() -> None:
    s = DeadlineSchedule(1000, 0, 0.2, "linear")
    assert s.apply(100, 500)
    assert s.anchor_step is None and s.total == 500
    assert mults(s, 500) == [lr_multiplier(k, 500, 0, 0.2, "linear") for k in range(500)]
    assert s.multiplier(499) == pytest.approx(0.01)


def test_projection_inside_the_new_warmdown_reanchors_without_a_jump() -> None:
    s = DeadlineSchedule(1000, 0, 0.2, "linear")
    assert s.apply(450, 500)              # the new warmdown would have begun at 400: decay from 1.0 at 450
    assert s.anchor_step == 450 and s.anchor_mult == 1.0
    assert s.multiplier(450) == 1.0 and s.multiplier(475) == pytest.approx(0.5) and s.multiplier(499) == pytest.approx(0.02)
    before = s.multiplier(480)
    assert s.apply(480, 490)              # slower still: from the current value to 0 at 490
    assert s.multiplier(480) == pytest.approx(before)
    assert s.multiplier(489) == pytest.approx(before / 10)


@pytest.mark.parametrize("decay", ["linear", "cosine"])
def test_random_reprojections_keep_the_lr_continuous_monotone_and_ending_near_zero(decay) -> None:
    import random

    rng = random.Random(7)
    s = DeadlineSchedule(5000, 20, 0.2, decay)
    prev = s.multiplier(20)
    step = 20
    while step < s.total:
        if step % 37 == 0:
            at = s.multiplier(step)
            # a projection's error is a fraction of the time left: it shrinks towards the end
            s.apply(step, step + max(1, round((s.total - step) * rng.uniform(0.9, 1.05))))
            assert s.multiplier(step) == pytest.approx(at)         # no jump where the projection lands
        m = s.multiplier(step)
        assert m <= prev + 1e-12
        prev = m
        step += 1
    assert s.multiplier(s.total - 1) <= 0.1


def test_no_warmdown_means_no_decay() -> None:
    s = DeadlineSchedule(1000, 0, 0.0, "linear")
    s.apply(500, 600)
    assert s.total == 600 and s.multiplier(599) == 1.0


def test_state_round_trips_and_another_plans_state_is_ignored() -> None:
    s = DeadlineSchedule(1000, 5, 0.2, "cosine")
    s.apply(300, 700)
    s.apply(650, 680)
    r = DeadlineSchedule.resume(s.state(), 1000, 5, 0.2, "cosine")
    assert r.state() == s.state() and mults(r, 700) == mults(s, 700)
    assert DeadlineSchedule.resume(s.state(), 999, 5, 0.2, "cosine").total == 999
    assert DeadlineSchedule.resume(None, 1000, 5, 0.2, "cosine").total == 1000
    assert DeadlineSchedule.resume({**s.state(), "total": "x"}, 1000, 5, 0.2, "cosine").total == 1000
    assert DeadlineSchedule.resume({**s.state(), "anchor_mult": 3.0}, 1000, 5, 0.2, "cosine").total == 1000


def test_propose_waits_for_measurements_then_follows_the_guard() -> None:
    g = BudgetGuard(deadline_s=100.0, ckpt_bytes=0)
    g.observe_checkpoint(1.0)
    g.observe_step(0.5)
    s = DeadlineSchedule(10_000, 0, 0.2, "linear")
    out = []
    for k in range(1, SKIP_INTERVALS + MIN_INTERVALS + 3):
        out.append(s.propose(k, 0.5 * k, g, ckpt_every_s=0.0, last_ckpt_s=0.0, val_every=0))
    n_wait = SKIP_INTERVALS + MIN_INTERVALS
    assert out[:n_wait] == [10_000] * n_wait           # not enough intervals yet
    k = n_wait + 1
    # 100 s deadline, reserve 1.5 × 1 s, margin 2 × 0.5 s, 0.5 s per step
    expect = project_final_step(k, 10_000, Timing(now_s=0.5 * k, deadline_s=100.0, reserve_s=1.5, step_s=0.5,
                                                  margin_s=0.5))
    assert out[n_wait] == expect and 180 < expect < 200
    s2 = DeadlineSchedule(10_000, 0, 0.2, "linear")
    again = [s2.propose(k, 0.5 * k, g, ckpt_every_s=0.0, last_ckpt_s=0.0, val_every=0) for k in range(1, len(out) + 1)]
    assert again == out                                 # deterministic given the measured times


def test_announcement_only_for_notable_changes() -> None:
    s = DeadlineSchedule(1000, 0, 0.2, "linear")
    assert s.announcement(1) is None
    s.apply(10, 600)
    assert "600 of the planned 1,000" in (s.announcement(10) or "")
    s.apply(20, 590)
    assert s.announcement(20) is None                 # moved by less than 10%
    s.apply(30, 500)
    assert s.announcement(30) is None                 # 10% of the run has not passed since the last line
    assert "500 of the planned" in (s.announcement(60) or "")


# ---------------------------------------------------------------------------- real runs (2 gloo processes)

HOURS = 0.004      # 14.4 s: an optimistic --mfu plans thousands of steps, the machine does a few hundred


def optimistic_plan(tmp_path, tiny_data, hours: float = HOURS, every_min: float = 0.03):  # noqa: ANN001, ANN201
    from planner.profiles import find_profile
    from tests.conftest import make_tiny_plan

    # 8x the CPU's measured peak and a link that hides nothing (the fitted overlap shows all of the gloo
    # all-reduce): the plan promises far more steps than any CI machine can reach
    fast = find_profile("CPU").model_copy(update={**{f: 1.5 for f in ("bf16_tflops", "tf32_tflops", "fp32_tflops")},
                                                  "intra_node_gb_s": 1000.0})
    return make_tiny_plan(tmp_path / "plan.json", tiny_data, steps=None, hours=hours, mfu=0.9, profile=fast,
                          checkpoint_every_minutes=every_min, hyper={"val_every_steps": 50, "warmdown_frac": 0.3})


def check_schedule_ended_at_the_stop(run) -> list[dict]:  # noqa: ANN001
    """The run stopped at its deadline with the warmdown done: last LR <= 10% of the peak, last step
    within a few steps of the projection, the LR never rising after its peak (one warmdown)."""
    import json

    from runner.metrics import last_by_step, read_metrics

    rows = [r for _, r in sorted(last_by_step(read_metrics(run)).items())]
    stop = json.loads((run / "stop.json").read_text())
    last = rows[-1]
    peak = 3e-3                                        # tests.conftest.make_tiny_plan's lr
    assert stop["reason"] == "deadline" and stop["step"] == last["step"]
    assert last["total_steps"] >= 5 * last["step"], (last["total_steps"], last["step"])   # far fewer than planned
    assert last["lr"] <= 0.1 * peak, [(r["step"], r["lr"]) for r in rows[-10:]]
    assert abs(last["step"] - last["projected_steps"]) <= 3, (last["step"], last["projected_steps"])
    lrs = [r["lr"] for r in rows]
    assert all(b <= a * (1 + 1e-9) for a, b in itertools.pairwise(lrs)), "the LR rose again"
    s = stop["summary"]
    assert s["achieved"]["steps"] == last["step"] and s["planned"]["steps"] == last["total_steps"]
    assert s["final_loss"] == pytest.approx(last["loss"])
    return rows


@pytest.mark.slow
def test_optimistic_plan_finishes_its_warmdown_at_the_auto_stop(tmp_path, tiny_data) -> None:
    from tests.conftest import torchrun

    plan = optimistic_plan(tmp_path, tiny_data)
    r = torchrun(plan, tmp_path / "run", timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = check_schedule_ended_at_the_stop(tmp_path / "run")
    assert "schedule: the deadline allows" in r.stdout and "summary" in r.stdout
    assert rows[0]["projected_steps"] == rows[0]["total_steps"]       # before the first measurement: the plan's


@pytest.mark.slow
def test_killed_and_resumed_run_ends_its_schedule_once(tmp_path, tiny_data) -> None:
    import os
    import signal
    import subprocess
    import time

    from runner.checkpoint_layout import complete_steps, step_dir
    from runner.checkpoint_meta import read_meta
    from runner.launcher import child_pids
    from runner.metrics import read_metrics
    from tests.conftest import REPO, runner_env, torchrun, torchrun_cmd

    plan = optimistic_plan(tmp_path, tiny_data, hours=0.004, every_min=0.02)
    run = tmp_path / "run"
    proc = subprocess.Popen(torchrun_cmd(plan, run), cwd=REPO, env=runner_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    killed_at = None
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None and killed_at is None:
            done = complete_steps(run)
            meta = (read_meta(step_dir(run, done[-1])) or {}) if done else {}
            saved = meta.get("schedule") or {}
            # a checkpoint carries a projection, well before the end
            if saved and saved["total"] < saved["planned_total"] and saved["total"] - done[-1] > 20:
                for pid in [*child_pids(proc.pid), proc.pid]:
                    os.kill(pid, signal.SIGKILL)
                killed_at = done[-1]
            time.sleep(0.02)
    finally:
        if proc.poll() is None and killed_at is None:
            for pid in [*child_pids(proc.pid), proc.pid]:
                os.kill(pid, signal.SIGKILL)
        proc.wait(timeout=30)
    assert killed_at is not None, "the run ended before it could be killed"
    resumed_from = complete_steps(run)[-1]
    saved = read_meta(step_dir(run, resumed_from))["schedule"]
    assert saved["total"] < saved["planned_total"]

    r = torchrun(plan, run, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    check_schedule_ended_at_the_stop(run)
    resumed = [x for x in read_metrics(run) if x["segment"] == 1]
    assert resumed[0]["step"] == resumed_from + 1
    assert resumed[0]["projected_steps"] == saved["total"]        # continues from the saved projection
