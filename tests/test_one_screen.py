"""Issue 23: one screen per answer, and numbers that do not contradict each other."""

from __future__ import annotations

import io
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from planner.build import build_plan
from planner.plan import PlanRequest, load_plan
from planner.profiles import find_profile
from planner.spec import style_spec
from runner.preflight import peak_checkpoint_bytes


def nanoplan(*args: str, columns: int = 80) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": str(columns), "LINES": "24"}
    return subprocess.run([sys.executable, "-m", "nanoplan", *args], capture_output=True, text=True, timeout=120,
                          env=env)


# ---------------------------------------------------------------- one screen

@pytest.mark.parametrize("model", [[], ["--depth", "20"]])
def test_default_answer_fits_one_80x24_screen(tmp_path: Path, model: list[str]) -> None:
    out = tmp_path / "p.json"
    r = nanoplan("estimate", "--gpu", "8xH100", "--budget", "1000", *model, "--out", str(out))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.rstrip("\n").splitlines()
    assert len(lines) <= 22, r.stdout
    assert max(len(x) for x in lines[:-1]) <= 80
    plan = load_plan(out)
    text = r.stdout
    assert f"{plan.model.name} (nanochat)" in text and f"{plan.training.device_batch_size} × " in text
    assert f"{plan.throughput.tokens_per_sec:,.0f} tokens/s" in text and f"{plan.schedule.tokens_per_param:.1f} " \
           "tokens/param" in text
    memory = next(x for x in lines if x.startswith("memory")).rstrip()
    assert memory.endswith(": fits") and f"of {plan.memory.capacity_bytes / 2**30:.2f} GiB per GPU" in memory
    assert "Why " not in text and "Budget and schedule" not in text and "--explain" in text
    assert lines[-1].startswith(f"→ {plan.model.name},")
    if not model:   # the search: the winner and 3 runners-up
        assert len([x for x in lines if re.match(r"^(★|\d) ", x)]) == 4


def test_explain_keeps_the_breakdown_and_json_stays_complete(tmp_path: Path) -> None:
    r = nanoplan("estimate", "--gpu", "8xH100", "--budget", "1000", "--explain", "--out", str(tmp_path / "p.json"))
    assert r.returncode == 0, r.stderr
    for part in ("Why d", "Memory per GPU", "Throughput", "Budget and schedule", "FLOPs/token"):
        assert part in r.stdout, part
    assert len([x for x in r.stdout.splitlines() if re.match(r"^(★|\d) ", x)]) == 6   # --explain: 5 runners-up
    j = nanoplan("estimate", "--gpu", "8xH100", "--budget", "1000", "--json")
    d = json.loads(j.stdout)
    assert d["memory"]["breakdown"] and d["throughput"]["step_seconds"] > 0 and d["schedule"]["storage_bytes"] > 0


def test_verdict_breaks_between_fields_in_a_terminal(tmp_path: Path) -> None:
    from nanoplan.estimate import _emit
    from planner.report import verdict, wrap_fields

    plan = build_plan(PlanRequest(model=style_spec("nanochat", 32, 2048, 65536), gpu="8xH100",
                                  profile=find_profile("H100"), budget_usd=1000))
    buf = io.StringIO()
    _emit(plan, "/tmp/some/longer/plan.json", False, Console(file=buf, width=80, force_terminal=True,
                                                              color_system=None))
    line = verdict(plan, "/tmp/some/longer/plan.json")
    assert len(line) > 80
    parts = wrap_fields(line, 80)
    assert all(len(p) <= 80 for p in parts) and len(parts) >= 2
    assert " ".join(p.strip() for p in parts) == line
    tail = buf.getvalue().rstrip("\n").splitlines()[-len(parts):]
    assert [t.rstrip() for t in tail] == parts
    for p in parts[:-1]:                 # every break falls after a field's comma, never inside a number
        assert p.endswith(","), p


# ---------------------------------------------------------------- one epoch rule

@pytest.mark.parametrize("extra", [["--depth", "64"], ["--depth", "64", "--strategy", "fsdp",
                                                       "--activation-checkpointing"], ["--depth", "12"]])
def test_one_epoch_cap_however_the_model_is_pinned(tmp_path: Path, extra: list[str]) -> None:
    out = tmp_path / "p.json"
    r = nanoplan("estimate", "--gpu", "8xH100", "--budget", "1000", "--dataset-tokens", "350M", *extra,
                 "--out", str(out))
    assert r.returncode == 0, r.stderr
    plan = load_plan(out)
    assert plan.schedule.epochs is not None and plan.schedule.epochs <= 4.0
    assert plan.budget.limited_by == "epochs" and plan.budget.usd < 1000
    assert plan.schedule.total_steps == math.floor(4 * 350e6 / plan.schedule.tokens_per_step)
    assert any("4 epochs" in w or "4.0 epochs" in w for w in plan.warnings), plan.warnings


def test_past_the_epoch_cap_is_warned_and_the_help_states_it(tmp_path: Path) -> None:
    out = tmp_path / "p.json"
    r = nanoplan("estimate", "--gpu", "8xH100", "--budget", "1000", "--dataset-tokens", "350M", "--depth", "12",
                 "--max-epochs", "10", "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert load_plan(out).schedule.epochs == pytest.approx(10, rel=1e-3)
    assert "! repeated data: 10.0 epochs" in r.stdout
    h = nanoplan("estimate", "--help", columns=200)
    text = " ".join(h.stdout.split())
    assert "default 4 with a dataset" in text and "--max-epochs of them, 4 by default" in text


# ---------------------------------------------------------------- one storage figure

def test_estimate_and_preflight_give_one_storage_figure(tmp_path: Path) -> None:
    out = tmp_path / "p.json"
    r = nanoplan("estimate", "--gpu", "8xH100", "--budget", "1000", "--depth", "32", "--out", str(out))
    plan = load_plan(out)
    s = plan.schedule
    assert peak_checkpoint_bytes(plan) == s.storage_bytes == 5 * s.checkpoint_bytes   # 3 kept + best + 1 written
    assert f"{s.storage_bytes / 2**30:.2f} GiB of checkpoints" in r.stdout


# ---------------------------------------------------------------- the loss column

def _loss_cells(stdout: str) -> tuple[str, list[str]]:
    head = next(x for x in stdout.splitlines() if x.startswith("#  model"))
    rows = [x for x in stdout.splitlines() if re.match(r"^(★|\d) ", x)]
    return head.split()[-1], [x.split()[-1] for x in rows]


def test_loss_outside_the_fit_vocabulary_is_labelled_a_ranking_score() -> None:
    r = nanoplan("estimate", "--gpu", "8xH100", "--budget", "1000", "--vocab-size", "32", "--out", "/dev/null")
    assert r.returncode == 0, r.stderr
    head, _ = _loss_cells(r.stdout)
    assert head == "loss*"
    assert ("* Muennighoff et al. 2023 fit (C4, GPT-2 tokenizer, vocab 50,257): ranks runs, not a loss to expect at "
            "vocab 32") in " ".join(r.stdout.split())
    d = nanoplan("estimate", "--gpu", "8xH100", "--budget", "1000", "--out", "/dev/null")
    assert _loss_cells(d.stdout)[0] == "loss" and "ranks runs" not in d.stdout


def test_runners_up_show_the_order_of_their_loss() -> None:
    r = nanoplan("estimate", "--gpu", "8xH100", "--budget", "1000", "--explain", "--out", "/dev/null",
                 columns=200)
    _, cells = _loss_cells(r.stdout)
    shown = [float(c) for c in cells]
    assert shown == sorted(shown) and len(set(cells)) == len(cells), cells   # sorted, and no two look the same


# ---------------------------------------------------------------- explicit dims

def test_explicit_dims_say_which_family_was_assumed(tmp_path: Path) -> None:
    dims = ("--n-layer", "36", "--d-model", "1280", "--n-head", "20", "--hours", "1")
    r = nanoplan("estimate", *dims, "--out", str(tmp_path / "a.json"))
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stdout.splitlines() if x.startswith("!"))
    assert "nanochat family assumed" in line and "--style gpt2 or llama" in line and len(line) <= 80
    g = nanoplan("estimate", *dims, "--style", "gpt2", "--out", str(tmp_path / "b.json"))
    assert "assumed" not in g.stdout and load_plan(tmp_path / "b.json").model.n_params < \
        load_plan(tmp_path / "a.json").model.n_params
