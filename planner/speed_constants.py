"""The step-time model's free constants, each with its unit and where it comes from.

planner/compute_model.py and planner/throughput.py read `DEFAULT`. All but link_efficiency were fitted by
benchmarks/fit_speed.py on the 55 calibration rows of benchmarks/public_runs/runs.yaml that have a measured speed
(tensor-parallel rows planned with --tp, as the planner plans them): least absolute deviations of log(predicted /
measured tokens/s), coordinate descent from a fixed start (a grid, then a golden-section refinement per constant) until
a round moves no constant. The held-out rows judge the result (benchmarks/results/public_runs.md). No constant was fitted
to one row: each moves many calibration rows (FIT_NOTES). Source of each fitted value: FIT_SOURCE.

Re-fit with `python benchmarks/fit_speed.py` and copy its printed values here.
"""

from __future__ import annotations

from dataclasses import dataclass

FIT_DATE = "2026-11-28"   # re-fitted with nanochat's March 2026 leaderboard rows (issue 29, sixth pass)
FIT_SOURCE = f"fitted on benchmarks/public_runs calibration set, {FIT_DATE} (benchmarks/fit_speed.py)"


@dataclass(frozen=True)
class SpeedConstants:
    """Free constants of the step-time model (units in the comments; FIT_SOURCE unless said otherwise)."""

    # fraction (1) of the GPU's achievable dense matmul rate (profile speed.matmul_tflops, the MAMF of the best
    # shape, a short benchmark) that a training step's GEMMs reach on average: shapes, tails and clocks under
    # sustained load. Hopper and newer (Ada and Blackwell take this value: they have no calibration rows of
    # their own, and B200's one power-limited calibration row is not enough to fit on)...
    matmul_efficiency: float = 0.7776
    # ...and Ampere, fitted apart: the same trainer and model (llm-foundry MPT-70B on 64 GPUs) reach 78% of the
    # MAMF in model FLOPs on A100 and 68% on H100 (sustained power draw holds the H100's clock further below
    # the boost clock the MAMF benchmark runs at)
    matmul_efficiency_ampere: float = 0.9188
    # fraction (1) of the attention kernel's published rate (profile speed.attention_tflops, FlashAttention-2's,
    # × the kernel's and the sequence length's cited factors: planner/kernels.py) that training steps reach on their
    # causal FLOPs (7·T·q per token and layer)
    attention_efficiency: float = 0.7323
    # rate (1) of llm-foundry's Triton flash-attention kernel relative to FlashAttention-2 (planner/kernels.py): the
    # FA2 paper puts it at 1/2.5 to 1/1.3 (A100); fitted inside that range on the rows that run it
    triton_attention: float = 0.77
    # HBM bytes moved by a block's element-wise and norm kernels (forward + backward) per byte it saves for
    # backward: eager, memory_eager.layer_activation_bytes (with the norms' inputs at the autocast width where the
    # trainer runs low-precision norms: StepSoftware.low_precision_norms); compiled, memory_compiled.block_per_token
    # (fused kernels write and read back fewer intermediates): bytes / byte. The loss's logit-wide passes are
    # counted apart, eager or fused as the trainer runs them (StepSoftware.fused_loss)
    elementwise: float = 10.8492
    # the same for a torch.compile'd step (or hand-fused kernels: llm.c, TinyLlama): inductor fuses the element-wise
    # work around each saved tensor into fewer, larger kernels, so fewer bytes move per byte saved
    elementwise_compiled: float = 6.0324
    # fraction (1) of a collective's time hidden by the compute it runs beside (DDP buckets during the last
    # micro-step's backward; FSDP prefetch during every micro-step); the rest shows in the step time
    overlap: float = 0.6485
    # achieved / nominal link bandwidth of NCCL ring collectives (1). An assumption, not fitted (FIT_NOTES)
    link_efficiency: float = 0.8
    # time (1) of nanochat's matmuls (`--trainer nanochat`, every version) relative to the model's at
    # matmul_efficiency. Its bf16 rows ran 8-14% faster than the shared terms predicted (three code versions, A100 and
    # H100, d20 to d32), and pulled the shared terms away from every other trainer's (issue 29's fifth pass: without
    # this term elementwise_compiled fitted 4.6, with it 5.9); with a term of their own they fit to themselves (its
    # 10 rows, bf16 and FP8, 2025-10 to 2026-03, now land within -5.5%..+4.3%). Matmuls, not the whole step: nanochat's
    # own FP8 gain (dev/LOG.md: 630K to 740K tok/s at d26, 1.17x) is what this reproduces (its d26 bf16 and FP8 rows
    # land within 2% of each other), and a whole-step term over-credits it by 6%.
    # Not a kernel measured apart: a trainer term, as triton_attention is llm-foundry's
    nanochat_matmul: float = 0.7755


DEFAULT = SpeedConstants()

# Per constant: which calibration rows move by more than 0.5% when it changes by 10% (benchmarks/fit_speed.py).
FIT_NOTES: dict[str, str] = {
    "matmul_efficiency": "32 of the 55 calibration rows (the H100, H200 and B200 ones)",
    "matmul_efficiency_ampere": "23 of the 55 calibration rows (the A100 ones)",
    "attention_efficiency": "52 of the 55 calibration rows (attention is 5-70% of their compute)",
    "triton_attention": "the 21 llm-foundry calibration rows (the only ones that run llm-foundry's Triton kernel)",
    "elementwise": "31 of the 55 calibration rows (the eager ones)",
    "elementwise_compiled": "24 of the 55 calibration rows (torch.compile, and llm.c's fused kernels)",
    "overlap": "18 of the 55 calibration rows (those whose communication is long enough to show)",
    "link_efficiency": "not fitted: on these rows it trades one for one with the overlap; an assumption",
    "nanochat_matmul": "the 7 nanochat calibration rows (d20 on A100 and H100, 2025-10; d26 bf16 and two FP8, 2026-02; d24 FP8, 2026-03)",
}
