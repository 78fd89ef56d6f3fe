"""PLMD: known cells never change, deterministic sampling, the loss wiring vs an independent computation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from algorithms.vision import plmd
from primitives import diffusion as sde

CFG = plmd.PLMDConfig(num_labels=4, T=4, channels=(4, 4), u_min=1, u_max=2, jump=1, re=1)


def _maps(seed=0, b=2, n=8):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 4, (b, n, n))
    known = rng.random((b, n, n)) < 0.5
    return labels, known


def _randomise(model, seed=0):
    state = nnx.state(model, nnx.Param)
    leaves, tree = jax.tree.flatten(state)
    keys = jax.random.split(jax.random.PRNGKey(seed), len(leaves))
    nnx.update(model, jax.tree.unflatten(tree, [0.2 * jax.random.normal(k, x.shape) for k, x in zip(keys, leaves)]))


@pytest.fixture(scope="module")
def models():
    m = plmd.init_models(CFG, seed=0)
    _randomise(m)          # a non-trivial (random) denoiser: the guarantee must hold for any model
    return m


@pytest.mark.parametrize("variant", plmd.VARIANTS)
def test_known_cells_unchanged_and_deterministic(models, variant):
    labels, known = _maps()
    out = plmd.complete(models, labels, known, jax.random.PRNGKey(1), CFG, variant=variant)
    lab = np.asarray(out["labels"])
    np.testing.assert_array_equal(lab[known], labels[known])
    assert lab.shape == labels.shape and lab.min() >= 0 and lab.max() < CFG.num_labels
    # Unknown cells of the input are never read.
    scrambled = np.where(known, labels, (labels + 1) % 4)
    again = plmd.complete(models, scrambled, known, jax.random.PRNGKey(1), CFG, variant=variant)
    np.testing.assert_array_equal(np.asarray(again["labels"]), lab)
    np.testing.assert_array_equal(np.asarray(again["obstacle"])[known], labels[known] == CFG.wall_label)


def test_encode_decode_round_trip():
    labels, known = _maps(3)
    e = plmd.encode(labels, known, CFG)
    np.testing.assert_array_equal(np.asarray(plmd.decode(e["x0_s"])), labels)
    np.testing.assert_array_equal(np.asarray(e["mu_s"])[~known], 0.0)
    np.testing.assert_array_equal(np.asarray(e["x0_o"])[..., 0] > 0, labels == CFG.wall_label)


def test_loss_wiring_at_initialisation():
    """At initialisation the U-Nets' output convs are zero (eps_hat = 0): the obstacle loss must equal
    mean |reverse_step(x_t, 0) - x*_{t-1}| computed here in float64 numpy from the same draws."""
    m = plmd.init_models(CFG, seed=0)
    labels, known = _maps(5)
    key = jax.random.PRNGKey(7)
    loss, parts = plmd.loss_fn(m, {"labels": jnp.asarray(labels), "known": jnp.asarray(known)}, key, CFG, CFG.schedule)
    sch = CFG.schedule
    kt, ko, _ = jax.random.split(key, 3)
    t = np.asarray(jax.random.randint(kt, (2,), 1, CFG.T + 1))
    z = np.asarray(jax.random.normal(ko, (2, 8, 8, 1)), np.float64)
    x0 = np.where(labels == CFG.wall_label, 1.0, -1.0)[..., None]
    mu = x0 * known[..., None]
    th, cs = np.asarray(sch.thetas, np.float64), np.asarray(sch.thetas_cumsum, np.float64)
    dt, lam = float(sch.dt), float(sch.max_sigma)
    errs = []
    for i in range(2):
        ti = t[i]
        xt = mu[i] + (x0[i] - mu[i]) * np.exp(-cs[ti] * dt) + lam * np.sqrt(1 - np.exp(-2 * cs[ti] * dt)) * z[i]
        a, b, c = np.exp(-th[ti] * dt), np.exp(-cs[ti] * dt), np.exp(-cs[ti - 1] * dt)
        star = a * (1 - c**2) / (1 - b**2) * (xt - mu[i]) + c * (1 - a**2) / (1 - b**2) * (x0[i] - mu[i]) + mu[i]
        hat = xt - th[ti] * (mu[i] - xt) * dt
        errs.append(np.abs(hat - star))
    np.testing.assert_allclose(float(parts["obstacle"]), np.mean(errs), rtol=1e-4)
    np.testing.assert_allclose(float(loss), sum(float(v) for v in parts.values()), rtol=1e-6)


def test_bad_input(models):
    labels, known = _maps()
    with pytest.raises(ValueError, match="variant"):
        plmd.complete(models, labels, known, jax.random.PRNGKey(0), CFG, variant="ddpm")
    with pytest.raises(ValueError, match="known must"):
        plmd.complete(models, labels, known[:, :4], jax.random.PRNGKey(0), CFG)
    with pytest.raises(ValueError, match="labels must be \\[b"):
        plmd.complete(models, labels[0], known[0], jax.random.PRNGKey(0), CFG)
    with pytest.raises(ValueError, match="u_min"):
        plmd.PLMDConfig(u_min=5, u_max=2)
    with pytest.raises(ValueError, match="wall_label"):
        plmd.PLMDConfig(num_labels=3, wall_label=3)
