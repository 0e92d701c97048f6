"""Spot GPUs: the interruption model, the Young/Daly cadence against a brute-force search in the Monte-Carlo,
what a --spot plan records for the runner, and `estimate --spot` / `compare --spot` on the command line."""

from __future__ import annotations

import csv
import io
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from planner.build import build_plan, rederive
from planner.errors import PlanError
from planner.plan import PlanRequest, SpotRequest, load_plan, plan_hash, save_plan, trained_fields
from planner.profiles import find_profile
from planner.spec import nanochat
from planner.spot import Costs, outcome, simulate, work_within, young_daly_s
from runner.clock import deadline_seconds

REPO = Path(__file__).resolve().parents[1]
H100 = find_profile("H100")


def costs(**kw: float) -> Costs:
    base = {"step_s": 2.0, "write_s": 60.0, "restart_s": 200.0, "first_s": 180.0, "mtbi_s": 6 * 3600.0}
    return Costs(**{**base, **kw})


def mean_paid(work_s: float, tau_s: float, c: Costs, trials: int = 2000, seed: int = 7) -> float:
    runs = simulate(work_s, tau_s, c, trials=trials, seed=seed)
    return sum(r.paid_s for r in runs) / len(runs)


# ---------------------------------------------------------------- the model


@pytest.mark.parametrize("c", [costs(), costs(write_s=20.0, mtbi_s=2 * 3600.0, restart_s=90.0, first_s=80.0)])
def test_young_daly_matches_a_brute_force_search_over_intervals(c: Costs) -> None:
    """The interval with the least expected total time in the Monte-Carlo (the same interruptions for every
    interval) lies next to sqrt(2·C·M), and sqrt(2·C·M) costs within 0.3% of it."""
    yd = young_daly_s(c.write_s, c.mtbi_s)
    assert yd == pytest.approx(math.sqrt(2 * c.write_s * c.mtbi_s))
    grid = [yd * f for f in (0.2, 0.35, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.25, 1.4, 1.6, 2.0, 2.8, 4.0)]
    work = 30 * 3600.0
    paid = {tau: mean_paid(work, tau, c) for tau in grid}
    best = min(paid, key=paid.__getitem__)
    assert 0.7 * yd <= best <= 1.4 * yd, (best / yd, {round(t / yd, 2): round(p / 3600, 3) for t, p in paid.items()})
    assert paid[yd] <= paid[best] * 1.003
    assert paid[grid[0]] > paid[yd] * 1.01 and paid[grid[-1]] > paid[yd] * 1.01   # the curve does rise on both sides


def test_without_interruptions_the_run_is_plain_arithmetic() -> None:
    """M = 10^12 s: the first start-up, the training and one write per interval, counted by hand (the first
    interval is shorter by the start-up, as the runner's cadence counts it)."""
    c = costs(mtbi_s=1e12)
    work, tau = 7_000.0, 900.0
    first_seg = tau - c.first_s
    writes = 1 + math.ceil((work - first_seg) / tau)
    run = simulate(work, tau, c, trials=3, seed=1)
    assert all(r.interruptions == 0 and r.finished and r.lost_s == 0 for r in run)
    assert run[0].paid_s == pytest.approx(c.first_s + work + writes * c.write_s)


def test_interruptions_arrive_at_the_poisson_rate_and_lose_at_most_an_interval_each() -> None:
    """Wald: for a Poisson process stopped at the run's end, E[interruptions] = E[paid time] / M."""
    c = costs(mtbi_s=3 * 3600.0)
    tau = 1200.0
    runs = simulate(20 * 3600.0, tau, c, trials=4000, seed=3)
    n = sum(r.interruptions for r in runs) / len(runs)
    paid = sum(r.paid_s for r in runs) / len(runs)
    assert n == pytest.approx(paid / c.mtbi_s, rel=0.03)
    assert all(r.lost_s <= r.interruptions * tau + 1e-6 for r in runs)
    lost = sum(r.lost_s for r in runs) / sum(r.interruptions for r in runs)
    assert 0.35 * tau <= lost <= 0.6 * tau          # about half an interval (plus part of a write)


def test_the_steps_finish_within_the_cap_at_the_quantile() -> None:
    c = costs()
    cap, tau = 24 * 3600.0, young_daly_s(c.write_s, c.mtbi_s)
    work = work_within(cap, tau, c, quantile_=0.9, trials=1000, seed=5)
    at = outcome(work, tau, c, quantile_=0.9, trials=1000, seed=5, cap_s=cap)
    assert at.finish_probability >= 0.9
    assert outcome(work * 1.05, tau, c, quantile_=0.9, trials=1000, seed=5, cap_s=cap).finish_probability < 0.9
    runs = simulate(work * 1.5, tau, c, trials=500, seed=5, cap_s=cap)
    assert max(r.paid_s for r in runs) <= cap                # whatever the interruptions: never past the cap
    assert at.expected_s <= at.p_s <= cap


# ---------------------------------------------------------------- what a spot plan records


def spot_request(**kw) -> PlanRequest:
    fields = {"gpu": "8xH100", "profile": H100, "model": nanochat(20), "budget_usd": 1000.0,
              "strategy": "zero1", "spot": SpotRequest()}
    return PlanRequest(**{**fields, **kw})


def test_a_spot_plan_records_the_spot_price_the_steps_and_the_cadence(tmp_path: Path) -> None:
    plan = build_plan(spot_request())
    sp, hw = plan.spot, plan.hardware
    assert sp is not None
    gcp = next(p for p in H100.prices if p.provider == "gcp")
    assert (hw.provider, hw.usd_per_gpu_hour, hw.price_date) == ("gcp spot", gcp.spot.usd_per_gpu_hour, gcp.spot.date)
    assert sp.on_demand_usd_per_gpu_hour == gcp.usd_per_gpu_hour
    # the runner's hard stop is the budget at the spot price
    cap_s = 1000.0 / (8 * gcp.spot.usd_per_gpu_hour) * 3600
    assert deadline_seconds(plan.request.hours, plan.request.budget_usd, plan.budget.usd_per_hour) == pytest.approx(cap_s)
    assert plan.budget.hours == pytest.approx(cap_s / 3600) and plan.budget.usd == pytest.approx(1000.0)
    # cadence: sqrt(2·C·M), C = checkpoint bytes / 1 GB/s (the profile's default storage), M = 6 h, 2 figures
    c_s = plan.schedule.checkpoint_bytes / 1e9
    assert sp.write_seconds == pytest.approx(c_s)
    assert sp.optimum_minutes == pytest.approx(math.sqrt(2 * c_s * 6 * 3600) / 60)
    assert plan.schedule.checkpoint_every_minutes == sp.checkpoint_every_minutes == float(f"{sp.optimum_minutes:.2g}")
    assert sp.restart_seconds == pytest.approx(sum(sp.restart_parts.values()))
    assert sp.restart_parts["checkpoint_load"] == pytest.approx(c_s) and sp.restart_parts["rendezvous"] == 0
    # the steps leave room for the interruptions, and finish within the cap in 90% of the runs
    train_s = plan.schedule.total_steps * plan.throughput.step_seconds
    assert 0.8 * cap_s < train_s < cap_s
    assert sp.finish_probability >= 0.9 and sp.expected_usd <= sp.p90_usd <= 1000.0 + 1e-6
    assert sp.expected_hours <= sp.p90_hours <= plan.budget.hours + 1e-9
    assert sp.on_demand_usd == pytest.approx(sp.on_demand_hours * 8 * gcp.usd_per_gpu_hour)
    # re-derivable, and a round trip through plan.json keeps it
    assert rederive(plan)[1] == []
    save_plan(plan, tmp_path / "p.json")
    assert load_plan(tmp_path / "p.json") == plan


def test_overrides_the_mtbi_per_node_and_on_demand_identity(tmp_path: Path) -> None:
    mine = build_plan(spot_request(price=2.0, spot=SpotRequest(mtbi_hours=1.5, checkpoint_every_minutes=30.0)))
    assert mine.hardware.usd_per_gpu_hour == 2.0 and mine.hardware.provider == "custom spot"
    assert mine.spot.mtbi_hours == 1.5 and mine.spot.mtbi_source == "--mtbi on the command line"
    assert mine.spot.cadence == "request" and mine.schedule.checkpoint_every_minutes == 30.0
    assert mine.spot.on_demand_usd is None
    two = build_plan(spot_request(gpu="2x8xH100")).spot      # any of the 2 nodes stops the run: M = 6 h / 2
    assert two.mtbi_hours == 6.0 and two.restart_parts["rendezvous"] > 0
    assert two.expected_interruptions == pytest.approx(two.expected_hours / 3.0, rel=0.1)
    # an on-demand plan's identity leaves the new, unset fields out: a plan.json written before them still resumes
    od = build_plan(spot_request(spot=None))
    doc = json.dumps(trained_fields(od.model_dump(mode="json")))
    assert '"spot": null' not in doc and '"storage_gb_s": null' not in doc and '"mtbi_hours"' in doc
    save_plan(od, tmp_path / "od.json")
    assert plan_hash(load_plan(tmp_path / "od.json")) == plan_hash(od)


def test_no_spot_price_needs_your_price_and_mtbi() -> None:
    a100 = find_profile("A100-80GB")
    with pytest.raises(PlanError, match="no spot price for A100-80GB"):
        build_plan(spot_request(gpu="8xA100", profile=a100))
    with pytest.raises(PlanError, match="--mtbi"):
        build_plan(spot_request(gpu="8xA100", profile=a100, price=1.2))
    plan = build_plan(spot_request(gpu="8xA100", profile=a100, price=1.2, spot=SpotRequest(mtbi_hours=4.0)))
    assert plan.spot.mtbi_hours == 4.0 and plan.hardware.usd_per_gpu_hour == 1.2


# ---------------------------------------------------------------- the command line


def nanoplan(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "80", "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "nanoplan", *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=120)


def test_estimate_spot_prints_expected_p90_cadence_and_on_demand(tmp_path: Path) -> None:
    r = nanoplan("estimate", "--gpu", "8xH100", "--budget", "1000", "--spot", "--out", "spot.json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    plan = load_plan(tmp_path / "spot.json")
    sp = plan.spot
    lines = r.stdout.splitlines()
    start = next(i for i, x in enumerate(lines) if x.startswith("Spot gcp $6.57/GPU-h"))
    block = lines[start:start + 5]
    assert all(len(x) <= 80 for x in block), block
    assert block[1].startswith(f"Checkpoint every {sp.checkpoint_every_minutes:.0f} min = √(2·C·M)")
    assert block[3].startswith(f"on spot:   ${sp.expected_usd:,.0f} expected, ${sp.p90_usd:,.0f} at P90, "
                               f"{sp.expected_hours:.1f} h")
    assert block[4].startswith(f"on demand: gcp ${sp.on_demand_usd:,.0f}, {sp.on_demand_hours:.1f} h")
    assert "modal $1,000, 31.6 h" in block[4]               # what the same budget buys without --spot
    assert lines[-1].startswith(f"→ {plan.model.name}") and "gcp spot" in lines[-1]


@pytest.mark.parametrize("args,words", [
    (["estimate", "--gpu", "8xA100", "--budget", "100", "--spot"], ["--spot", "no spot price for A100-80GB"]),
    (["estimate", "--budget", "100", "--mtbi", "6h"], ["--mtbi", "spot GPUs only"]),
    (["estimate", "--budget", "100", "--spot", "--mtbi", "soon"], ["--mtbi", "duration"]),
    (["compare", "--budget", "100", "--mtbi", "6h"], ["--mtbi", "spot GPUs only"]),
])
def test_bad_spot_input_is_one_line_exit_2(tmp_path: Path, args: list[str], words: list[str]) -> None:
    r = nanoplan(*args, cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    first = r.stderr.splitlines()[0]
    assert all(w in first for w in words), r.stderr


def test_compare_spot_ranks_configurations_by_what_the_budget_buys(tmp_path: Path) -> None:
    r = nanoplan("compare", "--budget", "1000", "--spot", "--gpus", "8xH100,4xH100,8xA100", "--format", "csv",
                 cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    rows = list(csv.DictReader(io.StringIO(r.stdout)))
    assert [x["gpu"] for x in rows][-1] == "8xA100-80GB" and "no spot price" in rows[-1]["note"]
    ranked = rows[:-1]
    assert {x["gpu"] for x in ranked} == {"8xH100-SXM", "4xH100-SXM"}
    losses = [float(x["loss"]) for x in ranked]
    assert losses == sorted(losses)
    for x in ranked:
        assert float(x["expected_usd"]) <= float(x["p90_usd"]) <= 1000.0 + 1e-6
        assert float(x["finish_probability"]) >= 0.9
        assert float(x["usd_per_gpu_hour"]) == 6.57
    t = nanoplan("compare", "--budget", "1000", "--spot", "--gpus", "8xH100,8xA100", cwd=tmp_path)
    assert t.returncode == 0 and "on spot" in t.stdout and all(len(x) <= 80 for x in t.stdout.splitlines())


def test_profile_spot_fields_are_sourced() -> None:
    """Every spot price is dated and sourced, with an MTBI that names its source or says it is an assumption;
    a storage bandwidth needs a source like any other figure."""
    from planner.profiles import HardwareProfile, builtin_profiles

    spots = [(p.name, q) for p in builtin_profiles().values() for q in p.prices if q.spot is not None]
    assert spots, "no profile has a spot price"
    for name, q in spots:
        s = q.spot
        assert s.date and s.source and s.mtbi_source, (name, q.provider)
        assert s.usd_per_gpu_hour < q.usd_per_gpu_hour, (name, q.provider)    # beside the same provider's on-demand
        assert s.mtbi_source.startswith("assumption") or "http" in s.mtbi_source or "§" in s.mtbi_source
    doc = H100.model_dump()
    with pytest.raises(ValueError, match="storage_gb_s"):
        HardwareProfile.model_validate({**doc, "storage_gb_s": 2.0})
    ok = HardwareProfile.model_validate({**doc, "storage_gb_s": 2.0,
                                         "sources": {**doc["sources"], "storage_gb_s": "measured: dd to the mount"}})
    assert ok.storage_bytes_per_s() == (2e9, "measured: dd to the mount")
