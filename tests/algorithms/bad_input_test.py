"""Bad input to the algorithms gets a clear error naming the argument (issue 26, section 1).

One table of (call, exception type, message regex); every message here is one the code produces.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from algorithms import training
from algorithms.decoding.generate import generate
from algorithms.optimization import gaussian_sup
from models.transformer import Transformer, TransformerConfig
from primitives.sampling import Sampler

CFG = TransformerConfig(vocab_size=11, d_model=16, num_layers=1, num_heads=2, num_kv_heads=1, d_ff=32)
NAN = float("nan")


@functools.cache
def model() -> Transformer:
    return Transformer(CFG, rngs=nnx.Rngs(0))


def _fit(batch_fn):
    return training.fit(model_fn=lambda rngs: Transformer(CFG, rngs=rngs),
                        optimizer_config=training.OptimizerConfig(total_steps=2, warmup_steps=0),
                        batch_fn=batch_fn, num_steps=2, progress=False)


def _batch(**arrays):
    base = {"inputs": np.ones((2, 4), np.int32), "targets": np.ones((2, 4), np.int32),
            "loss_mask": np.ones((2, 4), np.float32)}
    return {k: v for k, v in {**base, **arrays}.items() if v is not None}


CASES = [
    # generate: prompt ids are checked eagerly, before the jitted loop.
    pytest.param(lambda: generate(model(), jnp.array([[1, -2]]), max_new_tokens=2), ValueError,
                 r"prompts must be token ids in \[0, vocab_size=11\); got min -2", id="generate-negative-prompt"),
    pytest.param(lambda: generate(model(), np.array([[1, 11]]), max_new_tokens=2), ValueError,
                 r"prompts must be token ids in \[0, vocab_size=11\); got max 11", id="generate-prompt-over-vocab"),
    pytest.param(lambda: generate(model(), jnp.array([[1.0, 2.0]]), max_new_tokens=2), TypeError,
                 r"prompts must be an integer array \(token ids\); got dtype float32", id="generate-float-prompt"),
    pytest.param(lambda: generate(model(), jnp.array([[1, 2]]), max_new_tokens=2, sampler=Sampler(temperature=NAN)),
                 ValueError, r"temperature must be finite; got temperature=nan", id="generate-nan-temperature"),
    # training: non-finite optimizer hyper-parameters, batches without the keys the loss needs.
    pytest.param(lambda: training.OptimizerConfig(learning_rate=NAN), ValueError,
                 r"learning_rate must be finite; got learning_rate=nan", id="optimizer-nan-lr"),
    pytest.param(lambda: training.OptimizerConfig(learning_rate=float("inf")), ValueError,
                 r"learning_rate must be finite; got learning_rate=inf", id="optimizer-inf-lr"),
    pytest.param(lambda: training.OptimizerConfig(clip_norm=NAN), ValueError,
                 r"clip_norm must be finite; got clip_norm=nan", id="optimizer-nan-clip"),
    pytest.param(lambda: training.OptimizerConfig(b2=NAN), ValueError, r"b2 must be finite; got b2=nan",
                 id="optimizer-nan-b2"),
    pytest.param(lambda: _fit(lambda i: _batch(targets=None)), ValueError,
                 r"batch must have the keys \['inputs', 'targets', 'loss_mask'\] .*missing \['targets'\], "
                 r"got keys \['inputs', 'loss_mask'\]", id="fit-missing-targets"),
    pytest.param(lambda: _fit(lambda i: _batch(inputs=np.full((2, 4), -1, np.int32))), ValueError,
                 r'batch\["inputs"\] must be token ids in >= 0; got min -1', id="fit-negative-inputs"),
    pytest.param(lambda: _fit(lambda i: _batch(targets=np.ones((2, 4), np.float32))), TypeError,
                 r'batch\["targets"\] must be an integer array \(token ids\); got dtype float32', id="fit-float-targets"),
    pytest.param(lambda: training.next_token_loss(model(), _batch(targets=np.full((2, 4), 11, np.int32))),
                 ValueError, r'batch\["targets"\] must be token ids in \[0, vocab_size=11\); got max 11',
                 id="next_token_loss-targets-over-vocab"),
    # gaussian_sup: the PTAS refuses huge grids before allocating them (eps=0.01 used to ask for 7 TiB).
    pytest.param(lambda: gaussian_sup.ptas_single_set(np.zeros(3), 0.01), ValueError,
                 r"Algorithm 1 at eps=0\.01, n=3 would evaluate at least \d+ allocations > max_candidates=5000000",
                 id="ptas-eps-0.01"),
    pytest.param(lambda: gaussian_sup.ptas_single_set(np.zeros(1), 0.01), ValueError,
                 r"Algorithm 1 at eps=0\.01 needs a counting table of eps\^-6 = \d+ entries > max_candidates=5000000",
                 id="ptas-eps-0.01-n1"),
]


@pytest.mark.parametrize("call, exc, message", CASES)
def test_bad_input_raises_a_clear_error(call, exc, message):
    with pytest.raises(exc, match=message):
        call()


def test_good_prompts_still_generate():
    out = generate(model(), jnp.array([[1, 10], [3, 0]]), max_new_tokens=2, prompt_lengths=jnp.array([2, 1]))
    assert out.tokens.shape == (2, 2)


hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings, strategies as st  # noqa: E402


@settings(max_examples=40, deadline=None)
@given(eps=st.floats(0.001, 0.3), n=st.integers(1, 8), max_candidates=st.integers(1, 20_000))
def test_ptas_refuses_or_runs_without_allocating_the_grid_first(eps, n, max_candidates):
    """A refused instance raises at once (no eps^-3 grid, no eps^-6 table is built), whatever eps."""
    try:
        res = gaussian_sup.ptas_single_set(np.zeros(n), eps, max_candidates=max_candidates)
    except ValueError as e:
        assert "max_candidates" in str(e)
    else:
        assert res.num_candidates <= max_candidates
