"""Issue 30 #2: the budget follows the run (planner.plan.budget_key), not the fields a resume may change.

Eleven killed launches of a 72 s plan and a twelfth with only `--checkpoint-every-minutes` changed ran
98.6 s (1.37x the budget): the launch records were keyed by the plan hash, which includes the cadence
and keep_last. The property test with a cadence change between launches is in tests/test_budget_promise.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from planner.build import build_plan
from planner.plan import RESUME_SAFE_FIELDS, budget_key, load_plan, plan_hash, save_plan
from runner import ledger
from runner.checkpoint_meta import resume_mismatch, train_hash
from runner.clock import boottime
from runner.launcher import Launch
from tests.conftest import REPO, make_tiny_plan, runner_env


def recadenced(src: Path, dst: Path, minutes: float = 0.5, keep_last: int = 5) -> Path:
    """`src` re-planned with another checkpoint cadence and keep_last, as `estimate ... --checkpoint-every-minutes`."""
    req = load_plan(src).request.model_copy(update={"checkpoint_every_minutes": minutes, "keep_last": keep_last})
    save_plan(build_plan(req, plan_path=str(dst)), dst)
    return dst


def test_the_budget_key_ignores_exactly_what_a_resume_may_change(tmp_path: Path, tiny_data: Path) -> None:
    a = make_tiny_plan(tmp_path / "a.json", tiny_data, steps=None, hours=0.002)
    b = recadenced(a, tmp_path / "b.json")
    pa, pb = load_plan(a), load_plan(b)
    assert plan_hash(pa) != plan_hash(pb) and budget_key(pa) == budget_key(pb) == train_hash(pb)
    assert resume_mismatch({"plan_hash": plan_hash(pa), "train_hash": budget_key(pa)}, pb) is None
    longer = make_tiny_plan(tmp_path / "c.json", tiny_data, steps=None, hours=0.004)      # another budget: another run
    lr = make_tiny_plan(tmp_path / "d.json", tiny_data, steps=None, hours=0.002, hyper={"lr": 1e-3})
    assert len({budget_key(pa), budget_key(load_plan(longer)), budget_key(load_plan(lr))}) == 3
    assert {"request.checkpoint_every_minutes", "request.keep_last"} <= set(RESUME_SAFE_FIELDS)


def test_a_changed_cadence_carries_the_spent_budget(tmp_path: Path, tiny_data: Path) -> None:
    """A launch of a 7.2 s plan that used 7.5 s (recorded as `nanoplan run` records it), then the same plan with
    another cadence and keep_last: the relaunch reads the run's records and starts nothing. Before, its plan hash
    matched no record, so it trained a whole budget again."""
    a = make_tiny_plan(tmp_path / "a.json", tiny_data, steps=None, hours=0.002)     # 7.2 s
    b = recadenced(a, tmp_path / "b.json")
    run = tmp_path / "run"
    pa = load_plan(a)
    first = Launch(run, node_rank=0, plan_hash=plan_hash(pa), launch_id="a1", t0=boottime() - 7.5, scale=1.0,
                   budget_key=budget_key(pa))
    first.acquire()
    first.start()
    first.finish("failed")           # killed: its last beat is its record
    first.release()
    recs = ledger.read_ledger(run)
    assert recs[0]["budget_key"] == budget_key(pa) and recs[0]["spent_s"] >= 7.5
    body = (run / ledger.LEDGER).read_text()
    r = subprocess.run([sys.executable, "-m", "nanoplan", "run", str(b), "--run-dir", str(run)],
                       capture_output=True, text=True, timeout=120, cwd=REPO, env=runner_env())
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stderr.startswith(f"nothing to do: the budget of {run} is spent: 7.5 s of its 7.2 s"), r.stderr
    assert (run / ledger.LEDGER).read_text() == body and not (run / "run_info.json").exists()   # nothing started


def test_records_link_a_probed_plan_its_source_and_their_cadence_changes(tmp_path: Path) -> None:
    """A `run --probe` record names the probed plan and its source, each by hash and by budget key: a later
    launch of either, with another cadence, counts it; another run's records do not count."""
    (tmp_path / ledger.LEDGER).write_text(json.dumps({"launches": [
        {"id": "a", "plan_hash": "P1", "source_hash": "S1", "budget_key": "KP", "source_key": "KS",
         "host": "h", "pid": 1, "carried_s": 0.0, "spent_s": 30.0, "state": "ended"},
        {"id": "b", "plan_hash": "O", "host": "h", "pid": 1, "carried_s": 0.0, "spent_s": 99.0, "state": "ended"},
    ]}))
    assert ledger.spent_before_s(tmp_path, "P2", key="KP") == 30.0     # the probed plan, recadenced
    assert ledger.spent_before_s(tmp_path, "S2", key="KS") == 30.0     # its source, recadenced (a new probe)
    assert ledger.spent_before_s(tmp_path, "P2", key="KX") == 0.0      # another run
    assert ledger.spent_before_s(tmp_path, "O") == 99.0
