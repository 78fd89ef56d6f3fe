"""U-Net with SPADE: shapes, time and condition dependence, SPADE reduces to plain normalisation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from models import unet as u


def _randomise(model, seed=0):
    """Replace every parameter by random values (the output conv and SPADE gamma/beta start at zero)."""
    state = nnx.state(model, nnx.Param)
    leaves, tree = jax.tree.flatten(state)
    keys = jax.random.split(jax.random.PRNGKey(seed), len(leaves))
    new = [0.3 * jax.random.normal(k, x.shape) for k, x in zip(keys, leaves)]
    nnx.update(model, jax.tree.unflatten(tree, new))


def test_group_norm_vs_numpy():
    h = jax.random.normal(jax.random.PRNGKey(0), (2, 4, 4, 6)) * 3 + 1
    got = np.asarray(u.group_norm(h, 2))
    x = np.asarray(h, np.float64).reshape(2, 4, 4, 2, 3)
    ref = ((x - x.mean((1, 2, 4), keepdims=True)) / np.sqrt(x.var((1, 2, 4), keepdims=True) + 1e-5)).reshape(2, 4, 4, 6)
    np.testing.assert_allclose(got, ref, atol=1e-4)


def test_spade_zero_gamma_beta_is_plain_norm_and_depends_on_s_only_through_them():
    sp = u.SPADE(8, 1, 4, 2, rngs=nnx.Rngs(0))
    h = jax.random.normal(jax.random.PRNGKey(1), (2, 8, 8, 8))
    s1 = jax.random.normal(jax.random.PRNGKey(2), (2, 8, 8, 1)); s2 = -s1
    # gamma = beta = 0 at initialisation: plain group norm, whatever S is.
    np.testing.assert_allclose(np.asarray(sp(h, s1)), np.asarray(u.group_norm(h, 2)), atol=1e-6)
    np.testing.assert_allclose(np.asarray(sp(h, s2)), np.asarray(u.group_norm(h, 2)), atol=1e-6)
    _randomise(sp)
    out1, out2 = sp(h, s1), sp(h, s2)
    assert float(jnp.abs(out1 - out2).max()) > 1e-3
    g, b = sp.modulation(s1, (8, 8))
    np.testing.assert_allclose(np.asarray(out1), np.asarray(u.group_norm(h, 2) * (1 + g) + b), atol=1e-5)
    # Lower resolution blocks see S average-pooled.
    g4, _ = sp.modulation(s1, (4, 4))
    assert g4.shape == (2, 4, 4, 8)


def test_unet_shapes_and_dependencies():
    cfg = u.UNetConfig(in_channels=3, cond_channels=2, spade_channels=1, channels=(8, 8))
    net = u.UNet(cfg, rngs=nnx.Rngs(0))
    graphdef = nnx.graphdef(net)
    # One compiled forward per batch size (op-by-op eager calls compile every op: ~25 s on 2 cores).
    apply = jax.jit(lambda state, x, c, t, s: nnx.merge(graphdef, state)(x, c, t, spade=s))
    x = jax.random.normal(jax.random.PRNGKey(0), (2, 8, 8, 3))
    c = jax.random.normal(jax.random.PRNGKey(1), (2, 8, 8, 2))
    s = jax.random.normal(jax.random.PRNGKey(2), (2, 8, 8, 1))
    out = apply(nnx.state(net), x, c, jnp.array([1, 5]), s)
    assert out.shape == x.shape and float(jnp.abs(out).max()) == 0.0   # zero-initialised output conv
    _randomise(net)
    state = nnx.state(net)
    base = apply(state, x, c, jnp.array([1, 5]), s)
    for other in (apply(state, x, c, jnp.array([2, 9]), s), apply(state, x, -c, jnp.array([1, 5]), s),
                  apply(state, x, c, jnp.array([1, 5]), -s)):
        assert float(jnp.abs(other - base).max()) > 1e-4
    # Per-sample independence (group norm statistics are per image).
    single = apply(state, x[:1], c[:1], jnp.array([1]), s[:1])
    np.testing.assert_allclose(np.asarray(single), np.asarray(base[:1]), atol=1e-4)


def test_bad_input():
    with pytest.raises(ValueError, match="num_groups"):
        u.UNetConfig(channels=(6, 8), num_groups=4)
    with pytest.raises(ValueError, match="channels"):
        u.UNetConfig(channels=())
    net = u.UNet(u.UNetConfig(in_channels=1, cond_channels=1, spade_channels=1, channels=(8, 8)), rngs=nnx.Rngs(0))
    z = jnp.zeros((1, 8, 8, 1))
    with pytest.raises(ValueError, match="x must"):
        net(jnp.zeros((1, 8, 8, 2)), z, jnp.array([1]), spade=z)
    with pytest.raises(ValueError, match="divisible"):
        net(jnp.zeros((1, 7, 8, 1)), jnp.zeros((1, 7, 8, 1)), jnp.array([1]), spade=jnp.zeros((1, 7, 8, 1)))
    with pytest.raises(ValueError, match="spade must"):
        net(z, z, jnp.array([1]))
    with pytest.raises(ValueError, match="cond must"):
        net(z, None, jnp.array([1]), spade=z)
