"""Token loader: DATA_DIR/train.bin and val.bin (raw uint16/uint32 arrays) read through np.memmap.

Training batches are a pure function of (seed, step, micro-step, rank), so a checkpoint's
data position is just its step and a resumed run continues on the exact next batch:

- train.bin is cut into W windows of seq_len+1 tokens (targets are the inputs shifted by one);
- global sample i of the run belongs to epoch i // W and is window perm_e[i % W], where perm_e
  is a permutation seeded by (seed, epoch) and each epoch starts at a random shift < seq_len;
- sample i = ((step · grad_accum + micro) · world + rank) · B + b, so every rank reads its own
  disjoint slice of each epoch and an epoch covers every window exactly once.

Validation uses a fixed set of windows from the start of val.bin, split across the ranks.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from planner.datameta import DataMeta, load_data_meta
from planner.errors import PlanError

FULL_PERMUTATION_MAX = 1 << 24  # above this many windows, use an affine bijection (O(1) memory)


def open_tokens(path: str | Path, dtype: str) -> np.ndarray:
    """Memory-map a raw token file (read-only)."""
    p = Path(path)
    if not p.exists():
        raise PlanError("--data", f"{p} does not exist", "run nanoplan prepare-data first")
    if p.stat().st_size == 0:
        return np.zeros(0, dtype=dtype)
    return np.memmap(p, dtype=dtype, mode="r")


def load_data(data_dir: str | Path) -> tuple[DataMeta, np.ndarray, np.ndarray]:
    """(meta, train tokens, val tokens) of a prepare-data directory."""
    meta = load_data_meta(data_dir)
    d = Path(data_dir)
    return meta, open_tokens(d / "train.bin", meta.dtype), open_tokens(d / "val.bin", meta.dtype)


def _coprime_multiplier(n: int, rng: np.random.Generator) -> int:
    while True:
        a = int(rng.integers(1, max(2, n)))
        if math.gcd(a, n) == 1:
            return a


class EpochOrder:
    """Window order of each epoch: a seeded permutation (or affine bijection) plus a start shift."""

    def __init__(self, n_windows: int, seq_len: int, seed: int, full_max: int = FULL_PERMUTATION_MAX) -> None:
        self.n = n_windows
        self.seq_len = seq_len
        self.seed = seed
        self.full_max = full_max
        self._cache: OrderedDict[int, tuple[int, np.ndarray | tuple[int, int]]] = OrderedDict()

    def _epoch(self, e: int) -> tuple[int, np.ndarray | tuple[int, int]]:
        hit = self._cache.get(e)
        if hit is not None:
            self._cache.move_to_end(e)
            return hit
        rng = np.random.default_rng([self.seed, e])
        shift = int(rng.integers(self.seq_len))
        if self.n <= self.full_max:
            order: np.ndarray | tuple[int, int] = rng.permutation(self.n).astype(np.int64)
        else:
            order = (_coprime_multiplier(self.n, rng), int(rng.integers(self.n)))
        self._cache[e] = (shift, order)
        while len(self._cache) > 2:
            self._cache.popitem(last=False)
        return shift, order

    def starts(self, sample_ids: np.ndarray) -> np.ndarray:
        """Token offset of each global sample's window."""
        epochs, j = np.divmod(sample_ids, self.n)
        out = np.empty_like(sample_ids)
        for e in np.unique(epochs):
            sel = epochs == e
            shift, order = self._epoch(int(e))
            if isinstance(order, np.ndarray):
                w = order[j[sel]]
            else:
                a, c = order
                w = (j[sel] * a + c) % self.n
            out[sel] = w * self.seq_len + shift
        return out


def _to_device(arr: np.ndarray, device: torch.device) -> torch.Tensor:
    t = torch.from_numpy(arr.astype(np.int64))
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t


class TrainBatches:
    """Micro-batches (x, y) of shape (B, T) for one rank, deterministic from (seed, step, micro, rank)."""

    def __init__(self, tokens: np.ndarray, seq_len: int, batch_size: int, grad_accum: int,
                 rank: int, world_size: int, seed: int, device: torch.device | str = "cpu",
                 full_permutation_max: int = FULL_PERMUTATION_MAX) -> None:
        self.tokens = tokens
        self.T, self.B, self.accum = seq_len, batch_size, grad_accum
        self.rank, self.world = rank, world_size
        self.device = torch.device(device)
        # windows of T+1 tokens starting at shift + k·T with shift < T: k < len//T - 1
        self.n_windows = len(tokens) // seq_len - 1
        if self.n_windows < 1:
            raise PlanError("--data", f"train.bin holds {len(tokens):,} tokens, fewer than 2 × seq_len = {2 * seq_len:,}",
                            "prepare more text or use a shorter --seq-len")
        self.order = EpochOrder(self.n_windows, seq_len, seed, full_permutation_max)
        self._offsets = np.arange(seq_len + 1, dtype=np.int64)

    @property
    def samples_per_step(self) -> int:
        return self.B * self.accum * self.world

    def sample_ids(self, step: int, micro: int) -> np.ndarray:
        base = ((step * self.accum + micro) * self.world + self.rank) * self.B
        return base + np.arange(self.B, dtype=np.int64)

    def window_starts(self, step: int, micro: int) -> np.ndarray:
        return self.order.starts(self.sample_ids(step, micro))

    def numpy_batch(self, step: int, micro: int) -> np.ndarray:
        """(B, T+1) tokens of one micro-batch."""
        idx = self.window_starts(step, micro)[:, None] + self._offsets[None, :]
        return np.asarray(self.tokens[idx])

    def batch(self, step: int, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
        buf = _to_device(self.numpy_batch(step, micro), self.device)
        return buf[:, :-1], buf[:, 1:]

    def micro_batches(self, step: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for m in range(self.accum):
            yield self.batch(step, m)

    def epoch_of(self, step: int) -> float:
        """Epochs completed after `step` optimizer steps."""
        return step * self.samples_per_step / self.n_windows


class ValBatches:
    """A fixed validation set: the first windows of val.bin, split evenly across ranks."""

    def __init__(self, tokens: np.ndarray, seq_len: int, batch_size: int, rank: int, world_size: int,
                 val_tokens: int = 0, device: torch.device | str = "cpu") -> None:
        self.tokens = tokens
        self.T, self.B = seq_len, batch_size
        self.device = torch.device(device)
        self.available = (len(tokens) - 1) // seq_len if len(tokens) > seq_len else 0
        want = max(1, math.ceil(val_tokens / seq_len)) if val_tokens else batch_size * world_size
        per_rank_batches = max(1, math.ceil(want / (batch_size * world_size)))
        self.n_batches = per_rank_batches
        first = rank * per_rank_batches * batch_size
        self.windows = [first + i for i in range(per_rank_batches * batch_size)]
        self._offsets = np.arange(seq_len + 1, dtype=np.int64)

    @property
    def enabled(self) -> bool:
        return self.available > 0

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for b in range(self.n_batches):
            w = np.array(self.windows[b * self.B:(b + 1) * self.B], dtype=np.int64) % self.available
            idx = (w * self.T)[:, None] + self._offsets[None, :]
            buf = _to_device(np.asarray(self.tokens[idx]), self.device)
            yield buf[:, :-1], buf[:, 1:]
