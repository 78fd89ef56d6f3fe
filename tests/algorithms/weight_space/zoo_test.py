"""Tests of the digits model zoo: symmetries, vmapped training, data variants, caching, bad input."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from algorithms.weight_space import zoo as Z
from experiments.tasks.digits import load_digits


def _layers(rng, sizes=(6, 5, 4, 3)):
    return [(rng.normal(size=(a, b)), rng.normal(size=b)) for a, b in zip(sizes[:-1], sizes[1:])]


def test_hidden_permutation_keeps_function():
    rng = np.random.default_rng(0)
    layers = _layers(rng)
    x = rng.normal(size=(7, 6))
    perm = Z.random_permutation(rng, layers)
    assert not np.allclose(perm[0][0], layers[0][0])  # the weights did move
    np.testing.assert_allclose(Z.mlp_apply(perm, x), Z.mlp_apply(layers, x), rtol=1e-12, atol=1e-12)


def test_canonicalize_is_orbit_invariant_and_keeps_function():
    rng = np.random.default_rng(1)
    layers = _layers(rng)
    x = rng.normal(size=(5, 6))
    c1 = Z.canonicalize(layers)
    c2 = Z.canonicalize(Z.random_permutation(rng, layers))
    for (k1, b1), (k2, b2) in zip(c1, c2):
        np.testing.assert_array_equal(k1, k2)
        np.testing.assert_array_equal(b1, b2)
    np.testing.assert_allclose(Z.mlp_apply(c1, x), Z.mlp_apply(layers, x), rtol=1e-12, atol=1e-12)
    norms = np.sqrt((c1[0][0] ** 2).sum(0) + c1[0][1] ** 2)
    assert np.all(np.diff(norms) <= 0)


def test_nnx_model_matches_mlp_apply():
    m = Z.ZooMLP((6, 5, 3), rngs=nnx.Rngs(0))
    layers = [(np.asarray(l.kernel[...]), np.asarray(l.bias[...])) for l in m.layers]
    x = np.random.default_rng(0).normal(size=(4, 6)).astype(np.float32)
    np.testing.assert_allclose(np.asarray(m(jnp.asarray(x))), Z.mlp_apply(layers, x), rtol=1e-5, atol=1e-5)


def test_vmapped_training_equals_single_model_trained_alone():
    rng = np.random.default_rng(0)
    n, d, b = 40, 9, 3
    x = rng.normal(size=(n, 3, 3)).astype(np.float32)
    x_rot = jnp.asarray(Z._rotated(x))
    labels = jnp.asarray(rng.integers(0, 4, (b, n)), jnp.int32)
    weights = jnp.asarray(rng.random((b, n)) < 0.7, jnp.float32)
    rot = jnp.asarray([0, 1, 3], jnp.int32)
    lr = jnp.asarray([1e-2, 3e-3, 5e-3], jnp.float32)
    keys = jax.random.split(jax.random.key(0), b)
    graphdef, states = Z._split_states((d, 5, 4), [1, 2, 3])
    together = Z.train_members(graphdef, states, x_rot, rot, labels, weights, lr, keys, steps=7, batch_size=8)
    for i in range(b):
        alone = Z._train_one(graphdef, jax.tree.map(lambda a: a[i], states), x_rot, rot[i], labels[i],
                             weights[i], lr[i], keys[i], steps=7, batch_size=8)
        for a, t in zip(jax.tree.leaves(alone), jax.tree.leaves(together)):
            np.testing.assert_allclose(np.asarray(t[i]), np.asarray(a), rtol=1e-5, atol=1e-6)
        moved = jax.tree.leaves(alone)[0] - jax.tree.leaves(states)[0][i]
        assert float(jnp.abs(moved).max()) > 0


def test_member_data_variants():
    cfg = Z.ZooConfig(num_models=5, num_subset_classes=3, noise_levels=(0.0,), permute_labels=True)
    v = Z.sample_variants(cfg)
    y = np.arange(50) % 10
    labels, weights = Z.make_member_data(cfg, v, y, train=True)
    for i in range(5):
        np.testing.assert_array_equal(weights[i], np.isin(y, v["subsets"][i]))
        np.testing.assert_array_equal(labels[i], v["perm"][i][y])  # no noise: permuted clean labels
        assert set(np.flatnonzero(v["classes"][i])) == set(v["perm"][i][v["subsets"][i]])
    noisy = Z.ZooConfig(num_models=40, noise_levels=(0.5,))
    vn = Z.sample_variants(noisy)
    yy = np.arange(1000) % 10
    ln, wn = Z.make_member_data(noisy, vn, yy, train=True)
    changed = ((ln != yy) * wn).sum() / wn.sum()
    # p = 0.5 redraw from k = 5 classes changes a label with prob 0.5 * 4/5 = 0.4.
    assert abs(changed - 0.4) < 4 * np.sqrt(0.4 * 0.6 / wn.sum())


def test_build_zoo_small_and_cache(tmp_path):
    (xtr, ytr), (xte, yte) = load_digits()
    cfg = Z.ZooConfig(num_models=4, hidden=(8,), steps=80, batch_size=32, pretrain_steps=40, chunk=3)
    z1 = Z.build_zoo(cfg, (xtr, ytr), (xte, yte), cache_dir=tmp_path, progress=False)
    assert len(list(tmp_path.glob("zoo-*.npz"))) == 1
    z2 = Z.build_zoo(cfg, (xtr, ytr), (xte, yte), cache_dir=tmp_path, progress=False)
    for a, b in zip(z1.kernels + z1.biases, z2.kernels + z2.biases):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(z1.test_acc, z2.test_acc)
    assert z1.layer_matrix(0).shape == (4, 8, 64) and z1.layer_matrix(1).shape == (4, 10, 8)
    np.testing.assert_array_equal(z1.classes.sum(1), 5)
    # Recorded test accuracy is the member's own accuracy, recomputed here with numpy.
    i = 0
    rot = np.rot90(xte, int(z1.rotation[i]), axes=(1, 2)).reshape(len(xte), -1)
    sub = np.isin(z1.perm[i][yte], np.flatnonzero(z1.classes[i]))
    pred = Z.mlp_apply(z1.layers(i), rot).argmax(-1)
    np.testing.assert_allclose(z1.test_acc[i], (pred == z1.perm[i][yte])[sub].mean(), atol=1e-6)
    assert z1.test_acc.mean() > 0.35  # above chance (1/5 of the subset)


def test_bad_input():
    with pytest.raises(ValueError, match="num_subset_classes"):
        Z.ZooConfig(num_subset_classes=11)
    with pytest.raises(ValueError, match="rotations"):
        Z.ZooConfig(rotations=(4,))
    with pytest.raises(ValueError, match="noise_levels"):
        Z.ZooConfig(noise_levels=(1.0,))
    layers = _layers(np.random.default_rng(0))
    with pytest.raises(ValueError, match="perms\\[0\\]"):
        Z.permute_hidden(layers, [np.array([0, 0, 1, 2, 3]), np.arange(4)])
    with pytest.raises(ValueError, match="perms"):
        Z.permute_hidden(layers, [np.arange(5)])
    with pytest.raises(ValueError, match="x: expected square"):
        Z._rotated(np.zeros((2, 3, 4)))
