"""Traced truth: parameters, FLOPs and peak memory of the runner's real training step.

It imports torch (through runner.model): the planner never imports it; `nanoplan validate --trace`,
the tests and the benchmarks do, to check the planner's formulas against the step they describe.

- Parameters: the runner's GPT built on the meta device (no memory, any size).
- FLOPs: `torch.utils.flop_counter.FlopCounterMode` over forward + backward on meta, cross-checked
  with fvcore's `FlopCountAnalysis` (forward only, one multiply-add = one flop).
- Memory: two real training steps of the runner (`runner.step.build_optimizer`, `train_step`,
  autocast, the model's own loss chunking and activation checkpointing, gradient accumulation)
  under `FakeTensorMode` on CPU, measured by `torch.distributed._tools.mem_tracker.MemTracker`.

Two deliberate departures from a plain CPU run, both documented in docs/memory.md (moved from the README's "Traced truth"):

1. CUDA kernel semantics (``kernels="cuda"``, the default). A CPU build cannot trace fake CUDA
   tensors, and a few CPU kernels save different tensors than their CUDA counterparts. For the
   trace, ``F.rms_norm`` and ``square``/``pow`` are swapped for versions that follow CUDA:
   CUDA's autocast runs both in fp32 (the CPU policy does not; ReLU² in nanochat is a square),
   and ``rms_norm`` runs as CUDA's fused kernel, which saves its input and the per-row rstd
   where the CPU decomposition also saves the normalised tensor. The other ops the runner
   uses (linear, SDPA, layer_norm and log_softmax on fp32 inputs, ...) already behave alike.
   ``kernels="cpu"`` traces the plain CPU path (what a CPU run of the runner does).
2. Data-parallel state. DDP cannot wrap fake tensors, so one rank's DDP state is reproduced as
   torch's reducer behaves with ``gradient_as_bucket_view=True`` (runner/train.py): one flat
   bucket of all parameters that lives for the whole run, gradients copied into it and then
   viewed from it after each synced backward, and fresh gradients under ``no_sync``.
   tests/test_trace.py checks this against a real DDP on a fake process group byte for byte.
   Sharded strategies (zero1, zero2, fsdp) are traced as DDP; at every moment of the last step
   their sharded parts (optimizer state; + gradients; + parameters) are divided by the
   data-parallel degree; fsdp adds two gathered layers and zero2 its parameter shard beside
   the gathered parameters (planner.memory_terms.sharded_extra). This is an analytic division, as
   planner.memory does, not a fake process group; tests/test_shard_state.py checks the
   runner's real per-rank parameters, gradients and optimizer state on 2 gloo processes.

Compiled plans (``compile`` on: GPU plans) are traced differently: runner.compiled_trace
compiles the runner's model with inductor on CPU and reads what AOTAutograd's partitioner saves
for backward. The traced peak is those captured saved tensors (every block, the head and loss,
the bf16 weight copies) in planner.memory_compiled's conservative backward walk, with the same
parameters, gradients, optimizer and data-parallel state as the analytic model: the capture
checks what the compiled forward keeps; the compiled backward's liveness needs a GPU.

Not traced: CUDA context, NCCL buffers, cuBLAS/flash-attention workspaces and allocator
fragmentation. Those are the profile's overhead terms (assumptions until measured on a GPU).
"""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from planner.counts import flops_per_token
from planner.memory import estimate
from planner.memory_terms import MemoryEstimate, StepConfig
from planner.spec import ModelSpec
from runner.cuda_emulation import cuda_semantics
from runner.model import GPT, build_meta_model

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from torch import nn

Kernels = Literal["cuda", "cpu"]
CATEGORIES = ("parameters", "buffers", "gradients", "optimizer_state", "activations", "temporaries")
# Optimizer hyper-parameters do not change memory; these match planner.plan.Hyper's defaults.
_HYPER = dict(lr=3e-4, matrix_lr=0.02, weight_decay=0.0, betas=(0.9, 0.95))


# --------------------------------------------------------------------------- parameters

def meta_param_count(spec: ModelSpec) -> int:
    """Parameters of the runner's model, counted on the meta device."""
    return sum(p.numel() for p in build_meta_model(spec).parameters())


# --------------------------------------------------------------------------- FLOPs

@dataclass(frozen=True)
class TracedFlops:
    """Training FLOPs per token, three ways. 2 FLOPs per multiply-add throughout, except
    `fvcore_forward_macs`, which is fvcore's own unit (1 per multiply-add, forward only)."""

    spec_name: str
    tokens: int                       # batch × seq_len traced
    analytic_per_token: int           # planner.counts.flops_per_token
    flop_counter_per_token: float     # FlopCounterMode, forward + backward
    fvcore_forward_macs: int | None   # fvcore total for one forward of `tokens`
    fvcore_per_token: float | None    # fvcore × 2 (MAC -> FLOPs) × 3 (backward = 2 × forward)
    by_op: dict[str, int] = field(default_factory=dict)

    @property
    def flop_counter_error(self) -> float:
        return self.analytic_per_token / self.flop_counter_per_token - 1.0

    @property
    def fvcore_error(self) -> float | None:
        return None if self.fvcore_per_token is None else self.analytic_per_token / self.fvcore_per_token - 1.0


def _sdpa_fvcore_handle(inputs: list[Any], outputs: list[Any]) -> int:
    """fvcore handle for aten::scaled_dot_product_attention: QKᵀ and AV, in multiply-adds.

    Counted over the full T×S score matrix (no saving for the causal mask), the same
    convention as FlopCounterMode and planner.counts.
    """
    from fvcore.nn.jit_handles import get_shape

    q, k = get_shape(inputs[0]), get_shape(inputs[1])
    *batch, t, e = q
    s = k[-2]
    n = 1
    for b in batch:
        n *= b
    return 2 * n * t * s * e


def trace_flops(spec: ModelSpec, batch: int = 1, use_fvcore: bool = True) -> TracedFlops:
    """Count training FLOPs of the runner's model on meta tensors.

    The loss is traced unchunked and without activation checkpointing: both recompute parts of
    the forward in backward, which costs time but is not model FLOPs (MFU counts model FLOPs).
    """
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    model = build_meta_model(spec, loss_chunk_tokens=0, activation_checkpointing=False)
    idx = torch.zeros((batch, spec.seq_len), dtype=torch.long, device="meta")
    with FlopCounterMode(display=False) as fc:
        loss = model(idx, idx)
        loss.backward()
    total = fc.get_total_flops()
    by_op = {str(k): int(v) for k, v in fc.get_flop_counts().get("Global", {}).items()}
    tokens = batch * spec.seq_len
    macs = None
    if use_fvcore:
        macs = fvcore_forward_macs(spec, batch)
    return TracedFlops(
        spec_name=spec.name, tokens=tokens, analytic_per_token=flops_per_token(spec),
        flop_counter_per_token=total / tokens, fvcore_forward_macs=macs,
        fvcore_per_token=None if macs is None else 6 * macs / tokens, by_op=by_op,
    )


def fvcore_forward_macs(spec: ModelSpec, batch: int = 1) -> int:
    """fvcore's count of one forward (logits for `batch` sequences), in multiply-adds."""
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # fvcore imports torch.jit.script (DeprecationWarning)
        from fvcore.nn import FlopCountAnalysis

    model = build_meta_model(spec).eval()
    idx = torch.zeros((batch, spec.seq_len), dtype=torch.long, device="meta")
    fca = FlopCountAnalysis(model, (idx,))
    fca.set_op_handle("aten::scaled_dot_product_attention", _sdpa_fvcore_handle)
    fca.unsupported_ops_warnings(False).uncalled_modules_warnings(False).tracer_warnings("none")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return int(fca.total())


# --------------------------------------------------------------------------- data-parallel state

def _rank_ddp(module: nn.Module) -> nn.Module:
    """One rank's `DDP(module, gradient_as_bucket_view=True)` state, for fake tensors.

    As torch's reducer does: one flat bucket of every parameter (allocated once, alive for the
    whole run); after each synced backward a parameter's gradient is copied into its bucket view
    and `.grad` becomes that view; under `no_sync` gradients are left where autograd put them.
    The all-reduce itself moves no memory and is left out.
    """
    import torch
    from torch import nn

    class RankDDP(nn.Module):
        def __init__(self, inner: nn.Module) -> None:
            super().__init__()
            self.module = inner
            params = [p for p in inner.parameters() if p.requires_grad]
            self.bucket = torch.empty(sum(p.numel() for p in params), dtype=params[0].dtype)
            self.views: dict[int, torch.Tensor] = {}
            off = 0
            for p in params:
                self.views[id(p)] = self.bucket[off:off + p.numel()].view_as(p)
                off += p.numel()
                p.register_post_accumulate_grad_hook(self._into_bucket)
            self.sync = True

        def _into_bucket(self, p: torch.Tensor) -> None:
            view = self.views[id(p)]
            if self.sync and p.grad is not None and p.grad._base is not self.bucket:
                view.copy_(p.grad)
                p.grad = view

        @contextlib.contextmanager
        def no_sync(self) -> Iterator[None]:
            self.sync = False
            try:
                yield
            finally:
                self.sync = True

        def forward(self, *args: Any, **kwargs: Any) -> Any:
            return self.module(*args, **kwargs)

    return RankDDP(module)


# --------------------------------------------------------------------------- memory

@dataclass
class TracedMemory:
    """Peak bytes of one rank's steady-state training step, from MemTracker."""

    config: StepConfig
    kernels: Kernels
    peak_bytes: int
    breakdown: dict[str, int]          # CATEGORIES at the moment of the peak
    peak_phase: str                    # forward | backward | optimizer
    seconds: float
    note: str = ""                     # how sharded parts were handled, if any
    capture: Any = None                # compiled plans: runner.compiled_trace.CompiledCapture

    def analytic(self) -> MemoryEstimate:
        return estimate(self.config)

    @property
    def relative_error(self) -> float:
        """(analytic − traced) / traced, on the allocated peak."""
        return self.analytic().allocated_peak / self.peak_bytes - 1.0


def _categories(snap: dict[Any, int]) -> dict[str, int]:
    by = {str(getattr(k, "value", k)): int(v) for k, v in snap.items()}
    return {
        "parameters": by.get("Parameter", 0),
        "buffers": by.get("Buffer", 0),
        "gradients": by.get("Gradient", 0),
        "optimizer_state": by.get("Optstate", 0),
        "activations": by.get("Activation", 0),
        "temporaries": by.get("Temp", 0) + by.get("Other", 0),
    }


def _make_tracker(cut: Callable[[dict[str, int]], int] | None = None) -> Any:
    """A MemTracker that records which phase (forward/backward/optimizer) held the peak.

    With `cut` (bytes a sharded strategy would not hold, from the categories of a moment), it
    also tracks the peak of the DDP-state level minus that cut, moment by moment.
    """
    from torch.distributed._tools.mem_tracker import MemTracker

    class PhaseTracker(MemTracker):
        peak_phase = "forward"
        steady = False                       # set for the last step: the optimizer state exists
        cut_peak = -1
        cut_phase = "forward"
        cut_categories: dict[str, int] = {}

        def _phase(self) -> str:
            return "optimizer" if self._in_opt else "backward" if self._mod_tracker.is_bw else "forward"

        def _update_peak_stats(self, peak_state: Any) -> None:
            # MemTracker's own version also updates every active module's local peak, a loop
            # over all modules per op; only the global peak is needed here.
            for dev, snap in self._curr_mem_snap.items():
                total = snap["Total"]
                if self._peak_mem.get(dev, 0) < total:
                    self._peak_mem[dev] = total
                    self._peak_mem_snap[dev] = dict(snap)
                    self.peak_phase = self._phase()
            if cut is not None and self.steady and self._curr_mem_snap:
                cats = _categories(next(iter(self._curr_mem_snap.values())))
                level = sum(cats.values()) - cut(cats)
                if level > self.cut_peak:
                    self.cut_peak, self.cut_phase, self.cut_categories = level, self._phase(), cats

    return PhaseTracker()


def run_traced_steps(cfg: StepConfig, kernels: Kernels = "cuda", steps: int = 2, grad_clip: float = 1.0,
                     tracker: Any = None, fake: bool = True,
                     wrap: Callable[[nn.Module], nn.Module] | None = None) -> Any:
    """Run `steps` runner training steps under a MemTracker (on fake CPU tensors); return it.

    `fake=False` runs the same steps on real CPU tensors (tests compare the two); `wrap`
    replaces the emulated DDP state for dp > 1 (tests pass a real DDP on a fake process group).
    """
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from runner.step import build_optimizer, train_step

    spec = cfg.spec
    mt = tracker if tracker is not None else _make_tracker()
    semantics = cuda_semantics() if kernels == "cuda" else contextlib.nullcontext()
    with FakeTensorMode() if fake else contextlib.nullcontext():
        model: nn.Module = GPT(spec, loss_chunk_tokens=cfg.loss_chunk_tokens,
                               activation_checkpointing=cfg.activation_checkpointing, ac_every=cfg.ac_every,
                               ac_policy=cfg.ac_policy)
        if cfg.precision == "bf16":               # as runner/train.py build_model
            for p in model.parameters():
                p.data = p.data.to(torch.bfloat16)
        raw = model
        if cfg.dp > 1:                              # runner/train.py wraps DDP when distributed
            model = (wrap or _rank_ddp)(raw)
        opt = build_optimizer(raw, cfg.optimizer, _HYPER["lr"], _HYPER["matrix_lr"], _HYPER["weight_decay"],
                              _HYPER["betas"], "cpu")
        bucket = getattr(model, "bucket", None)
        mt.track_external(model, *opt.optimizers, *([bucket] if bucket is not None else []))

        def micro_batches() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
            while True:
                mt.reset_mod_stats()   # MemTracker follows one forward per module per "iteration"
                x = torch.randint(0, spec.vocab_size, (cfg.device_batch_size, spec.seq_len))
                yield x, torch.randint(0, spec.vocab_size, (cfg.device_batch_size, spec.seq_len))

        batches = micro_batches()
        with mt, semantics:
            for i in range(steps):
                mt.steady = i == steps - 1
                train_step(model, opt, batches, cfg.grad_accum_steps, cfg.precision, "cpu", grad_clip)
    return mt


def trace_compiled_memory(cfg: StepConfig) -> TracedMemory:
    """Peak memory of one rank's compiled step: the captured saved tensors in the compiled walk."""
    from runner.compiled_trace import capture_compiled

    t0 = time.perf_counter()
    cap = capture_compiled(cfg)
    L = cfg.spec.n_layer
    block = None if cfg.activation_checkpointing else cap.per_layer_tokens[L // 2] + cap.per_layer_constant[L // 2]
    e = estimate(cfg, compiled_saved=(cap.saved_bytes, block))
    cats = {k: e.breakdown.get(k, 0) for k in CATEGORIES}
    cats["temporaries"] += e.breakdown.get("loss_temporaries", 0)
    note = (f"compiled: {cap.n_saved} saved tensors ({cap.n_bases} buffers, {cap.saved_bytes / 2**30:.2f} GiB) "
            "captured from the partitioner on CPU, in the conservative compiled backward walk")
    return TracedMemory(config=cfg, kernels="cuda", peak_bytes=e.allocated_peak, breakdown=cats,
                        peak_phase=e.peak_phase, seconds=time.perf_counter() - t0, note=note, capture=cap)


def trace_memory(cfg: StepConfig, kernels: Kernels = "cuda", steps: int = 2, grad_clip: float = 1.0) -> TracedMemory:
    """Peak memory of one rank's training step (see the module docstring for what is emulated).

    A compiled plan (cfg.compile) is traced with `trace_compiled_memory`.
    """
    if cfg.compile:
        return trace_compiled_memory(cfg)
    t0 = time.perf_counter()
    dp = max(1, cfg.dp)
    if cfg.strategy == "ddp" or dp == 1:
        mt = run_traced_steps(cfg, kernels=kernels, steps=steps, grad_clip=grad_clip)
        cats = _categories(next(iter(mt.get_tracker_snapshot("peak").values())))
        return TracedMemory(config=cfg, kernels=kernels, peak_bytes=sum(cats.values()), breakdown=cats,
                            peak_phase=mt.peak_phase, seconds=time.perf_counter() - t0)
    from dataclasses import replace

    from planner.memory_terms import SHARDED, sharded_extra

    w = 2 if cfg.precision == "bf16" else 4
    extra_key, extra = sharded_extra(cfg.strategy, cfg.spec, w, dp)

    def cut(cats: dict[str, int]) -> int:
        return sum(cats[k] - cats[k] // dp for k in SHARDED[cfg.strategy]) - extra

    tracker = _make_tracker(cut)
    # zero2/fsdp (FSDP2) have no DDP bucket: each micro-step reduce-scatters into sharded gradients, so they are
    # traced as one rank without DDP, then divided
    dp_traced = 1 if cfg.strategy in ("zero2", "fsdp") else cfg.dp
    run_traced_steps(replace(cfg, strategy="ddp", dp=dp_traced), kernels=kernels, steps=steps, grad_clip=grad_clip,
                     tracker=tracker)
    cats = dict(tracker.cut_categories)
    for k in SHARDED[cfg.strategy]:
        cats[k] //= dp
    cats[extra_key] += extra
    parts = ", ".join(k.replace("_", " ") for k in SHARDED[cfg.strategy])
    note = (f"{cfg.strategy}: traced as DDP; at every moment {parts} divided by dp={dp}"
            + ({"fsdp": ", plus two gathered layers", "zero2": ", plus the gathered parameters"}.get(cfg.strategy, ""))
            + " (analytic)")
    return TracedMemory(config=cfg, kernels=kernels, peak_bytes=sum(cats.values()), breakdown=cats,
                        peak_phase=tracker.cut_phase, seconds=time.perf_counter() - t0, note=note)
