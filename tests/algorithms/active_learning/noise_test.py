"""Annotator noise model (spec vision_weights_envs.md 6(e)): flip rate within a binomial tolerance from the count,
flips never map to the same class, the flip target distribution, determinism per seed."""

from __future__ import annotations

import math

import numpy as np
import pytest

from algorithms.active_learning import noise


@pytest.mark.parametrize("rate", [0.05, 0.2])
@pytest.mark.parametrize("kind", ["symmetric", "pair"])
def test_flip_rate_matches_configured_rate(rate, kind):
    n, k = 20000, 5
    y = np.random.default_rng(0).integers(0, k, n)
    out = noise.noisy_annotations(y, rate, num_classes=k, kind=kind, rng=np.random.default_rng(1))
    flips = int(np.sum(out != y))
    assert abs(flips - n * rate) <= 4.5 * math.sqrt(n * rate * (1 - rate)), (flips, n * rate)
    changed = out[out != y] - y[out != y]
    if kind == "pair":
        assert np.all((y[out != y] + 1) % k == out[out != y])
    else:
        # Symmetric: each of the K - 1 other classes gets ~1/(K - 1) of the flips.
        off = (out[out != y] - y[out != y]) % k
        cnt = np.bincount(off, minlength=k)
        assert cnt[0] == 0
        e = flips / (k - 1)
        assert np.all(np.abs(cnt[1:] - e) <= 4.5 * math.sqrt(e)), cnt
    assert np.all(changed != 0)


def test_limits_and_determinism():
    y = np.arange(10) % 4
    assert np.array_equal(noise.noisy_annotations(y, 0.0, num_classes=4, rng=np.random.default_rng(0)), y)
    assert np.all(noise.noisy_annotations(y, 1.0, num_classes=4, rng=np.random.default_rng(0)) != y)
    a = noise.noisy_annotations(y, 0.3, num_classes=4, rng=np.random.default_rng(7))
    b = noise.noisy_annotations(y, 0.3, num_classes=4, rng=np.random.default_rng(7))
    assert np.array_equal(a, b)
    t = noise.transition_matrix(4, 0.3)
    np.testing.assert_allclose(t.sum(1), 1.0)
    np.testing.assert_allclose(np.diag(t), 0.7)
    np.testing.assert_allclose(t[0, 1:], 0.1)


def test_custom_transition_matrix_frequencies():
    t = np.array([[0.5, 0.3, 0.2], [0.0, 1.0, 0.0], [0.1, 0.1, 0.8]])
    n = 30000
    out = noise.flip_labels(np.zeros(n, np.int64), t, rng=np.random.default_rng(3))
    freq = np.bincount(out, minlength=3)
    assert np.all(np.abs(freq - n * t[0]) <= 4.5 * np.sqrt(n * t[0] * (1 - t[0]))), freq


@pytest.mark.parametrize("call,match", [
    (lambda: noise.transition_matrix(3, 1.5), r"rate must be a flip probability in \[0, 1\], got 1.5"),
    (lambda: noise.transition_matrix(1, 0.1), r"num_classes must be an integer >= 2, got 1"),
    (lambda: noise.transition_matrix(3, 0.1, kind="blur"), r"kind must be one of .*got 'blur'"),
    (lambda: noise.flip_labels(np.array([0, 3]), np.eye(3), rng=np.random.default_rng(0)),
     r"labels must lie in \[0, 3\), got range \[0, 3\]"),
    (lambda: noise.flip_labels(np.array([0]), np.ones((2, 2)), rng=np.random.default_rng(0)),
     r"transition must be a square row-stochastic matrix"),
])
def test_bad_input_names_the_argument(call, match):
    with pytest.raises(ValueError, match=match):
        call()
