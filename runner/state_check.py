"""A checkpoint's tensors held against the live model and optimizer, before anything is loaded.

A checkpoint that passes its checksums can still be crafted: meta.json is resealed by whoever
wrote the files. torch's loaders do not check an optimizer's state: a wrong-shape `exp_avg`
crashes fused AdamW (a segfault, then torchrun restarts into it), a 1-D one with more elements
trains on garbage, a 3-element `step` ends in a traceback. So every tensor is checked first: its
shape, dtype and element count against the parameter it belongs to, and each problem names the
tensor in full. Each function returns the problem as text (the caller names the file), or None.

- model.pt (ddp, zero1): `model_problem`, against the model's own state dict;
- optim_rank0.pt (ddp, zero1): `optimizer_problem`, against each optimizer's param groups. The
  state of a parameter is AdamW's step/exp_avg/exp_avg_sq (+max_exp_avg_sq with amsgrad) or Muon's
  momentum_buffer; `step` is one finite number >= 0, every other tensor has its parameter's shape
  and dtype. ZeroRedundancyOptimizer's consolidated state has the same layout, indexed over all
  parameters;
- DCP checkpoints (zero2, fsdp): `dcp_problem`, the .metadata's global size and dtype of each
  entry against the live state dict (DTensors report their global shape), before dcp.load.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch

from planner.errors import echo

STEP = "step"
# What each optimizer keeps per parameter (torch.optim.AdamW/Adam, torch.optim.Muon), when it keeps anything.
REQUIRED_STATE = {"AdamW": (STEP, "exp_avg", "exp_avg_sq"), "Adam": (STEP, "exp_avg", "exp_avg_sq"),
                  "Muon": ("momentum_buffer",)}


def _shape(shape: Iterable[int]) -> str:
    dims = tuple(int(d) for d in shape)
    n = math.prod(dims)
    return f"({', '.join(map(str, dims))}{',' if len(dims) == 1 else ''}) = {n:,} element{'s' if n != 1 else ''}"


def mismatch(value: Any, shape: Iterable[int], dtype: torch.dtype) -> str | None:
    """How `value` differs from a tensor of `shape` and `dtype` (shape, element count, dtype), or None."""
    if not isinstance(value, torch.Tensor):
        return f"is a {type(value).__name__}, not a tensor"
    want = tuple(int(d) for d in shape)
    if tuple(value.shape) != want:
        return f"has shape {_shape(value.shape)}, this run's has {_shape(want)}"
    if value.dtype != dtype:
        return f"has dtype {str(value.dtype).removeprefix('torch.')}, this run's is {str(dtype).removeprefix('torch.')}"
    return None


def model_problem(state: Any, live: dict[str, torch.Tensor]) -> str | None:
    """`state` (a loaded model.pt) against the live model's state dict: the same names, shapes and dtypes."""
    if not isinstance(state, dict):
        return f"holds a {type(state).__name__}, not a model state dict"
    missing = [k for k in live if k not in state]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        return f"has no tensor {echo(missing[0])}{more}, which this plan's model has"
    extra = [k for k in state if k not in live]
    if extra:
        return f"holds a tensor {echo(extra[0])} that this plan's model does not have"
    for k, t in live.items():
        if (why := mismatch(state[k], t.shape, t.dtype)) is not None:
            return f"tensor {echo(k)} {why}"
    return None


def _step_problem(value: Any) -> str | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        ok = math.isfinite(value) and value >= 0
        return None if ok else f"is {value!r}, not a step count >= 0"
    if not isinstance(value, torch.Tensor):
        return f"is a {type(value).__name__}, not a tensor"
    if value.dim() != 0:
        return f"has shape {_shape(value.shape)}, a step count is one number (shape ())"
    if not (value.dtype.is_floating_point or value.dtype in (torch.int32, torch.int64)):
        return f"has dtype {str(value.dtype).removeprefix('torch.')}, not a real number"
    v = float(value)
    return None if math.isfinite(v) and v >= 0 else f"is {v!r}, not a step count >= 0"


def _groups(saved: Any, live: list[dict[str, Any]], where: str) -> tuple[dict[Any, torch.Tensor] | None, str | None]:
    """{saved parameter index: live parameter} from the saved and live param groups, or the problem."""
    if not isinstance(saved, list) or len(saved) != len(live):
        n = len(saved) if isinstance(saved, list) else type(saved).__name__
        return None, f"{where}.param_groups has {n} group(s), this run's optimizer {len(live)}"
    out: dict[Any, torch.Tensor] = {}
    for g, (s, lg) in enumerate(zip(saved, live, strict=True)):
        ids = s.get("params") if isinstance(s, dict) else None
        if not isinstance(ids, list) or len(ids) != len(lg["params"]):
            n = len(ids) if isinstance(ids, list) else "no"
            return None, f"{where}.param_groups[{g}] lists {n} parameters, this run's optimizer {len(lg['params'])}"
        for i, p in zip(ids, lg["params"], strict=True):
            if isinstance(i, bool) or not isinstance(i, int) or i in out:
                return None, f"{where}.param_groups[{g}].params holds {echo(i, 40)}, not a distinct parameter index"
            out[i] = p
    return out, None


def optimizer_problem(saved: Any, optimizers: list[Any], names: dict[int, str]) -> str | None:
    """`saved` (optim_rank0.pt's "optimizer": {"optimizers": [state dict, ...]}) against the live optimizers.

    `names` maps id(parameter) to its name in the model, so a problem names the parameter too."""
    sds = saved.get("optimizers") if isinstance(saved, dict) else None
    if not isinstance(sds, list) or len(sds) != len(optimizers):
        n = len(sds) if isinstance(sds, list) else "no list of"
        return f"holds {n} optimizer state(s), this run has {len(optimizers)} optimizer(s)"
    for o_i, (sd, opt) in enumerate(zip(sds, optimizers, strict=True)):
        where = f"optimizers[{o_i}]"
        if not isinstance(sd, dict) or not isinstance(sd.get("state"), dict):
            return f"{where} is not an optimizer state dict (no 'state' mapping)"
        params, why = _groups(sd.get("param_groups"), opt.param_groups, where)
        if params is None:
            return why
        kind = type(getattr(opt, "optim", opt)).__name__    # ZeroRedundancyOptimizer wraps the real one
        amsgrad = any(g.get("amsgrad") for g in opt.param_groups)
        required = REQUIRED_STATE.get(kind, ()) + (("max_exp_avg_sq",) if amsgrad and kind in ("AdamW", "Adam") else ())
        for idx, st in sd["state"].items():
            if idx not in params:
                return f"{where}.state holds an entry for parameter index {echo(idx, 40)}, which its param groups do not list"
            p = params[idx]
            label = f"{where}.state[{idx}]"
            of = f" (of parameter {names.get(id(p), '?')})"
            if not isinstance(st, dict):
                return f"{label}{of} is a {type(st).__name__}, not a mapping"
            if st and (absent := [k for k in required if k not in st]):
                return f"{label}{of} has no {absent[0]!r}, which {kind} keeps for every parameter"
            for key, value in st.items():
                why = _step_problem(value) if key == STEP else mismatch(value, p.shape, p.dtype)
                if why is not None:
                    return f"{label}[{echo(key, 80)}]{of} {why}"
    return None


def dcp_problem(metadata: Any, live: dict[str, Any], what: str) -> str | None:
    """A DCP checkpoint's .metadata against the flattened live state dict it is about to be loaded into:
    every live tensor must be there with the same global size and dtype."""
    entries = getattr(metadata, "state_dict_metadata", None)
    if not isinstance(entries, dict):
        return "holds no state_dict_metadata"
    for key, t in live.items():
        if not isinstance(t, torch.Tensor):
            continue
        m = entries.get(key)
        if m is None:
            return f"has no entry {echo(key)}, which this run's {what} has"
        size, props = getattr(m, "size", None), getattr(m, "properties", None)
        if size is None or props is None:
            return f"entry {echo(key)} is not a tensor, this run's {what} has one of shape {_shape(t.shape)}"
        if tuple(size) != tuple(t.shape):
            return f"entry {echo(key)} has shape {_shape(size)}, this run's {what} has {_shape(t.shape)}"
        if key.endswith(f".{STEP}") and t.dim() == 0:
            continue   # a step count: any real dtype loads into it
        if getattr(props, "dtype", None) != t.dtype:
            return (f"entry {echo(key)} has dtype {str(getattr(props, 'dtype', None)).removeprefix('torch.')}, "
                    f"this run's {what} has {str(t.dtype).removeprefix('torch.')}")
    return None
