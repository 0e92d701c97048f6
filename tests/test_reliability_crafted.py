"""Files crafted by hand (issue 22, items 9-14): checkpoints resealed around a wrong tensor, token ids outside
the vocab where the sampled check does not look, hand-edited plans and profiles given to export and estimate,
invisible characters in launch files, and the small ones (a pickled model.pt, a list as a segment, the hint of
a NaN loss after a resume).

The crafted checkpoints are resealed (sizes and sha256 in meta.json, meta_sha256), so every checksum passes:
only the new checks of the tensors against the live model and optimizer stand between them and the run.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from planner.build import build_plan
from planner.datameta import DataMeta
from planner.errors import PlanError
from planner.plan import PlanRequest, load_plan
from planner.profiles import find_profile
from planner.spec import nanochat
from runner.checkpoint import write_meta
from runner.data import REDO
from runner.torch_files import sha256_file
from tests.conftest import REPO, TEXT, make_tiny_plan, nanoplan_no_launch, runner_env, write_data_dir
from tests.errlines import as_one_line

CPU = torch.device("cpu")


nanoplan_in_process = nanoplan_no_launch   # tests/conftest.py


def nanoplan_run(plan: Path, run: Path, timeout: int = 180) -> subprocess.CompletedProcess:
    """The real launcher: torchrun (--max-restarts 3) and its workers."""
    return subprocess.run([sys.executable, "-m", "nanoplan", "run", str(plan), "--run-dir", str(run)],
                          capture_output=True, text=True, timeout=timeout, cwd=REPO, env=runner_env())


def errors_of(r: subprocess.CompletedProcess) -> list[str]:
    return [x for x in r.stderr.splitlines() if x.startswith("error:")]


def assert_once_without_restart(r: subprocess.CompletedProcess) -> None:
    said = [x for x in (r.stdout + r.stderr).splitlines() if not x.startswith("launching:")]
    assert "Traceback" not in r.stderr and not any("restart" in x.lower() for x in said), r.stderr[-3000:]
    assert "Segmentation fault" not in r.stderr and "SIGSEGV" not in r.stderr, r.stderr[-3000:]


def reseal(step: Path) -> None:
    """Recompute meta.json's file list (size, sha256) and its own seal, as a forger would."""
    meta = json.loads((step / "meta.json").read_text())
    meta.pop("meta_sha256", None)
    meta["files"] = {str(f.relative_to(step)): {"sha256": sha256_file(f), "bytes": f.stat().st_size}
                     for f in sorted(step.rglob("*")) if f.is_file() and f.name != "meta.json"}
    write_meta(step, meta)


# ---------------------------------------------------------------- 9. crafted optimizer and model state

@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(plan, run dir) of a 3-step one-process run: checkpoints step_1 and step_3."""
    d = tmp_path_factory.mktemp("crafted")
    data = write_data_dir(d / "data", TEXT.read_bytes())
    plan = make_tiny_plan(d / "plan.json", data, steps=3, gpus=1)
    r = subprocess.run([sys.executable, "-m", "runner.train", "--plan", str(plan), "--run-dir", str(d / "run")],
                       capture_output=True, text=True, timeout=180, cwd=REPO, env=runner_env())
    assert r.returncode == 0, r.stderr[-3000:]
    return plan, d / "run"


@pytest.fixture
def run_copy(tmp_path: Path, finished: tuple[Path, Path]) -> tuple[Path, Path, Path]:
    """(plan, a copy of the run resuming from step_1, its step_1 dir)."""
    plan, run = finished
    shutil.copytree(run, tmp_path / "run")
    shutil.rmtree(tmp_path / "run" / "checkpoints" / "step_00000003")
    return plan, tmp_path / "run", tmp_path / "run" / "checkpoints" / "step_00000001"


def craft_optimizer(step: Path, change: Callable[[dict[str, Any]], None]) -> None:
    o = torch.load(step / "optim_rank0.pt", weights_only=True)
    change(o["optimizer"]["optimizers"][0]["state"])
    torch.save(o, step / "optim_rank0.pt")
    reseal(step)


def craft_model(step: Path, change: Callable[[dict[str, Any]], None]) -> None:
    m = torch.load(step / "model.pt", weights_only=True)
    change(m)
    torch.save(m, step / "model.pt")
    reseal(step)


def restore(plan_path: Path, step: Path) -> None:
    """runner.train's restore of a checkpoint into a freshly built model and optimizer (one process)."""
    from runner.plan_model import wrap_model
    from runner.resume import restore_model, restore_training_state

    par = wrap_model(load_plan(plan_path), 1, CPU)
    scheds = [torch.optim.lr_scheduler.LambdaLR(o, lambda s: 1.0) for o in par.opt.optimizers]
    restore_model(par, step, CPU)
    restore_training_state(par, scheds, step, 0, CPU)


P3 = "blocks.0.mlp.fc.weight"    # parameter 3 of the tiny model: shape (256, 64)


@pytest.mark.parametrize("change,says", [
    (lambda st: st[3].update(exp_avg=torch.zeros(3, 5)),
     f"optimizers[0].state[3]['exp_avg'] (of parameter {P3}) has shape (3, 5) = 15 elements, this run's has "
     "(256, 64) = 16,384 elements"),
    (lambda st: st[3].update(exp_avg=torch.zeros(4 * 256 * 64)),
     f"optimizers[0].state[3]['exp_avg'] (of parameter {P3}) has shape (65536,) = 65,536 elements, this run's has "
     "(256, 64) = 16,384 elements"),
    (lambda st: st[3].update(step=torch.zeros(3)),
     f"optimizers[0].state[3]['step'] (of parameter {P3}) has shape (3,) = 3 elements, a step count is one "
     "number (shape ())"),
    (lambda st: st[3].update(exp_avg_sq=st[3]["exp_avg_sq"].double()),
     f"optimizers[0].state[3]['exp_avg_sq'] (of parameter {P3}) has dtype float64, this run's is float32"),
    (lambda st: st[3].pop("exp_avg"),
     f"optimizers[0].state[3] (of parameter {P3}) has no 'exp_avg', which AdamW keeps for every parameter"),
    (lambda st: st.update({99: st[3]}),
     "optimizers[0].state holds an entry for parameter index 99, which its param groups do not list"),
    (lambda st: st[3].update(step=torch.tensor(float("nan"))),
     f"optimizers[0].state[3]['step'] (of parameter {P3}) is nan, not a step count >= 0"),
])
def test_a_crafted_optimizer_state_is_refused_before_it_is_loaded(run_copy: tuple[Path, Path, Path], change,
                                                                  says: str) -> None:
    plan, _, step = run_copy
    craft_optimizer(step, change)
    with pytest.raises(PlanError) as e:
        restore(plan, step)
    assert (e.value.field, e.value.problem) == (str(step / "optim_rank0.pt"), says)
    assert "move step_00000001 out of" in e.value.fix


@pytest.mark.parametrize("change,says", [
    (lambda m: m.update({P3: torch.zeros(3, 5)}),
     f"tensor '{P3}' has shape (3, 5) = 15 elements, this run's has (256, 64) = 16,384 elements"),
    (lambda m: m.update({P3: m[P3].double()}), f"tensor '{P3}' has dtype float64, this run's is float32"),
    (lambda m: m.pop(P3), f"has no tensor '{P3}', which this plan's model has"),
])
def test_a_crafted_model_pt_is_refused_naming_the_tensor_in_full(run_copy: tuple[Path, Path, Path], change,
                                                                 says: str) -> None:
    plan, _, step = run_copy
    craft_model(step, change)
    with pytest.raises(PlanError) as e:
        restore(plan, step)
    assert (e.value.field, e.value.problem) == (str(step / "model.pt"), says)


def test_an_untouched_checkpoint_still_restores(run_copy: tuple[Path, Path, Path]) -> None:
    plan, _, step = run_copy
    restore(plan, step)


def test_the_issue_s_crafted_exp_avg_stops_the_run_once_through_nanoplan_run(run_copy: tuple[Path, Path, Path]) -> None:
    """The issue's case: rank 0 segfaulted in fused AdamW and torchrun restarted into it. Now: exit 2, one line."""
    plan, run, step = run_copy
    craft_optimizer(step, lambda st: st[3].update(exp_avg=torch.zeros(3, 5)))
    r = nanoplan_run(plan, run)
    assert r.returncode == 2, r.stderr[-3000:]
    assert errors_of(r) == [f"error: {step / 'optim_rank0.pt'}: optimizers[0].state[3]['exp_avg'] (of parameter {P3}) "
                            "has shape (3, 5) = 15 elements, this run's has (256, 64) = 16,384 elements (it was not "
                            f"written by this plan's run, or was edited after; move step_00000001 out of {step.parent} "
                            "to resume from an earlier checkpoint, or use another --run-dir)"]
    assert_once_without_restart(r)


def test_zero_redundancy_state_is_indexed_over_all_parameters(tmp_path: Path) -> None:
    """zero1's optim_rank0.pt holds ZeroRedundancyOptimizer's consolidated state: the same check applies."""
    import torch.distributed as dist
    from torch.distributed.optim import ZeroRedundancyOptimizer

    from runner.state_check import optimizer_problem

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
        opt = ZeroRedundancyOptimizer(list(model.parameters()), optimizer_class=torch.optim.AdamW, lr=0.1)
        model(torch.ones(1, 4)).sum().backward()
        opt.step()
        opt.consolidate_state_dict(to=0)
        names = {id(p): n for n, p in model.named_parameters()}
        saved = {"optimizers": [opt.state_dict()]}
        assert optimizer_problem(saved, [opt], names) is None
        saved["optimizers"][0]["state"][2]["exp_avg"] = torch.zeros(2, 4)
        assert optimizer_problem(saved, [opt], names) == (
            "optimizers[0].state[2]['exp_avg'] (of parameter 1.weight) has shape (2, 4) = 8 elements, this run's "
            "has (2, 3) = 6 elements")
    finally:
        dist.destroy_process_group()


def test_a_crafted_dcp_checkpoint_is_refused_on_every_rank(tmp_path: Path, tiny_data: Path) -> None:
    """fsdp (2 processes): the .metadata's sizes are checked against the live state before dcp.load."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save, torch_save_to_dcp

    plan = make_tiny_plan(tmp_path / "plan.json", tiny_data, steps=3, strategy="fsdp")
    run = tmp_path / "run"
    first = nanoplan_run(plan, run)
    assert first.returncode == 0, first.stderr[-3000:]
    shutil.rmtree(run / "checkpoints" / "step_00000003")            # resume from step_1
    step = run / "checkpoints" / "step_00000001"
    optim = step / "dcp" / "optim"
    dcp_to_torch_save(optim, tmp_path / "optim.pt")
    sd = torch.load(tmp_path / "optim.pt", weights_only=True)
    sd["state"]["blocks.0.mlp.proj.weight"]["exp_avg"] = torch.zeros(3, 5)
    torch.save(sd, tmp_path / "optim.pt")
    shutil.rmtree(optim)
    torch_save_to_dcp(tmp_path / "optim.pt", optim)
    reseal(step)
    r = nanoplan_run(plan, run)
    assert r.returncode == 2, r.stderr[-3000:]
    assert [e.split(" (it was not")[0] for e in errors_of(r)] == [
        f"error: {optim}: entry 'state.blocks.0.mlp.proj.weight.exp_avg' has shape (3, 5) = 15 elements, this run's "
        "optimizer has (64, 256) = 16,384 elements"]
    assert_once_without_restart(r)


# ---------------------------------------------------------------- 10. out-of-vocab ids outside the sampled blocks

def test_an_out_of_vocab_id_outside_the_sampled_blocks_stops_every_rank_once(tmp_path: Path) -> None:
    """A train.bin over FULL_CHECK_MAX_BYTES with id 300 (vocab 256) in rank 1's first batch only, in no sampled
    block: the issue saw 4 IndexError tracebacks and three restarts. Now: exit 2, one line naming file and offset."""
    from runner import data as rd

    data = tmp_path / "data"
    data.mkdir()
    n = (rd.FULL_CHECK_MAX_BYTES + (4 << 20)) // 2
    toks = np.random.default_rng(0).integers(0, 256, n, dtype=np.uint16)
    val = np.random.default_rng(1).integers(0, 256, 20_000, dtype=np.uint16)
    (data / "meta.json").write_text(DataMeta(tokenizer="byte", vocab_size=256, dtype="uint16", train_tokens=n,
                                             val_tokens=len(val), sources=["random"]).model_dump_json())
    plan = make_tiny_plan(tmp_path / "plan.json", data, steps=3, gpus=2)
    p = load_plan(plan)
    tr = p.training
    batches = rd.TrainBatches(toks, tr.seq_len, tr.device_batch_size, tr.grad_accum_steps, 1, 2, p.request.hyper.seed)
    blocks = rd._blocks(n * 2)
    sampled = lambda i: any(off // 2 <= i < (off + ln) // 2 for off, ln in blocks)  # noqa: E731
    at = next(int(s) + 5 for s in batches.window_starts(0, 0) if not sampled(int(s) + 5))
    toks[at] = 300
    toks.tofile(data / "train.bin")
    val.tofile(data / "val.bin")
    try:
        rd.check_token_ids(np.memmap(data / "train.bin", dtype=np.uint16, mode="r"), 256, data / "train.bin")  # unseen
        r = nanoplan_run(plan, tmp_path / "run")
    finally:
        (data / "train.bin").unlink()
    assert r.returncode == 2, r.stderr[-3000:]
    assert errors_of(r) == [f"error: {data / 'train.bin'}: holds token id 300 at token {at:,}, but the vocab has 256 ids "
                            f"(meta.json); the embedding has no row for it ({REDO})"]
    assert_once_without_restart(r)
    assert not (tmp_path / "run" / "checkpoints").exists() or not any((tmp_path / "run" / "checkpoints").iterdir())


def test_a_batch_with_a_bad_id_is_zeroed_and_noted_and_the_val_set_is_checked_whole(tmp_path: Path) -> None:
    from runner.data import TrainBatches, ValBatches

    toks = np.arange(1000, dtype=np.uint16) % 200
    toks[500:] = 7
    toks[600] = 999
    tb = TrainBatches(toks, 16, 4, 1, 0, 1, 0, vocab_size=256, path="t.bin")
    hits = [(s, tb.numpy_batch(s, 0)) for s in range(40)]
    assert all(int(b.max()) < 256 for _, b in hits) and tb.problem == (999, 600)
    assert str(tb.shared_problem()).startswith("t.bin: holds token id 999 at token 600, but the vocab has 256 ids")
    with pytest.raises(PlanError, match=r"v.bin: holds token id 999 at token 600"):
        ValBatches(toks, 16, 4, 0, 1, val_tokens=640, vocab_size=256, path="v.bin")
    ValBatches(toks, 16, 4, 0, 1, val_tokens=320, vocab_size=256, path="v.bin")          # windows before it: fine


# ---------------------------------------------------------------- 11. export re-derives the plan

@pytest.fixture(scope="module")
def gpu_plan_doc() -> dict[str, Any]:
    req = PlanRequest(gpu="2x8xH100", profile=find_profile("H100"), model=nanochat(12), hours=2.0, run_dir="runs/a")
    return json.loads(build_plan(req, plan_path="plan.json").model_dump_json())


def _edited(doc: dict, *changes: tuple[tuple[str, ...], Any]) -> str:
    d = json.loads(json.dumps(doc))
    for path, value in changes:
        node = d
        for k in path[:-1]:
            node = node[k]
        node[path[-1]] = value
    return json.dumps(d).replace('"NODES"', str(10**30))


@pytest.mark.parametrize("changes,says", [
    ([(("hardware", "nodes"), "NODES")], f"stale or edited: hardware.nodes is {10**30:,} in the plan, 2 re-derived"),
    ([(("budget", "hours"), 1e308)], "stale or edited: budget.hours is 1e+308 in the plan, 2 re-derived"),
    ([(("budget", "hours"), 5e-324)], "stale or edited: budget.hours is 4.94066e-324 in the plan, 2 re-derived"),
])
@pytest.mark.parametrize("target", [["--slurm"], ["--skypilot", "--bucket", "s3://b/run"]])
def test_export_refuses_a_hand_edited_plan(tmp_path: Path, gpu_plan_doc: dict, changes, says: str, target) -> None:
    (tmp_path / "plan.json").write_text(_edited(gpu_plan_doc, *changes))
    code, out, err = nanoplan_in_process("export", "plan.json", *target, cwd=tmp_path)
    assert (code, out) == (2, ""), err
    assert as_one_line(err).startswith(f"error: plan.json: {says}")


def test_a_plan_shorter_than_one_step_is_neither_made_nor_exported(tmp_path: Path) -> None:
    code, out, err = nanoplan_in_process("estimate", "--gpu", "2x8xH100", "--depth", "12", "--hours", "5e-324",
                                         "--out", "plan.json", cwd=tmp_path)
    assert (code, out) == (2, "") and not (tmp_path / "plan.json").exists()
    assert as_one_line(err).startswith("error: --hours: 1.8e-320 s leaves no time for one optimizer step")
    # a file that says so anyway (an older nanoplan wrote such plans as one step) is refused, as is its export
    assert nanoplan_in_process("estimate", "--gpu", "2x8xH100", "--depth", "12", "--hours", "1", "--out", "plan.json",
                               cwd=tmp_path)[0] == 0
    doc = json.loads((tmp_path / "plan.json").read_text())
    doc["request"]["hours"] = doc["budget"]["hours"] = 5e-324
    (tmp_path / "plan.json").write_text(json.dumps(doc))
    for cmd in (["validate", "plan.json"], ["export", "plan.json", "--slurm"]):
        code, out, err = nanoplan_in_process(*cmd, cwd=tmp_path)
        assert code == 2 and "--time=" not in out + err and len(err.splitlines()) == 2, (cmd, out, err)
        assert "leaves no time for one optimizer step" in err, (cmd, err)


def test_export_of_an_untouched_plan_still_works(tmp_path: Path, gpu_plan_doc: dict) -> None:
    (tmp_path / "plan.json").write_text(json.dumps(gpu_plan_doc))
    code, out, err = nanoplan_in_process("export", "plan.json", "--slurm", cwd=tmp_path)
    assert code == 0 and "#SBATCH --nodes=2" in out and "#SBATCH --time=0-02:12:00" in out, err


# ---------------------------------------------------------------- 12. absurd profile numbers

PROFILE = (REPO / "hardware_profiles" / "H100-SXM.yaml").read_text()


@pytest.mark.parametrize("field,value,says", [
    ("hbm_tb_s", "5.0e-324", "5e-324 is outside the plausible range 0.01 to 100 TB/s"),
    ("memory_gb", "5.0e-324", "5e-324 is outside the plausible range 1 to 2048 GB"),
    ("bf16_tflops", "5.0e-324", "5e-324 is outside the plausible range 0.01 to 100000 TFLOP/s"),
    ("default_mfu", "5.0e-324", "5e-324 is outside the plausible range 0.001 to 1 fraction of peak"),
    ("intra_node_gb_s", "5.0e-324", "5e-324 is outside the plausible range 0.001 to 100000 GB/s"),
    ("inter_node_gb_s", "1.0e+9", "1000000000.0 is outside the plausible range 0.001 to 100000 GB/s"),
    ("usable_bytes", "1", "1 is outside the plausible range 1e+08 to 2.2e+12 bytes"),
])
def test_a_profile_figure_outside_its_range_names_file_field_and_range(tmp_path: Path, field: str, value: str,
                                                                       says: str) -> None:
    lines = [f"{field}: {value}" if x.startswith(f"{field}:") else x for x in PROFILE.splitlines()]
    (tmp_path / "p.yaml").write_text("\n".join(lines) + "\n")
    code, _, err = nanoplan_in_process("estimate", "--profile", "p.yaml", "--gpu", "8xH100-SXM", "--depth", "12",
                                       "--hours", "2", cwd=tmp_path)
    assert code == 2 and as_one_line(err).startswith(f"error: p.yaml: field '{field}': {says}"), err


def test_a_price_below_a_cent_is_refused_but_free_is_fine(tmp_path: Path) -> None:
    (tmp_path / "p.yaml").write_text(PROFILE.replace("usd_per_gpu_hour: 3.95", "usd_per_gpu_hour: 5.0e-324"))
    code, _, err = nanoplan_in_process("estimate", "--profile", "p.yaml", "--gpu", "8xH100-SXM", "--depth", "12",
                                       "--budget", "100", cwd=tmp_path)
    assert code == 2 and as_one_line(err).startswith(
        "error: p.yaml: field 'prices.0.usd_per_gpu_hour': 5e-324 is outside the plausible range: 0 (your own machine) "
        "or 0.01 to 10000 $/GPU-hour"), err
    code, _, err = nanoplan_in_process("estimate", "--gpu", "8xH100", "--price", "0.000001", "--depth", "12",
                                       "--budget", "100", cwd=tmp_path)
    assert code == 2 and as_one_line(err).startswith("error: --price: 1e-06 is outside the plausible range"), err
    code, _, err = nanoplan_in_process("estimate", "--gpu", "8xH100", "--price", "0", "--depth", "12", "--hours", "1",
                                       cwd=tmp_path)
    assert code == 0, err


def test_every_shipped_profile_is_inside_the_ranges() -> None:
    from planner.profiles import builtin_profiles

    assert len(builtin_profiles()) >= 14        # each was validated against the ranges when it was read


# ---------------------------------------------------------------- 13. invisible characters

INVISIBLE = ["\u202e", "\u202a", "\u2066", "\u2067", "\u2068", "\u2069", "\u200e", "\u200f", "\u061c",
             "\u200b", "\u200c", "\u200d", "\u2060", "\ufeff"]


@pytest.mark.parametrize("ch", INVISIBLE)
def test_invisible_characters_are_refused_in_plans_and_launch_file_arguments(tmp_path: Path, gpu_plan_doc: dict,
                                                                             ch: str) -> None:
    import unicodedata

    code_point = f"U+{ord(ch):04X} {unicodedata.name(ch)}"
    for path in (("launch", "run_dir"), ("request", "data_dir"), ("model", "name"), ("hardware", "provider")):
        (tmp_path / "plan.json").write_text(_edited(gpu_plan_doc, (path, "runs/" + ch + "gnp.exe")))
        code, out, err = nanoplan_in_process("export", "plan.json", "--slurm", cwd=tmp_path)
        assert (code, out) == (2, ""), (path, err)
        assert as_one_line(err).startswith(f"error: plan.json: field '{'.'.join(path)}': holds a control character "
                                           f"({code_point} at index 5)"), err
    (tmp_path / "plan.json").write_text(json.dumps(gpu_plan_doc))
    for argv in (["--skypilot", "--bucket", f"s3://b/{ch}x"], ["--slurm", "--bucket", f"/scratch/{ch}x"],
                 ["--slurm", "--partition", f"gpu{ch}"], ["--slurm", "--account", f"{ch}acct"]):
        code, out, err = nanoplan_in_process("export", "plan.json", *argv, cwd=tmp_path)
        assert (code, out) == (2, "") and f"error: {argv[1]}: holds a control character ({code_point}" in err, err
    (tmp_path / f"p{ch}.json").write_text(json.dumps(gpu_plan_doc))
    code, out, err = nanoplan_in_process("export", f"p{ch}.json", "--slurm", cwd=tmp_path)
    assert code == 2 and out == "" and f"holds a control character ({code_point} at index 1)" in err, err


def test_the_skypilot_source_is_quoted(tmp_path: Path, gpu_plan_doc: dict) -> None:
    (tmp_path / "plan.json").write_text(json.dumps(gpu_plan_doc))
    code, out, err = nanoplan_in_process("export", "plan.json", "--skypilot", "--bucket", "s3://b/run #x", cwd=tmp_path)
    assert code == 0, err
    assert '    source: "s3://b/run #x"' in out.splitlines()


# ---------------------------------------------------------------- 14. the small ones

def test_export_model_of_a_pickled_model_pt_is_one_line_that_never_advises_unsafe_loading(
        run_copy: tuple[Path, Path, Path]) -> None:
    _, run, step = run_copy
    torch.save({"w": torch.nn.Linear(2, 2)}, step / "model.pt")     # a pickled module, resealed
    reseal(step)
    code, out, err = nanoplan_in_process("export-model", str(run), "--step", "1")
    assert code == 2 and out == "", err
    assert as_one_line(err) == (
        f"error: {step / 'model.pt'}: refused by torch.load(weights_only=True): it holds pickled objects, not just "
        "tensors (Unsupported global: GLOBAL torch.nn.modules.linear.Linear) (it is not a nanoplan checkpoint; move "
        "it out of the run dir, or use another --run-dir)")
    assert "weights_only=False" not in err and "weights_only` set to `False" not in err and "safe_globals" not in err
    assert not list(run.glob("model_step_*")) and not list(run.glob(".model_step_*"))


@pytest.mark.parametrize("segment", [[], {"a": 1}, "one", -1, 1.5])
def test_calibrate_refuses_a_segment_that_is_not_a_count(tmp_path: Path, segment: Any) -> None:
    run = tmp_path / "run"
    shutil.copytree(REPO / "tests" / "data" / "calibration" / "tiny-1cpu", run)
    lines = (run / "metrics.jsonl").read_text().splitlines()
    row = json.loads(lines[4])
    row["segment"] = segment
    lines[4] = json.dumps(row)
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    code, _, err = nanoplan_in_process("calibrate", str(run))
    assert code == 2, err
    assert as_one_line(err) == (f"error: {run / 'metrics.jsonl'}:5: field 'segment': must be an integer >= 0, "
                                f"got {segment!r}")


def test_a_nan_loss_after_a_resume_names_the_checkpoint(run_copy: tuple[Path, Path, Path]) -> None:
    """A poisoned optimizer state (a negative exp_avg_sq: its square root is NaN) passes the tensor checks;
    the loss goes NaN after the resume, exit 3, and the hint names the checkpoint as well as the LR and data."""
    plan, run, step = run_copy
    craft_optimizer(step, lambda st: [s.update(exp_avg_sq=-torch.ones_like(s["exp_avg_sq"])) for s in st.values()])
    r = subprocess.run([sys.executable, "-m", "runner.train", "--plan", str(plan), "--run-dir", str(run)],
                       capture_output=True, text=True, timeout=180, cwd=REPO, env=runner_env())
    assert r.returncode == 3, r.stderr[-3000:]
    assert errors_of(r) == [
        f"error: the loss is not finite at step 3; stopped without a checkpoint. This launch resumed from {step}: its "
        f"model or optimizer state may be poisoned (move it and any later step_* dirs out of {step.parent} to resume "
        "from an earlier checkpoint); else lower request.hyper.lr in the plan, or check the data"]


@pytest.mark.parametrize("old,new,says", [
    ("mtbi_hours: 6\n", "mtbi_hours: 1.0e-9\n", "field 'prices.5.spot.mtbi_hours': 1e-09 is outside the plausible range "
     "0.1 to 100000 hours"),
    ("      usd_per_gpu_hour: 6.57", "      usd_per_gpu_hour: 5.0e-324", "field 'prices.5.spot.usd_per_gpu_hour': 5e-324 "
     "is outside the plausible range: 0 (your own machine) or 0.01 to 10000 $/GPU-hour"),
])
def test_spot_figures_outside_their_range_name_the_field(tmp_path: Path, old: str, new: str, says: str) -> None:
    assert old in PROFILE
    (tmp_path / "p.yaml").write_text(PROFILE.replace(old, new))
    code, _, err = nanoplan_in_process("estimate", "--profile", "p.yaml", "--gpu", "8xH100-SXM", "--depth", "12",
                                       "--hours", "2", cwd=tmp_path)
    assert code == 2 and f"error: p.yaml: {says}" in as_one_line(err), err
