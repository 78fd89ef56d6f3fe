"""Batched Euclidean k-means (Lloyd) with deterministic centroid updates.

Dimension legend: ``...`` independent groups (e.g. batch x heads of a KV cache), ``s`` points per
group, ``d`` features, ``k`` centroids.

One Lloyd step, per group:

  * **update**: each centroid becomes the mean of its points, computed with ``jax.ops.segment_sum``
    (a fixed reduction order, so runs are bit-reproducible; the atomic adds of a GPU scatter are
    not). A centroid with no points keeps its previous value.
  * **assign**: every point moves to its nearest centroid, with squared distances expanded as
    ``|x|^2 - 2 x.c + |c|^2`` (one matmul, what the Pallas assignment kernel tiles); ties go to the
    lowest centroid index.

Initialization takes ``k`` distinct random points of the group (``jax.random.permutation``). The
loop stops after ``max_iters`` steps or once the fraction of points that changed label in a step is
below ``tol``. Each step can only lower the inertia ``sum_i |x_i - c[a_i]|^2`` (the update minimizes
it for fixed labels, the assignment for fixed centroids), which the tests check step by step.

When ``k >= s`` every point can be its own centroid; :func:`kmeans` then uses ``k = s`` (the
result is exact: each centroid is its single point), so callers never store unused centroids.

Examples:
    >>> import jax, jax.numpy as jnp
    >>> x = jnp.array([[0., 0.], [0., 1.], [10., 10.], [10., 11.]])
    >>> res = kmeans(x, jax.random.key(0), num_centroids=2)
    >>> bool(res.labels[0] == res.labels[1]) and bool(res.labels[2] == res.labels[3])
    True
    >>> sorted(res.centroids.tolist())
    [[0.0, 0.5], [10.0, 10.5]]

References:
  Lloyd, "Least squares quantization in PCM", IEEE Trans. Inf. Theory 28(2), 1982.
  Quant VideoGen (QVG), arXiv:2602.02958 (k-means smoothing of KV caches; the official code's
    centroid update uses atomics, which the paper's reproducers found to be non-deterministic).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

__all__ = ["KMeansResult", "assign", "update_centroids", "inertia", "kmeans"]


class KMeansResult(NamedTuple):
    """k-means output for a batch of groups.

    Attributes:
      centroids: [..., k, d] float32.
      labels: [..., s] int32, the nearest centroid of each point (under ``centroids``).
      inertia: [...] float32, ``sum_i |x_i - centroids[labels_i]|^2``.
      iterations: [...] int32, Lloyd steps taken.
      history: [..., max_iters + 1] float32, the inertia after initialization and after each step
        (repeated after the stop).
    """

    centroids: jax.Array
    labels: jax.Array
    inertia: jax.Array
    iterations: jax.Array
    history: jax.Array


def _sq_distances(x: jax.Array, c: jax.Array) -> jax.Array:
    """[s, d], [k, d] -> [s, k] squared distances ``|x|^2 - 2 x.c + |c|^2`` (clamped at 0)."""
    xx = jnp.sum(x * x, axis=-1, keepdims=True)
    cc = jnp.sum(c * c, axis=-1)[None, :]
    xc = jnp.matmul(x, c.T, precision=jax.lax.Precision.HIGHEST)
    return jnp.maximum(xx - 2.0 * xc + cc, 0.0)


def assign(x: jax.Array, centroids: jax.Array) -> jax.Array:
    """Nearest-centroid labels: x [..., s, d], centroids [..., k, d] -> [..., s] int32."""
    _check_pair(x, centroids)
    f = lambda xi, ci: jnp.argmin(_sq_distances(xi, ci), axis=-1).astype(jnp.int32)
    return _over_groups(f, x.astype(jnp.float32), centroids.astype(jnp.float32))


def update_centroids(x: jax.Array, labels: jax.Array, centroids: jax.Array) -> jax.Array:
    """Means of the points of each label (segment sums); empty clusters keep ``centroids``.

    Args:
      x: [..., s, d]; labels: [..., s] ints in [0, k); centroids: [..., k, d] (the previous ones).

    Returns:
      [..., k, d] float32.
    """
    _check_pair(x, centroids)

    def f(xi, li, ci):
        k = ci.shape[0]
        sums = jax.ops.segment_sum(xi, li, num_segments=k, indices_are_sorted=False)
        counts = jax.ops.segment_sum(jnp.ones(li.shape, jnp.float32), li, num_segments=k)
        return jnp.where(counts[:, None] > 0, sums / jnp.maximum(counts, 1.0)[:, None], ci)

    return _over_groups(f, x.astype(jnp.float32), labels.astype(jnp.int32), centroids.astype(jnp.float32))


def inertia(x: jax.Array, labels: jax.Array, centroids: jax.Array) -> jax.Array:
    """``sum_i |x_i - centroids[labels_i]|^2`` per group: [..., s, d], [..., s], [..., k, d] -> [...]."""
    gathered = jnp.take_along_axis(centroids.astype(jnp.float32), labels[..., None].astype(jnp.int32), axis=-2)
    return jnp.sum((x.astype(jnp.float32) - gathered) ** 2, axis=(-2, -1))


def kmeans(x: jax.Array, key: jax.Array, *, num_centroids: int, max_iters: int = 10,
           tol: float = 1e-4) -> KMeansResult:
    """Lloyd's k-means on every group of ``x`` independently.

    Args:
      x: [..., s, d] float points (s >= 1).
      key: PRNG key for the initialization (one independent draw per group).
      num_centroids: k >= 1; capped at s (every point its own centroid).
      max_iters: the most Lloyd steps (>= 0; 0 returns the initialization).
      tol: stop once the fraction of points that changed label in a step is below this.

    Returns:
      A :class:`KMeansResult` with ``min(k, s)`` centroids per group.
    """
    if x.ndim < 2:
        raise ValueError(f"x must be [..., s, d]; got shape {x.shape}")
    if x.shape[-2] < 1:
        raise ValueError(f"x must hold at least one point per group (s >= 1); got shape {x.shape}")
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise ValueError(f"x must be a floating-point array; got dtype {x.dtype}")
    if int(num_centroids) < 1:
        raise ValueError(f"num_centroids must be >= 1; got {num_centroids}")
    if int(max_iters) < 0:
        raise ValueError(f"max_iters must be >= 0; got {max_iters}")
    if not tol >= 0:
        raise ValueError(f"tol must be >= 0; got {tol}")
    s = x.shape[-2]
    k = min(int(num_centroids), s)
    lead = x.shape[:-2]
    flat = x.reshape(-1, s, x.shape[-1]).astype(jnp.float32)
    keys = jax.random.split(key, flat.shape[0])
    out = jax.vmap(lambda xi, ki: _kmeans_one(xi, ki, k=k, max_iters=int(max_iters), tol=float(tol)))(flat, keys)
    return KMeansResult(
        centroids=out.centroids.reshape(*lead, k, x.shape[-1]),
        labels=out.labels.reshape(*lead, s),
        inertia=out.inertia.reshape(lead),
        iterations=out.iterations.reshape(lead),
        history=out.history.reshape(*lead, int(max_iters) + 1),
    )


def _kmeans_one(x: jax.Array, key: jax.Array, *, k: int, max_iters: int, tol: float) -> KMeansResult:
    s = x.shape[0]
    c0 = x[jax.random.permutation(key, s)[:k]]
    l0 = jnp.argmin(_sq_distances(x, c0), axis=-1).astype(jnp.int32)
    i0 = inertia(x, l0, c0)
    hist0 = jnp.full((max_iters + 1,), i0)

    def cond(state):
        it, _, _, changed, _ = state
        return (it < max_iters) & (changed >= tol)

    def body(state):
        it, c, lab, _, hist = state
        c = update_centroids(x, lab, c)
        new = jnp.argmin(_sq_distances(x, c), axis=-1).astype(jnp.int32)
        changed = jnp.mean((new != lab).astype(jnp.float32))
        value = inertia(x, new, c)
        hist = jnp.where(jnp.arange(max_iters + 1) > it, value, hist)
        return it + 1, c, new, changed, hist

    it, c, lab, _, hist = jax.lax.while_loop(cond, body, (jnp.int32(0), c0, l0, jnp.float32(1.0), hist0))
    return KMeansResult(c, lab, hist[-1], it, hist)


def _check_pair(x: jax.Array, centroids: jax.Array) -> None:
    if x.ndim < 2 or centroids.ndim != x.ndim or centroids.shape[:-2] != x.shape[:-2] \
            or centroids.shape[-1] != x.shape[-1]:
        raise ValueError(f"x [..., s, d] and centroids [..., k, d] must share leading dims and d; got shapes "
                         f"{x.shape} and {centroids.shape}")


def _over_groups(f, *arrays):
    """Applies the per-group function ``f`` over the flattened leading dims of ``arrays``."""
    lead = arrays[0].shape[:-2]
    flat = [a.reshape(-1, *a.shape[len(lead):]) for a in arrays]
    out = jax.vmap(f)(*flat)
    return out.reshape(*lead, *out.shape[1:])
