"""The device check: one short run on a GPU that compiles every Pallas kernel, checks it, and times it.

    python -m pallas_kernels.device_check                      # on the GPU machine (about 5 minutes)
    python -m pallas_kernels.device_check --dry-run            # anywhere: tiny shapes, interpreted
    python -m pallas_kernels.device_check --lower-only         # anywhere: every full-size program lowers

GPU time is lent rarely and briefly, so everything the kernels still owe a GPU runs from this one
command, in order of importance, each step guarded so that one failure (a Triton compile error, a
numerical mismatch) is recorded and the run goes on:

1. **The card's ceilings**, measured in the same run: the copy bandwidth (read and write a 2 GiB
   array, ``x + 1``) and the read bandwidth (sum of the same array).
2. **Every kernel entry point** (``CASES``, one per public kernel call and gradient) compiled for
   Triton (``implementation="pallas_triton"``, ``interpret=False``) at production-like shapes, checked
   against the package's XLA reference on the same inputs (error relative to the reference's largest
   magnitude, per output), and timed against it.
3. **FFD against our dense decode kernel** at 32k to 256k tokens (``primitives.ffd.synthetic_problem``
   heads): the kept page fraction, the same selection as the reference, and the speedup.
4. **The dense decode roofline** (issue rows of ``python -m pallas_kernels.bench --only decode`` on the
   GPU): the decode kernel and XLA's decode per cache length, GQA shape and cache axis order, with the
   modeled bytes, achieved bandwidth and fraction of the copy ceiling: which axis order is faster on
   the card (``primitives.attention.default_kv_layout`` still assumes "bskd" there).

A time budget (``--budget-s``) skips what is left, saying so, rather than overrun the lease. The JSON
(``--out``, default ``results/bench/gpu_<card>.json``) records the card's name and every number; the
same tables in Markdown (:func:`report`, with the axis-order verdict of :func:`layout_verdict`) are
written beside it (``.md``), and ``--report JSON`` prints them again for an earlier run.
``--dry-run`` runs the same code at tiny shapes with the kernels interpreted (on CPU, seconds), which
is what the test suite does, so the script itself is known to work before a GPU is spent on it;
``--lower-only`` (also tested) lowers every program of the GPU run at its full shapes for Triton.
Nothing is asserted here: a failed check is reported as such for the reader to act on.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import pathlib
import re
import time
import traceback
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels.decode_attention import decode_attention, decode_cost
from pallas_kernels.ffd_decode import ffd_decode
from pallas_kernels.flash_attention import flash_attention
from pallas_kernels.grouped_matmul import grouped_matmul
from pallas_kernels.kv_quant import dequantize, quantize, quantized_decode_attention
from pallas_kernels.qvg import kmeans_assign, qvg_attention
from pallas_kernels.vegas import sparse_decode_attention, verify_attention
from pallas_kernels.wkv import bi_wkv
from primitives import attention as attn_ref
from primitives import ffd as ffd_ref
from primitives import residual_quantization as rq

BF16 = jnp.bfloat16
TOLERANCE = {jnp.dtype(BF16): 2e-2, jnp.dtype(jnp.float32): 1e-4}  # error / max |reference|


@dataclasses.dataclass(frozen=True)
class Size:
    """The shapes one run uses: ``FULL`` on the GPU, ``TINY`` for the dry run."""

    batch: int
    heads: int
    kv_heads: int
    head_dim: int
    tokens: int  # cache length of the decode-type kernels
    seq: int  # sequence length of flash attention and WKV
    gmm: tuple  # (m, k, n, groups)
    assign: tuple  # (groups, points, centroids, dim) of the k-means assignment
    decode_tokens: tuple  # the roofline rows
    ffd_tokens: tuple  # FFD against dense decode
    ceiling_bytes: int


FULL = Size(batch=8, heads=32, kv_heads=8, head_dim=128, tokens=32768, seq=4096, gmm=(8192, 2048, 5632, 8),
            assign=(64, 8192, 256, 128), decode_tokens=(2048, 8192, 32768, 65536),
            ffd_tokens=(32768, 65536, 131072, 262144), ceiling_bytes=2 << 30)
TINY = Size(batch=2, heads=8, kv_heads=2, head_dim=128, tokens=512, seq=64, gmm=(96, 64, 64, 3),
            assign=(2, 64, 8, 32), decode_tokens=(512,), ffd_tokens=(1024,), ceiling_bytes=8 << 20)


@dataclasses.dataclass(frozen=True)
class Case:
    """One kernel entry point: ``build(size) -> (fn, args)`` with ``fn(kw, *args)``, where ``kw`` holds the
    ``implementation`` (and ``interpret``) keywords of the kernel call: the kernel and its XLA reference
    run the same ``fn`` on the same ``args``."""

    kernel: str  # the pallas_kernels sub-package
    name: str
    build: Callable


CASES: list[Case] = []


def _case(kernel: str, name: str):
    def register(build):
        CASES.append(Case(kernel, name, build))
        return build

    return register


def _normal(key: int, shape, dtype=BF16, scale: float = 1.0):
    return (scale * jax.random.normal(jax.random.key(key), shape, jnp.float32)).astype(dtype)


def _lengths(z: Size) -> np.ndarray:
    """Per-sequence cache lengths [b] int32: full, and others ending inside a block (numpy: also a constant
    under `jax.eval_shape`)."""
    return np.asarray([z.tokens - (i * 37) % (z.tokens // 2) for i in range(z.batch)], np.int32)


def _kw(impl: str, interpret: bool) -> dict:
    return {"implementation": impl} if impl == "xla" else {"implementation": impl, "interpret": interpret}


@_case("decode_attention", "decode")
def _decode(z: Size):
    q = _normal(0, (z.batch, z.heads, z.head_dim))
    k, v = (_normal(i, (z.batch, z.tokens, z.kv_heads, z.head_dim)) for i in (1, 2))
    f = lambda kw, q, k, v, n: decode_attention(q, k, v, n, **kw)
    return f, (q, k, v, jnp.asarray(_lengths(z)))


@_case("ffd_decode", "ffd_decode")
def _ffd(z: Size):
    k, v = (_normal(i, (z.batch, z.tokens, z.kv_heads, z.head_dim)) for i in (3, 4))
    cache = jax.jit(ffd_ref.build_cache, static_argnames=("page_size", "residual_dtype"))(
        k, v, jnp.asarray(_lengths(z)), page_size=128, residual_dtype=BF16)
    q = _normal(5, (z.batch, z.heads, z.head_dim))
    return (lambda kw, q, c: ffd_decode(q, c, delta=5.0, **kw)[:3]), (q, cache)  # out, lse, keep


def _flash_args(z: Size):
    return (_normal(6, (1, z.seq, z.heads, z.head_dim)), _normal(7, (1, z.seq, z.kv_heads, z.head_dim)),
            _normal(8, (1, z.seq, z.kv_heads, z.head_dim)))


@_case("flash_attention", "forward_causal")
def _flash(z: Size):
    return (lambda kw, q, k, v: flash_attention(q, k, v, causal=True, **kw)), _flash_args(z)


@_case("flash_attention", "forward_backward_causal")
def _flash_grad(z: Size):
    def f(kw, q, k, v):
        loss = lambda *a: flash_attention(*a, causal=True, **kw).astype(jnp.float32).sum()
        return jax.value_and_grad(loss, (0, 1, 2))(q, k, v)

    return f, _flash_args(z)


def _gmm_args(z: Size):
    m, k, n, e = z.gmm
    total = m - m // 16  # the last rows lie past the groups' total
    cuts = np.sort(np.random.default_rng(0).choice(np.arange(1, total), e - 1, replace=False))
    sizes = np.diff(np.concatenate([[0], cuts, [total]]))  # uneven groups
    return _normal(9, (m, k), scale=0.1), _normal(10, (e, k, n), scale=0.1), jnp.asarray(sizes, jnp.int32)


@_case("grouped_matmul", "forward")
def _gmm(z: Size):
    return (lambda kw, x, w, g: grouped_matmul(x, w, g, **kw)), _gmm_args(z)


@_case("grouped_matmul", "forward_backward")
def _gmm_grad(z: Size):
    def f(kw, x, w, g):  # d_lhs (gmm on rhs^T) and d_rhs (tgmm)
        loss = lambda a, b: grouped_matmul(a, b, g, **kw).astype(jnp.float32).sum()
        return jax.value_and_grad(loss, (0, 1))(x, w)

    return f, _gmm_args(z)


def _kv_x(z: Size, key: int = 11):
    return _normal(key, (z.batch, z.tokens, z.kv_heads, z.head_dim))


_K_FORMAT = {"bits": 4, "group_size": 64}
_V_FORMAT = {"bits": 2, "group_size": 128, "scheme": "asymmetric", "scale_dtype": BF16}


@_case("kv_quant", "quantize")
def _kv_quantize(z: Size):
    return (lambda kw, x: quantize(x, **_K_FORMAT, **kw)), (_kv_x(z),)


@_case("kv_quant", "dequantize")
def _kv_dequantize(z: Size):
    vt = quantize(_kv_x(z), **_V_FORMAT, implementation="xla")
    return (lambda kw, t: dequantize(t, **kw)), (vt,)


@_case("kv_quant", "quantized_decode")
def _kv_decode(z: Size):
    kt = quantize(_kv_x(z, 12), **_K_FORMAT, implementation="xla")
    vt = quantize(_kv_x(z, 13), **_V_FORMAT, implementation="xla")
    f = lambda kw, q, k, v, n: quantized_decode_attention(q, k, v, n, **kw)
    return f, (_normal(14, (z.batch, z.heads, z.head_dim)), kt, vt, jnp.asarray(_lengths(z)))


@_case("qvg", "kmeans_assign")
def _qvg_assign(z: Size):
    g, s, c, d = z.assign
    x, cent = _normal(15, (g, s, d), jnp.float32), _normal(16, (g, c, d), jnp.float32)
    return (lambda kw, x, c: kmeans_assign(x, c, **kw)), (x, cent)


@_case("qvg", "qvg_attention")
def _qvg_attention(z: Size):
    span = z.tokens // 4
    x = _normal(17, (z.batch, z.kv_heads, span, z.head_dim))
    quant = jax.jit(rq.qvg_quantize, static_argnames="config")
    # QVG's format for K and V: QVG-Pro's 2-bit 16-channel groups give 4-channel sub-slices Triton cannot
    # load (the cross-lowering contract says the same).
    kt = quant(x, jax.random.key(0), config=rq.QVG)
    vt = quant(_normal(18, x.shape), jax.random.key(1), config=rq.QVG)
    f = lambda kw, q, k, v, n: qvg_attention(q, k, v, n, **kw)
    q = _normal(19, (z.batch, 64 if z is FULL else 4, z.heads, z.head_dim))
    return f, (q, kt, vt, jnp.asarray(np.minimum(_lengths(z), span)))


def _vegas_kv(z: Size):
    return (_normal(20, (z.batch, z.tokens, z.kv_heads, z.head_dim)),
            _normal(21, (z.batch, z.tokens, z.kv_heads, z.head_dim)))


@_case("vegas", "verify")
def _vegas_verify(z: Size):
    t = 5
    q = _normal(22, (z.batch, t, z.heads, z.head_dim))
    pos = jnp.asarray(_lengths(z)[:, None] - t + np.arange(t)[None], jnp.int32)
    f = lambda kw, q, k, v, p: verify_attention(q, k, v, p, rows=(0, t - 1), **kw)
    return f, (q, *_vegas_kv(z), pos)


@_case("vegas", "sparse_decode")
def _vegas_sparse(z: Size):
    rng = np.random.default_rng(1)
    n_idx = max(z.tokens // 16, 8)
    n = _lengths(z)
    idx = np.stack([rng.permutation(int(m))[:n_idx] for m in np.asarray(n)]).astype(np.int32)
    valid = rng.random(idx.shape) > 0.2
    start = np.maximum(n - 64, 0)
    f = lambda kw, q, k, v, i, ok, rs, ln: sparse_decode_attention(q, k, v, i, ok, rs, ln, max_recent=64,
                                                                   return_lse=True, **kw)
    q = _normal(23, (z.batch, z.heads, z.head_dim))
    return f, (q, *_vegas_kv(z), jnp.asarray(idx), jnp.asarray(valid), jnp.asarray(start), jnp.asarray(n))


@_case("wkv", "bi_wkv_forward_backward")
def _wkv(z: Size):
    c = 768 if z is FULL else 32

    def f(kw, w, u, k, v, probe):  # every gradient (w, u, k, v): the backward kernel's four outputs
        loss = lambda *a: (bi_wkv(*a, **kw).astype(jnp.float32) * probe).sum()
        return jax.value_and_grad(loss, (0, 1, 2, 3))(w, u, k, v)

    return f, (_normal(24, (c,), jnp.float32), _normal(25, (c,), jnp.float32),
               _normal(26, (z.batch, z.seq, c), scale=2.0), _normal(27, (z.batch, z.seq, c)),
               _normal(28, (z.batch, z.seq, c), jnp.float32))


# --------------------------------------------------------------------------------------------------------
# Measuring


def timed_rounds(fns: dict[str, Callable], repeats: int) -> dict[str, list[float]]:
    """Seconds of each call per zero-argument callable: ``repeats`` rounds, each calling every callable
    once in turn (so round ``i`` of two callables ran under the same machine conditions), after one
    warm-up call each."""
    for f in fns.values():
        jax.block_until_ready(f())
    times = {k: [] for k in fns}
    for _ in range(repeats):
        for k, f in fns.items():
            t = time.perf_counter()
            jax.block_until_ready(f())
            times[k].append(time.perf_counter() - t)
    return times


def timed(fns: dict[str, Callable], repeats: int) -> dict[str, float]:
    """Median seconds per zero-argument callable, interleaved round-robin after one warm-up each."""
    return {k: float(np.median(v)) for k, v in timed_rounds(fns, repeats).items()}


def ceilings(nbytes: int, repeats: int) -> dict:
    """The device's copy bandwidth (``x + 1``: read and write ``nbytes``) and read bandwidth (a sum), bytes/s."""
    x = jnp.ones((nbytes // 4,), jnp.float32) * 1.5
    copy, total = jax.jit(lambda a: a + 1.0), jax.jit(jnp.sum)
    t = timed({"copy": lambda: copy(x), "read": lambda: total(x)}, repeats)
    return {"copy_bytes_per_s": 2 * nbytes / t["copy"], "read_bytes_per_s": nbytes / t["read"], "bytes": nbytes}


def compare(got, want) -> dict:
    """Largest error of each output leaf relative to the reference leaf's largest magnitude.

    Float leaves: ``max |got - want| / max |want|`` over entries finite in both (non-finite entries must
    agree). Integer and boolean leaves: the fraction of entries that differ.
    """
    def host(x):  # floats as float32 (numpy has no bfloat16 arithmetic of its own)
        return np.asarray(x.astype(jnp.float32) if jnp.issubdtype(x.dtype, jnp.floating) else x)

    errs, mismatched_nonfinite = [], 0
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        g, w = host(g), host(w)
        if g.shape != w.shape:
            raise ValueError(f"output shapes differ: kernel {g.shape}, reference {w.shape}")
        if np.issubdtype(w.dtype, np.floating):
            ok = np.isfinite(g) & np.isfinite(w)
            mismatched_nonfinite += int(np.sum(np.isfinite(g) != np.isfinite(w)))
            scale = float(np.max(np.abs(w[ok]), initial=0.0)) or 1.0
            errs.append(float(np.max(np.abs(g[ok] - w[ok]), initial=0.0)) / scale)
        else:
            errs.append(float(np.mean(g != w)) if g.size else 0.0)
    return {"relative_errors": errs, "max_relative_error": max(errs, default=0.0),
            "nonfinite_mismatches": mismatched_nonfinite}


def _tolerance(args) -> float:
    floats = [x.dtype for x in jax.tree.leaves(args) if jnp.issubdtype(x.dtype, jnp.floating)]
    return max(TOLERANCE.get(jnp.dtype(d), 2e-2) for d in floats) if floats else 0.0


def check_case(case: Case, z: Size, impl: str, interpret: bool, repeats: int) -> dict:
    """Compile and run one case and its XLA reference on the same inputs: error, pass/fail, times."""
    row = {"case": f"{case.kernel}.{case.name}"}
    try:
        fn, args = case.build(z)
        kernel = jax.jit(functools.partial(fn, _kw(impl, interpret)))
        reference = jax.jit(functools.partial(fn, _kw("xla", False)))
        t0 = time.perf_counter()
        got = jax.block_until_ready(kernel(*args))
        row["compile_and_first_run_s"] = time.perf_counter() - t0
        row.update(compare(got, reference(*args)))
        row["tolerance"] = _tolerance(args)
        row["passed"] = row["max_relative_error"] <= row["tolerance"] and row["nonfinite_mismatches"] == 0
        t = timed({"kernel": lambda: kernel(*args), "xla": lambda: reference(*args)}, repeats)
        row.update(kernel_ms=t["kernel"] * 1e3, xla_ms=t["xla"] * 1e3, speedup_vs_xla=t["xla"] / t["kernel"])
    except Exception as e:  # a compile or runtime failure is a result, not the end of the run
        row.update(passed=False, error=f"{type(e).__name__}: {e}"[:2000], traceback=traceback.format_exc()[-4000:])
    return row


def ffd_rows(z: Size, impl: str, interpret: bool, repeats: int, delta: float = 5.0) -> list[dict]:
    """FFD's kernel against our dense decode kernel on synthetic sink-and-needle heads, per cache length
    (one sequence, the size's heads: 32 query over 8 KV heads of 128 at full size)."""
    rows = []
    for tokens in z.ffd_tokens:
        pr = ffd_ref.synthetic_problem(jax.random.key(0), batch=1, tokens=tokens, kv_heads=z.kv_heads,
                                       group=z.heads // z.kv_heads, head_dim=z.head_dim, page_size=128, needles=4,
                                       needle_gap=10.0, sink_gap=12.0)
        q, k, v = (x.astype(BF16) for x in (pr.q, pr.keys, pr.values))
        cache = jax.jit(ffd_ref.build_cache, static_argnames=("page_size", "residual_dtype"))(
            k, v, pr.lengths, page_size=128, residual_dtype=BF16)
        dense = jax.jit(lambda q, k, v, n: decode_attention(q, k, v, n, **_kw(impl, interpret)))
        ffd = jax.jit(lambda q, c: ffd_decode(q, c, delta=delta, **_kw(impl, interpret)))
        got, want = ffd(q, cache), jax.jit(lambda q, c: ffd_ref.ffd_decode(q, c, delta=delta))(q, cache)
        exact = dense(q, k, v, pr.lengths).astype(jnp.float32)
        t = timed({"dense_kernel": lambda: dense(q, k, v, pr.lengths), "ffd_kernel": lambda: ffd(q, cache)}, repeats)
        rel = jnp.linalg.norm(got.out.astype(jnp.float32) - exact, axis=-1) / jnp.linalg.norm(exact, axis=-1)
        rows.append({"tokens": tokens, "kept_fraction": float(ffd_ref.kept_fraction(got.keep, cache)),
                     "same_selection_as_reference": bool(jnp.all(got.keep == want.keep)),
                     "max_abs_diff_vs_reference": float(jnp.max(jnp.abs(got.out.astype(jnp.float32)
                                                                        - want.out.astype(jnp.float32)))),
                     "max_rel_error_vs_dense": float(jnp.max(rel)),
                     "dense_kernel_ms": t["dense_kernel"] * 1e3, "ffd_kernel_ms": t["ffd_kernel"] * 1e3,
                     "speedup_vs_dense_kernel": t["dense_kernel"] / t["ffd_kernel"]})
    return rows


def decode_rows(z: Size, impl: str, interpret: bool, repeats: int, copy_bytes_per_s: float,
                shapes=((32, 8, 128), (16, 2, 128))) -> list[dict]:
    """Dense decode (batch 1, bf16 cache): the kernel and XLA's decode, per length, GQA shape and axis order."""
    rows = []
    for h, kh, d in shapes:
        for tokens in z.decode_tokens:
            q = _normal(30, (1, h, d))
            k, v = _normal(31, (1, tokens, kh, d)), _normal(32, (1, tokens, kh, d))
            n = jnp.full((1,), tokens, jnp.int32)
            nbytes = decode_cost(batch=1, kv_len=tokens, num_heads=h, num_kv_heads=kh, head_dim=d,
                                 kv_itemsize=2).bytes_accessed
            for layout in ("bskd", "bksd"):
                kk, vv = (k, v) if layout == "bskd" else (jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2))
                kernel = jax.jit(lambda q, k, v, n, lay=layout: decode_attention(q, k, v, n, kv_layout=lay,
                                                                                 **_kw(impl, interpret)))
                xla = jax.jit(lambda q, k, v, n, lay=layout: attn_ref.decode_attention(q, k, v, n, kv_layout=lay))
                err = compare(kernel(q, kk, vv, n), xla(q, kk, vv, n))["max_relative_error"]
                t = timed({"kernel": lambda: kernel(q, kk, vv, n), "xla": lambda: xla(q, kk, vv, n)}, repeats)
                rows.append({"tokens": tokens, "heads": h, "kv_heads": kh, "head_dim": d, "layout": layout,
                             "mbytes": nbytes / 1e6, "kernel_ms": t["kernel"] * 1e3, "xla_ms": t["xla"] * 1e3,
                             "kernel_vs_xla_relative_error": err,
                             "kernel_tb_s": nbytes / t["kernel"] / 1e12,
                             "fraction_of_copy_ceiling": nbytes / t["kernel"] / copy_bytes_per_s})
    return rows


def lower_full(platform: str = "cuda") -> dict[str, str]:
    """Lowers every program the GPU run compiles, at its full shapes, for `platform`, on any machine.

    The cases (``FULL``), the FFD kernel at the longest FFD length and the decode kernel at the longest
    roofline length in both axis orders. Arguments are abstract (`jax.eval_shape`), so nothing is
    allocated. Catches Triton's rules (power-of-two blocks, no scratch) at production shapes before a
    GPU is spent. Returns ``{program: "ok" or the error}``.
    """
    from pallas_kernels import _backend

    kw = _kw("pallas_triton", False)

    def case_program(case: Case):
        built = {}

        def args():  # concrete inside eval_shape: nothing is allocated
            built["fn"], a = case.build(FULL)
            return a

        abstract = jax.eval_shape(args)
        return functools.partial(built["fn"], kw), abstract

    sd = jax.ShapeDtypeStruct
    programs = {f"{c.kernel}.{c.name}": functools.partial(case_program, c) for c in CASES}
    s = max(FULL.ffd_tokens)
    programs[f"ffd_rows.ffd_decode_{s}"] = lambda: (
        lambda q, c: ffd_decode(q, c, delta=5.0, **kw),
        (sd((1, 32, 128), BF16), jax.eval_shape(
            lambda k, v, n: ffd_ref.build_cache(k, v, n, page_size=128, residual_dtype=BF16),
            sd((1, s, 8, 128), BF16), sd((1, s, 8, 128), BF16), sd((1,), jnp.int32))))
    s = max(FULL.decode_tokens)
    for layout, kv in (("bskd", sd((1, s, 8, 128), BF16)), ("bksd", sd((1, 8, s, 128), BF16))):
        programs[f"decode_rows.decode_{s}_{layout}"] = lambda lay=layout, kv=kv: (
            lambda q, k, v, n: decode_attention(q, k, v, n, kv_layout=lay, **kw),
            (sd((1, 32, 128), BF16), kv, kv, sd((1,), jnp.int32)))
    out = {}
    for name, make in programs.items():
        try:
            fn, args = make()
            with _backend.compiling_for("gpu"):
                text = _backend.lower_for(fn, *args, platform=platform)
            out[name] = "ok" if "triton" in text.lower() else "lowered without a Triton call"
        except Exception as e:
            out[name] = f"{type(e).__name__}: {e}"[:2000]
    return out


def run(*, dry_run: bool = False, repeats: int | None = None, budget_s: float = 420.0,
        only: tuple[str, ...] | None = None, log=print) -> dict:
    """Runs the check (see the module docstring) and returns its record.

    Args:
      dry_run: tiny shapes and interpreted kernels (``TINY``), for testing this script anywhere.
      repeats: timed calls per contender (default 5, 1 in a dry run).
      budget_s: wall-clock budget; steps not started by then are listed under ``skipped``.
      only: case ids (``kernel.name``) to run; default all.
      log: progress printer.
    """
    z, interpret = (TINY, True) if dry_run else (FULL, False)
    repeats = (1 if dry_run else 5) if repeats is None else repeats
    impl = "pallas_triton"
    start = time.monotonic()
    over = lambda: time.monotonic() - start > budget_s
    device = jax.devices()[0]
    rec = {"device": device.device_kind, "backend": jax.default_backend(), "jax": jax.__version__,
           "date": time.strftime("%Y-%m-%d"), "dry_run": dry_run, "implementation": impl, "interpret": interpret,
           "repeats": repeats, "size": dataclasses.asdict(z), "skipped": []}
    log(f"device check on {rec['device']} ({rec['backend']}), jax {rec['jax']}, "
        f"{'dry run: tiny shapes, interpreted' if dry_run else 'compiled for Triton'}")
    rec["ceilings"] = ceilings(z.ceiling_bytes, repeats)
    log(f"copy {rec['ceilings']['copy_bytes_per_s'] / 1e12:.3f} TB/s, read "
        f"{rec['ceilings']['read_bytes_per_s'] / 1e12:.3f} TB/s")
    rec["kernels"] = []
    for case in CASES:
        cid = f"{case.kernel}.{case.name}"
        if only is not None and cid not in only:
            continue
        if over():
            rec["skipped"].append(cid)
            continue
        row = check_case(case, z, impl, interpret, repeats)
        rec["kernels"].append(row)
        status = "ok  " if row["passed"] else "FAIL"
        detail = row.get("error") or (f"err {row['max_relative_error']:.2e} (tol {row['tolerance']:.0e}), kernel "
                                      f"{row['kernel_ms']:.3f} ms, xla {row['xla_ms']:.3f} ms")
        log(f"  {status} {cid:<42} {detail}")
    rec["step_errors"] = {}
    shapes = ((32, 8, 128), (16, 2, 128)) if not dry_run else ((z.heads, z.kv_heads, z.head_dim),)
    steps = (("ffd", lambda: ffd_rows(z, impl, interpret, repeats), _FFD_LINE),
             ("decode", lambda: decode_rows(z, impl, interpret, repeats, rec["ceilings"]["copy_bytes_per_s"],
                                            shapes), _DECODE_LINE))
    for name, step, line in steps:
        if only is not None and name not in only:
            continue
        if over():
            rec["skipped"].append(name)
            continue
        try:
            rec[name] = step()
            log(f"{name}:")
            for row in rec[name]:
                log("  " + line.format(**row))
        except Exception as e:
            rec["step_errors"][name] = f"{type(e).__name__}: {e}"[:2000] + "\n" + traceback.format_exc()[-4000:]
            log(f"{name}: FAILED {rec['step_errors'][name]}")
    rec["seconds"] = time.monotonic() - start
    rec["all_passed"] = (all(r["passed"] for r in rec["kernels"]) and not rec["skipped"]
                         and not rec["step_errors"])
    log(f"done in {rec['seconds']:.0f} s; every kernel and step passed: {rec['all_passed']}"
        + (f"; skipped (time budget): {rec['skipped']}" if rec["skipped"] else ""))
    return rec


_FFD_LINE = ("{tokens:>7} tokens: kept {kept_fraction:.3f}, same selection {same_selection_as_reference}, "
             "err vs dense {max_rel_error_vs_dense:.2e}, dense kernel {dense_kernel_ms:.3f} ms, "
             "FFD kernel {ffd_kernel_ms:.3f} ms, speedup {speedup_vs_dense_kernel:.2f}x")
_DECODE_LINE = ("{tokens:>7} tokens {heads}/{kv_heads}/{head_dim} {layout}: kernel {kernel_ms:.3f} ms "
                "({kernel_tb_s:.3f} TB/s, {fraction_of_copy_ceiling:.0%} of copy), xla {xla_ms:.3f} ms, "
                "err {kernel_vs_xla_relative_error:.1e}")


def _md_table(header: list[str], rows: list[list]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + \
        ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]


def layout_verdict(decode: list[dict]) -> dict:
    """Which cache axis order the decode kernel ran faster in, per (GQA shape, length) and overall.

    Returns ``{"rows": [{"shape", "tokens", "faster", "bskd_over_bksd"}], "faster_in": {layout: count},
    "geomean_bskd_over_bksd": float}`` (a ratio above 1: "bksd" is faster), or ``{}`` without both orders.
    """
    by = {}
    for r in decode:
        by.setdefault((f"{r['heads']}/{r['kv_heads']}/{r['head_dim']}", r["tokens"]), {})[r["layout"]] = r["kernel_ms"]
    rows = [{"shape": shape, "tokens": tokens, "bskd_over_bksd": t["bskd"] / t["bksd"],
             "faster": "bksd" if t["bksd"] < t["bskd"] else "bskd"}
            for (shape, tokens), t in by.items() if {"bskd", "bksd"} <= t.keys()]
    if not rows:
        return {}
    return {"rows": rows, "faster_in": {lay: sum(r["faster"] == lay for r in rows) for lay in ("bskd", "bksd")},
            "geomean_bskd_over_bksd": float(np.exp(np.mean([np.log(r["bskd_over_bksd"]) for r in rows])))}


def report(rec: dict) -> str:
    """The run's record as Markdown tables, for ``results/bench/`` and the README's performance section.

    Every field a failed or skipped step lacks is left out rather than guessed; a failed case shows the
    first line of its error.
    """
    c = rec.get("ceilings", {})
    lines = [f"# Device check: {rec['device']} ({rec['backend']}), jax {rec['jax']}, {rec['date']}", "",
             f"`python -m pallas_kernels.device_check{' --dry-run' if rec['dry_run'] else ''}`"
             f"{' (tiny shapes, kernels interpreted)' if rec['dry_run'] else ''}: "
             f"{rec.get('seconds', 0):.0f} s, medians of {rec['repeats']}, implementation {rec['implementation']}. "
             f"Copy bandwidth {c.get('copy_bytes_per_s', 0) / 1e12:.3f} TB/s, read bandwidth "
             f"{c.get('read_bytes_per_s', 0) / 1e12:.3f} TB/s (a {c.get('bytes', 0) / 2**30:.2f} GiB array, same run). "
             f"Every kernel and step passed: **{rec.get('all_passed')}**."]
    if rec.get("skipped"):
        lines.append(f"Skipped (time budget): {', '.join(rec['skipped'])}.")
    for name, err in rec.get("step_errors", {}).items():
        lines.append(f"Step `{name}` failed: `{err.splitlines()[0]}`.")
    rows = []
    for r in rec.get("kernels", []):
        if "error" in r:
            rows.append([r["case"], "**error**", "", "", "", "", "`" + r["error"].splitlines()[0][:160] + "`"])
        else:
            rows.append([r["case"], "pass" if r["passed"] else "**FAIL**",
                         f"{r['max_relative_error']:.1e} / {r['tolerance']:.0e}", f"{r['kernel_ms']:.3f}",
                         f"{r['xla_ms']:.3f}", f"{r['speedup_vs_xla']:.2f}x", f"{r['compile_and_first_run_s']:.1f} s"])
    lines += ["", "## Kernels against their XLA references (same inputs)", ""]
    lines += _md_table(["case", "check", "rel. error / tolerance", "kernel ms", "XLA ms", "XLA / kernel",
                        "compile + first run"], rows)
    if rec.get("ffd"):
        lines += ["", "## FFD kernel against the dense decode kernel (one sequence, synthetic sink+needle heads, delta=5)", ""]
        lines += _md_table(["tokens", "kept", "same selection", "rel. error vs dense", "dense kernel ms",
                            "FFD kernel ms", "speedup"],
                           [[r["tokens"], f"{r['kept_fraction']:.1%}", r["same_selection_as_reference"],
                             f"{r['max_rel_error_vs_dense']:.2e}", f"{r['dense_kernel_ms']:.3f}",
                             f"{r['ffd_kernel_ms']:.3f}", f"{r['speedup_vs_dense_kernel']:.2f}x"] for r in rec["ffd"]])
    if rec.get("decode"):
        lines += ["", "## Dense decode kernel against the copy ceiling (batch 1, bf16 cache)", ""]
        lines += _md_table(["tokens", "h/k/d", "layout", "K+V MB", "kernel ms", "TB/s", "of copy ceiling", "XLA ms",
                            "rel. error vs XLA"],
                           [[r["tokens"], f"{r['heads']}/{r['kv_heads']}/{r['head_dim']}", r["layout"],
                             f"{r['mbytes']:.0f}", f"{r['kernel_ms']:.3f}", f"{r['kernel_tb_s']:.3f}",
                             f"{r['fraction_of_copy_ceiling']:.0%}", f"{r['xla_ms']:.3f}",
                             f"{r['kernel_vs_xla_relative_error']:.1e}"] for r in rec["decode"]])
        v = layout_verdict(rec["decode"])
        if v:
            lines += ["", f"Axis order: the kernel ran faster on \"bksd\" (head-major) in {v['faster_in']['bksd']} "
                          f"of {len(v['rows'])} rows and on \"bskd\" in {v['faster_in']['bskd']}; time bskd / bksd, "
                          f"geometric mean {v['geomean_bskd_over_bksd']:.2f} (above 1: head-major is faster). "
                          "`primitives.attention.default_kv_layout` decides the GPU default from this."]
    return "\n".join(lines) + "\n"


def default_out(device_kind: str) -> pathlib.Path:
    """``results/bench/gpu_<card>.json`` with the card's name made file-safe."""
    slug = re.sub(r"[^a-z0-9]+", "_", device_kind.lower()).strip("_") or "device"
    return pathlib.Path("results/bench") / f"gpu_{slug}.json"


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes, interpreted kernels (any machine)")
    parser.add_argument("--lower-only", action="store_true",
                        help="only lower every full-size program for Triton (any machine, seconds)")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--budget-s", type=float, default=420.0, help="skip what is left after this many seconds")
    parser.add_argument("--only", default=None, help="comma list of case ids (kernel.name), 'ffd', 'decode'")
    parser.add_argument("--out", default=None, help="JSON path (default results/bench/gpu_<card>.json; "
                                                    "a dry run writes only when given); Markdown tables beside it (.md)")
    parser.add_argument("--report", default=None, metavar="JSON",
                        help="print the Markdown tables of an earlier run's JSON and exit (any machine)")
    args = parser.parse_args(argv)
    if args.report:
        text = report(json.loads(pathlib.Path(args.report).read_text()))
        print(text)
        return {"report": text}
    if args.lower_only:
        res = lower_full()
        for name, status in res.items():
            print(f"  {name:<42} {status}")
        return {"lowered": res}
    if not args.dry_run and jax.default_backend() != "gpu":
        parser.error(f"no GPU here (backend {jax.default_backend()!r}); use --dry-run to test the script")
    rec = run(dry_run=args.dry_run, repeats=args.repeats, budget_s=args.budget_s,
              only=None if args.only is None else tuple(args.only.split(",")))
    out = args.out or (None if args.dry_run else default_out(rec["device"]))
    if out:
        path = pathlib.Path(out)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(rec, indent=1))
        path.with_suffix(".md").write_text(report(rec))
        print(f"wrote {path} and {path.with_suffix('.md')}")
    return rec


if __name__ == "__main__":
    main()
