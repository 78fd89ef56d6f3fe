"""Vegas: verification-guided KV selection for self-speculative decoding with sparse drafting.

Dimension legend: ``L`` layers, ``H`` query heads, ``R`` score rows kept from the verification block,
``N`` cache capacity (keys), ``K`` the largest budget (static), ``P`` pages.

Self-speculative decoding drafts ``gamma`` tokens with the same model attending to a small subset of
the KV cache, then verifies them with one full-attention pass over ``gamma + 1`` tokens. The
verification pass already computes the exact attention of its newest queries over the whole cache;
Vegas keeps, per layer, the raw scores of two of its rows (the first and the last verification
token) and their logsumexp, and turns them into the KV subset for the next drafting round:

  * importance (``key_importance``, "weight" mode): ``m[j] = mean_{h, r} exp(tau S[h, r, j] - lse[h, r])``,
    the mean softmax weight of key j over heads and the kept rows ("logit" mode: the mean raw score);
  * budget (``sparse_budget``): ``clamp(ceil(ratio * seqlen), min_tokens, max_tokens)``, at most the
    keys visible to the first verification row (``valid_len = seqlen - q_len + 1``);
  * selection (``select_keys``): one top-k index set per layer, shared by all heads;
  * drafting (``draft_key_mask``): a draft step attends to the selected keys plus every key at
    position ``>= valid_len`` (the tokens accepted in the last verification and the drafts so far).

Baseline drafters at the same budget: StreamingLLM (``streaming_keep``: a sink plus the most recent
keys) and Quest (``page_bounds`` / ``quest_keep``: per-page min/max key bounds scored against the
current query). Acceptance rules are ``primitives.speculative``.

Status: this module holds the selection math and the drafting masks with their tests. The
self-speculative decoding loop over the decoder LM, the verification / sparse-decode kernels and the
``vegas`` experiment are not built yet (issue 4).

Example:
    >>> import jax, jax.numpy as jnp
    >>> s = jax.random.normal(jax.random.key(0), (2, 4, 2, 100))             # [L, H, R, N] raw scores
    >>> lse = jax.nn.logsumexp(s * 0.125, axis=-1)
    >>> m = key_importance(s, lse, scale=0.125)
    >>> idx, ok = select_keys(m, valid_len=90, budget=10, max_budget=16)
    >>> idx.shape, int(ok.sum(-1)[0]), bool((jnp.where(ok, idx, 0) < 90).all())
    ((2, 16), 10, True)

References:
  Vegas: "Verification-Guided Self-Speculative Decoding" (arXiv:2602.07223; official code:
    platformxlab/vegas, `vllm/v1/spec_decode/sparse_attn/`).
  Xiao et al., "Efficient Streaming Language Models with Attention Sinks", arXiv:2309.17453, 2023.
  Tang et al., "Quest: Query-Aware Sparsity for Efficient Long-Context LLM Inference",
    arXiv:2406.10774, 2024.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

__all__ = ["key_importance", "sparse_budget", "select_keys", "draft_key_mask", "streaming_keep", "page_bounds",
           "quest_keep", "score_rows"]

SCORE_MODES = ("weight", "logit")
SCORE_ROWS = ("first_last", "all", "last_accepted")


def score_rows(q_len: int, mode: str = "first_last", *, accepted: int | None = None) -> tuple[int, ...]:
    """Which rows of a verification block of ``q_len`` queries feed the importance.

    "first_last": rows 0 and q_len - 1 (one row when q_len == 1); "all": every row;
    "last_accepted": the row of the last accepted token (``accepted`` drafts were accepted).
    """
    if mode not in SCORE_ROWS:
        raise ValueError(f"mode must be one of {SCORE_ROWS}; got {mode!r}")
    if q_len < 1:
        raise ValueError(f"q_len must be >= 1; got {q_len}")
    if mode == "all":
        return tuple(range(q_len))
    if mode == "last_accepted":
        if accepted is None or not 0 <= accepted < q_len:
            raise ValueError(f"accepted must be in [0, q_len={q_len}) for 'last_accepted'; got {accepted}")
        return (accepted,)
    return (0,) if q_len == 1 else (0, q_len - 1)


def key_importance(scores: jax.Array, lse: jax.Array, *, scale: float, mode: str = "weight") -> jax.Array:
    """Per-key importance from verification score rows.

    Args:
      scores: [..., H, R, N] raw scores q.k (unscaled; -inf at keys a row cannot see).
      lse: [..., H, R] logsumexp of the scaled, masked logits of those rows (over all keys).
      scale: the softmax scale tau (1/sqrt(d)).
      mode: "weight" (mean softmax probability) or "logit" (mean raw score over visible entries).

    Returns:
      [..., N] float32.
    """
    if mode not in SCORE_MODES:
        raise ValueError(f"mode must be one of {SCORE_MODES}; got {mode!r}")
    if scores.shape[:-1] != lse.shape:
        raise ValueError(f"lse must be scores.shape[:-1]; got scores {scores.shape}, lse {lse.shape}")
    s = scores.astype(jnp.float32)
    if mode == "weight":
        w = jnp.exp(scale * s - lse.astype(jnp.float32)[..., None])
        return jnp.mean(w, axis=(-3, -2))
    visible = jnp.isfinite(s)
    return jnp.sum(jnp.where(visible, s, 0.0), axis=(-3, -2)) / jnp.maximum(visible.sum(axis=(-3, -2)), 1)


def sparse_budget(seqlen: int | jax.Array, valid_len: int | jax.Array, *, ratio: float, min_tokens: int = 256,
                  max_tokens: int | None = None) -> jax.Array:
    """``min(clamp(ceil(ratio * seqlen), min_tokens, max_tokens), valid_len)`` as int32."""
    if not 0 < ratio <= 1:
        raise ValueError(f"ratio must be in (0, 1]; got {ratio}")
    if min_tokens < 0:
        raise ValueError(f"min_tokens must be >= 0; got {min_tokens}")
    budget = jnp.ceil(ratio * jnp.asarray(seqlen, jnp.float32)).astype(jnp.int32)
    budget = jnp.maximum(budget, min_tokens)
    if max_tokens is not None:
        budget = jnp.minimum(budget, max(int(max_tokens), min_tokens))
    return jnp.minimum(budget, jnp.asarray(valid_len, jnp.int32))


def select_keys(importance: jax.Array, valid_len: int | jax.Array, budget: int | jax.Array, *,
                max_budget: int) -> tuple[jax.Array, jax.Array]:
    """Top-``budget`` keys among the first ``valid_len`` of each row of ``importance``.

    Args:
      importance: [..., N].
      valid_len: keys eligible (positions < valid_len).
      budget: keys to keep (traced; at most ``max_budget``).
      max_budget: static K, the size of the returned index arrays.

    Returns:
      (indices [..., K] int32, valid [..., K] bool): the first ``min(budget, valid_len)`` entries are
      the selection, sorted by decreasing importance (ties to the lower index); the rest are unused.
    """
    n = importance.shape[-1]
    k = min(int(max_budget), n)
    pos = jnp.arange(n)
    masked = jnp.where(pos < valid_len, importance.astype(jnp.float32), -jnp.inf)
    _, idx = jax.lax.top_k(masked, k)
    count = jnp.minimum(jnp.minimum(jnp.asarray(budget, jnp.int32), jnp.asarray(valid_len, jnp.int32)), k)
    valid = jnp.arange(k) < count
    return idx.astype(jnp.int32), jnp.broadcast_to(valid, idx.shape)


def draft_key_mask(indices: jax.Array, valid: jax.Array, valid_len: int | jax.Array, current_len: int | jax.Array,
                   capacity: int) -> jax.Array:
    """Keys a draft step may read: the selection plus the recent range [valid_len, current_len).

    Args:
      indices, valid: [..., K] from :func:`select_keys` (or any drafter).
      valid_len: start of the recent range.
      current_len: keys in the cache including the token being drafted from.
      capacity: N.

    Returns:
      [..., capacity] bool.
    """
    pos = jnp.arange(capacity)
    recent = (pos >= valid_len) & (pos < current_len)
    chosen = jnp.zeros(indices.shape[:-1] + (capacity,), bool)
    chosen = jax.vmap(lambda c, i, v: c.at[i].max(v), in_axes=(0, 0, 0))(
        chosen.reshape(-1, capacity), indices.reshape(-1, indices.shape[-1]), valid.reshape(-1, valid.shape[-1]))
    return chosen.reshape(indices.shape[:-1] + (capacity,)) | recent


def streaming_keep(valid_len: int | jax.Array, budget: int | jax.Array, capacity: int, *,
                   sink: int = 4) -> jax.Array:
    """StreamingLLM drafter: the first ``sink`` keys plus the most recent ``budget - sink`` before valid_len.

    Returns:
      [capacity] bool (combine with the recent range as in :func:`draft_key_mask`).
    """
    pos = jnp.arange(capacity)
    budget = jnp.minimum(jnp.asarray(budget, jnp.int32), jnp.asarray(valid_len, jnp.int32))
    s = jnp.minimum(sink, budget)
    window = budget - s
    return (pos < valid_len) & ((pos < s) | (pos >= valid_len - window))


def page_bounds(keys: jax.Array, valid_len: int | jax.Array, page_size: int) -> tuple[jax.Array, jax.Array]:
    """Quest's per-page element-wise min and max of the keys: keys [N, kh, d] -> ([P, kh, d], [P, kh, d]).

    Keys at positions >= valid_len are excluded (a page with none gets +inf / -inf bounds).
    """
    n, kh, d = keys.shape
    p = math.ceil(n / page_size)
    pad = p * page_size - n
    valid = (jnp.arange(p * page_size) < valid_len)[:, None, None]
    kp = jnp.pad(keys.astype(jnp.float32), ((0, pad), (0, 0), (0, 0)))
    lo = jnp.where(valid, kp, jnp.inf).reshape(p, page_size, kh, d).min(axis=1)
    hi = jnp.where(valid, kp, -jnp.inf).reshape(p, page_size, kh, d).max(axis=1)
    return lo, hi


def quest_keep(q: jax.Array, lo: jax.Array, hi: jax.Array, valid_len: int | jax.Array, budget: int | jax.Array,
               *, page_size: int, capacity: int) -> jax.Array:
    """Quest drafter: the pages with the largest upper bound ``sum_c max(q_c lo_c, q_c hi_c)``.

    Args:
      q: [H, d] the current query (query heads grouped over kh KV heads).
      lo, hi: [P, kh, d] from :func:`page_bounds`.
      valid_len, budget: as for the other drafters; ``ceil(budget / page_size)`` pages are kept.
      page_size, capacity: layout.

    Returns:
      [capacity] bool.
    """
    h, d = q.shape
    p, kh, _ = lo.shape
    qg = q.astype(jnp.float32).reshape(kh, h // kh, d)
    bound = jnp.maximum(qg[None] * lo[:, :, None], qg[None] * hi[:, :, None]).sum(-1)  # [P, kh, g]
    score = jnp.where(jnp.isfinite(bound), bound, -jnp.inf).max(axis=(1, 2))  # a page matters if any head wants it
    pages = jnp.minimum(-(-jnp.asarray(budget, jnp.int32) // page_size), p)
    order = jnp.argsort(-score)
    rank = jnp.zeros(p, jnp.int32).at[order].set(jnp.arange(p, dtype=jnp.int32))
    keep_page = (rank < pages) & jnp.isfinite(score)
    pos = jnp.arange(capacity)
    return keep_page[jnp.minimum(pos // page_size, p - 1)] & (pos < valid_len)
