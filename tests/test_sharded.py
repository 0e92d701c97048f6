"""zero1, zero2 and fsdp in the runner: real 2-process torchrun runs over gloo on CPU.

Each strategy trains the same tiny plan as a DDP reference (gradient accumulation 2, a warmup
and a long warmdown, so a lost optimizer or scheduler state would show). Rank 1 is killed in
the middle of its 4th checkpoint write (after its DCP shards, before meta.json); torchrun
restarts the workers and they resume from the 3rd checkpoint. One launch per strategy shows:
- the losses equal DDP's (zero1 bit for bit; FSDP2 within 1e-4), and they fall;
- the steps run again after the resume repeat the first attempt's losses exactly;
- the checkpoints are DCP shards for zero2/fsdp and model.pt for zero1, and all verify;
  the half-written one was set aside;
- `nanoplan export-model` writes one file whose tensors, cut into FSDP2's shards, hash to the
  live model's per-rank fingerprints in meta.json. These are taken from the training processes'
  parameters just before the write.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from planner.plan import load_plan
from runner.checkpoint_layout import ckpt_root, complete_steps, step_dir
from runner.checkpoint_meta import read_meta, verify
from runner.metrics import read_metrics
from runner.model import GPT
from tests.conftest import REPO, make_tiny_plan, runner_env

pytestmark = pytest.mark.slow

STEPS = 20
KILLED_WRITE = 4


def plan_for(d: Path, data: Path, strategy: str) -> Path:
    return make_tiny_plan(d / f"plan_{strategy}.json", data, steps=STEPS, device_batch_size=4, total_batch_tokens=1024,
                          strategy=strategy, checkpoint_every_minutes=0.003, keep_last=1000,
                          hyper={"val_every_steps": 8, "warmup_steps": 3, "warmdown_frac": 0.5})


def launch(plan: Path, run: Path, *, restarts: int = 0, env: dict[str, str] | None = None) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1", "--nproc-per-node=2",
           f"--max-restarts={restarts}", "-m", "runner.train", "--plan", str(plan), "--run-dir", str(run)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=REPO,
                       env=runner_env(TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1", **(env or {})))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]


def export(run: Path, step: int, out: Path) -> dict[str, torch.Tensor]:
    r = subprocess.run([sys.executable, "-m", "nanoplan", "export-model", str(run), "--step", str(step),
                        "--out", str(out)], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert r.returncode == 0, r.stderr
    assert f"wrote {out}: 10 tensors, 131,072 parameters (float32), step {step}" in r.stdout
    assert "GPT(spec).load_state_dict works" in r.stdout
    return torch.load(out, weights_only=True)


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory: pytest.TempPathFactory, tiny_data: Path) -> Path:
    d = tmp_path_factory.mktemp("ddp")
    launch(plan_for(d, tiny_data, "ddp"), d / "run")
    return d / "run"


@pytest.fixture(scope="module", params=["zero1", "zero2", "fsdp"])
def runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, tiny_data: Path) -> tuple[str, Path]:
    """(strategy, run dir) of a run whose rank 1 died in its 4th checkpoint write and was restarted."""
    st = request.param
    d = tmp_path_factory.mktemp(st)
    launch(plan_for(d, tiny_data, st), d / "run", restarts=1,
           env={"NANOPLAN_FAULT": "after_model", "NANOPLAN_FAULT_AT": str(KILLED_WRITE), "NANOPLAN_FAULT_RANK": "1"})
    return st, d / "run"


def test_learns_as_ddp_does_and_resumes_exactly(runs, ddp_run: Path) -> None:
    st, run = runs
    rows, ref = read_metrics(run), {x["step"]: x for x in read_metrics(ddp_run)}
    first = [x for x in rows if x["segment"] == 0]
    resumed = [x for x in rows if x["segment"] == 1]
    info = json.loads((run / "run_info.json").read_text())
    assert [s["restart_count"] for s in info["segments"]] == [0, 1]
    start = info["segments"][1]["resumed_from_step"]
    assert [x["step"] for x in resumed] == list(range(start + 1, STEPS + 1))
    again = {x["step"]: x for x in first if x["step"] > start}
    assert again, "no step ran both before and after the resume"
    for x in resumed:                # a resume round-trips: the same steps give the same losses
        if x["step"] in again:
            assert (x["loss"], x["grad_norm"], x["lr"]) == (again[x["step"]]["loss"], again[x["step"]]["grad_norm"],
                                                            again[x["step"]]["lr"]), x["step"]
    last = {x["step"]: x for x in rows}
    assert sorted(last) == sorted(ref) == list(range(1, STEPS + 1))
    assert last[1]["loss"] > 5.0 and sum(last[s]["loss"] for s in range(STEPS - 3, STEPS + 1)) / 4 < last[1]["loss"] - 1.5
    for s, a in last.items():
        b = ref[s]
        if st == "zero1":            # DDP's all-reduce and step, the optimizer step split between ranks
            assert (a["loss"], a["grad_norm"], a["lr"]) == (b["loss"], b["grad_norm"], b["lr"]), s
            # the validation passes: every 8 steps in both; before a checkpoint (wall-clock cadence) where both had one
            if s % 8 == 0 or ("val_loss" in a and "val_loss" in b):
                assert a.get("val_loss") == b.get("val_loss"), s
        else:                        # reduce-scatter of pre-divided gradients: last-bit differences
            assert a["loss"] == pytest.approx(b["loss"], rel=1e-4), s
            assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4), s
            assert a["lr"] == b["lr"]


def test_checkpoints_are_sharded_and_verify(runs) -> None:
    st, run = runs
    steps = complete_steps(run)
    assert len(steps) >= KILLED_WRITE and steps[-1] == STEPS
    for s in steps:
        path = step_dir(run, s)
        assert verify(path) == (True, "ok")
        meta = read_meta(path)
        files, rep = set(meta["files"]), meta["replicas"]
        assert {"optim_rank0.pt", "rng_rank0.pt", "rng_rank1.pt"} <= files
        if st == "zero1":            # DDP layout: one model.pt, the optimizer state consolidated on rank 0
            assert "model.pt" in files and not any(f.startswith("dcp/") for f in files)
            assert rep["kind"] == "bytes" and rep["agree"] is True
        else:                        # every rank wrote its own DCP shards of the model and of the optimizer
            assert "model.pt" not in files
            for sub in ("model", "optim"):
                assert {f"dcp/{sub}/.metadata", f"dcp/{sub}/__0_0.distcp", f"dcp/{sub}/__1_0.distcp"} <= files
            assert rep["kind"] == "shards" and rep["agree"] is None and len(set(rep["fingerprints"])) == 2
    # the 4th write died before its meta.json: the restart deleted it and resumed from the 3rd
    start = json.loads((run / "run_info.json").read_text())["segments"][1]["resumed_from_step"]
    assert start in steps and len([s for s in steps if s <= start]) == KILLED_WRITE - 1
    assert not (ckpt_root(run) / ".damaged").exists()


def _shard_fingerprint(full: dict[str, torch.Tensor], names: list[str], rank: int, world: int) -> str:
    """sha256 of rank's FSDP2 shards (dim-0 chunks), in parameter order, as runner/parallel.py hashes them."""
    h = hashlib.sha256()
    for n in names:
        h.update(torch.chunk(full[n], world, dim=0)[rank].contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def test_export_model_equals_the_live_model(runs, ddp_run: Path, tmp_path: Path) -> None:
    st, run = runs
    meta = read_meta(step_dir(run, STEPS))
    sd = export(run, STEPS, tmp_path / "model.pt")
    plan = load_plan(Path(json.loads((run / "run_info.json").read_text())["plan_path"]))
    model = GPT(plan.request.model)
    model.load_state_dict(sd)                      # strict: every name and shape
    names = [n for n, _ in model.named_parameters()]
    prints = meta["replicas"]["fingerprints"]
    if st == "zero1":
        h = hashlib.sha256()
        for n in names:
            h.update(sd[n].contiguous().view(torch.uint8).numpy().tobytes())
        assert prints == [h.hexdigest()] * 2
    else:
        assert prints == [_shard_fingerprint(sd, names, r, 2) for r in range(2)]
    ddp = torch.load(step_dir(ddp_run, STEPS) / "model.pt", weights_only=True)
    for n in names:
        torch.testing.assert_close(sd[n], ddp[n], rtol=0, atol=0 if st == "zero1" else 1e-4)


def test_sample_reads_the_same_weights_in_memory(runs, tmp_path: Path) -> None:
    """`nanoplan sample` loads a checkpoint without writing anything: DCP shards (zero2/fsdp) are read in memory
    with no process group; the weights equal the consolidated export's."""
    from runner.sample import load_weights

    st, run = runs
    sd = export(run, STEPS, tmp_path / "model.pt")
    plan = load_plan(Path(json.loads((run / "run_info.json").read_text())["plan_path"]))
    model = GPT(plan.request.model)
    before = set(Path(run).rglob("*"))
    load_weights(step_dir(run, STEPS), model)
    assert set(Path(run).rglob("*")) == before
    for n, t in model.state_dict().items():
        torch.testing.assert_close(t, sd[n], rtol=0, atol=0)
