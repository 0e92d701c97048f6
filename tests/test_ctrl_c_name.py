"""Ctrl-C is reported as Ctrl-C (issue 28): `nanoplan run` asks its workers to stop with SIGTERM after writing the
signal it got into the stop-request file, and the workers report that signal, not the SIGTERM that carried it."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from runner.checkpoint_layout import step_dir
from runner.checkpoint_meta import verify
from runner.metrics import read_metrics
from tests.test_reliability_faults import kill_tree, wait_for
from tests.test_reliability_process import start

pytestmark = pytest.mark.slow


def test_ctrl_c_during_training_is_reported_as_sigint(tmp_path: Path, tiny_plan) -> None:
    plan = tiny_plan(steps=100_000, hyper={"val_every_steps": 4})
    run = tmp_path / "run"
    p = start(plan, run)
    try:
        wait_for(lambda: len(read_metrics(run)) >= 6, timeout=90, what="6 steps")
        os.kill(p.pid, signal.SIGINT)           # what a terminal's Ctrl-C sends to `nanoplan run`
        out, err = p.communicate(timeout=90)
    finally:
        kill_tree(p)
    assert p.returncode == 0, err[-3000:]
    stop = json.loads((run / "stop.json").read_text())
    assert stop["reason"] == "signal" and stop["signals"][0] == "SIGINT", stop["signals"]
    assert f"got SIGINT: stopping after step {stop['step']} with a checkpoint" in out + err
    assert "got SIGTERM" not in out + err
    assert verify(step_dir(run, stop["step"])) == (True, "ok")
    last = read_metrics(run)[-1]           # the final checkpoint's validation is in the last row, as in the summary
    assert last["step"] == stop["step"] and last["val_loss"] == stop["summary"]["final_val_loss"]
