"""A public run (runs.yaml row) as the planner's inputs, and the planner's prediction for it.

`inputs(row)` maps a row onto what nanoplan plans: a ModelSpec of the row's architecture family, the hardware
(profile × GPUs per node × nodes), and a StepConfig (micro-batch, accumulation, data-parallel degree, strategy,
checkpointing, compile, precision, optimizer). `predict(row)` runs the planner on it: tokens/s from
planner.throughput, and the fit verdict from planner.fit_verdict on the allocated peak of planner.memory.

Mapping (README.md in this folder has the sources of each row):
- arch `nanochat-2025-10` -> planner.spec.nanochat(depth); `nanochat-2026-01` -> the same d20 (the sliding window
  and the residual scalars add no saved tensor the planner counts); `modded-nanogpt-2024-10` -> the nanochat block
  (rotary, ReLU², QK-norm, weightless RMSNorm, no bias) with the row's heads, width, vocabulary and tied head;
  `mpt` -> GPT-2 style (LayerNorm with bias, GELU, learned positions, biases, tied): the count matches llm-foundry's
  printed NumParams exactly; `llama` -> planner.spec.llama with the row's FFN width and vocabulary.
- The loss, by what each trainer runs (`mem_cfg` for the memory, `cfg` for the speed): torchtitan computes cross-entropy on the full fp32 logits
  (`cross_entropy(pred.flatten(0, 1).float(), ...)`), as the runner's unchunked loss does: loss_chunk_tokens = 0.
  nanochat and modded-nanogpt compile the softcap and cross-entropy into fused kernels, and llm-foundry's MPT
  configs use a fused cross-entropy (`loss_fn: fused_crossentropy`): none of them materialises fp32 logit-sized
  copies, so their memory is the runner's chunked loss's (planner.memory.DEFAULT_LOSS_CHUNK_TOKENS, the runner's
  own way not to), and their speed the unchunked loss's (a fused loss re-runs no head matmul).
- Optimizer: `muon+adamw` -> muon, anything else -> adamw. Precision: bf16 autocast over fp32 master weights (all
  these trainers keep fp32 master weights, FSDP's PURE mode included); FP8 rows set StepConfig.fp8.
- Gradients are reduced in the row's `grad_reduce_dtype` (llm-foundry: fp32 for DEFAULT mixed precision, bf16
  for PURE, from its precision_detail).
- `fsdp+tp` (one row): tensor parallelism is not modelled; the row is reported with its prediction as if each
  tensor-parallel group of t GPUs were one device of t× the compute, memory and bandwidth (`tp_merged`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from benchmarks.public_runs.schema import PublicRun
from planner.counts import flops_per_token
from planner.memory import DEFAULT_LOSS_CHUNK_TOKENS, estimate
from planner.memory_terms import StepConfig
from planner.profiles import Hardware, HardwareProfile, find_profile, parse_gpu_spec
from planner.spec import ModelSpec, llama, nanochat


@dataclass(frozen=True)
class RowInputs:
    """What the planner sees of one public run."""

    spec: ModelSpec
    hw: Hardware
    cfg: StepConfig                  # for the speed
    mem_cfg: StepConfig              # for the memory (the loss as the trainer holds it)
    notes: tuple[str, ...] = ()


def spec_of(r: PublicRun) -> ModelSpec:
    """The row's model as a ModelSpec (module docstring: the mapping per family)."""
    T, V = r.seq_len, r.vocab_size or 50257
    if r.arch.startswith("nanochat"):
        s = nanochat(r.n_layer, seq_len=T, vocab_size=V)
        if s.d_model != r.d_model or s.n_head != r.n_heads:
            raise ValueError(f"{r.id}: nanochat depth {r.n_layer} is not d_model {r.d_model} / {r.n_heads} heads")
        return s
    if r.arch.startswith("modded-nanogpt"):
        return ModelSpec(style="custom", n_layer=r.n_layer, d_model=r.d_model, n_head=r.n_heads,
                         n_kv_head=r.n_kv_heads or r.n_heads, d_ff=r.ffn_hidden or 4 * r.d_model, vocab_size=V,
                         seq_len=T, mlp="relu2", norm="rmsnorm_noweight", pos="rotary", tied=bool(r.tied_embeddings),
                         bias=False, qk_norm=True)
    if r.arch == "mpt":
        return ModelSpec(style="gpt2", n_layer=r.n_layer, d_model=r.d_model, n_head=r.n_heads,
                         n_kv_head=r.n_kv_heads or r.n_heads, d_ff=r.ffn_hidden or 4 * r.d_model, vocab_size=V,
                         seq_len=T, mlp="gelu", norm="layernorm", pos="learned", tied=bool(r.tied_embeddings),
                         bias=True)
    if r.arch == "llama":
        return llama(r.n_layer, r.d_model, r.n_heads, r.n_kv_heads or r.n_heads, d_ff=r.ffn_hidden, seq_len=T,
                     vocab_size=V, tied=bool(r.tied_embeddings))
    raise ValueError(f"{r.id}: unknown arch {r.arch!r}")


def tp_merged(prof: HardwareProfile, t: int) -> HardwareProfile:
    """A tensor-parallel group of t GPUs as one device: t× compute, memory and HBM bandwidth (an approximation)."""
    if t <= 1:
        return prof
    upd: dict = {"name": f"{prof.name}-tp{t}", "memory_gb": prof.memory_gb * t, "usable_bytes": prof.usable_bytes * t,
                 "hbm_tb_s": prof.hbm_tb_s * t, "bf16_tflops": prof.bf16_tflops * t, "tf32_tflops": prof.tf32_tflops * t,
                 "gpus_per_node": max(1, prof.gpus_per_node // t), "aliases": []}
    if prof.fp8_tflops:
        upd["fp8_tflops"] = prof.fp8_tflops * t
    speed = getattr(prof, "speed", None)
    if speed is not None:
        upd["speed"] = speed.scaled(t)
    return HardwareProfile.model_validate({**prof.model_dump(), **upd})


def gpu_variant(r: PublicRun, prof: HardwareProfile) -> HardwareProfile:
    """The row's GPU where it differs from the profile in a way the row states: torchtitan's Grand Teton H100s are
    96 GB HBM2e parts at 2.4 TB/s (gpu_detail); their usable memory is taken as the 80 GB part's × 96/80."""
    detail = r.gpu_detail or ""
    if r.gpu == "H100-SXM" and "96GB HBM2e (2.4 TB/s)" in detail:
        return HardwareProfile.model_validate({**prof.model_dump(), "name": "H100-SXM-96GB", "aliases": [],
                                               "memory_gb": 96.0, "hbm_tb_s": 2.4,
                                               "usable_bytes": prof.usable_bytes * 96 // 80})
    return prof


def hardware_of(r: PublicRun) -> Hardware:
    prof = gpu_variant(r, find_profile(r.gpu))
    t = r.tp_degree
    if t > 1:
        prof = tp_merged(prof, t)
        return parse_gpu_spec(f"{r.nodes}x{r.gpus_per_node // t}x{prof.name}", profile=prof)
    spec = f"{r.nodes}x{r.gpus_per_node}x{prof.name}" if r.nodes > 1 else f"{r.gpus_per_node}x{prof.name}"
    return parse_gpu_spec(spec, profile=prof)


def reduce_dtype(r: PublicRun) -> str | None:
    """The dtype gradients are reduced in: the row's, else llm-foundry's mixed-precision mode (PURE: bf16)."""
    if r.grad_reduce_dtype:
        return r.grad_reduce_dtype
    detail = (r.precision_detail or "").upper()
    if "PURE" in detail:
        return "bf16"
    if "DEFAULT" in detail:
        return "fp32"
    return None


def grad_accum(r: PublicRun) -> int:
    if r.grad_accum_steps:
        return r.grad_accum_steps
    if r.global_batch_seqs:
        return max(1, r.global_batch_seqs // (r.micro_batch_per_gpu * r.dp_degree))
    return 1


def inputs(r: PublicRun, *, baseline: bool = False) -> RowInputs:
    """The planner's inputs for a row. baseline=True: only what the planner before issue 25 could express
    (full or no checkpointing, no FP8, no reduce dtype)."""
    spec = spec_of(r)
    hw = hardware_of(r)
    notes: list[str] = []
    strategy = {"fsdp+tp": "fsdp", "hsdp": "fsdp"}.get(r.strategy, r.strategy)
    if r.tp_degree > 1:
        notes.append(f"TP{r.tp_degree} as one device")
    ac = r.activation_checkpointing
    kw: dict = {}
    if baseline:
        full = ac == "full"
        if ac.startswith("selective"):
            notes.append("selective AC not expressible: none")
    else:
        full = ac != "none"
        kw = {"ac_policy": {"full": "full", "selective-op": "selective-op", "selective-layer": "full",
                            "none": "full"}[ac],
              "ac_every": 2 if ac == "selective-layer" else 1,
              "fp8": r.precision == "fp8", "reduce_dtype": reduce_dtype(r)}
    known = {f.name for f in fields(StepConfig)}
    kw = {k: v for k, v in kw.items() if k in known}
    cfg = StepConfig(spec=spec, device_batch_size=r.micro_batch_per_gpu, grad_accum_steps=grad_accum(r),
                     dp=r.dp_degree, precision="bf16-autocast",
                     optimizer="muon" if r.optimizer.startswith("muon") else "adamw",
                     strategy=strategy, activation_checkpointing=full,  # type: ignore[arg-type]
                     loss_chunk_tokens=0, compile=r.compile, **kw)
    # a fused cross-entropy recomputes nothing (speed: unchunked) and keeps no fp32 logits (memory: chunked)
    fused = not baseline and r.trainer != "torchtitan"
    mem_cfg = replace(cfg, loss_chunk_tokens=DEFAULT_LOSS_CHUNK_TOKENS) if fused else cfg
    return RowInputs(spec=spec, hw=hw, cfg=cfg, mem_cfg=mem_cfg, notes=tuple(notes))


# ------------------------------------------------------------------ what was measured

def measured_tokens_per_s(r: PublicRun) -> tuple[float | None, str]:
    """Tokens/s of the whole job and what it was derived from. The step time comes first where the source's own
    tokens/s counts one micro-batch per step (nanochat); MFU only where nothing else is given."""
    T = r.seq_len
    if r.measured_step_time_ms and r.global_batch_seqs:
        return r.global_batch_seqs * T / (r.measured_step_time_ms / 1e3), "step time"
    if r.measured_tokens_per_s_total:
        return r.measured_tokens_per_s_total, "tokens/s"
    if r.measured_tokens_per_s_per_gpu:
        return r.measured_tokens_per_s_per_gpu * r.total_gpus, "tokens/s per GPU"
    if r.measured_mfu_pct and r.mfu_basis_flops_per_token and r.mfu_basis_peak_tflops:
        return (r.measured_mfu_pct / 100 * r.total_gpus * r.mfu_basis_peak_tflops * 1e12
                / r.mfu_basis_flops_per_token), "MFU"
    return None, ""


def measured_memory_bytes(r: PublicRun) -> tuple[int | None, str | None]:
    if r.measured_memory is None:
        return None, None
    unit = {"MiB": 2**20, "GiB": 2**30, "GB": 1e9}[r.measured_memory_unit or "GiB"]
    return int(r.measured_memory * unit), r.measured_memory_kind


@dataclass(frozen=True)
class Prediction:
    row: PublicRun
    inputs: RowInputs
    tokens_per_s: float             # predicted, whole job
    measured: float | None          # measured tokens/s, whole job
    allocated: int                  # predicted allocated peak per GPU (bytes)
    verdict: str                    # "fits" | "tight" | "does not fit"
    verdict_detail: str
    mfu: float                      # predicted model-FLOPs MFU (bf16 peak)

    @property
    def error(self) -> float | None:
        if self.measured is None:
            return None
        return self.tokens_per_s / self.measured - 1.0

    @property
    def verdict_ok(self) -> bool:
        """No wrong verdict: a run that ran is not refused; one that ran out of memory is not called a fit."""
        if self.row.outcome == "ran":
            return self.verdict != "does not fit"
        return self.verdict != "fits"


def predicted_tokens_per_s(r: PublicRun, k: object | None = None) -> float:
    """The planner's tokens/s for a row (whole job), with speed constants `k` (planner.speed_constants)."""
    from planner.throughput import estimate_throughput
    inp = inputs(r)
    return estimate_throughput(inp.cfg, inp.hw, k=k).tokens_per_sec if k is not None else \
        estimate_throughput(inp.cfg, inp.hw).tokens_per_sec


def predict(r: PublicRun, *, baseline: bool = False) -> Prediction:
    """The planner's tokens/s and fit verdict for a row (baseline: the model before issue 25)."""
    inp = inputs(r, baseline=baseline)
    cfg, hw = inp.cfg, inp.hw
    from planner.throughput import estimate_throughput
    tp = estimate_throughput(cfg, hw)
    mem = estimate(inp.mem_cfg)
    if baseline:
        from planner.build import fits, memory_of
        full = memory_of(inp.mem_cfg, hw)
        ok = fits(full, hw, 0.05)
        verdict, detail = ("fits" if ok else "does not fit"), "allocated + context + NCCL + 5% vs 95% of usable"
    else:
        from planner.fit_verdict import verdict_for
        v = verdict_for(mem.allocated_peak, hw)
        verdict, detail = v.verdict, v.reason
    measured, _ = measured_tokens_per_s(r)
    peak = hw.profile.bf16_tflops * 1e12
    mfu = tp.tokens_per_sec * flops_per_token(inp.spec) / (hw.num_gpus * peak)
    return Prediction(row=r, inputs=inp, tokens_per_s=tp.tokens_per_sec, measured=measured,
                      allocated=mem.allocated_peak, verdict=verdict, verdict_detail=detail, mfu=mfu)

