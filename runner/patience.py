"""Validation patience (early stopping): the best validation loss so far, and how many scheduled
evaluations have passed without beating it. It travels in each checkpoint's meta.json ("patience").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class Patience:
    best_val: float | None = None
    evals_since_best: int = 0

    @classmethod
    def from_meta(cls, meta: dict[str, Any]) -> Patience:
        """Resumed from a checkpoint's meta.json (a fresh one without it)."""
        p = meta.get("patience") or {}
        return cls(p.get("best_val_loss"), int(p.get("evals_since_best") or 0))

    def note(self, val: float) -> None:
        """A scheduled evaluation's loss (the checkpoint's own evaluation does not count)."""
        if self.best_val is None or val < self.best_val:
            self.best_val, self.evals_since_best = val, 0
        else:
            self.evals_since_best += 1

    def exhausted(self, limit: int) -> bool:
        """`limit` evaluations in a row without a new best (never, when limit is 0)."""
        return bool(limit) and self.evals_since_best >= limit

    def state(self) -> dict[str, Any]:
        return {"best_val_loss": self.best_val, "evals_since_best": self.evals_since_best}
