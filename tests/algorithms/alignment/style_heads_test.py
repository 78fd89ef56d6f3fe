"""Style Modulation Heads (algorithms.alignment.style_heads) against independent references."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from algorithms.alignment import style_heads as sh
from models.transformer import Transformer, TransformerConfig

L, H, D = 3, 4, 16


@pytest.fixture(scope="module")
def model():
    cfg = TransformerConfig(vocab_size=11, d_model=D, num_layers=L, num_heads=H, num_kv_heads=2, d_ff=32)
    return Transformer(cfg, rngs=nnx.Rngs(0))


@pytest.fixture(scope="module")
def tokens():
    return jax.random.randint(jax.random.key(1), (2, 6), 0, 11)


def _u(model, seed=2):
    d = model.config.resolved_head_dim
    return jax.random.normal(jax.random.key(seed), (H, d))


# ------------------------------------------------------------------------------------------------
# Steering through the model.
# ------------------------------------------------------------------------------------------------

def test_zero_coefficient_is_identity(model, tokens):
    base = model(tokens).logits
    hd = sh.head_steering_deltas(_u(model), layer=1, heads=(0, 2), coef=0.0, num_layers=L)
    rd = sh.residual_steering_deltas(jnp.ones((D,)), layer=1, coef=0.0, num_layers=L)
    np.testing.assert_array_equal(np.asarray(model(tokens, head_deltas=hd).logits), np.asarray(base))
    np.testing.assert_array_equal(np.asarray(model(tokens, residual_deltas=rd).logits), np.asarray(base))
    # A non-zero coefficient does change the output (the identity above is not vacuous).
    hd1 = sh.head_steering_deltas(_u(model), layer=1, heads=(0, 2), coef=2.0, num_layers=L)
    assert np.abs(np.asarray(model(tokens, head_deltas=hd1).logits - base)).max() > 1e-3


@pytest.mark.parametrize("layer,heads", [(1, (0, 2)), (2, (3,)), (0, (1, 2, 3))])
def test_steering_listed_heads_leaves_upstream_unchanged(model, tokens, layer, heads):
    u, coef = _u(model), 3.0
    base = model(tokens, return_intermediates=True).intermediates
    hd = sh.head_steering_deltas(u, layer=layer, heads=heads, coef=coef, num_layers=L)
    out = model(tokens, head_deltas=hd, return_intermediates=True).intermediates
    res0, res1 = np.asarray(base["residuals"]), np.asarray(out["residuals"])
    ho0, ho1 = np.asarray(base["head_outputs"]), np.asarray(out["head_outputs"])
    # Residual stream up to the steered layer's input, and every head output of earlier layers: identical.
    np.testing.assert_array_equal(res1[:layer + 1], res0[:layer + 1])
    np.testing.assert_array_equal(ho1[:layer], ho0[:layer])
    others = [i for i in range(H) if i not in heads]
    np.testing.assert_array_equal(ho1[layer][:, :, others], ho0[layer][:, :, others])
    # The steered heads moved by exactly coef * u_h; everything after changed.
    np.testing.assert_allclose(ho1[layer][:, :, list(heads)] - ho0[layer][:, :, list(heads)],
                               np.broadcast_to(coef * np.asarray(u)[list(heads)], ho0[layer][:, :, list(heads)].shape),
                               atol=1e-5)
    assert np.abs(res1[layer + 1] - res0[layer + 1]).max() > 1e-3


def test_head_steering_equals_adding_projected_delta_to_attention_output(model, tokens):
    """The steered block output equals a hand-run block whose attention output gets W_O (c u ⊙ m)."""
    layer, heads, coef, u = 1, (1, 3), 1.7, _u(model, 5)
    base = model(tokens, return_intermediates=True).intermediates
    hd = sh.head_steering_deltas(u, layer=layer, heads=heads, coef=coef, num_layers=L)
    steered = model(tokens, head_deltas=hd, return_intermediates=True).intermediates["residuals"][layer + 1]
    block = model.layers[layer]
    x = base["residuals"][layer]
    positions = jnp.broadcast_to(jnp.arange(tokens.shape[1])[None], tokens.shape)
    a, _, _, _ = block.attn(block.attn_norm(x), positions)
    m = np.zeros((H, 1)); m[list(heads)] = 1.0
    wo = np.asarray(block.attn.wo[...], np.float64)
    x2 = np.asarray(x, np.float64) + np.asarray(a, np.float64) + np.einsum("hd,hdD->D", coef * np.asarray(u) * m, wo)
    f, _ = block.ffn(block.ffn_norm(jnp.asarray(x2, jnp.float32)))
    np.testing.assert_allclose(np.asarray(steered), x2 + np.asarray(f), atol=1e-4)


def test_residual_steering_adds_after_the_block(model, tokens):
    v = jax.random.normal(jax.random.key(3), (D,))
    base = model(tokens, return_intermediates=True).intermediates["residuals"]
    rd = sh.residual_steering_deltas(v, layer=0, coef=0.5, num_layers=L)
    out = model(tokens, residual_deltas=rd, return_intermediates=True).intermediates["residuals"]
    np.testing.assert_allclose(np.asarray(out[1] - base[1]), np.broadcast_to(0.5 * np.asarray(v), base[1].shape),
                               atol=1e-5)


def test_steer_pre_o_empty_and_all_heads():
    x = jax.random.normal(jax.random.key(0), (2, 3, H, 5))
    u = jax.random.normal(jax.random.key(1), (H, 5))
    np.testing.assert_array_equal(np.asarray(sh.steer_pre_o(x, u, (), 4.0)), np.asarray(x))
    np.testing.assert_allclose(np.asarray(sh.steer_pre_o(x, u, range(H), 4.0)), np.asarray(x + 4.0 * u), atol=1e-6)
    y = np.asarray(sh.steer_pre_o(x, u, (2,), -1.0))
    np.testing.assert_array_equal(y[..., [0, 1, 3], :], np.asarray(x)[..., [0, 1, 3], :])


def test_ablation_mask_zeroes_the_heads(model, tokens):
    m = sh.ablation_mask(num_layers=L, num_heads=H, layer=2, heads=(0, 3))
    expected = np.ones((L, H)); expected[2, [0, 3]] = 0
    np.testing.assert_array_equal(np.asarray(m), expected)
    ho = np.asarray(model(tokens, head_mask=m, return_intermediates=True).intermediates["head_outputs"])
    assert np.all(ho[2][:, :, [0, 3]] == 0) and np.abs(ho[2][:, :, [1, 2]]).max() > 0


def test_hook_activations_decompose_the_residual_stream(model, tokens):
    acts = sh.hook_activations(model, tokens)
    inter = model(tokens, return_intermediates=True).intermediates
    res = np.asarray(inter["residuals"], np.float64)
    np.testing.assert_allclose(np.asarray(acts["residual"]), res[1:], atol=1e-6)
    wo = np.stack([np.asarray(layer.attn.wo[...], np.float64) for layer in model.layers])
    attn = np.einsum("lbthd,lhdD->lbtD", np.asarray(inter["head_outputs"], np.float64), wo)
    np.testing.assert_allclose(np.asarray(acts["attn_out"]), attn, atol=1e-5)
    np.testing.assert_allclose(res[:-1] + np.asarray(acts["attn_out"]) + np.asarray(acts["mlp_out"]), res[1:],
                               atol=1e-5)
    # With a residual delta the MLP output is still recovered (the delta is taken out).
    rd = sh.residual_steering_deltas(jnp.ones((D,)), layer=1, coef=2.0, num_layers=L)
    steered = sh.hook_activations(model, tokens, residual_deltas=rd)
    block = model.layers[1]
    x_mid = steered["residual"][0] + steered["attn_out"][1]
    f, _ = block.ffn(block.ffn_norm(x_mid))
    np.testing.assert_allclose(np.asarray(steered["mlp_out"][1]), np.asarray(f), atol=1e-4)


# ------------------------------------------------------------------------------------------------
# Head contribution scores.
# ------------------------------------------------------------------------------------------------

def _numpy_contributions(u_flat, a, o_proj):
    """The official loop (compute.py) in float64: o_proj is torch-style [D, h*d]."""
    h = H
    d = u_flat.shape[0] // h
    s = []
    for k in range(h):
        masked = np.zeros_like(u_flat)
        masked[k * d:(k + 1) * d] = u_flat[k * d:(k + 1) * d]
        s.append(float((o_proj @ masked) @ a))
    s = np.array(s)
    sd = s.std()
    return ((s - s.mean()) / sd if sd > 0 else s - s.mean()), s


def test_head_contributions_match_float64_reference(model):
    rng = np.random.default_rng(0)
    for layer in range(L):
        wo = np.asarray(model.layers[layer].attn.wo[...], np.float64)  # [h, d, D]
        hh, d, DD = wo.shape
        u = rng.normal(size=(hh * d,))
        a = rng.normal(size=(DD,))
        o_proj = wo.reshape(hh * d, DD).T  # torch layout [D, h*d]
        z_ref, s_ref = _numpy_contributions(u, a, o_proj)
        z, s = sh.head_contributions(jnp.asarray(u, jnp.float32), jnp.asarray(a, jnp.float32), jnp.asarray(wo))
        np.testing.assert_allclose(np.asarray(s), s_ref, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(np.asarray(z), z_ref, rtol=1e-4, atol=1e-4)
        # Linearity: the head scores sum to <W_O u, a>; z has mean 0 and std 1.
        np.testing.assert_allclose(float(np.asarray(s).sum()), float((o_proj @ u) @ a), rtol=1e-4, atol=1e-5)
        assert abs(float(np.asarray(z).mean())) < 1e-5 and abs(float(np.asarray(z).std()) - 1) < 1e-4
    # Layer-wise version agrees with the per-layer one.
    wo_all = sh.output_projections(model)
    d = wo_all.shape[2]
    U = jnp.asarray(rng.normal(size=(L, H, d)), jnp.float32)
    A = jnp.asarray(rng.normal(size=(L, D)), jnp.float32)
    zs, ss = sh.layer_head_contributions(U, A, wo_all)
    for layer in range(L):
        z1, s1 = sh.head_contributions(U[layer], A[layer], wo_all[layer])
        np.testing.assert_allclose(np.asarray(ss[layer]), np.asarray(s1), rtol=1e-5, atol=1e-6)


def test_single_head_projection_scores_only_that_head():
    rng = np.random.default_rng(1)
    d, k = 3, 2
    wo = np.zeros((H, d, D)); wo[k] = rng.normal(size=(d, D))
    z, s = sh.head_contributions(rng.normal(size=(H, d)), rng.normal(size=(D,)), wo)
    s = np.asarray(s)
    assert s[k] != 0 and np.all(s[[i for i in range(H) if i != k]] == 0)
    assert sh.top_heads(z if s[k] > 0 else -np.asarray(z), 1) == (k,)


def test_zscore_constant_row_and_top_heads():
    np.testing.assert_array_equal(np.asarray(sh.zscore(jnp.full((4,), 3.0))), np.zeros(4))
    assert sh.top_heads(np.array([0.1, 2.0, -1.0, 2.0]), 3) == (1, 3, 0)


# ------------------------------------------------------------------------------------------------
# Mean differences, filtering, localization.
# ------------------------------------------------------------------------------------------------

def test_mean_difference_matches_numpy_and_swaps_sign():
    rng = np.random.default_rng(2)
    pos, neg = rng.normal(size=(5, 7, 2, 3)), rng.normal(size=(4, 6, 2, 3))
    pm = rng.random((5, 7)) < 0.5; pm[:, 0] = True
    nm = rng.random((4, 6)) < 0.5; nm[:, 3] = True
    ref = (np.mean([pos[i][pm[i]].mean(0) for i in range(5)], 0)
           - np.mean([neg[i][nm[i]].mean(0) for i in range(4)], 0))
    v = sh.mean_difference(pos, neg, pos_mask=pm, neg_mask=nm)
    np.testing.assert_allclose(np.asarray(v), ref, atol=1e-5)
    np.testing.assert_allclose(np.asarray(sh.mean_difference(neg, pos, pos_mask=nm, neg_mask=pm)), -ref, atol=1e-5)


def test_filter_pairs_brute_force():
    grid = [0.0, 49.9, 50.0, 100.0]
    rows = np.array(list(itertools.product(grid, repeat=4)))
    keep = sh.filter_pairs(*rows.T, threshold=50.0)
    ref = [(tp >= 50) and (tn < 50) and (cp >= 50) and (cn >= 50) for tp, tn, cp, cn in rows]
    np.testing.assert_array_equal(keep, ref)
    assert 0 < keep.sum() < len(rows)


def test_cosine_quantities():
    rng = np.random.default_rng(3)
    v = rng.normal(size=(5, 8))
    v[2] = 0.0
    c = np.asarray(sh.cosine_matrix(v))
    np.testing.assert_allclose(c, c.T, atol=1e-6)
    np.testing.assert_allclose(np.diag(c)[[0, 1, 3, 4]], 1.0, atol=1e-6)
    assert c[2, 2] == 0 and np.all(c[2] == 0)  # sklearn's convention for a zero vector
    n = v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-30)
    a_ref = np.array([n[i] @ n[i + 1] for i in range(4)])
    np.testing.assert_allclose(np.asarray(sh.adjacent_cosine(v)), a_ref, atol=1e-6)
    d = np.asarray(sh.adjacent_differences(v))
    assert d.shape == (3,)
    np.testing.assert_allclose(d, a_ref[:-1] - a_ref[1:], atol=1e-6)


@pytest.mark.parametrize("formed_at", [1, 3, 5])
def test_localization_finds_planted_direction(formed_at):
    """Synthetic activations: from layer `formed_at` on, pos samples carry a fixed direction."""
    rng = np.random.default_rng(formed_at)
    Ln, Dn, n, t = 7, 32, 40, 5
    direction = rng.normal(size=Dn) * 3.0
    early = rng.normal(size=(Ln, Dn))  # a different, layer-specific shift before the direction forms
    shift = np.where(np.arange(Ln)[:, None] >= formed_at, direction[None], early)
    pos = rng.normal(size=(n, t, Ln, Dn)) + shift[None, None]
    neg = rng.normal(size=(n, t, Ln, Dn))
    mask = np.ones((n, t)); mask[:, :2] = 0  # "response" tokens only
    v = sh.steering_vector(pos, neg, pos_mask=mask, neg_mask=mask)
    assert v.shape == (Ln, Dn)
    assert sh.localize_layer(v) == formed_at
    # Cosine between the vector and the planted direction is ~1 from that layer on.
    cos = np.asarray(v) @ direction / (np.linalg.norm(np.asarray(v), axis=1) * np.linalg.norm(direction))
    assert np.all(cos[formed_at:] > 0.95)


def test_localization_break_rule():
    """Where the direction breaks (stable, then changes): the official d_i peaks at the last stable layer."""
    rng = np.random.default_rng(9)
    u = rng.normal(size=16)
    v = np.stack([u + 0.01 * rng.normal(size=16) for _ in range(4)] + [rng.normal(size=16) for _ in range(3)])
    assert sh.localize_layer(v, rule="break") == 3


# ------------------------------------------------------------------------------------------------
# Pareto front and hypervolume.
# ------------------------------------------------------------------------------------------------

def test_pareto_and_hypervolume_brute_force():
    rng = np.random.default_rng(4)
    for _ in range(5):
        p = rng.random((9, 2))
        front = set(sh.pareto_front(p).tolist())
        ref = {i for i in range(len(p)) if not any(
            (p[j] >= p[i]).all() and (p[j] > p[i]).any() for j in range(len(p)))}
        assert front == ref
        g = (np.arange(400) + 0.5) / 400
        X, Y = np.meshgrid(g, g, indexing="ij")
        covered = np.zeros_like(X, bool)
        for x, y in p:
            covered |= (X <= x) & (Y <= y)
        assert abs(sh.hypervolume_2d(p) - covered.mean()) < 5e-3
    assert sh.hypervolume_2d([[0.5, 0.5], [1.0, 0.2]]) == pytest.approx(0.5 * 0.5 + 0.5 * 0.2)
    assert sh.hypervolume_2d([[0.0, 1.0]]) == 0.0


# ------------------------------------------------------------------------------------------------
# Bad input.
# ------------------------------------------------------------------------------------------------

def test_bad_input_errors(model):
    u = jnp.ones((H, 4))
    with pytest.raises(ValueError, match="heads"):
        sh.head_steering_deltas(u, layer=0, heads=(H,), coef=1.0, num_layers=L)
    with pytest.raises(ValueError, match="distinct"):
        sh.head_steering_deltas(u, layer=0, heads=(1, 1), coef=1.0, num_layers=L)
    with pytest.raises(ValueError, match="layer"):
        sh.head_steering_deltas(u, layer=L, heads=(0,), coef=1.0, num_layers=L)
    with pytest.raises(ValueError, match="u_pre_o"):
        sh.head_steering_deltas(jnp.ones((H * 4,)), layer=0, heads=(0,), coef=1.0, num_layers=L)
    with pytest.raises(ValueError, match="v: expected"):
        sh.residual_steering_deltas(jnp.ones((2, D)), layer=0, coef=1.0, num_layers=L)
    with pytest.raises(ValueError, match="wo"):
        sh.head_contributions(jnp.ones((H, 4)), jnp.ones((D,)), jnp.ones((H * 4, D)))
    with pytest.raises(ValueError, match="u_pre_o"):
        sh.head_contributions(jnp.ones((H, 3)), jnp.ones((D,)), jnp.ones((H, 4, D)))
    with pytest.raises(ValueError, match="a_attn_out"):
        sh.head_contributions(jnp.ones((H, 4)), jnp.ones((D + 1,)), jnp.ones((H, 4, D)))
    with pytest.raises(ValueError, match="pos_mask"):
        sh.mean_difference(np.ones((2, 3, 4)), np.ones((2, 3, 4)), pos_mask=np.ones((2, 4)))
    with pytest.raises(ValueError, match="at least one selected token"):
        sh.mean_difference(np.ones((2, 3, 4)), np.ones((2, 3, 4)), neg_mask=np.array([[1, 0, 0], [0, 0, 0]]))
    with pytest.raises(ValueError, match="feature shape"):
        sh.mean_difference(np.ones((2, 3, 4)), np.ones((2, 3, 5)))
    with pytest.raises(ValueError, match="at least 3 layers"):
        sh.localize_layer(np.ones((2, 4)))
    with pytest.raises(ValueError, match="rule"):
        sh.localize_layer(np.ones((4, 4)), rule="middle")
    with pytest.raises(ValueError, match="trait_neg"):
        sh.filter_pairs([60.0], [120.0], [60.0], [60.0])
    with pytest.raises(ValueError, match="k: expected"):
        sh.top_heads(np.zeros(4), 5)
    with pytest.raises(ValueError, match="points"):
        sh.hypervolume_2d(np.ones((3, 3)))
    with pytest.raises(ValueError, match="head_deltas"):  # the model checks the hook's shape
        model(jnp.zeros((1, 3), jnp.int32), head_deltas=jnp.zeros((L, H + 1, 4)))
