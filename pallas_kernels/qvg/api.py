"""Public QVG ops: `kmeans_assign(x, centroids)` and `qvg_attention(q, k, v, lengths)`.

Dimension legend: `g` groups (all leading dims flattened), `s` points / span tokens, `d` dim,
`k` centroids, `b` batch, `t` query tokens, `h` query heads, `kh` KV heads (h % kh == 0),
`n` stages, `G` residual group size; a residual of `bits` bits packs 8 / bits codes (planes) per
byte, so its codes are [.., d / (8 / bits)].

`kmeans_assign` is `primitives.kmeans.assign`: nearest centroid by ``|x|^2 - 2 x.c + |c|^2``,
lowest index on ties. On compiled GPUs the matmul may run in TF32, which can flip near-ties; the
interpreter matches the reference exactly. The labels are written as [g, 1, s] rows (points along
lanes): as a [g, s, 1] column, XLA:TPU padded them to 128 lanes, 256 MiB of temporaries for the AOT
case's 64 x 8192 points; none now, on v5e and v6e.

`qvg_attention` is `primitives.attention.attention(q, K, V, kv_lengths=lengths)` where K and V are
the dequantized QVG spans (`primitives.residual_quantization.QVGTensor` of shape [b, kh, s, d], the
per-(batch, head) layout the quantizer clusters over). The kernel reads labels, centroids, packed
residual codes and scales, never a float copy (see `kernel.py` for the one-hot formulation).

Layout and splits (what makes long spans fit a TPU). Grid (b, kh, splits): the span is cut into
`num_splits` parts of whole `block_k` tiles, each program returns its unnormalized partial (o, m, l)
and the wrapper merges the parts with `primitives.attention.combine_partials`, as `kv_quant`'s
quantized decode does. A split axis with partials (rather than an "arbitrary" axis accumulating in
VMEM scratch) keeps one kernel body for Mosaic and Triton (Triton has no scratch) and leaves every
axis parallel; its cost is one [rows, d] float32 partial per split and a q C^T per split, so on TPU
the default takes the fewest splits whose blocks fit `_backend.TPU_BLOCK_VMEM_BUDGET`
(`config.default_splits`). Every per-token array lies with the tokens along the lanes: labels [b,
kh, n, s], codes [b, kh, d/(8/bits), s], scales and zero points [b, kh, d/G, s]. Token-major, their
narrow last dims (labels 1, codes 32, scales 2 to 8) padded to 128 lanes, 4x to 128x their size: the
whole 8k span no longer fitted (Mosaic: 28.56M > 16M scoped VMEM on v5e). Lane-major, a token costs
about 170 bytes of double-buffered VMEM in the production case (K in QVG's format, V in QVG-Pro's, d
= 128: 16.20M measured at 96k tokens in one split on v5e; `config.tpu_bytes_per_token` estimates
384, which is the safe side). The codes are read plane by plane (byte row r of plane i is channel
``(r // sub) G + i sub + r % sub``, sub = G / (8 / bits)); the wrapper permutes the channels of q,
of the centroids and of the output accordingly (`channel_order`), so each tile takes one [R,
d/(8/bits)] x [d/(8/bits), bk] dot per plane.

Compiled for TPU on this machine against device descriptions (`python -m pallas_kernels.aot --only
qvg`; JAX 0.10.2, libtpu 0.0.42.1): batch 8, 8 KV heads x 64 query rows, d = 128, spans 8k, 32k (one
split, 0 MiB of XLA temporaries) up to 1M tokens (32 splits by default) on v5e and v6e.

The stored scales and zero points are widened in the wrapper (s d / G elements, 1/G of the span):
fp8 to bfloat16 (exact), float16 / float32 to float32, since neither backend's convert path needs fp8.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_kernels import _backend
from pallas_kernels.qvg.config import AssignBlockSizes, QVGAttentionBlockSizes, default_splits, tpu_bytes_per_token
from pallas_kernels.qvg.cost import assign_cost, qvg_attention_cost
from pallas_kernels.qvg.kernel import kmeans_assign_kernel, qvg_attention_kernel
from primitives import attention as attn_ref
from primitives import kmeans as km
from primitives import residual_quantization as rq

__all__ = ["kmeans_assign", "qvg_attention"]


@functools.partial(jax.jit, static_argnames=("block_sizes", "implementation", "interpret"))
def kmeans_assign(x: jax.Array, centroids: jax.Array, *, block_sizes: AssignBlockSizes | None = None,
                  implementation: str | None = None, interpret: bool | None = None) -> jax.Array:
    """Nearest-centroid labels of every point.

    Args:
      x: [..., s, d] points.
      centroids: [..., k, d] with the same leading dims.
      block_sizes: tiling; default `AssignBlockSizes.default(points=s, implementation=...)`.
      implementation: None | "xla" (`primitives.kmeans.assign`) | "pallas" | "pallas_tpu" | "pallas_triton".
      interpret: run the Pallas kernel in the interpreter (None = iff on CPU).

    Returns:
      [..., s] int32 labels.
    """
    if x.ndim < 2 or centroids.ndim != x.ndim or centroids.shape[:-2] != x.shape[:-2] \
            or centroids.shape[-1] != x.shape[-1]:
        raise ValueError(f"x [..., s, d] and centroids [..., k, d] must share leading dims and d; got shapes "
                         f"{x.shape} and {centroids.shape}")
    impl = _backend.resolve_implementation(implementation)
    if impl == "xla":
        return km.assign(x, centroids)
    lead, (s, d), k = x.shape[:-2], x.shape[-2:], centroids.shape[-2]
    g = math.prod(lead)
    bs = block_sizes or AssignBlockSizes.default(points=s, implementation=impl)
    bs.validate(impl)
    sp = max(1, -(-s // bs.block_s)) * bs.block_s
    # TPU: the [bs, kp] distances are transposed in the kernel, so kp fills whole lanes (the MXU is 128
    # wide anyway); the padded centroids never win (their distance is +inf).
    kp = -(-k // 128) * 128 if impl == "pallas_tpu" else _backend.padded_rows(k, impl)
    xf = _backend.pad_axis(x.reshape(g, s, d).astype(jnp.float32), 1, sp)
    cf = _backend.pad_axis(centroids.reshape(g, k, d).astype(jnp.float32), 1, kp)
    cc = jnp.sum(cf * cf, axis=-1)[:, None, :]  # [g, 1, kp]
    cost = assign_cost(groups=g, points=s, centroids=k, dim=d)
    with _backend.quiet_triton_deprecation():
        labels = pl.pallas_call(
            functools.partial(kmeans_assign_kernel, num_centroids=k),
            grid=(g, sp // bs.block_s),
            in_specs=[pl.BlockSpec((None, bs.block_s, d), lambda i, j: (i, j, 0)),
                      pl.BlockSpec((None, kp, d), lambda i, j: (i, 0, 0)),
                      pl.BlockSpec((None, 1, kp), lambda i, j: (i, 0, 0))],
            out_specs=pl.BlockSpec((None, 1, bs.block_s), lambda i, j: (i, 0, j)),
            out_shape=jax.ShapeDtypeStruct((g, 1, sp), jnp.int32),
            compiler_params=_backend.compiler_params(impl, dimension_semantics=("parallel", "parallel")),
            interpret=_backend.resolve_interpret(interpret),
            cost_estimate=pl.CostEstimate(flops=int(cost.flops), bytes_accessed=int(cost.bytes_accessed),
                                          transcendentals=0),
            name="kmeans_assign",
        )(xf, cf, cc)
    return labels[:, 0, :s].reshape(*lead, s)


def _check_span(name: str, t, q: jax.Array) -> None:
    if not isinstance(t, rq.QVGTensor):
        raise ValueError(f"{name} must be a primitives.residual_quantization.QVGTensor; got {type(t).__name__}")
    if len(t.shape) != 4:
        raise ValueError(f"{name} must be a QVG span of shape [b, kh, s, d]; got shape {t.shape}")
    b, _, h, d = q.shape
    if t.shape[0] != b or t.shape[3] != d:
        raise ValueError(f"q {q.shape} ([b, t, h, d]) and {name} {t.shape} ([b, kh, s, d]) disagree on batch or "
                         f"head dim")
    if h % t.shape[1]:
        raise ValueError(f"query heads ({h}) must be a multiple of KV heads ({t.shape[1]}) in {name}")
    r = t.residual
    if r is not None and (r.axis != 3 or r.pack_block != r.group_size):
        raise ValueError(f"{name}.residual must be quantized along d with pack_block == group_size; got "
                         f"axis={r.axis}, pack_block={r.pack_block}")


def _meta(t: rq.QVGTensor, implementation: str, name: str, d: int):
    r = t.residual
    if r is None:
        return None
    if implementation == "pallas_triton" and d * r.bits // 8 < 16:
        raise ValueError(f"Triton's dot needs >= 16 channels per code plane: {name} d / (8 / bits) = "
                         f"{d * r.bits // 8}")
    return (r.bits, r.group_size, r.scheme)


def channel_order(d: int, meta: tuple | None) -> np.ndarray:
    """[d] channel index of each position of the kernel's plane-major order for a residual format
    meta = (bits, G, scheme): position ``i d/n + r`` is plane i of packed byte r, i.e. channel
    ``(r // sub) G + i sub + r % sub`` with n = 8 / bits, sub = G / n (the identity when meta is None)."""
    if meta is None:
        return np.arange(d)
    n = 8 // meta[0]
    sub, dn = meta[1] // n, d // n
    r = np.arange(dn)
    return np.concatenate([(r // sub) * meta[1] + i * sub + r % sub for i in range(n)])


def _widen(a: jax.Array) -> jax.Array:
    """Scales / zero points in a dtype both backends load and convert: fp8 (and bfloat16) become bfloat16,
    which holds every fp8 value exactly; float16 and float32 become float32."""
    dt = jnp.dtype(a.dtype)
    return a.astype(jnp.bfloat16 if dt.itemsize == 1 or dt == jnp.bfloat16 else jnp.float32)


def _take_channels(a: jax.Array, order: np.ndarray) -> jax.Array:
    """a[..., order] (no gather when `order` is the identity)."""
    return a if np.array_equal(order, np.arange(a.shape[-1])) else a[..., order]


def reference(q: jax.Array, k: rq.QVGTensor, v: rq.QVGTensor, lengths: jax.Array, *, scale: float):
    """Dequantize the spans, then dense attention; returns (out [b, t, h, d] float32, lse [b, h, t])."""
    kd = jnp.swapaxes(rq.dequantize(k, jnp.float32), 1, 2)
    vd = jnp.swapaxes(rq.dequantize(v, jnp.float32), 1, 2)
    res = attn_ref.attention(q.astype(jnp.float32), kd, vd, kv_lengths=lengths, scale=scale, return_lse=True)
    return res.out, res.lse


@functools.partial(jax.jit, static_argnames=("scale", "block_sizes", "return_residuals", "implementation",
                                             "interpret"))
def qvg_attention(q: jax.Array, k: rq.QVGTensor, v: rq.QVGTensor, lengths: jax.Array | None = None, *,
                  scale: float | None = None, block_sizes: QVGAttentionBlockSizes | None = None,
                  return_residuals: bool = False, implementation: str | None = None,
                  interpret: bool | None = None):
    """Attention of queries over a QVG-quantized key/value span (no causal mask inside the span).

    Args:
      q: [b, t, h, d] queries (e.g. the tokens of the chunk being generated).
      k, v: `QVGTensor` spans of shape [b, kh, s, d] (each with its own stages, centroids and
        residual format).
      lengths: [b] valid span tokens per sequence (default: all s).
      scale: logit scale (default 1/sqrt(d)).
      block_sizes: tiling; default `QVGAttentionBlockSizes.default(...)`; `num_splits=None` (the default)
        picks the split count with `config.default_splits` (on TPU: the fewest that fit VMEM).
      return_residuals: also return lse [b, h, t] float32 (to merge with attention over the
        full-precision chunks via `primitives.attention.combine_partials`).
      implementation: None | "xla" (dequantize, then the reference) | "pallas" | "pallas_tpu" | "pallas_triton".
      interpret: run the Pallas kernel in the interpreter (None = iff on CPU).

    Returns:
      out [b, t, h, d] in q's dtype (and lse).
    """
    if q.ndim != 4:
        raise ValueError(f"q must be [b, t, h, d]; got shape {q.shape}")
    _check_span("k", k, q)
    _check_span("v", v, q)
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape; got k {k.shape}, v {v.shape}")
    b, t, h, d = q.shape
    kh, s = k.shape[1], k.shape[2]
    lengths = jnp.full((b,), s, jnp.int32) if lengths is None else lengths
    if lengths.shape != (b,):
        raise ValueError(f"lengths must have shape [b]=({b},); got {lengths.shape}")
    lengths = jnp.clip(lengths.astype(jnp.int32), 0, s)
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    impl = _backend.resolve_implementation(implementation)
    if impl == "xla":
        out, lse = reference(q, k, v, lengths, scale=scale)
        return (out.astype(q.dtype), lse) if return_residuals else out.astype(q.dtype)

    k_meta, v_meta = _meta(k, impl, "k", d), _meta(v, impl, "v", d)
    bs = block_sizes or QVGAttentionBlockSizes.default(seq_len=s, implementation=impl)
    bs.validate(impl)
    g = h // kh
    rows = g * t
    rp = _backend.padded_rows(rows, impl)
    # Rows of one KV head: its g query heads times the t query tokens.
    qg = q.reshape(b, t, kh, g, d).transpose(0, 2, 3, 1, 4).reshape(b, kh, rows, d)
    qg = _backend.pad_axis(_take_channels(qg, channel_order(d, k_meta)), 2, rp)

    # Every per-token array lies with the tokens along the last (lane) axis: labels [b, kh, n, s], codes
    # [b, kh, d/n, s], scales and zero points [b, kh, d/G, s]; token-major, their narrow last dims (1,
    # d/n, d/G) would pad to 128 lanes in TPU VMEM (and HBM).
    spans = []  # per span: ([per-token arrays], centroids)
    for span, meta in ((k, k_meta), (v, v_meta)):
        kc = span.centroids.shape[-2]
        cents = _backend.pad_axis(span.centroids, 3, _backend.padded_rows(kc, impl))  # [n, b, kh, kp, d]
        cents = _take_channels(cents, channel_order(d, meta))  # in the order of q (keys) / of the output (values)
        per_token = [jnp.moveaxis(span.labels, 0, 2)]
        r = span.residual
        if r is not None:
            per_token += [jnp.swapaxes(a, 2, 3) for a in [r.codes, _widen(r.scale)]
                          + ([_widen(r.zero)] if r.scheme == "asymmetric" else [])]
        spans.append((per_token, cents))
    bytes_per_token = tpu_bytes_per_token([(a.shape[2], a.dtype.itemsize) for pt, _ in spans for a in pt])
    splits = bs.num_splits or default_splits(seq_len=s, block_k=bs.block_k, programs=b * kh, implementation=impl,
                                             bytes_per_token=bytes_per_token)
    chunk = bs.block_k * splits
    sp = max(1, -(-s // chunk)) * chunk  # whole splits; padded tokens lie past every length
    split_len = sp // splits

    arrays, specs = [], []
    for per_token, cents in spans:
        n = cents.shape[0]
        for pos, a in enumerate(per_token):
            arrays.append(_backend.pad_axis(a, 3, sp))
            specs.append(pl.BlockSpec((None, None, a.shape[2], split_len), lambda i, j, c: (i, j, 0, c)))
            if pos == 0:  # the centroids follow the labels
                arrays.append(cents)
                specs.append(pl.BlockSpec((n, None, None) + cents.shape[3:], lambda i, j, c: (0, i, j, 0, 0)))
    len_spec = (pl.BlockSpec(memory_space=pltpu.SMEM) if impl == "pallas_tpu"
                else pl.BlockSpec((b,), lambda i, j, c: (0,)))
    cost = qvg_attention_cost(batch=b, query_rows=rows, kv_heads=kh, span=s, dim=d,
                              stored_bytes=k.nbytes + v.nbytes, k_stages=k.labels.shape[0],
                              v_stages=v.labels.shape[0], centroids=max(k.centroids.shape[-2], v.centroids.shape[-2]),
                              q_itemsize=q.dtype.itemsize, splits=splits)
    kernel = functools.partial(qvg_attention_kernel, k_stages=k.labels.shape[0], v_stages=v.labels.shape[0],
                               k_meta=k_meta, v_meta=v_meta, block_k=bs.block_k, split_len=split_len, scale=scale)
    stat = jax.ShapeDtypeStruct((b, kh, splits, rp, 1), jnp.float32)
    with _backend.quiet_triton_deprecation():
        o, m, l = pl.pallas_call(
            kernel,
            grid=(b, kh, splits),
            in_specs=[len_spec, pl.BlockSpec((None, None, rp, d), lambda i, j, c: (i, j, 0, 0))] + specs,
            out_specs=[pl.BlockSpec((None, None, None, rp, d), lambda i, j, c: (i, j, c, 0, 0)),
                       pl.BlockSpec((None, None, None, rp, 1), lambda i, j, c: (i, j, c, 0, 0)),
                       pl.BlockSpec((None, None, None, rp, 1), lambda i, j, c: (i, j, c, 0, 0))],
            out_shape=[jax.ShapeDtypeStruct((b, kh, splits, rp, d), jnp.float32), stat, stat],
            compiler_params=_backend.compiler_params(impl, dimension_semantics=("parallel", "parallel", "parallel")),
            interpret=_backend.resolve_interpret(interpret),
            cost_estimate=pl.CostEstimate(flops=int(cost.flops), bytes_accessed=int(cost.bytes_accessed),
                                          transcendentals=int(cost.transcendentals)),
            name="qvg_attention",
        )(lengths, qg, *arrays)
    # Merge the splits: [splits, b, kh, rows(, d)], each normalized over its own tokens.
    o = _take_channels(o[:, :, :, :rows], np.argsort(channel_order(d, v_meta)))
    m, l = m[:, :, :, :rows, 0], l[:, :, :, :rows, 0]
    safe = jnp.where(l > 0, l, 1.0)
    part = jnp.moveaxis(o / safe[..., None], 2, 0)
    part_lse = jnp.moveaxis(jnp.where(l > 0, m + jnp.log(safe), -jnp.inf), 2, 0)
    merged = attn_ref.combine_partials(part, part_lse)
    out = merged.out.reshape(b, kh, g, t, d).transpose(0, 3, 1, 2, 4).reshape(b, t, h, d)
    lse = merged.lse.reshape(b, h, t)
    return (out.astype(q.dtype), lse) if return_residuals else out.astype(q.dtype)
