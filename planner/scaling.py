"""Predicted loss for ranking runs: one data-constrained scaling law, fitted as a whole.

L(N, D, U) = E + A / N'^α + B / D'^β  (Muennighoff et al. 2023, "Scaling Data-Constrained
Language Models", eq. 5-7), with the constants of their own joint fit (the "Parametric Fit"
of github.com/huggingface/datablations: A = e^6.255414, B = e^7.3049974, E = e^0.6254804,
α = β = 0.3526596, R*_D = 15.387756, R*_N = 5.309743):

- D' = U + U·R*_D·(1 − exp(−R_D/R*_D)), R_D = D/U − 1: repeated tokens are worth less
  than fresh ones; D' = D up to one epoch and D' → U·(1 + R*_D) however long the run.
- N' = U_N + U_N·R*_N·(1 − exp(−R_N/R*_N)), R_N = N/U_N − 1, where U_N is the
  compute-optimal model size for U tokens *under the same fit*: parameters beyond it are
  worth less than the first U_N.

Why this fit and not Hoffmann et al.'s (E=1.69, A=406.4, B=410.7, α=0.34, β=0.28): R*_D
and R*_N were fitted together with these base constants. Hoffmann's approach-3 constants
put the compute-optimal ratio near 50 tokens/param at our scales (Besiroglu et al. 2024
show those estimates are inconsistent with Hoffmann's own approaches 1 and 2), while the
excess-parameter term started at U/20. Between U/50 and U/20 only repeats were penalised,
so less data pushed the search towards bigger models. This fit has α = β, so its
compute-optimal ratio is 1/G² ≈ 19.6 tokens/param at every scale (G below), the
"20 tokens per parameter" rule, and U_N is exactly the point where both discounts start.

Use the numbers to rank choices against each other, not as absolute losses of a run on
your data and tokenizer (the fit is on C4 with the GPT-2 tokenizer).
"""

from __future__ import annotations

import math

E = math.exp(0.6254804)        # 1.869: irreducible loss
A = math.exp(6.255414)         # 520.8
B = math.exp(7.3049974)        # 1487.7
ALPHA = 0.3526596
BETA = 0.3526596
R_STAR_D = 15.387756           # decay constant of the value of repeated tokens
R_STAR_N = 5.309743            # decay constant of the value of excess parameters
# Compute-optimal split of this fit: N_opt = G·(C/6)^(β/(α+β)), D_opt = (C/6)^(α/(α+β))/G.
G = ((ALPHA * A) / (BETA * B)) ** (1.0 / (ALPHA + BETA))
OPTIMAL_TOKENS_PER_PARAM = 1.0 / G**2   # ≈ 19.6 (α = β, so the same at every scale)
TOKENS_PER_PARAM = 20.0                 # Chinchilla's rule of thumb (--objective chinchilla)


def data_optimal_params(unique_tokens: float) -> float:
    """U_N: the compute-optimal model size for `unique_tokens` tokens under this fit."""
    return (unique_tokens * G) ** (BETA / ALPHA) * G


def effective_tokens(tokens: float, unique_tokens: float | None) -> float:
    """D': the fresh-data equivalent of `tokens` drawn from `unique_tokens`."""
    if unique_tokens is None or tokens <= unique_tokens:
        return float(tokens)
    repeats = tokens / unique_tokens - 1.0
    return unique_tokens + unique_tokens * R_STAR_D * (1.0 - math.exp(-repeats / R_STAR_D))


def effective_params(n_params: float, unique_tokens: float | None) -> float:
    """N': parameters beyond U_N, the compute-optimal size for the unique data, are worth less."""
    if unique_tokens is None:
        return float(n_params)
    u_n = data_optimal_params(unique_tokens)
    if n_params <= u_n:
        return float(n_params)
    excess = n_params / u_n - 1.0
    return u_n + u_n * R_STAR_N * (1.0 - math.exp(-excess / R_STAR_N))


def model_term(n_params: float, unique_tokens: float | None = None) -> float:
    """E + A/N'^α: the part of the loss that depends on the model (and the dataset size)."""
    return E + A / effective_params(n_params, unique_tokens) ** ALPHA


def data_term(tokens: float, unique_tokens: float | None = None) -> float:
    """B/D'^β: the part of the loss that depends on the tokens trained on."""
    return B / effective_tokens(tokens, unique_tokens) ** BETA


def chinchilla_loss(n_params: float, tokens: float) -> float:
    """L(N, D) with fresh data only, in nats per token (Chinchilla's functional form)."""
    return E + A / n_params**ALPHA + B / tokens**BETA


def predicted_loss(n_params: float, tokens: float, unique_tokens: float | None = None) -> float:
    """L(N', D'): repeats and excess parameters discounted when the dataset is given."""
    return model_term(n_params, unique_tokens) + data_term(tokens, unique_tokens)


def chinchilla_distance(tokens_per_param: float) -> float:
    """How far a run is from 20 tokens/param, symmetric in ratio: |ln(tpp / 20)|."""
    return abs(math.log(max(tokens_per_param, 1e-12) / TOKENS_PER_PARAM))
