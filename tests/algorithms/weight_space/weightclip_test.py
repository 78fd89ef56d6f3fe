"""Tests of WeightCLIP: losses vs float64 numpy, set/permutation invariances, tokeniser, AE training, mappers."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from algorithms.weight_space import weightclip as W
from algorithms.weight_space import zoo as zoo_lib


def _np_logits(z, d, t, b):
    z = np.asarray(z, np.float64)
    d = np.asarray(d, np.float64)
    zn = z / np.linalg.norm(z, axis=1, keepdims=True)
    dn = d / np.linalg.norm(d, axis=1, keepdims=True)
    return t * zn @ dn.T + b


def _np_siglip(z, d, pos, t, b, tm=None):
    lg = _np_logits(z, d, t, b)
    y = 2 * pos.astype(np.float64) - 1
    per = np.log1p(np.exp(-y * lg))
    if tm is None:
        return per.mean()
    return per[tm > 0].mean()


def _np_log_softmax(a, axis):
    a = a - a.max(axis=axis, keepdims=True)
    return a - np.log(np.exp(a).sum(axis=axis, keepdims=True))


def _np_multi_positive(z, d, pos, t, tm):
    lg = _np_logits(z, d, t, 0.0)
    keep = tm > 0
    fwd = []
    lp = _np_log_softmax(lg, 1)
    for n in range(lg.shape[0]):
        if keep[n] and pos[n].any():
            fwd.append(-lp[n, pos[n]].mean())
    bwd = []
    lpb = _np_log_softmax(lg[keep], 0)
    pk = pos[keep]
    for u in range(lg.shape[1]):
        if pk[:, u].any():
            bwd.append(-lpb[pk[:, u], u].mean())
    return np.mean(fwd) + np.mean(bwd)


def _toy(seed=0, n=12, u=4, dim=5):
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(n, dim)).astype(np.float32)
    d = rng.normal(size=(u, dim)).astype(np.float32)
    owner = rng.integers(0, u, n)
    pos = owner[:, None] == np.arange(u)[None]
    tm = (rng.random(n) > 0.25).astype(np.float32)
    return z, d, pos, tm


@pytest.mark.parametrize("masked", [False, True])
def test_siglip_loss_matches_float64_numpy(masked):
    z, d, pos, tm = _toy(1)
    got = W.siglip_alignment_loss(jnp.asarray(z), jnp.asarray(d), jnp.asarray(pos), temperature=3.0,
                                  bias=-1.5, token_mask=jnp.asarray(tm) if masked else None)
    np.testing.assert_allclose(float(got), _np_siglip(z, d, pos, 3.0, -1.5, tm if masked else None), rtol=1e-5)
    summed = W.siglip_alignment_loss(jnp.asarray(z), jnp.asarray(d), jnp.asarray(pos), temperature=3.0,
                                     bias=-1.5, token_mask=jnp.asarray(tm) if masked else None,
                                     reduction="sum_datasets")
    np.testing.assert_allclose(float(summed), d.shape[0] * _np_siglip(z, d, pos, 3.0, -1.5, tm if masked else None),
                               rtol=1e-5)


def test_siglip_bias_gradient_closed_form():
    z, d, pos, _ = _toy(2)
    g = jax.grad(lambda b: W.siglip_alignment_loss(jnp.asarray(z), jnp.asarray(d), jnp.asarray(pos),
                                                   temperature=2.0, bias=b))(jnp.float32(-4.0))
    y = 2 * pos - 1.0
    lg = _np_logits(z, d, 2.0, -4.0)
    ref = np.mean(-y / (1 + np.exp(y * lg)))          # mean(-y sigmoid(-y logits))
    np.testing.assert_allclose(float(g), ref, rtol=1e-4)


def test_multi_positive_matches_float64_numpy():
    z, d, pos, tm = _toy(3, n=15, u=5)
    got = W.multi_positive_loss(jnp.asarray(z), jnp.asarray(d), jnp.asarray(pos), temperature=2.5,
                                token_mask=jnp.asarray(tm))
    np.testing.assert_allclose(float(got), _np_multi_positive(z, d, pos, 2.5, tm), rtol=1e-5)


def test_multi_positive_one_pair_each_is_sum_of_clip_directions():
    rng = np.random.default_rng(4)
    z, d = rng.normal(size=(6, 4)), rng.normal(size=(6, 4))
    got = W.multi_positive_loss(jnp.asarray(z, jnp.float32), jnp.asarray(d, jnp.float32), jnp.eye(6, dtype=bool),
                                temperature=3.0)
    lg = _np_logits(z, d, 3.0, 0.0)
    clip = -np.mean(np.diag(_np_log_softmax(lg, 1))) - np.mean(np.diag(_np_log_softmax(lg, 0)))
    np.testing.assert_allclose(float(got), clip, rtol=1e-5)


def test_dataset_encoder_is_invariant_to_example_order():
    enc = W.DatasetEncoder(6, 3, hidden=16, latent_dim=5, rngs=nnx.Rngs(0))
    rng = np.random.default_rng(5)
    x = jnp.asarray(rng.normal(size=(2, 9, 6)), jnp.float32)
    y = jnp.asarray(rng.integers(0, 3, (2, 9)))
    p = rng.permutation(9)
    a, b = enc(x, y), enc(x[:, p], y[:, p])
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(np.asarray(a), axis=-1), 4.0, rtol=1e-5)
    # ... but sensitive to the labels: changing one label changes the embedding
    y2 = y.at[0, 0].set((y[0, 0] + 1) % 3)
    assert np.abs(np.asarray(enc(x, y2))[0] - np.asarray(a)[0]).max() > 1e-4


def _random_zoo(m=16, sizes=(4, 5, 3), seed=0):
    rng = np.random.default_rng(seed)
    ks = [rng.normal(size=(m, a, b)).astype(np.float32) for a, b in zip(sizes[:-1], sizes[1:])]
    bs = [rng.normal(size=(m, b)).astype(np.float32) for b in sizes[1:]]
    return ks, bs


def test_tokenize_detokenize_round_trip_and_mask():
    ks, bs = _random_zoo(3)
    tok, mask, pos = W.tokenize(ks, bs, tokensize=4)        # rows of 5 -> 2 tokens, rows of 6 -> 2 tokens
    assert tok.shape == (3, 2 * 5 + 2 * 3, 4) and mask.shape == tok.shape[1:]
    assert mask.sum() == 5 * 5 + 3 * 6 and np.all(tok[:, mask == 0] == 0)
    np.testing.assert_array_equal(pos[:, 0], np.arange(16))
    np.testing.assert_array_equal(pos[:, 1], [0] * 10 + [1] * 6)
    np.testing.assert_array_equal(tok[1, 2:4].ravel(), np.r_[ks[0][1, :, 1], bs[0][1, 1], 0, 0, 0])  # row 1: bias last
    k2, b2 = W.detokenize(tok, [(4, 5), (5, 3)], tokensize=4)
    for a, b in zip(ks + bs, k2 + b2):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("symmetry", ["match", "sort"])
def test_embedding_invariant_to_hidden_permutations(symmetry):
    ks, bs = _random_zoo(8, sizes=(4, 6, 5, 3))
    tz = W.WeightTokenizer.fit(ks, bs, symmetry=symmetry)
    ae = W.WeightAE(tz.tokensize, tz.positions, d_model=16, heads=2, layers=1, latent_dim=4, rngs=nnx.Rngs(0))
    rng = np.random.default_rng(6)
    layers = [(k[3], b[3]) for k, b in zip(ks, bs)]
    perm = zoo_lib.random_permutation(rng, layers)
    pk = [p[0][None] for p in perm]
    pb = [p[1][None] for p in perm]
    z0 = W.embed_models(ae, tz.encode([k[3:4] for k in ks], [b[3:4] for b in bs]))
    z1 = W.embed_models(ae, tz.encode(pk, pb))
    np.testing.assert_allclose(z0, z1, rtol=1e-5, atol=1e-5)
    # the permuted model computes the same function, and without canonicalisation the embedding changes
    x = rng.normal(size=(7, 4)).astype(np.float32)
    np.testing.assert_allclose(zoo_lib.mlp_apply(layers, x), zoo_lib.mlp_apply(perm, x), rtol=1e-5, atol=1e-5)
    raw = W.WeightTokenizer.fit(ks, bs, symmetry="none")
    assert np.abs(W.embed_models(ae, raw.encode([k[3:4] for k in ks], [b[3:4] for b in bs]))
                  - W.embed_models(ae, raw.encode(pk, pb))).max() > 1e-3
    # decode(encode) of the canonical tokens gives back a model with the original function
    kd, bd = tz.decode(tz.encode(pk, pb))
    np.testing.assert_allclose(zoo_lib.mlp_apply([(k[0], b[0]) for k, b in zip(kd, bd)], x),
                               zoo_lib.mlp_apply(layers, x), rtol=1e-4, atol=1e-4)


def _tiny_setup(m=24):
    ks, bs = _random_zoo(m, sizes=(4, 5, 3), seed=7)
    tz = W.WeightTokenizer.fit(ks, bs, symmetry="match")
    tokens = tz.encode(ks, bs)
    rng = np.random.default_rng(8)
    pool = W.DatasetPool(x=jnp.asarray(rng.normal(size=(2, 40, 4)), jnp.float32),
                         variant=jnp.asarray(rng.integers(0, 2, m)),
                         labels=jnp.asarray(rng.integers(0, 3, (m, 40))),
                         weights=jnp.asarray((rng.random((m, 40)) < 0.6).astype(np.float32)))
    return tz, tokens, pool


def test_ae_training_reduces_reconstruction_error_and_alignment_trains():
    tz, tokens, pool = _tiny_setup()
    ae = W.WeightAE(tz.tokensize, tz.positions, d_model=32, heads=2, layers=1, latent_dim=8, rngs=nnx.Rngs(1))
    enc = W.DatasetEncoder(4, 3, hidden=16, latent_dim=8, rngs=nnx.Rngs(2))
    mask = jnp.asarray(tz.mask)

    def recon(model):
        return float(W.masked_normalized_mse(model(jnp.asarray(tokens))[1], jnp.asarray(tokens), mask))

    before = recon(ae)
    cfg = W.TrainConfig(steps=150, batch_size=12, set_size=5, lr=3e-3, temperature=5.0)
    ae2, enc2, b, hist = W.train_weightclip(ae, enc, tokens, tz.mask, pool, np.arange(24), cfg,
                                            key=jax.random.key(0), progress=False)
    assert recon(ae2) < 0.5 * before, (before, recon(ae2))
    assert recon(ae) == before                                  # inputs not modified
    assert np.mean(hist["align"][-20:]) < np.mean(hist["align"][:20])
    assert b != cfg.bias_init
    # post-hoc alignment leaves the AE unchanged
    ae3, _, _, _ = W.train_weightclip(ae2, enc, tokens, tz.mask, pool, np.arange(24),
                                      W.TrainConfig(steps=5, batch_size=12, set_size=5, freeze_ae=True),
                                      key=jax.random.key(1), progress=False)
    np.testing.assert_array_equal(W.embed_models(ae3, tokens), W.embed_models(ae2, tokens))


def test_masked_mse_invariances():
    rng = np.random.default_rng(9)
    t, p = rng.normal(size=(3, 4, 5)), rng.normal(size=(3, 4, 5))
    mask = (rng.random((4, 5)) > 0.3).astype(np.float32)
    base = float(W.masked_normalized_mse(jnp.asarray(p), jnp.asarray(t), jnp.asarray(mask)))
    aff = float(W.masked_normalized_mse(jnp.asarray(3 * p + 2), jnp.asarray(3 * t + 2), jnp.asarray(mask)))
    t2 = np.where(mask > 0, t, 100.0)
    changed = float(W.masked_normalized_mse(jnp.asarray(p), jnp.asarray(t2), jnp.asarray(mask)))
    np.testing.assert_allclose([aff, changed], [base, base], rtol=1e-4)
    v = mask.astype(bool)[None].repeat(3, 0)
    np.testing.assert_allclose(base, np.mean((p[v] - t[v]) ** 2) / t[v].var(), rtol=1e-4)


def test_ridge_recovers_linear_map_and_recall_brute_force():
    rng = np.random.default_rng(10)
    x = rng.normal(size=(50, 4))
    w = rng.normal(size=(4, 3))
    y = x @ w + 0.7
    wh = W.fit_ridge(x, y, rel_lambda=1e-10)
    np.testing.assert_allclose(W.predict_ridge(wh, x), y, atol=1e-4)
    s = rng.normal(size=(6, 9))
    rel = rng.random((6, 9)) < 0.2
    rel[0] = False
    got = W.recall_at_k(s, rel, [1, 3])
    for q in range(6):
        top = np.argsort(-s[q])
        for j, k in enumerate([1, 3]):
            assert got[q, j] == float(rel[q, top[:k]].any())


def test_refinement_decreases_loss_and_shell_scale():
    tz, tokens, _ = _tiny_setup()
    ae = W.WeightAE(tz.tokensize, tz.positions, d_model=16, heads=2, layers=1, latent_dim=4, rngs=nnx.Rngs(3))
    rng = np.random.default_rng(11)
    x, y = jnp.asarray(rng.normal(size=(20, 4)), jnp.float32), jnp.asarray(rng.integers(0, 3, 20))
    z0 = jnp.asarray(W.embed_models(ae, tokens[:1])[0])
    decode = lambda z: tz.decode(ae.decode(z))
    loss = lambda k, b: W.mlp_loss(k, b, x, y)
    zb, ls = W.refine_latent(decode, z0, loss, steps=3, lr=1e-3)
    assert float(ls[-1]) < float(ls[0]) and float(loss(*decode(zb))) == pytest.approx(float(ls.min()), rel=1e-5)
    kb, lf = W.finetune_weights(*decode(z0), loss, steps=3, lr=1e-3)
    assert float(lf[-1]) < float(lf[0])
    zs = W.shell_scale(z0, 2.5, 1.0)
    np.testing.assert_allclose(np.linalg.norm(np.asarray(zs), axis=-1), 2.5, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(W.shell_scale(z0, 2.5, 0.0)), np.asarray(z0), rtol=1e-6)


def test_bad_inputs_name_the_argument():
    z, d, pos, _ = _toy(12)
    with pytest.raises(ValueError, match="pos"):
        W.siglip_alignment_loss(jnp.asarray(z), jnp.asarray(d), jnp.asarray(pos[:, :2]))
    with pytest.raises(ValueError, match="token_mask"):
        W.multi_positive_loss(jnp.asarray(z), jnp.asarray(d), jnp.asarray(pos), token_mask=jnp.ones(3))
    with pytest.raises(ValueError, match="tokens"):
        W.detokenize(np.zeros((2, 7, 4)), [(4, 5), (5, 3)], tokensize=4)
    with pytest.raises(ValueError, match="objective"):
        W.TrainConfig(objective="infonce")
    with pytest.raises(ValueError, match="symmetry"):
        W.canonical_layers([(np.ones((2, 2)), np.ones(2))], symmetry="flip")
    with pytest.raises(ValueError, match="x, y"):
        W.DatasetEncoder(3, 2, rngs=nnx.Rngs(0))(jnp.ones((4, 5)), jnp.ones((4,), jnp.int32))
    with pytest.raises(ValueError, match="reduction"):
        W.siglip_alignment_loss(jnp.asarray(z), jnp.asarray(d), jnp.asarray(pos), reduction="sum")
    with pytest.raises(ValueError, match="ks"):
        W.recall_at_k(np.zeros((2, 3)), np.ones((2, 3), bool), [4])
    with pytest.raises(ValueError, match="alpha"):
        W.shell_scale(jnp.ones((2, 3)), 1.0, 1.5)
