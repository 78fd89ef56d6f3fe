"""Vegas: verification-guided KV selection for self-speculative decoding with sparse drafting.

The model drafts ``gamma`` tokens attending to a small KV subset, then verifies them with one full-attention pass;
Vegas keeps two score rows of that pass per layer (first and last verification token) with their logsumexp and
picks the next round's keys from them (one top-k set per layer, shared by all heads).

  Selection: ``key_importance`` (mean softmax weight or raw score per key), ``sparse_budget`` / ``Budget``,
             ``select_keys``, ``score_rows``, ``draft_key_mask`` (selected keys plus every key ``>= valid_len``).
  Baselines: ``streaming_keep`` (StreamingLLM), ``page_bounds`` / ``quest_keep`` (Quest, via `primitives.quest`).
  Decoding:  ``speculative_generate`` -> ``SpeculativeOutput`` (one ``jax.jit``, a ``lax.while_loop``) on a decoder
             LM with the `models.Transformer` hooks ``score_rows=`` / ``sparse_decode=`` (`pallas_kernels.vegas`);
             drafters (``DRAFTERS``: ``VegasDrafter``, ``StreamingDrafter``, ``QuestDrafter``, ``RandomDrafter``)
             share it via ``refresh(VerifyInfo)`` / ``select(...)``; acceptance rules: `primitives.speculative`.
Greedy output equals plain greedy decoding for any drafter, budget and gamma; sampled output has the target's law.

Dimension legend: ``L`` layers, ``H`` query heads, ``R`` score rows kept from the verification block,
``N`` cache capacity (keys), ``K`` the largest budget (static), ``P`` pages.

Spec: papers/specs/inference_moe.md section 1 (method from the official code in 1(b), ambiguities in 1(g)).

INFERRED (not in the official code): the first selection comes from a ``q_len = 1`` verification of the last
prompt token after prefilling the rest (so each batch row may have its own prompt length); StreamingLLM keeps
``sink`` keys plus a token window (official: pages); the Quest and random (losslessness check) drafters.

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
  Tang et al., "Quest: Query-Aware Sparsity for Efficient Long-Context LLM Inference", arXiv:2406.10774, 2024.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from algorithms.decoding._prompts import check_prompts, resolve_key
from models.kv_cache import KVCache
from models.transformer import SparseDecode
from primitives import quest
from primitives import speculative as spec
from primitives.attention import kv_token_axis
from primitives.sampling import Sampler

__all__ = ["key_importance", "sparse_budget", "select_keys", "draft_key_mask", "streaming_keep", "page_bounds",
           "quest_keep", "score_rows", "Budget", "VerifyInfo", "VegasDrafter", "StreamingDrafter", "QuestDrafter",
           "RandomDrafter", "SpeculativeOutput", "speculative_generate", "DRAFTERS"]

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
    """``min(clamp(ceil(ratio * seqlen), min_tokens, max_tokens), valid_len)`` as int32 (``ratio`` may be traced)."""
    if not isinstance(ratio, jax.core.Tracer) and not 0 < float(ratio) <= 1:
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

    Keys at positions >= valid_len are excluded (a page with none gets +inf / -inf bounds). The
    token-major view of :func:`primitives.quest.page_bounds`.
    """
    lo, hi = quest.page_bounds(jnp.swapaxes(keys, 0, 1), page_size=page_size, valid_len=valid_len)
    return jnp.swapaxes(lo, 0, 1), jnp.swapaxes(hi, 0, 1)


def quest_keep(q: jax.Array, lo: jax.Array, hi: jax.Array, valid_len: int | jax.Array, budget: int | jax.Array,
               *, page_size: int, capacity: int) -> jax.Array:
    """Quest drafter: the pages with the largest upper bound ``sum_c max(q_c lo_c, q_c hi_c)``.

    A page's score is the max of :func:`primitives.quest.page_scores` over all query heads; the
    pages are :func:`primitives.quest.select_pages`.

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
    qg = q.reshape(kh, h // kh, d)
    bound = quest.page_scores(qg[None], lo[:, :, None], hi[:, :, None])  # [P, kh, g]
    score = bound.max(axis=(1, 2))  # a page matters if any head wants it
    keep_page = quest.select_pages(score, -(-jnp.asarray(budget, jnp.int32) // page_size))
    pos = jnp.arange(capacity)
    return keep_page[jnp.minimum(pos // page_size, p - 1)] & (pos < valid_len)


# ----------------------------------------------------------------------------------------------------
# Drafters and the self-speculative decoding loop.


@dataclasses.dataclass(frozen=True)
class Budget:
    """The KV budget shared by every drafter: ``clamp(ceil(ratio * seqlen), min_tokens, max_tokens)``.

    Attributes:
      ratio: fraction of the sequence length, in (0, 1]; with ``speculative_generate(budget_ratio=r)``
        it is the static maximum that sizes the index arrays and ``r`` (traced) the ratio in use.
      min_tokens: floor (the official default is 256; small models use less).
      max_tokens: cap (None = no cap).
    """

    ratio: float = 0.05
    min_tokens: int = 256
    max_tokens: int | None = None

    def __post_init__(self):
        if not 0 < self.ratio <= 1:
            raise ValueError(f"Budget.ratio must be in (0, 1]; got {self.ratio}")
        if self.min_tokens < 0:
            raise ValueError(f"Budget.min_tokens must be >= 0; got {self.min_tokens}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"Budget.max_tokens must be >= 1 or None; got {self.max_tokens}")

    def __call__(self, seqlen: jax.Array, valid_len: jax.Array, ratio: jax.Array | None = None) -> jax.Array:
        """The budget; ``ratio`` (traced, at most ``self.ratio``) overrides the ratio, not the static bound."""
        return sparse_budget(seqlen, valid_len, ratio=self.ratio if ratio is None else ratio,
                             min_tokens=self.min_tokens, max_tokens=self.max_tokens)

    def max_keys(self, capacity: int) -> int:
        """Static bound K on the budget for a cache of ``capacity`` keys."""
        k = max(math.ceil(self.ratio * capacity), self.min_tokens)
        if self.max_tokens is not None:
            k = min(k, max(self.max_tokens, self.min_tokens))
        return max(1, min(k, capacity))


class VerifyInfo(NamedTuple):
    """What a drafter's ``refresh`` sees after a verification pass.

    Attributes:
      scores: [L, b, h, R, S] raw scores of the verification rows the drafter asked for.
      lse: [L, b, h, R] their logsumexp.
      rows: the static rows (indices into the verification block) of ``scores``.
      accepted: [b] drafts accepted in this verification (0 for the first, draft-free one).
      valid_len: [b] keys visible to the first verification row (selection range).
      seqlen: [b] keys in the cache including all verification tokens (the budget's base).
      budget: [b] keys to select.
      cache: the cache after the verification (before rollback; entries >= valid_len + accepted + 1 are stale).
    """

    scores: jax.Array
    lse: jax.Array
    rows: tuple[int, ...]
    accepted: jax.Array
    valid_len: jax.Array
    seqlen: jax.Array
    budget: jax.Array
    cache: KVCache


@dataclasses.dataclass(frozen=True)
class VegasDrafter:
    """Vegas: one top-k set per layer from the verification's score rows.

    Attributes:
      budget: the KV budget.
      score_mode: "weight" (mean softmax weight, the default) or "logit" (mean raw score).
      rows: "first_last" (default), "all" (every verification row) or "last_accepted" (the row of the
        last accepted token), the ablation of the paper's Insight 1.
    """

    budget: Budget = Budget()
    score_mode: str = "weight"
    rows: str = "first_last"

    def __post_init__(self):
        if self.score_mode not in SCORE_MODES:
            raise ValueError(f"score_mode must be one of {SCORE_MODES}; got {self.score_mode!r}")
        if self.rows not in SCORE_ROWS:
            raise ValueError(f"rows must be one of {SCORE_ROWS}; got {self.rows!r}")

    def verify_rows(self, q_len: int) -> tuple[int, ...]:
        """Rows the verification pass must return: the chosen ones (all of them for "last_accepted")."""
        return tuple(range(q_len)) if self.rows in ("all", "last_accepted") else score_rows(q_len, self.rows)

    def refresh(self, info: VerifyInfo, *, scale: float):
        scores, lse = info.scores, info.lse
        if self.rows == "last_accepted" and len(info.rows) > 1:
            row = info.accepted[None, :, None, None]  # row a holds the last accepted token
            scores = jnp.take_along_axis(scores, row[..., None], axis=3)
            lse = jnp.take_along_axis(lse, row, axis=3)
        m = key_importance(scores, lse, scale=scale, mode=self.score_mode)  # [L, b, S]
        k = self.budget.max_keys(m.shape[-1])
        idx, ok = select_keys(m, info.valid_len[None, :, None], info.budget[None, :, None], max_budget=k)
        return idx, ok

    def select(self, selection, layer: int, q: jax.Array, keys: jax.Array):
        del q, keys
        idx, ok = selection
        return idx[layer], ok[layer]


@dataclasses.dataclass(frozen=True)
class StreamingDrafter:
    """StreamingLLM: the first ``sink`` keys plus the most recent ``budget - sink`` before valid_len."""

    budget: Budget = Budget()
    sink: int = 4

    def __post_init__(self):
        if self.sink < 0:
            raise ValueError(f"sink must be >= 0; got {self.sink}")

    def verify_rows(self, q_len: int) -> tuple[int, ...]:
        return (0,)

    def refresh(self, info: VerifyInfo, *, scale: float):
        del scale
        k = self.budget.max_keys(info.cache.capacity)
        i = jnp.arange(k)[None, :]
        budget = jnp.minimum(info.budget, info.valid_len)[:, None]
        s = jnp.minimum(self.sink, budget)
        idx = jnp.where(i < s, i, info.valid_len[:, None] - budget + i)  # sink, then the window
        return idx.astype(jnp.int32), i < budget

    def select(self, selection, layer: int, q: jax.Array, keys: jax.Array):
        del layer, q, keys
        return selection


@dataclasses.dataclass(frozen=True)
class QuestDrafter:
    """Quest: ``ceil(budget / page_size)`` pages ranked by ``sum_c max(q_c lo_c, q_c hi_c)``.

    The per-page key bounds are rebuilt after each verification (a serving system updates them
    incrementally); each draft step scores the pages with its own query, per layer, and a page is
    kept for all heads of the layer when any query head ranks it high (its score is the max over heads).
    """

    budget: Budget = Budget()
    page_size: int = 16

    def __post_init__(self):
        if self.page_size < 1:
            raise ValueError(f"page_size must be >= 1; got {self.page_size}")

    def verify_rows(self, q_len: int) -> tuple[int, ...]:
        return (0,)

    def refresh(self, info: VerifyInfo, *, scale: float):
        del scale
        head_major = kv_token_axis(info.cache.layout) == 2
        keys = jnp.stack([k if head_major else jnp.swapaxes(k, 1, 2) for k in info.cache.keys])  # [L, b, kh, S, d]
        lo, hi = quest.page_bounds(keys, page_size=self.page_size, valid_len=info.valid_len[:, None])
        return lo, hi, info.valid_len, info.budget  # bounds [L, b, kh, P, d]

    def select(self, selection, layer: int, q: jax.Array, keys: jax.Array):
        lo, hi, valid_len, budget = selection
        lo, hi = lo[layer], hi[layer]  # [b, kh, P, d]
        b, kh, num_pages, d = lo.shape
        capacity = keys.shape[1]
        qg = q.reshape(b, kh, -1, 1, d)
        bound = quest.page_scores(qg, lo[:, :, None], hi[:, :, None])  # [b, kh, g, P]
        score = bound.max(axis=(1, 2))  # [b, P]: a page is kept for the layer when any head ranks it high
        max_pages = min(num_pages, -(-self.budget.max_keys(capacity) // self.page_size))
        pages, ok = quest.top_pages(score, max_pages, -(-budget // self.page_size))  # [b, Kp]
        idx = (pages[:, :, None] * self.page_size + jnp.arange(self.page_size)).reshape(b, -1)
        ok = jnp.repeat(ok, self.page_size, axis=1) & (idx < valid_len[:, None])
        return idx, ok


@dataclasses.dataclass(frozen=True)
class RandomDrafter:
    """A uniform random subset of ``budget`` keys per layer (drawn from ``seed`` and the step)."""

    budget: Budget = Budget()
    seed: int = 0

    def verify_rows(self, q_len: int) -> tuple[int, ...]:
        return (0,)

    def refresh(self, info: VerifyInfo, *, scale: float):
        noise = jax.random.uniform(jax.random.fold_in(jax.random.key(self.seed), info.seqlen[0]),
                                   info.scores.shape[:2] + (info.cache.capacity,))
        k = self.budget.max_keys(info.cache.capacity)
        return select_keys(noise, info.valid_len[None, :, None], info.budget[None, :, None], max_budget=k)

    select = VegasDrafter.select


DRAFTERS = {"vegas": VegasDrafter, "streaming": StreamingDrafter, "quest": QuestDrafter, "random": RandomDrafter}


class SpeculativeOutput(NamedTuple):
    """What ``speculative_generate`` returns.

    Attributes:
      tokens: [b, N] generated tokens.
      iterations: [b] draft-and-verify iterations each row ran until it had N tokens.
      emitted: [b] tokens emitted by those iterations (N - 1 plus any overshoot; the first token comes
        from the draft-free verification of the last prompt token).
      accepted_at: [b, gamma] how many iterations accepted draft position i (acceptance at position i
        = accepted_at[:, i] / iterations).
      kv_read: [b] cache entries read per layer over all iterations (drafts: listed + recent keys;
        verification: the whole visible cache once), the bandwidth proxy.
      draft_keys: [b] cache entries read per layer by the draft steps alone.
    """

    tokens: jax.Array
    iterations: jax.Array
    emitted: jax.Array
    accepted_at: jax.Array
    kv_read: jax.Array
    draft_keys: jax.Array


def speculative_generate(model: nnx.Module, prompts: jax.Array, *, max_new_tokens: int, drafter: Any,
                         gamma: int = 4, prompt_lengths: jax.Array | None = None,
                         sampler: Sampler = Sampler(), key: jax.Array | None = None,
                         budget_ratio: float | jax.Array | None = None) -> SpeculativeOutput:
    """Self-speculative decoding: gamma sparse-attention drafts, then one full-attention verification.

    Args:
      model: a `models.Transformer` (any decoder LM with its ``score_rows=`` / ``sparse_decode=`` hooks).
      prompts: [b, P] right-padded prompts.
      max_new_tokens: N >= 1.
      drafter: a ``VegasDrafter``, ``StreamingDrafter``, ``QuestDrafter`` or ``RandomDrafter`` (any
        object with ``verify_rows``, ``refresh`` and ``select``).
      gamma: draft tokens per iteration (>= 1).
      prompt_lengths: [b] real prompt lengths (>= 1); default P.
      sampler: the target sampler (greedy by default); drafts use the same sampler on the draft
        logits and are verified by speculative rejection sampling (temperature, top-k and top-p are
        all honored because both distributions come from ``sampler.filtered_logits``).
      key: PRNG key (required unless greedy).
      budget_ratio: the budget ratio to use, in (0, ``drafter.budget.ratio``]; a traced argument, so a
        sweep over ratios compiles once per drafter (whose ``budget.ratio`` is then the sweep's maximum
        and sizes the static index arrays). None = ``drafter.budget.ratio``.

    Returns:
      SpeculativeOutput.
    """
    prompts, lengths, _, _ = check_prompts(prompts, prompt_lengths, max_new_tokens=max_new_tokens)
    if gamma < 1:
        raise ValueError(f"gamma must be >= 1; got {gamma}")
    for name in ("verify_rows", "refresh", "select"):
        if not hasattr(drafter, name):
            raise ValueError(f"drafter must define {name}(); got {type(drafter).__name__}")
    key = resolve_key(key, sampler.is_greedy)
    max_ratio = drafter.budget.ratio
    if budget_ratio is None:
        budget_ratio = max_ratio
    elif not isinstance(budget_ratio, jax.core.Tracer) and not 0 < float(budget_ratio) <= max_ratio:
        raise ValueError(f"budget_ratio must be in (0, drafter.budget.ratio={max_ratio}]; got {budget_ratio}")
    graphdef, state = nnx.split(model)
    return _speculative(graphdef, state, prompts, lengths, key, jnp.asarray(budget_ratio, jnp.float32),
                        max_new_tokens=max_new_tokens, drafter=drafter, gamma=gamma, sampler=sampler)


@functools.partial(jax.jit, static_argnames=("graphdef", "max_new_tokens", "drafter", "gamma", "sampler"))
def _speculative(graphdef, state, prompts, prompt_lengths, key, ratio, *, max_new_tokens, drafter, gamma,
                 sampler):
    model = nnx.merge(graphdef, state)
    b, p = prompts.shape
    n, g = max_new_tokens, gamma
    scale = 1.0 / math.sqrt(model.config.resolved_head_dim)
    capacity = p + n + 2 * g + 2
    rows_b = jnp.arange(b)
    greedy = sampler.is_greedy

    def probs(logits):
        return jax.nn.softmax(sampler.filtered_logits(logits), axis=-1)

    def pick(logits, key):
        if greedy:
            return jnp.argmax(logits, axis=-1).astype(jnp.int32)
        return jax.random.categorical(key, sampler.filtered_logits(logits), axis=-1).astype(jnp.int32)

    def refresh(out, accepted, valid_len, seqlen, rows):
        inter = out.intermediates
        lse = jnp.take(inter["attn_lse"], jnp.asarray(rows), axis=-1)  # [L, b, h, R]
        budget = drafter.budget(seqlen, valid_len, ratio)
        info = VerifyInfo(inter["attn_scores"], lse, rows, accepted, valid_len, seqlen, budget, out.cache)
        return drafter.refresh(info, scale=scale)

    # Prefill all prompt tokens but the last, then verify that last token alone (q_len = 1).
    cache = model.init_cache(b, capacity)
    cache = model(prompts, cache=cache, num_valid=prompt_lengths - 1).cache
    last = prompts[rows_b, prompt_lengths - 1]
    rows0 = drafter.verify_rows(1)
    out = model(last[:, None], cache=cache, score_rows=rows0)
    key, sub = jax.random.split(key)
    tok = pick(out.logits[:, 0], sub)
    selection = refresh(out, jnp.zeros((b,), jnp.int32), prompt_lengths, prompt_lengths, rows0)
    tokens = jnp.zeros((b, n + g + 1), jnp.int32).at[:, 0].set(tok)
    zeros = jnp.zeros((b,), jnp.int32)
    carry = dict(cache=out.cache, tok=tok, selection=selection, valid_len=prompt_lengths, tokens=tokens,
                 count=jnp.ones((b,), jnp.int32), iterations=zeros, accepted_at=jnp.zeros((b, g), jnp.int32),
                 kv_read=prompt_lengths.astype(jnp.float32), draft_keys=jnp.zeros((b,), jnp.float32), key=key)
    rows_v = drafter.verify_rows(g + 1)

    def cond(c):
        return jnp.any(c["count"] < n)

    def body(c):
        cache, active = c["cache"], c["count"] < n
        committed = cache.lengths  # keys in the cache; the pending token `tok` goes at this position
        key, k_draft, k_accept = jax.random.split(c["key"], 3)
        sparse = SparseDecode(functools.partial(drafter.select, c["selection"]), c["valid_len"], 2 * g)

        def draft_step(carry, k):
            dcache, t = carry
            o = model(t[:, None], cache=dcache, sparse_decode=sparse)
            logits = o.logits[:, 0]
            nxt = pick(logits, k)
            return (o.cache, nxt), (nxt, logits)

        (_, _), (drafts, dlogits) = jax.lax.scan(draft_step, (cache, c["tok"]), jax.random.split(k_draft, g))
        drafts, dlogits = drafts.T, jnp.swapaxes(dlogits, 0, 1)  # [b, g], [b, g, v]
        # Keys each draft step read (per layer): the listed ones plus the recent range.
        listed = _listed_count(drafter, c["selection"], model, cache)
        recent = (committed + 1 - c["valid_len"])[:, None] + jnp.arange(g)[None, :]
        draft_reads = (listed[:, None] + recent).sum(-1).astype(jnp.float32)

        block = jnp.concatenate([c["tok"][:, None], drafts], axis=1)  # [b, g + 1]
        out = model(block, cache=cache, score_rows=rows_v)
        target = out.logits  # [b, g + 1, v]
        if greedy:
            a, y = jax.vmap(spec.greedy_accept)(drafts, target)
        else:
            a, y = jax.vmap(spec.speculative_accept)(jax.random.split(k_accept, b), drafts, probs(dlogits),
                                                     probs(target))
        # Emit drafts[:a] then y at tokens[count:count + a + 1] (rows already done write nothing).
        emit = jnp.concatenate([drafts, jnp.zeros((b, 1), jnp.int32)], axis=1)
        emit = jnp.where(jnp.arange(g + 1)[None, :] == a[:, None], y[:, None], emit)
        cols = c["count"][:, None] + jnp.arange(g + 1)[None, :]
        keep = active[:, None] & (jnp.arange(g + 1)[None, :] <= a[:, None])
        tokens = c["tokens"].at[rows_b[:, None], jnp.where(keep, cols, n + g + 1)].set(emit, mode="drop")
        valid_len = committed + 1  # keys visible to the first verification row
        selection = refresh(out, a, valid_len, committed + g + 1, rows_v)
        new_cache = out.cache.replace(lengths=jnp.where(active, committed + 1 + a, committed))
        act = active.astype(jnp.int32)
        return dict(
            cache=new_cache, tok=jnp.where(active, y, c["tok"]),
            selection=selection,  # a finished row's selection is never used again
            valid_len=jnp.where(active, valid_len, c["valid_len"]), tokens=tokens,
            count=c["count"] + act * (a + 1), iterations=c["iterations"] + act,
            accepted_at=c["accepted_at"] + act[:, None] * (jnp.arange(g)[None, :] < a[:, None]),
            kv_read=c["kv_read"] + act * (draft_reads + committed + g + 1),
            draft_keys=c["draft_keys"] + act * draft_reads, key=key)

    c = jax.lax.while_loop(cond, body, carry)
    return SpeculativeOutput(c["tokens"][:, :n], c["iterations"], c["count"] - 1, c["accepted_at"],
                             c["kv_read"], c["draft_keys"])


def _listed_count(drafter, selection, model, cache) -> jax.Array:
    """[b] mean over layers of the listed keys a draft step reads (Quest: counted for its first query)."""
    if isinstance(drafter, QuestDrafter):
        lo, hi, valid_len, budget = selection
        ps = drafter.page_size
        pages = jnp.minimum(-(-budget // ps), lo.shape[-2])
        return jnp.minimum(pages * ps, valid_len) + 2 * (-(-valid_len // ps))  # + the bounds of every page
    ok = selection[1]
    return ok.sum(-1).mean(0) if ok.ndim == 3 else ok.sum(-1)
