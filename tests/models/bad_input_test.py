"""Bad input to the models gets a clear error naming the argument (issue 26, section 1).

One table of (call, exception type, message regex); every message here is one the code produces.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from models.transformer import Transformer, TransformerConfig

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
