"""Predicted loss for ranking runs: the Chinchilla parametric fit and data repetition.

- Hoffmann et al. 2022 ("Training Compute-Optimal Large Language Models", approach 3):
  L(N, D) = E + A/N^α + B/D^β with E=1.69, A=406.4, B=410.7, α=0.34, β=0.28, where N is
  the total parameter count (embeddings included, as in the paper) and D the training tokens.
- Muennighoff et al. 2023 ("Scaling Data-Constrained Language Models", eq. 5): with U unique
  tokens seen for D ≥ U tokens, R = D/U − 1 repetitions are worth
  D' = U + U·R*·(1 − exp(−R/R*)) fresh tokens, R* ≈ 15.4. D' = D for D ≤ U; D' → U·(1 + R*)
  however long the run. Their matching discount on excess parameters (eq. 6) is applied
  too: with U_N = U/20 the Chinchilla-optimal size for the unique data, a model of N > U_N
  parameters is worth N' = U_N + U_N·R*_N·(1 − exp(−(N/U_N − 1)/R*_N)), R*_N ≈ 5.3. Without
  it the fit rewards ever bigger models on a small dataset.

Use the numbers to rank choices against each other, not as absolute losses of a run on
your data and tokenizer (DESIGN.md s5).
"""

from __future__ import annotations

import math

E = 1.69
A = 406.4
B = 410.7
ALPHA = 0.34
BETA = 0.28
R_STAR_D = 15.4            # Muennighoff et al. 2023: decay constant of repeated-data value
R_STAR_N = 5.3             # Muennighoff et al. 2023: decay constant of excess-parameter value
TOKENS_PER_PARAM = 20.0    # Chinchilla's compute-optimal rule of thumb


def effective_tokens(tokens: float, unique_tokens: float | None) -> float:
    """Muennighoff's D': the fresh-data equivalent of `tokens` drawn from `unique_tokens`."""
    if unique_tokens is None or tokens <= unique_tokens:
        return float(tokens)
    repeats = tokens / unique_tokens - 1.0
    return unique_tokens + unique_tokens * R_STAR_D * (1.0 - math.exp(-repeats / R_STAR_D))


def effective_params(n_params: float, unique_tokens: float | None) -> float:
    """Muennighoff's N': parameters beyond the compute-optimal size for the unique data decay."""
    if unique_tokens is None:
        return float(n_params)
    u_n = unique_tokens / TOKENS_PER_PARAM
    if n_params <= u_n:
        return float(n_params)
    excess = n_params / u_n - 1.0
    return u_n + u_n * R_STAR_N * (1.0 - math.exp(-excess / R_STAR_N))


def chinchilla_loss(n_params: float, tokens: float) -> float:
    """L(N, D) of the Chinchilla fit, in nats per token."""
    return E + A / n_params**ALPHA + B / tokens**BETA


def predicted_loss(n_params: float, tokens: float, unique_tokens: float | None = None) -> float:
    """L(N', D'): repeats and excess parameters discounted when the dataset is given."""
    return chinchilla_loss(effective_params(n_params, unique_tokens), effective_tokens(tokens, unique_tokens))


def chinchilla_distance(tokens_per_param: float) -> float:
    """How far a run is from 20 tokens/param, symmetric in ratio: |ln(tpp / 20)|."""
    return abs(math.log(max(tokens_per_param, 1e-12) / TOKENS_PER_PARAM))
