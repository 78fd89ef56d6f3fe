"""FFD decode for models and experiments: the page selectors behind one call and a gathered XLA fast path.

Faster Flash Decoding (Liu et al., ICML 2026) scans 2-bit key codes, keeps the pages whose best scan
score reaches ``m_ref - delta`` (``m_ref`` from the first and the last full page only) and attends
exactly to those pages plus the current, incomplete page. :mod:`primitives.ffd` is the readable
reference (every page computed, dropped pages masked); ``pallas_kernels.ffd_decode`` is the fused
kernel that skips dropped pages inside the kernel. This module is what a model or an experiment
calls:

* :func:`select_pages`: FFD's top-delta selection or a baseline at a page budget (``"top_k"``: global
  top-k of the scan maxima; ``"quest"``: per-page min/max key bounds; ``"all"``: every valid page).
* :func:`scan_page_maxima`: the scan's per-head page maxima computed chunk by chunk, so the unpacked
  float codes of only ``chunk_pages`` pages exist at a time (XLA does not fuse the unpacking into the
  dot; a full unpacked copy of the keys would cost as much as reading dense keys).
* :func:`gathered_decode`: attention over at most ``capacity`` selected pages per (sequence, KV head),
  gathered before any arithmetic, so the residual and values of dropped pages are never read. The
  capacity is static (XLA needs static shapes); selected pages beyond it, lowest scan maximum first,
  are dropped and counted in ``overflow``. With ``capacity >= kept pages`` the result equals the
  reference's.
* :func:`decode`: selection plus attention in one call, with ``implementation`` choosing the gathered
  path, the masked reference or the Pallas kernel.

Example:
    >>> import jax, jax.numpy as jnp
    >>> from primitives import ffd as ref
    >>> kq, kk, kv = jax.random.split(jax.random.key(0), 3)
    >>> q = jax.random.normal(kq, (1, 4, 16))
    >>> keys, values = jax.random.normal(kk, (1, 200, 2, 16)), jax.random.normal(kv, (1, 200, 2, 16))
    >>> cache = ref.build_cache(keys, values, jnp.array([200]), page_size=16)
    >>> out = decode(q, cache, delta=5.0, capacity=12)           # all 12 full pages fit: exact FFD
    >>> bool(jnp.allclose(out.out, ref.ffd_decode(q, cache, delta=5.0).out, atol=1e-5)), int(out.overflow.sum())
    (True, 0)
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from pallas_kernels import ffd_decode as ffd_kernel
from primitives import ffd as ref

__all__ = ["SELECTORS", "IMPLEMENTATIONS", "Selection", "DecodeOutput", "select_pages",
           "gathered_decode", "decode", "pages_for_fraction"]

SELECTORS = ("top_delta", "top_k", "quest", "all")
IMPLEMENTATIONS = ("gathered", "reference", "kernel")


class Selection(NamedTuple):
    """Pages chosen for one decode step.

    Attributes:
      keep: [b, k, p] bool selected valid pages (shared by the GQA group of each KV head).
      page_max: [b, k, p] the group's best scan score per page (base 2; -inf on invalid pages); the
        gathered path prefers high values when the selection exceeds its capacity.
      threshold: [b, h] ``m_ref - delta`` for top-delta, NaN for the budget selectors.
    """

    keep: jax.Array
    page_max: jax.Array
    threshold: jax.Array


class DecodeOutput(NamedTuple):
    """Result of :func:`decode` / :func:`gathered_decode`.

    Attributes:
      out: [b, h, d] attention output in q's dtype.
      lse: [b, h] natural-log logsumexp of the attended scores.
      keep: [b, k, p] bool pages attended (after any capacity overflow).
      threshold: [b, h] as in :class:`Selection`.
      overflow: [b, k] int32 selected pages dropped because they exceeded the capacity (0 for the
        reference and the kernel).
    """

    out: jax.Array
    lse: jax.Array
    keep: jax.Array
    threshold: jax.Array
    overflow: jax.Array


def pages_for_fraction(cache: ref.FFDCache, fraction: float) -> int:
    """The per-(sequence, KV head) page budget ``round(fraction * pages)`` for the budget selectors."""
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"fraction must be in [0, 1], got {fraction}")
    return int(round(fraction * cache.num_pages))


def select_pages(q: jax.Array, cache: ref.FFDCache, *, selector: str = "top_delta", delta: float = 5.0,
                 num_pages: int | None = None, chunk_pages: int | None = None) -> Selection:
    """Selects the pages one decode step attends to.

    Args:
      q: [b, h, d] queries.
      cache: the FFD cache.
      selector: ``"top_delta"`` (FFD: threshold ``m_ref - delta``), ``"top_k"`` (the ``num_pages``
        best pages by scan maximum), ``"quest"`` (the ``num_pages`` best by Quest's min/max bound) or
        ``"all"`` (every valid page).
      delta: FFD margin in log2 units (``"top_delta"`` only).
      num_pages: page budget per (sequence, KV head) for ``"top_k"`` and ``"quest"``.
      chunk_pages: scan chunk (see :func:`primitives.ffd.chunked_page_maxima`).
    """
    if selector not in SELECTORS:
        raise ValueError(f"selector must be one of {SELECTORS}, got {selector!r}")
    if selector in ("top_k", "quest") and num_pages is None:
        raise ValueError(f"selector {selector!r} needs num_pages (a page budget per sequence and KV head)")
    b, h, _ = q.shape
    valid = cache.valid_pages[:, None, :]
    per_head = ref.chunked_page_maxima(q, cache, chunk_pages=chunk_pages)  # [b, k, g, p]
    page_max = jnp.max(per_head, axis=2)
    if selector == "top_delta":
        th = ref.reference_threshold(q, cache, delta)  # [b, k, g]
        keep = jnp.any(per_head >= th[..., None], axis=2) & valid
        return Selection(keep, page_max, th.reshape(b, h))
    if selector == "top_k":
        keep = ref._top_pages(page_max, valid, num_pages)
    elif selector == "quest":
        keep = ref.quest_keep(q, cache, num_pages)
    else:
        keep = jnp.broadcast_to(valid, page_max.shape)
    return Selection(keep, page_max, jnp.full((b, h), jnp.nan, jnp.float32))


def gathered_decode(q: jax.Array, cache: ref.FFDCache, selection: Selection, *, capacity: int,
                    use_residual: bool = True) -> DecodeOutput:
    """Attention over at most ``capacity`` selected pages per (sequence, KV head) plus the current page.

    Only the gathered pages' codes, scales, residual and values are read after the selection; see
    :func:`primitives.ffd.gathered_decode`.
    """
    o = ref.gathered_decode(q, cache, selection.keep, selection.page_max, capacity=capacity,
                            use_residual=use_residual)
    return DecodeOutput(o.out, o.lse, o.keep, selection.threshold, o.overflow)


@functools.partial(jax.jit, static_argnames=("selector", "delta", "num_pages", "capacity", "use_residual",
                                             "implementation", "chunk_pages"))
def decode(q: jax.Array, cache: ref.FFDCache, *, selector: str = "top_delta", delta: float = 5.0,
           num_pages: int | None = None, capacity: int | None = None, use_residual: bool = True,
           implementation: str = "gathered", chunk_pages: int | None = None) -> DecodeOutput:
    """One decode step: select pages, then attend to them and to the current page.

    Args:
      q: [b, h, d] queries; cache: the FFD cache.
      selector, delta, num_pages, chunk_pages: as in :func:`select_pages`.
      capacity: gather budget of the ``"gathered"`` path (default: every page, always exact).
      use_residual: refine kept pages with the residual.
      implementation: ``"gathered"`` (XLA fast path), ``"reference"`` (every page computed and
        masked) or ``"kernel"`` (``pallas_kernels.ffd_decode`` on the current backend; top-delta only).
    """
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"implementation must be one of {IMPLEMENTATIONS}, got {implementation!r}")
    no_overflow = jnp.zeros(cache.scales.shape[:2], jnp.int32)
    if implementation == "kernel":
        if selector != "top_delta":
            raise ValueError(f"implementation 'kernel' fuses FFD's top-delta selection only; got selector {selector!r}")
        o = ffd_kernel.ffd_decode(q, cache, delta=delta, use_residual=use_residual)
        return DecodeOutput(o.out, o.lse, o.keep, o.threshold, no_overflow)
    sel = select_pages(q, cache, selector=selector, delta=delta, num_pages=num_pages, chunk_pages=chunk_pages)
    if implementation == "reference":
        o = ref.sparse_decode(q, cache, sel.keep, use_residual=use_residual)
        return DecodeOutput(o.out, o.lse, o.keep, sel.threshold, no_overflow)
    return gathered_decode(q, cache, sel, capacity=max(cache.num_pages, 1) if capacity is None else capacity,
                           use_residual=use_residual)
