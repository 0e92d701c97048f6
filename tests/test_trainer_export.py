"""`nanoplan export PLAN --for TRAINER`: each file checked by the trainer's own parser, numbers round-tripped.

- DeepSpeed: its own `deepspeed.runtime.config.DeepSpeedConfig` reads ds_config.json (it asserts
  train_batch_size = micro × accumulation × world size, rejects removed keys, and its ZeRO pydantic model
  forbids unknown keys). DeepSpeedConfig asks torch.distributed for the world size; the test answers for
  the plan's GPUs, as the launcher would.
- torchtitan 0.3: its own `torchtitan.config.manager.ConfigManager` (tyro) parses the exported command line.
- torchtitan 0.2 and nanochat do not install here (0.2 is not the installed torchtitan; nanochat is not a
  package): their files are checked against the flags and keys read at the cited commits
  (planner/trainers/flags.py), with torchrun's own parser splitting the command, configurator rules for
  nanochat 2025 (`--key=value`, value of the default's type) and an argparse parser for nanochat 2026-07.

CI installs the `trainers` extra with constraints.txt (torch stays 2.13.0); importorskip is a fallback only.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import shlex
import stat
import subprocess
from pathlib import Path

import pytest
import tomllib

from planner.plan import Plan, load_plan
from planner.trainers.flags import NANOCHAT_FLAGS, TORCHTITAN_0_2_KEYS
from planner.trainers.launch_files import deepspeed_config, launch_files
from tests.conftest import nanoplan_cli
from tests.errlines import error_and_hint

GPU = "8xH100"


cli = nanoplan_cli   # tests/conftest.py


def make(tmp_path: Path, capsys, *args: str, name: str = "plan.json") -> Plan:
    code, _, err = cli(["estimate", *args, "--out", name], capsys, tmp_path)
    assert code == 0, err
    return load_plan(tmp_path / name)


def round_trip(plan: Plan, micro: int, accum: int, steps: int, every: int) -> None:
    """The exported numbers are the plan's: global batch, planned tokens, an hourly checkpoint."""
    t, s = plan.training, plan.schedule
    assert (micro, accum) == (t.device_batch_size, t.grad_accum_steps)
    assert micro * accum * plan.hardware.num_gpus * t.seq_len == t.total_batch_tokens == s.tokens_per_step
    assert steps * s.tokens_per_step == s.total_tokens
    assert every == s.checkpoint_every_steps
    assert abs(every * plan.throughput.step_seconds - 3600) <= plan.throughput.step_seconds


def script_command(text: str) -> list[str]:
    """The launch line of an exported train.sh / base_train.sh, split as bash would."""
    line = [x for x in text.splitlines() if x and not x.startswith("#") and not x.startswith("set ")][-1]
    words = shlex.split(line)
    return [w for w in words if "=" not in w or w.startswith("-")]   # drop VAR=value prefixes


# --------------------------------------------------------------------------- DeepSpeed


@pytest.fixture
def ds_world(monkeypatch):
    ds_config = pytest.importorskip("deepspeed.runtime.config")

    def world(n: int):
        monkeypatch.setattr(ds_config.dist, "get_rank", lambda *a, **k: 0)
        monkeypatch.setattr(ds_config.dist, "get_world_size", lambda *a, **k: n)
        return ds_config.DeepSpeedConfig
    return world


@pytest.mark.parametrize("strategy, stage", [("zero1", 1), ("zero2", 2), ("fsdp", 3)])
def test_deepspeed_config_is_read_by_deepspeed(strategy: str, stage: int, tmp_path: Path, capsys, ds_world) -> None:
    plan = make(tmp_path, capsys, "--trainer", "deepspeed", "--style", "gpt2", "--n-layer", "24", "--d-model", "1536",
                "--n-head", "16", "--vocab-size", "50000", "--seq-len", "2048", "--gpu", GPU, "--device-batch-size", "4",
                "--total-batch-tokens", str(512 * 2048), "--strategy", strategy, "--budget", "1000")
    code, _, err = cli(["export", "plan.json", "--for", "deepspeed", "--out", "launch"], capsys, tmp_path)
    assert code == 0, err
    cfg = json.loads((tmp_path / "launch" / "ds_config.json").read_text())
    ds = ds_world(plan.hardware.num_gpus)(cfg)
    assert (ds.train_batch_size, ds.train_micro_batch_size_per_gpu, ds.gradient_accumulation_steps) == (512, 4, 16)
    assert ds.zero_optimization_stage == stage and ds.zero_enabled
    assert ds.bfloat16_config.enabled and ds.gradient_clipping == plan.request.hyper.grad_clip
    assert ds.optimizer_name == "adamw" and ds.scheduler_name == "WarmupDecayLR"
    steps = ds.scheduler_params["total_num_steps"]
    train = (tmp_path / "launch" / "train.sh").read_text()
    every = int(train.split("engine.save_checkpoint every ")[1].split(" steps")[0].replace(",", ""))
    round_trip(plan, ds.train_micro_batch_size_per_gpu, ds.gradient_accumulation_steps, steps, every)
    assert script_command(train) == ["deepspeed", "--num_gpus=8", "train.py", "--deepspeed", "--deepspeed_config",
                                     "ds_config.json"]
    assert os.stat(tmp_path / "launch" / "train.sh").st_mode & stat.S_IXUSR


def test_deepspeed_rejects_what_the_config_must_not_say(ds_world, tmp_path: Path, capsys) -> None:
    """The same parser fails a wrong accumulation or a removed key: the check above can fail."""
    plan = make(tmp_path, capsys, "--trainer", "deepspeed", "--preset", "gpt2", "--gpu", GPU, "--steps", "10")
    cfg = deepspeed_config(plan)
    parse = ds_world(8)
    parse(cfg)
    with pytest.raises(AssertionError):
        parse({**cfg, "gradient_accumulation_steps": cfg["gradient_accumulation_steps"] + 1})
    with pytest.raises(Exception, match="removed"):
        parse({**cfg, "elasticity": {"enabled": True}})


# --------------------------------------------------------------------------- torchtitan


@pytest.mark.parametrize("mode, ac_class, keep", [("selective-op", "SelectiveAC", "1"), ("full", "FullAC", "3"),
                                                  ("none", None, "5")])
def test_torchtitan_03_command_is_parsed_by_torchtitan(mode: str, ac_class: str | None, keep: str, tmp_path: Path,
                                                       capsys) -> None:
    manager = pytest.importorskip("torchtitan.config.manager")
    plan = make(tmp_path, capsys, "--trainer", "torchtitan", "--preset", "8B", "--gpu", GPU, "--device-batch-size", "1",
                "--total-batch-tokens", str(16 * 8192), "--ac-mode", mode, "--keep-last", keep, "--budget", "1000")
    text = launch_files(plan)["train.sh"]
    argv = script_command(text)
    from torch.distributed.run import get_args_parser
    run = get_args_parser().parse_args(argv[1:])
    assert run.module and run.training_script == "torchtitan.train" and run.nproc_per_node == "8"
    cfg = manager.ConfigManager().parse_args(run.training_script_args)
    tr, par = cfg.training, cfg.parallelism
    assert (par.data_parallel_shard_degree, par.data_parallel_replicate_degree, par.tensor_parallel_degree) == (8, 1, 1)
    assert tr.seq_len == 8192 and tr.global_batch_size == 16 and cfg.checkpoint.enable
    accum = tr.global_batch_size // (tr.local_batch_size * par.data_parallel_shard_degree)
    round_trip(plan, tr.local_batch_size, accum, tr.steps, cfg.checkpoint.interval)
    kind = type(cfg.activation_checkpoint).__qualname__.split(".")[0]
    assert kind == (ac_class or kind) and (ac_class is not None or "SelectiveAC" not in kind and "FullAC" not in kind)
    assert cfg.compile.enable is False
    # keep_latest_k at least 2 (torchtitan refuses 1); CUDA graphs off (no graph pool in the memory model); the
    # plan's AdamW and warmup, not the config's (weight decay 0.1, 200 warmup steps)
    assert cfg.checkpoint.keep_latest_k == max(2, int(keep)) and cfg.training.disable_cuda_graphs
    h = plan.request.hyper
    assert cfg.optimizer.param_groups[0].optimizer_kwargs == {"lr": h.lr, "betas": h.betas, "eps": 1e-8,
                                                              "weight_decay": h.weight_decay}
    assert cfg.lr_scheduler.warmup_steps == h.warmup_steps


@pytest.mark.parametrize("strategy, tp, degrees", [("hsdp", 2, (4, 2, 2)), ("fsdp", 4, (4, 1, 4)), ("ddp", 2, (1, 8, 2))])
def test_torchtitan_03_parses_tensor_parallel_and_hsdp_plans(strategy: str, tp: int, degrees: tuple[int, int, int],
                                                             tmp_path: Path, capsys) -> None:
    """Issue 29: a plan with --tp N and/or --strategy hsdp exports torchtitan's own degrees (2 nodes of 8 here):
    data-parallel ranks are the GPUs over tp; hsdp shards within a node's tensor-parallel groups and replicates
    across nodes. torchtitan's parser reads them back, with the micro-batch and accumulation over those ranks."""
    manager = pytest.importorskip("torchtitan.config.manager")
    plan = make(tmp_path, capsys, "--trainer", "torchtitan", "--preset", "8B", "--gpu", "2x8xH100",
                "--device-batch-size", "1", "--total-batch-tokens", str(64 * 8192), "--strategy", strategy,
                "--tp", str(tp), "--budget", "1000")
    argv = [w.replace("$NODE_RANK", "0").replace("$MASTER_ADDR", "head") for w in
            script_command(launch_files(plan)["train.sh"])]          # what the shell expands on node 0
    from torch.distributed.run import get_args_parser
    run = get_args_parser().parse_args(argv[1:])
    cfg = manager.ConfigManager().parse_args(run.training_script_args)
    par, tr, t = cfg.parallelism, cfg.training, plan.training
    assert (par.data_parallel_shard_degree, par.data_parallel_replicate_degree, par.tensor_parallel_degree) == degrees
    assert par.enable_sequence_parallel is True
    dp = par.data_parallel_shard_degree * par.data_parallel_replicate_degree
    assert dp * tp == 16 and tr.local_batch_size == t.device_batch_size
    assert tr.global_batch_size * tr.seq_len == t.total_batch_tokens == 64 * 8192
    assert tr.global_batch_size // (tr.local_batch_size * dp) == t.grad_accum_steps


def test_torchtitan_02_toml_uses_only_v022_keys(tmp_path: Path, capsys) -> None:
    plan = make(tmp_path, capsys, "--trainer", "torchtitan", "--trainer-version", "0.2", "--preset", "8B", "--gpu", GPU,
                "--device-batch-size", "1", "--total-batch-tokens", str(16 * 8192), "--keep-last", "1", "--budget", "1000")
    code, _, err = cli(["export", "plan.json", "--for", "torchtitan", "--out", "tt"], capsys, tmp_path)
    assert code == 0, err
    doc = tomllib.loads((tmp_path / "tt" / "llama3_8b.toml").read_text())
    for sec, keys in doc.items():
        for k, v in keys.items():
            assert k in TORCHTITAN_0_2_KEYS[sec] and isinstance(v, TORCHTITAN_0_2_KEYS[sec][k]), (sec, k)
    t, par = doc["training"], doc["parallelism"]
    assert doc["model"] == {"name": "llama3", "flavor": "8B", "hf_assets_path": "./assets/hf/Llama-3.1-8B"}
    assert doc["activation_checkpoint"] == {"mode": "selective", "selective_ac_option": "op"}
    assert doc["checkpoint"]["keep_latest_k"] == 2          # v0.2.2 refuses 1 ("the last one may be being saved")
    round_trip(plan, t["local_batch_size"], t["global_batch_size"] // (t["local_batch_size"] * par["data_parallel_shard_degree"]),
               t["steps"], doc["checkpoint"]["interval"])
    argv = script_command((tmp_path / "tt" / "train.sh").read_text())
    assert argv[-2:] == ["--job.config_file", "llama3_8b.toml"] and "torchtitan.train" in argv


# --------------------------------------------------------------------------- nanochat


def _nanochat_args(text: str) -> list[str]:
    from torch.distributed.run import get_args_parser
    run = get_args_parser().parse_args(script_command(text)[1:])
    assert run.standalone and run.module and run.training_script == "scripts.base_train"
    return run.training_script_args


def _configurator(args: list[str], flags: dict[str, type]) -> dict[str, object]:
    """nanochat/configurator.py's rules: `--key=value`, a known key, a value of the default's type."""
    out = {}
    for arg in args:
        assert arg.startswith("--") and "=" in arg, arg
        key, val = arg[2:].split("=")
        assert key in flags, key
        value = ast.literal_eval(val)
        assert type(value) is flags[key], (key, val)
        out[key] = value
    return out


def _argparse(args: list[str], flags: dict[str, type]) -> dict[str, object]:
    p = argparse.ArgumentParser(exit_on_error=False)
    for name, typ in flags.items():
        if typ is bool:
            p.add_argument(name, action="store_true")
        else:
            p.add_argument(name, type=typ)
    return vars(p.parse_args(args))


@pytest.mark.parametrize("version", ["2025-10", "2025-11", "2026-07"])
def test_nanochat_d20_for_100_dollars_gives_base_train(version: str, tmp_path: Path, capsys) -> None:
    plan = make(tmp_path, capsys, "--trainer", "nanochat", "--trainer-version", version, "--depth", "20", "--gpu", GPU,
                "--budget", "100", "--headroom", "0")
    code, out, err = cli(["export", "plan.json", "--for", "nanochat"], capsys, tmp_path)
    assert code == 0, err
    assert out.startswith("# ==> base_train.sh <==\n#!/usr/bin/env bash\n")
    args = _nanochat_args(out)
    flags = NANOCHAT_FLAGS[version]
    if version == "2026-07":
        got = {k: v for k, v in _argparse(args, flags).items() if v is not None and v is not False}
        got = {k.replace("_", "-"): v for k, v in got.items()}
        assert "total-batch-size" not in got           # nanochat's own rule (its default -1): 2**20 for d20
        micro, total, steps = got["device-batch-size"], 2**20, got["num-iterations"]
        every = got["save-every"]
        assert "--resume-from-step" in out
    else:
        got = _configurator(args, flags)
        micro, total, steps = got["device_batch_size"], got["total_batch_size"], got["num_iterations"]
        every = got.get("save_every", plan.schedule.checkpoint_every_steps)
        assert ("save_every" in got) == (version == "2025-11")
        if version == "2025-10":
            assert "the hourly checkpoint cannot be expressed" in out
    assert got["depth"] == 20 and plan.hardware.usd_per_gpu_hour * 8 * plan.budget.hours == pytest.approx(100, abs=0.5)
    assert total == plan.training.total_batch_tokens
    round_trip(plan, micro, total // (micro * 8 * 2048), steps, every)
    assert version in out and plan.launch.command[-len(args):] == args


def test_export_for_another_trainer_or_a_nanoplan_plan_is_refused(tmp_path: Path, capsys) -> None:
    make(tmp_path, capsys, "--depth", "12", "--gpu", GPU, "--steps", "10")
    code, _, err = cli(["export", "plan.json", "--for", "nanochat"], capsys, tmp_path)
    assert code == 2 and "plans nanoplan's step" in err and "--trainer nanochat" in err
    code, _, err = cli(["export", "plan.json", "--for", "megatron"], capsys, tmp_path)
    assert code == 2 and "error: --for: unknown trainer" in err


# --------------------------------------------------------------------------- a hand-edited plan (issue 30 item 1)


def _edit(tmp_path: Path, name: str, change) -> None:
    doc = json.loads((tmp_path / "plan.json").read_text())
    change(doc)
    (tmp_path / name).write_text(json.dumps(doc))


def _refused(tmp_path: Path, capsys, name: str, trainer: str) -> str:
    before = sorted(p.name for p in tmp_path.rglob("*"))
    code, out, err = cli(["export", name, "--for", trainer, "--out", "launch"], capsys, tmp_path)
    line, _ = error_and_hint(err)
    assert code == 2 and line.startswith(f"error: {name}: stale or edited:"), err
    assert sorted(p.name for p in tmp_path.rglob("*")) == before and not out   # nothing written, nothing printed
    return line


def test_an_edited_launch_command_is_refused_and_never_copied(tmp_path: Path, capsys) -> None:
    make(tmp_path, capsys, "--trainer", "nanochat", "--depth", "12", "--gpu", GPU, "--budget", "20")
    payload = ["bash", "-c", "touch pwned; torchrun --standalone -m scripts.base_train"]
    _edit(tmp_path, "edited.json", lambda d: d["launch"].update(command=payload))
    assert "launch.command" in _refused(tmp_path, capsys, "edited.json", "nanochat")
    # launch_files itself rebuilds the command from the request: the edited words never reach base_train.sh
    text = launch_files(load_plan(tmp_path / "edited.json"))["base_train.sh"]
    assert "pwned" not in text and "bash -c" not in text
    assert script_command(text) == load_plan(tmp_path / "plan.json").launch.command


@pytest.mark.parametrize("where", ["ABSOLUTE", "../evil.toml", "sub/../../evil.toml"])
def test_the_torchtitan_02_toml_is_never_written_where_the_plan_says(where: str, tmp_path: Path, capsys) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (tmp_path / "outside").mkdir()
    where = str(tmp_path / "outside" / "evil.toml") if where == "ABSOLUTE" else where
    make(work, capsys, "--trainer", "torchtitan", "--trainer-version", "0.2", "--preset", "8B", "--gpu", GPU,
         "--device-batch-size", "1", "--total-batch-tokens", str(16 * 8192), "--budget", "1000")
    _edit(work, "edited.json", lambda d: d["launch"]["command"].__setitem__(-1, where))
    _refused(work, capsys, "edited.json", "torchtitan")
    assert not Path(where).exists() and not (work / where).exists()
    assert list(launch_files(load_plan(work / "edited.json"))) == ["llama3_8b.toml", "train.sh"]


def test_a_ds_config_takes_no_accumulation_from_an_edited_plan(tmp_path: Path, capsys) -> None:
    make(tmp_path, capsys, "--trainer", "deepspeed", "--preset", "gpt2", "--gpu", GPU, "--steps", "10")
    _edit(tmp_path, "edited.json", lambda d: d["training"].update(grad_accum_steps=10**30))
    assert "training.grad_accum_steps" in _refused(tmp_path, capsys, "edited.json", "deepspeed")


def test_exported_shell_words_are_quoted_and_the_scheduler_s_variables_stay_one_word(tmp_path: Path, capsys) -> None:
    """A multi-node train.sh run by bash with a stand-in torchrun: $NODE_RANK and $MASTER_ADDR expand as one word
    each, whatever they hold, and nothing else expands."""
    make(tmp_path, capsys, "--trainer", "torchtitan", "--preset", "8B", "--gpu", "2x8xH100", "--device-batch-size",
         "1", "--total-batch-tokens", str(32 * 8192), "--budget", "1000")
    code, _, err = cli(["export", "plan.json", "--for", "torchtitan", "--out", "launch"], capsys, tmp_path)
    assert code == 0, err
    stub = 'torchrun() { printf "%s\\n" "$@" > args.txt; }; source ./train.sh'
    env = {**os.environ, "NODE_RANK": "1", "MASTER_ADDR": "10.0.0.1 *"}
    subprocess.run(["bash", "-c", stub], cwd=tmp_path / "launch", env=env, check=True)
    words = (tmp_path / "launch" / "args.txt").read_text().splitlines()
    assert "--node_rank=1" in words and "--rdzv_endpoint=10.0.0.1 *:29500" in words
    plan = load_plan(tmp_path / "plan.json")
    expected = [w.replace("$NODE_RANK", "1").replace("$MASTER_ADDR", "10.0.0.1 *") for w in plan.launch.command[1:]]
    assert words == expected
