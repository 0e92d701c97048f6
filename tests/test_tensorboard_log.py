"""Optional TensorBoard logging (runner/tensorboard_log.py), read back with TensorBoard's own event reader."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from runner.metrics import MetricsLog
from runner.tensorboard_log import DIR, ENV, TAGS, open_log
from tests.conftest import REPO, runner_env

ea = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator",
                         reason="the tensorboard package is not installed (pip install 'nanoplan[tensorboard]')")


def _read(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    acc = ea.EventAccumulator(str(log_dir), size_guidance={ea.SCALARS: 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def _row(step: int, **kw: float | None) -> dict:
    return {"step": step, "total_steps": 10, "loss": 5.0 - step / 10, "lr": 1e-3, "grad_norm": 0.5 + step,
            "tokens_per_sec": 1000.0 * step, "mfu": 0.01 * step, "step_seconds": 0.5, "elapsed_hours": step / 3600,
            "usd_spent": 0.25 * step, "tokens_seen": 512 * step, "epoch": 0.1, "max_memory_allocated": None,
            "max_memory_reserved": None, "world_size": 2, "device": "cpu", "compiled": False, "segment": 0, **kw}


def test_every_scalar_reads_back_at_its_step(tmp_path: Path) -> None:
    log = MetricsLog(tmp_path, tensorboard=True)
    for step in (1, 2, 3):
        log.write(_row(step, **({"val_loss": 4.25} if step == 2 else {}),
                       **({"max_memory_allocated": 3 * 2**30, "max_memory_reserved": 4 * 2**30} if step == 3 else {})))
    log.close()
    got = _read(tmp_path / DIR)
    assert got["loss/train"] == [(1, pytest.approx(4.9)), (2, pytest.approx(4.8)), (3, pytest.approx(4.7))]
    assert got["loss/val"] == [(2, 4.25)]
    assert got["speed/tokens_per_sec"] == [(1, 1000.0), (2, 2000.0), (3, 3000.0)]
    assert got["speed/mfu"] == [(s, pytest.approx(0.01 * s)) for s in (1, 2, 3)]
    assert got["cost/usd_spent"] == [(1, 0.25), (2, 0.5), (3, 0.75)]
    assert got["memory/max_allocated_gib"] == [(3, 3.0)] and got["memory/max_reserved_gib"] == [(3, 4.0)]
    assert got["train/lr"] == [(s, pytest.approx(1e-3)) for s in (1, 2, 3)]
    assert set(got) == {tag for tag, _ in TAGS.values()}            # nothing else (no segment, epoch, ...)
    assert (tmp_path / "metrics.jsonl").read_text().count("\n") == 3   # metrics.jsonl as before


def test_a_resumed_run_replaces_the_steps_after_its_checkpoint(tmp_path: Path) -> None:
    first = MetricsLog(tmp_path, tensorboard=True)
    for step in range(1, 6):
        first.write(_row(step))
    first.close()                      # killed after step 5; the checkpoint was at step 3
    second = MetricsLog(tmp_path, tensorboard=True)
    for step in (4, 5, 6):
        second.write(_row(step, loss=1.0 * step, segment=1))
    second.close()
    assert _read(tmp_path / DIR)["loss/train"] == [(1, pytest.approx(4.9)), (2, pytest.approx(4.8)),
                                                   (3, pytest.approx(4.7)), (4, 4.0), (5, 5.0), (6, 6.0)]


def test_off_unless_asked_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    log = MetricsLog(tmp_path / "a")
    log.write(_row(1))
    log.close()
    assert not (tmp_path / "a" / DIR).exists() and open_log(tmp_path / "a") is None
    monkeypatch.setenv(ENV, "1")
    log = MetricsLog(tmp_path / "b")
    log.write(_row(1))
    log.close()
    assert _read(tmp_path / "b" / DIR)["loss/train"] == [(1, pytest.approx(4.9))]


def test_the_flag_without_the_package_is_one_error_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from nanoplan.cli import app

    monkeypatch.setattr("runner.tensorboard_log.available", lambda: False)
    r = CliRunner().invoke(app, ["run", str(tmp_path / "plan.json"), "--tensorboard", "--dry-run"])
    assert r.exit_code != 0 and "tensorboard package" in str(r.exception) and "nanoplan[tensorboard]" in str(
        r.exception)


@pytest.mark.slow
def test_nanoplan_run_with_the_flag_writes_events_tensorboard_reads(tmp_path: Path, tiny_plan) -> None:
    plan = tiny_plan(steps=6, hyper={"val_every_steps": 3})
    run_dir = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "nanoplan", "run", str(plan), "--run-dir", str(run_dir), "--tensorboard"],
                       capture_output=True, text=True, timeout=180, cwd=REPO, env=runner_env())   # env says 0: the flag wins
    assert r.returncode == 0, r.stderr[-3000:]
    got = _read(run_dir / DIR)
    assert [s for s, _ in got["loss/train"]] == [1, 2, 3, 4, 5, 6]
    # the scheduled passes (3, 6) and the one before the first checkpoint (step 1, which measures the write): every
    # validation the run makes reaches metrics.jsonl and TensorBoard (issue 28), the last one equal to the summary's
    assert [s for s, _ in got["loss/val"]] == [1, 3, 6]
    from runner.metrics import read_metrics
    rows = read_metrics(run_dir)
    assert [(r["step"], r["val_loss"]) for r in rows if "val_loss" in r] == [(s, pytest.approx(v, rel=1e-6))
                                                                             for s, v in got["loss/val"]]
    import json
    stop = json.loads((run_dir / "stop.json").read_text())
    assert stop["summary"]["final_val_loss"] == rows[-1]["val_loss"]
    assert all(v > 0 for _, v in got["speed/tokens_per_sec"]) and "memory/max_allocated_gib" not in got   # CPU
    without = tmp_path / "plain"
    r = subprocess.run([sys.executable, "-m", "nanoplan", "run", str(plan), "--run-dir", str(without)],
                       capture_output=True, text=True, timeout=180, cwd=REPO, env=runner_env())
    assert r.returncode == 0, r.stderr[-3000:]
    assert not (without / DIR).exists()
