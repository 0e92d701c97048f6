"""Schema of runs.yaml: public GPU training measurements, each with its source and quoted line.

Load with ``load_runs()``. Field meanings and units are in README.md next to this file. No torch, no nanoplan.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal, Optional

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

RUNS_FILE = Path(__file__).with_name("runs.yaml")

Trainer = Literal["nanochat", "torchtitan", "llm-foundry", "modded-nanogpt", "megatron-lm", "deepspeed", "nanogpt",
                  "llm.c", "litgpt"]
Strategy = Literal["ddp", "zero1", "zero2", "fsdp", "hsdp", "fsdp+tp"]
Checkpointing = Literal["none", "full", "selective-layer", "selective-op"]
# the attention kernel the run's software used (README.md, "Attention kernels"): FlashAttention 1 (torch <= 2.1 SDPA),
# FlashAttention-2 (torch's flash backend since 2.2), FlashAttention-3, cuDNN's fused attention, llm-foundry's Triton
# flash-attention kernel (flash_attn_triton, FlashAttention-1 era)
AttentionKernel = Literal["fa1", "fa2", "fa3", "cudnn", "triton-fa1"]

SPEED_FIELDS = ("measured_tokens_per_s_per_gpu", "measured_tokens_per_s_total", "measured_step_time_ms",
                "measured_mfu_pct")
MEMORY_FIELDS = ("measured_memory", "measured_memory_unit", "measured_memory_kind")

PosInt = Annotated[int, Field(gt=0)]
PosFloat = Annotated[float, Field(gt=0)]


class PublicRun(BaseModel):
    """One measured (or out-of-memory) training configuration from a public source."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(pattern=r"^[a-z0-9][a-z0-9.-]*$")
    split: Literal["calibration", "heldout"]
    outcome: Literal["ran", "oom"]

    # where the figures come from: repo + path + commit, or a URL
    source_repo: Optional[str] = Field(default=None, pattern=r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")
    source_path: Optional[str] = None
    source_commit: Optional[str] = Field(default=None, pattern=r"^[0-9a-f]{40}$")
    source_url: Optional[str] = Field(default=None, pattern=r"^https://\S+$")
    source_date: Optional[str] = Field(default=None, pattern=r"^\d{4}(-\d{2}){0,2}$")
    quote: str = Field(min_length=10)

    trainer: Trainer
    trainer_version: Optional[str]

    # model
    model_name: str
    arch: str
    n_layer: PosInt
    d_model: PosInt
    n_heads: PosInt
    n_kv_heads: Optional[PosInt]
    ffn_hidden: Optional[PosInt]
    vocab_size: Optional[PosInt]
    tied_embeddings: Optional[bool]
    n_params_reported: Optional[PosInt]

    # batch (micro_batch_per_gpu is per data-parallel rank, in sequences of seq_len tokens)
    seq_len: PosInt
    micro_batch_per_gpu: PosInt
    grad_accum_steps: Optional[PosInt]
    global_batch_seqs: Optional[PosInt]

    # hardware: gpu is a nanoplan profile name (hardware_profiles/<gpu>.yaml)
    gpu: str
    gpu_detail: Optional[str]
    gpu_memory_gb: Optional[PosFloat]
    gpus_per_node: PosInt
    nodes: PosInt

    # how it was run
    strategy: Strategy
    tp_degree: PosInt
    # torchtitan's async tensor parallelism (enable_async_tensor_parallel: the TP collectives micro-pipelined with the
    # matmuls by inductor); the planner has none, so such a row is planned as plain --tp (its note says so)
    async_tp: bool = False
    activation_checkpointing: Checkpointing
    compile: bool
    # element-wise work in hand-fused kernels without torch.compile (llm.c, TinyLlama's fused norm/SwiGLU/rotary/loss)
    fused_elementwise: bool = False
    attention_kernel: Optional[AttentionKernel] = None
    # the loss's logit-wide passes in fused kernels (a compiled loss, or a fused cross-entropy kernel); null: as
    # `compile` (README.md, fields: the sources of each value)
    fused_loss: Optional[bool] = None
    # the norms run in the autocast dtype, with no fp32 copy of their input (llm-foundry's low_precision_layernorm)
    low_precision_norms: bool = False
    precision: Literal["bf16", "fp8"]
    precision_detail: Optional[str]
    grad_reduce_dtype: Optional[Literal["fp32", "bf16"]]
    optimizer: str

    # what was measured (absent when the source does not give it)
    measured_tokens_per_s_per_gpu: Optional[float] = Field(default=None, gt=0)
    measured_tokens_per_s_total: Optional[float] = Field(default=None, gt=0)
    measured_step_time_ms: Optional[float] = Field(default=None, gt=0)
    measured_mfu_pct: Optional[float] = Field(default=None, gt=0, le=100)
    mfu_basis_flops_per_token: Optional[float] = Field(default=None, gt=0)
    mfu_basis_peak_tflops: Optional[float] = Field(default=None, gt=0)
    measured_memory: Optional[float] = Field(default=None, gt=0)
    measured_memory_unit: Optional[Literal["MiB", "GiB", "GB"]] = None
    measured_memory_kind: Optional[Literal["max_memory_allocated", "max_memory_reserved", "nvidia-smi"]] = None

    notes: str = ""

    @model_validator(mode="after")
    def _check(self) -> PublicRun:
        in_repo = (self.source_repo, self.source_path, self.source_commit)
        if self.source_url is None and not all(in_repo):
            raise ValueError(f"{self.id}: needs source_repo + source_path + source_commit, or source_url")
        if self.source_url is not None and any(in_repo):
            raise ValueError(f"{self.id}: give either repo/path/commit or a URL, not both")
        speeds = [getattr(self, f) for f in SPEED_FIELDS]
        if self.outcome == "ran" and all(v is None for v in speeds):
            raise ValueError(f"{self.id}: a run that ran needs tokens/s, step time or MFU")
        if self.outcome == "oom" and any(v is not None for v in speeds):
            raise ValueError(f"{self.id}: an out-of-memory row carries no speed")
        mem = [getattr(self, f) for f in MEMORY_FIELDS]
        if any(v is not None for v in mem) and not all(v is not None for v in mem):
            raise ValueError(f"{self.id}: measured_memory, its unit and its kind go together")
        if self.gpus_per_node % self.tp_degree:
            raise ValueError(f"{self.id}: tp_degree must divide the GPUs of a node (tensor parallelism stays in a node)")
        if (self.tp_degree > 1) != (self.strategy == "fsdp+tp") and self.strategy != "hsdp":
            raise ValueError(f"{self.id}: strategy fsdp+tp goes with tp_degree > 1 (hsdp takes either)")
        if self.grad_accum_steps and self.global_batch_seqs:
            implied = self.micro_batch_per_gpu * self.dp_degree * self.grad_accum_steps
            if implied != self.global_batch_seqs:
                raise ValueError(f"{self.id}: micro-batch x DP ranks x accumulation = {implied},"
                                 f" not global_batch_seqs {self.global_batch_seqs}")
        return self

    @property
    def total_gpus(self) -> int:
        return self.gpus_per_node * self.nodes

    @property
    def dp_degree(self) -> int:
        return self.total_gpus // self.tp_degree

    @property
    def multi_node(self) -> bool:
        return self.nodes > 1


class RunsFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    schema_version: Literal[1]
    runs: list[PublicRun]


def load_runs(path: Optional[Path | str] = None) -> list[PublicRun]:
    """Parse and validate runs.yaml (or ``path``); raises ValueError on a bad or duplicated row."""
    data = yaml.safe_load(Path(path or RUNS_FILE).read_text())
    runs = RunsFile.model_validate(data).runs
    seen: set[str] = set()
    for r in runs:
        if r.id in seen:
            raise ValueError(f"duplicate id {r.id!r}")
        seen.add(r.id)
    return runs
