"""k-means: recovery of separated clusters, monotone inertia, empty clusters, determinism, brute force."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from primitives import kmeans as km


def _blobs(seed, groups=3, k=4, per=25, d=8, spread=0.05):
    """Well-separated clusters: centers on a scaled simplex, tiny noise; returns x [g, s, d] and labels [g, s]."""
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((groups, k, d)) * 10.0
    truth = np.stack([rng.permutation(np.repeat(np.arange(k), per)) for _ in range(groups)])
    x = np.take_along_axis(centers, truth[..., None], axis=1) + spread * rng.standard_normal((groups, k * per, d))
    return x.astype(np.float32), truth


def _same_partition(a, b):
    """True when two labelings define the same partition (equal up to renaming)."""
    return len(set(zip(a.tolist(), b.tolist()))) == len(set(a.tolist())) == len(set(b.tolist()))


def test_recovers_well_separated_clusters_in_every_group():
    x, truth = _blobs(0)
    # Lloyd from random points often merges two blobs (a local optimum); over 16 restarts (one batched
    # call, independent inits per group) the lowest-inertia result of every group must be the truth.
    restarts = 16
    res = km.kmeans(jnp.broadcast_to(jnp.asarray(x), (restarts,) + x.shape), jax.random.key(0),
                    num_centroids=4, max_iters=20)
    best = np.argmin(np.asarray(res.inertia), axis=0)  # [groups]
    for g in range(x.shape[0]):
        assert _same_partition(np.asarray(res.labels[best[g], g]), truth[g])


def test_inertia_never_increases_and_matches_history():
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.standard_normal((4, 200, 6)).astype(np.float32))
    res = km.kmeans(x, jax.random.key(0), num_centroids=12, max_iters=15, tol=0.0)
    hist = np.asarray(res.history)
    assert np.all(np.diff(hist, axis=-1) <= 1e-5 * hist[..., :1])
    np.testing.assert_allclose(res.inertia, km.inertia(x, res.labels, res.centroids), rtol=1e-5)
    # Labels are the nearest centroids under the returned centroids.
    np.testing.assert_array_equal(res.labels, km.assign(x, res.centroids))


def test_steps_match_a_numpy_lloyd_iteration():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((50, 3)).astype(np.float64)
    c = x[[0, 7, 19, 33]].copy()
    lab = np.argmin(((x[:, None] - c[None]) ** 2).sum(-1), 1)
    for _ in range(3):
        c = np.stack([x[lab == j].mean(0) if np.any(lab == j) else c[j] for j in range(4)])
        lab = np.argmin(((x[:, None] - c[None]) ** 2).sum(-1), 1)
    cj = jnp.asarray(x[[0, 7, 19, 33]], jnp.float32)[None]
    xj = jnp.asarray(x, jnp.float32)[None]
    lj = km.assign(xj, cj)
    for _ in range(3):
        cj = km.update_centroids(xj, lj, cj)
        lj = km.assign(xj, cj)
    np.testing.assert_array_equal(lj[0], lab)
    np.testing.assert_allclose(cj[0], c, rtol=1e-5, atol=1e-6)


def test_empty_cluster_keeps_its_centroid():
    x = jnp.asarray([[[0.0], [0.1], [5.0]]])
    old = jnp.asarray([[[0.0], [5.0], [100.0]]])
    labels = jnp.asarray([[0, 0, 1]])
    new = km.update_centroids(x, labels, old)
    np.testing.assert_allclose(new[0, :, 0], [0.05, 5.0, 100.0])


def test_deterministic_given_the_key_and_key_dependent():
    x = jnp.asarray(np.random.default_rng(3).standard_normal((2, 64, 4)).astype(np.float32))
    a = km.kmeans(x, jax.random.key(5), num_centroids=8)
    b = km.kmeans(x, jax.random.key(5), num_centroids=8)
    c = km.kmeans(x, jax.random.key(6), num_centroids=8)
    np.testing.assert_array_equal(a.centroids, b.centroids)
    np.testing.assert_array_equal(a.labels, b.labels)
    assert not np.array_equal(np.asarray(a.centroids), np.asarray(c.centroids))


def test_k_at_least_s_is_exact_and_capped():
    x = jnp.asarray(np.random.default_rng(4).standard_normal((2, 5, 3)).astype(np.float32))
    res = km.kmeans(x, jax.random.key(0), num_centroids=9)
    assert res.centroids.shape == (2, 5, 3)
    np.testing.assert_array_equal(jnp.take_along_axis(res.centroids, res.labels[..., None], axis=1), x)
    assert float(res.inertia.max()) == 0.0


def test_converged_result_is_a_local_optimum_close_to_brute_force_on_a_tiny_instance():
    # 8 points, 2 clusters: enumerate all 2^7 partitions for the optimal inertia.
    x = np.asarray([[0.0], [0.2], [0.4], [3.0], [3.1], [3.5], [8.0], [8.2]], np.float64)
    best = min(sum(((x[np.array(p) == j] - x[np.array(p) == j].mean()) ** 2).sum() for j in (0, 1)
                   if np.any(np.array(p) == j))
               for p in itertools.product((0, 1), repeat=8) if len(set(p)) == 2)
    inertias = [float(km.kmeans(jnp.asarray(x, jnp.float32), jax.random.key(r), num_centroids=2,
                                max_iters=20).inertia) for r in range(8)]
    assert min(inertias) == pytest.approx(best, rel=1e-5)


def test_bad_arguments_are_named():
    x = jnp.zeros((4, 2))
    with pytest.raises(ValueError, match="num_centroids"):
        km.kmeans(x, jax.random.key(0), num_centroids=0)
    with pytest.raises(ValueError, match="x must be"):
        km.kmeans(jnp.zeros(3), jax.random.key(0), num_centroids=1)
    with pytest.raises(ValueError, match="centroids"):
        km.assign(x[None], jnp.zeros((1, 2, 3)))
