"""The live view: smoothed tokens/s against the plan, projected end, validation loss, and the stop summary."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from planner.build import build_plan
from planner.plan import PlanRequest
from planner.profiles import find_profile
from planner.spec import preset
from runner.display import SMOOTH_STEPS, Display, Smoother, _table, fmt_hours, stop_summary, summary_lines, vs_plan


def row(step: int, seconds: float, **kw) -> dict:
    base = {"step": step, "total_steps": 1000, "loss": 2.0, "tokens_per_sec": 1024 / seconds, "step_seconds": seconds,
            "tokens_seen": 1024 * step, "mfu": 0.1, "usd_spent": 1.0, "elapsed_hours": 0.1, "projected_steps": 800,
            "projected_tokens": 800 * 1024}
    return {**base, **kw}


def test_smoother_averages_tokens_over_seconds_of_the_window() -> None:
    s = Smoother(3)
    assert s.value() is None
    for tokens, secs in ((100, 1.0), (100, 3.0), (100, 1.0), (100, 1.0)):
        s.add(tokens, secs)
    assert s.value() == pytest.approx(300 / 5.0)        # the first step left the window


def test_vs_plan_is_signed_either_way() -> None:
    assert vs_plan(60.0, 100.0) == pytest.approx(-0.4)
    assert vs_plan(120.0, 100.0) == pytest.approx(0.2) and vs_plan(100.0, 100.0) == 0.0
    assert vs_plan(None, 100.0) is None and vs_plan(50.0, None) is None


def test_view_smooths_jumpy_steps_and_keeps_the_last_val_loss() -> None:
    d = Display(True, None, live=False, planned_tokens_per_sec=2048.0)
    views = [d.view(row(k, 0.25 if k % 2 else 1.0, **({"val_loss": 1.5} if k == 3 else {})))
             for k in range(1, 2 * SMOOTH_STEPS + 1)]
    last = views[-1]
    assert last["smoothed"] == pytest.approx(2 * 1024 / 1.25)       # not 4096 or 1024 as single steps say
    assert last["vs_plan"] == pytest.approx((2 * 1024 / 1.25) / 2048.0 - 1)
    assert last["val_loss"] == 1.5


def test_plain_line_says_where_the_run_ends_and_how_it_compares_with_the_plan(capsys) -> None:
    d = Display(True, None, live=False, planned_tokens_per_sec=4096.0)
    d.update(row(5, 0.5, val_loss=1.25))
    d.update(row(6, 0.25, val_loss=1.0))
    ahead = Display(True, None, live=False, planned_tokens_per_sec=1024.0)
    ahead.update(row(5, 0.5, val_loss=1.25))
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("step 5/1000 (ends at 800)  loss 2.0000  val 1.2500  2,048 tok/s (-50% vs plan)")
    assert "2,731 tok/s (-33% vs plan)" in lines[1]       # 2,048 tokens in 0.75 s, against 4,096 planned
    assert "2,048 tok/s (+100% vs plan)" in lines[2]      # faster than planned says so too


def test_live_table_shows_projection_and_window() -> None:
    buf = io.StringIO()
    with Display(True, 10.0, live=True, console=Console(file=buf, force_terminal=True, width=100),
                 planned_tokens_per_sec=4096.0) as d:
        d.update(row(5, 0.5))
    out = buf.getvalue()
    for text in ("ends at", "step 800, 819k tokens", f"tokens/s ({SMOOTH_STEPS}-step avg)", "-50% vs plan",
                 "auto-stop in", "next checkpoint in"):
        assert text in out, text


def _last_frame(text: str) -> str:
    """What a terminal shows at the end of a Live display: the text after the last cursor-up."""
    return text.rsplit("\x1b[1A", 1)[-1] if "\x1b[1A" in text else text


@pytest.mark.parametrize("seconds_to_stop", [None, 95.0])
def test_live_panel_after_the_run_shows_why_it_stopped_not_a_countdown(seconds_to_stop) -> None:
    buf = io.StringIO()
    with Display(True, 10.0, live=True, console=Console(file=buf, force_terminal=True, width=100),
                 planned_tokens_per_sec=4096.0) as d:
        r = row(1000, 10.0, seconds_to_stop=seconds_to_stop, seconds_to_checkpoint=3599.0, projected_steps=2000)
        d.update(r)
        during = Console(file=io.StringIO(), width=100, record=True)
        during.print(_table(r, d.view(r), 10.0))
        d.finish("total_steps", "runs/x/checkpoints/step_00001000")
    final, shown = _last_frame(buf.getvalue()), during.export_text()
    assert "next checkpoint in" in shown
    assert ("59m59s" if seconds_to_stop is None else "1m35s (the final one)") in shown
    assert ("no deadline: stops at step 1,000" in shown) == (seconds_to_stop is None)
    assert "stopped" in final and "total_steps at step 1,000" in final and "step_00001000" in final
    for gone in ("next checkpoint in", "59m59s", "auto-stop in"):
        assert gone not in final, gone


def test_next_checkpoint_is_the_final_one_when_the_run_ends_first() -> None:
    """Issue 28: a 2-minute run with hourly checkpoints said "next checkpoint in 59m35s"; its next checkpoint is
    the final one, at the deadline (auto-stop) or at its last step (no deadline), whichever comes first."""
    def shown(r: dict) -> str:
        c = Console(file=io.StringIO(), width=100, record=True)
        c.print(_table(r, Display(True, None, live=False).view(r), None))
        return next(line for line in c.export_text().splitlines() if "next checkpoint in" in line)

    assert "2m00s (the final one)" in shown(row(10, 1.0, seconds_to_stop=120.0, seconds_to_checkpoint=3575.0))
    assert "0m30s (the final one)" in shown(row(770, 1.0, seconds_to_checkpoint=3575.0))   # 30 steps of 1 s left
    assert shown(row(10, 1.0, seconds_to_stop=7200.0, seconds_to_checkpoint=3575.0, projected_steps=9000)).split()[-1] \
        == "59m35s"


def test_hours_read_in_seconds_minutes_or_hours() -> None:
    assert [fmt_hours(h) for h in (0.0001516, 0.002517, 0.5, 1.0, 31.62, 1234.5)] == [
        "0.5 s", "9.1 s", "30.0 min", "1.0 h", "31.6 h", "1,234.5 h"]
    assert fmt_hours(None) == "-" and fmt_hours(float("nan")) == "-"


def test_stop_summary_planned_against_achieved() -> None:
    req = PlanRequest(gpu="2xCPU", profile=find_profile("CPU"), model=preset("tiny"), steps=100, precision="fp32",
                      compile=False, total_batch_tokens=1024, price=2.0)
    plan = build_plan(req)
    s = stop_summary(plan, steps=40, tokens=40 * 1024, hours=0.01, usd=0.04, loss=1.5, val_loss=1.75)
    assert s["planned"] == {"steps": 100, "tokens": 100 * 1024, "hours": plan.budget.hours, "usd": plan.budget.usd}
    assert s["achieved"] == {"steps": 40, "tokens": 40 * 1024, "hours": 0.01, "usd": 0.04}
    text = "\n".join(summary_lines(s))
    assert "40 (40%)" in text and "final loss 1.5000, val 1.7500" in text and "$0.04" in text
    assert "36.0 s" in text and " h" not in text.split("time", 1)[1].split("\n")[0].replace(" s", "")[-2:]


def test_stop_summary_of_a_nan_run_is_valid_json() -> None:
    import json

    req = PlanRequest(gpu="2xCPU", profile=find_profile("CPU"), model=preset("tiny"), steps=10, precision="fp32",
                      compile=False, total_batch_tokens=1024)
    s = stop_summary(build_plan(req), steps=3, tokens=3072, hours=0.001, usd=0.0, loss=float("nan"), val_loss=None)
    assert s["final_loss"] is None
    json.loads(json.dumps(s, allow_nan=False))
    assert "final loss -" in "\n".join(summary_lines(s))


def test_log_lines_wrap_between_words_on_a_terminal_and_stay_whole_in_a_pipe(capsys) -> None:
    msg = "stopped: total_steps at step 60/60, 0.25 min, $0.00; checkpoint runs/t1/checkpoints/step_00000060 [x]"
    buf = io.StringIO()
    Display(True, None, live=True, console=Console(file=buf, width=80, force_terminal=True, color_system=None)).log(msg)
    lines = [x.rstrip() for x in buf.getvalue().splitlines()]
    assert lines == ["stopped: total_steps at step 60/60, 0.25 min, $0.00; checkpoint",
                     "runs/t1/checkpoints/step_00000060 [x]"]
    Display(True, None, live=False).log(msg)
    assert capsys.readouterr().out == msg + "\n"
