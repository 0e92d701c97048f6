"""Budget clock, deadline guard and the LR schedule: exact arithmetic."""

from __future__ import annotations

import math

import pytest

from runner.clock import CKPT_FALLBACK_MIN_S, BudgetGuard, Clock, deadline_seconds, restart_carried_s
from runner.schedule import lr_multiplier


class FakeTime:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_clock_scales_budget_time_not_real_time() -> None:
    ft = FakeTime()
    c = Clock(scale=60.0, time_fn=ft)
    ft.t += 2.5
    assert c.real() == 2.5 and c.budget() == 150.0


def test_clock_from_env(monkeypatch) -> None:
    monkeypatch.setenv("NANOPLAN_TIME_SCALE", "12")
    monkeypatch.setenv("NANOPLAN_CKPT_DELAY_S", "0.5")
    c = Clock.from_env()
    assert c.scale == 12 and c.ckpt_delay_s == 0.5
    monkeypatch.setenv("NANOPLAN_TIME_SCALE", "fast")
    with pytest.raises(ValueError, match="NANOPLAN_TIME_SCALE"):
        Clock.from_env()


def test_deadline_is_the_requested_hours_or_dollars() -> None:
    assert deadline_seconds(2.0, None, 40.0) == 2.0 * 3600         # --hours 2
    assert deadline_seconds(None, 100.0, 50.0) == 2.0 * 3600       # --budget 100 at $50/h
    assert deadline_seconds(3.0, 100.0, 50.0) == 2.0 * 3600        # both: the earlier
    assert deadline_seconds(0.01, None, 0.0) == 36.0               # free CPU: hours only
    assert deadline_seconds(None, 100.0, 0.0) is None              # $0/h: dollars cannot bound it
    assert deadline_seconds(None, None, 20.0) is None              # --steps: no deadline


def test_guard_reserves_two_steps_and_the_checkpoint() -> None:
    g = BudgetGuard(deadline_s=100.0, carried_s=10.0)
    assert g.checkpoint_estimate() == CKPT_FALLBACK_MIN_S   # nothing measured yet
    g.observe_step(2.0)
    g.observe_checkpoint(4.0)
    g.observe_eval(2.0)
    assert g.reserve_s() == 1.5 * (4.0 + 2.0)
    # carried 10 + run + 2 steps (4) + reserve 9 must stay <= 100
    assert not g.should_stop(77.0)
    assert g.should_stop(77.01)
    assert g.seconds_to_stop(70.0) == pytest.approx(100 - 9 - 2 - 80)


def test_guard_step_estimate_follows_two_slow_steps_of_three_not_one() -> None:
    """The next step's estimate is the median of the last three (the slower of the first two): a stall is
    an outlier, a machine that got slower shows it in two steps of three (issue 22 #3)."""
    g = BudgetGuard(deadline_s=None)
    g.observe_step(10.0)
    assert g.step_s == 10.0
    g.observe_step(1.0)
    assert g.step_s == 10.0                  # two steps: the slower
    g.observe_step(1.0)
    assert g.step_s == 1.0
    g.observe_step(60.0)
    assert g.step_s == 1.0                   # one stalled step is not a forecast
    g.observe_step(20.0)
    assert g.step_s == 20.0                  # two slow steps of three are
    assert not g.should_stop(1e9) and g.seconds_to_stop(5) is None


def test_guard_falls_back_to_bytes_for_big_checkpoints() -> None:
    assert BudgetGuard(deadline_s=1.0, ckpt_bytes=int(5e9)).checkpoint_estimate() == pytest.approx(100.0)


def _simulate(deadline: float, *, count_due: bool, step: float = 1.0, ckpt: float = 4.0, every: float = 10.0) -> float:
    """The budget seconds a run ends at: fixed step and write times, a periodic checkpoint, the final one."""
    g = BudgetGuard(deadline_s=deadline)
    g.observe_checkpoint(ckpt)
    t = last = 0.0
    while True:
        t += step
        g.observe_step(step)
        due = t - last >= every
        if g.should_stop(t, checkpoint_due=due and count_due):
            return t + ckpt                       # the final checkpoint
        if due:
            t += ckpt
            last = t


def test_guard_counts_the_periodic_checkpoint_due_now() -> None:
    """Not counting a checkpoint due at this step lets the final one pass the deadline."""
    deadlines = [40 + 0.25 * i for i in range(200)]
    assert any(_simulate(d, count_due=False) > d for d in deadlines)
    assert all(d - 10 < _simulate(d, count_due=True) <= d for d in deadlines)
    g = BudgetGuard(deadline_s=100.0)
    g.observe_step(2.0)
    g.observe_checkpoint(4.0)
    g.observe_eval(2.0)
    assert g.due_s() == 0.0 and g.due_s(eval_due=True) == 3.0 and g.due_s(True, True) == g.reserve_s() == 9.0
    assert not g.should_stop(86.0) and g.should_stop(86.0, eval_due=True) and g.should_stop(86.0, checkpoint_due=True)
    assert not g.should_stop(84.0, eval_due=True) and g.should_stop(79.0, checkpoint_due=True)


def test_a_torchrun_restart_carries_what_its_launch_carried_in() -> None:
    """A restart carries its launch's carry (runner.train adds the launch's age on CLOCK_BOOTTIME);
    no wall-clock difference is involved (an NTP step cannot charge anything)."""
    seg0 = {"job": "j1", "restart_count": 0, "carried_hours": 0.5, "clock_start_unix": 1000.0}
    assert restart_carried_s([seg0], "j1", 1) == 1800.0
    assert restart_carried_s([seg0], "j1", 2) == 1800.0                  # attempt 1 died before it was recorded
    assert restart_carried_s([{**seg0, "clock_start_unix": 1e12}], "j1", 1) == 1800.0   # a stepped wall clock
    assert restart_carried_s([seg0], "j1", 0) is None                    # a first launch
    assert restart_carried_s([seg0], "j2", 1) is None                    # another job
    assert restart_carried_s([{**seg0, "restart_count": 1}], "j1", 1) is None
    assert restart_carried_s([{"job": "j1", "restart_count": 0}], "j1", 1) is None   # an older record
    assert restart_carried_s([{**seg0, "carried_hours": float("nan")}], "j1", 1) is None
    seg1 = {**seg0, "restart_count": 1, "carried_hours": 0.9}   # a second restart: the launch's carry, once
    assert restart_carried_s([{"job": "j0", "restart_count": 0, "carried_hours": 0.1}, seg0, seg1], "j1", 2) == 1800.0


def test_the_clock_starts_when_the_launch_started() -> None:
    """NANOPLAN_LAUNCH_T0 (the launcher's process start on CLOCK_BOOTTIME) moves the origin back:
    the start-up counts; a later rendezvous report of an older node moves it back further, never forward."""
    from runner.clock import ENV_LAUNCH_T0, boottime, launch_age_s, process_start_boottime

    now = boottime()
    assert 4.9 < launch_age_s({ENV_LAUNCH_T0: repr(now - 5.0)}) < 6.0
    assert launch_age_s({ENV_LAUNCH_T0: "garbage"}) == 0.0 and launch_age_s({}) == 0.0
    assert launch_age_s({ENV_LAUNCH_T0: repr(now + 100)}) == 0.0          # never negative
    started = process_start_boottime()
    assert started is None or 0 <= now - started < 1e6
    ft = FakeTime()
    c = Clock(scale=2.0, time_fn=ft, age_s=3.0)
    assert c.real() == 3.0 and c.budget() == 3.0          # the start-up counts 1:1, also under a time scale
    ft.t += 1.0
    assert c.real() == 4.0 and c.budget() == 5.0
    c.start_earlier(10.0)
    assert c.real() == 10.0 and c.budget() == 11.0
    c.start_earlier(4.0)
    assert c.real() == 10.0


def test_lr_schedule_warmup_flat_warmdown() -> None:
    total, warm = 100, 10
    assert lr_multiplier(0, total, warm, 0.2, "linear") == pytest.approx(0.1)
    assert lr_multiplier(9, total, warm, 0.2, "linear") == 1.0
    assert lr_multiplier(79, total, warm, 0.2, "linear") == 1.0
    assert lr_multiplier(80, total, warm, 0.2, "linear") == 1.0
    assert lr_multiplier(90, total, warm, 0.2, "linear") == pytest.approx(0.5)
    assert lr_multiplier(99, total, warm, 0.2, "linear") == pytest.approx(0.05)
    assert lr_multiplier(90, total, 0, 0.2, "cosine") == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.5)))
    assert lr_multiplier(50, total, 0, 1.0, "cosine") == pytest.approx(0.5)
    assert lr_multiplier(50, total, 0, 0.0, "linear") == 1.0


ROW = {"step": 12, "total_steps": 100, "loss": 2.5, "tokens_per_sec": 12345.0, "mfu": 0.412, "usd_spent": 0.5,
       "elapsed_hours": 0.5, "seconds_to_stop": 3725.0, "seconds_to_checkpoint": 65.0, "val_loss": 2.75}


def test_live_display_shows_progress_budget_and_timers() -> None:
    import io

    from rich.console import Console

    from runner.display import Display

    buf = io.StringIO()
    with Display(True, budget_usd=10.0, live=True, console=Console(file=buf, force_terminal=True, width=100)) as d:
        d.update(ROW)
    out = buf.getvalue()
    for text in ("12 / 100", "2.5000", "val 2.7500", "12,345", "41.2%", "$0.50 of $10.00", "30m00s", "1h02m05s",
                 "1m05s"):
        assert text in out, text


def test_plain_display_line(capsys) -> None:
    from runner.display import Display

    Display(True, None, live=False).update(ROW)
    assert capsys.readouterr().out == ("step 12/100  loss 2.5000  val 2.7500  12,345 tok/s  mfu 41.2%  $0.50  "
                                       "30m00s elapsed  stop in 1h02m05s\n")
    Display(False, None, live=False).update(ROW)
    assert capsys.readouterr().out == ""
