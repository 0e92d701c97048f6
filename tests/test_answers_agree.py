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
