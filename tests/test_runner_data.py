"""The token loader: determinism from (seed, step, micro, rank), disjoint rank slices, epochs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from planner.errors import PlanError
from runner.data import EpochOrder, TrainBatches, ValBatches, load_data

T, B = 8, 3
TEXT = Path(__file__).resolve().parents[1] / "examples" / "tiny" / "text.txt"


def tokens(n: int = 1000) -> np.ndarray:
    return (np.arange(n) % 251).astype(np.uint16)


def loader(rank: int = 0, world: int = 2, accum: int = 2, seed: int = 7, **kw) -> TrainBatches:
    return TrainBatches(tokens(), T, B, accum, rank, world, seed, **kw)


def test_batch_is_a_pure_function_of_seed_step_micro_rank() -> None:
    a, b = loader(), loader()
    for _ in range(5):  # other batches read in between change nothing
        b.batch(3, 0)
    xa, ya = a.batch(11, 1)
    xb, yb = b.batch(11, 1)
    assert torch.equal(xa, xb) and torch.equal(ya, yb)
    assert xa.shape == (B, T) and xa.dtype == torch.int64
    assert not torch.equal(loader(seed=8).batch(11, 1)[0], xa)
    assert not torch.equal(a.batch(11, 0)[0], xa)
    assert not torch.equal(loader(rank=1).batch(11, 1)[0], xa)


def test_targets_are_inputs_shifted_by_one() -> None:
    x, y = loader().batch(4, 0)
    toks = tokens()
    starts = loader().window_starts(4, 0)
    for i, s in enumerate(starts):
        assert x[i].tolist() == toks[s:s + T].tolist()
        assert y[i].tolist() == toks[s + 1:s + T + 1].tolist()


def test_ranks_read_disjoint_windows_and_an_epoch_covers_each_window_once() -> None:
    world, accum = 2, 2
    ls = [loader(rank=r, world=world, accum=accum) for r in range(world)]
    n = ls[0].n_windows
    assert n == 1000 // T - 1
    per_step = B * accum * world
    steps = n // per_step  # whole steps inside epoch 0
    seen = [s for st in range(steps) for lo in ls for m in range(accum) for s in lo.window_starts(st, m).tolist()]
    assert len(seen) == len(set(seen)) == steps * per_step  # no window twice, ranks disjoint
    shift = seen[0] % T
    assert all(s % T == shift for s in seen)  # one shift per epoch, windows T apart
    assert max(seen) + T + 1 <= 1000


def test_affine_order_is_a_bijection_too() -> None:
    order = EpochOrder(n_windows=97, seq_len=T, seed=3, full_max=0)
    starts = order.starts(np.arange(97))
    assert sorted((starts - starts[0] % T) // T) == list(range(97))
    again = EpochOrder(n_windows=97, seq_len=T, seed=3, full_max=0).starts(np.arange(97))
    assert np.array_equal(starts, again)


def test_epoch_counter() -> None:
    lo = loader()
    assert lo.epoch_of(0) == 0
    assert lo.epoch_of(10) == pytest.approx(10 * 12 / 124)


def test_too_little_data_is_a_one_line_error() -> None:
    with pytest.raises(PlanError, match="fewer than 2 × seq_len"):
        TrainBatches(tokens(15), T, B, 1, 0, 1, 0)


def test_validation_windows_are_fixed_and_split_across_ranks() -> None:
    toks = tokens(200)
    v0 = ValBatches(toks, T, B, rank=0, world_size=2, val_tokens=0)
    v1 = ValBatches(toks, T, B, rank=1, world_size=2, val_tokens=0)
    assert v0.n_batches == 1 and v0.windows == [0, 1, 2] and v1.windows == [3, 4, 5]
    (x0, y0), = list(v0)
    assert x0[1].tolist() == toks[8:16].tolist() and y0[1].tolist() == toks[9:17].tolist()
    assert torch.equal(next(iter(v0))[0], x0)
    big = ValBatches(toks, T, B, rank=0, world_size=2, val_tokens=100)  # 13 windows -> 3 batches of 3 per rank
    assert big.n_batches == 3
    assert not ValBatches(tokens(5), T, B, 0, 1).enabled


def test_load_data_reads_the_meta_dtype(tiny_data) -> None:
    meta, train, val = load_data(tiny_data)
    assert meta.vocab_size == 256 and train.dtype == np.uint16
    assert len(train) == meta.train_tokens and len(val) == meta.val_tokens
    assert bytes(train[:40].astype(np.uint8)) == TEXT.read_bytes()[:40]
