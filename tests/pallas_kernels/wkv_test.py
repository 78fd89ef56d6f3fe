"""Bi-WKV kernel (interpret mode) vs the quadratic reference and a float64 numpy reference, on shapes that are
not block multiples; gradients through the custom VJP; dispatch; cross-lowering for TPU and Triton; bad input."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels import _backend
from pallas_kernels.wkv import WKVBlockSizes, bi_wkv, bi_wkv_cost, bi_wkv_quadratic_cost
from primitives import linear_attention as la

sd = jax.ShapeDtypeStruct
_reference = jax.jit(la.bi_wkv_reference)


def np_bi_wkv(w, u, k, v):
    """Float64 numpy Bi-WKV from the definition (softmax over tokens, log space): [b, t, c]."""
    w, u, k, v = (np.asarray(x, np.float64) for x in (w, u, k, v))
    t = k.shape[1]
    out = np.zeros_like(v)
    for ti in range(t):
        logits = k - (np.abs(ti - np.arange(t)) - 1.0)[None, :, None] * w
        logits[:, ti] = u + k[:, ti]
        p = np.exp(logits - logits.max(axis=1, keepdims=True))
        out[:, ti] = (p * v).sum(1) / p.sum(1)
    return out


def _problem(lead, t, c, seed, k_scale=2.0):
    r = np.random.default_rng(seed)
    f = lambda s, sc=1.0: jnp.asarray(r.standard_normal(s) * sc, jnp.float32)
    return f((c,)), f((c,)), f(lead + (t, c), k_scale), f(lead + (t, c))


# (shell, leading dims, t, c, block sizes): token counts that are not chunk multiples (and, for Triton, not
# powers of two), sequence counts (batch x channels) that are not tile multiples, a one-token sequence.
CASES = [
    ("pallas_triton", (3,), 37, 20, WKVBlockSizes(rows=2, lanes=16, block_t=8)),
    ("pallas_tpu", (2, 1), 13, 70, WKVBlockSizes(rows=8, lanes=128, block_t=5)),
    ("pallas_triton", (2,), 1, 5, WKVBlockSizes(rows=1, lanes=16, block_t=4)),
]


@pytest.mark.parametrize("impl, lead, t, c, bs", CASES)
def test_kernel_matches_the_references(impl, lead, t, c, bs):
    w, u, k, v = _problem(lead, t, c, t + c)
    got = bi_wkv(w, u, k, v, implementation=impl, interpret=True, block_sizes=bs)
    assert got.shape == k.shape and got.dtype == v.dtype
    np.testing.assert_allclose(got, _reference(w, u, k, v), rtol=1e-5, atol=1e-5)
    n = int(np.prod(lead))
    np.testing.assert_allclose(got.reshape(n, t, c), np_bi_wkv(w, u, k.reshape(n, t, c), v.reshape(n, t, c)),
                               rtol=1e-5, atol=1e-5)


def test_chunk_length_and_tile_shape_do_not_change_the_result():
    # The per-token math is the same however the time loop is chunked (including block_t > t: no full chunk)
    # and however the sequences are tiled: equal outputs, to the float32 rounding of one multiply-add (XLA,
    # running the interpreted body, may fuse a multiply and an add into an FMA in one unrolling and not in
    # another; that moved one output by 1 ulp once the second pass also wrote the log-normalizer).
    w, u, k, v = _problem((2,), 10, 5, 8)
    outs = [bi_wkv(w, u, k, v, implementation="pallas_triton", interpret=True, block_sizes=bs)
            for bs in (WKVBlockSizes(rows=1, lanes=16, block_t=1), WKVBlockSizes(rows=1, lanes=16, block_t=3),
                       WKVBlockSizes(rows=2, lanes=16, block_t=16))]
    for o in outs[1:]:
        np.testing.assert_allclose(o, outs[0], rtol=4e-7, atol=0)


def test_kernel_is_stable_where_the_naive_form_overflows_and_accepts_bf16():
    r = np.random.default_rng(4)
    t, c = 11, 4
    w = jnp.asarray([30.0, -30.0, 0.5, -12.0], jnp.float32)
    u = jnp.asarray([5.0, -40.0, 60.0, 0.0], jnp.float32)
    k = jnp.asarray(r.uniform(-100, 100, (2, t, c)), jnp.float32)
    v = jnp.asarray(r.standard_normal((2, t, c)), jnp.float32)
    assert float(jnp.max(k)) > np.log(np.finfo(np.float32).max)  # the naive exp(k) already overflows float32
    bs = WKVBlockSizes(rows=1, lanes=16, block_t=4)
    got = bi_wkv(w, u, k, v, implementation="pallas_triton", interpret=True, block_sizes=bs)
    assert np.all(np.isfinite(np.asarray(got)))
    np.testing.assert_allclose(got, np_bi_wkv(w, u, k, v), rtol=1e-5, atol=1e-5)
    # bf16 inputs, float32 accumulation: the kernel equals the reference run on the same rounded inputs.
    kb, vb = k.astype(jnp.bfloat16), v.astype(jnp.bfloat16)
    got16 = bi_wkv(w, u, kb, vb, implementation="pallas_triton", interpret=True, block_sizes=bs)
    assert got16.dtype == jnp.bfloat16
    np.testing.assert_allclose(got16.astype(jnp.float32), np_bi_wkv(w, u, kb.astype(jnp.float32),
                                                                   vb.astype(jnp.float32)), rtol=1e-2, atol=1e-2)


def _stiff_problem(lead, t, c, seed):
    """Decays of both signs and keys far beyond exp's float32 range: the naive gradient overflows."""
    r = np.random.default_rng(seed)
    w = jnp.asarray(r.choice([30.0, -30.0, 0.5, -12.0, 0.05], c), jnp.float32)
    u = jnp.asarray(r.uniform(-40, 60, c), jnp.float32)
    k = jnp.asarray(r.uniform(-100, 100, lead + (t, c)), jnp.float32)
    return w, u, k, jnp.asarray(r.standard_normal(lead + (t, c)), jnp.float32)


# (shell, problem, leading dims, t, c, block sizes): the backward kernel's gradients (all four) against the
# gradients of the quadratic reference, on both shells, shapes that are not block multiples, a stiff case.
GRAD_CASES = [
    ("pallas_triton", _problem, (2,), 9, 6, WKVBlockSizes(rows=1, lanes=16, block_t=4)),
    ("pallas_tpu", _problem, (2, 1), 13, 70, WKVBlockSizes(rows=8, lanes=128, block_t=5)),
    ("pallas_triton", _stiff_problem, (2,), 11, 5, WKVBlockSizes(rows=1, lanes=16, block_t=3)),
]


@pytest.mark.parametrize("impl, problem, lead, t, c, bs", GRAD_CASES)
def test_gradients_through_the_kernel_match_the_reference(impl, problem, lead, t, c, bs):
    w, u, k, v = problem(lead, t, c, 1)
    probe = jnp.asarray(np.random.default_rng(2).standard_normal(lead + (t, c)), jnp.float32)

    def loss(fn):
        return jax.jit(jax.grad(lambda *a: jnp.sum(probe * fn(*a)), argnums=(0, 1, 2, 3)))

    got = loss(lambda *a: bi_wkv(*a, implementation=impl, interpret=True, block_sizes=bs))(w, u, k, v)
    want = loss(la.bi_wkv_reference)(w, u, k, v)
    for name, g, h in zip("wukv", got, want):
        assert np.all(np.isfinite(np.asarray(g))), name
        np.testing.assert_allclose(g, h, rtol=2e-5, atol=2e-5 * max(1.0, float(jnp.abs(h).max())), err_msg=name)


def test_backward_falls_back_to_the_xla_vjp_where_its_blocks_do_not_fit(monkeypatch):
    # A VMEM cap between the forward's need and the backward's: the forward kernel runs, the gradient comes
    # from the XLA primitive's VJP, and equals the backward kernel's.
    from pallas_kernels.wkv import api

    w, u, k, v = _problem((2, 1), 13, 70, 3)
    bs = WKVBlockSizes(rows=8, lanes=128, block_t=5)
    grad = lambda: jax.grad(lambda kk: jnp.sum(bi_wkv(w, u, kk, v, implementation="pallas_tpu", interpret=True,
                                                      block_sizes=bs) ** 2))(k)
    want = grad()
    assert api._tpu_vmem_bytes(13, bs, 4) < api._tpu_backward_vmem_bytes(13, bs, 4, 4)
    monkeypatch.setattr(api, "_TPU_VMEM_CAP", api._tpu_vmem_bytes(13, bs, 4))
    monkeypatch.setattr(api, "_pallas_backward", lambda *a, **kw: pytest.fail("the backward kernel ran"))
    jax.clear_caches()  # trace again under the patched cap (bi_wkv is jitted)
    np.testing.assert_allclose(grad(), want, rtol=2e-5, atol=2e-5)
    jax.clear_caches()


def test_dispatch_xla_is_the_cpu_default():
    w, u, k, v = _problem((2,), 10, 3, 3)
    want = bi_wkv(w, u, k, v, implementation="xla", method="scan")
    for impl in (None, "auto"):
        np.testing.assert_array_equal(bi_wkv(w, u, k, v, implementation=impl), want)
    np.testing.assert_allclose(want, la.bi_wkv(w, u, k, v), atol=1e-6)
    np.testing.assert_allclose(bi_wkv(w, u, k, v, implementation="xla", method="associative"), want, atol=1e-6)


@pytest.mark.parametrize("platform, impl", [("tpu", "pallas_tpu"), ("cuda", "pallas_triton")])
def test_cross_lowering_forward_and_gradient(platform, impl):
    # Vision-RWKV-T at 224 px: 14 x 14 = 196 tokens, 192 channels; bf16 activations, f32 decays.
    def f(w, u, k, v):
        fwd = bi_wkv(w, u, k, v, implementation=impl, interpret=False)
        g = jax.grad(lambda kk: jnp.sum(bi_wkv(w, u, kk, v, implementation=impl, interpret=False)
                                        .astype(jnp.float32)))(k)
        return fwd, g

    args = (sd((192,), jnp.float32), sd((192,), jnp.float32), sd((4, 196, 192), jnp.bfloat16),
            sd((4, 196, 192), jnp.bfloat16))
    text = _backend.lower_for(f, *args, platform=platform).lower()
    assert ("tpu_custom_call" if platform == "tpu" else "triton") in text
    assert "bi_wkv" in text


def test_bad_input_is_named():
    w, u, k, v = _problem((1,), 4, 3, 0)
    with pytest.raises(ValueError, match="k and v must have the same shape"):
        bi_wkv(w, u, k, v[:, :3], implementation="pallas_triton", interpret=True)
    with pytest.raises(ValueError, match=r"w must have shape \[c\]"):
        bi_wkv(w[:2], u, k, v, implementation="pallas_tpu", interpret=True)
    with pytest.raises(ValueError, match="implementation must be one of"):
        bi_wkv(w, u, k, v, implementation="cuda")
    with pytest.raises(ValueError, match="method must be one of"):
        bi_wkv(w, u, k, v, method="fft")
    with pytest.raises(ValueError, match="Triton needs lanes a power of two"):
        bi_wkv(w, u, k, v, implementation="pallas_triton", interpret=True, block_sizes=WKVBlockSizes(lanes=48))
    with pytest.raises(ValueError, match="TPU needs rows a multiple of 8"):
        WKVBlockSizes(rows=4).validate("pallas_tpu")
    with pytest.raises(ValueError, match="block_t must be a positive int"):
        WKVBlockSizes(block_t=0)
    with pytest.raises(ValueError, match="use implementation='xla'"):
        jax.eval_shape(lambda k: bi_wkv(w, u, k, k, implementation="pallas_tpu", interpret=False),
                       sd((1, 8192, 3), jnp.float32))


def test_cost_model_counts():
    c = bi_wkv_cost(batch=2, seq_len=10, channels=3, itemsize=2)
    n = 2 * 10 * 3
    assert c.flops == 37 * n and c.transcendentals == 8 * n
    assert c.bytes_accessed == n * (2 * 2 + 4 + 4) + 2 * 2 * 3 * 4
    q = bi_wkv_quadratic_cost(batch=2, seq_len=10, channels=3)
    assert q.flops == 6 * 2 * 100 * 3 and q.transcendentals == 2 * 100 * 3
    # Linear vs quadratic: the FLOP ratio grows linearly with the sequence length.
    ratio = [bi_wkv_quadratic_cost(batch=1, seq_len=t, channels=8).flops / bi_wkv_cost(batch=1, seq_len=t,
                                                                                        channels=8).flops
             for t in (100, 200)]
    assert ratio[1] == pytest.approx(2 * ratio[0])
