"""Contract every Pallas kernel signs: it lowers for TPU (Mosaic) and for GPU (Triton) on a CPU-only machine.

One table, one test. Each kernel registers its lowering case(s) with `@lowering_case(...)`: a builder that,
given the resolved implementation ("pallas_tpu" or "pallas_triton") and the case's parameters, returns the
function to lower, its abstract arguments (`jax.ShapeDtypeStruct`s or `jax.eval_shape` pytrees) and,
optionally, extra checks on the lowered module text. `test_cross_lowering` lowers every case with
`_backend.lower_for` and asserts the backend's marker (`tpu_custom_call` / `triton`) is in the text. This
catches TPU block-shape rules and Triton's power-of-two / no-scratch rules without the hardware
(PALLAS.md, "tests every kernel has", item 3). The per-kernel test files keep their numerics tests.
"""

from __future__ import annotations

import dataclasses
import pkgutil
from typing import Callable

import jax
import jax.numpy as jnp
import pytest

import pallas_kernels
from pallas_kernels import _backend
from pallas_kernels.decode_attention import DecodeBlockSizes, decode_attention
from pallas_kernels.ffd_decode import FFDBlockSizes, ffd_decode
from pallas_kernels.flash_attention import FlashBlockSizes, flash_attention
from pallas_kernels.grouped_matmul import GmmBlockSizes, grouped_matmul
from pallas_kernels.kv_quant import QuantDecodeBlockSizes, dequantize, quantize, quantized_decode_attention
from pallas_kernels.qvg import QVGAttentionBlockSizes, kmeans_assign, qvg_attention
from pallas_kernels.vegas import sparse_decode_attention, verify_attention
from pallas_kernels.wkv import bi_wkv
from primitives import ffd as ffd_ref
from primitives import quantization as qz
from primitives import residual_quantization as rq

IMPLEMENTATION = {"tpu": "pallas_tpu", "cuda": "pallas_triton"}
MARKER = {"tpu": "tpu_custom_call", "cuda": "triton"}
sd = jax.ShapeDtypeStruct


@dataclasses.dataclass(frozen=True)
class LoweringCase:
    kernel: str  # the pallas_kernels sub-package
    name: str  # which entry point / variant
    platform: str  # "tpu" | "cuda"
    build: Callable  # (impl, **params) -> (fn, args) or (fn, args, check(text))
    params: tuple = ()  # static parameters of the case, as (name, value) pairs

    @property
    def id(self) -> str:
        extra = "".join(f"-{k}{v}" for k, v in self.params)
        return f"{self.kernel}.{self.name}-{self.platform}{extra}"


CASES: list[LoweringCase] = []


def lowering_case(kernel: str, name: str, platforms=("tpu", "cuda"), **params):
    """Registers `build` for each platform in `platforms` (with `params` passed to it as keywords)."""

    def register(build):
        for platform in platforms:
            CASES.append(LoweringCase(kernel, name, platform, build, tuple(params.items())))
        return build

    return register


# ---------------------------------------------------------------------------------------------------------
# decode_attention


@lowering_case("decode_attention", "decode")
def _decode(impl):
    f = lambda q, k, v, n: decode_attention(q, k, v, n, implementation=impl, interpret=False,
                                            block_sizes=DecodeBlockSizes(block_k=128, num_splits=4))
    return f, (sd((2, 8, 128), jnp.bfloat16), sd((2, 1024, 2, 128), jnp.bfloat16),
               sd((2, 1024, 2, 128), jnp.bfloat16), sd((2,), jnp.int32))


# ---------------------------------------------------------------------------------------------------------
# ffd_decode


@lowering_case("ffd_decode", "ffd_decode")
def _ffd(impl):
    b, kh, g, d, s, bs = 2, 2, 4, 128, 2048, 128
    cache = jax.eval_shape(lambda k, v, n: ffd_ref.build_cache(k, v, n, page_size=bs, residual_dtype=jnp.bfloat16),
                           sd((b, s, kh, d), jnp.bfloat16), sd((b, s, kh, d), jnp.bfloat16), sd((b,), jnp.int32))
    f = lambda q, c: ffd_decode(q, c, delta=5.0, implementation=impl, interpret=False,
                                block_sizes=FFDBlockSizes(num_splits=4)).out
    return f, (sd((b, kh * g, d), jnp.bfloat16), cache)


# ---------------------------------------------------------------------------------------------------------
# flash_attention


@lowering_case("flash_attention", "causal")
def _flash(impl):
    f = lambda q, k, v: flash_attention(q, k, v, causal=True, implementation=impl, interpret=False,
                                        block_sizes=FlashBlockSizes(block_q=128, block_k=128))
    return f, (sd((1, 512, 8, 128), jnp.bfloat16), sd((1, 512, 2, 128), jnp.bfloat16),
               sd((1, 512, 2, 128), jnp.bfloat16))


# ---------------------------------------------------------------------------------------------------------
# grouped_matmul


_GMM_BS = {"pallas_tpu": GmmBlockSizes(block_m=128, block_k=128, block_n=128),
           "pallas_triton": GmmBlockSizes(block_m=64, block_k=32, block_n=64)}


@lowering_case("grouped_matmul", "forward_and_backward")
def _gmm(impl):
    bs = _GMM_BS[impl]

    def f(x, w, g):  # forward + both backward kernels (d_lhs gmm on rhs^T, d_rhs tgmm)
        return jax.value_and_grad(lambda a, b: grouped_matmul(a, b, g, implementation=impl, interpret=False,
                                                              block_sizes=bs).astype(jnp.float32).sum(), (0, 1))(x, w)

    def check(text):
        text = text.lower()
        assert "grouped_matmul" in text and "tgmm" in text
        if impl == "pallas_tpu":
            assert text.count("tpu_custom_call") == 3  # forward, d_lhs, d_rhs

    return f, (sd((300, 256), jnp.bfloat16), sd((8, 256, 384), jnp.bfloat16), sd((8,), jnp.int32)), check


# ---------------------------------------------------------------------------------------------------------
# kv_quant


_KV_X = sd((2, 1024, 8, 128), jnp.bfloat16)


def _kv_quantized():
    kt = jax.eval_shape(lambda a: qz.quantize(a, bits=4, group_size=64), _KV_X)
    vt = jax.eval_shape(lambda a: qz.quantize(a, bits=2, group_size=128, scheme="asymmetric",
                                              scale_dtype=jnp.bfloat16), _KV_X)
    return kt, vt


@lowering_case("kv_quant", "quantize")
def _kv_quantize(impl):
    def check(text):
        if impl == "pallas_triton":
            assert "div.rn.f32" in text  # correctly rounded division, as the reference

    return lambda a: quantize(a, bits=4, group_size=64, implementation=impl, interpret=False), (_KV_X,), check


@lowering_case("kv_quant", "dequantize")
def _kv_dequantize(impl):
    _, vt = _kv_quantized()
    return lambda t: dequantize(t, implementation=impl, interpret=False), (vt,)


@lowering_case("kv_quant", "quantized_decode")
def _kv_decode(impl):
    kt, vt = _kv_quantized()
    f = lambda q, k, v, n: quantized_decode_attention(q, k, v, n, implementation=impl, interpret=False,
                                                      block_sizes=QuantDecodeBlockSizes(block_k=128, num_splits=4))
    return f, (sd((2, 32, 128), jnp.bfloat16), kt, vt, sd((2,), jnp.int32))


# ---------------------------------------------------------------------------------------------------------
# qvg


@lowering_case("qvg", "kmeans_assign")
def _qvg_assign(impl):
    f = lambda x, c: kmeans_assign(x, c, implementation=impl, interpret=False)
    return f, (sd((8, 4096, 128), jnp.float32), sd((8, 256, 128), jnp.float32))


@lowering_case("qvg", "qvg_attention")
def _qvg_attention(impl):
    x = sd((2, 4, 2048, 128), jnp.bfloat16)
    kt = jax.eval_shape(lambda a: rq.qvg_quantize(a, jax.random.key(0), config=rq.QVG), x)
    vt = jax.eval_shape(lambda a: rq.qvg_quantize(a, jax.random.key(0), config=rq.QVG_PRO), x)
    g = lambda q, k, v, n: qvg_attention(q, k, v, n, implementation=impl, interpret=False,
                                         block_sizes=QVGAttentionBlockSizes(block_k=128))
    if impl == "pallas_triton":  # QVG-Pro's 16-channel blocks at 2 bits give 4-channel sub-slices: not for Triton
        vt = kt
    return g, (sd((2, 64, 8, 128), jnp.bfloat16), kt, vt, sd((2,), jnp.int32))


# ---------------------------------------------------------------------------------------------------------
# vegas: sparse decode with d=64 on TPU takes the all-heads-per-program path (lane rule), d=128 one KV head
# per program; verify on TPU spans every KV head over a token-major cache and one over a head-major one.


def _verify_args(d, kh=2):
    return (sd((2, 5, 8, d), jnp.bfloat16), sd((2, 1000, kh, d), jnp.bfloat16), sd((2, 1000, kh, d), jnp.bfloat16),
            sd((2, 5), jnp.int32))


def _sparse_args(d, kh=2):
    return (sd((2, 8, d), jnp.bfloat16), sd((2, 1000, kh, d), jnp.bfloat16), sd((2, 1000, kh, d), jnp.bfloat16),
            sd((2, 50), jnp.int32), sd((2, 50), jnp.bool_), sd((2,), jnp.int32), sd((2,), jnp.int32))


def _vegas_verify(impl, d):
    f = lambda q, k, v, p: verify_attention(q, k, v, p, rows=(0, 4), implementation=impl, interpret=False)
    return f, _verify_args(d)


def _vegas_verify_head_major(impl, d):
    f = lambda q, k, v, p: verify_attention(q, k, v, p, rows=(0, 4), implementation=impl, interpret=False,
                                            kv_layout="bksd")
    q, k, v, p = _verify_args(d)
    return f, (q, sd((2, 2, 1000, d), k.dtype), sd((2, 2, 1000, d), v.dtype), p)


def _vegas_sparse(impl, d):
    g = lambda q, k, v, i, ok, rs, n: sparse_decode_attention(q, k, v, i, ok, rs, n, max_recent=64, return_lse=True,
                                                              implementation=impl, interpret=False)
    return g, _sparse_args(d)


for _d, _platforms in ((128, ("tpu", "cuda")), (64, ("tpu",))):
    lowering_case("vegas", "verify", platforms=_platforms, d=_d)(_vegas_verify)
    lowering_case("vegas", "verify_head_major", platforms=_platforms, d=_d)(_vegas_verify_head_major)
    lowering_case("vegas", "sparse_decode", platforms=_platforms, d=_d)(_vegas_sparse)


# ---------------------------------------------------------------------------------------------------------
# wkv


@lowering_case("wkv", "bi_wkv")
def _wkv(impl):
    def f(w, u, k, v):  # forward kernel + gradient (the backward kernel)
        return jax.value_and_grad(lambda kk: bi_wkv(w, u, kk, v, implementation=impl, interpret=False)
                                  .astype(jnp.float32).sum())(k)

    return f, (sd((192,), jnp.float32), sd((192,), jnp.float32), sd((4, 196, 192), jnp.bfloat16),
               sd((4, 196, 192), jnp.bfloat16))


# ---------------------------------------------------------------------------------------------------------
# The contract.


def test_every_kernel_package_registers_both_platforms():
    packages = {m.name for m in pkgutil.iter_modules(pallas_kernels.__path__) if m.ispkg}
    kernels = {c.kernel for c in CASES}
    assert kernels == packages
    for kernel in kernels:
        assert {c.platform for c in CASES if c.kernel == kernel} == {"tpu", "cuda"}, kernel


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_cross_lowering(case):
    built = case.build(IMPLEMENTATION[case.platform], **dict(case.params))
    fn, args, check = built if len(built) == 3 else (*built, None)
    text = _backend.lower_for(fn, *args, platform=case.platform)
    assert MARKER[case.platform] in text.lower()
    if check is not None:
        check(text)
