"""Checkpoints: atomic files, meta.json last with checksums, verification, faults, retention, best.json."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from planner.plan import plan_hash
from runner.checkpoint import save_checkpoint
from runner.checkpoint_layout import BEST, complete_steps, list_steps, step_dir
from runner.checkpoint_meta import verify
from runner.checkpoint_retention import latest_good, read_best, retain, set_aside, update_best
from runner.faults import FAULT_EXIT, Faults
from runner.metrics import MetricsLog, read_metrics
from runner.torch_files import load_torch, sha256_file

REPO = Path(__file__).resolve().parents[1]


def save(run_dir: Path, step: int, value: float = 1.0, **meta) -> Path:
    return save_checkpoint(
        run_dir, step, rank=0, world_size=1,
        model_state=lambda: {"w": torch.full((4, 4), value)},
        optim_state=lambda: {"optimizer": {"state": {}, "param_groups": []}, "schedulers": []},
        meta={"plan_hash": "abc", **meta},
    )


def test_checkpoint_files_and_meta_with_checksums(tmp_path: Path) -> None:
    p = save(tmp_path, 7, val_loss=2.5)
    assert p == tmp_path / "checkpoints" / "step_00000007"
    assert sorted(f.name for f in p.iterdir()) == ["meta.json", "model.pt", "optim_rank0.pt", "rng_rank0.pt"]
    meta = json.loads((p / "meta.json").read_text())
    assert meta["step"] == 7 and meta["val_loss"] == 2.5 and meta["plan_hash"] == "abc"
    assert set(meta["files"]) == {"model.pt", "optim_rank0.pt", "rng_rank0.pt"}
    for name, info in meta["files"].items():
        assert info["sha256"] == sha256_file(p / name) and info["bytes"] == (p / name).stat().st_size
    assert verify(p) == (True, "ok")
    assert torch.equal(load_torch(p / "model.pt")["w"], torch.ones(4, 4))
    assert not list(p.glob(".*.tmp"))


def test_damaged_or_unfinished_checkpoints_fall_back(tmp_path: Path) -> None:
    save(tmp_path, 1)
    save(tmp_path, 2)
    p3 = save(tmp_path, 3)
    (step_dir(tmp_path, 4)).mkdir()            # a write killed before meta.json
    (step_dir(tmp_path, 4) / "model.pt").write_bytes(b"partial")
    data = bytearray((p3 / "model.pt").read_bytes())
    data[-30] ^= 0xFF                               # bit rot in the newest complete one
    (p3 / "model.pt").write_bytes(bytes(data))
    assert verify(p3) == (False, "model.pt fails its sha256 check")
    msgs: list[str] = []
    step, meta = latest_good(tmp_path, msgs.append)
    assert step == 2 and meta["step"] == 2
    assert "step_00000004" in msgs[0] and "meta.json" in msgs[0]
    assert "step_00000003" in msgs[1] and "sha256" in msgs[1]
    (step_dir(tmp_path, 2) / "optim_rank0.pt").unlink()
    assert verify(step_dir(tmp_path, 2)) == (False, "optim_rank0.pt is missing")
    assert latest_good(tmp_path, msgs.append)[0] == 1
    # before resuming, unusable newer ones are set aside: debris deleted, damaged ones kept
    assert set_aside(tmp_path, 4) is None and not step_dir(tmp_path, 4).exists()
    assert set_aside(tmp_path, 3) == tmp_path / "checkpoints" / ".damaged" / "step_00000003"
    assert list_steps(tmp_path) == [1, 2]


def test_rewriting_a_step_clears_debris(tmp_path: Path) -> None:
    d = step_dir(tmp_path, 5)
    d.mkdir(parents=True)
    (d / "junk.pt").write_bytes(b"x")
    save(tmp_path, 5)
    assert not (d / "junk.pt").exists() and verify(d)[0]


FAULT_SCRIPT = textwrap.dedent("""
    import sys, torch
    from runner.checkpoint import save_checkpoint
    from runner.faults import Faults
    save_checkpoint(sys.argv[1], 9, rank=0, world_size=1, model_state=lambda: {"w": torch.ones(3)},
                    optim_state=lambda: {"optimizer": {}, "schedulers": []}, meta={"plan_hash": "abc"},
                    faults=Faults.from_env())
    print("finished")
""")


@pytest.mark.parametrize("point,present", [("after_model", {"model.pt"}),
                                           ("before_meta", {"model.pt", "optim_rank0.pt", "rng_rank0.pt"})])
def test_fault_injection_leaves_previous_checkpoint_intact(tmp_path: Path, point: str, present: set[str]) -> None:
    save(tmp_path, 3)
    env = {"PATH": "/usr/bin:/bin", "NANOPLAN_FAULT": point, "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-c", FAULT_SCRIPT, str(tmp_path)], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == FAULT_EXIT and "finished" not in r.stdout, r.stderr
    d9 = step_dir(tmp_path, 9)
    assert {f.name for f in d9.iterdir() if not f.name.startswith(".")} == present
    assert not verify(d9)[0]
    assert latest_good(tmp_path, lambda m: None)[0] == 3


def test_faults_only_fire_in_the_first_launch(monkeypatch) -> None:
    monkeypatch.setenv("NANOPLAN_FAULT", "step:4")
    assert Faults.from_env().crash_step == 4
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    assert Faults.from_env().crash_step is None
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    monkeypatch.setenv("NANOPLAN_FAULT", "sometimes")
    with pytest.raises(ValueError, match="NANOPLAN_FAULT"):
        Faults.from_env()


def fake_complete(run_dir: Path, step: int) -> None:
    d = step_dir(run_dir, step)
    d.mkdir(parents=True)
    (d / "meta.json").write_text(json.dumps({"step": step}))


def test_retention_keeps_last_k_and_the_best(tmp_path: Path) -> None:
    for s in (10, 20, 30, 40, 50, 60):
        save(tmp_path, s)
    step_dir(tmp_path, 35).mkdir()   # debris of a killed write
    step_dir(tmp_path, 70).mkdir()   # a write in progress: newer than every complete one
    assert update_best(tmp_path, 20, 1.5)
    deleted = retain(tmp_path, keep_last=2)
    assert deleted == [10, 30, 35, 40]
    assert list_steps(tmp_path) == [20, 50, 60, 70]
    assert retain(tmp_path, keep_last=1) == [50]
    assert complete_steps(tmp_path) == [20, 60]


def flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_retention_never_deletes_the_only_good_checkpoint(tmp_path: Path) -> None:
    """The newest checkpoints are damaged (bit rot after they were written): the newest older one
    that verifies is kept, whatever keep_last says, and it is the one a resume uses."""
    for s in (1, 2, 3, 4):
        save(tmp_path, s)
    for s in (3, 4):
        flip_a_byte(step_dir(tmp_path, s) / "model.pt")
    assert retain(tmp_path, keep_last=1) == [1, 3]          # 4 is the newest: never deleted
    assert list_steps(tmp_path) == [2, 4]
    assert latest_good(tmp_path, lambda m: None)[0] == 2
    save(tmp_path, 5)
    flip_a_byte(step_dir(tmp_path, 5) / "rng_rank0.pt")
    flip_a_byte(step_dir(tmp_path, 2) / "optim_rank0.pt")   # nothing verifies any more: nothing is deleted
    assert retain(tmp_path, keep_last=1) == [] and list_steps(tmp_path) == [2, 4, 5]
    save(tmp_path, 6)                                          # once a new one verifies, the damaged ones may go
    assert retain(tmp_path, keep_last=1) == [2, 4, 5] and list_steps(tmp_path) == [6]


def test_retention_keeps_the_best_by_validation_loss_without_best_json(tmp_path: Path) -> None:
    """The best checkpoint is kept even when it is older than the last k and best.json is missing
    or stale (it names a checkpoint that is gone): the lowest val_loss in the metas counts."""
    for s, v in ((1, 3.0), (2, 1.0), (3, 2.0), (4, 2.5), (5, 2.6)):
        save(tmp_path, s, val_loss=v)
    assert read_best(tmp_path) is None
    assert retain(tmp_path, keep_last=2) == [1, 3]
    assert list_steps(tmp_path) == [2, 4, 5]
    (tmp_path / BEST).write_text(json.dumps({"step": 99, "val_loss": 0.5, "path": "checkpoints/step_00000099"}))
    save(tmp_path, 6, val_loss=2.7)
    assert retain(tmp_path, keep_last=1) == [4, 5]
    assert list_steps(tmp_path) == [2, 6] and verify(step_dir(tmp_path, 2)) == (True, "ok")


def test_best_json_tracks_the_lowest_validation_loss(tmp_path: Path) -> None:
    for s in (1, 2, 3):
        fake_complete(tmp_path, s)
    assert update_best(tmp_path, 1, 3.0)
    assert not update_best(tmp_path, 2, 3.5)
    assert not update_best(tmp_path, 2, None)
    assert update_best(tmp_path, 3, 2.0)
    assert read_best(tmp_path) == {"step": 3, "val_loss": 2.0, "path": "checkpoints/step_00000003"}
    import shutil
    shutil.rmtree(step_dir(tmp_path, 3))   # the best is gone: the next one takes over
    assert update_best(tmp_path, 2, 3.5)


def test_plan_hash_ignores_where_not_what(tmp_path: Path, tiny_plan) -> None:
    from planner.plan import load_plan

    a = load_plan(tiny_plan("a.json", steps=30))
    b = load_plan(tiny_plan("b.json", steps=30, run_dir="elsewhere"))
    c = load_plan(tiny_plan("c.json", steps=31))
    assert plan_hash(a) == plan_hash(b) != plan_hash(c)
    assert len(plan_hash(a)) == 64


def test_metrics_log_survives_a_torn_last_line(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 5.0}\n{"step": 2, "lo')
    log = MetricsLog(tmp_path, tensorboard=False)
    log.write({"step": 2, "loss": 4.0, "lr": float("nan")})
    log.close()
    rows = read_metrics(tmp_path)
    assert rows == [{"step": 1, "loss": 5.0}, {"step": 2, "loss": 4.0, "lr": None}]
