"""Small learner and evaluation of the active-learning loop: balanced accuracy against sklearn, the labels-to-reach
interpolation and the saving on synthetic monotone curves (closed forms), and the vmapped head training."""

from __future__ import annotations

import jax
import numpy as np
import pytest
import sklearn.metrics

from algorithms.active_learning import learner


def test_balanced_accuracy_is_macro_recall():
    rng = np.random.default_rng(0)
    t = rng.integers(0, 4, 200)
    p = np.where(rng.random(200) < 0.7, t, rng.integers(0, 4, 200))
    assert learner.balanced_accuracy(t, p, 4) == pytest.approx(sklearn.metrics.balanced_accuracy_score(t, p))


def test_labels_to_reach_and_saving_on_linear_curves():
    b = np.arange(0, 501, 50)
    slow = 0.5 + 0.001 * b          # reaches 0.6 at 100 labels
    fast = 0.5 + 0.002 * b          # reaches 0.6 at 50 labels
    assert learner.labels_to_reach(b, slow, 0.6) == pytest.approx(100.0)
    assert learner.labels_to_reach(b, slow, 0.625) == pytest.approx(125.0)   # interpolated
    assert learner.labels_to_reach(b, fast, 0.4) == 0.0
    assert learner.labels_to_reach(b, slow, 1.5) == float("inf")
    assert learner.annotation_saving(b, fast, slow, 0.7) == pytest.approx(0.5)
    assert learner.annotation_saving(b, slow, fast, 0.7) == pytest.approx(-1.0)
    assert learner.annotation_saving(b, slow, fast, 1.2) == float("-inf")
    assert np.isnan(learner.annotation_saving(b, slow, fast, 2.0))
    # a dip does not count as un-reaching: the running maximum is used
    assert learner.labels_to_reach([0, 1, 2, 3], [0.1, 0.7, 0.5, 0.8], 0.6) == pytest.approx(5 / 6)


def test_fit_heads_learns_weighted_labels_and_ignores_unlabeled():
    rng = np.random.default_rng(0)
    n, d, k = 120, 5, 3
    centers = rng.normal(size=(k, d)) * 4
    y = rng.integers(0, k, n)
    x = (centers[y] + rng.normal(size=(n, d))).astype(np.float32)
    w = np.zeros((2, n))
    w[:, :40] = 1.0
    labels = np.stack([y, np.where(np.arange(n) < 40, y, (y + 1) % k)])  # run 1 differs only where w = 0
    keys = jax.random.split(jax.random.key(0), 2)
    keys = jax.numpy.stack([keys[0], keys[0]])
    g, params = learner.fit_heads(x, labels, w, keys, num_classes=k, hidden=8, steps=150)
    probs = np.asarray(learner.predict_probs(g, params, x))
    assert probs.shape == (2, n, k)
    np.testing.assert_allclose(probs[0], probs[1], atol=1e-6)
    assert np.mean(probs[0].argmax(1) == y) > 0.95
    np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-5)
    # per-run inputs equal to the shared ones give the same heads
    g2, params2 = learner.fit_heads(np.stack([x, x]), labels, w, keys, num_classes=k, hidden=8, steps=150)
    probs2 = np.asarray(learner.predict_probs(g2, params2, np.stack([x, x])))
    np.testing.assert_allclose(probs2, probs, atol=1e-5)
    logits, feats = learner.features(g, params, x)
    assert feats.shape == (2, n, 8) and np.all(np.asarray(feats) >= 0)


def test_bad_input_names_the_argument():
    with pytest.raises(ValueError, match=r"labels and weights must both have shape \(R, 4\)"):
        learner.fit_heads(np.zeros((4, 2)), np.zeros((1, 3), int), np.zeros((1, 3)), jax.random.split(
            jax.random.key(0), 1), num_classes=2)
    with pytest.raises(ValueError, match=r"budgets must be increasing"):
        learner.labels_to_reach([0, 0, 1], [0.1, 0.2, 0.3], 0.2)
