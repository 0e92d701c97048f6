"""A DeepSpeed ZeRO training step (deepspeedai/DeepSpeed), as nanoplan plans it.

DeepSpeed wraps the user's own model and loop (`deepspeed.initialize(model=..., config=ds_config)`), so the
model is the GPT nanoplan describes (for the "1B GPT-2" guide: `--style gpt2`), built eagerly, in bf16.

Version 0.19: deepspeed 0.19.8 from the package index (uploaded 2026-10-20), the release the export tests run
(its DeepSpeedConfig reads every exported ds_config.json). Each fact below was read in that release's own source,
as installed (paths under deepspeed/). The newest public snapshot of deepspeedai/DeepSpeed seen here, edaa722
(2026-08-22), is 0.19.6 development code and differs: it still accepts the `elasticity` block 0.19.8 refuses, and
has no `compute_grad_norm`. What 0.19.8 does, by file:
- deepspeed/runtime/config.py: `train_batch_size` must equal `train_micro_batch_size_per_gpu` ×
  `gradient_accumulation_steps` × world size (`_batch_assertion`); removed keys raise
  (`_reject_removed_config_keys`: elasticity, sparse_attention, curriculum_learning, ...).
- `bf16.enabled`: the module's weights and gradients are bf16; a ZeRO optimizer keeps the fp32 master
  weights and AdamW's two moments, 12 bytes per parameter, partitioned over the data-parallel ranks
  (deepspeed/runtime/zero/stage_1_and_2.py, stage3.py). Stage 1 partitions that state, stage 2 also the
  gradients (reduced into partitions as they are made), stage 3 also the bf16 weights (gathered per
  module ahead of use): nanoplan's zero1, zero2 and fsdp, shown and exported as ZeRO-1, ZeRO-2 and ZeRO-3
  (`--strategy zero3` is taken for fsdp).
- buckets (deepspeed/runtime/zero/config.py defaults, written out in the exported config):
  reduce_bucket_size 5e8 elements. Stage 1/2 stage gradients in `reduce_bucket_size` buffers
  (`setup_buckets`: fp32 for ZeRO-1, bf16 for ZeRO-2, two of them with overlap_comm); stage 3 keeps one
  bf16 flat reduce buffer of that size and prefetches stage3_prefetch_bucket_size (5e7) elements.
- stage 0 with bf16 runs DeepSpeed's own bf16 optimizer wrapper, which nanoplan does not model: refused.

Memory: the planner's step (planner.memory.estimate) in bf16 with the strategy above, plus the
fp32 state beyond the bf16 step's (8 bytes per parameter, partitioned) and the buckets.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from planner.counts import n_params
from planner.memory import estimate
from planner.memory_terms import F32, MemoryEstimate, StepConfig
from planner.plan import Plan, PlanRequest, TrainerRef
from planner.trainers import Trainer, Version, with_overheads

BF16 = 2
VERSIONS = (
    Version("0.19", "deepspeed==0.19.8", "2026-10-20", "0.19.8",
            "deepspeed 0.19.8 (package index, uploaded 2026-10-20), its installed source: "
            "deepspeed/runtime/config.py, deepspeed/runtime/zero/config.py, stage_1_and_2.py, stage3.py"),
)
STAGE = {"zero1": 1, "zero2": 2, "fsdp": 3}
REDUCE_BUCKET = 500_000_000        # zero/config.py reduce_bucket_size default (elements)
ALLGATHER_BUCKET = 500_000_000     # zero/config.py allgather_bucket_size default (elements)
PREFETCH_BUCKET = 50_000_000       # zero/config.py stage3_prefetch_bucket_size default (elements)
PERSISTENCE = 100_000              # zero/config.py stage3_param_persistence_threshold default (elements)
MAX_LIVE = 1_000_000_000           # zero/config.py stage3_max_live_parameters default (elements)


def overlap_comm(stage: int) -> bool:
    """What the exported config says: DeepSpeed's own default (on for stage 3, zero/config.py overlap_comm_valid)."""
    return stage == 3


def bucket_bytes(stage: int) -> int:
    """Bytes of the gradient staging buffers a rank holds during the backward."""
    if stage == 3:
        return BF16 * REDUCE_BUCKET + BF16 * PREFETCH_BUCKET
    per = F32 if stage == 1 else BF16
    return per * REDUCE_BUCKET * (2 if overlap_comm(stage) else 1)


class DeepSpeed(Trainer):
    name = "deepspeed"
    repo = "deepspeedai/DeepSpeed"
    versions = VERSIONS
    default_version = "0.19"
    allocator_sets = ""     # deepspeed 0.19.8 sets no PYTORCH_CUDA_ALLOC_CONF (it is only mentioned, in ulysses_sp.py's docstring)

    def problems(self, req: PlanRequest, num_gpus: int, nodes: int, gpu_kind: str) -> list[tuple[str, str, str]]:
        out: list[tuple[str, str, str]] = []
        if gpu_kind != "gpu":
            out.append(("--gpu", "nanoplan models DeepSpeed's CUDA step", "plan it on a GPU profile"))
        if req.strategy not in STAGE:
            out.append(("--strategy", f"{req.strategy} is ZeRO stage 0, where bf16 runs DeepSpeed's own bf16 optimizer "
                        "wrapper, which nanoplan does not model", "use --strategy zero1, zero2 or zero3"))
        if req.optimizer != "adamw":
            out.append(("--optimizer", "nanoplan writes DeepSpeed's AdamW (its Muon works with ZeRO 1-2 only and is "
                        "not modelled)", "drop --optimizer"))
        if req.activation_checkpointing:
            out.append(("--activation-checkpointing", "ds_config cannot checkpoint a model DeepSpeed did not build; "
                        "your script would call torch.utils.checkpoint", "drop it, or lower the micro-batch"))
        if req.compile:
            out.append(("--compile", "the guide's loop runs eagerly (engine.compile() is the script's call)",
                        "drop --compile"))
        if req.precision != "bf16-autocast":
            out.append(("--precision", "nanoplan writes bf16.enabled (bf16 weights, fp32 master state)",
                        "drop --precision"))
        if req.loss_chunk_tokens != 0:
            out.append(("loss_chunk_tokens", "the guide's loss takes the full logits", "set it to 0"))
        if req.trainer.ac_mode is not None:
            out.append(("--ac-mode", "is a torchtitan option", "drop it"))
        if req.fp8:
            out.append(("--fp8", "ds_config has no FP8 training nanoplan models", "drop --fp8"))
        if req.trainer.window_pattern is not None:
            out.append(("window_pattern", "is a nanochat option", "leave it unset"))
        return out

    def strategy_label(self, strategy: str) -> str:
        return f"ZeRO-{STAGE[strategy]}" if strategy in STAGE else strategy

    def fallbacks(self, user: dict[str, Any]) -> list[dict[str, Any]]:
        """ZeRO-1, then ZeRO-2, when ZeRO-3 (the first try, the fewest bytes) does not fit and no stage was
        chosen: the stage with the fewest partitions that fits communicates least."""
        return [{"strategy": "zero1"}, {"strategy": "zero2"}] if user.get("strategy") is None else []

    def plan_label(self, req: PlanRequest) -> str:
        return self.strategy_label(req.strategy)

    def export_notes(self, plan: Plan) -> list[str]:
        """What ds_config.json cannot say (JSON has no comments): train.sh's comments, and `export --for`'s notes."""
        req, h = plan.request, plan.request.hyper
        stage = STAGE[req.strategy]
        return [f"ZeRO-{stage} (zero_optimization.stage {stage}) on {plan.hardware.num_gpus} GPUs",
                f"ds_config.json: AdamW lr {h.lr:g}, weight decay {h.weight_decay:g} and {h.warmup_steps} warmup "
                "steps (WarmupDecayLR) are the plan's (request.hyper: nanoplan's defaults, no weight decay, no "
                "warmup); edit them there for another recipe"]

    def request_fields(self, user: dict[str, Any], num_gpus: int, version: str | None,
                       profile: Any = None) -> dict[str, Any]:
        v = self.version(version).key
        strategy = {"zero3": "fsdp"}.get(user.get("strategy") or "", user.get("strategy"))   # ZeRO-3 is fsdp
        return {"optimizer": user.get("optimizer") or "adamw", "strategy": strategy or "fsdp",
                "activation_checkpointing": bool(user.get("activation_checkpointing")),
                "compile": bool(user.get("compile")), "precision": user.get("precision") or "bf16-autocast",
                "loss_chunk_tokens": 0, "trainer": TrainerRef(name="deepspeed", version=v, ac_mode=user.get("ac_mode"))}

    def memory(self, cfg: StepConfig, ref: TrainerRef, overheads: dict[str, int], fragmentation: float) -> MemoryEstimate:
        stage = STAGE.get(cfg.strategy, 3)
        mem = estimate(replace(cfg, precision="bf16", compile=False, loss_chunk_tokens=0))
        dp = max(1, cfg.dp)
        P = n_params(cfg.spec)
        breakdown = dict(mem.breakdown)
        extra = {"optimizer_state": 8 * P // dp,            # fp32 master weights beside the bf16 step's moments
                 "temporaries": bucket_bytes(stage)}
        for k, x in extra.items():
            breakdown[k] += x
        add = sum(extra.values())
        phases = {p: t + add for p, t in mem.phases.items()}
        total = sum(breakdown.values())
        return with_overheads(total, mem.peak_phase, breakdown, phases, overheads, fragmentation)



DEEPSPEED = DeepSpeed()
