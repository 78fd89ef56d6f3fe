"""Tests of algorithms.scaling.dynamic_sparse: exact per-matrix density at init, after prune/regrow and
after optimizer steps; embeddings, output projection and norms stay dense; the pruned set is the
k = ceil(p nnz) smallest-magnitude active weights (numpy brute force); regrowth only among inactive
entries; regrown weights start at zero with zero Adam moments; inactive weights have zero moments
during training; the cosine prune-rate schedule; density 1 trains densely."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from algorithms import training
from algorithms.scaling import dynamic_sparse as ds
from models import Transformer, TransformerConfig

CFG = TransformerConfig(vocab_size=16, d_model=16, num_layers=1, num_heads=2, num_kv_heads=1, d_ff=32)
OPT = training.OptimizerConfig(learning_rate=1e-2, warmup_steps=2, total_steps=24, weight_decay=0.0, clip_norm=None)


def _flat(tree):
    return {jax.tree_util.keystr(p): np.asarray(x) for p, x in jax.tree_util.tree_leaves_with_path(tree)}


def _batch(i):
    """Learnable sequences: a random start, then +1 mod vocab."""
    start = np.random.default_rng(i).integers(0, CFG.vocab_size, (4, 1))
    x = (start + np.arange(9)[None, :]) % CFG.vocab_size
    return {"inputs": x[:, :-1], "targets": x[:, 1:], "loss_mask": np.ones((4, 8), np.float32)}


@pytest.fixture(scope="module")
def setup():
    optimizer = training.make_optimizer(OPT)
    fns = ds.make_dst_functions(lambda r: Transformer(CFG, rngs=r), optimizer)
    state, masks = fns.init(jnp.int32(0), jnp.float32(1.0))
    assert all(np.asarray(m).all() for m in jax.tree.leaves(masks))
    return optimizer, fns.graphdef, state, fns


def _is_sparse(name):
    return ("layers" in name) and not name.endswith("['scale']")


def test_init_masks_exact_density_and_dense_exclusions(setup):
    _, _, state, fns = setup
    for density in (0.5, 0.25, 0.1):
        masks = _flat(fns.init(jnp.int32(1), jnp.float32(density))[1])  # init_masks inside the jitted init
        assert set(masks) == set(_flat(state.params))
        for name, m in masks.items():
            if _is_sparse(name):
                assert m.sum() == max(1, round(density * m.size)), name
            else:  # embed, unembed, norm scales
                assert m.all(), name
    flags = _flat(ds.sparse_leaves(state.params))
    assert not flags["['embed']"] and not flags["['unembed']"] and flags["['layers'][0]['attn']['wq']"]
    masks = ds.init_masks(jax.random.key(1), state.params, 0.25)  # the public function, same counts
    assert all(np.asarray(m).sum() == v.sum() for m, v in zip(jax.tree.leaves(masks), jax.tree.leaves(
        fns.init(jnp.int32(1), jnp.float32(0.25))[1])))
    with pytest.raises(ValueError, match="density"):
        ds.init_masks(jax.random.key(0), state.params, 0.0)


def _update(fns, seed, density, rate, key):
    """(params before, masks before, params after, masks after, regrown, pruned) of one jitted update."""
    state, masks = fns.init(jnp.int32(seed), jnp.float32(density))
    before_p, before_m = _flat(state.params), _flat(masks)
    state, new_m, stats = fns.update(jax.random.key(key), state, masks, jnp.float32(rate))
    return before_p, before_m, _flat(state.params), _flat(new_m), _flat(stats["regrown_mask"]), \
        _flat(stats["pruned_mask"])


def test_prune_and_regrow_matches_brute_force(setup):
    _, _, _, fns = setup
    rate = 0.2
    old_w, old_m, nw, nm, rg, pr = _update(fns, 2, 0.3, rate, 3)
    for name in old_w:
        if not _is_sparse(name):
            assert np.array_equal(nw[name], old_w[name]) and nm[name].all() and not rg[name].any()
            continue
        nnz = old_m[name].sum()
        k = math.ceil(rate * nnz)
        assert nm[name].sum() == nnz  # density unchanged
        assert pr[name].sum() == k and rg[name].sum() == k
        # Pruned = the k smallest |w| among active (brute force; random normal init has no ties).
        active_vals = np.abs(old_w[name][old_m[name]])
        thresh = np.sort(active_vals)[k - 1]
        assert np.array_equal(pr[name], old_m[name] & (np.abs(old_w[name]) <= thresh))
        assert not (rg[name] & old_m[name]).any()  # regrown only among previously inactive
        assert np.array_equal(nm[name], (old_m[name] & ~pr[name]) | rg[name])
        assert np.all(nw[name][rg[name]] == 0.0)  # zero init
        assert np.all(nw[name][~nm[name]] == 0.0)
        keep = nm[name] & ~rg[name]
        assert np.array_equal(nw[name][keep], old_w[name][keep])


def test_regrowth_is_random_and_cap_makes_dense_a_no_op(setup):
    _, _, _, fns = setup
    r1 = _update(fns, 2, 0.3, 0.2, 3)[4]
    r2 = _update(fns, 2, 0.3, 0.2, 4)[4]
    assert any(not np.array_equal(r1[n], r2[n]) for n in r1 if _is_sparse(n))
    old_w, _, nw, nm, rg, _ = _update(fns, 0, 1.0, 0.1, 0)
    assert all(np.array_equal(nw[n], old_w[n]) for n in nw)
    assert all(m.all() for m in nm.values()) and not any(r.any() for r in rg.values())


def _adam_moments(opt_state):
    found = []
    for leaf in jax.tree.leaves(opt_state, is_leaf=lambda x: hasattr(x, "mu") and hasattr(x, "nu")):
        if hasattr(leaf, "mu"):
            found.append(leaf)
    assert len(found) == 1
    return _flat(found[0].mu), _flat(found[0].nu)


def test_training_keeps_density_and_moments_of_inactive_and_regrown_are_zero(setup):
    optimizer, graphdef, state0, fns = setup
    density = 0.25
    masks = ds.init_masks(jax.random.key(5), state0.params, density)
    state = state0._replace(params=ds.apply_masks(state0.params, masks))
    state = jax.tree.map(jnp.array, state)  # a copy: the step donates its input
    init_masks = _flat(masks)
    key = jax.random.key(6)
    for step in range(12):
        state, metrics = fns.train_step(state, masks, _batch(step))
        assert np.isfinite(float(metrics["loss"]))
        mu, nu = _adam_moments(state.opt_state)
        w, m = _flat(state.params), _flat(masks)
        for name in w:
            assert np.all(w[name][~m[name]] == 0.0)  # mask applied after the optimizer step
            assert np.all(mu[name][~m[name]] == 0.0) and np.all(nu[name][~m[name]] == 0.0)
            if _is_sparse(name):
                assert m[name].sum() == round(density * m[name].size)
        if step % 4 == 3:
            key, sub = jax.random.split(key)
            before_mu, _ = _adam_moments(state.opt_state)
            before_m = _flat(masks)
            state, masks, stats = fns.update(sub, state, masks, jnp.float32(0.3))
            assert int(stats["pruned"]) == int(stats["regrown"]) > 0
            mu, nu = _adam_moments(state.opt_state)
            w, m = _flat(state.params), _flat(masks)
            for name in w:
                grown = m[name] & ~before_m[name]
                assert np.all(w[name][grown] == 0.0)
                assert np.all(mu[name][grown] == 0.0) and np.all(nu[name][grown] == 0.0)
                assert np.all(mu[name][~m[name]] == 0.0) and np.all(nu[name][~m[name]] == 0.0)
                kept = m[name] & before_m[name]
                assert np.array_equal(mu[name][kept], before_mu[name][kept])
    # Topology evolved, density did not.
    final = _flat(masks)
    assert any(not np.array_equal(final[n], init_masks[n]) for n in final if _is_sparse(n))


def test_prune_rate_schedule():
    assert float(ds.prune_rate(0, 100, 0.1)) == pytest.approx(0.1)
    assert float(ds.prune_rate(50, 100, 0.1)) == pytest.approx(0.05, abs=1e-7)
    assert float(ds.prune_rate(100, 100, 0.1)) == pytest.approx(0.0, abs=1e-8)
    assert float(ds.prune_rate(150, 100, 0.1)) == pytest.approx(0.0, abs=1e-8)
    r = [float(ds.prune_rate(t, 100)) for t in range(101)]
    assert all(a >= b for a, b in zip(r, r[1:]))
    with pytest.raises(ValueError, match="total_steps"):
        ds.prune_rate(0, 0)


def test_train_dst_driver_exact_density_and_dense_baseline(setup):
    optimizer, graphdef, _, fns = setup
    kw = dict(model_fn=lambda r: Transformer(CFG, rngs=r), optimizer_config=OPT, batch_fn=_batch, num_steps=12,
              update_frequency=4, initial_prune_rate=0.3, functions=fns, progress=False,
              eval_steps=(0, 6, 12))
    evals = lambda p: float(fns.loss(p, _batch(999))["loss"])  # noqa: E731
    sparse = ds.train_dst(density=0.25, eval_fn=evals, **kw)
    assert sorted(sparse.evals) == [0, 6, 12]
    m = _flat(sparse.masks)
    assert sum(v.sum() for n, v in m.items() if _is_sparse(n)) == sum(
        round(0.25 * v.size) for n, v in m.items() if _is_sparse(n))
    assert sparse.nnz <= round(0.25 * sparse.num_sparse) and sparse.nnz > 0.9 * 0.25 * sparse.num_sparse
    assert sparse.evals[12] < sparse.evals[0]  # it learns
    dense = ds.train_dst(density=1.0, eval_fn=evals, **kw)
    assert dense.nnz == dense.num_sparse
    with pytest.raises(ValueError, match="update_frequency"):
        ds.train_dst(density=0.5, **dict(kw, update_frequency=0))
