"""What `torch.compile` saves for backward in the runner's step, read off on CPU (no GPU needed).

AOTAutograd's min-cut partitioner decides which forward tensors the compiled backward keeps.
Its choice does not depend on real data or on the device (its only device logic is for RNG
functionalization), so it can be read on CPU:

1. Build the runner's GPT on the meta device, `to_empty(device="cpu")` (no page is touched).
2. Compile it with the real inductor backend, under the runner's autocast, with CUDA's kernel
   semantics emulated (runner.cuda_emulation.cuda_semantics: fp32 rms_norm through
   `aten::_fused_rms_norm`, registered for CPU here so autograd records FusedRmsNormBackward as on
   CUDA; CUDA autocast's fp32 pow; flash-attention SDPA, which CPU's SDPA is).
3. Wrap `torch._inductor.compile_fx.min_cut_rematerialization_partition`: call the real one,
   keep (forward graph, backward graph, number of forward outputs), and raise before code
   generation. The FX graph and AOTAutograd caches are off (a cache hit skips the partitioner).
4. The forward graph's outputs after the user outputs are the saved tensors. Each is resolved
   through views (and `getitem` of split) to its base buffer; each base counts once. Graph
   inputs (parameters, token ids) are not counted: they exist anyway.

Saved bases are attributed to a block by the source line they come from (`nn_module_stack`),
and split into per-token tensors and constant ones (computed from parameters only: the bf16
weight copies autocast makes). The hooks are private, so this is pinned to the torch version it
was checked on (TORCH_CHECKED) and applies its patches only for the duration of a capture
(`torch.library._scoped_library`, restored attributes). It imports torch inside functions only.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from planner.errors import PlanError
from planner.memory_terms import StepConfig

TORCH_CHECKED = ("2.13.",)    # torch versions whose partitioner hooks this capture was checked on

_BLOCK = re.compile(r"blocks\.(\d+)\b|blocks\[(\d+)\]|blocks_(\d+)_")


class _Captured(Exception):
    """Raised by the wrapped partitioner once it has produced the graphs (stops code generation)."""


@dataclass
class CompiledCapture:
    """Saved-for-backward bytes of the compiled step (one micro-batch), by where they come from."""

    config: StepConfig
    per_layer_tokens: list[int]         # each block's per-token saved bytes × N (its activations)
    per_layer_constant: list[int]       # each block's constant saved bytes (bf16 weight copies)
    other_tokens: int                   # embedding, final norm, head and loss
    other_constant: int                 # the head's bf16 weight copy
    n_saved: int                        # saved tensors (before resolving bases)
    n_bases: int
    seconds: float
    by_base: list[tuple[str, str, int]] = field(default_factory=list)   # (node, owner, bytes)

    @property
    def saved_bytes(self) -> int:
        return (sum(self.per_layer_tokens) + sum(self.per_layer_constant)
                + self.other_tokens + self.other_constant)


def check_torch_version(version: str) -> None:
    """Refuse a torch whose private partitioner hooks this capture was not checked on."""
    if not version.startswith(TORCH_CHECKED):
        raise PlanError("torch", f"the compiled-step capture relies on private torch hooks checked on torch "
                        f"{'/'.join(v + 'x' for v in TORCH_CHECKED)}; this is torch {version}",
                        "install the pinned torch, or validate with --no-compile plans (eager trace)")


@contextlib.contextmanager
def _partition_hook(store: dict[str, Any]) -> Iterator[None]:
    """Swap inductor's partitioner for one that records the graphs and raises `_Captured`."""
    import torch._inductor.compile_fx as cfx

    real = cfx.min_cut_rematerialization_partition

    def capture(joint: Any, inputs: Any, **kwargs: Any) -> Any:
        fw, bw = real(joint, inputs, **kwargs)
        store["fw"], store["bw"], store["n_fwd"] = fw, bw, kwargs.get("num_fwd_outputs")
        raise _Captured

    cfx.min_cut_rematerialization_partition = capture
    try:
        yield
    finally:
        cfx.min_cut_rematerialization_partition = real


def _is_view(node: Any) -> bool:
    """A node whose output aliases its first input (a view, or an element of a split)."""
    import operator

    if node.op != "call_function":
        return False
    if node.target is operator.getitem:
        return True
    schema = getattr(node.target, "_schema", None)
    if schema is None or not schema.returns:
        return False
    ret = schema.returns[0].alias_info
    return ret is not None and not ret.is_write


def _base(node: Any) -> Any:
    while _is_view(node) and node.args and hasattr(node.args[0], "op"):
        node = node.args[0]
    return node


def _base_bytes(node: Any) -> int:
    """Bytes of a base buffer: its storage (a split's outputs share their input's)."""
    val = node.meta.get("val")
    if val is None:
        return 0
    if isinstance(val, (list, tuple)):
        return sum(int(v.numel()) * v.element_size() for v in val if hasattr(v, "numel"))
    if not hasattr(val, "numel"):
        return 0
    return int(val.untyped_storage().nbytes()) if hasattr(val, "untyped_storage") else 0


def _owner(node: Any) -> int | None:
    """The block index a node was traced from, or None (embedding, final norm, head, loss)."""
    stack = node.meta.get("nn_module_stack") or {}
    for key, (path, _cls) in reversed(list(stack.items())):
        for text in (str(path), str(key)):
            m = _BLOCK.search(text)
            if m:
                return int(next(g for g in m.groups() if g is not None))
    return None


def _from_params_only(node: Any, token_inputs: set[Any], memo: dict[Any, bool]) -> bool:
    """True when no token input (ids, targets) reaches `node`: a constant such as a weight copy."""
    stack = [node]
    seen: set[Any] = set()
    while stack:
        n = stack.pop()
        if n in memo:
            if not memo[n]:
                memo[node] = False
                return False
            continue
        if n in seen:
            continue
        seen.add(n)
        if n in token_inputs:
            memo[node] = False
            return False
        stack.extend(a for a in n.all_input_nodes)
    memo[node] = True
    return True


def _summarise(cfg: StepConfig, store: dict[str, Any], seconds: float) -> CompiledCapture:
    import torch

    fw = store["fw"]
    outputs = next(n for n in fw.graph.nodes if n.op == "output").args[0]
    saved = [n for n in outputs[store["n_fwd"]:] if hasattr(n, "op")]
    token_inputs = {n for n in fw.graph.nodes if n.op == "placeholder"
                    and isinstance(n.meta.get("val"), torch.Tensor) and not n.meta["val"].is_floating_point()}
    L = cfg.spec.n_layer
    tok, const = [0] * L, [0] * L
    other_tok = other_const = 0
    memo: dict[Any, bool] = {}
    bases: dict[Any, None] = {}
    for n in saved:
        b = _base(n)
        if b.op == "placeholder":
            continue
        bases.setdefault(b, None)
    rows: list[tuple[str, str, int]] = []
    for b in bases:
        nb = _base_bytes(b)
        i = _owner(b)
        constant = _from_params_only(b, token_inputs, memo)
        if i is None:
            if constant:
                other_const += nb
            else:
                other_tok += nb
        elif constant:
            const[i] += nb
        else:
            tok[i] += nb
        rows.append((b.name, "other" if i is None else f"block {i}", nb))
    return CompiledCapture(config=cfg, per_layer_tokens=tok, per_layer_constant=const, other_tokens=other_tok,
                           other_constant=other_const, n_saved=len(saved), n_bases=len(bases), seconds=seconds,
                           by_base=rows)


def capture_compiled(cfg: StepConfig, kernels: str = "cuda") -> CompiledCapture:
    """Compile the runner's forward + loss for `cfg` on CPU and read what its backward keeps.

    One micro-batch of cfg.device_batch_size × seq_len tokens, the runner's precision,
    activation checkpointing and loss chunking. Data parallelism and the optimizer do not change
    what the compiled graph saves; runner.trace adds their state. kernels="cpu" captures the
    plain CPU step (no CUDA emulation), as a real CPU run compiles it (tests compare the two).
    """
    import torch

    check_torch_version(torch.__version__)
    import torch._dynamo
    import torch._functorch.config as fconfig
    import torch._inductor.config as iconfig

    from runner.cuda_emulation import cuda_semantics, fused_rms_norm_on_cpu
    from runner.model import build_meta_model
    from runner.step import autocast

    t0 = time.perf_counter()
    spec = cfg.spec
    model = build_meta_model(spec, loss_chunk_tokens=cfg.loss_chunk_tokens,
                             activation_checkpointing=cfg.activation_checkpointing)
    model.to_empty(device="cpu")
    if cfg.precision == "bf16":
        model.to(torch.bfloat16)
    model.train()
    idx = torch.zeros((cfg.device_batch_size, spec.seq_len), dtype=torch.long)
    store: dict[str, Any] = {}
    torch._dynamo.reset()
    with contextlib.ExitStack() as stack:
        stack.enter_context(iconfig.patch(fx_graph_cache=False))
        stack.enter_context(fconfig.patch(enable_autograd_cache=False))
        stack.enter_context(_partition_hook(store))
        if kernels == "cuda":
            stack.enter_context(fused_rms_norm_on_cpu())
            stack.enter_context(cuda_semantics(fused_op=True))
        compiled = torch.compile(model, backend="inductor", fullgraph=True)
        try:
            with autocast("cpu", cfg.precision):
                compiled(idx, idx)
        except Exception as e:  # dynamo wraps the backend's exception
            if "fw" not in store:
                raise
            del e
    torch._dynamo.reset()
    if "fw" not in store:
        raise RuntimeError("the partitioner was not reached: nothing captured")
    return _summarise(cfg, store, time.perf_counter() - t0)
