"""planner/uncertainty.py: P10–P90 bands from the speed model's held-out errors on public runs (issue 29 item 3).

Independent references: order statistics worked by hand, the public runs' own measured speeds (the bands must hold
them 75–85% of the time on the held-out runs), and the committed error data against today's predictions."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys

import pytest
from pydantic import ValidationError

from planner.build import build_plan
from planner.plan import Plan, PlanRequest, UncertaintyPlan, plan_hash
from planner.profiles import find_profile
from planner.spec import nanochat
from planner.uncertainty import (
    MIN_RUNS,
    RUNS,
    Kind,
    Run,
    band_for,
    band_from,
    inner,
    kind_of,
    rank_quantile,
    relative_span,
    similar_runs,
)


def _run(i: int, err: float, gpu: str = "H100-SXM", trainer: str = "torchtitan", compiled: bool = True,
         multi: bool = False) -> Run:
    return Run(f"r{i}", gpu, "hopper", trainer, compiled, multi, "heldout", err)


def test_bands_are_type6_quantiles_of_the_errors() -> None:
    errs = [-0.2, -0.1, 0.0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3]                # n = 9: ranks 1.0 and 9.0
    lo, hi, finish = band_from(errs)
    assert (lo, hi) == (math.exp(-0.3), math.exp(0.2))     # measured / predicted = exp(-log error)
    assert finish == pytest.approx((2 + 0.5) / 9)          # the model not too fast: error < 0, half of the ties
    errs19 = [i / 100 for i in range(19)]                  # n = 19: ranks 0.1 * 20 = 2 and 0.9 * 20 = 18
    lo, hi, _ = band_from(errs19)
    assert (lo, hi) == (pytest.approx(math.exp(-0.17)), pytest.approx(math.exp(-0.01)))
    errs17 = [float(i) for i in range(17)]                 # n = 17: ranks 1.8 and 16.2, read between neighbours
    assert rank_quantile(errs17, 0.1) == pytest.approx(0.8) and rank_quantile(errs17, 0.9) == pytest.approx(15.2)
    assert rank_quantile([5.0], 0.1) == 5.0 and rank_quantile([1.0, 2.0], 0.9) == 2.0     # clamped to the ends


def test_type6_bands_hold_80_percent_of_new_runs() -> None:
    """The band's promise, checked by simulation: over many groups of n exchangeable errors, the P10-P90 band of a
    group holds a new error from the same distribution about 80% of the time for every group size a plan meets (the
    split-conformal rounding it replaced held 89% at n = 17)."""
    import random

    rng = random.Random(29)
    for n in (9, 12, 17, 25):
        trials, inside = 4000, 0
        for _ in range(trials):
            e = sorted(rng.gauss(0.0, 0.1) for _ in range(n))
            x = rng.gauss(0.0, 0.1)
            inside += rank_quantile(e, 0.1) <= x <= rank_quantile(e, 0.9)
        assert 0.77 <= inside / trials <= 0.83, (n, inside / trials)


def test_the_most_similar_runs_with_enough_of_them() -> None:
    runs = ([_run(i, 0.01 * i) for i in range(8)]                                  # torchtitan, compiled, 1 node
            + [_run(10 + i, 0.0, trainer="llm-foundry", compiled=False) for i in range(8)]
            + [_run(20 + i, 0.0, multi=True) for i in range(3)]
            + [_run(30 + i, 0.0, gpu="A100-80GB") for i in range(20)])
    kind = Kind(family="H100/H200", trainer="torchtitan", compiled=True, multi_node=False)
    got, keys = similar_runs(kind, runs)
    assert keys == ("trainer", "compiled", "multi_node") and {r.id for r in got} == {f"r{i}" for i in range(8)}
    got, keys = similar_runs(Kind("H100/H200", "torchtitan", True, True), runs)   # only 3 multi-node: back off
    assert keys == ("trainer", "compiled") and len(got) == 11
    got, keys = similar_runs(Kind("H100/H200", None, False, False), runs)         # the runner: any trainer
    assert keys == ("compiled", "multi_node") and len(got) == 8
    assert band_for(Kind("H100/H200", None, True, True), runs[:5]) is None         # 5 < MIN_RUNS comparable runs
    assert MIN_RUNS == 8


def test_gpus_without_comparable_runs_get_no_band() -> None:
    assert kind_of("RTX-4090", None, True, 1).family is None
    for gpu, words in (("1xRTX-4090", "no public runs on RTX-4090 to compare with"),
                       ("8xB200", "only 2 public runs on B200, too few for a band"),
                       ("8xH100-PCIe", "no public runs on H100-PCIe to compare with")):
        prof = gpu.split("x", 1)[1]
        plan = build_plan(PlanRequest(gpu=gpu, profile=find_profile(prof), model=nanochat(12), hours=1.0))
        u = plan.uncertainty
        assert u is not None and u.basis == words and u.runs == 0
        assert u.tokens_per_sec is u.tokens is u.hours is u.usd is u.finish_probability is None


def test_a_budget_plan_bands_its_tokens_and_a_steps_plan_its_hours_and_dollars() -> None:
    h100 = find_profile("H100")
    budget = build_plan(PlanRequest(gpu="8xH100", profile=h100, model=nanochat(20), budget_usd=1000))
    u = budget.uncertainty
    assert u is not None and u.runs >= MIN_RUNS and "H100/H200" in u.basis
    tps = budget.throughput.tokens_per_sec
    assert u.tokens_per_sec[0] < tps < u.tokens_per_sec[1]
    assert u.tokens[0] < budget.schedule.total_tokens < u.tokens[1]
    assert u.tokens[0] % budget.schedule.tokens_per_step == 0            # whole optimizer steps
    assert u.hours is None and u.usd is None                             # the budget stops the run on time
    assert 0 < u.finish_probability < 1
    steps = build_plan(PlanRequest(gpu="8xH100", profile=h100, model=nanochat(20), steps=1000))
    v = steps.uncertainty
    assert v.tokens is None and v.hours[0] < steps.budget.hours < v.hours[1]
    assert v.usd == pytest.approx((v.hours[0] * steps.budget.usd_per_hour, v.hours[1] * steps.budget.usd_per_hour))
    # the band is the same relative band both ways round: faster runs train more tokens or finish sooner
    assert v.hours[0] == pytest.approx(steps.budget.hours * tps / u.tokens_per_sec[1])
    flat = build_plan(PlanRequest(gpu="8xH100", profile=h100, model=nanochat(20), steps=1000, mfu=0.4))
    assert flat.uncertainty.runs == 0 and "flat MFU" in flat.uncertainty.basis


def test_plan_json_field_is_strict_additive_and_not_part_of_the_identity() -> None:
    plan = build_plan(PlanRequest(gpu="8xH100", profile=find_profile("H100"), model=nanochat(20), budget_usd=1000))
    doc = plan.model_dump(mode="json")
    assert Plan.model_validate(doc) == plan
    with pytest.raises(ValidationError):
        UncertaintyPlan.model_validate({**doc["uncertainty"], "p50": 1})
    older = {k: v for k, v in doc.items() if k != "uncertainty"}         # a plan written before issue 29
    assert Plan.model_validate(older).uncertainty is None
    assert plan_hash(Plan.model_validate(older)) == plan_hash(plan)


def test_committed_errors_are_todays_held_out_predictions() -> None:
    """planner/speed_errors.py is data, not computed at run time: it must match the model as it is
    (re-run `python benchmarks/speed_errors.py`; the calibration rows' cross-validated errors take minutes, so
    only the held-out rows are re-predicted here)."""
    from benchmarks.public_runs.adapter import measured_tokens_per_s, predicted_tokens_per_s
    from benchmarks.public_runs.schema import load_runs

    rows = {r.id: r for r in load_runs()}
    assert {r.id for r in RUNS} <= set(rows)
    held = [r for r in RUNS if r.split == "heldout"]
    assert len(held) == 29 and len(RUNS) == 84        # every run with a measured speed, tensor-parallel ones too
    for r in held:
        m, _ = measured_tokens_per_s(rows[r.id])
        assert r.log_error == pytest.approx(math.log(predicted_tokens_per_s(rows[r.id]) / m), abs=2e-5), r.id


def test_bands_hold_about_80_percent_of_runs_no_constant_saw() -> None:
    """Issue 29's bar: the printed P10–P90 band contains the measured tokens/s for 75–85% of runs, each band built
    from every other run's error (benchmarks/public_runs.py prints the same counts). Over the 82 runs with an error no
    constant was fitted to (held-out, and calibration by cross-validation) it holds 64 (78%); over the 28 held-out
    runs alone 22 (79%): type-6 bands hold 80% on average, and 28 runs spread about ±8 points around it, so the
    held-out share is held to 75–90% (2026-11-28; benchmarks/results/public_runs.md)."""
    def coverage(split: str | None) -> tuple[int, int]:
        inside = total = 0
        for r in RUNS:
            if split is not None and r.split != split:
                continue
            band = band_for(kind_of(r.gpu, r.trainer, r.compiled, 2 if r.multi_node else 1),
                            [x for x in RUNS if x.id != r.id])
            if band is None:
                continue
            total += 1
            inside += band.lo <= math.exp(-r.log_error) <= band.hi
        return inside, total

    inside, total = coverage(None)
    assert total == 82 and 0.75 <= inside / total <= 0.85, (inside, total)
    inside, total = coverage("heldout")
    assert total == 28 and 0.75 <= inside / total <= 0.90, (inside, total)


def test_hours_bands_carry_their_unit_once_and_enough_digits() -> None:
    """A 3-minute plan's band was '3 min–3 min'; a band across the hour lost its unit ('50 min–1.2')."""
    def band(lo: float, hi: float) -> str:
        return inner(UncertaintyPlan(basis="x", runs=8, hours=(lo, hi)), "hours")

    assert band(3.1 / 60, 3.4 / 60) == "P10–P90 3.1–3.4 min"
    assert band(20 / 60, 40 / 60) == "P10–P90 20–40 min"
    assert band(50 / 60, 1.2) == "P10–P90 50 min–1.2 h"
    assert band(28.14, 34.0) == "P10–P90 28.1–34.0 h"
    assert inner(UncertaintyPlan(basis="x", runs=0), "hours") == ""


def test_relative_span_words() -> None:
    band = band_for(Kind("H100/H200", None, True, False))
    assert band is not None
    lo, hi = relative_span(band, False).rstrip("%").split("/")
    assert float(lo) < 0 < float(hi)
    slo, shi = relative_span(band, True).rstrip("%").split("/")       # hours: the other way round
    assert float(slo) == pytest.approx(round((1 / band.hi - 1) * 100)) and float(shi) > 0
    assert relative_span(None, False) == "-"


def _nanoplan(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "80", "LINES": "24"}
    return subprocess.run([sys.executable, "-m", "nanoplan", *args], capture_output=True, text=True, timeout=120,
                          env=env)


def test_estimate_compare_and_validate_print_the_bands(tmp_path) -> None:
    out = tmp_path / "p.json"
    r = _nanoplan("estimate", "--gpu", "8xH100", "--budget", "1000", "--depth", "20", "--out", str(out))
    assert r.returncode == 0, r.stderr
    text = r.stdout
    assert "tokens/s (P10–P90 " in text and "B tokens in the budget (" in text
    assert "odds" in text and "similar runs)" in text
    assert max(len(x) for x in text.splitlines()[:-1]) <= 80
    v = _nanoplan("validate", str(out))
    assert v.returncode == 0 and "tokens/s (P10–P90 " in v.stdout and "likely to train all" in v.stdout
    c = _nanoplan("compare", "--budget", "1000", "--gpus", "8xH100,1xRTX-4090")
    assert c.returncode == 0, c.stderr
    h100 = next(x for x in c.stdout.splitlines() if "8xH100-SXM " in x)
    rtx = next(x for x in c.stdout.splitlines() if "1xRTX-4090 " in x)
    band = re.compile(r" [-+]\d+/[-+]\d+% ")
    assert "P10–P90" in c.stdout and band.search(h100) and not band.search(rtx) and " - " in rtx
