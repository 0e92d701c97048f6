"""Why the search keeps bf16 autocast over fp32 master weights and never picks pure bf16 itself (issue 29, item 5).

Pure bf16 (`--precision bf16`: runner/train.py casts the model to bfloat16) is a different plan from bf16 autocast:
weights, gradients and AdamW's moments are bf16, 8 bytes per parameter of state instead of 16, with no autocast casts
and half the optimizer's memory traffic, so it holds less and runs faster (planner.memory, planner.throughput count
both). It also trains differently. torch.optim.AdamW and Muon then write each update into bf16 weights with
round-to-nearest and no fp32 master copy, so an update smaller than half a bf16 ulp of its weight (8 significant
bits) is lost. Zamirai et al. 2020, "Revisiting BFloat16 Training" (arXiv 2010.06192): "nearest rounding for model
weight updates often cancels small updates, which degrades the convergence and model accuracy"; they recover 32-bit
accuracy only with stochastic rounding or Kahan summation, which torch's optimizers do not do.

The search ranks runs by the loss Chinchilla's fit predicts (planner/scaling.py), fitted on runs with fp32 master
weights: it would credit pure bf16's memory and speed and not its rounding, ranking a worse-trained run above a better
one. So the search keeps the precision asked for (bf16 autocast by default on GPUs), and says what pure bf16 would
change (`pure_bf16_sentence`, in `estimate --explain`); asked for explicitly, a pure-bf16 plan carries a warning
(`PURE_BF16_WARNING`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from planner.memory import allocated_peak
from planner.memory_terms import StepConfig
from planner.throughput import StepModel
from planner.units import fmt_bytes

CITE = "Zamirai et al. 2020, arXiv 2010.06192"
PURE_BF16_WARNING = (f"pure bf16: weights and AdamW moments in bf16 with no fp32 master copy, so updates below half a "
                     f"bf16 ulp of a weight round away ({CITE}); the loss the search ranks by cannot price that, "
                     "so it never picks pure bf16 itself")


def pure_bf16_sentence(result: Any) -> str | None:
    """For a search result (planner.candidates.SearchResult) under bf16 autocast: what pure bf16 would hold and how
    fast the winner's setting would run, and why it was not searched. None for other precisions or no winner."""
    best, s, hw = result.best, result.settings, result.hw
    if best is None or s.precision != "bf16-autocast":
        return None
    g = hw.num_gpus
    cfg = StepConfig(spec=best.spec, device_batch_size=best.device_batch, grad_accum_steps=best.grad_accum, dp=g,
                     precision="bf16", optimizer=s.optimizer, strategy=best.strategy,  # type: ignore[arg-type]
                     activation_checkpointing=best.activation_checkpointing, loss_chunk_tokens=s.loss_chunk_tokens,
                     compile=result.compiled)
    auto = allocated_peak(replace(cfg, precision="bf16-autocast"))
    saved = auto - allocated_peak(cfg)
    sm = StepModel(best.spec, hw, precision="bf16", optimizer=s.optimizer, strategy=best.strategy,
                   compiled=result.compiled, loss_chunk_tokens=s.loss_chunk_tokens, tokens_per_step=s.total_batch_tokens,
                   mfu=s.mfu)
    faster = best.step_seconds / sm.seconds(best.device_batch, best.grad_accum, best.activation_checkpointing) - 1
    return (f"Precision: bf16 autocast over fp32 master weights. Pure bf16 (--precision bf16) was not searched: for "
            f"{best.name} at {best.settings_label}, micro-batch {best.device_batch}, it would allocate "
            f"{fmt_bytes(saved)} less per GPU and run {faster:+.1%} tokens/s, but AdamW would round every update "
            f"into bf16 weights with no fp32 master copy, which cancels small updates ({CITE}): a cost the predicted "
            "loss cannot price. Ask for it with --precision bf16.")
