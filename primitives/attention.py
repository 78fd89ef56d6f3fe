"""Reference attention: the definition of correctness for every attention kernel.

Dimension legend (used in shapes below):
  b  batch                     t  query tokens          s  key/value tokens
  h  query heads               k  key/value heads (h % k == 0; k == h is MHA,
  d  head dim                     k == 1 is MQA, anything between is GQA)

Everything here is a pure function of arrays. Softmax statistics are computed in
float32 whatever the input dtype. A query row that can see no key (fully masked)
returns zeros and a logsumexp of -inf, never NaN, so partial results from split
or sparse attention can be merged with `combine_partials` without special cases.

Masks compose by logical AND:
  * `causal`: key position <= query position (positions default to 0..t-1 and
    0..s-1; pass `q_positions` when queries sit at the end of a KV cache),
  * `kv_lengths[b]`: keys at index >= kv_lengths[b] are padding,
  * `q_segment_ids` / `kv_segment_ids`: a query only sees keys of its segment
    (sequence packing),
  * `mask`: any extra boolean array broadcastable to [b, h, t, s].

References:
  Vaswani et al., "Attention Is All You Need", arXiv:1706.03762, 2017.
  Ainslie et al., "GQA: Training Generalized Multi-Query Transformer Models from
  Multi-Head Checkpoints", arXiv:2305.13245, 2023.
  Su et al., "RoFormer: Enhanced Transformer with Rotary Position Embedding",
  arXiv:2104.09864, 2021.
  Dao et al., "Flash-Decoding for long-context inference", 2023 (split-K merge).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from primitives.validation import check_lengths

__all__ = [
    "AttentionOutput",
    "attention",
    "decode_attention",
    "combine_partials",
    "rope",
    "rope_frequencies",
    "attention_mask",
    "KV_LAYOUTS",
    "default_kv_layout",
    "kv_token_axis",
    "kv_tokens_heads",
]

# Axis orders of a key/value array: token-major [b, s, k, d] or head-major [b, k, s, d].
KV_LAYOUTS = ("bskd", "bksd")


def default_kv_layout(backend: str | None = None) -> str:
    """The KV-cache axis order measured fastest for dense decode on `backend` (default: JAX's).

    "bksd" on CPU: XLA's CPU dot reads each head's keys contiguously, about 6x faster per decode
    step at 64k tokens than over the strided head axis of "bskd" (`python -m pallas_kernels.bench
    --only decode` measures both in one run). "bskd" on GPU and TPU, the order the Pallas kernels
    were tuned on; both orders are supported everywhere, and no accelerator measurement has chosen
    between them yet. Compiled for TPU v5e and v6e without one (`python -m experiments aot lm_1b
    --decode 32768`), a decoder LM's decode step in either order updates its cache in place, copies
    no cache buffer, and has the same bytes accessed by the compiler's cost model.
    """
    backend = jax.default_backend() if backend is None else backend
    return "bksd" if backend == "cpu" else "bskd"


def kv_token_axis(layout: str) -> int:
    """The token axis of a key/value array in `layout` ("bskd" -> 1, "bksd" -> 2)."""
    if layout not in KV_LAYOUTS:
        raise ValueError(f"kv_layout must be one of {KV_LAYOUTS}; got {layout!r}")
    return 1 if layout == "bskd" else 2


def kv_tokens_heads(shape: tuple[int, ...], layout: str) -> tuple[int, int]:
    """(tokens s, key/value heads k) of a [b, s, k, d] ("bskd") or [b, k, s, d] ("bksd") array shape."""
    axis = kv_token_axis(layout)
    return shape[axis], shape[3 - axis]


class AttentionOutput(NamedTuple):
    """Attention result with its softmax statistics.

    Attributes:
      out: [b, t, h, d] (or [b, h, d] for `decode_attention`), input dtype.
      lse: [b, h, t] (or [b, h]) float32 logsumexp of the scaled, masked
        logits; -inf for rows that see no key.
    """

    out: jax.Array
    lse: jax.Array


def _check_qkv(q: jax.Array, k: jax.Array, v: jax.Array, kv_layout: str = "bskd") -> tuple[int, int, int, int, int, int]:
    kv_token_axis(kv_layout)
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ValueError(
            f"attention expects q [b, t, h, d], k and v [{', '.join(kv_layout)}]; got "
            f"q.shape={q.shape}, k.shape={k.shape}, v.shape={v.shape}"
        )
    b, t, h, d = q.shape
    (s, kh), (vs, vkh) = kv_tokens_heads(k.shape, kv_layout), kv_tokens_heads(v.shape, kv_layout)
    bk, dk = k.shape[0], k.shape[3]
    if (vs, vkh) != (s, kh) or v.shape[0] != bk:
        raise ValueError(f"k and v must agree on [b, s, k]; got k.shape={k.shape}, v.shape={v.shape}")
    if bk != b:
        raise ValueError(f"q and k batch sizes differ: q.shape={q.shape}, k.shape={k.shape}")
    if dk != d:
        raise ValueError(f"q and k head dims differ: q.shape={q.shape}, k.shape={k.shape}")
    if kh == 0 or h % kh:
        raise ValueError(
            f"number of query heads must be a multiple of key/value heads; got h={h}, k={kh}"
        )
    return b, t, h, d, s, kh


def _check_positions(name: str, positions, batch: int, length: int, axis: str) -> None:
    """Positions must be [n] or [b, n] (a leading 1 broadcasts); anything else is the wrong length."""
    if positions is None:
        return
    shape = tuple(jnp.shape(positions))
    if shape not in ((length,), (1, length), (batch, length)):
        raise ValueError(f"{name} must have shape [{axis}]=({length},) or [b, {axis}]=({batch}, {length}); "
                         f"got {shape}")


def attention_mask(
    *,
    batch: int,
    q_len: int,
    kv_len: int,
    causal: bool = False,
    q_positions: jax.Array | None = None,
    kv_positions: jax.Array | None = None,
    q_segment_ids: jax.Array | None = None,
    kv_segment_ids: jax.Array | None = None,
    kv_lengths: jax.Array | None = None,
    mask: jax.Array | None = None,
) -> jax.Array | None:
    """Combines the mask options into one boolean array broadcastable to [b, 1|h, t, s].

    Returns None when nothing is masked.
    """
    _check_positions("q_positions", q_positions, batch, q_len, "t")
    _check_positions("kv_positions", kv_positions, batch, kv_len, "s")
    parts = []
    if causal:
        qp = jnp.arange(q_len)[None] if q_positions is None else q_positions
        kp = jnp.arange(kv_len)[None] if kv_positions is None else kv_positions
        qp = jnp.broadcast_to(jnp.asarray(qp), (batch, q_len))
        kp = jnp.broadcast_to(jnp.asarray(kp), (batch, kv_len))
        parts.append(kp[:, None, None, :] <= qp[:, None, :, None])
    if kv_lengths is not None:
        kv_lengths = jnp.asarray(kv_lengths)
        if kv_lengths.shape != (batch,):
            raise ValueError(f"kv_lengths must have shape [b]=({batch},); got {kv_lengths.shape}")
        check_lengths("kv_lengths", kv_lengths, kv_len)  # concrete values only (see `attention`)
        parts.append((jnp.arange(kv_len)[None, :] < kv_lengths[:, None])[:, None, None, :])
    if (q_segment_ids is None) != (kv_segment_ids is None):
        raise ValueError("pass both q_segment_ids and kv_segment_ids, or neither")
    if q_segment_ids is not None:
        if q_segment_ids.shape != (batch, q_len) or kv_segment_ids.shape != (batch, kv_len):
            raise ValueError(
                f"segment ids must be [b, t]=({batch}, {q_len}) and [b, s]=({batch}, {kv_len}); got "
                f"{q_segment_ids.shape} and {kv_segment_ids.shape}"
            )
        parts.append(q_segment_ids[:, None, :, None] == kv_segment_ids[:, None, None, :])
    if mask is not None:
        mask = jnp.asarray(mask, bool)
        while mask.ndim < 4:
            mask = mask[None]
        parts.append(mask)
    if not parts:
        return None
    out = parts[0]
    for p in parts[1:]:
        out = jnp.logical_and(out, p)
    return out


def attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    causal: bool = False,
    q_positions: jax.Array | None = None,
    kv_positions: jax.Array | None = None,
    q_segment_ids: jax.Array | None = None,
    kv_segment_ids: jax.Array | None = None,
    kv_lengths: jax.Array | None = None,
    mask: jax.Array | None = None,
    bias: jax.Array | None = None,
    scale: float | None = None,
    return_lse: bool = False,
    kv_layout: str = "bskd",
) -> jax.Array | AttentionOutput:
    """Multi-head dot-product attention with GQA/MQA and composable masks.

    Args:
      q: [b, t, h, d] queries.
      k: [b, s, k, d] keys.
      v: [b, s, k, d] values.
      causal: mask keys whose position is greater than the query's.
      q_positions: [b, t] or [t] integer positions of the queries (causal only).
        Defaults to 0..t-1. For queries appended to a cache of length L use
        L + arange(t).
      kv_positions: [b, s] or [s] positions of the keys; defaults to 0..s-1.
      q_segment_ids: [b, t] segment id per query (packing).
      kv_segment_ids: [b, s] segment id per key.
      kv_lengths: [b] number of valid keys per sequence (right padding), in [0, s]. Concrete
        values outside [0, s] raise ValueError; inside `jit` the lengths are traced and not
        checked (a length above s then means all keys, a negative one no key: a zero row).
      mask: extra boolean mask broadcastable to [b, h, t, s]; True = attend.
      bias: additive logits broadcastable to [b, h, t, s], added after the scale and before the
        masks (ALiBi-style biases, Hyper-ICL's calibration); computed in float32.
      scale: logit scale; defaults to 1/sqrt(d).
      return_lse: also return the float32 logsumexp per (b, h, t).
      kv_layout: axis order of k and v: "bskd" ([b, s, k, d], token-major) or "bksd"
        ([b, k, s, d], head-major). Same maths; the head-major order lets XLA's CPU dot read each
        head's keys contiguously (about 6x faster decode at 64k tokens, see `pallas_kernels.bench`).

    Returns:
      [b, t, h, d] in q's dtype, or `AttentionOutput(out, lse)` when
      `return_lse`; lse has shape [b, h, t].

    Raises:
      ValueError: naming the argument, for shapes that disagree (q, k, v, positions of the wrong
        length, segment ids, kv_lengths) and for concrete kv_lengths outside [0, s].

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> q = jnp.ones((1, 3, 4, 8)); kv = jnp.ones((1, 3, 2, 8))
      >>> attention(q, kv, kv, causal=True).shape
      (1, 3, 4, 8)
    """
    b, t, h, d, s, kh = _check_qkv(q, k, v, kv_layout)
    g = h // kh
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    full_mask = attention_mask(
        batch=b,
        q_len=t,
        kv_len=s,
        causal=causal,
        q_positions=q_positions,
        kv_positions=kv_positions,
        q_segment_ids=q_segment_ids,
        kv_segment_ids=kv_segment_ids,
        kv_lengths=kv_lengths,
        mask=mask,
    )
    # Rows m = (g, t): the query heads sharing a key/value head, times the query tokens. One
    # [m, d] x [d, s] product per (b, k) is the shape XLA's dot runs fastest (a separate t axis in
    # the einsum made the CPU decode step ~4x slower).
    qg = q.reshape(b, t, kh, g, d).transpose(0, 2, 3, 1, 4).reshape(b, kh, g * t, d)
    logits = jnp.einsum(f"bkmd,{kv_layout}->bkms", qg, k, preferred_element_type=jnp.float32)
    logits = logits.astype(jnp.float32).reshape(b, kh, g, t, s) * scale
    if bias is not None:
        bias = jnp.asarray(bias, jnp.float32)
        if bias.ndim != 4:
            raise ValueError(f"bias must be broadcastable to [b, h, t, s]=({b}, {h}, {t}, {s}) with 4 dims; "
                             f"got shape {tuple(bias.shape)}")
        try:
            bias = jnp.broadcast_to(bias, (b, h, t, s))
        except ValueError:
            raise ValueError(f"bias must be broadcastable to [b, h, t, s]=({b}, {h}, {t}, {s}); "
                             f"got shape {tuple(bias.shape)}") from None
        logits = logits + bias.reshape(b, kh, g, t, s)
    if full_mask is not None:
        # [b, 1|h, t, s] -> [b, k, g, t, s] (a per-head mask splits like the heads).
        m = jnp.broadcast_to(full_mask, (b, full_mask.shape[1], t, s))
        m = jnp.broadcast_to(m, (b, h, t, s)).reshape(b, kh, g, t, s)
        logits = jnp.where(m, logits, -jnp.inf)
    lse = jax.nn.logsumexp(logits, axis=-1)  # [b, k, g, t]; -inf on empty rows
    safe_lse = jnp.where(jnp.isfinite(lse), lse, 0.0)
    probs = jnp.exp(logits - safe_lse[..., None])  # exp(-inf) = 0 on masked keys
    out = jnp.einsum(f"bkms,{kv_layout}->bkmd", probs.reshape(b, kh, g * t, s), v.astype(jnp.float32))
    out = out.reshape(b, kh, g, t, d).transpose(0, 3, 1, 2, 4).reshape(b, t, h, d).astype(q.dtype)
    if return_lse:
        return AttentionOutput(out, lse.reshape(b, h, t))
    return out


def decode_attention(
    q: jax.Array,
    k_cache: jax.Array,
    v_cache: jax.Array,
    lengths: jax.Array,
    *,
    scale: float | None = None,
    return_lse: bool = False,
    kv_layout: str = "bskd",
) -> jax.Array | AttentionOutput:
    """Attention of one new query token per sequence over a KV cache.

    Args:
      q: [b, h, d] the query of the newest token of each sequence.
      k_cache: [b, s, k, d] cached keys ([b, k, s, d] when kv_layout="bksd"); entries at token
        index >= lengths[b] are ignored.
      v_cache: cached values, k_cache's shape.
      lengths: [b] int, number of valid cache entries per sequence, in [0, s] (0 allowed:
        the output is zeros and the lse -inf). Concrete lengths outside [0, s] (the cache
        capacity) raise ValueError; traced lengths (inside `jit`) are not checked, and a length
        above s then reads as the whole cache.
      scale: logit scale; defaults to 1/sqrt(d).
      return_lse: also return the logsumexp [b, h].
      kv_layout: "bskd" or "bksd", the cache's axis order (see `attention`).

    Returns:
      [b, h, d], or `AttentionOutput(out [b, h, d], lse [b, h])`.
    """
    if q.ndim != 3:
        raise ValueError(f"decode_attention expects q of shape [b, h, d]; got {q.shape}")
    if k_cache.ndim == 4:
        check_lengths("lengths", lengths, kv_tokens_heads(k_cache.shape, kv_layout)[0])
    res = attention(q[:, None], k_cache, v_cache, kv_lengths=lengths, scale=scale, return_lse=True,
                    kv_layout=kv_layout)
    out, lse = res.out[:, 0], res.lse[..., 0]
    return AttentionOutput(out, lse) if return_lse else out


def combine_partials(
    outs: jax.Array, lses: jax.Array, *, axis: int = 0
) -> AttentionOutput:
    """Merges attention results computed over disjoint key sets (split-K, sparse, draft).

    With partial outputs o_i (each normalized over its own key set) and
    logsumexps l_i, the result over the union of the key sets is
    `sum_i exp(l_i - L) o_i` with `L = logsumexp_i l_i`. Partials whose key set
    was empty (l_i = -inf) get weight zero; if all are empty the result is zeros
    with L = -inf.

    Args:
      outs: [n, ..., d] partial outputs stacked along `axis` (here 0).
      lses: [n, ...] matching logsumexps (the shape of outs without the last dim).
      axis: the axis that indexes the partials.

    Returns:
      `AttentionOutput(out [..., d] in outs' dtype, lse [...] float32)`.

    Examples:
      >>> import jax.numpy as jnp
      >>> o = jnp.stack([jnp.ones((2, 4)), jnp.zeros((2, 4))])
      >>> l = jnp.log(jnp.array([[1.0, 1.0], [3.0, 3.0]]))
      >>> combine_partials(o, l).out[0, 0]  # weights 1/4 and 3/4
      Array(0.25, dtype=float32)
    """
    if outs.shape[:-1] != lses.shape:
        raise ValueError(
            f"lses must have the shape of outs without its last dim; got outs {outs.shape}, lses {lses.shape}"
        )
    axis = axis % lses.ndim
    lses = lses.astype(jnp.float32)
    total = jax.nn.logsumexp(lses, axis=axis)
    safe_total = jnp.where(jnp.isfinite(total), total, 0.0)
    w = jnp.exp(lses - jnp.expand_dims(safe_total, axis))  # 0 for empty partials
    out = jnp.sum(w[..., None] * outs.astype(jnp.float32), axis=axis)
    return AttentionOutput(out.astype(outs.dtype), total)


def rope_frequencies(head_dim: int, *, base: float = 10000.0) -> jax.Array:
    """Inverse frequencies [d/2] of rotary embeddings: base^(-2i/d)."""
    if head_dim % 2:
        raise ValueError(f"rotary embeddings need an even head dim; got head_dim={head_dim}")
    return base ** (-jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim)


def rope(x: jax.Array, positions: jax.Array, *, base: float = 10000.0) -> jax.Array:
    """Applies rotary position embeddings (half-split convention).

    The head dim is split into halves (x1, x2) rotated pairwise by angle
    `position * base^(-2i/d)`, as in LLaMA/Gemma. Relative property:
    <rope(q, m), rope(k, n)> depends only on m - n.

    Args:
      x: [b, t, h, d] queries or keys.
      positions: [b, t] (or [t]) integer or float positions.
      base: the frequency base.

    Returns:
      [b, t, h, d] rotated array in x's dtype.
    """
    if x.ndim != 4:
        raise ValueError(f"rope expects x of shape [b, t, h, d]; got {x.shape}")
    b, t, _, d = x.shape
    _check_positions("positions", positions, b, t, "t")
    positions = jnp.broadcast_to(jnp.asarray(positions), (b, t)).astype(jnp.float32)
    angles = positions[..., None] * rope_frequencies(d, base=base)  # [b, t, d/2]
    sin = jnp.sin(angles)[:, :, None, :]
    cos = jnp.cos(angles)[:, :, None, :]
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x.dtype)
