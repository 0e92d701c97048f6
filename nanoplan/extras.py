"""The optional packages and the extra of nanoplan that brings each one: a command that needs one that is not
installed says so in one line (exit 2), naming the extra to install, never with a traceback.

Planning (`pip install -e .`: estimate, compare, validate, profiles, schema, export) needs none of them.
"""

from __future__ import annotations

import importlib.util

from planner.errors import PlanError

TORCH_FIRST = "pip install torch==2.13.0 first (the README's set-up), then "
# top-level module -> (the extra that installs it, how to install it)
EXTRAS: dict[str, tuple[str, str]] = {
    "torch": ("train", TORCH_FIRST + "pip install -e '.[train]' (or pip install 'nanoplan[train]')"),
    "fvcore": ("train", "pip install -e '.[train]' (or pip install fvcore)"),
    "matplotlib": ("plot", "pip install -e '.[plot]' (or pip install matplotlib), or drop --plot"),
    "tokenizers": ("bpe", "pip install -e '.[bpe]' (or pip install tokenizers), or use --tokenizer byte or char"),
    "tensorboard": ("tensorboard", "pip install -e '.[tensorboard]' (or pip install tensorboard)"),
}


def missing(module: str | None, what: str) -> PlanError | None:
    """The one-line error for `what` (a command) when `module` (a dotted name) is an optional package that is
    not installed; None for any other module (a real bug keeps its traceback)."""
    top = (module or "").partition(".")[0]
    if top not in EXTRAS:
        return None
    extra, how = EXTRAS[top]
    return PlanError(what, f"needs {top} (nanoplan's '{extra}' extra), which is not installed", how)


def require(module: str, what: str) -> None:
    """Raise the one-line error before `what` starts something that needs `module` in another process (torchrun,
    the probe's trials), where a missing package would only show as that process's failure."""
    if importlib.util.find_spec(module) is None:
        err = missing(module, what)
        if err is not None:
            raise err
