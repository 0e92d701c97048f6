"""The parts of `nanoplan run` for other trainers (runner/trainers/), one at a time, without processes:
whether a checkpoint is complete (against real torch.save and torch DCP files), the step lines (in each
trainer's own format), the budget arithmetic, the commands (parsed by the trainers' own parsers where they
install), and the planner's CPU plan for nanochat. tests/test_trainer_run.py runs the whole thing.
"""

from __future__ import annotations

import argparse
import json
import pickle
import shlex
from pathlib import Path

import pytest

from planner.plan import Plan, load_plan
from planner.trainers.flags import NANOCHAT_FLAGS
from runner.trainers import adapter_for
from runner.trainers.adapter import Launch, clean, set_flags, trainer_python
from runner.trainers.files import dcp_files, dcp_ranks, torch_file_problem
from runner.trainers.guard import KILL_S, Guard
from tests.conftest import nanoplan_cli

cli = nanoplan_cli

NANOCHAT_CPU = ["--trainer", "nanochat", "--depth", "2", "--gpu", "CPU", "--precision", "fp32", "--seq-len", "64",
                "--vocab-size", "256", "--device-batch-size", "1", "--total-batch-tokens", "64", "--hours", "0.01"]
NANOCHAT_GPU = ["--trainer", "nanochat", "--depth", "2", "--gpu", "2xH100", "--seq-len", "64", "--vocab-size", "256",
                "--device-batch-size", "1", "--total-batch-tokens", "128", "--hours", "0.1"]   # 3 min of it start-up
TITAN = ["--trainer", "torchtitan", "--preset", "debugmodel", "--gpu", "2xH100", "--device-batch-size", "1",
         "--total-batch-tokens", "4096", "--hours", "1"]
DEEPSPEED = ["--trainer", "deepspeed", "--style", "gpt2", "--n-layer", "2", "--d-model", "64", "--n-head", "2",
             "--vocab-size", "256", "--seq-len", "64", "--gpu", "2xH100", "--device-batch-size", "1",
             "--total-batch-tokens", "128", "--hours", "1"]


def make(tmp_path: Path, capsys, args: list[str], name: str = "plan.json") -> Plan:
    code, _, err = cli(["estimate", *args, "--out", name], capsys, tmp_path)
    assert code == 0, err
    return load_plan(tmp_path / name)


# --------------------------------------------------------------------------- the planner: nanochat on a CPU


def test_nanochat_plans_a_cpu_run_of_one_process_in_fp32(tmp_path: Path, capsys) -> None:
    """runs/runcpu.sh trains on a CPU: the plan is made (it was refused: "plan it on a GPU profile"), two CPU
    processes are refused (no process group on a CPU: two unsynchronised copies), and so is bf16 there."""
    plan = make(tmp_path, capsys, NANOCHAT_CPU)
    assert plan.request.trainer.name == "nanochat" and plan.hardware.num_gpus == 1
    assert plan.request.precision == "fp32" and plan.request.profile.kind == "cpu"
    code, _, err = cli(["estimate", *[a if a != "CPU" else "2xCPU" for a in NANOCHAT_CPU]], capsys, tmp_path)
    assert code == 2 and "sets up no process group" in err and "2 unsynchronised copies" in err, err
    assert err.count("\n") == 2 and "hint: use --gpu CPU (one process)" in err
    code, _, err = cli(["estimate", *[a for a in NANOCHAT_CPU if a not in ("--precision", "fp32")]], capsys, tmp_path)
    assert code == 2 and "on a CPU it computes in fp32" in err and "hint: add --precision fp32" in err, err


# --------------------------------------------------------------------------- checkpoint files


def test_a_torch_save_file_is_whole_only_with_its_end(tmp_path: Path) -> None:
    """A real torch.save file is whole; cut short anywhere (a kill mid-write), or not a zip, it is not."""
    torch = pytest.importorskip("torch")
    p = tmp_path / "model_000010.pt"
    torch.save({"w": torch.arange(4096, dtype=torch.float32), "step": 10}, p)
    assert torch_file_problem(p) is None
    data = p.read_bytes()
    cut = tmp_path / "cut.pt"
    for n in sorted({0, 1, 30, len(data) // 3, len(data) // 2, len(data) - 200, len(data) - 22, len(data) - 1}):
        cut.write_bytes(data[:n])
        assert torch_file_problem(cut) is not None, n
        with pytest.raises((RuntimeError, EOFError, OSError, pickle.UnpicklingError)):   # the reference: torch cannot load it
            torch.load(cut, weights_only=True)
    (tmp_path / "j.pt").write_text("{}")
    assert "not a whole" in torch_file_problem(tmp_path / "j.pt")
    assert torch_file_problem(tmp_path / "absent.pt") == "missing"


def test_a_dcp_checkpoint_is_complete_with_its_metadata_and_every_file(tmp_path: Path) -> None:
    """Real torch DCP (what torchtitan writes): .metadata names the data files, read without unpickling it;
    a missing or empty data file (a half-purged step dir) or a missing or cut .metadata is incomplete."""
    dcp = pytest.importorskip("torch.distributed.checkpoint")
    torch = pytest.importorskip("torch")
    d = tmp_path / "step-20"
    dcp.save({"model": {"w": torch.ones(64, 64)}, "step": 20}, checkpoint_id=str(d))
    names, why = dcp_files(d)
    assert why is None and names == sorted(p.name for p in d.glob("*.distcp")) == ["__0_0.distcp"]
    assert dcp_ranks(names) == 1
    meta = (d / ".metadata").read_bytes()
    (d / ".metadata").write_bytes(meta[: len(meta) // 2])
    assert dcp_files(d)[0] is None and "pickle" in dcp_files(d)[1] or "short" in dcp_files(d)[1]
    (d / ".metadata").write_bytes(meta)
    (d / "__0_0.distcp").write_bytes(b"")
    assert dcp_files(d) == (None, "__0_0.distcp is empty or not a file")
    (d / "__0_0.distcp").unlink()
    assert dcp_files(d) == (None, "__0_0.distcp is missing")
    (d / ".metadata").unlink()
    assert dcp_files(d)[1] == "no .metadata (DCP writes it last)"


def test_nanochat_and_deepspeed_checkpoints_need_every_rank_s_files(tmp_path: Path, capsys) -> None:
    """nanochat: model_, meta_ (Infinity allowed, its step checked) and optim_ of every rank; DeepSpeed: each
    rank's ZeRO partition and the model; a GPU count other than the writers' is found from the files."""
    torch = pytest.importorskip("torch")
    run = tmp_path / "run"
    nc = adapter_for("nanochat")
    ck = nc.checkpoint_dir(run)
    ck.mkdir(parents=True)
    torch.save({"x": 1}, ck / "model_000030.pt")
    (ck / "meta_000030.json").write_text('{"step": 30, "loop_state": {"min_val_bpb": Infinity}}')
    torch.save({"x": 1}, ck / "optim_000030_rank0.pt")
    assert nc.steps(run) == [30] and nc.problem(run, 30, 1) is None
    assert nc.problem(run, 30, 2) == "optim_000030_rank1.pt: missing"
    torch.save({"x": 1}, ck / "optim_000030_rank1.pt")
    assert nc.problem(run, 30, 2) is None and nc.written_by(run, 30) == 2
    (ck / "meta_000030.json").write_text('{"step": 31}')
    assert nc.problem(run, 30, 2) == "meta_000030.json: says step 31"
    ds = adapter_for("deepspeed")
    g = ds.checkpoint_dir(run) / "global_step40"
    g.mkdir(parents=True)
    for r in range(2):
        torch.save({"r": r}, g / f"bf16_zero_pp_rank_{r}_mp_rank_00_optim_states.pt")
    assert ds.problem(run, 40, 2) == "zero_pp_rank_0_mp_rank_00_model_states.pt: missing"   # ZeRO-3: per rank
    torch.save({"m": 1}, g / "mp_rank_00_model_states.pt")                                    # ZeRO-1/2: rank 0
    assert ds.problem(run, 40, 2) is None and ds.written_by(run, 40) == 2
    assert ds.problem(run, 40, 3) == "zero_pp_rank_2_mp_rank_00_optim_states.pt: missing"


# --------------------------------------------------------------------------- step lines


def test_step_lines_in_each_trainer_s_own_format() -> None:
    """Lines as the trainers print them (nanochat's from DESIGN §9a and its 2025-11 form; torchtitan's f-string
    in components/metrics.py with its colours; DeepSpeed's log_dist line): steps done, loss, tokens/s."""
    nc, tt, ds = adapter_for("nanochat"), adapter_for("torchtitan"), adapter_for("deepspeed")
    line = ("step 00010/00020 (50.00%) | loss: 8.313887 | lrm: 0.28 | dt: 44.21ms | tok/sec: 11,581 | bf16_mfu: 0.00 | "
            "epoch: 1 pq: 1 rg: 4 | total time: 0.00m | eta: 0.1m")
    e = nc.parse(line, 8)
    assert (e.step, e.total, e.loss, e.tokens_per_sec, e.lr) == (11, 20, 8.313887, 11581, 0.28)
    old = ("step 00099/01000 (9.90%) | loss: 4.500000 | grad norm: 0.9000 | lrm: 1.00 | dt: 100.00ms | tok/sec: 5,242 "
           "| mfu: 40.00 | total time: 1.00m")
    assert nc.parse(old, 1).step == 100 and nc.parse(old, 1).lr == 1.0
    assert nc.parse("Step 00250 | Validation bpb: 0.81", 1) is None
    red, green, reset = "\x1b[31m", "\x1b[32m", "\x1b[39m"
    titan = (f"[titan] 2026-09-01 10:00:00,123 - root - INFO - {red}step: 12  {green}loss: 10.25000  \x1b[33m"
             f"grad_norm:  1.7700  \x1b[36mmemory:  1.86GiB(2.35%)  \x1b[34mtps: 1,543  \x1b[36mtflops: 0.11  "
             f"\x1b[35mmfu: 0.01%{reset}")
    e = tt.parse(clean(titan), 8)
    assert (e.step, e.loss, e.tokens_per_sec) == (12, 10.25, 1543 * 8)
    dsl = "[2026-10-01 10:00:00,000] [INFO] [logging.py:107:log_dist] [Rank 0] step=30, skipped=0, lr=[0.0003], mom=[(0.9, 0.95)]"
    e = ds.parse(dsl, 2)
    assert (e.step, e.lr, e.loss) == (30, 0.0003, None)
    assert ds.parse("step=7, skipped=0, lr=[1e-05], loss=2.5", 1).loss == 2.5


# --------------------------------------------------------------------------- the guard


def test_the_step_count_puts_the_last_save_before_the_deadline() -> None:
    """E: start-up, E - S - 1 more steps, 1.5 x each periodic save and the final one, the exit: all before the
    deadline, and E + 1 would not be."""
    g = Guard(deadline_s=100.0, carried_s=10.0, step_s=1.0, save_s=2.0, startup_s=5.0, exit_s=1.0)
    # left = 100 - 10 - 0 - 5 - 3 - 1 = 81 s after the first step; every 10 steps a save of 3 s
    e = g.end_step(0.0, 0, 10_000, 10)
    cost = lambda end: (end - 1) + 3.0 * ((end - 1) // 10)   # noqa: E731
    assert cost(e) <= 81 < cost(e + 1), e
    assert e == 64
    assert g.end_step(0.0, 0, 40, 10) == 40                     # the plan's own step count caps it
    assert g.end_step(0.0, 30, 10_000, 10) == 30 + 64           # from a resume: the same time, later steps
    assert g.end_step(80.0, 0, 10_000, 10) == 2                 # 1 s left after the first step: one more
    assert g.end_step(82.0, 0, 10_000, 10) == 0                 # no room for a start-up, a step and a save
    assert Guard(None, 0, 1, 1, 1).end_step(1e9, 5, 77, 10) == 77   # a --steps plan: its steps
    assert g.save_every(600.0) == 600 and Guard(100, 0, 7.0, 1, 1).save_every(60) == 9
    g.mean_s = 2.0       # evaluation passes between steps: the launch's mean step is twice the last steps'
    assert g.save_every(600.0) == 300 and g.end_step(0.0, 0, 10_000, 10) == 37   # 2 x 36 + 3 x 3 = 81


def test_the_guard_stops_when_the_next_save_would_land_late_and_waits_for_one_in_progress() -> None:
    g = Guard(deadline_s=100.0, carried_s=0.0, step_s=1.0, save_s=2.0, startup_s=5.0, exit_s=1.0)
    # at 80 s, 5 steps to the save at 10 (+3 s, + the kill): 89 s, fine; at 92 s: 101 s, stop now
    assert not g.must_stop(80.0, done=5, saved=0, every=10, end=50)
    assert g.must_stop(92.0, done=5, saved=0, every=10, end=50)
    assert not g.must_stop(95.0, done=10, saved=0, every=10, end=50)       # step 10's save is being written
    assert g.must_stop(100.0 - KILL_S, done=10, saved=0, every=10, end=50)  # ... until the hard stop
    assert not g.must_stop(97.0, done=50, saved=50, every=10, end=50)      # saved at its end: exiting
    # before the first step line the rest of the start-up counts
    assert not g.must_stop(84.0, done=0, saved=0, every=10, end=10, starting_s=4.0)
    assert g.must_stop(84.0, done=0, saved=0, every=10, end=10, starting_s=0.0)


def test_a_relaunch_with_measured_figures_is_made_only_when_it_pays() -> None:
    # the plan said 0.03 s a step; measured 0.1 s: the launch's end (300) no longer fits: relaunch
    g = Guard(deadline_s=40.0, carried_s=0.0, step_s=0.1, save_s=0.2, startup_s=2.0, exit_s=1.0)
    r = g.relaunch(10.0, saved=20, end=300, every=20, total=10_000, cadence_s=0.6)
    assert r is not None and r[1] == 6 and 20 < r[0] < 300
    # the end fits and a relaunch would gain less than 2%: stay; one that ends much later: relaunch
    assert g.relaunch(10.0, saved=20, end=r[0], every=r[1], total=10_000, cadence_s=0.6) is None
    longer = Guard(deadline_s=400.0, carried_s=0.0, step_s=0.1, save_s=0.2, startup_s=2.0, exit_s=1.0)
    assert longer.relaunch(10.0, saved=20, end=r[0], every=r[1], total=10_000, cadence_s=0.6)[0] > 2 * r[0]


# --------------------------------------------------------------------------- commands


def launch_of(plan: Plan, run: Path, tdir: Path | None, end: int = 50, every: int = 7,
              resume: int | None = 30) -> Launch:
    return Launch(plan, run, tdir, end_step=end, save_every=every, resume_step=resume)


def test_nanochat_commands_carry_the_step_count_cadence_resume_and_checkpoint_dir(tmp_path: Path, capsys) -> None:
    """The flags parse with nanochat 2026-07's own flags (and 2025-11's configurator keys); a CPU plan runs one
    `python -m scripts.base_train --device-type=cpu` (runs/runcpu.sh), a GPU plan torchrun without restarts."""
    nc = adapter_for("nanochat")
    run = tmp_path / "run"
    cpu = nc.command(launch_of(make(tmp_path, capsys, NANOCHAT_CPU), run, None))
    assert cpu[1:3] == ["-m", "scripts.base_train"]
    p = argparse.ArgumentParser()
    for flag, typ in NANOCHAT_FLAGS["2026-07"].items():
        p.add_argument(flag, **({"action": "store_true"} if typ is bool else {"type": typ}))
    a = p.parse_args(cpu[3:])
    assert (a.num_iterations, a.save_every, a.resume_from_step, a.device_type) == (50, 7, 30, "cpu")
    assert a.model_tag == str(nc.checkpoint_dir(run)) and Path(a.model_tag).is_absolute()
    gpu = nc.command(launch_of(make(tmp_path, capsys, NANOCHAT_GPU, "g.json"), run, None, resume=None))
    assert gpu[1:5] == ["-m", "torch.distributed.run", "--max-restarts=0", "--standalone"]
    a = p.parse_args(gpu[gpu.index("--") + 1:])
    assert (a.num_iterations, a.save_every, a.resume_from_step, a.device_type) == (50, 7, None, None)
    old = nc.command(launch_of(make(tmp_path, capsys, [*NANOCHAT_GPU, "--trainer-version", "2025-11"], "o.json"),
                               run, None))
    assert {"--num_iterations=50", "--save_every=7", "--resume_from_step=30"} <= set(old)


def test_the_torchtitan_command_is_read_by_torchtitan(tmp_path: Path, capsys) -> None:
    manager = pytest.importorskip("torchtitan.config.manager")
    from torch.distributed.run import get_args_parser

    tt = adapter_for("torchtitan")
    run = tmp_path / "run"
    cmd = tt.command(launch_of(make(tmp_path, capsys, TITAN), run, tmp_path))
    assert cmd[1:3] == ["-m", "torch.distributed.run"]
    targs = get_args_parser().parse_args(cmd[3:])
    assert targs.module and targs.training_script == "torchtitan.train" and targs.max_restarts == 0
    cfg = manager.ConfigManager().parse_args(targs.training_script_args)
    assert cfg.dump_folder == str(run.resolve() / "torchtitan") and cfg.metrics.log_freq == 1
    assert (cfg.training.steps, cfg.checkpoint.interval, cfg.checkpoint.load_step) == (50, 7, 30)
    assert cfg.checkpoint.enable and not cfg.checkpoint.last_save_model_only and cfg.checkpoint.keep_latest_k == 3


def test_the_deepspeed_command_and_config(tmp_path: Path, capsys, monkeypatch) -> None:
    """The script gets nanoplan's flags; RUN_DIR/ds_config.json is the plan's, read by DeepSpeed's own
    DeepSpeedConfig, printing every step and decaying over the launch's step count."""
    ds_config = pytest.importorskip("deepspeed.runtime.config")
    monkeypatch.setattr(ds_config.dist, "get_rank", lambda *a, **k: 0)
    monkeypatch.setattr(ds_config.dist, "get_world_size", lambda *a, **k: 2)
    ds = adapter_for("deepspeed")
    run = tmp_path / "run"
    run.mkdir()
    launch = launch_of(make(tmp_path, capsys, DEEPSPEED), run, tmp_path)
    ds.prepare(launch)
    cmd = ds.command(launch)
    assert Path(cmd[0]).name == "deepspeed" and cmd[1:3] == ["--num_gpus=2", "train.py"]
    assert shlex.join(cmd[3:]).endswith(f"--deepspeed --deepspeed_config {run.resolve() / 'ds_config.json'} --steps 50 "
                                        f"--save-every 7 --save-dir {run.resolve() / 'checkpoints'} "
                                        "--load-tag global_step30")
    cfg = ds_config.DeepSpeedConfig(json.loads((run / "ds_config.json").read_text()))
    assert cfg.steps_per_print == 1 and cfg.scheduler_params["total_num_steps"] == 50


def test_the_trainer_s_own_venv_is_used_when_its_checkout_has_one(tmp_path: Path) -> None:
    import sys

    assert trainer_python(tmp_path) == sys.executable and trainer_python(None) == sys.executable
    py = tmp_path / ".venv" / "bin" / "python"
    py.parent.mkdir(parents=True)
    py.write_text("#!/bin/sh\n")
    py.chmod(0o755)
    assert trainer_python(tmp_path) == str(py)


def test_set_flags_replaces_a_flag_wherever_and_however_it_was_given() -> None:
    argv = ["--a", "1", "--b=2", "--on", "--c", "3"]
    assert set_flags(argv, {"--a": "9", "--b": "8", "--on": None}) == ["--c", "3", "--a", "9", "--b", "8", "--on"]


def test_a_launch_never_asks_for_a_step_count_at_or_below_its_resume_step(tmp_path: Path, capsys) -> None:
    """nanochat resumed with --num-iterations below its resume step never stops (its `step == num_iterations`
    is never met): the supervisor starts nothing instead, when the newest checkpoint is the plan's last step,
    when the run already ended at its deadline, or when no step and save fit in what is left."""
    torch = pytest.importorskip("torch")
    from runner.trainers.supervise import Supervisor

    plan = make(tmp_path, capsys, NANOCHAT_CPU)
    run = tmp_path / "run"
    nc = adapter_for("nanochat")
    ck = nc.checkpoint_dir(run)
    ck.mkdir(parents=True)
    total = plan.schedule.total_steps
    for name in (f"model_{total:06d}.pt", f"optim_{total:06d}_rank0.pt"):
        torch.save({"x": 1}, ck / name)
    (ck / f"meta_{total:06d}.json").write_text(json.dumps({"step": total}))

    def decide(carried: float = 0.0) -> tuple:
        sup = Supervisor(plan, "plan.json", run, nc, None, launch_id="x", t0=1e18, carried_s=carried, stops=None)
        sup.age = lambda: 0.0                                          # type: ignore[method-assign]
        return sup.decide()

    launch, _, why = decide()
    assert launch is None and f"holds the checkpoint of its last step ({total:,})" in why
    for p in ck.iterdir():
        p.rename(ck / p.name.replace(f"{total:06d}", f"{10:06d}"))
    (ck / "meta_000010.json").write_text(json.dumps({"step": 10}))
    launch, _, why = decide()
    assert why is None and launch.resume_step == 10 and launch.end_step > 10
    (run / "run_info.json").write_text(json.dumps({"plan_hash": None, "segments": [
        {"segment": 0, "ended": "deadline", "last_saved": 10}]}))
    launch, _, why = decide()
    assert launch is None and "stopped at its deadline at step 10" in why
    (run / "run_info.json").unlink()
    launch, _, why = decide(carried=plan.budget.hours * 3600 - 1.0)
    assert launch is None and "is spent" in why
