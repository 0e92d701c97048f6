"""torchtitan's Llama-3 pre-training step (pytorch/torchtitan), as nanoplan plans it.

Versions (`--trainer-version KEY`):
- 0.2 (v0.2.2, 73a0e69, 2026-02-20): job TOML files (torchtitan/config/job_config.py,
  torchtitan/models/llama3/train_configs/llama3_8b.toml), launched with
  `torchrun ... -m torchtitan.train --job.config_file FILE` (run_train.sh). Full logits:
  `cross_entropy(pred.flatten(0, 1).float(), ...)` (torchtitan/components/loss.py).
- 0.3 (0.3.0 on the package index, uploaded 2026-09-03): Python configs chosen with `--module llama3 --config
  llama3_8b`, overridden as `--section.key value` (torchtitan/config/manager.py, tyro), activation
  checkpointing as a subcommand (`activation-checkpoint:selective|full|none`). Its Llama configs wrap the
  loss in ChunkedLossWrapper (num_chunks 8 over the sequence, torchtitan/components/loss.py). It captures the
  forward and backward in a CUDA graph unless `--training.disable-cuda-graphs` (added in f84224a, 2026-08-13;
  torchtitan/distributed/cudagraph.py): a private pool that keeps the step's activations reserved through the
  optimizer step and gradients that are zeroed, not freed. nanoplan's memory model has neither, so the exports
  turn the graphs off.
- main (b5bcd76, 2026-08-21): the same step and configs, but the batch dimension folded into the token
  dimension since 73aed7f (2026-08-20, "fold batch dim"): `--training.num-tokens-per-microbatch-per-dp-rank`,
  `--training.num-tokens-per-train-step` and `--training.max-context-length` replace local-batch-size,
  global-batch-size and seq-len (torchtitan/config/configs.py TrainingConfig). Documents are packed into the
  token budget and attention stops at document boundaries: nanoplan still counts full causal attention over
  max-context-length, an upper bound.

What the step does:
- model: the registered Llama-3 flavours only (debugmodel, 8B, 70B, 405B; torchtitan/models/llama3/
  __init__.py): dims are not command-line options, so any other model is refused.
- parallelism: FSDP2 `fully_shard` over data_parallel_shard_degree = every GPU (fsdp, or zero2 with
  fsdp_reshard_after_forward = "never"), or DDP (data_parallel_replicate_degree). Mixed precision:
  fp32 parameters sharded, bf16 gathered for compute, fp32 gradient reduction (training.mixed_precision_param
  "bfloat16", mixed_precision_reduce "float32"). AdamW (default_adamw / [optimizer] name "AdamW"), fused.
- activation checkpointing (torchtitan/distributed/activation_checkpoint.py): none; full (each block
  recomputed); selective-op, the default of the 8B configs: saves the outputs of matmuls and attention,
  recomputing every second matmul (`mm_count % 2 == 0`), so a Llama block keeps wq, wv, w1 and w2's
  outputs, the attention output and its statistics, and its input.
- compile: off in the 8B/70B configs; `--compile.enable` turns it on.

Memory: the planner's own step (planner.memory.estimate) in bf16 for activations, with the
differences added: parameters, gradients and AdamW moments are fp32 shards (the planner's bf16 step
counts 2-byte ones); selective-op adds its saved matmul outputs to the full-checkpointing step;
0.3 chunks the loss into 8 pieces. Public memory readings (max_memory_reserved) for 8B on 8xH100
and 128xH100 bound this model from above in tests/test_trainers.py.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from planner.counts import n_params
from planner.memory import estimate
from planner.memory_parallel import param_shards
from planner.memory_terms import F32, MemoryEstimate, StepConfig
from planner.plan import PlanRequest, TrainerRef
from planner.spec import ModelSpec, llama
from planner.trainers import Trainer, Version, with_overheads

REPO = "pytorch/torchtitan"
V02, V03, MAIN = "0.2", "0.3", "main"
VERSIONS = (
    Version(V02, "73a0e6979dd10b6b1904098eb3c8f62c18ab87ce", "2026-02-20", "v0.2.2, job TOML",
            f"{REPO} torchtitan/config/job_config.py, torchtitan/models/llama3/, torchtitan/distributed/"),
    Version(V03, "torchtitan==0.3.0", "2026-09-03", "0.3.0, Python configs",
            "torchtitan 0.3.0 (package index, uploaded 2026-09-03): torchtitan/config/manager.py, "
            "torchtitan/models/llama3/config_registry.py, torchtitan/config/configs.py"),
    Version(MAIN, "b5bcd76c66d0acb1a08b176d9639425bc55e0b2a", "2026-08-21", "main, token-based batch flags",
            f"{REPO} torchtitan/config/configs.py (TrainingConfig since 73aed7f), torchtitan/models/llama3/"
            "config_registry.py, torchtitan/components/checkpointer/base.py"),
)
LOSS_CHUNKS_03 = 8          # 0.3.0 and main ChunkedLossWrapper.Config.num_chunks
CHUNKED = (V03, MAIN)       # the versions whose Llama configs chunk the loss
VOCAB = 128256              # Llama 3 tokenizer (8B/70B/405B); debugmodel uses 2048
FLAVOURS: dict[str, ModelSpec] = {
    # torchtitan/models/llama3/__init__.py: dim, n_layers, n_heads, n_kv_heads, ffn from ffn_dim_multiplier/multiple_of
    "debugmodel": llama(6, 256, 16, 16, 768, seq_len=2048, vocab_size=2048),
    "8B": llama(32, 4096, 32, 8, 14336, seq_len=8192, vocab_size=VOCAB),
    "70B": llama(80, 8192, 64, 8, 28672, seq_len=8192, vocab_size=VOCAB),
    "405B": llama(126, 16384, 128, 8, 53248, seq_len=8192, vocab_size=VOCAB),
}
CONFIG_FN = {"debugmodel": "llama3_debugmodel", "8B": "llama3_8b", "70B": "llama3_70b", "405B": "llama3_405b"}
TOML_NAME = {"debugmodel": "debug_model", "8B": "llama3_8b", "70B": "llama3_70b", "405B": "llama3_405b"}


def flavour_of(spec: ModelSpec) -> str | None:
    """The registered flavour this spec is (seq_len aside), or None."""
    for name, f in FLAVOURS.items():
        if spec.model_dump(exclude={"seq_len"}) == f.model_dump(exclude={"seq_len"}):
            return name
    return None


def flavour_spec(name: str, seq_len: int | None = None) -> ModelSpec | None:
    """`--preset` names for torchtitan's flavours: 8B, llama3_8b, llama3-8b, ... (None if not one)."""
    key = name.lower().replace("-", "_").removeprefix("llama3_").removeprefix("llama3.1_").upper()
    for fname, f in FLAVOURS.items():
        if key == fname.upper():
            return f.model_copy(update={"seq_len": seq_len}) if seq_len else f
    return None


def selective_op_saved(spec: ModelSpec, precision_bytes: int = 2) -> int:
    """Bytes per token one Llama block keeps under op-level selective checkpointing: its input, and the
    outputs of the 1st, 3rd, 5th and 7th matmul (wq, wv, w1, w2) and of attention (out + logsumexp)."""
    a, d = precision_bytes, spec.d_model
    q, kv, f = spec.n_head * spec.head_dim, spec.n_kv_head * spec.head_dim, spec.d_ff
    return a * d + a * (q + kv + f + d) + a * q + F32 * spec.n_head


class Torchtitan(Trainer):
    name = "torchtitan"
    repo = REPO
    versions = VERSIONS
    default_version = V03
    # run_train.sh: PYTORCH_ALLOC_CONF="expandable_segments:True" torchrun ... (0168bd5; run_llama_train.sh since
    # a5e57e4, 2024-10-22); the wheel's torchtitan.train sets none, so nanoplan's export line sets it (launch_files.py)
    allocator_sets = "its run_train.sh, and nanoplan's export line"
    separate_projections = True     # wq, wk, wv, wo; w1, w3, w2 (planner/checkpointing.py)
    hybrid_parallel = True          # --parallelism.data_parallel_replicate_degree, tensor_parallel_degree
    model_hint = "give --preset 8B (or 70B, 405B, debugmodel)"

    def model_for(self, version: str, *, depth: int | None, preset: str | None, seq_len: int | None,
                  vocab: int | None) -> ModelSpec | None:
        """--preset NAME: one of torchtitan's Llama 3 flavours (flavour_spec)."""
        return flavour_spec(preset, seq_len) if preset is not None else None

    def fallbacks(self, user: dict[str, Any]) -> list[dict[str, Any]]:
        """Full activation checkpointing when selective does not fit and the user chose neither."""
        if user.get("ac_mode") is None and user.get("activation_checkpointing") is None:
            return [{"ac_mode": "full"}]
        return []

    def plan_label(self, req: PlanRequest) -> str:
        return f"{req.strategy} with {req.trainer.ac_mode} activation checkpointing"

    def problems(self, req: PlanRequest, num_gpus: int, nodes: int, gpu_kind: str) -> list[tuple[str, str, str]]:
        out: list[tuple[str, str, str]] = []
        if gpu_kind != "gpu":
            out.append(("--gpu", "nanoplan models torchtitan's CUDA step", "plan it on a GPU profile"))
        if flavour_of(req.model) is None:
            out.append(("--preset", "its llama3 module builds only the registered flavours (debugmodel, 8B, 70B, 405B); "
                        "model dims are not options", "give --preset 8B (or 70B, 405B, debugmodel)"))
        if req.strategy not in ("fsdp", "zero2", "ddp", "hsdp"):
            out.append(("--strategy", f"{req.strategy}: it shards optimizer state only with the parameters (FSDP2)",
                        "use --strategy fsdp, zero2 (reshard_after_forward never), hsdp or ddp"))
        if req.optimizer != "adamw":
            out.append(("--optimizer", "its Llama configs train with AdamW", "drop --optimizer"))
        if req.precision != "bf16-autocast":
            out.append(("--precision", "it trains fp32 shards with bf16 compute (FSDP2 mixed precision)",
                        "drop --precision"))
        if req.loss_chunk_tokens != 0:
            out.append(("loss_chunk_tokens", "its loss chunking is fixed by the version (0.2 none, 0.3 eight chunks)",
                        "set it to 0"))
        if req.fp8:
            out.append(("--fp8", "nanoplan does not model torchtitan's float8 converters", "drop --fp8"))
        if req.trainer.window_pattern is not None:
            out.append(("window_pattern", "is a nanochat option", "leave it unset"))
        mode = req.trainer.ac_mode
        if mode is None or (mode != "none") != req.activation_checkpointing or \
                (mode == "selective-op") != (req.ac_policy == "selective-op") or req.ac_every != 1:
            out.append(("--ac-mode", "the activation-checkpoint mode must be none, selective-op or full, with "
                        "activation_checkpointing true and ac_policy as the mode for selective-op and full",
                        "give --ac-mode"))
        return out

    def request_fields(self, user: dict[str, Any], num_gpus: int, version: str | None,
                       profile: Any = None) -> dict[str, Any]:
        v = self.version(version).key
        ac = user.get("activation_checkpointing")
        mode = user.get("ac_mode") or ("full" if ac else "none" if ac is False else "selective-op")
        return {"optimizer": user.get("optimizer") or "adamw", "strategy": user.get("strategy") or "fsdp",
                "activation_checkpointing": mode != "none", "ac_policy": "selective-op" if mode == "selective-op" else "full",
                "compile": bool(user.get("compile")),
                "precision": user.get("precision") or "bf16-autocast", "loss_chunk_tokens": 0,
                "trainer": TrainerRef(name="torchtitan", version=v, ac_mode=mode)}

    def memory(self, cfg: StepConfig, ref: TrainerRef, overheads: dict[str, int], fragmentation: float) -> MemoryEstimate:
        v = self.version(ref.version).key
        mode = ref.ac_mode or "selective-op"
        N = cfg.device_batch_size * cfg.spec.seq_len
        chunk = -(-N // LOSS_CHUNKS_03) if v == V03 else 0
        # selective-op: the fully checkpointed step plus what torchtitan's policy saves (selective_op_saved, below)
        step = replace(cfg, precision="bf16", loss_chunk_tokens=chunk, activation_checkpointing=mode != "none",
                       ac_policy="full")
        mem = estimate(step)
        P = n_params(cfg.spec)
        dp = param_shards(cfg)      # the FSDP shard group (hsdp: one node's), × the tensor-parallel degree
        breakdown = dict(mem.breakdown)
        extra = {"parameters": 2 * P // dp, "optimizer_state": 4 * P // dp,     # fp32 shards, not bf16
                 "gradients": breakdown["gradients"]}                            # fp32 gradients (reduce fp32)
        if mode == "selective-op":
            extra["activations"] = cfg.spec.n_layer * (selective_op_saved(cfg.spec) - 2 * cfg.spec.d_model) * N
        for k, x in extra.items():
            breakdown[k] += x
        add = sum(extra.values()) - extra["gradients"]
        phases = {p: t + add for p, t in mem.phases.items()}
        total = sum(breakdown.values())
        phases[mem.peak_phase] = total
        # run_train.sh launches with PYTORCH_ALLOC_CONF="expandable_segments:True": no fragmentation allowance
        return with_overheads(total, mem.peak_phase, breakdown, phases, overheads, 0.0)



TORCHTITAN = Torchtitan()
