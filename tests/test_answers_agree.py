"""Answers that must agree with each other and with the truth (issue 28, item 3): the search's sentences and
its ranking, compare's marks and their caveat, the tokens/param of a default length, the MFU the hours come
from, start-up in every plan's hours, a copied plan, and what `estimate` writes that `run` would refuse."""

from __future__ import annotations

import re

from planner.candidates import Length, Settings, depth_ladder
from planner.explain import explain
from planner.profiles import parse_gpu_spec
from planner.ranking import SETTINGS_TOL, zero1_first
from planner.selection import search


def _dataset_search():
    hw = parse_gpu_spec("8xH100")
    return search(depth_ladder("nanochat"), hw, Length(budget_usd=1000), Settings(dataset_tokens=350_000_000))


def test_a_strategy_that_fits_is_never_said_not_to_fit_and_ties_go_to_the_simpler_one() -> None:
    """With a dataset the spend is shorter than the budget and each setting runs its own whole steps: the
    ranking's ties and explain's sentences must still see ddp (it fits: 9.7 GiB) as the winner's sibling."""
    r = _dataset_search()
    best = r.best
    same = [c for c in r.ranked if c.spec == best.spec]
    ddp = [c for c in same if c.strategy == "ddp"]
    assert ddp, "ddp fits this model"
    text = " ".join(explain(r))
    for m in re.finditer(r"with ddp, (d\d+) does not fit", text):
        assert not [c for c in r.ranked if c.name == m.group(1) and c.strategy == "ddp"], text
    # ties: the simplest setting within SETTINGS_TOL of the model's fastest at the same spend wins
    fastest = min(same, key=lambda c: c.step_seconds)
    tied = [c for c in same if c.step_seconds <= fastest.step_seconds * (1 + SETTINGS_TOL)]
    order = ("zero1", "ddp", "zero2", "fsdp") if zero1_first(r.hw) else ("ddp", "zero1", "zero2", "fsdp")
    simplest = min(tied, key=lambda c: (c.activation_checkpointing, -c.device_batch, order.index(c.strategy)))
    assert (best.strategy, best.device_batch, best.activation_checkpointing) == (
        simplest.strategy, simplest.device_batch, simplest.activation_checkpointing)


def test_an_unproven_speed_never_takes_a_mark_while_a_proven_row_can() -> None:
    """8xB200's predicted speed is far above its public runs (+69% when this was written): on that speed alone it would be best, cheapest
    and fastest. It keeps its row and '*', takes no mark, and the caption (markdown too) says what it would take."""
    from planner.compare import DEFAULT_GPUS, caption, compare, records, to_markdown
    from planner.profiles import find_profile, speed_off

    cmp = compare(DEFAULT_GPUS, depth_ladder("nanochat"), Length(budget_usd=1000))
    rows = {r.gpu: r for r in cmp.rows}
    b200 = rows["8xB200"]
    assert speed_off(find_profile("B200")) is not None and b200.unproven
    assert not (b200.is_best or b200.is_cheapest or b200.is_fastest)
    assert b200.would_take, "on its own numbers it would take a mark"
    for flag in ("is_best", "is_cheapest", "is_fastest"):
        marked = [r for r in cmp.rows if getattr(r, flag)]
        assert len(marked) == 1 and not marked[0].unproven
    assert f"Not marked: 8xB200 would take {b200.would_take}" in caption(cmp)
    md = to_markdown(cmp)
    assert "Not marked: 8xB200" in md and re.search(r"\* 8xB200: tokens/s \+\d+% vs its \d+ public runs", md), md
    rec = {r["gpu"]: r for r in records(cmp)}
    assert rec["8xB200"]["speed_unproven"] is True and rec["8xH100-SXM"]["speed_unproven"] is False
    # only unproven rows: the marks go to them (nothing else to recommend), and nothing is withheld
    alone = compare(["8xB200", "4xB200"], depth_ladder("nanochat"), Length(budget_usd=1000))   # both unproven
    assert sum(r.is_best for r in alone.rows) == 1 and not any(r.would_take for r in alone.rows)


def test_every_plan_pays_its_launch_in_hours_and_dollars_as_the_spot_model_does() -> None:
    """A plan's hours are what the runner's budget clock counts (it starts with `nanoplan run`): the launch's
    start-up and compile warm-up (planner/spot.py's constants, one source), then the steps."""
    from planner.build import build_plan
    from planner.plan import PlanRequest, SpotRequest
    from planner.profiles import find_profile
    from planner.spec import nanochat
    from planner.spot import COMPILE_S, START_UP_S, WARM_STEPS

    base = dict(gpu="8xH100", profile=find_profile("H100"), model=nanochat(4))
    p = build_plan(PlanRequest.model_validate({**base, "steps": 100}))
    step = p.throughput.step_seconds
    assert p.budget.startup_seconds == START_UP_S["gpu"] + COMPILE_S["gpu"]
    assert p.budget.hours * 3600 == _approx(p.budget.startup_seconds + 100 * step)
    assert p.budget.usd == _approx(p.budget.hours * p.budget.usd_per_hour)
    # the spot model's launch pays the same (its restart, less the checkpoint load and the cold steps it loses)
    sp = build_plan(PlanRequest.model_validate({**base, "steps": 100, "spot": SpotRequest(mtbi_hours=6)})).spot
    assert sp.restart_parts["start_up"] + sp.restart_parts["compile_warmup"] - WARM_STEPS * step == _approx(
        p.budget.startup_seconds)
    # a budget: its hours are the budget's, and the steps are those that fit after the launch
    b = build_plan(PlanRequest.model_validate({**base, "budget_usd": 10}))
    assert b.budget.usd == _approx(10) and b.budget.startup_seconds > 0
    assert b.schedule.total_steps == int((b.budget.hours * 3600 - 180) / step)
    # CPU, no compile: the CPU start-up alone
    cpu = build_plan(PlanRequest.model_validate({"gpu": "CPU", "profile": find_profile("CPU"), "model": nanochat(2),
                                                 "steps": 3, "precision": "fp32", "compile": False}))
    assert cpu.budget.startup_seconds == START_UP_S["cpu"]


def test_the_search_counts_the_launch_as_its_plan_does() -> None:
    """The runners-up table and compare show the hours and dollars the written plan has."""
    from planner.selection import plan_for_best

    for r in (search(depth_ladder("nanochat"), parse_gpu_spec("8xH100"), Length(budget_usd=100)), _dataset_search()):
        plan = plan_for_best(r, {"gpu": "8xH100", "profile": r.hw.profile, "budget_usd": 1000 if
                                 r.settings.dataset_tokens else 100, "dataset_tokens": r.settings.dataset_tokens})
        assert plan.schedule.total_steps == r.best.steps
        assert plan.budget.hours == _approx(r.best.hours) and plan.budget.usd == _approx(r.best.usd)
        assert plan.budget.startup_seconds == 180


def _approx(x: float):  # noqa: ANN202
    import pytest

    return pytest.approx(x, rel=1e-9)


def test_a_copied_plan_is_the_same_plan_for_run_and_validate_and_a_stale_one_is_said_in_words(tmp_path) -> None:
    """`run` re-derived a copied plan at its new path and warned that the launch line differed, while `validate`
    said consistent: both now rebuild it at the path it records, and a difference reads as a sentence."""
    import shutil

    from planner.build import rederive
    from planner.plan import load_plan
    from planner.validate import validate_paths
    from tests.conftest import make_tiny_plan

    src = make_tiny_plan(tmp_path / "a" / "plan.json", None, steps=10)
    (tmp_path / "b").mkdir()
    dst = tmp_path / "b" / "copy.json"
    shutil.copy(src, dst)
    assert rederive(load_plan(dst), str(dst))[1] == []              # what `run` asks
    assert validate_paths([str(dst)])[0].consistent                   # what `validate` says
    raw = dst.read_text().replace('"total_steps": 10', '"total_steps": 11')
    dst.write_text(raw)
    problems = rederive(load_plan(dst), str(dst))[1]
    assert problems == ["schedule.total_steps is 11 in the plan, 10 re-derived"]
    plan = load_plan(src)
    cmd = [*plan.launch.command[:-1], "elsewhere"]
    edited = plan.model_copy(update={"launch": plan.launch.model_copy(update={"command": cmd})})
    (line,) = rederive(edited)[1]
    assert line.startswith("launch.command is python -m torch.distributed.run ") and "'" not in line, line
    assert " --run-dir elsewhere in the plan, python -m " in line


def run_cli(monkeypatch, capsys, *args: str, columns: int = 80) -> tuple[int, str, str]:  # noqa: ANN001
    """nanoplan in this process: (exit code, stdout, stderr)."""
    import sys

    import pytest

    from nanoplan.cli import main

    monkeypatch.setattr(sys, "argv", ["nanoplan", *args])
    monkeypatch.setenv("COLUMNS", str(columns))
    monkeypatch.setenv("LINES", "24")
    with pytest.raises(SystemExit) as e:
        main()
    out = capsys.readouterr()
    return int(e.value.code or 0), out.out, out.err


def test_estimate_refuses_the_plans_run_would_refuse(monkeypatch, capsys, tmp_path, tiny_data) -> None:
    """An absolute (or '..') --run-dir and a --vocab-size below --data's: one error line at estimate, no plan."""
    monkeypatch.chdir(tmp_path)
    base = ("estimate", "--gpu", "CPU", "--depth", "2", "--seq-len", "64", "--total-batch-tokens", "1024",
            "--steps", "5", "--out", "p.json")
    for bad in (str(tmp_path / "abs"), "../up", "~/home"):
        code, out, err = run_cli(monkeypatch, capsys, *base, "--run-dir", bad)
        assert code == 2 and err.startswith(f"error: --run-dir: is {bad!r}; a plan file may only name") and \
            len(err.splitlines()) == 2, err
    code, _, err = run_cli(monkeypatch, capsys, *base, "--data", str(tiny_data), "--vocab-size", "200")
    assert code == 2 and err.startswith(f"error: --vocab-size: 200 is smaller than the vocab of {tiny_data} (256 "), err
    assert not (tmp_path / "p.json").exists()
    # what estimate accepts, run's own check accepts: a relative run dir, a vocab padded past the data's
    code, _, err = run_cli(monkeypatch, capsys, *base, "--data", str(tiny_data), "--vocab-size", "320",
                           "--run-dir", "runs/mine")
    assert code == 0, err
    from planner.plan import load_plan
    from runner.preflight import check_data, check_plan_run_dir

    plan = load_plan(tmp_path / "p.json")
    assert check_plan_run_dir(plan.launch.run_dir) is None and check_data(plan, tiny_data).vocab_size == 256


def test_the_loss_is_labelled_with_the_law_it_comes_from() -> None:
    """planner/scaling.py is Muennighoff et al.'s data-constrained fit, not Hoffmann et al.'s (Chinchilla)."""
    from planner.explain import loss_caption

    r = search(depth_ladder("nanochat", vocab_size=256), parse_gpu_spec("8xH100"), Length(budget_usd=100))
    cap = loss_caption(r) or ""
    assert cap.startswith("* Muennighoff et al. 2023 fit (C4, GPT-2 tokenizer") and "Chinchilla" not in cap


def test_a_default_length_and_the_summary_count_the_same_parameters(monkeypatch, capsys, tmp_path) -> None:
    """nanochat 2026-07 trains 12 tokens per "scaling param" (transformer matrices + lm_head) when given no
    length (scripts/base_train.py at 92d63d4); the summary and the warnings count the same parameters, so the
    header no longer says 20 tokens/param while the summary says 10.6."""
    from planner.plan import load_plan

    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(monkeypatch, capsys, "estimate", "--trainer", "nanochat", "--depth", "20", "--gpu",
                             "A100-40GB", "--out", "p.json", columns=200)
    assert code == 0, err
    scaling = 12 * 20 * 1280**2 + 32768 * 1280 + 10 * 12 * 10   # blocks + lm_head + ve gates (10 layers × 12 × 10)
    assert scaling == 435_160_240
    plan = load_plan(tmp_path / "p.json")
    batch = plan.schedule.tokens_per_step
    assert batch == 2**20                                         # nanochat's own batch rule at d20
    steps = int(12 * scaling) // batch
    assert plan.schedule.total_steps == steps and plan.schedule.tokens_per_param == _approx(steps * batch / scaling)
    text = " ".join(out.split())
    assert "12 tokens per scaling param (its transformer matrices + lm_head, 435M of 897M params" in text
    assert f"= {steps * batch / scaling:.1f} tokens/scaling param (435M)" in text and "undertrained" not in text
    # nanoplan's own runner: Chinchilla's 20 over every parameter, and the summary says 20.0 of the same
    code, out, err = run_cli(monkeypatch, capsys, "estimate", "--depth", "20", "--out", "q.json", columns=200)
    text = " ".join(out.split())
    assert "20 tokens per parameter (Chinchilla's rule), over all 561M parameters" in text
    assert "= 20.0 tokens/param" in text


def test_the_summary_shows_the_mfu_the_hours_come_from() -> None:
    """The hours come from tokens/s, i.e. the whole step's MFU; the compute phase's MFU is higher (48% vs 28%)."""
    from planner.build import build_plan
    from planner.plan import PlanRequest
    from planner.profiles import find_profile
    from planner.report import summary_rows
    from planner.spec import nanochat

    p = build_plan(PlanRequest.model_validate({"gpu": "8xH100", "profile": find_profile("H100"), "model": nanochat(6),
                                               "steps": 1000}))
    tp = p.throughput
    assert round(tp.mfu, 2) != round(tp.effective_mfu, 2)
    assert tp.effective_mfu == _approx(tp.tokens_per_sec * p.model.flops_per_token / (8 * tp.peak_flops_per_gpu))
    speed = dict(summary_rows(p))["speed"]
    assert f"MFU {tp.effective_mfu:.0%})" in speed and f"{tp.mfu:.0%}" not in speed
    assert p.budget.hours * 3600 == _approx(p.budget.startup_seconds + 1000 * p.schedule.tokens_per_step /
                                            tp.tokens_per_sec)


def test_a_measured_start_up_replaces_the_assumed_one(monkeypatch, capsys, tmp_path) -> None:
    """--startup-seconds: what a launch took where it was measured (the GPU kit's small run, a probe) replaces the
    60 s + 120 s a GPU plan otherwise assumes; pinned plans and the search count it alike."""
    from planner.plan import load_plan

    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(monkeypatch, capsys, "estimate", "--gpu", "8xH100", "--depth", "4", "--hours", "0.01",
                           "--out", "a.json")
    assert code == 2 and "start-up and compile warm-up (3.0 min)" in err, err
    code, _, err = run_cli(monkeypatch, capsys, "estimate", "--gpu", "8xH100", "--depth", "4", "--hours", "0.01",
                           "--startup-seconds", "10", "--out", "b.json")
    plan = load_plan(tmp_path / "b.json")
    assert code == 0 and plan.budget.startup_seconds == 10 and plan.request.startup_seconds == 10, err
    assert plan.schedule.total_steps == int((36 - 10) / plan.throughput.step_seconds)
    code, _, err = run_cli(monkeypatch, capsys, "estimate", "--gpu", "8xH100", "--hours", "0.05",
                           "--startup-seconds", "10", "--out", "c.json")
    searched = load_plan(tmp_path / "c.json")
    assert code == 0 and searched.budget.startup_seconds == 10, err
    assert searched.schedule.total_steps == int((180 - 10) / searched.throughput.step_seconds)
