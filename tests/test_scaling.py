"""Chinchilla parametric loss and Muennighoff effective data, against hand-computed values."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from planner.scaling import (
    R_STAR_D,
    chinchilla_distance,
    chinchilla_loss,
    effective_tokens,
    predicted_loss,
)


def test_chinchilla_70b_on_1_4t() -> None:
    # Hand-computed: 1.69 + 406.4 / 4864.5 + 410.7 / 2516.5 = 1.69 + 0.08354 + 0.16320
    assert chinchilla_loss(70e9, 1.4e12) == pytest.approx(1.93674, abs=2e-4)


def test_loss_falls_with_params_and_tokens() -> None:
    assert chinchilla_loss(2e9, 40e9) < chinchilla_loss(1e9, 40e9)
    assert chinchilla_loss(1e9, 80e9) < chinchilla_loss(1e9, 40e9)
    assert chinchilla_loss(1e30, 1e30) == pytest.approx(1.69, abs=1e-5)   # E, the irreducible loss


def test_effective_tokens_hand_values() -> None:
    U = 350e6
    assert effective_tokens(100e6, U) == 100e6                      # under one epoch: all fresh
    assert effective_tokens(U, U) == U                              # continuous at one epoch
    # 2 epochs: R = 1 -> 1 + 15.4·(1 − e^(−1/15.4)) = 1.968235
    assert effective_tokens(2 * U, U) / U == pytest.approx(1.968235, rel=1e-5)
    # 4 epochs: R = 3 -> 1 + 15.4·(1 − e^(−3/15.4)) = 3.725905, 93% of fresh: "about as good as new data"
    assert effective_tokens(4 * U, U) / U == pytest.approx(3.725905, rel=1e-5)
    # 34 epochs (the guide's run): worth only ~14.6 epochs of fresh data
    assert effective_tokens(34 * U, U) / U == pytest.approx(1 + 15.4 * (1 - math.exp(-33 / 15.4)), rel=1e-12)
    assert effective_tokens(34 * U, U) / U == pytest.approx(14.593, abs=1e-3)
    # the limit: U·(1 + R*)
    assert effective_tokens(1e9 * U, U) == pytest.approx(U * (1 + R_STAR_D), rel=1e-9)
    assert effective_tokens(5e9, None) == 5e9


@given(st.floats(1e6, 1e13), st.floats(1e6, 1e13), st.floats(1.0001, 100.0))
def test_effective_tokens_monotone_and_bounded(d: float, u: float, k: float) -> None:
    e1, e2 = effective_tokens(d, u), effective_tokens(d * k, u)
    assert e1 <= e2 * (1 + 1e-12)
    assert e1 <= d * (1 + 1e-12) and e1 <= u * (1 + R_STAR_D) * (1 + 1e-12)


def test_repeated_data_costs_loss() -> None:
    N, D, U = 1e9, 20e9, 1e9
    assert predicted_loss(N, D, U) > predicted_loss(N, D)
    assert predicted_loss(N, D, 100e9) == predicted_loss(N, D)


def test_chinchilla_distance() -> None:
    assert chinchilla_distance(20.0) == 0.0
    assert chinchilla_distance(40.0) == pytest.approx(math.log(2))
    assert chinchilla_distance(10.0) == pytest.approx(math.log(2))
