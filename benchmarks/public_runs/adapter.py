"""A public run (runs.yaml row) as the planner's inputs, and the planner's prediction for it.

`inputs(row)` maps a row onto what nanoplan plans: a ModelSpec of the row's architecture family, the hardware
(profile × GPUs per node × nodes), and a StepConfig (micro-batch, accumulation, data-parallel degree, strategy,
checkpointing, compile, precision, optimizer). `predict(row)` runs the planner on it: tokens/s from
planner.throughput, and the fit verdict from planner.fit_verdict on the allocated peak of planner.memory.

Mapping (README.md in this folder has the sources of each row):
- nanochat rows are planned as `--trainer nanochat` plans (issue 29): the model, the request fields, the memory and
  the attention kernel come from planner/trainers/nanochat (`nanochat-2025-10` -> version 2025-10,
  `nanochat-2026-01` -> 2026-07, the nearest modelled version, with the half-context windows those runs had).
- arch `modded-nanogpt-2024-10` -> the nanochat block (rotary, ReLU², QK-norm, weightless RMSNorm, no bias) with the
  row's heads, width, vocabulary and tied head; `modded-nanogpt-2024-10-gelu` -> the same with a GELU MLP and no
  QK-norm; `mpt` and `gpt2` (llm.c) -> GPT-2 style (LayerNorm with bias, GELU, learned positions, biases, tied): the
  count matches llm-foundry's printed NumParams exactly; `llama` -> planner.spec.llama with the row's FFN width and
  vocabulary.
- Software (issue 29): the row's `attention_kernel` (planner/kernels.py prices it against FlashAttention-2), and its
  element-wise work as compiled where it ran torch.compile or hand-fused kernels (`fused_elementwise`: llm.c,
  TinyLlama); the memory keeps the row's own `compile`.
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
from planner.kernels import StepSoftware, runner_software, window_span
from planner.memory import DEFAULT_LOSS_CHUNK_TOKENS, estimate
from planner.memory_terms import MemoryEstimate, StepConfig
from planner.plan import TrainerRef
from planner.profiles import Hardware, HardwareProfile, find_profile, parse_gpu_spec
from planner.spec import ModelSpec, llama
from planner.trainers import trainer_for
from planner.trainers.nanochat import model_spec as nanochat_spec


@dataclass(frozen=True)
class RowInputs:
    """What the planner sees of one public run."""

    spec: ModelSpec
    hw: Hardware
    cfg: StepConfig                  # for the speed
    mem_cfg: StepConfig              # for the memory (the loss as the trainer holds it)
    notes: tuple[str, ...] = ()
    software: StepSoftware | None = None   # the attention kernel and span (planner/kernels.py)
    trainer: TrainerRef | None = None      # the planner's trainer module the row is planned as (nanochat)


NANOCHAT_VERSION = {"nanochat-2025-10": "2025-10", "nanochat-2026-01": "2026-07"}   # arch -> trainer version


def trainer_of(r: PublicRun) -> TrainerRef | None:
    """The planner trainer a row is planned as: nanochat's rows as `--trainer nanochat` plans, the rest as steps."""
    if r.arch in NANOCHAT_VERSION:
        return TrainerRef(name="nanochat", version=NANOCHAT_VERSION[r.arch])
    return None


def spec_of(r: PublicRun) -> ModelSpec:
    """The row's model as a ModelSpec (module docstring: the mapping per family)."""
    T, V = r.seq_len, r.vocab_size or 50257
    ref = trainer_of(r)
    if ref is not None:
        s = nanochat_spec(ref.version or "", r.n_layer, seq_len=T, vocab_size=V)
        if s.d_model != r.d_model or s.n_head != r.n_heads:
            raise ValueError(f"{r.id}: nanochat depth {r.n_layer} is not d_model {r.d_model} / {r.n_heads} heads")
        return s
    if r.arch.startswith("modded-nanogpt"):
        gelu = r.arch.endswith("-gelu")
        return ModelSpec(style="custom", n_layer=r.n_layer, d_model=r.d_model, n_head=r.n_heads,
                         n_kv_head=r.n_kv_heads or r.n_heads, d_ff=r.ffn_hidden or 4 * r.d_model, vocab_size=V,
                         seq_len=T, mlp="gelu" if gelu else "relu2", norm="rmsnorm_noweight", pos="rotary",
                         tied=bool(r.tied_embeddings), bias=False, qk_norm=not gelu)
    if r.arch in ("mpt", "gpt2"):
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


# torchtitan's Grand Teton H100s (benchmarks/llama3_h100_202412_torchtitan.md): "HBM2e-based SXM H100 with lower TDP,
# the actual peak TFLOPs number is between SXM and NVL, and we don't know its exact value", at "the default 500W power
# limit". Their compute is taken at the middle of that range: (NVL 835 + SXM 989) / 2 / 989 of the SXM part's
# (an assumption inside the cited bounds; NVIDIA H100 datasheet dense bf16 figures).
GRAND_TETON_COMPUTE = (835.0 + 989.0) / 2.0 / 989.0


def gpu_variant(r: PublicRun, prof: HardwareProfile) -> HardwareProfile:
    """The row's GPU where it differs from the profile in a way the row states: torchtitan's Grand Teton H100s are
    96 GB HBM2e parts at 2.4 TB/s and 500 W (gpu_detail); their usable memory is taken as the 80 GB part's × 96/80,
    their matmul and attention rates as GRAND_TETON_COMPUTE of the SXM part's."""
    detail = r.gpu_detail or ""
    if r.gpu == "H100-SXM" and "96GB HBM2e (2.4 TB/s)" in detail:
        speed = prof.speed.model_copy(update={  # type: ignore[union-attr]
            "matmul_tflops": prof.speed.matmul_tflops * GRAND_TETON_COMPUTE,  # type: ignore[union-attr]
            "fp8_matmul_tflops": (prof.speed.fp8_matmul_tflops or 0) * GRAND_TETON_COMPUTE or None,  # type: ignore[union-attr]
            "attention_tflops": prof.speed.attention_tflops * GRAND_TETON_COMPUTE})  # type: ignore[union-attr]
        return HardwareProfile.model_validate({**prof.model_dump(), "name": "H100-SXM-96GB", "aliases": [],
                                               "memory_gb": 96.0, "hbm_tb_s": 2.4, "speed": speed.model_dump(),
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


def software_of(r: PublicRun, spec: ModelSpec, prof: HardwareProfile) -> StepSoftware:
    """The attention kernel (and span) a row ran: a nanochat row's from planner/trainers/nanochat, with the
    half-context windows (T/2) of its Jan-Feb 2026 runs (gpt.py at 348fbb3: short_window = long_window // 2; the
    2026-07 version uses a quarter); every other row's from its `attention_kernel`."""
    ref = trainer_of(r)
    tr = trainer_for(ref)
    if ref is not None and tr is not None:
        sw = tr.step_software(spec, ref, prof) or runner_software(prof)
        if r.arch == "nanochat-2026-01" and sw.attention_span != 1.0:
            T = spec.seq_len
            windows = [T if "SSSL"[i % 4] == "L" or i == spec.n_layer - 1 else T // 2 for i in range(spec.n_layer)]
            sw = replace(sw, attention_span=window_span(windows, T))
        return sw
    return StepSoftware(attention=r.attention_kernel) if r.attention_kernel else runner_software(prof)


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
    ref = trainer_of(r)
    notes: list[str] = [f"--trainer {ref.name} {ref.version}"] if ref is not None and not baseline else []
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
    if baseline:
        return RowInputs(spec=spec, hw=hw, cfg=cfg, mem_cfg=cfg, notes=tuple(notes))
    if ref is not None:   # nanochat: its full-logit loss and its own memory model (planner/trainers/nanochat)
        speed = replace(cfg, compile=True)
        return RowInputs(spec=spec, hw=hw, cfg=speed, mem_cfg=cfg, notes=tuple(notes),
                         software=software_of(r, spec, hw.profile), trainer=ref)
    # a fused cross-entropy recomputes nothing (speed: unchunked) and keeps no fp32 logits (memory: chunked)
    fused = r.trainer != "torchtitan"
    mem_cfg = replace(cfg, loss_chunk_tokens=DEFAULT_LOSS_CHUNK_TOKENS) if fused else cfg
    speed = replace(cfg, compile=r.compile or r.fused_elementwise)
    return RowInputs(spec=spec, hw=hw, cfg=speed, mem_cfg=mem_cfg, notes=tuple(notes),
                     software=software_of(r, spec, hw.profile))


def memory_of_row(inp: RowInputs) -> MemoryEstimate:
    """The row's allocated peak: the trainer's own memory model (nanochat) or the planner's (planner.build.memory_of:
    the same overheads)."""
    from planner.build import memory_of  # noqa: PLC0415
    if inp.trainer is not None:
        return memory_of(inp.mem_cfg, inp.hw, inp.trainer)
    return estimate(inp.mem_cfg)


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
    if k is not None:
        return estimate_throughput(inp.cfg, inp.hw, k=k, software=inp.software).tokens_per_sec  # type: ignore[arg-type]
    return estimate_throughput(inp.cfg, inp.hw, software=inp.software).tokens_per_sec


def predict(r: PublicRun, *, baseline: bool = False) -> Prediction:
    """The planner's tokens/s and fit verdict for a row (baseline: the model before issue 25)."""
    inp = inputs(r, baseline=baseline)
    cfg, hw = inp.cfg, inp.hw
    from planner.throughput import estimate_throughput
    tp = estimate_throughput(cfg, hw, software=inp.software)
    mem = memory_of_row(inp) if not baseline else estimate(inp.mem_cfg)
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

