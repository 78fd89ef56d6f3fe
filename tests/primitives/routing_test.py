"""Routing primitives against float64 numpy brute force; dispatch round trips; shift invariance."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from primitives import routing as R


def _np_softmax(z):
    z = np.asarray(z, np.float64)
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _logits(shape, seed=0, scale=2.0):
    return scale * jax.random.normal(jax.random.key(seed), shape, jnp.float32)


def test_router_logits_zero_bias_is_bitwise_identity_and_bias_adds():
    x = jax.random.normal(jax.random.key(1), (3, 5, 8))
    w = jax.random.normal(jax.random.key(2), (8, 6))
    base = R.router_logits(x, w)
    np.testing.assert_array_equal(R.router_logits(x, w, jnp.zeros(6)), base)
    bias = jnp.arange(6.0)
    np.testing.assert_allclose(R.router_logits(x, w, bias), np.asarray(x, np.float64) @ np.asarray(w) + np.arange(6.0),
                               rtol=1e-5, atol=1e-5)
    assert base.dtype == jnp.float32


@pytest.mark.parametrize("renormalize", [True, False])
def test_top_k_gating_matches_brute_force(renormalize):
    z = _logits((4, 7, 6))
    k = 3
    r = R.top_k_gating(z, k, renormalize=renormalize)
    p = _np_softmax(z)
    idx = np.argsort(-p, axis=-1, kind="stable")[..., :k]
    np.testing.assert_array_equal(r.indices, idx)
    want = np.take_along_axis(p, idx, -1)
    if renormalize:
        want = want / want.sum(-1, keepdims=True)
        np.testing.assert_allclose(np.asarray(r.gates).sum(-1), 1.0, atol=1e-6)
    np.testing.assert_allclose(r.gates, want, atol=1e-6)
    np.testing.assert_allclose(r.probs, p, atol=1e-6)


def test_ties_go_to_the_lower_expert():
    r = R.top_k_gating(jnp.zeros((2, 5)), 2)
    np.testing.assert_array_equal(r.indices, [[0, 1], [0, 1]])
    np.testing.assert_allclose(r.gates, 0.5)


@pytest.mark.parametrize("renormalize", [True, False])
def test_bias_gradient_sums_to_zero_under_softmax_over_all_experts(renormalize):
    z = _logits((16, 5), seed=3)
    target = jax.random.normal(jax.random.key(4), (16, 2))

    def f(bias):  # any function of the gates (through the softmax over all E)
        g = R.top_k_gating(z + bias, 2, renormalize=renormalize).gates
        return jnp.sum((g - target) ** 2)

    grad = jax.grad(f)(jnp.zeros(5))
    assert float(jnp.max(jnp.abs(grad))) > 1e-3
    assert abs(float(jnp.sum(grad))) < 1e-6


def test_load_balancing_loss_closed_forms_and_numpy():
    E = 4
    assert float(R.load_balancing_loss(jnp.full((8, E), 1 / E), jnp.tile(jnp.arange(E), 2)[:, None])) == pytest.approx(1.0)
    one_hot = jax.nn.one_hot(jnp.zeros(6, jnp.int32), E)
    assert float(R.load_balancing_loss(one_hot, jnp.zeros((6, 1), jnp.int32))) == pytest.approx(E)
    z = _logits((3, 5, E), seed=5)
    r = R.top_k_gating(z, 2)
    p = _np_softmax(z).reshape(-1, E)
    counts = np.bincount(np.asarray(r.indices).reshape(-1), minlength=E)
    want = E * np.sum(counts / (15 * 2) * p.mean(0))
    assert float(R.load_balancing_loss(r.probs, r.indices)) == pytest.approx(want, rel=1e-5)
    # A mask drops padded tokens from both f and P.
    mask = jnp.zeros((3, 5)).at[:, :2].set(1.0)
    sub = R.load_balancing_loss(r.probs[:, :2], r.indices[:, :2])
    assert float(R.load_balancing_loss(r.probs, r.indices, mask=mask)) == pytest.approx(float(sub), rel=1e-6)


def test_z_loss_confidence_and_entropy_match_numpy():
    z = _logits((6, 5), seed=6)
    lse = np.log(np.exp(np.asarray(z, np.float64)).sum(-1))
    assert float(R.router_z_loss(z)) == pytest.approx(np.mean(lse ** 2), rel=1e-5)
    p = _np_softmax(z)
    s = -np.sort(-p, -1)
    np.testing.assert_allclose(R.routing_confidence(jnp.asarray(p, jnp.float32), k=2), s[:, :2].sum(-1), atol=1e-6)
    np.testing.assert_allclose(R.routing_confidence(jnp.asarray(p, jnp.float32), kind="top1"), s[:, 0], atol=1e-6)
    np.testing.assert_allclose(R.routing_confidence(jnp.asarray(p, jnp.float32), kind="margin"), s[:, 0] - s[:, 1],
                               atol=1e-6)
    np.testing.assert_allclose(R.routing_entropy(jnp.asarray(p, jnp.float32)), -(p * np.log(p)).sum(-1), atol=1e-5)
    assert float(R.routing_entropy(jnp.full((7,), 1 / 7))) == pytest.approx(np.log(7), rel=1e-6)
    assert float(R.routing_entropy(jnp.array([1.0, 0.0, 0.0]))) == 0.0


def test_dispatch_round_trip_group_sizes_and_combine():
    m, k, E, D = 11, 3, 5, 4
    idx = jax.random.randint(jax.random.key(7), (m, k), 0, E - 1)  # expert E-1 stays empty
    d = R.dispatch_metadata(idx, E)
    assert int(d.group_sizes.sum()) == m * k and int(d.group_sizes[E - 1]) == 0
    np.testing.assert_array_equal(d.group_sizes, np.bincount(np.asarray(idx).reshape(-1), minlength=E))
    assert np.all(np.diff(np.asarray(d.expert_ids)) >= 0)
    np.testing.assert_array_equal(np.asarray(idx).reshape(-1)[np.asarray(d.order)], d.expert_ids)
    # unsort(sort(x)) == x, for per-assignment rows and for replicated token rows.
    rows = jax.random.normal(jax.random.key(8), (m * k, D))
    np.testing.assert_array_equal(R.unsort(rows[d.order], d, k).reshape(m * k, D), rows)
    x = jax.random.normal(jax.random.key(9), (m, D))
    back = R.unsort(R.sort_by_expert(x, d), d, k)
    for j in range(k):
        np.testing.assert_array_equal(back[:, j], x)
    # Stable: within an expert, token order is preserved.
    tok, eids = np.asarray(d.token_index), np.asarray(d.expert_ids)
    for e in range(E):
        assert np.all(np.diff(tok[eids == e]) >= 0)
    # combine == brute-force loop over tokens and slots.
    y_sorted = jax.random.normal(jax.random.key(10), (m * k, D))
    gates = jax.random.uniform(jax.random.key(11), (m, k))
    want = np.zeros((m, D))
    inv, g_np, y_np = np.asarray(d.inverse), np.asarray(gates), np.asarray(y_sorted)
    for t in range(m):
        for j in range(k):
            want[t] += g_np[t, j] * y_np[inv[t * k + j]]
    np.testing.assert_allclose(R.combine(y_sorted, gates, d), want, atol=1e-5)


def test_bad_inputs_raise_value_errors():
    w = jnp.zeros((4, 3))
    with pytest.raises(ValueError, match="x must be"):
        R.router_logits(jnp.zeros((2, 5)), w)
    with pytest.raises(ValueError, match="bias must have shape"):
        R.router_logits(jnp.zeros((2, 4)), w, jnp.zeros(4))
    with pytest.raises(ValueError, match="k must be in"):
        R.top_k_gating(jnp.zeros((2, 3)), 4)
    with pytest.raises(ValueError, match="kind must be one of"):
        R.routing_confidence(jnp.zeros((2, 3)), kind="max")
    with pytest.raises(ValueError, match="indices must be"):
        R.dispatch_metadata(jnp.zeros((2,), jnp.int32), 3)
    with pytest.raises(ValueError, match="disagree on tokens"):
        R.load_balancing_loss(jnp.zeros((2, 3)), jnp.zeros((3, 1), jnp.int32))
