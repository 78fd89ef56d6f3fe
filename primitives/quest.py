"""Quest page selection: per-page key bounds, query-aware upper bounds, top pages.

Dimension legend: ``...`` leading batch dims (batch, KV heads, layers, ...), ``n`` tokens, ``d`` head
dim, ``P = ceil(n / bs)`` pages of ``bs`` tokens, ``K`` a static number of listed pages.

Quest keeps, for every page of ``bs`` consecutive keys, the element-wise minimum and maximum of its
keys (:func:`page_bounds`). For a query ``q`` the score of any key ``k`` of the page is bounded by

    q . k = sum_d q_d k_d <= sum_d max(q_d lo_d, q_d hi_d)                        (:func:`page_scores`)

since ``q_d k_d`` is linear in ``k_d`` in ``[lo_d, hi_d]``. A decode step attends only to the pages
with the largest bounds: :func:`select_pages` marks them ``[..., P]`` (any traced count per row),
:func:`top_pages` lists them ``[..., K]`` in rank order (a static capacity). Both rank by decreasing
score with ties to the lower page index and skip pages with no valid key (score ``-inf``).

Callers: ``primitives.ffd`` (the Quest baseline over FFD's head-major pages ``[b, k, p, bs, d]``)
and ``algorithms.decoding.vegas`` (the Quest drafter over the model's KV cache).

Example:
    >>> import jax.numpy as jnp
    >>> keys = jnp.array([[1., 0.], [0., 1.], [-1., 0.], [0., -1.], [2., 2.]])  # n = 5, d = 2
    >>> lo, hi = page_bounds(keys, page_size=2, valid_len=5)                     # P = 3 pages
    >>> lo.tolist(), hi.tolist()
    ([[0.0, 0.0], [-1.0, -1.0], [2.0, 2.0]], [[1.0, 1.0], [0.0, 0.0], [2.0, 2.0]])
    >>> s = page_scores(jnp.array([1., -1.]), lo, hi)   # >= q.k of every key of the page
    >>> s.tolist()
    [1.0, 1.0, 0.0]
    >>> select_pages(s, 2).tolist()                     # ties go to the lower page
    [True, True, False]
    >>> idx, ok = top_pages(s, 3, num_pages=1)
    >>> idx.tolist(), ok.tolist()
    ([0, 1, 2], [True, False, False])

References:
  Tang et al., "Quest: Query-Aware Sparsity for Efficient Long-Context LLM Inference",
    arXiv:2406.10774, 2024.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

__all__ = ["page_bounds", "page_scores", "select_pages", "top_pages"]


def page_bounds(keys: jax.Array, *, page_size: int,
                valid_len: int | jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    """Per-page element-wise minimum and maximum of the keys (Quest's page metadata).

    Args:
      keys: [..., n, d] keys, tokens on the second-to-last axis (head-major).
      page_size: bs, tokens per page; when ``bs`` does not divide ``n`` the last page holds fewer keys.
      valid_len: keys at positions >= valid_len are excluded (an int or an int array broadcastable
        to ``keys.shape[:-2]``); None = all ``n`` keys. A page without a valid key gets ``+inf`` /
        ``-inf`` bounds (and :func:`page_scores` gives it ``-inf``).

    Returns:
      (lo, hi): float32 [..., P, d] each, ``P = ceil(n / bs)``.
    """
    if keys.ndim < 2:
        raise ValueError(f"keys must be [..., n, d]; got shape {keys.shape}")
    if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1:
        raise ValueError(f"page_size must be a positive int; got {page_size!r}")
    *lead, n, d = keys.shape
    p = math.ceil(n / page_size)
    pad = p * page_size - n
    x = keys.astype(jnp.float32)
    if pad:
        x = jnp.pad(x, [(0, 0)] * len(lead) + [(0, pad), (0, 0)])
    x = x.reshape(*lead, p, page_size, d)
    if valid_len is None and not pad:
        return jnp.min(x, axis=-2), jnp.max(x, axis=-2)
    vl = jnp.asarray(n if valid_len is None else valid_len)
    try:
        jnp.broadcast_shapes(vl.shape, tuple(lead))
    except ValueError:
        raise ValueError(f"valid_len must broadcast to keys.shape[:-2]={tuple(lead)}; got shape {vl.shape}") from None
    pos = jnp.arange(p * page_size)
    valid = ((pos < vl[..., None]) & (pos < n)).reshape(*vl.shape, p, page_size, 1)
    lo = jnp.where(valid, x, jnp.inf).min(axis=-2)
    hi = jnp.where(valid, x, -jnp.inf).max(axis=-2)
    return lo, hi


def page_scores(q: jax.Array, lo: jax.Array, hi: jax.Array) -> jax.Array:
    """Quest's upper bound ``sum_d max(q_d lo_d, q_d hi_d)`` of ``q . k`` over the keys of each page.

    Args:
      q: [..., d] queries.
      lo, hi: [..., d] page bounds from :func:`page_bounds`; broadcast against ``q`` over the leading
        dims (e.g. ``q [b, k, g, 1, d]`` with ``lo [b, k, 1, P, d]`` scores every head's pages).

    Returns:
      float32 [...] (the broadcast leading shape): the bound, ``-inf`` where it is not finite (pages
      without a valid key).
    """
    if lo.shape != hi.shape:
        raise ValueError(f"lo and hi must have the same shape; got {lo.shape} and {hi.shape}")
    if q.ndim < 1 or lo.ndim < 1 or q.shape[-1] != lo.shape[-1]:
        raise ValueError(f"q [..., d] and the bounds [..., d] must share d; got q {q.shape}, bounds {lo.shape}")
    qf = q.astype(jnp.float32)
    bound = jnp.maximum(qf * lo.astype(jnp.float32), qf * hi.astype(jnp.float32)).sum(-1)
    return jnp.where(jnp.isfinite(bound), bound, -jnp.inf)


def _ranks(scores: jax.Array) -> jax.Array:
    """Rank of each entry of the last axis by decreasing score (0 = best; ties to the lower index)."""
    return jnp.argsort(jnp.argsort(-scores, axis=-1, stable=True), axis=-1, stable=True)


def select_pages(scores: jax.Array, num_pages, *, valid: jax.Array | None = None) -> jax.Array:
    """The ``num_pages`` highest-scoring valid pages of each row, as a mask.

    Args:
      scores: [..., P] page scores (e.g. from :func:`page_scores`).
      num_pages: pages to keep: an int >= 0, or an int array (traced allowed) broadcastable to
        ``scores.shape[:-1]`` (a count per row).
      valid: bool broadcastable to ``scores``: the pages that may be kept; None = the pages with a
        finite score.

    Returns:
      keep: bool [..., P] (broadcast shape), ``min(num_pages, valid pages)`` True per row: the valid
      pages of rank < num_pages by decreasing score, ties to the lower page index.
    """
    if isinstance(num_pages, (int, float)):
        if num_pages < 0:
            raise ValueError(f"num_pages must be >= 0, got {num_pages}")
        n = jnp.asarray(int(num_pages))
    else:
        n = jnp.asarray(num_pages)[..., None]
    valid = jnp.isfinite(scores) if valid is None else valid
    rank = _ranks(jnp.where(valid, scores, -jnp.inf))
    return (rank < n) & valid


def top_pages(scores: jax.Array, max_pages: int, num_pages=None) -> tuple[jax.Array, jax.Array]:
    """The best ``max_pages`` pages of each row, listed by decreasing score.

    Args:
      scores: [..., P] page scores.
      max_pages: static capacity K (clipped to P).
      num_pages: pages in use per row (an int or an int array broadcastable to ``scores.shape[:-1]``,
        traced allowed); None = K.

    Returns:
      (indices int32 [..., K], ok bool [..., K]): page indices by decreasing score (ties to the lower
      index); ``ok`` marks the first ``num_pages`` entries with a finite score. The pages marked ok
      are exactly those :func:`select_pages` keeps.
    """
    if isinstance(max_pages, bool) or not isinstance(max_pages, int) or max_pages < 1:
        raise ValueError(f"max_pages must be a positive int; got {max_pages!r}")
    k = min(max_pages, scores.shape[-1])
    top, idx = jax.lax.top_k(scores, k)
    ok = jnp.isfinite(top)
    if num_pages is not None:
        ok = ok & (jnp.arange(k) < jnp.asarray(num_pages)[..., None])
    return idx.astype(jnp.int32), ok
