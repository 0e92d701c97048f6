"""The data-constrained loss (Muennighoff et al. 2023's joint fit), against published and hand-computed values."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from planner.scaling import (
    OPTIMAL_TOKENS_PER_PARAM,
    R_STAR_D,
    chinchilla_distance,
    chinchilla_loss,
    data_optimal_params,
    effective_params,
    effective_tokens,
    predicted_loss,
)


def test_the_fits_own_published_values() -> None:
    # huggingface/datablations README, "Parametric Fit": the two runs of the paper's Figure 1 (right)
    assert predicted_loss(6.34e9, 242e9, 25e9) == pytest.approx(2.2256440889984477, abs=1e-12)
    assert predicted_loss(8.67e9, 178e9, 25e9) == pytest.approx(2.2269634075087867, abs=1e-12)


def test_chinchilla_70b_on_1_4t() -> None:
    # Hand-computed: 1.8691 + 520.82 / 70e9^0.35266 + 1487.7 / 1.4e12^0.35266 = 1.8691 + 0.07795 + 0.07749
    assert chinchilla_loss(70e9, 1.4e12) == pytest.approx(2.0246, abs=2e-4)


def test_compute_optimal_ratio_is_about_20() -> None:
    # α = β: N_opt = G·sqrt(C/6), D_opt = sqrt(C/6)/G, so D/N = 1/G² at every scale
    assert OPTIMAL_TOKENS_PER_PARAM == pytest.approx(19.613, abs=1e-3)
    assert data_optimal_params(1e9) == pytest.approx(1e9 / OPTIMAL_TOKENS_PER_PARAM, rel=1e-9)
    # and it is the optimum: at fixed compute 6·N·D, moving N off it either way raises the loss
    n = 1e9
    d = n * OPTIMAL_TOKENS_PER_PARAM
    assert all(chinchilla_loss(n, d) < chinchilla_loss(n * k, d / k) for k in (0.8, 0.95, 1.05, 1.25))


def test_loss_falls_with_params_and_tokens() -> None:
    assert chinchilla_loss(2e9, 40e9) < chinchilla_loss(1e9, 40e9)
    assert chinchilla_loss(1e9, 80e9) < chinchilla_loss(1e9, 40e9)
    assert chinchilla_loss(1e30, 1e30) == pytest.approx(1.8691, abs=1e-4)   # E, the irreducible loss


def test_excess_parameters_saturate() -> None:
    U = 1e9
    u_n = data_optimal_params(U)
    assert effective_params(u_n / 2, U) == u_n / 2 and effective_params(u_n, U) == pytest.approx(u_n)
    assert effective_params(1e15, U) == pytest.approx(u_n * (1 + 5.309743), rel=1e-9)
    assert effective_params(3 * u_n, U) < 3 * u_n and effective_params(5e9, None) == 5e9


def test_effective_tokens_hand_values() -> None:
    U = 350e6
    assert effective_tokens(100e6, U) == 100e6                      # under one epoch: all fresh
    assert effective_tokens(U, U) == U                              # continuous at one epoch
    # 2 epochs: R = 1 -> 1 + 15.388·(1 − e^(−1/15.388)) = 1.968199
    assert effective_tokens(2 * U, U) / U == pytest.approx(1.968199, rel=1e-5)
    # 4 epochs: R = 3 -> 1 + 15.388·(1 − e^(−3/15.388)) = 3.725673, 93% of fresh: "about as good as new data"
    assert effective_tokens(4 * U, U) / U == pytest.approx(3.725673, rel=1e-5)
    # 34 epochs (the guide's run): worth only ~14.6 epochs of fresh data
    assert effective_tokens(34 * U, U) / U == pytest.approx(1 + R_STAR_D * (1 - math.exp(-33 / R_STAR_D)), rel=1e-12)
    assert effective_tokens(34 * U, U) / U == pytest.approx(14.586, abs=1e-3)
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
