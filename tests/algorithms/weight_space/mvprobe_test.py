"""Tests of MVProbe, ProbeX and StatNN: numpy transcriptions, symmetries, theory constants, training, bad input."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from algorithms.weight_space import mvprobe as M


def _np_std(s):
    m = s.mean(axis=(1, 2), keepdims=True)
    v = ((s - m) ** 2).sum(axis=(1, 2), keepdims=True) / (s.shape[1] * s.shape[2] - 1)
    return (s - m) / (np.sqrt(v) + 1e-8)


def _p(x):
    return np.asarray(x[...], np.float64)


def test_probex_forward_matches_numpy():
    model = M.ProbeX(3, 4, 2, n_probes=2, proj_dim=3, rep_dim=5, rngs=nnx.Rngs(0))
    x = np.random.default_rng(0).normal(size=(2, 3, 4))
    s = x @ _p(model.u)                                         # [B, dH, r]
    p = np.maximum(np.einsum("bhr,hp->brp", s, _p(model.v)), 0)  # [B, r, p]
    t = p.reshape(2, -1) @ _p(model.encoder.kernel) + _p(model.encoder.bias)
    ref = t @ _p(model.head.kernel) + _p(model.head.bias)
    np.testing.assert_allclose(np.asarray(model(jnp.asarray(x, jnp.float32))), ref, rtol=1e-4, atol=1e-5)


def test_mvprobe_forward_matches_numpy():
    model = M.MVProbe(3, 4, 2, n_probes=2, proj_dim=3, rep_dim=5, rngs=nnx.Rngs(1))
    x = np.random.default_rng(1).normal(size=(2, 3, 4))
    xt = x.transpose(0, 2, 1)
    s = [x @ _p(model.u1), x @ xt @ _p(model.u2), xt @ _p(model.u3), xt @ x @ _p(model.u4)]
    vs = [_p(model.v1), _p(model.v2), _p(model.v3), _p(model.v4)]
    f = np.concatenate([np.maximum(_np_std(si).transpose(0, 2, 1) @ v, 0).reshape(2, -1) for si, v in zip(s, vs)], -1)
    ref = (f @ _p(model.encoder.kernel) + _p(model.encoder.bias)) @ _p(model.head.kernel) + _p(model.head.bias)
    np.testing.assert_allclose(np.asarray(model(jnp.asarray(x, jnp.float32))), ref, rtol=1e-4, atol=1e-4)


def test_gram_views_computed_without_materialising_match_dense():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(3, 5, 7)).astype(np.float32)
    u = [rng.normal(size=sh).astype(np.float32) for sh in ((7, 4), (5, 4), (5, 4), (7, 4))]
    _, s2, _, s4 = M.probe_responses(jnp.asarray(x), *map(jnp.asarray, u))
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(np.asarray(s2), (x64 @ x64.transpose(0, 2, 1)) @ u[1], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.asarray(s4), (x64.transpose(0, 2, 1) @ x64) @ u[3], rtol=1e-4, atol=1e-4)


def test_view_symmetries_under_row_and_column_permutations():
    rng = np.random.default_rng(3)
    x = jnp.asarray(rng.normal(size=(2, 5, 7)), jnp.float32)
    u1, u2, u3, u4 = (jnp.asarray(rng.normal(size=sh), jnp.float32) for sh in ((7, 4), (5, 4), (5, 4), (7, 4)))
    pr, pc = rng.permutation(5), rng.permutation(7)
    base = M.probe_responses(x, u1, u2, u3, u4)
    rowp = M.probe_responses(x[:, pr], u1, u2, u3, u4)
    tol = dict(rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(rowp[0], base[0][:, pr], **tol)          # S_xu(PX) = P S_xu(X)
    np.testing.assert_allclose(rowp[3], base[3], **tol)                 # column Gram: row-permutation invariant
    inv = np.argsort(pr)
    np.testing.assert_allclose(M.probe_responses(x[:, pr], u1, u2, u3[pr], u4)[2], base[2], **tol)  # S_xtu(PX; PU3)
    np.testing.assert_allclose(M.probe_responses(x[:, pr], u1, u2[pr], u3, u4)[1], base[1][:, pr], **tol)
    colp = M.probe_responses(x[:, :, pc], u1, u2, u3, u4)
    np.testing.assert_allclose(colp[1], base[1], **tol)                 # row Gram: column-permutation invariant
    np.testing.assert_allclose(colp[2], base[2][:, pc], **tol)
    assert inv.shape == (5,)


def test_embedding_invariance_to_hidden_unit_permutation():
    """A zoo layer's output units are X's rows: the column-Gram view's embedding ignores their order, the
    row-Gram view's embedding ignores the order of the input units (columns); ProbeX's does not."""
    rng = np.random.default_rng(4)
    x = jnp.asarray(rng.normal(size=(3, 6, 8)), jnp.float32)
    pr, pc = rng.permutation(6), rng.permutation(8)
    col = M.MVProbe(6, 8, 2, n_probes=3, proj_dim=4, rep_dim=5, views=("xtxu",), rngs=nnx.Rngs(0))
    np.testing.assert_allclose(col(x[:, pr]), col(x), rtol=1e-4, atol=1e-4)
    row = M.MVProbe(6, 8, 2, n_probes=3, proj_dim=4, rep_dim=5, views=("xxtu",), rngs=nnx.Rngs(0))
    np.testing.assert_allclose(row(x[:, :, pc]), row(x), rtol=1e-4, atol=1e-4)
    px = M.ProbeX(6, 8, 2, n_probes=3, proj_dim=4, rep_dim=5, rngs=nnx.Rngs(0))
    assert not np.allclose(px(x[:, pr]), px(x), atol=1e-3)


def test_ablation_zeroes_exact_slices():
    x = jnp.asarray(np.random.default_rng(5).normal(size=(2, 4, 5)), jnp.float32)
    full = M.MVProbe(4, 5, 2, n_probes=2, proj_dim=3, rep_dim=4, rngs=nnx.Rngs(0))
    part = M.MVProbe(4, 5, 2, n_probes=2, proj_dim=3, rep_dim=4, views=("xu", "xtxu"), rngs=nnx.Rngs(0))
    ff, fp = np.asarray(full.features(x)), np.asarray(part.features(x))
    assert ff.shape == (2, 4 * 2 * 3)
    w = 6
    np.testing.assert_array_equal(fp[:, w:3 * w], 0)
    np.testing.assert_allclose(fp[:, :w], ff[:, :w], rtol=1e-6)
    np.testing.assert_allclose(fp[:, 3 * w:], ff[:, 3 * w:], rtol=1e-6)


def test_standardization_moments_and_scale_invariance():
    rng = np.random.default_rng(6)
    s = jnp.asarray(rng.normal(3.0, 5.0, size=(4, 6, 3)), jnp.float32)
    z = np.asarray(M.standardize(s), np.float64)
    np.testing.assert_allclose(z.mean(axis=(1, 2)), 0, atol=1e-5)
    np.testing.assert_allclose(z.reshape(4, -1).std(-1, ddof=1), 1, rtol=1e-4)
    m = M.MVProbe(6, 3, 2, n_probes=2, proj_dim=2, rep_dim=3, rngs=nnx.Rngs(0))
    x = jnp.asarray(rng.normal(size=(2, 6, 3)), jnp.float32)
    for a, b in zip(m.responses(x), m.responses(7.0 * x)):   # first order scales by c, Gram by c^2: both removed
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


def test_null_space_pairs_collapse_for_probex_not_for_mvprobe():
    """Thm 1/2: X2 = X1 + N(I - U U^+) has X2 U = X1 U; the Gram and column views see the difference."""
    rng = np.random.default_rng(7)
    model = M.MVProbe(5, 8, 2, n_probes=3, proj_dim=4, rep_dim=4, standardize=False, rngs=nnx.Rngs(0))
    u = _p(model.u1)
    x1 = rng.normal(size=(5, 8))
    x2 = x1 + rng.normal(size=(5, 8)) @ (np.eye(8) - u @ np.linalg.pinv(u))
    x = jnp.asarray(np.stack([x1, x2]), jnp.float32)
    s = [np.asarray(t) for t in model.responses(x)]
    np.testing.assert_allclose(s[0][0], s[0][1], atol=1e-4)   # first-order row view collapses
    assert np.abs(s[2][0] - s[2][1]).max() > 1e-2             # column view differs
    assert np.abs(s[3][0] - s[3][1]).max() > 1e-2             # column-Gram view differs


def test_scale_ratio_constants_monte_carlo():
    """Thm 3: E||X X^T V||^2 / E||X U||^2 = n(n+m+1) s^2 / m and E||X^T X U||^2 / E||X U||^2 = (m+n+1) s^2."""
    m, n, sig, draws = 20, 50, 0.3, 3000
    key = jax.random.key(0)
    x = sig * jax.random.normal(key, (draws, m, n))
    u = jnp.eye(n)[:, :4]
    v = jnp.eye(m)[:, :4]
    xt = jnp.swapaxes(x, 1, 2)
    first = float(jnp.mean(jnp.sum((x @ u) ** 2, (1, 2))))
    row_gram = float(jnp.mean(jnp.sum((x @ (xt @ v)) ** 2, (1, 2))))
    col_gram = float(jnp.mean(jnp.sum((xt @ (x @ u)) ** 2, (1, 2))))
    assert abs(row_gram / first / (n * (n + m + 1) * sig**2 / m) - 1) < 0.05   # 15.98
    assert abs(col_gram / first / ((m + n + 1) * sig**2) - 1) < 0.05           # 6.39


def test_train_probe_learns_a_gram_signal():
    """Class 1 matrices carry a rank-one spike X += a b^T with fixed unit b (random sign and scale of a);
    trained probes beat chance on held-out matrices and BCE falls."""
    rng = np.random.default_rng(8)
    n = 160
    y = rng.integers(0, 2, n)
    b = rng.normal(size=6)
    b /= np.linalg.norm(b)
    x = rng.normal(size=(n, 5, 6))
    x += y[:, None, None] * 3.0 * rng.normal(size=(n, 5, 1)) * b[None, None, :]
    yy = np.stack([y, 1 - y], -1).astype(np.float32)
    model = M.MVProbe(5, 6, 2, n_probes=4, proj_dim=4, rep_dim=8, rngs=nnx.Rngs(0))
    trained, hist = M.train_probe(model, x[:120], yy[:120], x[120:], yy[120:], loss="bce", key=jax.random.key(0),
                                  epochs=60, lr=3e-3, batch_size=32, eval_every=20)
    assert hist["train_loss"][-1] < hist["train_loss"][0]
    assert M.evaluate(trained, x[120:], yy[120:], "bce") > 0.8
    stats = M.weight_statistics(jnp.asarray(x[:120], jnp.float32))
    snn = M.StatNN(2, mean=stats.mean(0), std=stats.std(0), hidden=8, rngs=nnx.Rngs(0))
    assert snn(stats[:3]).shape == (3, 2)
    with pytest.raises(ValueError, match="stats"):
        snn(jnp.asarray(x[:3], jnp.float32))


def test_weight_statistics_values():
    x = jnp.asarray(np.arange(12, dtype=np.float32).reshape(1, 3, 4) - 5.0)
    f = np.asarray(M.weight_statistics(x))[0]
    a = np.arange(12) - 5.0
    ref = [a.mean(), a.std(), *np.quantile(a, [0, .25, .5, .75, 1]),
           np.abs(a).mean(), np.abs(a).std(), *np.quantile(np.abs(a), [0, .25, .5, .75, 1])]
    np.testing.assert_allclose(f, ref, rtol=1e-5)


def test_bad_input():
    with pytest.raises(ValueError, match="views"):
        M.MVProbe(3, 4, 2, views=("xx",), rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="n_probes"):
        M.ProbeX(3, 4, 2, n_probes=0, rngs=nnx.Rngs(0))
    m = M.MVProbe(3, 4, 2, n_probes=2, proj_dim=2, rep_dim=2, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="x: expected"):
        m(jnp.zeros((2, 4, 3)))
    with pytest.raises(ValueError, match="u2"):
        M.probe_responses(jnp.zeros((1, 3, 4)), jnp.zeros((4, 2)), jnp.zeros((4, 2)), jnp.zeros((3, 2)),
                          jnp.zeros((4, 2)))
    with pytest.raises(ValueError, match="loss"):
        M.probe_loss(jnp.zeros((2, 2)), jnp.zeros((2, 2)), "mse")
    with pytest.raises(ValueError, match="y_train"):
        M.train_probe(m, np.zeros((4, 3, 4)), np.zeros((3, 2)), np.zeros((2, 3, 4)), np.zeros((2, 2)),
                      loss="bce", key=jax.random.key(0))
