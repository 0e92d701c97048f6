"""A spot run, for real: a tiny CPU plan made with --spot is killed with SIGKILL (every process, as a
preempted machine is) at Poisson times, several times, and relaunched with `nanoplan run` each time. The
interruptions are a seeded Poisson process on training time: each launch is killed an exponential time
(mean MEAN_S) after its first step.

- The final model and every step's loss equal an uninterrupted run's (a replayed step too).
- Work lost per interruption is at most one checkpoint interval plus one step (and the write in flight).
- The real wall time summed over every launch stays within the plan's hours plus one start-up, and the
  budget ledger (launches.json) counted every launch, the killed ones included, up to its last heartbeat.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from planner.plan import SpotRequest, load_plan
from runner import checkpoint as ck
from runner.checkpoint_layout import complete_steps
from runner.ledger import HEARTBEAT_S, ORPHAN_EXIT_S, PREPAID_S, ledger_total_s, read_ledger
from runner.metrics import read_metrics
from tests.conftest import REPO, make_tiny_plan, runner_env, torchrun
from tests.test_reliability_faults import kill_tree, segments, wait_for

pytestmark = pytest.mark.slow

STEPS = 240
EVERY_S = 0.6            # the plan's checkpoint cadence (budget seconds)
HOURS = 150 / 3600       # the plan's hard limit: far above what the launches take, so it never re-lays the LR
KILLS = 3
MEAN_S = 0.5             # mean training seconds between interruptions (Poisson); 240 steps train in ~2.5 s here


def spot_plan(path: Path, data: Path) -> Path:
    """1xCPU tiny, --spot (your price $0, --mtbi 2 min), --hours as the cap; --max-epochs pins STEPS."""
    tokens_per_step = 512
    train_tokens = json.loads((data / "meta.json").read_text())["train_tokens"]
    return make_tiny_plan(path, data, gpus=1, steps=None, hours=HOURS, price=0.0, keep_last=1000,
                          dataset_tokens=train_tokens, max_epochs=(STEPS + 0.5) * tokens_per_step / train_tokens,
                          spot=SpotRequest(mtbi_hours=2 / 60, checkpoint_every_minutes=EVERY_S / 60))


def launch(plan: Path, run: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "nanoplan", "run", str(plan), "--run-dir", str(run)], cwd=REPO,
                            env=runner_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def model_state(run: Path, step: int) -> dict[str, torch.Tensor]:
    return torch.load(ck.step_dir(run, step) / "model.pt", map_location="cpu", weights_only=True)


def test_a_spot_run_killed_at_poisson_times_resumes_to_the_uninterrupted_result(tmp_path: Path,
                                                                                tiny_data: Path) -> None:
    plan_path = spot_plan(tmp_path / "plan.json", tiny_data)
    plan = load_plan(plan_path)
    assert plan.spot is not None and plan.schedule.total_steps == STEPS and plan.budget.limited_by == "epochs"
    assert plan.schedule.checkpoint_every_minutes == pytest.approx(EVERY_S / 60)

    # the uninterrupted reference, run alongside the spot run (one core each)
    ref_run, ref_result = tmp_path / "ref", {}
    ref = threading.Thread(target=lambda: ref_result.update(r=torchrun(plan_path, ref_run, 1, timeout=240)))
    ref.start()

    run = tmp_path / "run"
    rng = random.Random(24)
    walls: list[float] = []
    kills = killed = 0       # interruptions of training; SIGKILLs of a launch (one may land after the last step)
    while True:
        n_seg = len(segments(run)) if (run / "run_info.json").exists() else 0
        t0 = time.monotonic()
        p = launch(plan_path, run)
        try:
            if kills < KILLS and STEPS not in complete_steps(run):
                wait_for(lambda n=n_seg: any(x["segment"] == n for x in read_metrics(run)), timeout=120,
                         what="the launch's first step")
                time.sleep(rng.expovariate(1.0 / MEAN_S))       # Poisson: exponential gaps of training time
                if p.poll() is None:
                    kill_tree(p)                                  # the machine is gone: every process, -9
                    walls.append(time.monotonic() - t0)
                    killed += 1
                    # a kill after the final checkpoint (during the summary) interrupts no training: the
                    # next launch has nothing to do, and says so
                    kills += STEPS not in complete_steps(run)
                    continue
            p.communicate(timeout=240)
            walls.append(time.monotonic() - t0)
            assert p.returncode == 0
            break
        finally:
            kill_tree(p)
    ref.join(timeout=240)
    r = ref_result["r"]
    assert r.returncode == 0, r.stderr[-3000:]  # type: ignore[union-attr]
    assert kills >= 2, f"only {kills} interruption(s) landed before the run finished"

    # the final model and every step's loss equal the uninterrupted run's
    ref_rows = read_metrics(ref_run)
    assert [x["step"] for x in ref_rows] == list(range(1, STEPS + 1))
    ref_loss = {x["step"]: x["loss"] for x in ref_rows}
    rows = read_metrics(run)
    assert {x["step"] for x in rows} == set(range(1, STEPS + 1))
    for x in rows:                                               # replayed steps too
        assert x["loss"] == ref_loss[x["step"]], (x["step"], x["loss"], ref_loss[x["step"]])
    mine, theirs = model_state(run, STEPS), model_state(ref_run, STEPS)
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)
    assert json.loads((run / "stop.json").read_text())["reason"] == "total_steps"

    # work lost per interruption: at most one checkpoint interval plus one step of training
    segs = segments(run)
    # one segment per interrupted launch, one that finished; a launch after a late kill may add one that trains nothing
    assert kills + 1 <= len(segs) <= killed + 1 and [x["segment"] for x in segs] == list(range(len(segs)))
    step_max = max(x["step_seconds"] for x in rows)
    for k in range(kills):
        resumed = segs[k + 1]["resumed_from_step"] or 0
        lost = [x for x in rows if x["segment"] == k and x["step"] > resumed]
        lost_s = sum(x["step_seconds"] for x in lost)
        assert lost_s <= EVERY_S + step_max, (k, lost_s, resumed, [x["step"] for x in lost])

    # every launch was counted, and the launches stayed within the plan's hours plus one start-up
    total_wall = sum(walls)
    first_step = rows[0]["elapsed_hours"] * 3600          # the first launch's start-up and first step
    assert total_wall <= HOURS * 3600 + first_step
    counted = ledger_total_s(read_ledger(run), json.loads((run / "run_info.json").read_text())["plan_hash"])
    # the ledger never counts short; a killed launch's last beat may count up to its prepaid time ahead
    ahead = killed * max(PREPAID_S, ORPHAN_EXIT_S)
    assert total_wall - killed * (HEARTBEAT_S + 0.5) <= counted <= total_wall + ahead + 0.5, (counted, total_wall, walls)
