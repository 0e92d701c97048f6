"""The launch files `nanoplan export PLAN --for TRAINER` writes, from a plan's numbers (pure text).

Every number comes from the plan: micro-batch, accumulation (= total batch ÷ (micro-batch × sequence
× GPUs)), steps (the budget's), the checkpoint interval in steps (the plan's hourly cadence), the
sequence length and GPU count. Flags and keys are only those in planner/trainers/flags.py (read at the
version's commit) or, for torchtitan 0.3 and DeepSpeed, those their own parsers accept
(tests/test_trainer_export.py runs them).

Nothing is copied from the plan file as text: the command is rebuilt from the plan's request and derived
numbers (the same `launch_argv` that wrote `launch.command`), file names are constants, and each shell
word is `shlex.quote`d (the scheduler's `$NODE_RANK` and `$MASTER_ADDR` alone expand, double-quoted).
nanoplan/export_trainer.py re-derives the plan first and refuses an edited one.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from planner.parallelism import data_parallel_degree, hsdp_shard
from planner.plan import Plan, PlanRequest
from planner.trainers.deepspeed import (
    ALLGATHER_BUCKET,
    DEEPSPEED,
    MAX_LIVE,
    PERSISTENCE,
    PREFETCH_BUCKET,
    REDUCE_BUCKET,
    STAGE,
    overlap_comm,
)
from planner.trainers.flags import NANOCHAT_FLAGS, TORCHTITAN_0_2_KEYS, TORCHTITAN_MAIN_FLAGS
from planner.trainers.nanochat import CURRENT, DEFAULT_VOCAB, FIRST, attention_kernel, auto_total_batch
from planner.trainers.torchtitan import CONFIG_FN, MAIN, TOML_NAME, V02, flavour_of

# the tokenizer paths torchtitan's own configs name (train_configs/*.toml, config_registry.py)
HF_ASSETS = {"debugmodel": "./tests/assets/tokenizer", "8B": "./assets/hf/Llama-3.1-8B",
             "70B": "./assets/hf/Llama-3.1-70B", "405B": "./assets/hf/Llama-3.1-405B"}


# nanochat 2026-07 base_train.py: --eval-tokens defaults to 80 × 524,288; the export lets the val-bpb passes take at
# most VAL_TIME_SHARE of the run's training time (a forward pass is about a third of a training step's FLOPs per
# token, so the passes' tokens ≤ 3 × share × the tokens trained)
NANOCHAT_EVAL_TOKENS = 80 * 524_288
VAL_TIME_SHARE = 0.01
FORWARD_SHARE = 3


def _micro_and_accum(req: PlanRequest, gpus: int) -> tuple[int, int]:
    """(micro-batch, accumulation) over the data-parallel ranks (the GPUs over the tensor-parallel degree)."""
    b = req.device_batch_size or 1
    return b, max(1, req.total_batch_tokens // (b * req.model.seq_len * data_parallel_degree(gpus, req.tp)))


# --------------------------------------------------------------------------- nanochat

def eval_passes(steps: int, eval_every: int) -> int:
    """base_train.py's val-bpb passes over a run: at step 0, every `eval_every` steps, and at the last step."""
    return steps // eval_every + 1 + (1 if steps % eval_every else 0)


def nanochat_eval_tokens(req: PlanRequest, gpus: int, eval_every: int, steps: int | None = None) -> int:
    """--eval-tokens for a val-bpb pass every `eval_every` steps of a `steps`-step run (None: a long one) whose passes
    take at most VAL_TIME_SHARE of its training time: nanochat's default (80 × 524,288) or less, a whole number of
    micro-batches over all GPUs, at least one."""
    world = (req.device_batch_size or 1) * req.model.seq_len * gpus
    if steps is None:
        cap = int(FORWARD_SHARE * VAL_TIME_SHARE * eval_every * req.total_batch_tokens)
    else:
        cap = int(FORWARD_SHARE * VAL_TIME_SHARE * steps * req.total_batch_tokens / eval_passes(steps, eval_every))
    return max(world, min(NANOCHAT_EVAL_TOKENS, cap) // world * world)


def nanochat_argv(req: PlanRequest, gpus_per_node: int, steps: int, save_every: int) -> list[str]:
    """`torchrun --standalone --nproc_per_node=N -m scripts.base_train -- FLAGS` (speedrun.sh's form).

    2026-07: no --total-batch-size when the plan's batch is nanochat's own rule (its default -1 computes the same
    number from --depth, and so its LR and weight-decay scaling); the window pattern the plan's attention kernel
    takes; --fp8 when planned; the val-bpb pass at the checkpoint cadence, bounded to VAL_TIME_SHARE of the time
    (nanochat_eval_tokens), and the CORE metric and samples off (their time is not in the plan: run
    scripts.base_eval after training, as speedrun.sh does)."""
    v = req.trainer.version or CURRENT
    spec = req.model
    vals: dict[str, Any] = {"depth": spec.n_layer, "max_seq_len": spec.seq_len,
                            "device_batch_size": req.device_batch_size, "total_batch_size": req.total_batch_tokens,
                            "num_iterations": steps}
    if v == CURRENT and req.total_batch_tokens == auto_total_batch(spec, v):
        del vals["total_batch_size"]
    if v != FIRST:
        vals["save_every"] = save_every
    if v == CURRENT:
        vals.update(window_pattern=req.trainer.window_pattern or "SSSL", fp8=req.fp8, eval_every=save_every,
                    eval_tokens=nanochat_eval_tokens(req, gpus_per_node, save_every, steps), core_metric_every=-1,
                    sample_every=-1)
    flags = NANOCHAT_FLAGS[v]
    args = []
    for key, value in vals.items():
        name = f"--{key.replace('_', '-')}" if v == CURRENT else key
        if name not in flags or type(value) is not flags[name]:
            raise ValueError(f"nanochat {v} has no flag {name} of type {type(value).__name__}")   # a bug here, not input
        if value is True:
            args.append(name)                                   # store_true
        elif value is not False:
            args.append(f"{name}={value}" if v == CURRENT else f"--{name}={value}")
    return ["torchrun", "--standalone", f"--nproc_per_node={gpus_per_node}", "-m", "scripts.base_train", "--", *args]


def _nanochat_recipe_notes(plan: Plan) -> list[str]:
    """2026-07: where the batch, window pattern, FP8 and evaluation settings come from."""
    t = plan.training
    req = plan.request.model_copy(update={"device_batch_size": t.device_batch_size})
    auto = auto_total_batch(req.model, CURRENT)
    if t.total_batch_tokens == auto:
        batch = (f"total batch {auto:,} tokens: nanochat's own rule for d{req.model.n_layer} (no --total-batch-size: "
                 "its default -1 computes it, and scales the LRs and weight decay to it)")
    else:
        batch = (f"total batch {t.total_batch_tokens:,} tokens as planned (nanochat's own rule gives {auto:,}); "
                 "nanochat scales its LRs and weight decay to it")
    pattern = req.trainer.window_pattern or "SSSL"
    kernel = attention_kernel(req.profile)
    window = (f"--window-pattern={pattern}: {plan.hardware.profile_name} gets Flash Attention 3 (Hopper)" if kernel == "fa3"
              else f"--window-pattern={pattern}: {plan.hardware.profile_name} runs PyTorch's SDPA, which has no sliding "
                   "windows (base_train.py recommends L there)")
    every, steps = plan.schedule.checkpoint_every_steps, plan.schedule.total_steps
    ev = nanochat_eval_tokens(req, plan.hardware.gpus_per_node, every, steps)
    passes = eval_passes(steps, every)
    share = passes * ev / (FORWARD_SHARE * steps * t.total_batch_tokens)
    out = [batch, window]
    if req.fp8:
        out.append("--fp8: the block matrices and lm_head in FP8 (tensorwise); evaluation runs in bf16")
    out.append(f"val bpb every {every:,} steps ({passes} passes) over {ev:,} tokens each (about {share:.1%} of the "
               "time, not in the plan's hours); CORE and samples off: run scripts.base_eval after training, as "
               "speedrun.sh does")
    return out


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
    if v == CURRENT:
        notes += _nanochat_recipe_notes(plan)
    if req.model.vocab_size != DEFAULT_VOCAB[v]:
        notes.append(f"vocabulary {req.model.vocab_size:,}: train the tokenizer with that size (scripts/tok_train.py)")
    return {"base_train.sh": _script(version_line, notes, "Run from the nanochat repository root, after its "
                                     "tokenizer and data steps (speedrun.sh).", plan_argv(plan))}


# --------------------------------------------------------------------------- torchtitan

def _torchrun(nodes: int, gpus_per_node: int) -> list[str]:
    if nodes <= 1:
        return ["torchrun", f"--nproc_per_node={gpus_per_node}", "--rdzv_backend", "c10d",
                "--rdzv_endpoint=localhost:0"]
    return ["torchrun", f"--nnodes={nodes}", f"--nproc_per_node={gpus_per_node}", "--node_rank=$NODE_RANK",
            "--rdzv_backend", "c10d", "--rdzv_endpoint=$MASTER_ADDR:29500"]


def _dp(req: PlanRequest, gpus: int, gpus_per_node: int) -> tuple[int, int, str]:
    """(replicate degree, shard degree, fsdp_reshard_after_forward) over the data-parallel ranks: ddp replicates,
    hsdp shards within a node (over its tensor-parallel groups) and replicates across nodes, the rest shard."""
    dp = data_parallel_degree(gpus, req.tp)
    if req.strategy == "ddp":
        return dp, 1, "default"
    if req.strategy == "hsdp":
        shard = hsdp_shard("hsdp", gpus_per_node, req.tp)
        return dp // shard, shard, "default"
    return 1, dp, "never" if req.strategy == "zero2" else "default"


def keep_latest_k(req: PlanRequest) -> int:
    """torchtitan's checkpoint.keep_latest_k: the plan's keep_last, but at least 2 (0.2.2 and 0.3.0 refuse 1: "the
    last one may be in the process of being saved")."""
    return max(2, req.keep_last)


def torchtitan_overrides(req: PlanRequest, gpus: int, steps: int, save_every: int,
                         gpus_per_node: int | None = None) -> list[str]:
    """0.3's (or main's) `--section.key value` overrides (tyro), then the activation-checkpoint subcommand.

    The batch as tokens on main (73aed7f: num-tokens-per-microbatch-per-dp-rank, num-tokens-per-train-step,
    max-context-length), as sequences on 0.3; the plan's AdamW settings and warmup instead of the config's
    (default_adamw: weight decay 0.1; warmup 200 steps); CUDA graphs off (nanoplan's memory model has no graph pool;
    torchtitan captures forward and backward unless told not to, since f84224a)."""
    b, _ = _micro_and_accum(req, gpus)
    rep, shard, reshard = _dp(req, gpus, gpus_per_node or gpus)
    h = req.hyper
    seq = req.model.seq_len
    if req.trainer.version == MAIN:
        batch = ["--training.num-tokens-per-microbatch-per-dp-rank", str(b * seq),
                 "--training.num-tokens-per-train-step", str(req.total_batch_tokens),
                 "--training.max-context-length", str(seq)]
    else:
        batch = ["--training.local-batch-size", str(b), "--training.global-batch-size", str(req.total_batch_tokens // seq),
                 "--training.seq-len", str(seq)]
    adamw = "--optimizer.param-groups.0.optimizer-kwargs."
    out = [*batch, "--training.steps", str(steps), "--training.max-norm", f"{h.grad_clip:g}",
           "--training.disable-cuda-graphs",
           f"{adamw}lr", f"{h.lr:g}", f"{adamw}betas", f"{h.betas[0]:g}", f"{h.betas[1]:g}", f"{adamw}eps", "1e-08",
           f"{adamw}weight-decay", f"{h.weight_decay:g}", "--lr-scheduler.warmup-steps", str(h.warmup_steps),
           "--parallelism.data-parallel-replicate-degree", str(rep),
           "--parallelism.data-parallel-shard-degree", str(shard),
           "--parallelism.fsdp-reshard-after-forward", reshard,
           "--parallelism.tensor-parallel-degree", str(req.tp),
           "--parallelism.enable-sequence-parallel" if req.sequence_parallel else
           "--parallelism.no-enable-sequence-parallel",
           "--checkpoint.enable", "--checkpoint.interval", str(save_every),
           "--checkpoint.keep-latest-k", str(keep_latest_k(req)),
           "--compile.enable" if req.compile else "--compile.no-enable"]
    mode = req.trainer.ac_mode or "selective-op"
    out.append({"none": "activation-checkpoint:none", "full": "activation-checkpoint:full"}.get(
        mode, "activation-checkpoint:selective"))
    if req.trainer.version == MAIN:
        unknown = [w for w in out if w.startswith("-") and w not in TORCHTITAN_MAIN_FLAGS]
        if unknown:
            raise ValueError(f"torchtitan main has no flag {unknown[0]}")   # a bug here, not input
    return out


def torchtitan_argv(req: PlanRequest, nodes: int, gpus_per_node: int, steps: int, save_every: int) -> list[str]:
    flavour = flavour_of(req.model) or "8B"
    head = [*_torchrun(nodes, gpus_per_node), "-m", "torchtitan.train"]
    if req.trainer.version == V02:
        return [*head, "--job.config_file", toml_name(req)]
    return [*head, "--module", "llama3", "--config", CONFIG_FN[flavour],
            *torchtitan_overrides(req, nodes * gpus_per_node, steps, save_every, gpus_per_node)]


def toml_name(req: PlanRequest) -> str:
    """0.2's job TOML file name: torchtitan's own name for the flavour (a constant, never from the plan file)."""
    return f"{TOML_NAME[flavour_of(req.model) or '8B']}.toml"


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
    rep, shard, reshard = _dp(req, g, plan.hardware.gpus_per_node)
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
                        "fsdp_reshard_after_forward": reshard, "tensor_parallel_degree": req.tp},
        "checkpoint": {"enable": True, "folder": "checkpoint", "interval": plan.schedule.checkpoint_every_steps,
                       "keep_latest_k": keep_latest_k(req)},
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
    h = req.hyper
    notes = [f"{s.total_steps:,} steps x {s.tokens_per_step:,} tokens = {s.total_tokens:,} tokens; checkpoint every "
             f"{s.checkpoint_every_steps:,} steps (about {s.checkpoint_every_minutes:g} min), the last "
             f"{keep_latest_k(req)} kept",
             f"AdamW lr {h.lr:g}, weight decay {h.weight_decay:g} and {h.warmup_steps} warmup steps are the plan's "
             "(request.hyper), not the config's (weight decay 0.1, 200 warmup steps)"]
    if req.trainer.version != V02:
        notes.append("--training.disable-cuda-graphs: nanoplan's memory model has no CUDA graph pool")
    files: dict[str, str] = {}
    if req.trainer.version == V02:
        files[toml_name(req)] = toml_text(torchtitan_toml(plan), [version_line, *notes])
    files["train.sh"] = _script(version_line, notes, "Run from the torchtitan repository root (its assets "
                                "downloaded); PYTORCH_ALLOC_CONF as run_train.sh sets it.", plan_argv(plan),
                                env=(("PYTORCH_ALLOC_CONF", "expandable_segments:True"),))
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
             f"({plan.model.n_params:,} parameters)", *DEEPSPEED.export_notes(plan)]
    return {"ds_config.json": json.dumps(deepspeed_config(plan), indent=2) + "\n",
            "train.sh": _script(version_line, notes, "train.py is your DeepSpeed script (deepspeed.initialize with "
                                "this config).", plan_argv(plan))}


# --------------------------------------------------------------------------- shared

def launch_argv(req: PlanRequest, nodes: int, gpus_per_node: int, steps: int, save_every: int) -> list[str]:
    """The trainer's launch command for a plan (LaunchPlan.command; the last line of the exported train.sh)."""
    name = req.trainer.name
    if name == "nanochat":
        return nanochat_argv(req, gpus_per_node, steps, save_every)
    if name == "torchtitan":
        return torchtitan_argv(req, nodes, gpus_per_node, steps, save_every)
    return deepspeed_argv(req, nodes, gpus_per_node, steps, save_every)


def plan_argv(plan: Plan) -> list[str]:
    """The plan's launch command rebuilt from its request and derived numbers, as planner.build wrote it (never
    read from `launch.command`, which a hand-edited file may hold anything in)."""
    req = plan.request.model_copy(update={"device_batch_size": plan.training.device_batch_size})
    hw = plan.hardware
    return launch_argv(req, hw.nodes, hw.gpus_per_node, plan.schedule.total_steps, plan.schedule.checkpoint_every_steps)


# the scheduler's variables a multi-node command expands (planner.trainers.launch_files._torchrun), double-quoted
_SHELL_VARIABLES = {"--node_rank=$NODE_RANK": '--node_rank="$NODE_RANK"',
                    "--rdzv_endpoint=$MASTER_ADDR:29500": '--rdzv_endpoint="$MASTER_ADDR":29500'}


def shell_line(argv: list[str], env: tuple[tuple[str, str], ...] = ()) -> str:
    """One shell command line: every word `shlex.quote`d, but for the scheduler's $NODE_RANK and $MASTER_ADDR,
    which expand as one word each."""
    words = [f"{k}={shlex.quote(v)}" for k, v in env]
    return " ".join(words + [_SHELL_VARIABLES.get(w) or shlex.quote(w) for w in argv])


def _script(version_line: str, notes: list[str], where: str, argv: list[str],
            env: tuple[tuple[str, str], ...] = ()) -> str:
    lines = ["#!/usr/bin/env bash", f"# {version_line}", *[f"# {n}" for n in notes], f"# {where}",
             "set -euo pipefail", shell_line(argv, env)]
    return "\n".join(lines) + "\n"


def launch_files(plan: Plan) -> dict[str, str]:
    """{file name: text} for the plan's trainer (names are constants; the command is rebuilt, plan_argv)."""
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


def export_notes(plan: Plan) -> list[str]:
    """What `nanoplan export --for` prints beside the files (stderr): the settings a file cannot comment on."""
    from planner.trainers import trainer_for  # noqa: PLC0415

    tr = trainer_for(plan.request.trainer)
    return tr.export_notes(plan) if tr is not None else []
