"""A public run (runs.yaml row) as the planner's inputs, and the planner's prediction for it.

`inputs(row)` maps a row onto what nanoplan plans: a ModelSpec of the row's architecture family, the hardware
(profile × GPUs per node × nodes), and a StepConfig (micro-batch, accumulation, data-parallel degree, strategy,
checkpointing, compile, precision, optimizer). `predict(row)` runs the planner on it: tokens/s from
planner.throughput, and the fit verdict from planner.fit_verdict on the allocated peak of planner.memory.

Mapping (README.md in this folder has the sources of each row):
- nanochat rows are planned as `--trainer nanochat` plans (issue 29), through planner/build.py's own calls: the
  request from the trainer's `request_fields` (plus the row's batch and --fp8), its StepConfig from
  `build.step_config`, its memory from `build.memory_of`, its step variant (sliding windows, the FP8 head) and
  attention software from `planner.trainers.step_speed_inputs` (`nanochat-2025-10` -> version 2025-10;
  `nanochat-2026-01`, `-2026-03` and `-2026-07` -> 2026-07, the nearest modelled version). One fact of the earlier
  2026 commits differs from 2026-07 and is put back: their short windows (`SHORT_WINDOW`).
- arch `modded-nanogpt-2024-10` -> the nanochat block (rotary, ReLU², QK-norm, weightless RMSNorm, no bias) with the
  row's heads, width, vocabulary and tied head; `modded-nanogpt-2024-10-gelu` -> the same with a GELU MLP and no
  QK-norm; `mpt` and `gpt2` (llm.c) -> GPT-2 style (LayerNorm with bias, GELU, learned positions, biases, tied): the
  count matches llm-foundry's printed NumParams exactly; `llama` -> planner.spec.llama with the row's FFN width and
  vocabulary.
- Software (issue 29): the row's `attention_kernel` (planner/kernels.py prices it against FlashAttention-2), its
  element-wise work as compiled where it ran torch.compile or hand-fused kernels (`fused_elementwise`: llm.c,
  TinyLlama), its loss as fused or eager where that differs from the step (`fused_loss`: llm-foundry's fused
  cross-entropy kernel, torchtitan's eager loss beside compiled blocks until 2025-04-02) and llm-foundry's bf16
  LayerNorm (`low_precision_norms`); the memory keeps the row's own `compile`.
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
- Tensor parallelism (`fsdp+tp`, torchtitan's 2-D rows) is planned as the planner plans `--tp t` (planner/parallelism.py,
  memory_parallel.py, throughput.py): strategy fsdp over the dp = GPUs / t data-parallel ranks, each GPU 1/t of
  every block, on the row's own GPUs; sequence parallel, as torchtitan applies it to every block (parallelize_llama.py
  `apply_tp`: "Apply tensor + sequence parallelism to every transformer block", SequenceParallel() on attention_norm
  and ffn_norm). `hsdp` rows would plan as `--strategy hsdp` with the shard group of one node's GPUs / t
  (planner.parallelism.hsdp_shard); none is recorded yet.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from functools import cache

from benchmarks.public_runs.schema import PublicRun
from planner.compute_model import StepVariant
from planner.kernels import StepSoftware, runner_software, window_span
from planner.memory import DEFAULT_LOSS_CHUNK_TOKENS, estimate
from planner.memory_terms import MemoryEstimate, StepConfig
from planner.parallelism import hsdp_shard
from planner.plan import PlanRequest, TrainerRef
from planner.profiles import Hardware, HardwareProfile, find_profile, parse_gpu_spec
from planner.spec import ModelSpec, llama
from planner.trainers import step_speed_inputs, trainer_for
from planner.trainers.nanochat import model_spec as nanochat_spec
from planner.trainers.nanochat import window_sizes


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
    variant: StepVariant | None = None     # where that trainer's step computes differently (planner/compute_model.py)
    request: PlanRequest | None = None     # the --trainer plan's request (nanochat rows)


NANOCHAT_VERSION = {"nanochat-2025-10": "2025-10", "nanochat-2026-01": "2026-07", "nanochat-2026-03": "2026-07",
                    "nanochat-2026-07": "2026-07"}   # arch -> trainer version
# the short sliding window of nanochat's 2026 commits, tokens of a T-token context (gpt.py `_compute_window_sizes`):
# half the context at 348fbb3, a67eba3, 2c062aa and 324e69c (short_window = long_window // 2); a third rounded up to
# the FA3 tile at 6ed7d1d (-(-long_window // 3 // 128) * 128, "2048 -> 768"); a quarter from a825e63 on, as 2026-07
SHORT_WINDOW = {"nanochat-2026-01": lambda T: T // 2, "nanochat-2026-03": lambda T: -(-T // 3 // 128) * 128}
# trainers whose tensor parallelism is sequence-parallel: torchtitan applies SequenceParallel() to every block's norms
# (`apply_tp`: torchtitan/parallelisms/parallelize_llama.py at 9dec370, torchtitan/models/llama3/ at 820504e)
SEQUENCE_PARALLEL = ("torchtitan",)


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
    """The row's GPUs, all of them (a tensor-parallel group's GPUs too: the plan's --tp divides the work over them)."""
    prof = gpu_variant(r, find_profile(r.gpu))
    spec = f"{r.nodes}x{r.gpus_per_node}x{prof.name}" if r.nodes > 1 else f"{r.gpus_per_node}x{prof.name}"
    return parse_gpu_spec(spec, profile=prof)


def leaderboard_windows(spec: ModelSpec, arch: str) -> list[int]:
    """The attention windows of a nanochat 2026 commit before a825e63 (gpt.py `_compute_window_sizes`: the default
    pattern SSSL tiled over the layers, S = the arch's SHORT_WINDOW, L = sequence_len, the last layer L): 2026-07's
    rule with the commit's short window."""
    return window_sizes(spec, "SSSL", short=SHORT_WINDOW[arch](spec.seq_len))


def software_of(r: PublicRun, prof: HardwareProfile) -> StepSoftware:
    """The kernels a row that is not planned as a trainer's plan ran (planner/kernels.py StepSoftware): its
    `attention_kernel` (else the runner's), its loss kernels (`fused_loss`; hand-fused kernels count as fused) and its
    norms' precision (`low_precision_norms`)."""
    base = StepSoftware(attention=r.attention_kernel) if r.attention_kernel else runner_software(prof)
    fused = True if r.fused_elementwise else r.fused_loss
    return replace(base, fused_loss=fused, low_precision_norms=r.low_precision_norms)


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


@cache
def inputs(r: PublicRun, *, baseline: bool = False) -> RowInputs:
    """The planner's inputs for a row. baseline=True: only what the planner before issue 25 could express
    (full or no checkpointing, no FP8, no reduce dtype). Cached: a row's inputs do not depend on the speed constants
    (benchmarks/fit_speed.py predicts every row thousands of times)."""
    spec = spec_of(r)
    hw = hardware_of(r)
    ref = trainer_of(r)
    if ref is not None and not baseline:
        return nanochat_inputs(r, spec, hw, ref)
    notes: list[str] = []
    strategy = {"fsdp+tp": "fsdp"}.get(r.strategy, r.strategy)
    if r.tp_degree > 1:
        if r.trainer not in SEQUENCE_PARALLEL:
            raise ValueError(f"{r.id}: whether {r.trainer} runs tensor parallelism with sequence parallelism is not "
                             "recorded (SEQUENCE_PARALLEL)")
        notes.append(f"--tp {r.tp_degree}" + (" (async TP planned as TP)" if r.async_tp else ""))
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
                     loss_chunk_tokens=0, compile=r.compile, tp=r.tp_degree, sequence_parallel=True,
                     hsdp_shard=hsdp_shard(strategy, r.gpus_per_node, r.tp_degree), **kw)
    if baseline:
        return RowInputs(spec=spec, hw=hw, cfg=cfg, mem_cfg=cfg, notes=tuple(notes))
    # a fused cross-entropy recomputes nothing (speed: unchunked) and keeps no fp32 logits (memory: chunked)
    fused = r.trainer != "torchtitan"
    mem_cfg = replace(cfg, loss_chunk_tokens=DEFAULT_LOSS_CHUNK_TOKENS) if fused else cfg
    speed = replace(cfg, compile=r.compile or r.fused_elementwise)
    return RowInputs(spec=spec, hw=hw, cfg=speed, mem_cfg=mem_cfg, notes=tuple(notes),
                     software=software_of(r, hw.profile))


def nanochat_request(r: PublicRun, spec: ModelSpec, hw: Hardware, ref: TrainerRef) -> PlanRequest:
    """The `nanoplan estimate --trainer nanochat` request of a row: the trainer's own request fields (muon, zero1 on
    several GPUs, compiled, unchunked loss, the window pattern for the GPU), the row's depth, batch and --fp8."""
    tr = trainer_for(ref)
    assert tr is not None
    fields_ = tr.request_fields({}, hw.num_gpus, ref.version, hw.profile)
    gpu = f"{hw.nodes}x{hw.gpus_per_node}x{hw.profile.name}" if hw.nodes > 1 else f"{hw.gpus_per_node}x{hw.profile.name}"
    return PlanRequest(**fields_, gpu=gpu, profile=hw.profile, model=spec, device_batch_size=r.micro_batch_per_gpu,
                       total_batch_tokens=r.micro_batch_per_gpu * r.dp_degree * grad_accum(r) * spec.seq_len,
                       fp8=r.precision == "fp8", steps=1)


def nanochat_inputs(r: PublicRun, spec: ModelSpec, hw: Hardware, ref: TrainerRef) -> RowInputs:
    """A nanochat row as planner/build.py plans it (module docstring): one StepConfig for the memory and the speed,
    the trainer's step variant and software; the Jan-Feb 2026 rows with their half-context windows."""
    from planner.build import step_config  # noqa: PLC0415

    req = nanochat_request(r, spec, hw, ref)
    cfg = step_config(req, r.micro_batch_per_gpu, hw.num_gpus)
    variant, software = step_speed_inputs(req, hw.profile)
    if r.arch in SHORT_WINDOW and software is not None and software.attention_span != 1.0:
        windows = leaderboard_windows(spec, r.arch)
        software = replace(software, attention_span=window_span(windows, spec.seq_len))
        if variant is not None:
            variant = replace(variant, attention_keys=tuple(windows))
    return RowInputs(spec=spec, hw=hw, cfg=cfg, mem_cfg=cfg, notes=(f"--trainer {ref.name} {ref.version}",),
                     software=software or runner_software(hw.profile), trainer=ref, variant=variant, request=req)


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
    kw = {"k": k} if k is not None else {}
    return estimate_throughput(inp.cfg, inp.hw, software=inp.software, variant=inp.variant, **kw).tokens_per_sec


def predict(r: PublicRun, *, baseline: bool = False) -> Prediction:
    """The planner's tokens/s and fit verdict for a row (baseline: the model before issue 25)."""
    inp = inputs(r, baseline=baseline)
    cfg, hw = inp.cfg, inp.hw
    from planner.throughput import estimate_throughput
    tp = estimate_throughput(cfg, hw, software=inp.software, variant=inp.variant)
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
    mfu = tp.tokens_per_sec * tp.flops_per_token / (hw.num_gpus * peak)
    return Prediction(row=r, inputs=inp, tokens_per_s=tp.tokens_per_sec, measured=measured,
                      allocated=mem.allocated_peak, verdict=verdict, verdict_detail=detail, mfu=mfu)

