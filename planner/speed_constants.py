"""The step-time model's free constants, each with its unit and where it comes from.

planner/compute_model.py and planner/throughput.py read `DEFAULT`. All but link_efficiency were fitted by
benchmarks/fit_speed.py on the 29 calibration rows of benchmarks/public_runs/runs.yaml that have a measured speed
(the tensor-parallel row left out): least squares on log(predicted / measured tokens/s), coordinate descent from a
fixed start (a grid, then a golden-section refinement per constant), stopped when a round gains less than 1%.
The held-out rows judge the result (benchmarks/results/public_runs.md). No constant was fitted to one row: each
moves many calibration rows (FIT_NOTES). Source of each fitted value: FIT_SOURCE.

Re-fit with `python benchmarks/fit_speed.py` and copy its printed values here.
"""

from __future__ import annotations

from dataclasses import dataclass

FIT_DATE = "2026-11-25"
FIT_SOURCE = f"fitted on benchmarks/public_runs calibration set, {FIT_DATE} (benchmarks/fit_speed.py)"


@dataclass(frozen=True)
class SpeedConstants:
    """Free constants of the step-time model (units in the comments; FIT_SOURCE unless said otherwise)."""

    # fraction (1) of the GPU's achievable dense matmul rate (profile speed.matmul_tflops, the MAMF of the best
    # shape, a short benchmark) that a training step's GEMMs reach on average: shapes, tails and clocks under
    # sustained load. Hopper and newer (Ada and Blackwell take this value: they have no calibration rows of
    # their own, and B200's one calibration row is not enough to fit on)...
    matmul_efficiency: float = 0.7528
    # ...and Ampere, fitted apart: the same trainer and model (llm-foundry MPT-70B on 64 GPUs) reach 78% of the
    # MAMF in model FLOPs on A100 and 68% on H100 (sustained power draw holds the H100's clock further below
    # the boost clock the MAMF benchmark runs at)
    matmul_efficiency_ampere: float = 0.897
    # fraction (1) of the GPU's published flash-attention rate (profile speed.attention_tflops) that training
    # shapes reach on their causal FLOPs (7·T·q per token and layer)
    attention_efficiency: float = 0.4546
    # HBM bytes moved by a block's element-wise and norm kernels (forward + backward) per byte it saves for
    # backward: eager, memory_eager.layer_activation_bytes; compiled, memory_compiled.block_per_token (fused
    # kernels write and read back fewer intermediates): bytes / byte
    elementwise: float = 5.3383
    # fraction (1) of a collective's time hidden by the compute it runs beside (DDP buckets during the last
    # micro-step's backward; FSDP prefetch during every micro-step); the rest shows in the step time
    overlap: float = 0.5814
    # achieved / nominal link bandwidth of NCCL ring collectives (1). An assumption, not fitted (FIT_NOTES)
    link_efficiency: float = 0.8


DEFAULT = SpeedConstants()

# Per constant: which calibration rows move by more than 0.5% when it changes by 10% (benchmarks/fit_speed.py).
FIT_NOTES: dict[str, str] = {
    "matmul_efficiency": "the 15 H100/H200 calibration rows",
    "matmul_efficiency_ampere": "the 14 A100 calibration rows",
    "attention_efficiency": "28 of the 29 calibration rows (attention is 5-40% of their compute)",
    "elementwise": "25 of the 29 calibration rows, most the small models and the H100 ones",
    "overlap": "the 10 multi-GPU calibration rows whose communication is long enough to show",
    "link_efficiency": "not fitted: on these rows it trades one for one with the overlap; an assumption",
}
