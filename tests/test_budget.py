"""Budget maths on the worked example of docs/sources.md §1 ($1000, 8 GPUs at $4/h = 31.25 h)."""

from pathlib import Path

import pytest

from planner.build import build_plan, grad_accum
from planner.errors import PlanError
from planner.plan import PlanRequest
from planner.profiles import find_profile
from planner.spec import nanochat
from tests.conftest import nanoplan_no_launch


def req(**kw) -> PlanRequest:
    base = dict(gpu="8xH100", profile=find_profile("H100"), price=4.0, model=nanochat(20))
    return PlanRequest.model_validate({**base, **kw})


def test_worked_example_hours_steps_tokens() -> None:
    p = build_plan(req(budget_usd=1000, dataset_tokens=350_000_000))
    assert p.budget.hours == pytest.approx(31.25)
    assert p.budget.usd == pytest.approx(1000)
    assert p.budget.usd_per_hour == 32
    assert p.schedule.tokens_per_step == 524_288
    # the launch's start-up (60 s) and compile warm-up (120 s) come out of the 31.25 h
    assert p.budget.startup_seconds == pytest.approx(60 + 120)
    assert p.schedule.total_steps == int((31.25 * 3600 - 180) / p.throughput.step_seconds)
    assert p.schedule.total_tokens == p.schedule.total_steps * 524_288
    assert p.schedule.epochs == pytest.approx(p.schedule.total_tokens / 350e6)
    assert p.schedule.checkpoint_every_steps == round(3600 / p.throughput.step_seconds)
    assert any("repeated data" in w for w in p.warnings)


def test_guide_34_epochs() -> None:
    # The guide: ~12B tokens over a 350M-token dataset = 34 epochs.
    p = build_plan(req(steps=22_888, dataset_tokens=350_000_000))
    assert p.schedule.total_tokens == 22_888 * 524_288
    assert p.schedule.epochs == pytest.approx(34.28, abs=0.01)
    assert p.budget.hours == pytest.approx((60 + 120 + 22_888 * p.throughput.step_seconds) / 3600)


def test_hours_sets_cost() -> None:
    p = build_plan(req(hours=10))
    assert p.budget.usd == pytest.approx(320)


def test_exactly_one_length() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        req(hours=1, budget_usd=10)
    with pytest.raises(ValueError, match="exactly one"):
        req()


def test_grad_accum_divides() -> None:
    assert grad_accum(524_288, 16, 2048, 8) == 2
    with pytest.raises(PlanError, match="does not divide"):
        grad_accum(524_288, 3, 2048, 8)


def test_undertrained_warning_and_checkpoint_fraction() -> None:
    p = build_plan(req(hours=0.5, checkpoint_every_minutes=0.5))
    assert any("undertrained" in w for w in p.warnings)
    assert p.schedule.checkpoint_every_steps == max(1, round(30 / p.throughput.step_seconds))
    # at peak: keep_last 3 + the best + the one being written (at most checkpoints + 2: step 1's and the final)
    assert p.schedule.storage_bytes == min(p.schedule.num_checkpoints + 2, 5) * p.schedule.checkpoint_bytes


def test_pcie_slower_than_sxm_for_big_models() -> None:
    from planner.spec import preset
    sxm = build_plan(req(model=preset("llama3.1-8b"), hours=1, strategy="fsdp", price=None))
    pcie = build_plan(PlanRequest.model_validate({**sxm.request.model_dump(), "gpu": "8xH100-PCIe",
                                                  "profile": find_profile("H100-PCIe").model_dump()}))
    assert pcie.throughput.exposed_comm_seconds > sxm.throughput.exposed_comm_seconds
    assert pcie.throughput.comm_seconds > 5 * sxm.throughput.comm_seconds


@pytest.mark.parametrize(("flag", "args", "said"), [
    ("--hours", ["--hours", "5e-324"], "1.8e-320 s leaves no time for one optimizer step"),
    ("--budget", ["--budget", "0.0001"], "$0.0001 buys 0.011 s of 8xH100-SXM, which leaves no time for one optimizer "
                                         "step"),
])
def test_a_length_shorter_than_one_step_is_refused_not_rounded_up(flag: str, args: list[str], said: str,
                                                                   tmp_path: Path) -> None:
    """A plan of one step would overrun the hours or dollars asked for (it used to be written, as 1 step)."""
    code, out, err = nanoplan_no_launch("estimate", "--gpu", "8xH100", "--depth", "4", *args, "--out", "p.json",
                                        cwd=tmp_path)
    lines = err.splitlines()
    assert code == 2 and lines[0].startswith(f"error: {flag}: {said}") and lines[1].startswith("hint: "), err
    assert not (tmp_path / "p.json").exists()
    with pytest.raises(PlanError, match="leaves no time for one optimizer step"):
        build_plan(req(hours=1e-6))
    assert build_plan(req(hours=1.0)).schedule.total_steps >= 1
