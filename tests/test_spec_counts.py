"""Exact parameter counts against published figures, and FLOPs against the PaLM formula."""

import pytest

from planner.counts import flops_per_token, matmul_params, n_params, param_counts
from planner.spec import ModelSpec, nanochat, preset, style_spec

# Published counts: nanochat README/code (d20, d32), HF GPT-2 model cards, Meta Llama configs.
PUBLISHED = {
    "d20": 560_988_160,
    "d32": 1_879_048_192,
    "gpt2": 124_439_808,
    "gpt2-medium": 354_823_168,
    "gpt2-large": 774_030_080,
    "gpt2-xl": 1_557_611_200,
    "llama3.2-1b": 1_235_814_400,
    "llama3.1-8b": 8_030_261_248,
}


@pytest.mark.parametrize("name,count", PUBLISHED.items())
def test_published_counts(name: str, count: int) -> None:
    assert n_params(preset(name)) == count


def test_nanochat_formula_12Ld2_plus_2Vd() -> None:
    for depth in (4, 12, 20, 26, 32, 64):
        s = nanochat(depth)
        d = 64 * depth
        assert n_params(s) == 12 * depth * d * d + 2 * 65536 * d


def test_guide_examples_are_wrong() -> None:
    # "depth 64, dim 4096 = ~4.3B": really 12.9B in the blocks alone (docs/sources.md §1).
    assert n_params(nanochat(64)) > 12.9e9
    # "1B: n_embd 1536, n_layer 24, vocab 50000" is about 0.76B.
    s = style_spec("gpt2", 24, 1024, 50000).model_copy(update={"d_model": 1536, "n_head": 12, "d_ff": 4 * 1536})
    assert 0.75e9 < n_params(s) < 0.77e9


def test_groups_sum_and_tied_head() -> None:
    g = param_counts(preset("gpt2"))
    assert g.head == 0  # tied
    assert g.total == sum(v for k, v in g.as_dict().items() if k != "total")
    assert param_counts(preset("d20")).norms == 0  # weightless RMSNorm


def test_flops_palm_formula() -> None:
    # PaLM appendix B: 6N + 12·L·H·Q·T, N excluding the input embedding.
    s = nanochat(20)
    L, d, V, T = 20, 1280, 65536, 2048
    n_matmul = 12 * L * d * d + V * d
    assert matmul_params(s) == n_matmul
    assert flops_per_token(s) == 6 * n_matmul + 12 * L * 10 * 128 * T
    # GQA: the attention term uses query heads × head_dim.
    ll = preset("llama3.1-8b")
    assert flops_per_token(ll) - 6 * matmul_params(ll) == 12 * 32 * 32 * 128 * ll.seq_len


@pytest.mark.parametrize("kw,msg", [
    (dict(d_model=100, n_head=3), "not divisible by n_head"),
    (dict(n_head=4, n_kv_head=3), "not divisible by n_kv_head"),
    (dict(n_layer=0), "greater than 0"),
    (dict(d_model=-64), "greater than 0"),
])
def test_invalid_shapes(kw: dict, msg: str) -> None:
    base = dict(n_layer=2, d_model=64, n_head=4, n_kv_head=4, d_ff=256, vocab_size=256, seq_len=32)
    with pytest.raises(ValueError, match=msg):
        ModelSpec(**{**base, **kw})
