"""Which attention kernel a training step runs, and how fast it is relative to FlashAttention-2 (docs/throughput.md).

The step-time model (planner/compute_model.py) prices causal attention at the GPU's published FlashAttention-2 rate
(profile `speed.attention_tflops`) × a fitted efficiency. Trainers and torch versions run other kernels, and the
public runs show it (the same modded-nanogpt code is 8% faster per step under torch 2.5.0, whose SDPA took cuDNN's
attention on H100). A kernel's speed relative to FlashAttention-2 is cited, never fitted:

| kernel | relative to FA2 | source |
|---|---|---|
| `fa2` | 1 | the reference: torch's SDPA flash backend since torch 2.2 |
| `fa1` | 0.5 | FA2 paper (Dao 2023, arXiv:2307.08691) §4.1: FA2 "is around 2× faster than FlashAttention"; the torch 2.2 release: SDPA's FlashAttention-2 gives "around 2x speedups compared to previous versions" |
| `triton-fa1` | fitted, 0.4–0.77 | FA2 paper §1: FA2 is "1.3-2.5× faster than FlashAttention in Triton" (§4.1: "1.3-1.5× ... in the forward pass and around 2× ... in the backward pass", which gives 0.546 with the backward 5/7 of the FLOPs); measured on A100 only, so the value is fitted inside that range (`SpeedConstants.triton_attention`) on the llm-foundry rows, the only ones that run it |
| `cudnn` (Hopper, Blackwell) | 1.60 | FA3 paper (Shah et al. 2024, arXiv:2407.08608) Fig. 5 (forward, causal, head dim 128) and Fig. 6 (backward, head dim 128) on H100 SXM5 at sequence 2k: FA2 298 / 291, cuDNN 484 / 465 TFLOP/s; forward + backward in the 2:5 FLOP ratio |
| `fa3` (Hopper) | 1.73 | the same figures: FlashAttention-3 521 / 501 TFLOP/s |

A kernel's rate also grows with the sequence length (more work per tile, fewer partial tiles): FlashAttention-2 on
H100 (the same figures, causal forward and backward, head dim 128) runs at 0.63 of its 16k rate at 512 tokens, 0.80
at 1k, 0.90 at 2k, 0.96 at 4k, 0.99 at 8k (`seq_len_factor`; the profile's `attention_tflops` is the long-sequence
rate). The same curve is used for every kernel and GPU (an assumption: the figures show the other kernels rising
alike).

Elsewhere (Ampere, Ada) `cudnn` and `fa3` count as `fa2`: no public measurement says otherwise, and neither is
what those GPUs run by default.

What nanoplan's runner runs (`runner_software`): torch 2.13's `scaled_dot_product_attention`. Its backend order
(aten/src/ATen/native/transformers/cuda/sdp_utils.cpp, `check_prefer_cudnn_attention`, pytorch/pytorch@001f694a)
puts cuDNN first on sm90/sm100 when the bundled cuDNN is newer than 9.15, else the flash backend (FA2). The CUDA
wheel of torch 2.13 is taken to bundle such a cuDNN (**assumption**: `nanoplan probe` measures the real step).
A trainer with other kernels says so through `Trainer.step_software` (planner/trainers/).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from planner.profiles import HardwareProfile

AttentionKernel = Literal["fa1", "fa2", "fa3", "cudnn", "triton-fa1"]
ATTENTION_KERNELS: tuple[str, ...] = ("fa1", "fa2", "fa3", "cudnn", "triton-fa1")

TRITON_FA1 = 1.0 / (2.0 / 7.0 * 1.4 + 5.0 / 7.0 * 2.0)          # 0.546
# FA3 paper, H100 SXM5, causal, head dim 128, sequence 2k: (forward, backward) TFLOP/s
_FA3_FIG = {"fa2": (298.0, 291.0), "cudnn": (484.0, 465.0), "fa3": (521.0, 501.0)}


def _fwd_bwd(fwd: float, bwd: float) -> float:
    """The forward + backward rate of a kernel whose backward is 5/7 of the FLOPs (7·T·q per token and layer)."""
    return 1.0 / (2.0 / 7.0 / fwd + 5.0 / 7.0 / bwd)


HOPPER_SPEEDUP = {k: _fwd_bwd(*v) / _fwd_bwd(*_FA3_FIG["fa2"]) for k, v in _FA3_FIG.items()}   # cudnn 1.60, fa3 1.73

# FA3 paper Fig. 5 (forward, causal) and Fig. 6 (backward), head dim 128, FlashAttention-2 on H100 SXM5, TFLOP/s
_FA2_BY_SEQ = {512: (191.0, 214.0), 1024: (260.0, 260.0), 2048: (298.0, 291.0), 4096: (319.0, 310.0),
               8192: (333.0, 318.0), 16384: (335.0, 322.0)}
SEQ_CURVE = {T: _fwd_bwd(*fb) / _fwd_bwd(*_FA2_BY_SEQ[16384]) for T, fb in _FA2_BY_SEQ.items()}


def seq_len_factor(seq_len: int) -> float:
    """The attention kernel's rate at this sequence length relative to its long-sequence rate (module docstring):
    linear in log2(T) between the measured lengths, the end values beyond them."""
    import math  # noqa: PLC0415

    pts = sorted(SEQ_CURVE.items())
    if seq_len <= pts[0][0]:
        return pts[0][1]
    if seq_len >= pts[-1][0]:
        return pts[-1][1]
    x = math.log2(seq_len)
    for (t0, f0), (t1, f1) in zip(pts, pts[1:], strict=False):
        if t0 <= seq_len <= t1:
            u = (x - math.log2(t0)) / (math.log2(t1) - math.log2(t0))
            return f0 + u * (f1 - f0)
    return pts[-1][1]


def kernel_speedup(kernel: str, architecture: str, triton: float = TRITON_FA1) -> float:
    """The kernel's forward + backward attention rate relative to FlashAttention-2 on this GPU generation
    (`triton`: the Triton kernel's, fitted inside its cited range)."""
    if kernel == "fa1":
        return 0.5
    if kernel == "triton-fa1":
        return triton
    if kernel == "cudnn" and architecture in ("hopper", "blackwell"):
        return HOPPER_SPEEDUP["cudnn"]
    if kernel == "fa3" and architecture == "hopper":
        return HOPPER_SPEEDUP["fa3"]
    return 1.0


@dataclass(frozen=True, slots=True)
class StepSoftware:
    """What the trainer's software runs where kernels differ between trainers: the attention kernel, the keys each
    token attends to relative to full causal attention (1; sliding windows less, `window_span`), the loss's kernels
    and the norms' precision (planner/compute_model.py prices the last two as element-wise traffic).

    - `fused_loss`: the loss's logit-wide passes run as one fused forward and one fused backward kernel (a compiled
      loss, or a hand-written fused cross-entropy such as flash-attn's xentropy, llm-foundry's default
      `loss_fn: fused_crossentropy`); False: eager PyTorch ops over fp32 logits (torchtitan before 2025-04-02
      compiled its blocks but not the loss: train.py at 9dec370, "TODO: compiling loss function causes CUDA errors,
      turning off for now"); None: as the step is compiled or not.
    - `low_precision_norms`: the norms run in the autocast dtype, so autocast makes no fp32 copy of their input
      (llm-foundry's `norm_type: low_precision_layernorm`, LPLayerNorm: layer_norm on bf16 inputs with autocast off).
    """

    attention: str = "fa2"
    attention_span: float = 1.0
    fused_loss: bool | None = None
    low_precision_norms: bool = False


def runner_software(prof: HardwareProfile) -> StepSoftware:
    """nanoplan's runner under torch 2.13 (module docstring): cuDNN attention on Hopper and Blackwell, FA2 elsewhere."""
    arch = prof.speed.architecture if prof.speed is not None else ""
    return StepSoftware(attention="cudnn" if arch in ("hopper", "blackwell") else "fa2")


def window_span(windows: list[int], seq_len: int) -> float:
    """Mean attended keys per token of layers with these attention windows, relative to full causal attention:
    a window w of a T-token sequence attends to min(t, w) keys at position t, on average w - w²/(2T); full causal
    attention T/2."""
    if not windows:
        return 1.0
    T = float(seq_len)
    per = [(min(w, T) - min(w, T) ** 2 / (2.0 * T)) / (T / 2.0) for w in windows]
    return sum(per) / len(per)
