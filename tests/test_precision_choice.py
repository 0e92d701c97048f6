"""Pure bf16 (`--precision bf16`) is a different plan from bf16 autocast; the search does not pick it itself and says
so, with what it would change (planner/precision_choice.py: its AdamW updates round into bf16 weights with no fp32
master copy, Zamirai et al. 2020, which the predicted loss the search ranks by cannot price)."""

from __future__ import annotations

import re
from dataclasses import replace

from planner.candidates import Length
from planner.memory import estimate
from planner.memory_terms import StepConfig
from planner.plan import load_plan
from planner.precision_choice import PURE_BF16_WARNING, pure_bf16_sentence
from planner.profiles import parse_gpu_spec
from planner.selection import search
from planner.spec import nanochat
from planner.throughput import estimate_throughput
from tests.conftest import nanoplan_cli

GiB = 2**30


def test_the_search_says_what_pure_bf16_would_change_and_why_not(capsys, tmp_path) -> None:
    hw = parse_gpu_spec("8xH100")
    result = search([nanochat(d) for d in (8, 12, 16)], hw, Length(budget_usd=50.0))
    best = result.best
    assert best is not None and result.settings.precision == "bf16-autocast"
    sentence = pure_bf16_sentence(result)
    assert sentence is not None and "was not searched" in sentence and "2010.06192" in sentence
    # the numbers, from the exact walk and estimate_throughput (not the search's fast paths)
    cfg = StepConfig(spec=best.spec, device_batch_size=best.device_batch, grad_accum_steps=best.grad_accum, dp=8,
                     strategy=best.strategy, activation_checkpointing=best.activation_checkpointing,  # type: ignore[arg-type]
                     loss_chunk_tokens=result.settings.loss_chunk_tokens, compile=True)
    pure = replace(cfg, precision="bf16")
    less = estimate(cfg).allocated_peak - estimate(pure).allocated_peak
    assert less > 0 and f"{less / GiB:.2f} GiB less" in sentence
    faster = estimate_throughput(pure, hw).tokens_per_sec / estimate_throughput(cfg, hw).tokens_per_sec - 1
    assert faster > 0 and f"run {faster:+.1%} tokens/s" in sentence
    code, out, err = nanoplan_cli(["estimate", "--gpu", "8xH100", "--budget", "50", "--explain", "--out", "s.json"],
                                  capsys, tmp_path)
    text = " ".join(re.sub(r"[│•╭╮╰╯─]", " ", out).split())
    assert code == 0 and "Pure bf16 (--precision bf16) was not searched" in text, err
    assert load_plan(tmp_path / "s.json").training.precision == "bf16-autocast"


def test_asked_for_pure_bf16_is_planned_with_a_warning(capsys, tmp_path) -> None:
    code, out, err = nanoplan_cli(["estimate", "--gpu", "8xH100", "--depth", "12", "--precision", "bf16", "--hours",
                                   "1", "--strategy", "zero1", "--out", "b.json"], capsys, tmp_path)
    plan = load_plan(tmp_path / "b.json")
    assert code == 0 and plan.training.precision == "bf16" and PURE_BF16_WARNING in plan.warnings, err
    auto = load_plan_for(capsys, tmp_path)
    assert PURE_BF16_WARNING not in auto.warnings
    assert plan.training.strategy == auto.training.strategy == "zero1"       # the same sharding, to compare
    # AdamW's two moments in bf16 rather than fp32: 2 × 2 bytes fewer per parameter, sharded over 8 ranks
    P = plan.model.n_params
    assert auto.memory.breakdown["optimizer_state"] - plan.memory.breakdown["optimizer_state"] == 2 * 2 * P // 8


def load_plan_for(capsys, tmp_path):
    code, _, err = nanoplan_cli(["estimate", "--gpu", "8xH100", "--depth", "12", "--hours", "1", "--strategy", "zero1",
                                 "--out", "a.json"], capsys, tmp_path)
    assert code == 0, err
    return load_plan(tmp_path / "a.json")
