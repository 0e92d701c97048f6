"""CUDA's kernel semantics on a CPU, for the traces of the runner's step (runner.trace, runner.compiled_trace).

A CPU build cannot run autograd on fake CUDA tensors, and a few CPU kernels save different tensors than
their CUDA counterparts. These context managers make the CPU step behave as CUDA's does: CUDA autocast's
fp32 list (rms_norm, pow/square, layer_norm) and the fused rms_norm kernel with what it saves.
Everything imports torch inside the functions.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


def cuda_semantics(fused_op: bool = False) -> contextlib.AbstractContextManager[Any]:
    """Give the runner's ops CUDA's autocast policy and fused rms_norm, for the duration of a trace.

    fused_op: call `aten::_fused_rms_norm` (CUDA's kernel; fused_rms_norm_on_cpu registers it for
    CPU) instead of the Python stand-in below, so a compiled graph holds the real op and backward.

    Swaps `F.rms_norm` and the pow/square entry points for versions that behave as on CUDA, and
    restores them on exit (the model looks them up at call time, so checkpoint recomputation in
    backward sees the same semantics as the forward).
    """
    import torch
    import torch.nn.functional as F

    low = (torch.bfloat16, torch.float16)

    def acc(t: torch.Tensor) -> torch.Tensor:
        return t.float() if t.dtype in low else t

    class FusedRMSNorm(torch.autograd.Function):
        """Saves what CUDA's `_fused_rms_norm` saves: input, rstd (fp32, one per row), weight.

        Backward allocates little beyond its outputs, as the fused kernel does.
        """

        @staticmethod
        def forward(ctx: Any, x: torch.Tensor, shape: tuple[int, ...], w: torch.Tensor | None,
                    eps: float | None) -> torch.Tensor:
            dims = tuple(range(-len(shape), 0))
            e = torch.finfo(x.dtype).eps if eps is None else eps
            xf = acc(x)
            rstd = torch.rsqrt(xf.pow(2).mean(dims, keepdim=True).add_(e))
            y = xf * rstd
            if w is not None:
                y.mul_(w)
            ctx.save_for_backward(x, rstd, w)
            ctx.dims = dims
            return y.to(x.dtype)

        @staticmethod
        def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:
            x, rstd, w = ctx.saved_tensors
            n = 1
            for d in ctx.dims:
                n *= x.shape[d]
            lead = tuple(range(x.dim() - len(ctx.dims)))
            xhat = x * rstd                                   # fp32 (rstd is fp32); becomes dx in place
            dw = None
            if w is not None:
                gw = g * xhat                                 # fp32 scratch: first g·x̂ for dw ...
                if ctx.needs_input_grad[2]:
                    dw = gw.sum(lead).to(w.dtype)
                torch.mul(g, w, out=gw)                       # ... then g·w, in the same buffer
            else:
                gw = acc(g)
            flat = (*x.shape[: x.dim() - len(ctx.dims)], 1, n)
            dot = torch.matmul(gw.reshape(flat), xhat.reshape(flat).transpose(-1, -2)).reshape(rstd.shape) / n
            dx = xhat.mul_(dot).neg_().add_(gw).mul_(rstd).to(x.dtype)
            return dx, None, dw, None

    def autocast_on() -> bool:
        return torch.is_autocast_enabled("cpu")

    def up(t: Any) -> Any:
        return t.float() if isinstance(t, torch.Tensor) and t.dtype in low else t

    def rms_norm(x: torch.Tensor, normalized_shape: Any, weight: torch.Tensor | None = None,
                 eps: float | None = None) -> torch.Tensor:
        if autocast_on():                 # CUDA autocast runs rms_norm in fp32
            x, weight = up(x), up(weight)
        with torch.autocast("cpu", enabled=False):
            if fused_op:
                return torch.ops.aten._fused_rms_norm(x, list(normalized_shape), weight, eps)[0]
            return FusedRMSNorm.apply(x, tuple(normalized_shape), weight, eps)

    def fp32_under_autocast(orig: Any) -> Any:
        def wrapped(x: Any, *args: Any, **kwargs: Any) -> Any:
            return orig(up(x) if autocast_on() else x, *args, **kwargs)
        return wrapped

    # (owner, attribute) -> replacement. pow/square and layer_norm: CUDA autocast's fp32 list (ReLU² in
    # nanochat; the CPU policy runs layer_norm on a bf16 residual in bf16).
    patches: dict[tuple[Any, str], Any] = {(F, "rms_norm"): rms_norm, (F, "layer_norm"): fp32_under_autocast(F.layer_norm)}
    for owner, name in ((torch.Tensor, "square"), (torch.Tensor, "pow"), (torch.Tensor, "__pow__"),
                        (torch, "square"), (torch, "pow")):
        patches[(owner, name)] = fp32_under_autocast(getattr(owner, name))

    @contextlib.contextmanager
    def applied() -> Iterator[None]:
        saved = {key: key[0].__dict__.get(key[1], _MISSING) for key in patches}
        try:
            for (owner, name), fn in patches.items():
                setattr(owner, name, fn)
            yield
        finally:
            for (owner, name), old in saved.items():
                if old is _MISSING:
                    delattr(owner, name)
                else:
                    setattr(owner, name, old)

    return applied()


_MISSING = object()


@contextlib.contextmanager
def fused_rms_norm_on_cpu() -> Iterator[None]:
    """Register CPU kernels for aten::_fused_rms_norm and its backward (fp32 compute), scoped.

    With a CPU backend kernel, autograd records FusedRmsNormBackward (saving input and rstd), as
    it does on CUDA, instead of decomposing rms_norm into differentiable pieces.
    """
    import torch
    from torch._decomp import decomposition_table

    fw = decomposition_table[torch.ops.aten._fused_rms_norm.default]
    bw = decomposition_table[torch.ops.aten._fused_rms_norm_backward.default]
    with torch.library._scoped_library("aten", "IMPL") as lib:
        lib.impl("_fused_rms_norm", fw, "CPU")
        lib.impl("_fused_rms_norm_backward", bw, "CPU")
        yield
