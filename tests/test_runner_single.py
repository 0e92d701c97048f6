"""One process without torchrun (no process group): Muon + AdamW, checkpoint contents, resume."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

from runner.checkpoint_layout import step_dir
from runner.metrics import read_metrics
from runner.torch_files import load_torch
from tests.conftest import REPO, runner_env


def train(plan: Path, run: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "runner.train", "--plan", str(plan), "--run-dir", str(run), *extra],
                          capture_output=True, text=True, timeout=90, cwd=REPO, env=runner_env())


def test_single_process_muon_run_checkpoints_and_resumes(tmp_path: Path, tiny_plan) -> None:
    plan = tiny_plan(gpus=1, steps=12, optimizer="muon", hyper={"val_every_steps": 4, "warmup_steps": 2})
    run = tmp_path / "run"
    r = train(plan, run)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = read_metrics(run)
    assert [x["step"] for x in rows] == list(range(1, 13)) and rows[0]["world_size"] == 1
    assert rows[-1]["loss"] < rows[0]["loss"] - 1.0
    assert rows[0]["lr"] == 0.02 * 0.5 and rows[1]["lr"] == 0.02   # Muon's group, warmup of 2 steps
    final = step_dir(run, 12)
    opt = load_torch(final / "optim_rank0.pt")
    assert len(opt["optimizer"]["optimizers"]) == 2                 # Muon for hidden matrices + AdamW
    assert [s["last_epoch"] for s in opt["schedulers"]] == [12, 12]
    model = load_torch(final / "model.pt")
    assert "wte.weight" in model and not any(k.startswith(("module.", "_orig_mod.")) for k in model)
    rng = load_torch(final / "rng_rank0.pt")
    assert isinstance(rng["torch"], torch.Tensor)

    r = train(plan, run, "--resume")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resumed from" in r.stdout and "nothing to do: total_steps already reached at step 12" in r.stdout
    assert len(read_metrics(run)) == 12


def test_replica_fingerprint_is_bit_exact() -> None:
    from planner.spec import preset
    from runner.model import GPT
    from runner.replicas import replica_fingerprint

    a, b = GPT(preset("tiny")), GPT(preset("tiny"))
    a.init_weights(3)
    b.init_weights(3)
    assert replica_fingerprint(a) == replica_fingerprint(b) and replica_fingerprint(a)[0] == "bytes"
    with torch.no_grad():
        b.blocks[1].mlp.fc.weight.view(-1)[7] = torch.nextafter(b.blocks[1].mlp.fc.weight.view(-1)[7], torch.tensor(1.0))
    assert replica_fingerprint(a) != replica_fingerprint(b)


def test_early_stop_on_validation_patience(tmp_path: Path, tiny_plan) -> None:
    # lr 10 wrecks the model, so the validation loss soon stops improving
    plan = tiny_plan(gpus=1, steps=60, hyper={"lr": 10.0, "val_every_steps": 1, "patience_evals": 2})
    run = tmp_path / "run"
    r = train(plan, run)
    assert r.returncode == 0, r.stderr[-3000:]
    vals = [x["val_loss"] for x in read_metrics(run)]
    best, bad, expected = float("inf"), 0, None
    for step, v in enumerate(vals, start=1):          # the rule, recomputed from the log
        best, bad = (v, 0) if v < best else (best, bad + 1)
        if bad >= 2:
            expected = step
            break
    stop = json.loads((run / "stop.json").read_text())
    assert expected is not None and stop["reason"] == "patience" and stop["step"] == expected == len(vals)
