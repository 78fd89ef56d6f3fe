"""Samplers against their definitions: support, exact nucleus, and Monte-Carlo distribution checks."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from primitives import sampling as S

LOGITS = jnp.array([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])


def _counts(tokens, v):
    return np.bincount(np.asarray(tokens).ravel(), minlength=v)


def _chi2_pvalue(counts, probs):
    probs = np.asarray(probs, np.float64)
    probs = probs / probs.sum()
    keep = probs > 0
    assert counts[~keep].sum() == 0, "sampled a token outside the support"
    return stats.chisquare(counts[keep], counts.sum() * probs[keep]).pvalue


def test_greedy_is_argmax_and_ignores_key():
    logits = jax.random.normal(jax.random.key(0), (4, 3, 10))
    np.testing.assert_array_equal(S.greedy(logits), np.argmax(np.asarray(logits), -1))
    assert S.greedy(logits, jax.random.key(1)).dtype == jnp.int32


def test_temperature_sample_matches_softmax():
    n = 40_000
    keys = jax.random.split(jax.random.key(0), n)
    toks = jax.vmap(lambda k: S.temperature_sample(LOGITS, k, temperature=0.7))(keys)
    probs = np.asarray(jax.nn.softmax(LOGITS / 0.7), np.float64)
    # Fixed seed; a correct sampler fails this with probability 1e-4.
    assert _chi2_pvalue(_counts(toks, 6), probs) > 1e-4


def test_top_k_support_and_distribution():
    n = 30_000
    keys = jax.random.split(jax.random.key(1), n)
    toks = jax.vmap(lambda k: S.top_k_sample(LOGITS, k, k=3))(keys)
    p = np.exp(np.asarray(LOGITS[:3], np.float64))
    probs = np.concatenate([p / p.sum(), np.zeros(3)])
    assert _chi2_pvalue(_counts(toks, 6), probs) > 1e-4


def brute_force_nucleus(logits, p):
    probs = np.exp(logits - logits.max())
    probs /= probs.sum()
    order = np.argsort(-probs, kind="stable")
    kept, mass = [], 0.0
    for i in order:
        kept.append(i)
        mass += probs[i]
        if mass >= p:
            break
    return set(kept)


@pytest.mark.parametrize("p", [0.1, 0.5, 0.8, 0.95, 1.0])
def test_top_p_keeps_the_smallest_nucleus(p):
    rng = np.random.default_rng(0)
    for _ in range(20):
        logits = rng.normal(size=12) * 2
        kept = set(np.flatnonzero(np.isfinite(np.asarray(S.top_p_logits(jnp.asarray(logits), p)))))
        assert kept == brute_force_nucleus(logits, p)


def test_top_p_sample_distribution():
    n = 30_000
    keys = jax.random.split(jax.random.key(2), n)
    toks = jax.vmap(lambda k: S.top_p_sample(LOGITS, k, p=0.8))(keys)
    kept = sorted(brute_force_nucleus(np.asarray(LOGITS, np.float64), 0.8))
    probs = np.zeros(6)
    probs[kept] = np.exp(np.asarray(LOGITS, np.float64)[kept])
    probs /= probs.sum()
    assert _chi2_pvalue(_counts(toks, 6), probs) > 1e-4


def test_sampler_log_probs_describe_what_it_samples():
    sampler = S.Sampler(temperature=0.5, top_k=4, top_p=0.9)
    lp = np.asarray(sampler.log_probs(LOGITS), np.float64)
    assert np.isclose(np.exp(lp).sum(), 1.0, atol=1e-6)
    n = 30_000
    toks = jax.vmap(lambda k: sampler(LOGITS, k))(jax.random.split(jax.random.key(3), n))
    assert _chi2_pvalue(_counts(toks, 6), np.exp(lp)) > 1e-4
    greedy = S.Sampler()
    assert int(greedy(LOGITS, jax.random.key(0))) == 0
    np.testing.assert_allclose(np.exp(greedy.log_probs(LOGITS)), np.eye(6)[0])
    assert hash(S.Sampler(top_k=2, temperature=1.0)) == hash(S.Sampler(top_k=2, temperature=1.0))


@pytest.mark.parametrize("call, match", [
    (lambda: S.temperature_sample(LOGITS, jax.random.key(0), temperature=0.0), "temperature must be > 0"),
    (lambda: S.top_k_logits(LOGITS, 0), "k must be in"),
    (lambda: S.top_p_logits(LOGITS, 1.5), "p must be in"),
    (lambda: S.Sampler(temperature=-1.0), "temperature must be >= 0"),
    (lambda: S.Sampler(top_p=0.0), "top_p must be in"),
])
def test_bad_options_raise(call, match):
    with pytest.raises(ValueError, match=match):
        call()
