"""The launch files `nanoplan export PLAN --for TRAINER` writes, from a plan's numbers (pure text).

Every number comes from the plan: micro-batch, accumulation (= total batch ÷ (micro-batch × sequence
× GPUs)), steps (the budget's), the checkpoint interval in steps (the plan's hourly cadence), the
sequence length and GPU count. Flags and keys are only those in planner/trainers/flags.py (read at the
version's commit) or, for torchtitan 0.3 and DeepSpeed, those their own parsers accept
(tests/test_trainer_export.py runs them).
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from planner.plan import Plan, PlanRequest
from planner.trainers.deepspeed import (
    ALLGATHER_BUCKET,
    MAX_LIVE,
    PERSISTENCE,
    PREFETCH_BUCKET,
    REDUCE_BUCKET,
    STAGE,
    overlap_comm,
)
from planner.trainers.flags import NANOCHAT_FLAGS, TORCHTITAN_0_2_KEYS
from planner.trainers.nanochat import CURRENT, DEFAULT_VOCAB, FIRST
from planner.trainers.torchtitan import CONFIG_FN, TOML_NAME, V02, flavour_of

# the tokenizer paths torchtitan's own configs name (train_configs/*.toml, config_registry.py)
HF_ASSETS = {"debugmodel": "./tests/assets/tokenizer", "8B": "./assets/hf/Llama-3.1-8B",
             "70B": "./assets/hf/Llama-3.1-70B", "405B": "./assets/hf/Llama-3.1-405B"}


def _micro_and_accum(req: PlanRequest, gpus: int) -> tuple[int, int]:
    b = req.device_batch_size or 1
    return b, max(1, req.total_batch_tokens // (b * req.model.seq_len * gpus))


# --------------------------------------------------------------------------- nanochat

def nanochat_argv(req: PlanRequest, gpus_per_node: int, steps: int, save_every: int) -> list[str]:
    """`torchrun --standalone --nproc_per_node=N -m scripts.base_train -- FLAGS` (speedrun.sh's form)."""
    v = req.trainer.version or CURRENT
    spec = req.model
    vals: dict[str, Any] = {"depth": spec.n_layer, "max_seq_len": spec.seq_len,
                            "device_batch_size": req.device_batch_size, "total_batch_size": req.total_batch_tokens,
                            "num_iterations": steps}
    if v != FIRST:
        vals["save_every"] = save_every
    flags = NANOCHAT_FLAGS[v]
    args = []
    for key, value in vals.items():
        name = f"--{key.replace('_', '-')}" if v == CURRENT else key
        if name not in flags or not isinstance(value, flags[name]):
            raise ValueError(f"nanochat {v} has no flag {name} of type {type(value).__name__}")   # a bug here, not input
        args.append(f"{name}={value}" if v == CURRENT else f"--{name}={value}")
    return ["torchrun", "--standalone", f"--nproc_per_node={gpus_per_node}", "-m", "scripts.base_train", "--", *args]


def nanochat_files(plan: Plan, version_line: str) -> dict[str, str]:
    req, s = plan.request, plan.schedule
    v = req.trainer.version or CURRENT
    notes = [f"{s.total_steps:,} steps x {s.tokens_per_step:,} tokens = {s.total_tokens:,} tokens "
             f"(micro-batch {plan.training.device_batch_size} x accumulation {plan.training.grad_accum_steps} "
             f"x {plan.hardware.num_gpus} GPUs x {plan.training.seq_len} tokens)"]
    if v == FIRST:
        notes.append("this version saves only at the end of the run: no --save_every (added in c6abcdf, "
                     "--trainer-version 2025-11); the hourly checkpoint cannot be expressed")
    else:
        flag = "--resume-from-step" if v == CURRENT else "--resume_from_step"
        notes.append(f"checkpoint every {s.checkpoint_every_steps:,} steps (about {s.checkpoint_every_minutes:g} min); "
                     f"after a stop, rerun with {flag}=<last saved step>")
    if req.model.vocab_size != DEFAULT_VOCAB[v]:
        notes.append(f"vocabulary {req.model.vocab_size:,}: train the tokenizer with that size (scripts/tok_train.py)")
    cmd = shlex.join(plan.launch.command)
    return {"base_train.sh": _script(version_line, notes, "Run from the nanochat repository root, after its "
                                     "tokenizer and data steps (speedrun.sh).", cmd)}


# --------------------------------------------------------------------------- torchtitan

def _torchrun(nodes: int, gpus_per_node: int) -> list[str]:
    if nodes <= 1:
        return ["torchrun", f"--nproc_per_node={gpus_per_node}", "--rdzv_backend", "c10d",
                "--rdzv_endpoint=localhost:0"]
    return ["torchrun", f"--nnodes={nodes}", f"--nproc_per_node={gpus_per_node}", "--node_rank=$NODE_RANK",
            "--rdzv_backend", "c10d", "--rdzv_endpoint=$MASTER_ADDR:29500"]


def _dp(req: PlanRequest, gpus: int) -> tuple[int, int, str]:
    """(replicate degree, shard degree, fsdp_reshard_after_forward)."""
    if req.strategy == "ddp":
        return gpus, 1, "default"
    return 1, gpus, "never" if req.strategy == "zero2" else "default"


def torchtitan_overrides(req: PlanRequest, gpus: int, steps: int, save_every: int) -> list[str]:
    """0.3's `--section.key value` overrides (tyro), then the activation-checkpoint subcommand."""
    b, _ = _micro_and_accum(req, gpus)
    rep, shard, reshard = _dp(req, gpus)
    out = ["--training.local-batch-size", str(b),
           "--training.global-batch-size", str(req.total_batch_tokens // req.model.seq_len),
           "--training.seq-len", str(req.model.seq_len), "--training.steps", str(steps),
           "--training.max-norm", f"{req.hyper.grad_clip:g}",
           "--parallelism.data-parallel-replicate-degree", str(rep),
           "--parallelism.data-parallel-shard-degree", str(shard),
           "--parallelism.fsdp-reshard-after-forward", reshard,
           "--parallelism.tensor-parallel-degree", "1",
           "--checkpoint.enable", "--checkpoint.interval", str(save_every),
           "--compile.enable" if req.compile else "--compile.no-enable"]
    mode = req.trainer.ac_mode or "selective-op"
    return out + [{"none": "activation-checkpoint:none", "full": "activation-checkpoint:full"}.get(
        mode, "activation-checkpoint:selective")]


def torchtitan_argv(req: PlanRequest, nodes: int, gpus_per_node: int, steps: int, save_every: int) -> list[str]:
    flavour = flavour_of(req.model) or "8B"
    head = [*_torchrun(nodes, gpus_per_node), "-m", "torchtitan.train"]
    if req.trainer.version == V02:
        return [*head, "--job.config_file", f"{TOML_NAME[flavour]}.toml"]
    return [*head, "--module", "llama3", "--config", CONFIG_FN[flavour],
            *torchtitan_overrides(req, nodes * gpus_per_node, steps, save_every)]


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return repr(v) if isinstance(v, float) else str(v)


def torchtitan_toml(plan: Plan) -> dict[str, dict[str, Any]]:
    """0.2's job TOML, as nested dicts (sections and keys from planner/trainers/flags.py)."""
    req, g = plan.request, plan.hardware.num_gpus
    flavour = flavour_of(req.model) or "8B"
    rep, shard, reshard = _dp(req, g)
    mode = req.trainer.ac_mode or "selective-op"
    h = req.hyper
    doc: dict[str, dict[str, Any]] = {
        "job": {"dump_folder": "./outputs", "description": f"nanoplan: Llama 3 {flavour} on {plan.hardware.spec}"},
        "model": {"name": "llama3", "flavor": flavour, "hf_assets_path": HF_ASSETS[flavour]},
        "optimizer": {"name": "AdamW", "lr": h.lr, "beta1": h.betas[0], "beta2": h.betas[1], "eps": 1e-8,
                      "weight_decay": h.weight_decay},
        "lr_scheduler": {"warmup_steps": h.warmup_steps},
        "training": {"dataset": "c4", "local_batch_size": plan.training.device_batch_size,
                     "global_batch_size": req.total_batch_tokens // req.model.seq_len, "seq_len": req.model.seq_len,
                     "max_norm": float(h.grad_clip), "steps": plan.schedule.total_steps},
        "parallelism": {"data_parallel_replicate_degree": rep, "data_parallel_shard_degree": shard,
                        "fsdp_reshard_after_forward": reshard, "tensor_parallel_degree": 1},
        "checkpoint": {"enable": True, "folder": "checkpoint", "interval": plan.schedule.checkpoint_every_steps,
                       "keep_latest_k": req.keep_last},
        "compile": {"enable": req.compile, "components": ["model", "loss"]},
        "activation_checkpoint": {"mode": "selective" if mode == "selective-op" else mode, "selective_ac_option": "op"},
    }
    for sec, keys in doc.items():
        for k, val in keys.items():
            if k not in TORCHTITAN_0_2_KEYS[sec] or not isinstance(val, TORCHTITAN_0_2_KEYS[sec][k]):
                raise ValueError(f"torchtitan 0.2 has no [{sec}] {k} of type {type(val).__name__}")
    return doc


def toml_text(doc: dict[str, dict[str, Any]], header: list[str]) -> str:
    lines = [f"# {x}" for x in header]
    for sec, keys in doc.items():
        lines += ["", f"[{sec}]"] + [f"{k} = {_toml_value(v)}" for k, v in keys.items()]
    return "\n".join(lines) + "\n"


def torchtitan_files(plan: Plan, version_line: str) -> dict[str, str]:
    req, s = plan.request, plan.schedule
    notes = [f"{s.total_steps:,} steps x {s.tokens_per_step:,} tokens = {s.total_tokens:,} tokens; checkpoint every "
             f"{s.checkpoint_every_steps:,} steps (about {s.checkpoint_every_minutes:g} min)"]
    files: dict[str, str] = {}
    if req.trainer.version == V02:
        name = plan.launch.command[-1]
        files[name] = toml_text(torchtitan_toml(plan), [version_line, *notes])
    files["train.sh"] = _script(version_line, notes, "Run from the torchtitan repository root (its assets "
                                "downloaded); PYTORCH_ALLOC_CONF as run_train.sh sets it.",
                                "PYTORCH_ALLOC_CONF=expandable_segments:True " + shlex.join(plan.launch.command))
    return files


# --------------------------------------------------------------------------- DeepSpeed

def deepspeed_config(plan: Plan) -> dict[str, Any]:
    """ds_config.json: batch sizes (train_batch_size = micro × accumulation × world), bf16, AdamW,
    gradient clipping, the ZeRO stage with its buckets, and a scheduler over the planned steps."""
    req, t, g = plan.request, plan.training, plan.hardware.num_gpus
    stage = STAGE[req.strategy]
    h = req.hyper
    zero: dict[str, Any] = {"stage": stage, "contiguous_gradients": True, "overlap_comm": overlap_comm(stage),
                            "reduce_bucket_size": REDUCE_BUCKET}
    if stage < 3:
        zero["allgather_bucket_size"] = ALLGATHER_BUCKET
    else:
        zero.update({"stage3_prefetch_bucket_size": PREFETCH_BUCKET, "stage3_param_persistence_threshold": PERSISTENCE,
                     "stage3_max_live_parameters": MAX_LIVE})
    return {
        "train_batch_size": t.device_batch_size * t.grad_accum_steps * g,
        "train_micro_batch_size_per_gpu": t.device_batch_size,
        "gradient_accumulation_steps": t.grad_accum_steps,
        "gradient_clipping": float(h.grad_clip),
        "bf16": {"enabled": True},
        "optimizer": {"type": "AdamW", "params": {"lr": h.lr, "betas": list(h.betas), "eps": 1e-8,
                                                  "weight_decay": h.weight_decay}},
        "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": 0.0, "warmup_max_lr": h.lr,
                                                         "warmup_num_steps": h.warmup_steps,
                                                         "total_num_steps": plan.schedule.total_steps}},
        "zero_optimization": zero,
        "steps_per_print": 100,
    }


def deepspeed_argv(req: PlanRequest, nodes: int, gpus_per_node: int, steps: int, save_every: int) -> list[str]:
    head = ["deepspeed"] + (["--hostfile=hostfile", f"--num_nodes={nodes}"] if nodes > 1 else [])
    return [*head, f"--num_gpus={gpus_per_node}", "train.py", "--deepspeed", "--deepspeed_config", "ds_config.json"]


def deepspeed_files(plan: Plan, version_line: str) -> dict[str, str]:
    s = plan.schedule
    notes = [f"{s.total_steps:,} steps x {s.tokens_per_step:,} tokens = {s.total_tokens:,} tokens "
             f"(scheduler.total_num_steps); your train.py should stop there and call engine.save_checkpoint every "
             f"{s.checkpoint_every_steps:,} steps (about {s.checkpoint_every_minutes:g} min)",
             f"sequence length {plan.training.seq_len}: the model nanoplan planned is {plan.model.name} "
             f"({plan.model.n_params:,} parameters)"]
    return {"ds_config.json": json.dumps(deepspeed_config(plan), indent=2) + "\n",
            "train.sh": _script(version_line, notes, "train.py is your DeepSpeed script (deepspeed.initialize with "
                                "this config).", shlex.join(plan.launch.command))}


# --------------------------------------------------------------------------- shared

def launch_argv(req: PlanRequest, nodes: int, gpus_per_node: int, steps: int, save_every: int) -> list[str]:
    """The trainer's launch command for a plan (LaunchPlan.command; the last line of the exported train.sh)."""
    name = req.trainer.name
    if name == "nanochat":
        return nanochat_argv(req, gpus_per_node, steps, save_every)
    if name == "torchtitan":
        return torchtitan_argv(req, nodes, gpus_per_node, steps, save_every)
    return deepspeed_argv(req, nodes, gpus_per_node, steps, save_every)


def _script(version_line: str, notes: list[str], where: str, command: str) -> str:
    lines = ["#!/usr/bin/env bash", f"# {version_line}", *[f"# {n}" for n in notes], f"# {where}",
             "set -euo pipefail", command.replace("'$NODE_RANK'", "$NODE_RANK").replace(
                 "'--node_rank=$NODE_RANK'", "--node_rank=$NODE_RANK").replace(
                 "'--rdzv_endpoint=$MASTER_ADDR:29500'", "--rdzv_endpoint=$MASTER_ADDR:29500")]
    return "\n".join(lines) + "\n"


def launch_files(plan: Plan) -> dict[str, str]:
    """{file name: text} for the plan's trainer."""
    from planner import __version__  # noqa: PLC0415
    from planner.trainers import trainer_for  # noqa: PLC0415

    tr = trainer_for(plan.request.trainer)
    if tr is None:
        raise ValueError("a nanoplan plan has no other trainer's files")
    v = tr.version(plan.request.trainer.version)
    where = f"{tr.repo}@{v.ref[:12]}" if len(v.ref) == 40 else v.ref
    line = (f"{tr.name} {v.key} ({v.label}; {where}, {v.date}): "
            f"{plan.model.name} on {plan.hardware.spec}, by nanoplan {__version__}")
    maker = {"nanochat": nanochat_files, "torchtitan": torchtitan_files, "deepspeed": deepspeed_files}[tr.name]
    return maker(plan, line)
