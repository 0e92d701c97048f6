"""The command-line surface of trainers that are not packages, as read at a cited commit.

nanochat is a repository, not a package, so its parser cannot be installed and asked. These are the
flags `scripts/base_train.py` accepts, with their types, read at the commit of each version
(planner/trainers/nanochat.py VERSIONS): for 2025-10 and 2025-11 the configurator's keys (the
module-level settings above `config_keys = ...`; nanochat/configurator.py overrides one only with a value
of the same type), for 2026-07 the `parser.add_argument("--...")` lines. torchtitan 0.2's job TOML
sections and keys are read from torchtitan/config/job_config.py at v0.2.2 (73a0e69), and torchtitan main's flags
(not on the package index) at b5bcd76. The exports use no other flag or key, and tests/test_trainer_export.py parses
every exported command against these.
"""

from __future__ import annotations

# karpathy/nanochat scripts/base_train.py @ 3a5e0bc50b123f37220f1ace6813f080455d19f3 (configurator keys)
NANOCHAT_2025_10: dict[str, type] = {
    "run": str, "depth": int, "max_seq_len": int, "num_iterations": int, "target_flops": float,
    "target_param_data_ratio": int, "device_batch_size": int, "total_batch_size": int, "embedding_lr": float,
    "unembedding_lr": float, "weight_decay": float, "matrix_lr": float, "grad_clip": float, "eval_every": int,
    "eval_tokens": int, "core_metric_every": int, "core_metric_max_per_task": int, "sample_every": int,
    "model_tag": str,
}
# karpathy/nanochat scripts/base_train.py @ c6abcdfe3a23f3cc3656e4132a606e8753415fca (configurator keys)
NANOCHAT_2025_11: dict[str, type] = {
    **NANOCHAT_2025_10, "device_type": str, "warmup_ratio": float, "warmdown_ratio": float, "final_lr_frac": float,
    "resume_from_step": int, "save_every": int,
}
# karpathy/nanochat scripts/base_train.py @ 92d63d4e8bb4df75c3b71618f31ddde2378b2bcd (argparse; store_true: bool)
NANOCHAT_2026_07: dict[str, type] = {
    "--run": str, "--device-type": str, "--fp8": bool, "--fp8-recipe": str, "--depth": int, "--aspect-ratio": int,
    "--head-dim": int, "--max-seq-len": int, "--window-pattern": str, "--num-iterations": int,
    "--target-flops": float, "--target-param-data-ratio": float, "--device-batch-size": int,
    "--total-batch-size": int, "--embedding-lr": float, "--unembedding-lr": float, "--weight-decay": float,
    "--matrix-lr": float, "--scalar-lr": float, "--warmup-steps": int, "--warmdown-ratio": float,
    "--final-lr-frac": float, "--resume-from-step": int, "--eval-every": int, "--eval-tokens": int,
    "--core-metric-every": int, "--core-metric-max-per-task": int, "--sample-every": int, "--save-every": int,
    "--model-tag": str,
}
NANOCHAT_FLAGS = {"2025-10": NANOCHAT_2025_10, "2025-11": NANOCHAT_2025_11, "2026-07": NANOCHAT_2026_07}

# pytorch/torchtitan torchtitan/config/job_config.py @ 73a0e6979dd10b6b1904098eb3c8f62c18ab87ce (v0.2.2):
# the JobConfig sections and the keys nanoplan writes in each, with their annotated types.
TORCHTITAN_0_2_KEYS: dict[str, dict[str, type]] = {
    "job": {"dump_folder": str, "description": str},
    "model": {"name": str, "flavor": str, "hf_assets_path": str},
    "optimizer": {"name": str, "lr": float, "beta1": float, "beta2": float, "eps": float, "weight_decay": float},
    "lr_scheduler": {"warmup_steps": int},
    "training": {"dataset": str, "local_batch_size": int, "global_batch_size": int, "seq_len": int,
                 "max_norm": float, "steps": int},
    "parallelism": {"data_parallel_replicate_degree": int, "data_parallel_shard_degree": int,
                    "fsdp_reshard_after_forward": str, "tensor_parallel_degree": int},
    "checkpoint": {"enable": bool, "folder": str, "interval": int, "keep_latest_k": int},
    "compile": {"enable": bool, "components": list},
    "activation_checkpoint": {"mode": str, "selective_ac_option": str},
}

# pytorch/torchtitan main @ b5bcd76c66d0acb1a08b176d9639425bc55e0b2a (2026-08-21): the tyro flags nanoplan writes, as
# `--module llama3 --config llama3_8b --help` lists them (torchtitan/config/configs.py, the token-based TrainingConfig
# since 73aed7f; torchtitan/components/optimizer, checkpointer/base.py), with the type of their value (bool: a flag
# without one). The activation-checkpoint subcommands are the positional choices.
TORCHTITAN_MAIN_FLAGS: dict[str, type | list[type]] = {
    "--module": str, "--config": str,
    "--training.num-tokens-per-microbatch-per-dp-rank": int, "--training.num-tokens-per-train-step": int,
    "--training.max-context-length": int, "--training.steps": int, "--training.max-norm": float,
    "--training.disable-cuda-graphs": bool,
    "--optimizer.param-groups.0.optimizer-kwargs.lr": float,
    "--optimizer.param-groups.0.optimizer-kwargs.betas": [float, float],
    "--optimizer.param-groups.0.optimizer-kwargs.eps": float,
    "--optimizer.param-groups.0.optimizer-kwargs.weight-decay": float,
    "--lr-scheduler.warmup-steps": int,
    "--parallelism.data-parallel-replicate-degree": int, "--parallelism.data-parallel-shard-degree": int,
    "--parallelism.fsdp-reshard-after-forward": str, "--parallelism.tensor-parallel-degree": int,
    "--parallelism.enable-sequence-parallel": bool, "--parallelism.no-enable-sequence-parallel": bool,
    "--checkpoint.enable": bool, "--checkpoint.interval": int, "--checkpoint.keep-latest-k": int,
    "--compile.enable": bool, "--compile.no-enable": bool,
}
TORCHTITAN_MAIN_AC = ("activation-checkpoint:selective", "activation-checkpoint:full",
                      "activation-checkpoint:memory-budget", "activation-checkpoint:none")
