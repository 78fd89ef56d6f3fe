"""Bad input to the models gets a clear error naming the argument (issue 26, section 1).

One table of (call, exception type, message regex); every message here is one the code produces.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from models.transformer import AttentionConfig, FFDConfig, MoEConfig, Transformer, TransformerConfig

SIZES = dict(vocab_size=11, d_model=16, num_layers=1, num_heads=2, num_kv_heads=1, d_ff=32)


def config(**overrides) -> TransformerConfig:
    return TransformerConfig(**{**SIZES, **overrides})


@functools.cache
def model() -> Transformer:
    return Transformer(config(), rngs=nnx.Rngs(0))


CASES = [
    # Sizes must be ints: a float would fail later inside JAX (or silently truncate).
    pytest.param(lambda: config(vocab_size=32.5), TypeError,
                 r"TransformerConfig\.vocab_size must be an int; got 32\.5 \(float\)", id="config-float-vocab_size"),
    pytest.param(lambda: config(d_model=16.0), TypeError,
                 r"TransformerConfig\.d_model must be an int; got 16\.0 \(float\)", id="config-float-d_model"),
    pytest.param(lambda: config(head_dim=np.float32(8)), TypeError,
                 r"TransformerConfig\.head_dim must be an int; got .*8\.0.* \(float32\)", id="config-float-head_dim"),
    pytest.param(lambda: config(num_layers=True), TypeError,
                 r"TransformerConfig\.num_layers must be an int; got True \(bool\)", id="config-bool-num_layers"),
    pytest.param(lambda: config(vocab_size=0), ValueError,
                 r"TransformerConfig\.vocab_size must be >= 1; got 0", id="config-zero-vocab_size"),
    pytest.param(lambda: config(rope_base=float("nan")), ValueError,
                 r"TransformerConfig\.rope_base must be finite; got TransformerConfig\.rope_base=nan",
                 id="config-nan-rope_base"),
    pytest.param(lambda: config(norm_eps=float("inf")), ValueError,
                 r"TransformerConfig\.norm_eps must be finite", id="config-inf-norm_eps"),
    # The nested sections check their own fields; messages name the dotted path.
    pytest.param(lambda: FFDConfig(delta=float("nan")), ValueError,
                 r"attention\.ffd\.delta must not be NaN", id="config-nan-ffd-delta"),
    pytest.param(lambda: FFDConfig(page_size=16.0), TypeError,
                 r"attention\.ffd\.page_size must be an int; got 16\.0 \(float\)", id="config-float-ffd-page_size"),
    pytest.param(lambda: FFDConfig(kept_fraction=0.0), ValueError,
                 r"attention\.ffd\.kept_fraction must be in \(0, 1\]; got 0\.0", id="config-zero-ffd-kept_fraction"),
    pytest.param(lambda: FFDConfig(gather_fraction=1.5), ValueError,
                 r"attention\.ffd\.gather_fraction must be in \(0, 1\]; got 1\.5", id="config-ffd-gather_fraction"),
    pytest.param(lambda: FFDConfig(residual_dtype="float16"), ValueError,
                 r"attention\.ffd\.residual_dtype must be one of \('float32', 'bfloat16', 'float8_e4m3fn'\); "
                 r"got 'float16'", id="config-ffd-residual_dtype"),
    pytest.param(lambda: AttentionConfig(decode="sparse"), ValueError,
                 r"attention\.decode must be one of \('dense', 'kernel', 'ffd'\); got 'sparse'",
                 id="config-attention-decode"),
    pytest.param(lambda: config(attention=AttentionConfig(kv_layout="sbkd")), ValueError,
                 r"attention\.kv_layout must be None or one of", id="config-attention-kv_layout"),
    pytest.param(lambda: config(ffn_type="moe", moe=MoEConfig(num_experts=2, experts_per_token=3)), ValueError,
                 r"moe\.experts_per_token must be in \[1, moe\.num_experts=2\]; got 3", id="config-moe-top_k"),
    pytest.param(lambda: MoEConfig(load_balance_weight=float("nan")), ValueError,
                 r"moe\.load_balance_weight must be finite", id="config-nan-moe-load_balance_weight"),
    pytest.param(lambda: config(attention={"decode": "ffd"}), TypeError,
                 r"TransformerConfig\.attention must be of type AttentionConfig; got dict", id="config-attention-type"),
    # Token ids against the vocabulary, and their dtype.
    pytest.param(lambda: model()(jnp.array([[1, 11]])), ValueError,
                 r"tokens must be token ids in \[0, vocab_size=11\); got max 11", id="call-token-over-vocab"),
    pytest.param(lambda: model()(jnp.array([[-1, 2]])), ValueError,
                 r"tokens must be token ids in \[0, vocab_size=11\); got min -1", id="call-negative-token"),
    pytest.param(lambda: model()(jnp.array([[1.0, 2.0]])), TypeError,
                 r"tokens must be an integer array \(token ids\); got dtype float32", id="call-float-tokens"),
    pytest.param(lambda: model()(jnp.zeros((2, 3, 1), jnp.int32)), ValueError,
                 r"tokens must be \[b, t\]; got shape \(2, 3, 1\)", id="call-tokens-rank"),
    pytest.param(lambda: model()(jnp.zeros((1, 3), jnp.int32), positions=jnp.arange(4)), ValueError,
                 r"positions must have shape \[t\]=\(3,\) or \[b, t\]=\(1, 3\); got \(4,\)", id="call-positions"),
]


@pytest.mark.parametrize("call, exc, message", CASES)
def test_bad_input_raises_a_clear_error(call, exc, message):
    with pytest.raises(exc, match=message):
        call()


def test_traced_tokens_are_not_range_checked_but_dtype_is():
    """Inside nnx.jit the ids are traced (documented): only the dtype is checked at trace time."""
    step = nnx.jit(lambda m, x: m(x).logits)
    assert step(model(), jnp.array([[1, 2]])).shape == (1, 2, 11)
    with pytest.raises(TypeError, match="tokens must be an integer array"):
        step(model(), jnp.array([[1.0, 2.0]]))
