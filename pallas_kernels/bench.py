"""Benchmarks of the Pallas core: modeled FLOPs and bytes, measured wall time, projected accelerator time.

    python -m pallas_kernels.bench                  # CPU: XLA references + FFD's XLA fast path
    python -m pallas_kernels.bench --out results/bench/cpu.json
    python -m pallas_kernels.bench --tokens 16384   # fewer FFD lengths (faster)
    python -m pallas_kernels.bench --only ffd --out results/bench/cpu.json   # FFD section only, merged

Per op and shape it prints the cost model's FLOPs and bytes, the XLA reference's measured wall time on
this machine, and the roofline time projected on an H200 (989 TFLOP/s bf16 dense, 4.3 TB/s: the
measured copy ceiling, below the 4.8 TB/s spec) and on a TPU v5e (197 TFLOP/s bf16, 819 GB/s).

For FFD, on synthetic decode steps with sink-and-needle heads (``primitives.ffd.synthetic_problem``):
the kept page fraction, the relative output error against exact attention, the modeled bytes against
dense bf16 K/V, and the wall-time ratio of FFD's XLA fast path (``primitives.ffd.fast_ffd_decode``:
one int8 product per KV head over one-byte scan keys with a proven error bound, exact float check of
the two reference pages and the candidates, gathered attention over the kept ones) against every dense XLA decode measured in the same run (the
library's reference ``decode_attention`` on the cache in its default axis order; head-major einsums
over float32 and bfloat16 K/V; a 16-block split-K head-major decode), with the ratio against the
fastest of them named explicitly; then, at the first length, the kept fraction, error and dropped
attention mass for several ``delta`` (``ffd_error_sweep``).
Timings interleave the contenders and report medians, so a busy machine slows all of them alike.

For Vegas (``pallas_kernels.vegas``): verification attention with two score rows over a 4k cache, and
sparse decode at S=16384 over K = 5% listed keys plus a 128-key recent window, with the gathered XLA
path's wall-time and modeled-bytes ratios against the dense masked reference, same inputs and run.

Dense decode roofline (``--only decode``): per cache length and GQA shape, the library's dense decode
(``primitives.attention.decode_attention`` on the cache in its default axis order) against the same
maths written other ways (two einsums on either order, a 16-block split-K), all interleaved on the same
inputs, beside ``sum(K) + sum(V)`` (reading the cache once and nothing else) and a 1 GiB reduction: the
library's bandwidth, its fraction of that read roofline and its ratio to the fastest alternative.

The model-level benchmarks (``generate`` throughput, the MoE FFN) live in ``experiments/bench.py``
(``python -m experiments bench`` runs them together with these sections).

With a GPU present, the same command also runs ``pallas_kernels.device_check`` (every Pallas kernel
compiled for Triton and checked against its reference, the card's measured copy ceiling, the dense
decode kernel's bandwidth per axis order, FFD's kernel speedup over our dense decode kernel at
32k-256k tokens); on a lent GPU run that module alone, it is the short one. Nothing here is asserted:
the numbers are printed (and saved with ``--out``) for the reader to judge.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import pathlib
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels.decode_attention import api as decode_api
from pallas_kernels._common import Cost
from pallas_kernels.decode_attention.cost import decode_cost
from pallas_kernels.ffd_decode import ffd_cost
from pallas_kernels import device_check, kv_quant
from pallas_kernels import qvg as qvg_kernels
from pallas_kernels import vegas as vegas_kernels
from pallas_kernels.flash_attention import api as flash_api
from pallas_kernels.flash_attention.cost import flash_cost
from primitives import attention as attn_ref
from primitives import ffd as ffd_ref
from primitives import quantization as qz
from primitives import residual_quantization as rq

H200 = {"name": "H200", "peak_flops": 989e12, "bandwidth": 4.3e12}
TPU_V5E = {"name": "TPU v5e", "peak_flops": 197e12, "bandwidth": 819e9}
DEVICES = (H200, TPU_V5E)


_timed = device_check.timed  # median seconds per callable, interleaved round-robin


def _projected(cost: Cost) -> dict:
    return {d["name"]: cost.projected_seconds(peak_flops=d["peak_flops"], bandwidth=d["bandwidth"]) for d in DEVICES}


def _row(op: str, shape: str, cost: Cost, seconds: float) -> dict:
    return {"op": op, "shape": shape, "gflops": cost.flops / 1e9, "mbytes": cost.bytes_accessed / 1e6,
            "xla_ms": seconds * 1e3, "projected_us": {k: v * 1e6 for k, v in _projected(cost).items()}}


def _print_rows(rows: list[dict]) -> None:
    print(f"{'op':<22}{'shape':<34}{'GFLOP':>9}{'MB':>10}{'XLA ms':>10}" + "".join(f"{d['name'] + ' us':>14}"
                                                                           for d in DEVICES))
    for r in rows:
        print(f"{r['op']:<22}{r['shape']:<34}{r['gflops']:>9.3f}{r['mbytes']:>10.1f}{r['xla_ms']:>10.2f}"
              + "".join(f"{r['projected_us'][d['name']]:>14.1f}" for d in DEVICES))


def _normal(key, shape, dtype=jnp.float32):
    return jax.random.normal(key, shape, jnp.float32).astype(dtype)


def bench_ops(repeats: int) -> list[dict]:
    """XLA reference wall time of every op at one representative shape, beside its cost model."""
    rows = []
    k = jax.random.split(jax.random.key(0), 6)
    # flash attention prefill: b=1, t=s=2048, 8 heads over 2 KV heads, d=64, causal.
    b, t, h, kh, d = 1, 2048, 8, 2, 64
    q, kk, vv = _normal(k[0], (b, t, h, d)), _normal(k[1], (b, t, kh, d)), _normal(k[2], (b, t, kh, d))
    f = jax.jit(lambda q, k, v: flash_api.flash_attention(q, k, v, causal=True, implementation="xla"))
    sec = _timed({"x": lambda: f(q, kk, vv)}, repeats)["x"]
    rows.append(_row("flash_attention", f"b{b} t{t} h{h}/{kh} d{d} causal", flash_cost(
        batch=b, q_len=t, kv_len=t, num_heads=h, num_kv_heads=kh, head_dim=d, itemsize=4, causal=True), sec))
    # decode attention: b=1, s=16k, 32 heads over 8 KV heads, d=128.
    b, s, h, kh, d = 1, 16384, 32, 8, 128
    q, kk, vv = _normal(k[3], (b, h, d)), _normal(k[4], (b, s, kh, d)), _normal(k[5], (b, s, kh, d))
    lengths = jnp.full((b,), s, jnp.int32)
    f = jax.jit(lambda q, k, v, n: decode_api.decode_attention(q, k, v, n, implementation="xla"))
    sec = _timed({"x": lambda: f(q, kk, vv, lengths)}, repeats)["x"]
    rows.append(_row("decode_attention", f"b{b} s{s} h{h}/{kh} d{d}", decode_cost(
        batch=b, kv_len=s, num_heads=h, num_kv_heads=kh, head_dim=d, kv_itemsize=4), sec))
    rows.extend(_bench_kv_quant(q, kk, vv, lengths, repeats))
    rows.extend(_bench_qvg(repeats))
    rows.extend(_bench_vegas(repeats))
    rows.extend(_bench_wkv(repeats))
    return rows


def _bench_vegas(repeats: int) -> list[dict]:
    """Vegas verify attention (XLA path) and sparse decode: gathered XLA path vs the dense masked reference."""
    k = jax.random.split(jax.random.key(2), 6)
    b, t, h, kh, d, s = 1, 5, 32, 8, 128, 4096  # gamma = 4 draft tokens + 1, score rows (0, t - 1)
    q, kk, vv = _normal(k[0], (b, t, h, d)), _normal(k[1], (b, s, kh, d)), _normal(k[2], (b, s, kh, d))
    pos = jnp.broadcast_to(jnp.arange(s - t, s, dtype=jnp.int32), (b, t))
    f = jax.jit(lambda q, k, v, p: vegas_kernels.verify_attention(q, k, v, p, rows=(0, t - 1), implementation="xla"))
    sec = _timed({"x": lambda: f(q, kk, vv, pos)}, repeats)["x"]
    rows = [_row("vegas verify", f"b{b} t{t} s{s} h{h}/{kh} d{d} R2", vegas_kernels.verify_cost(
        batch=b, q_len=t, num_heads=h, num_kv_heads=kh, kv_len=s, head_dim=d, score_rows=2, kv_itemsize=4), sec)]
    s, w = 16384, 128
    n_idx = s * 5 // 100
    qd, kk, vv = _normal(k[3], (b, h, d)), _normal(k[4], (b, s, kh, d)), _normal(k[5], (b, s, kh, d))
    lengths = jnp.full((b,), s, jnp.int32)
    start = lengths - w
    idx = jax.random.permutation(k[0], s - w)[:n_idx][None].astype(jnp.int32)
    valid = jnp.ones((b, n_idx), bool)
    scale = 1.0 / math.sqrt(d)
    sparse = jax.jit(lambda q, k, v: vegas_kernels.sparse_decode_attention(q, k, v, idx, valid, start, lengths,
                                                                           max_recent=w, implementation="xla"))
    dense = jax.jit(lambda q, k, v: vegas_kernels.sparse_decode_reference(q, k, v, idx, valid, start, lengths,
                                                                          max_recent=w, scale=scale).out)
    err = float(jnp.max(jnp.abs(sparse(qd, kk, vv) - dense(qd, kk, vv))))
    times = _timed({"sparse": lambda: sparse(qd, kk, vv), "dense": lambda: dense(qd, kk, vv)}, repeats)
    cost = vegas_kernels.sparse_decode_cost(batch=b, num_heads=h, num_kv_heads=kh, head_dim=d, num_indices=n_idx,
                                            max_recent=w, kv_itemsize=4)
    dense_cost = decode_cost(batch=b, kv_len=s, num_heads=h, num_kv_heads=kh, head_dim=d, kv_itemsize=4)
    shape = f"b{b} s{s} K{n_idx} W{w} h{h}/{kh} d{d}"
    row = _row("vegas sparse (gather)", shape, cost, times["sparse"])
    row.update({"dense_ms": times["dense"] * 1e3, "wall_ratio_vs_dense": times["sparse"] / times["dense"],
                "bytes_ratio_vs_dense": cost.bytes_accessed / dense_cost.bytes_accessed, "max_abs_err": err})
    return rows + [row, _row("vegas sparse dense ref", shape, dense_cost, times["dense"])]


def _print_vegas(rows: list[dict]) -> None:
    for r in rows:
        if "wall_ratio_vs_dense" in r:
            print(f"vegas sparse decode {r['shape']}: gathered XLA / dense reference wall {r['wall_ratio_vs_dense']:.3f} "
                  f"({r['xla_ms']:.2f} / {r['dense_ms']:.2f} ms), modeled bytes {r['bytes_ratio_vs_dense']:.3f}, "
                  f"max abs err {r['max_abs_err']:.1e}")


def _qvg_problem(*, s=4096, kh=8, d=128, t=64, h=8, seed=1):
    """A chunk of t query tokens over a QVG span of s tokens (one stage, 256 centroids, INT2, G=64)."""
    k = jax.random.split(jax.random.key(seed), 3)
    keys, values = _normal(k[0], (1, kh, s, d)), _normal(k[1], (1, kh, s, d))
    cfg = dataclasses.replace(rq.QVG, kmeans_iters=2)
    kt, vt = rq.qvg_quantize(keys, k[2], config=cfg), rq.qvg_quantize(values, k[2], config=cfg)
    q = _normal(k[2], (1, t, h, d))
    return q, keys, values, kt, vt


def _bench_qvg(repeats: int) -> list[dict]:
    """Attention of one chunk over a QVG span (XLA path: dequantize, then dense) beside bf16 attention."""
    q, keys, values, kt, vt = _qvg_problem()
    _, t, h, d = q.shape
    kh, s = keys.shape[1], keys.shape[2]
    k16, v16 = (jnp.swapaxes(x, 1, 2).astype(jnp.bfloat16) for x in (keys, values))
    f = jax.jit(lambda q, kt, vt: qvg_kernels.qvg_attention(q, kt, vt, implementation="xla"))
    g = jax.jit(lambda q, k, v: attn_ref.attention(q, k, v))
    times = _timed({"qvg": lambda: f(q, kt, vt), "dense": lambda: g(q.astype(jnp.bfloat16), k16, v16)}, repeats)
    cost = qvg_kernels.qvg_attention_cost(batch=1, query_rows=t * h // kh, kv_heads=kh, span=s, dim=d,
                                          stored_bytes=kt.nbytes + vt.nbytes, k_stages=1, v_stages=1,
                                          centroids=kt.centroids.shape[-2])
    dense = flash_cost(batch=1, q_len=t, kv_len=s, num_heads=h, num_kv_heads=kh, head_dim=d, itemsize=2,
                       causal=False)
    shape = f"t{t} s{s} h{h}/{kh} d{d}"
    return [_row(f"qvg attention {kt.bits_per_element:.2f}b", shape, cost, times["qvg"]),
            _row("attention bf16", shape, dense, times["dense"])]


def _bench_wkv(repeats: int, seq_lens=(256, 1024, 4096), channels: int = 256, heads: int = 4) -> list[dict]:
    """Bi-WKV (linear-time XLA path) against sequence length, beside dense softmax attention (quadratic) over
    the same tokens and width (``heads`` heads of ``channels / heads``); both timed interleaved in one run.
    Prints, per length, each one's wall-time growth since the first length, their wall and FLOP ratios."""
    from pallas_kernels import wkv as wkv_kernels

    d = channels // heads
    f = jax.jit(lambda w, u, k, v: wkv_kernels.bi_wkv(w, u, k, v, implementation="xla"))
    g = jax.jit(lambda q, k, v: attn_ref.attention(q, k, v))
    rows, first = [], None
    for t in seq_lens:
        key = jax.random.split(jax.random.key(3), 5)
        # Vision-RWKV's fancy-init range of decays (-5..3) and bonuses, divided by t as the model does.
        w = jnp.linspace(-5.0, 3.0, channels) / t
        u = jnp.log(0.3) + 0.5 * ((jnp.arange(channels) + 1) % 3 - 1.0) / t
        k, v, q = (_normal(key[i], (1, t, channels)) for i in range(3))
        heads_of = lambda x: x.reshape(1, t, heads, d)
        times = _timed({"wkv": lambda: f(w, u, k, v), "attn": lambda: g(heads_of(q), heads_of(k), heads_of(v))},
                       repeats)
        first = first or times
        cost = wkv_kernels.bi_wkv_cost(batch=1, seq_len=t, channels=channels)
        dense = flash_cost(batch=1, q_len=t, kv_len=t, num_heads=heads, num_kv_heads=heads, head_dim=d, itemsize=4,
                           causal=False)
        row = _row("bi_wkv xla (linear)", f"b1 t{t} c{channels}", cost, times["wkv"])
        row.update({"growth_vs_first": times["wkv"] / first["wkv"], "attention_ms": times["attn"] * 1e3,
                    "attention_growth_vs_first": times["attn"] / first["attn"],
                    "wall_ratio_vs_attention": times["wkv"] / times["attn"],
                    "flops_ratio_vs_attention": cost.flops / dense.flops,
                    "bytes_ratio_vs_attention": cost.bytes_accessed / dense.bytes_accessed})
        rows += [row, _row("attention (quadratic)", f"b1 t{t} h{heads} d{d}", dense, times["attn"])]
        print(f"bi_wkv t={t} ({t // seq_lens[0]}x tokens): wall {times['wkv'] * 1e3:.2f} ms "
              f"({row['growth_vs_first']:.1f}x), attention {times['attn'] * 1e3:.2f} ms "
              f"({row['attention_growth_vs_first']:.1f}x); bi_wkv / attention: wall "
              f"{row['wall_ratio_vs_attention']:.3f}, "
              f"modeled FLOPs {row['flops_ratio_vs_attention']:.4f}, bytes {row['bytes_ratio_vs_attention']:.3f}")
    return rows


def _bench_kv_quant(q, k, v, lengths, repeats: int) -> list[dict]:
    """4-bit group-wise (64 channels) quantized decode over the same cache, and the quantize op."""
    b, s, kh, d = k.shape
    h = q.shape[1]
    kt, vt = (qz.quantize(x, bits=4, group_size=64) for x in (k, v))
    f = jax.jit(lambda q, kt, vt, n: kv_quant.quantized_decode_attention(q, kt, vt, n, implementation="xla"))
    g = jax.jit(lambda x: kv_quant.quantize(x, bits=4, group_size=64, implementation="xla"))
    times = _timed({"decode": lambda: f(q, kt, vt, lengths), "quantize": lambda: g(k)}, repeats)
    dec = kv_quant.quant_decode_cost(batch=b, kv_len=s, num_heads=h, num_kv_heads=kh, head_dim=d, k_bits=4,
                                     v_bits=4, k_group=64, v_group=64)
    qc = kv_quant.quantize_cost(elements=b * s * kh * d, bits=4, group_size=64, in_itemsize=4)
    return [_row("kv_quant decode 4b", f"b{b} s{s} h{h}/{kh} d{d} g64", dec, times["decode"]),
            _row("kv_quant quantize 4b", f"[{b},{s},{kh},{d}] g64", qc, times["quantize"])]


def read_bandwidth(nbytes: int = 1 << 30, repeats: int = 5) -> float:
    """This machine's read bandwidth in bytes/s: the median time of summing a float32 array of `nbytes`."""
    x = jnp.ones((nbytes // 4,), jnp.float32) * 1.5  # materialized (not a broadcast constant)
    f = jax.jit(jnp.sum)
    return nbytes / _timed({"sum": lambda: f(x)}, repeats)["sum"]


def _decode_formulations(h: int, kh: int, d: int, layout: str) -> dict:
    """Dense decode attention, one query token over a float32 cache, written several ways.

    ``library``: ``primitives.attention.decode_attention`` on the cache in the library's default axis
    order ``layout`` (what the decoder LM's dense decode step runs); ``library_<other>``: the same on the
    other order. Alternatives (same maths, hand-written): ``einsum_<order>``: scores einsum, softmax,
    p.v einsum, on either order; ``einsum_kT``: the same with the keys stored transposed per head
    (``[b, k, d, s]``, values head-major), which makes the score product a plain ``[g, d] x [d, s]``
    matrix product; ``split16_bksd``: flash-decoding style, 16 key blocks merged by log-sum-exp. ``read``: ``sum(K) + sum(V)``, the cost of reading the cache once and doing nothing
    else (the roofline of this step, measured interleaved with the others).
    """
    scale = 1.0 / math.sqrt(d)
    other = "bskd" if layout == "bksd" else "bksd"

    def einsum(k_order, v_order):
        def f(q, k, v, n):
            qg = q.reshape(q.shape[0], kh, h // kh, d)
            sc = jnp.einsum(f"bkgd,{k_order}->bkgs", qg, k) * scale
            sc = jnp.where(jnp.arange(sc.shape[-1]) < n[:, None, None, None], sc, -jnp.inf)
            return jnp.einsum(f"bkgs,{v_order}->bkgd", jax.nn.softmax(sc, axis=-1), v).reshape(q.shape)
        return f

    def split16(q, k, v, n):  # head-major cache
        b, s = q.shape[0], k.shape[2]
        c = 16 if s % 16 == 0 else 1
        qg = q.reshape(b, kh, h // kh, d)
        sc = jnp.einsum("bkgd,bkcsd->bkcgs", qg, k.reshape(b, kh, c, -1, d)) * scale
        pos = jnp.arange(s).reshape(c, -1)[None, None, :, None, :]
        sc = jnp.where(pos < n[:, None, None, None, None], sc, -jnp.inf)
        m = jnp.max(sc, axis=-1, keepdims=True)
        p = jnp.exp(sc - m)
        o = jnp.einsum("bkcgs,bkcsd->bkcgd", p, v.reshape(b, kh, c, -1, d))
        a = jnp.exp(m[..., 0] - jnp.max(m[..., 0], axis=2, keepdims=True))
        return (jnp.sum(o * a[..., None], 2) / jnp.sum(jnp.sum(p, -1) * a, 2)[..., None]).reshape(q.shape)

    lib = lambda order: (lambda q, k, v, n: attn_ref.decode_attention(q, k, v, n, kv_layout=order))
    fns = {"library": (lib(layout), layout), f"library_{other}": (lib(other), other),
           "einsum_bksd": (einsum("bksd", "bksd"), "bksd"), "einsum_bskd": (einsum("bskd", "bskd"), "bskd"),
           "einsum_kT": (einsum("bkds", "bksd"), "kT"), "split16_bksd": (split16, "bksd"), "read": (lambda q, k, v, n: jnp.sum(k) + jnp.sum(v), layout)}
    if jax.default_backend() == "gpu":
        fns["kernel"] = (lambda q, k, v, n: decode_api.decode_attention(
            q, k, v, n, implementation="pallas_triton", kv_layout=layout), layout)
    return {name: (jax.jit(f), order) for name, (f, order) in fns.items()}


ALTERNATIVES = ("einsum_bksd", "einsum_bskd", "einsum_kT", "split16_bksd")


def bench_decode(token_counts=(2048, 8192, 16384, 32768, 65536), shapes=((32, 8, 128), (16, 2, 128)),
                 repeats: int = 5, read_bytes: int = 1 << 30) -> dict:
    """Dense decode roofline: per length and GQA shape, every formulation timed interleaved on the same inputs.

    Per row: milliseconds of each formulation, the K+V bytes one step reads, the library's achieved
    bandwidth, its fraction of the same-run read roofline (``read`` time / ``library`` time) and its
    ratio to the fastest hand-written alternative. Also the machine's read bandwidth from a 1 GiB
    reduction (``read_bandwidth``), for scale.
    """
    layout = attn_ref.default_kv_layout()
    out = {"layout": layout, "read_bandwidth_gb_s": read_bandwidth(read_bytes) / 1e9, "rows": []}
    for h, kh, d in shapes:
        fns = _decode_formulations(h, kh, d, layout)
        for s in token_counts:
            keys = jax.random.split(jax.random.key(s), 3)
            q = _normal(keys[0], (1, h, d))
            tm = {"k": _normal(keys[1], (1, s, kh, d)), "v": _normal(keys[2], (1, s, kh, d))}
            caches = {"bskd": (tm["k"], tm["v"]), "bksd": tuple(jnp.swapaxes(x, 1, 2) for x in (tm["k"], tm["v"]))}
            caches["kT"] = (jnp.swapaxes(caches["bksd"][0], 2, 3), caches["bksd"][1])
            n = jnp.full((1,), s - 1, jnp.int32)
            want = fns["einsum_bskd"][0](q, *caches["bskd"], n)
            err = {name: float(jnp.max(jnp.abs(f(q, *caches[order], n) - want)))
                   for name, (f, order) in fns.items() if name != "read"}
            times = _timed({name: (lambda f=f, kv=caches[order]: f(q, *kv, n))
                            for name, (f, order) in fns.items()}, repeats)
            nbytes = 2 * s * kh * d * 4
            best = min(ALTERNATIVES, key=times.get)
            out["rows"].append({
                "tokens": s, "heads": h, "kv_heads": kh, "head_dim": d, "mbytes": nbytes / 1e6,
                "ms": {k: v * 1e3 for k, v in times.items()}, "max_abs_err_vs_einsum_bskd": err,
                "library_gb_s": nbytes / times["library"] / 1e9, "read_gb_s": nbytes / times["read"] / 1e9,
                "fraction_of_read": times["read"] / times["library"], "fastest_alternative": best,
                "library_vs_fastest": times["library"] / times[best]})
            del caches, tm
    return out


def _print_decode(res: dict) -> None:
    print(f"\nDense decode roofline (float32 cache, b=1; library = primitives.attention.decode_attention on its "
          f"default '{res['layout']}' order; read = sum(K)+sum(V) in the same run; machine read bandwidth "
          f"{res['read_bandwidth_gb_s']:.1f} GB/s from a 1 GiB sum)")
    print(f"{'tokens':>7}{'h/k/d':>11}{'MB':>8}{'library':>9}{'other ord':>10}{'ein bksd':>9}{'ein bskd':>9}"
          f"{'ein kT':>8}{'split16':>9}{'read':>8}{'lib GB/s':>9}{'of read':>8}{'x fastest':>10}")
    for r in res["rows"]:
        m = r["ms"]
        other = next(v for k, v in m.items() if k.startswith("library_"))
        print(f"{r['tokens']:>7}{str(r['heads']) + '/' + str(r['kv_heads']) + '/' + str(r['head_dim']):>11}"
              f"{r['mbytes']:>8.0f}{m['library']:>9.2f}{other:>10.2f}{m['einsum_bksd']:>9.2f}{m['einsum_bskd']:>9.2f}"
              f"{m['einsum_kT']:>8.2f}{m['split16_bksd']:>9.2f}{m['read']:>8.2f}{r['library_gb_s']:>9.1f}{r['fraction_of_read']:>8.0%}"
              f"{r['library_vs_fastest']:>10.2f}")


def _ffd_problem(tokens: int, seed: int = 0):
    pr = ffd_ref.synthetic_problem(jax.random.key(seed), batch=1, tokens=tokens, kv_heads=8, group=4, head_dim=128,
                                   page_size=128, needles=4, needle_gap=10.0, sink_gap=12.0)
    cache = jax.jit(ffd_ref.build_cache, static_argnames=("page_size", "residual_dtype"))(
        pr.keys, pr.values, pr.lengths, page_size=128, residual_dtype=jnp.float8_e4m3fn)
    return pr, cache


def _dense_formulations(b: int, kh: int, h: int, d: int, tokens: int) -> dict:
    """Dense XLA decodes over a head-major cache (``[b, k, s, d]``), the contenders for "fastest dense".

    ``hm_f32``: one einsum for the scores, softmax, one einsum for p.v (float32 K/V as stored);
    ``hm_bf16``: the same over bfloat16 K/V with float32 accumulation (half the bytes, but the CPU
    converts bf16); ``hm_split16``: flash-decoding style, 16 key blocks with per-block max and sum
    merged by log-sum-exp (float32).
    """
    scale = 1.0 / math.sqrt(d)

    def hm(q, k, v):
        qg = q.reshape(b, kh, -1, d).astype(k.dtype)
        w = jax.nn.softmax(jnp.einsum("bkgd,bksd->bkgs", qg, k, preferred_element_type=jnp.float32) * scale, axis=-1)
        return jnp.einsum("bkgs,bksd->bkgd", w.astype(v.dtype), v, preferred_element_type=jnp.float32).reshape(b, h, d)

    def split(q, k, v, n=16 if tokens % 16 == 0 else 1):
        qg = q.reshape(b, kh, -1, d)
        ks, vs = k.reshape(b, kh, n, -1, d), v.reshape(b, kh, n, -1, d)
        sc = jnp.einsum("bkgd,bkcsd->bkcgs", qg, ks) * scale
        m = jnp.max(sc, axis=-1, keepdims=True)
        p = jnp.exp(sc - m)
        o = jnp.einsum("bkcgs,bkcsd->bkcgd", p, vs)
        mm = jnp.max(m[..., 0], axis=2, keepdims=True)
        a = jnp.exp(m[..., 0] - mm)
        return (jnp.sum(o * a[..., None], 2) / jnp.sum(jnp.sum(p, -1) * a, 2)[..., None]).reshape(b, h, d)

    return {"hm_f32": jax.jit(hm), "hm_bf16": jax.jit(hm), "hm_split16": jax.jit(split)}


def bench_ffd(token_counts, delta: float, repeats: int) -> list[dict]:
    """FFD's XLA fast path against every dense XLA decode formulation, same inputs, interleaved timings.

    The gather capacity is static (XLA shapes): the largest candidate count of the int8 scan per
    sequence (all KV heads together) for this input, so the fast path never falls back to the exact
    float scan; the row records it and the most pages a KV head keeps.
    """
    rows = []
    for tokens in token_counts:
        pr, cache = _ffd_problem(tokens)
        b, s, kh, d = pr.keys.shape
        h = pr.q.shape[1]
        keep, _ = jax.jit(ffd_ref.top_delta_keep, static_argnums=2)(pr.q, cache, delta)
        cand = jax.jit(ffd_ref.scan_candidates, static_argnums=2)(pr.q, cache, delta)[0]
        capacity = max(1, int(jnp.max(jnp.sum(cand, (1, 2)))))  # static gather budget: no fallback
        kept = float(ffd_ref.kept_fraction(keep, cache))
        k_hm, v_hm = pr.keys.transpose(0, 2, 1, 3), pr.values.transpose(0, 2, 1, 3)
        k16, v16 = k_hm.astype(jnp.bfloat16), v_hm.astype(jnp.bfloat16)
        dense_ref = jax.jit(attn_ref.decode_attention)
        forms = _dense_formulations(b, kh, h, d, s)
        fast = jax.jit(lambda q, c: ffd_ref.fast_ffd_decode(q, c, delta=delta, capacity=capacity))
        out = fast(pr.q, cache)
        want = jax.jit(ffd_ref.ffd_decode, static_argnames="delta")(pr.q, cache, delta=delta)
        exact = dense_ref(pr.q, pr.keys, pr.values, pr.lengths)
        err = float(jnp.max(jnp.linalg.norm(out.out - exact, axis=-1) / jnp.linalg.norm(exact, axis=-1)))
        dense_errs = {name: float(jnp.max(jnp.abs(f(pr.q, *kv) - exact))) for name, f, kv in
                      (("hm_f32", forms["hm_f32"], (k_hm, v_hm)), ("hm_bf16", forms["hm_bf16"], (k16, v16)),
                       ("hm_split16", forms["hm_split16"], (k_hm, v_hm)))}
        # the library's dense decode on the cache in its default order ("bksd" on CPU)
        lib_kv = (k_hm, v_hm) if attn_ref.default_kv_layout() == "bksd" else (pr.keys, pr.values)
        dense_lib = jax.jit(lambda q, k, v, n: attn_ref.decode_attention(q, k, v, n,
                                                                         kv_layout=attn_ref.default_kv_layout()))
        rounds = device_check.timed_rounds({"dense_ref": lambda: dense_lib(pr.q, *lib_kv, pr.lengths),
                                            "hm_f32": lambda: forms["hm_f32"](pr.q, k_hm, v_hm),
                                            "hm_bf16": lambda: forms["hm_bf16"](pr.q, k16, v16),
                                            "hm_split16": lambda: forms["hm_split16"](pr.q, k_hm, v_hm),
                                            "ffd_fast": lambda: fast(pr.q, cache)}, repeats)
        times = {k: float(np.median(v)) for k, v in rounds.items()}
        dense_names = [k for k in times if k != "ffd_fast"]
        fastest = min(dense_names, key=times.get)
        # The spread of the speedup over the rounds (each round times every contender once, in turn): the
        # fastest dense formulation's time over FFD's in the same round.
        per_round = np.asarray(rounds[fastest]) / np.asarray(rounds["ffd_fast"])
        model = ffd_ref.modeled_bytes(batch=b, tokens=s, kv_heads=kh, head_dim=d, page_size=128, kept=kept)
        cost = ffd_cost(batch=b, tokens=s, num_heads=h, num_kv_heads=kh, head_dim=d, page_size=128, kept=kept,
                        residual_itemsize=1, v_itemsize=2)
        dense_cost = decode_cost(batch=b, kv_len=s, num_heads=h, num_kv_heads=kh, head_dim=d, kv_itemsize=2)
        elems = b * s * kh * d
        # What the CPU path reads: int8 scan keys (1 B/element) + two fp32 numbers per page; the two
        # reference pages' packed codes and scales; for the gathered candidates: packed codes, fp32
        # scales, fp8 residual and f32 values; the exact current page (f32 K and V).
        cpu_read = elems + b * kh * (s // 128) * 8 + 2 * b * kh * (128 * d * 0.25 + 4 * d) \
            + capacity * b * (128 * d * (0.25 + 1 + 4) + 4 * d) + 2 * 4 * b * kh * 128 * d
        rows.append({
            "tokens": s, "delta": delta, "kept_fraction": kept, "capacity_pages_per_sequence": capacity,
            "max_kept_pages_per_kv_head": int(jnp.max(jnp.sum(keep, -1))),
            "same_selection_as_reference": bool(jnp.all(out.keep == want.keep)),
            "max_abs_diff_vs_reference": float(jnp.max(jnp.abs(out.out - want.out))),
            "overflow_pages": int(jnp.sum(out.overflow)), "max_rel_error": err,
            "dense_max_abs_err": dense_errs,
            "bytes_ratio_vs_dense_bf16": model["ratio"], "ffd_mbytes": cost.bytes_accessed / 1e6,
            "dense_mbytes": dense_cost.bytes_accessed / 1e6,
            "cpu_path_mbytes": cpu_read / 1e6, "dense_f32_mbytes": 2 * 4 * elems / 1e6,
            "extra_storage_mbytes_scan_keys": elems / 1e6,
            "ms": {k: v * 1e3 for k, v in times.items()},
            "fastest_dense": fastest,
            "speedup_vs_fastest_dense": times[fastest] / times["ffd_fast"],
            "speedup_vs_fastest_dense_per_round": {
                "min": float(per_round.min()), "p25": float(np.percentile(per_round, 25)),
                "median": float(np.median(per_round)), "p75": float(np.percentile(per_round, 75)),
                "max": float(per_round.max()), "rounds": int(per_round.size)},
            "speedup_vs_dense_ref": times["dense_ref"] / times["ffd_fast"],
            "speedup_vs_dense_head_major": times["hm_f32"] / times["ffd_fast"],
            "projected_us": {"ffd": {k: v * 1e6 for k, v in _projected(cost).items()},
                             "dense": {k: v * 1e6 for k, v in _projected(dense_cost).items()}},
        })
    return rows


def _print_ffd(rows: list[dict]) -> None:
    print(f"\nFFD XLA fast path (int8 scan, exact check of candidates, gathered attention) vs dense XLA decode "
          f"(b=1, 32 query / 8 KV heads, d=128, pages of 128, fp8 residual; delta={rows[0]['delta'] if rows else '-'} log2)")
    print(f"{'tokens':>8}{'kept':>7}{'cap':>5}{'same sel':>9}{'rel err':>9}{'ref ms':>8}{'hm f32':>8}{'hm bf16':>8}"
          f"{'split16':>8}{'FFD ms':>8}{'fastest dense':>15}{'x fastest dense':>17}{'x ref':>7}")
    for r in rows:
        m = r["ms"]
        print(f"{r['tokens']:>8}{r['kept_fraction']:>7.1%}{r['capacity_pages_per_sequence']:>5}{str(r['same_selection_as_reference']):>9}"
              f"{r['max_rel_error']:>9.2e}{m['dense_ref']:>8.2f}{m['hm_f32']:>8.2f}{m['hm_bf16']:>8.2f}"
              f"{m['hm_split16']:>8.2f}{m['ffd_fast']:>8.2f}{r['fastest_dense']:>15}"
              f"{r['speedup_vs_fastest_dense']:>16.2f}x{r['speedup_vs_dense_ref']:>6.2f}x")
    for r in rows:
        pr = r["speedup_vs_fastest_dense_per_round"]
        print(f"  {r['tokens']}: FFD x fastest dense per round ({pr['rounds']} rounds, each timing every contender "
              f"once): median {pr['median']:.2f}x, quartiles {pr['p25']:.2f}-{pr['p75']:.2f}x, "
              f"range {pr['min']:.2f}-{pr['max']:.2f}x")
    for r in rows:
        print(f"  {r['tokens']}: CPU path reads ~{r['cpu_path_mbytes']:.1f} MB (int8 scan keys {r['extra_storage_mbytes_scan_keys']:.1f} MB "
              f"stored beside the packed codes) vs {r['dense_f32_mbytes']:.1f} MB dense f32 K/V; "
              f"kernel bytes model vs dense bf16 {r['bytes_ratio_vs_dense_bf16']:.3f}; "
              f"max |FFD XLA - ffd_decode reference| {r['max_abs_diff_vs_reference']:.1e}")


def ffd_error_sweep(tokens: int = 16384, deltas=(3.0, 5.0, 7.0, 10.0, math.inf)) -> dict:
    """Kept fraction, error and dropped attention mass of FFD's selection as ``delta`` varies.

    For each ``delta`` (log2 units): the kept page fraction, the max over heads of the relative L2
    error of the FFD output against exact dense attention, and the max over heads of the exact
    attention mass (natural softmax of the exact logits) on dropped pages. It also splits the exact
    mass into the planted sink and needle tokens and the diffuse background (standard-normal keys,
    ``synthetic_problem``'s ``spread``): the background share bounds what a page selection that keeps
    only the peaked pages can reach.
    """
    pr, cache = _ffd_problem(tokens)
    b, s, kh, d = pr.keys.shape
    g = pr.q.shape[1] // kh
    exact = jax.jit(attn_ref.decode_attention)(pr.q, pr.keys, pr.values, pr.lengths)
    logits = jnp.einsum("bkgd,bskd->bkgs", pr.q.reshape(b, kh, g, d), pr.keys) / math.sqrt(d)
    w = jax.nn.softmax(logits, axis=-1)  # [b, k, g, s]
    bs = cache.page_size
    page_mass = w[..., : cache.num_pages * bs].reshape(b, kh, g, cache.num_pages, bs).sum(-1)  # [b, k, g, p]
    # Planted tokens: the sink (first 4) and one needle per chosen page: the top-4 logit of each page.
    planted = jnp.zeros((b, kh, g, s), bool).at[..., :4].set(True)
    top_tok = jnp.argsort(logits, axis=-1)[..., -8:]  # sink + needles are the 8 largest logits here
    planted = planted | (jnp.zeros_like(planted).at[jnp.arange(b)[:, None, None, None], jnp.arange(kh)[None, :, None, None],
                                                    jnp.arange(g)[None, None, :, None], top_tok].set(True))
    background = float(jnp.max(jnp.sum(jnp.where(planted, 0.0, w), -1)))
    ffd_fn = jax.jit(ffd_ref.ffd_decode, static_argnames="delta")
    rows = []
    for delta in deltas:
        o = ffd_fn(pr.q, cache, delta=delta)
        err = float(jnp.max(jnp.linalg.norm(o.out - exact, axis=-1) / jnp.linalg.norm(exact, axis=-1)))
        dropped = jnp.sum(jnp.where(o.keep[:, :, None, :] | ~cache.valid_pages[:, None, None, :], 0.0, page_mass), -1)
        rows.append({"delta": delta, "kept_fraction": float(ffd_ref.kept_fraction(o.keep, cache)),
                     "max_rel_error": err, "max_dropped_mass": float(jnp.max(dropped))})
    return {"tokens": tokens, "rows": rows, "max_background_mass": background,
            "synthetic": {"spread": 1.0, "sink_gap": 12.0, "needle_gap": 10.0, "needles": 4}}


def _print_ffd_sweep(sweep: dict) -> None:
    print(f"\nFFD error vs kept fraction at {sweep['tokens']} tokens (reference selection; exact dense as truth)")
    print(f"{'delta':>7}{'kept':>8}{'max rel L2 err':>16}{'max dropped mass':>18}")
    for r in sweep["rows"]:
        print(f"{r['delta']:>7}{r['kept_fraction']:>8.1%}{r['max_rel_error']:>16.2e}{r['max_dropped_mass']:>18.2e}")
    print(f"  diffuse background (N(0, spread^2) logits, spread=1) holds up to {sweep['max_background_mass']:.1%} of a "
          f"head's attention mass, spread over every page: a selection reaches 1e-2 only once it keeps most of it.")


def _run_ops(args) -> dict:
    rows = bench_ops(args.repeats)
    _print_rows(rows)
    _print_vegas(rows)
    return {"ops": rows}


def _run_decode(args) -> dict:
    res = bench_decode([int(t) for t in args.decode_tokens.split(",")], repeats=args.repeats)
    _print_decode(res)
    return {"decode": res}


def _run_ffd(args) -> dict:
    rows = bench_ffd([int(t) for t in args.tokens.split(",")], args.delta, args.repeats)
    _print_ffd(rows)
    sweep = ffd_error_sweep(int(args.tokens.split(",")[0]))
    _print_ffd_sweep(sweep)
    return {"ffd": rows, "ffd_error_sweep": sweep}


# Sections of this command: name -> run(args) returning the JSON entries it adds. `python -m experiments
# bench` runs these plus the model-level ones (decoder LM generate throughput, MoE FFN).
SECTIONS = {"ops": _run_ops, "decode": _run_decode, "ffd": _run_ffd}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tokens", default="16384,65536", help="comma list of FFD cache lengths (CPU)")
    parser.add_argument("--decode-tokens", default="2048,8192,16384,32768,65536",
                        help="comma list of dense decode cache lengths")
    parser.add_argument("--delta", type=float, default=5.0, help="FFD margin, log2 units")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=None, help="write the numbers as JSON here")


def main(argv=None, *, sections: dict | None = None, extra_arguments=None, description: str | None = None) -> dict:
    """Runs the selected sections (all by default), prints their tables, optionally merges them into --out."""
    sections = SECTIONS if sections is None else sections
    parser = argparse.ArgumentParser(description=description or __doc__.split("\n")[0])
    add_arguments(parser)
    if extra_arguments is not None:
        extra_arguments(parser)
    parser.add_argument("--only", default=None,
                        help=f"comma list of sections to run, of {sorted(sections)} (with --out, merged into an "
                             "existing JSON file)")
    args = parser.parse_args(argv)
    only = None if args.only is None else args.only.split(",")
    unknown = sorted(set(only or ()) - set(sections))
    if unknown:
        parser.error(f"--only: unknown sections {unknown}; choose from {sorted(sections)}")
    backend = jax.default_backend()
    print(f"backend {backend} ({jax.devices()[0].device_kind}), jax {jax.__version__}, "
          f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs")
    today = time.strftime("%Y-%m-%d")
    result = {"backend": backend, "device": jax.devices()[0].device_kind, "jax": jax.__version__,
              "cpus": os.cpu_count(), "date": today}
    if only and args.out and pathlib.Path(args.out).exists():
        result = {**json.loads(pathlib.Path(args.out).read_text()), **result}
    # "date" is the last write; a merged file's sections were measured on different days, so each
    # result key also records its own under "dates".
    dates = dict(result.get("dates", {}))
    for name, run in sections.items():
        if only is None or name in only:
            rows = run(args)
            result.update(rows)
            dates.update(dict.fromkeys(rows, today))
    result["dates"] = dates
    if backend == "gpu":  # the compiled kernels: the device check (`python -m pallas_kernels.device_check` alone)
        result["gpu"] = device_check.run(repeats=args.repeats)
    if args.out:
        path = pathlib.Path(args.out)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=1))
        print(f"wrote {path}")
    return result


if __name__ == "__main__":
    main()
