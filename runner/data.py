"""Token loader: DATA_DIR/train.bin and val.bin (raw uint16/uint32 arrays) read through np.memmap.

Training batches are a pure function of (seed, step, micro-step, rank), so a checkpoint's
data position is just its step and a resumed run continues on the exact next batch:

- train.bin is cut into W windows of seq_len+1 tokens (targets are the inputs shifted by one);
- global sample i of the run belongs to epoch i // W and is window perm_e[i % W], where perm_e
  is a permutation seeded by (seed, epoch) and each epoch starts at a random shift < seq_len;
- sample i = ((step · grad_accum + micro) · world + rank) · B + b, so every rank reads its own
  disjoint slice of each epoch and an epoch covers every window exactly once.

Validation uses a fixed set of windows from the start of val.bin, split across the ranks.

Checks before any rank indexes the embedding (each a one-line PlanError naming the file, exit 2):
a .bin whose size is not a whole number of tokens, or differs from meta.json's token count, and
token ids >= meta.json's vocab_size (every token of a file up to FULL_CHECK_MAX_BYTES, sampled
blocks above). `fingerprint` identifies a data file cheaply for the resume check (runner/train.py).

Above FULL_CHECK_MAX_BYTES the ids outside the sampled blocks are checked as they are read: each
training micro-batch (one max() over the tokens already in host memory) and, once, the whole
validation set. A training batch holds only this rank's windows, so a bad id is not raised at once
(the other ranks would wait in the step's collectives, then crash into torchrun restarts): the
batch's bad ids are zeroed, so the step runs, and `problem` is set; the trainer shares it in the
step's all-reduce and every rank raises `shared_problem()` (a PlanError naming the file and the
token offset) together.
"""

from __future__ import annotations

import hashlib
import math
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from planner.datameta import DataMeta, load_data_meta
from planner.errors import PlanError

FULL_PERMUTATION_MAX = 1 << 24  # above this many windows, use an affine bijection (O(1) memory)
SAMPLE_BLOCKS = 64                 # fingerprint and token-id check of a large file: this many blocks ...
SAMPLE_BLOCK_BYTES = 1 << 20       # ... of 1 MiB, evenly spaced, the first and the last included
FULL_CHECK_MAX_BYTES = 256 << 20   # files up to this size are hashed and range-checked whole
REDO = "re-run nanoplan prepare-data: the file is damaged, or not from this data dir"


def _blocks(size: int) -> list[tuple[int, int]]:
    """(offset, length) of the bytes a check reads: the whole file, or SAMPLE_BLOCKS spaced blocks."""
    if size <= FULL_CHECK_MAX_BYTES:
        return [(0, size)]
    last = size - SAMPLE_BLOCK_BYTES
    return [(last * i // (SAMPLE_BLOCKS - 1), SAMPLE_BLOCK_BYTES) for i in range(SAMPLE_BLOCKS)]


def fingerprint(path: str | Path) -> dict[str, object]:
    """{"bytes", "sha256", "method"} of a data file: a full sha256 up to FULL_CHECK_MAX_BYTES, above that a
    sha256 of the size and SAMPLE_BLOCKS blocks of 1 MiB (64 MiB read, whatever the file's size)."""
    p = Path(path)
    size = p.stat().st_size
    blocks = _blocks(size)
    h = hashlib.sha256(f"{size}:".encode())
    with open(p, "rb") as f:
        for off, n in blocks:
            f.seek(off)
            while n > 0 and (chunk := f.read(min(n, 1 << 22))):
                h.update(chunk)
                n -= len(chunk)
    return {"bytes": size, "sha256": h.hexdigest(),
            "method": "full" if len(blocks) == 1 else f"sampled:{SAMPLE_BLOCKS}x{SAMPLE_BLOCK_BYTES}"}


def _bad_id(path: Path | str, token_id: int, index: int, vocab_size: int) -> PlanError:
    return PlanError(str(path), f"holds token id {token_id:,} at token {index:,}, but the vocab has "
                     f"{vocab_size:,} ids (meta.json); the embedding has no row for it", REDO)


def check_token_ids(tokens: np.ndarray, vocab_size: int, path: Path, blocks: list[tuple[int, int]] | None = None) -> None:
    """Every token id (sampled blocks for a large file, or the given (byte offset, length) blocks) must be
    < vocab_size; PlanError naming the file and the token."""
    item = tokens.dtype.itemsize
    for off, n in blocks if blocks is not None else _blocks(len(tokens) * item):
        chunk = np.asarray(tokens[off // item:(off + n) // item])
        if chunk.size and int(chunk.max()) >= vocab_size:
            i = off // item + int(np.argmax(chunk >= vocab_size))
            raise _bad_id(path, int(tokens[i]), i, vocab_size)


def _may_exceed(tokens: np.ndarray, vocab_size: int | None) -> bool:
    """Whether a token of this dtype can be >= vocab_size at all (uint16 never is with a 65,536 vocab)."""
    return vocab_size is not None and len(tokens) > 0 and int(np.iinfo(tokens.dtype).max) >= vocab_size


def _path_of(tokens: np.ndarray, path: str | Path | None) -> str:
    return str(path or getattr(tokens, "filename", None) or "the token file")


def open_tokens(path: str | Path, dtype: str, expect_tokens: int | None = None) -> np.ndarray:
    """Memory-map a raw token file (read-only), checking that it holds whole tokens (and the count expected)."""
    p = Path(path)
    if not p.exists():
        raise PlanError("--data", f"{p} does not exist", "run nanoplan prepare-data first")
    size, item = p.stat().st_size, np.dtype(dtype).itemsize
    if size % item:
        raise PlanError(str(p), f"has {size:,} bytes, not a whole number of {dtype} tokens ({item} bytes each); "
                        "it is truncated or not a token file", REDO)
    if expect_tokens is not None and size // item != expect_tokens:
        raise PlanError(str(p), f"holds {size // item:,} tokens, but meta.json says {expect_tokens:,}", REDO)
    if size == 0:
        return np.zeros(0, dtype=dtype)
    return np.memmap(p, dtype=dtype, mode="r")


def load_data(data_dir: str | Path) -> tuple[DataMeta, np.ndarray, np.ndarray]:
    """(meta, train tokens, val tokens) of a prepare-data directory, checked: whole tokens, the counts of
    meta.json, and token ids below its vocab_size."""
    meta = load_data_meta(data_dir)
    d = Path(data_dir)
    train = open_tokens(d / "train.bin", meta.dtype, meta.train_tokens)
    val = open_tokens(d / "val.bin", meta.dtype, meta.val_tokens)
    check_token_ids(train, meta.vocab_size, d / "train.bin")
    check_token_ids(val, meta.vocab_size, d / "val.bin")
    return meta, train, val


def data_fingerprints(data_dir: str | Path) -> dict[str, dict[str, object]]:
    """{"train.bin": fingerprint, "val.bin": fingerprint} of a data dir."""
    return {name: fingerprint(Path(data_dir) / name) for name in ("train.bin", "val.bin")}


def fingerprint_change(old: object, data_dir: str | Path,
                       new: dict[str, dict[str, object]]) -> tuple[str, str] | None:
    """(file, what changed) in the data since `old` (a checkpoint's record) was taken; None when nothing did,
    or when `old` is missing (a checkpoint from before fingerprints)."""
    if not isinstance(old, dict):
        return None
    for name, now in new.items():
        was = old.get(name)
        if not isinstance(was, dict):
            continue
        where = str(Path(data_dir) / name)
        if was.get("bytes") != now["bytes"]:
            return where, f"has {now['bytes']:,} bytes, {was.get('bytes')} when the checkpoint was written"
        if was.get("method") == now["method"] and was.get("sha256") != now["sha256"]:
            return where, f"changed since the checkpoint was written (its sha256, {now['method']}, differs)"
    return None


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
                 full_permutation_max: int = FULL_PERMUTATION_MAX, vocab_size: int | None = None,
                 path: str | Path | None = None) -> None:
        self.tokens = tokens
        self.vocab_size = vocab_size if _may_exceed(tokens, vocab_size) else None   # None: nothing to check
        self.path = _path_of(tokens, path)
        self.problem: tuple[int, int] | None = None    # (token id, token index) of the first bad id this rank read
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
        """(B, T+1) tokens of one micro-batch; ids >= the vocab are noted in `problem` and zeroed."""
        idx = self.window_starts(step, micro)[:, None] + self._offsets[None, :]
        arr = np.asarray(self.tokens[idx])
        if self.vocab_size is not None and int(arr.max()) >= self.vocab_size:
            bad = arr >= self.vocab_size
            at = np.unravel_index(int(np.argmax(bad)), bad.shape)
            self.problem = self.problem or (int(arr[at]), int(idx[at]))
            arr = np.where(bad, 0, arr).astype(arr.dtype)   # the step still runs on every rank (see the docstring)
        return arr

    def shared_problem(self) -> PlanError:
        """Collective, on every rank once a step's all-reduce said some rank read a bad id: the error of the
        lowest rank that did (file and token offset)."""
        import torch.distributed as dist

        found: list[tuple[int, int] | None] = [self.problem]
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            found = [None] * dist.get_world_size()
            dist.all_gather_object(found, self.problem)
        token_id, index = next(p for p in found if p is not None)
        return _bad_id(self.path, token_id, index, self.vocab_size or 0)

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
                 val_tokens: int = 0, device: torch.device | str = "cpu", vocab_size: int | None = None,
                 path: str | Path | None = None) -> None:
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
        if self.enabled and _may_exceed(tokens, vocab_size):
            # the whole validation set (every rank's windows: a prefix of val.bin), the same check on every rank
            n = min(self.available, per_rank_batches * batch_size * world_size) * seq_len + 1
            check_token_ids(tokens, int(vocab_size or 0), Path(_path_of(tokens, path)), [(0, n * tokens.dtype.itemsize)])

    @property
    def enabled(self) -> bool:
        return self.available > 0

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for b in range(self.n_batches):
            w = np.array(self.windows[b * self.B:(b + 1) * self.B], dtype=np.int64) % self.available
            idx = (w * self.T)[:, None] + self._offsets[None, :]
            buf = _to_device(np.asarray(self.tokens[idx]), self.device)
            yield buf[:, :-1], buf[:, 1:]
