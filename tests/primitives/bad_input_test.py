"""Bad input to the primitives gets a clear error naming the argument (issue 26, section 1).

One table of (call, exception type, message regex); every message here is one the code produces.
Values (token ids, lengths, NaN) are checked when concrete; the last tests pin down what the
docstrings promise under `jit` (no check) and property-test the shared checks with hypothesis.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.decode_attention import decode_attention as kernel_decode_attention
from primitives import attention as A
from primitives import conformal, drift_diffusion, kmeans, policy_losses, quantization, sampling, validation

NAN, INF = float("nan"), float("inf")
Q = jnp.ones((2, 3, 4, 8))  # [b, t, h, d]
KV = jnp.ones((2, 5, 2, 8))  # [b, s, k, d], s = 5
QD = jnp.ones((2, 4, 8))  # decode query [b, h, d]
CACHE_BKSD = jnp.ones((2, 2, 5, 8))  # [b, k, s, d], capacity 5

CASES = [
    # attention: lengths against the key count, positions of the wrong length.
    pytest.param(lambda: A.attention(Q, KV, KV, kv_lengths=jnp.array([3, -1])), ValueError,
                 r"kv_lengths must lie in \[0, capacity=5\]; got min -1", id="attention-negative-kv_lengths"),
    pytest.param(lambda: A.attention(Q, KV, KV, kv_lengths=np.array([3, 6])), ValueError,
                 r"kv_lengths must lie in \[0, capacity=5\]; got max 6", id="attention-kv_lengths-over-s"),
    pytest.param(lambda: A.attention(Q, KV, KV, causal=True, q_positions=jnp.arange(4)), ValueError,
                 r"q_positions must have shape \[t\]=\(3,\) or \[b, t\]=\(2, 3\); got \(4,\)", id="attention-q_positions"),
    pytest.param(lambda: A.attention(Q, KV, KV, causal=True, kv_positions=jnp.zeros((2, 4), jnp.int32)),
                 ValueError, r"kv_positions must have shape \[s\]=\(5,\) or \[b, s\]=\(2, 5\); got \(2, 4\)",
                 id="attention-kv_positions"),
    pytest.param(lambda: A.rope(Q, jnp.arange(4)), ValueError,
                 r"positions must have shape \[t\]=\(3,\) or \[b, t\]=\(2, 3\); got \(4,\)", id="rope-positions"),
    # decode attention: lengths against the cache capacity in either layout.
    pytest.param(lambda: A.decode_attention(QD, KV, KV, jnp.array([6, 1])), ValueError,
                 r"lengths must lie in \[0, capacity=5\]; got max 6", id="decode-lengths-over-capacity-bskd"),
    pytest.param(lambda: A.decode_attention(QD, CACHE_BKSD, CACHE_BKSD, jnp.array([5, -1]), kv_layout="bksd"),
                 ValueError, r"lengths must lie in \[0, capacity=5\]; got min -1", id="decode-negative-lengths-bksd"),
    pytest.param(lambda: kernel_decode_attention(QD, CACHE_BKSD, CACHE_BKSD, jnp.array([6, 1]), kv_layout="bksd",
                                                 implementation="xla"),
                 ValueError, r"lengths must lie in \[0, capacity=5\]; got max 6", id="kernel-decode-lengths"),
    pytest.param(lambda: kernel_decode_attention(QD, KV, KV, jnp.array([-2, 1]), implementation="xla"),
                 ValueError, r"lengths must lie in \[0, capacity=5\]; got min -2", id="kernel-decode-negative"),
    # sampling: non-finite hyper-parameters, empty vocabulary.
    pytest.param(lambda: sampling.Sampler(temperature=NAN), ValueError,
                 r"temperature must be finite; got temperature=nan", id="sampler-nan-temperature"),
    pytest.param(lambda: sampling.Sampler(temperature=INF), ValueError,
                 r"temperature must be finite; got temperature=inf", id="sampler-inf-temperature"),
    pytest.param(lambda: sampling.Sampler(temperature=1.0, top_p=NAN), ValueError,
                 r"top_p must be finite; got top_p=nan", id="sampler-nan-top_p"),
    pytest.param(lambda: sampling.Sampler(temperature=1.0, top_k=2.5), TypeError,
                 r"top_k must be an int; got 2.5 \(float\)", id="sampler-float-top_k"),
    pytest.param(lambda: sampling.temperature_sample(jnp.zeros((2, 3)), jax.random.key(0), temperature=INF),
                 ValueError, r"temperature must be finite; got temperature=inf", id="temperature_sample-inf"),
    pytest.param(lambda: sampling.greedy(jnp.zeros((2, 0))), ValueError,
                 r"logits must be \[\.\.\., v\] with a non-empty vocabulary v >= 1; got shape \(2, 0\)",
                 id="greedy-empty-vocab"),
    pytest.param(lambda: sampling.Sampler()(jnp.zeros((2, 0)), jax.random.key(0)), ValueError,
                 r"non-empty vocabulary v >= 1; got shape \(2, 0\)", id="sampler-empty-vocab"),
    # conformal: NaN scores, mismatched calibration arrays named by their public names.
    pytest.param(lambda: conformal.conformal_quantile(jnp.array([1.0, NAN, 2.0]), 0.1), ValueError,
                 r"scores must not contain NaN; got 1 NaN of 3 \(first at index 1\)", id="conformal-nan-scores"),
    pytest.param(lambda: conformal.split_conformal_interval(jnp.zeros(9), jnp.zeros(8), jnp.zeros(2), alpha=0.1),
                 ValueError, r"cal_pred, cal_y must have the same shape; got \{'cal_pred': \(9,\), 'cal_y': \(8,\)\}",
                 id="split-conformal-mismatch"),
    pytest.param(lambda: conformal.split_conformal_interval(jnp.zeros(3), jnp.array([0.0, NAN, 1.0]), jnp.zeros(2),
                                                            alpha=0.1),
                 ValueError, r"cal_y must not contain NaN", id="split-conformal-nan"),
    pytest.param(lambda: conformal.cqr_interval(jnp.zeros(4), jnp.zeros(3), jnp.zeros(4), jnp.zeros(1), jnp.zeros(1),
                                                alpha=0.1),
                 ValueError, r"cal_lo, cal_hi, cal_y must have the same shape", id="cqr-mismatch"),
    # quantization: one inf would wipe its group.
    pytest.param(lambda: quantization.quantize(jnp.array([1.0, INF, 2.0, 3.0]), bits=4, group_size=4), ValueError,
                 r"x must be finite; got 1 non-finite entry \(first at index \(1,\): inf\)", id="quantize-inf"),
    pytest.param(lambda: quantization.quantize_codes(jnp.full((2, 4), NAN), bits=8, group_size=2), ValueError,
                 r"x must be finite; got 8 non-finite entries \(first at index \(0, 0\): nan\)", id="quantize-nan"),
    # kmeans: zero points.
    pytest.param(lambda: kmeans.kmeans(jnp.zeros((0, 3)), jax.random.key(0), num_centroids=2), ValueError,
                 r"x must hold at least one point per group \(s >= 1\); got shape \(0, 3\)", id="kmeans-no-points"),
    # token_logprobs: ids against the vocabulary, float ids.
    pytest.param(lambda: policy_losses.token_logprobs(jnp.zeros((2, 5)), jnp.array([1, 5])), ValueError,
                 r"tokens must be token ids in \[0, vocab_size=5\); got max 5", id="token_logprobs-over-vocab"),
    pytest.param(lambda: policy_losses.token_logprobs(jnp.zeros((2, 5)), jnp.array([-1, 0])), ValueError,
                 r"tokens must be token ids in \[0, vocab_size=5\); got min -1", id="token_logprobs-negative"),
    pytest.param(lambda: policy_losses.token_logprobs(jnp.zeros((2, 5)), jnp.array([1.0, 2.0])), TypeError,
                 r"tokens must be an integer array \(token ids\); got dtype float32", id="token_logprobs-float"),
    pytest.param(lambda: policy_losses.token_logprobs(jnp.zeros((2, 5)), jnp.array([1, 2]), temperature=NAN),
                 ValueError, r"temperature must be finite; got temperature=nan", id="token_logprobs-nan-temperature"),
    # drift diffusion: threshold and scale must be finite and > 0.
    pytest.param(lambda: drift_diffusion.ig_pdf(1.0, -1.0, 0.5, 0.0), ValueError,
                 r"a must be finite and > 0; got a=-1.0", id="ig_pdf-negative-a"),
    pytest.param(lambda: drift_diffusion.ig_pdf(1.0, 1.0, 0.5, 0.0), ValueError,
                 r"sigma must be finite and > 0; got sigma=0.0", id="ig_pdf-zero-sigma"),
    pytest.param(lambda: drift_diffusion.ig_cdf(jnp.ones(3), 1.0, NAN, 1.0), ValueError,
                 r"mu must be finite; got mu=nan", id="ig_cdf-nan-mu"),
    pytest.param(lambda: drift_diffusion.ig_mass(jnp.array([1.0, 0.0]), 0.5, 1.0), ValueError,
                 r"a must be finite and > 0; got a=\[1\. 0\.\]", id="ig_mass-zero-a"),
    # the shared checks themselves.
    pytest.param(lambda: validation.check_int("n", True), TypeError, r"n must be an int; got True \(bool\)",
                 id="check_int-bool"),
    pytest.param(lambda: validation.check_positive_finite("sigma", NAN), ValueError,
                 r"sigma must be a finite number > 0; got sigma=nan", id="check_positive_finite-nan"),
]


@pytest.mark.parametrize("call, exc, message", CASES)
def test_bad_input_raises_a_clear_error(call, exc, message):
    with pytest.raises(exc, match=message):
        call()


def test_good_input_still_passes():
    out = A.attention(Q, KV, KV, causal=True, q_positions=jnp.arange(3) + 2, kv_lengths=jnp.array([5, 0]))
    assert out.shape == Q.shape
    assert A.decode_attention(QD, CACHE_BKSD, CACHE_BKSD, jnp.array([5, 0]), kv_layout="bksd").shape == QD.shape
    assert float(drift_diffusion.ig_pdf(jnp.array(1.0), 1.0, -0.5, 1.0)) > 0
    assert conformal.conformal_quantile(jnp.array([1.0, INF, 2.0]), 0.5) == 2.0  # inf scores are allowed


def test_traced_values_are_not_checked_as_documented():
    """Inside jit the lengths are traced: a length above s reads as all keys, a negative one as none."""
    f = jax.jit(lambda n: A.attention(Q, KV, KV, kv_lengths=n, return_lse=True))
    out = f(jnp.array([7, -1]))
    np.testing.assert_allclose(out.out[0], A.attention(Q, KV, KV)[0])
    assert bool(jnp.all(out.lse[1] == -jnp.inf)) and bool(jnp.all(out.out[1] == 0))
    # Static shapes are still checked at trace time.
    with pytest.raises(ValueError, match="q_positions must have shape"):
        jax.jit(lambda p: A.attention(Q, KV, KV, causal=True, q_positions=p))(jnp.arange(4))


hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings, strategies as st  # noqa: E402
from hypothesis.extra import numpy as hnp  # noqa: E402

_SETTINGS = settings(max_examples=60, deadline=None)
_INTS = hnp.arrays(np.int64, hnp.array_shapes(min_dims=1, max_dims=2, max_side=6),
                   elements=st.integers(-5, 40))


@_SETTINGS
@given(ids=_INTS, vocab=st.integers(1, 40))
def test_check_token_ids_raises_iff_an_id_is_out_of_range(ids, vocab):
    bad = bool(np.any((ids < 0) | (ids >= vocab)))
    if bad:
        with pytest.raises(ValueError, match=r"ids must be token ids in \[0, vocab_size="):
            validation.check_token_ids("ids", ids, vocab)
    else:
        validation.check_token_ids("ids", ids, vocab)


@_SETTINGS
@given(lengths=_INTS, capacity=st.integers(0, 40))
def test_check_lengths_raises_iff_a_length_is_outside_capacity(lengths, capacity):
    if np.any((lengths < 0) | (lengths > capacity)):
        with pytest.raises(ValueError, match=r"n must lie in \[0, capacity="):
            validation.check_lengths("n", lengths, capacity)
    else:
        validation.check_lengths("n", lengths, capacity)


@_SETTINGS
@given(x=hnp.arrays(np.float64, hnp.array_shapes(max_dims=2, max_side=5),
                    elements=st.floats(allow_nan=True, allow_infinity=True)))
def test_check_finite_raises_iff_an_entry_is_not_finite(x):
    if np.all(np.isfinite(x)):
        validation.check_finite("x", x)
    else:
        with pytest.raises(ValueError, match=r"x must be finite; got"):
            validation.check_finite("x", x)


@_SETTINGS
@given(scores=hnp.arrays(np.float32, st.integers(1, 12), elements=st.floats(-10, 10, width=32)),
       where=st.integers(0, 11), alpha=st.floats(0.0, 1.0))
def test_conformal_quantile_never_counts_a_nan(scores, where, alpha):
    q = float(conformal.conformal_quantile(scores, alpha))
    assert not np.isnan(q)
    scores = scores.copy()
    scores[where % scores.size] = np.nan
    with pytest.raises(ValueError, match="scores must not contain NaN"):
        conformal.conformal_quantile(scores, alpha)
