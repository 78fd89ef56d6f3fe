"""Reference attention against a float64 numpy implementation written from the definition."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from primitives import attention as A


def naive_attention(q, k, v, *, causal=False, q_pos=None, kv_pos=None, q_seg=None, kv_seg=None,
                    kv_lengths=None, scale=None):
    """Loops over (batch, head, query) in float64; returns (out [b,t,h,d], lse [b,h,t])."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    b, t, h, d = q.shape
    s, kh = k.shape[1], k.shape[2]
    scale = 1 / np.sqrt(d) if scale is None else scale
    q_pos = np.broadcast_to(np.arange(t) if q_pos is None else q_pos, (b, t))
    kv_pos = np.broadcast_to(np.arange(s) if kv_pos is None else kv_pos, (b, s))
    out = np.zeros((b, t, h, d))
    lse = np.full((b, h, t), -np.inf)
    for bi in range(b):
        for hi in range(h):
            kv_head = hi // (h // kh)
            for ti in range(t):
                ok = np.ones(s, bool)
                if causal:
                    ok &= kv_pos[bi] <= q_pos[bi, ti]
                if kv_lengths is not None:
                    ok &= np.arange(s) < kv_lengths[bi]
                if q_seg is not None:
                    ok &= kv_seg[bi] == q_seg[bi, ti]
                if not ok.any():
                    continue
                logits = scale * k[bi, :, kv_head] @ q[bi, ti, hi]
                logits = np.where(ok, logits, -np.inf)
                m = logits.max()
                w = np.exp(logits - m)
                lse[bi, hi, ti] = m + np.log(w.sum())
                out[bi, ti, hi] = (w / w.sum()) @ v[bi, :, kv_head]
    return out, lse


def _qkv(key, b=2, t=5, s=7, h=4, kh=2, d=8):
    k1, k2, k3 = jax.random.split(jax.random.key(key), 3)
    return (jax.random.normal(k1, (b, t, h, d)), jax.random.normal(k2, (b, s, kh, d)),
            jax.random.normal(k3, (b, s, kh, d)))


@pytest.mark.parametrize("kh", [1, 2, 4])  # MQA, GQA, MHA
@pytest.mark.parametrize("jit", [False, True])
def test_matches_numpy_with_all_masks(kh, jit):
    q, k, v = _qkv(0, kh=kh)
    q_pos = np.array([[2, 3, 4, 5, 6], [0, 1, 2, 3, 4]])
    q_seg = np.array([[0, 0, 1, 1, 1], [0, 0, 0, 0, 0]])
    kv_seg = np.array([[0, 0, 0, 1, 1, 1, 1], [0, 0, 0, 0, 0, 0, 0]])
    lengths = np.array([7, 4])
    f = lambda q, k, v: A.attention(q, k, v, causal=True, q_positions=q_pos, q_segment_ids=q_seg,
                                    kv_segment_ids=kv_seg, kv_lengths=lengths, return_lse=True)
    res = (jax.jit(f) if jit else f)(q, k, v)
    out, lse = naive_attention(q, k, v, causal=True, q_pos=q_pos, q_seg=q_seg, kv_seg=kv_seg, kv_lengths=lengths)
    np.testing.assert_allclose(res.out, out, atol=1e-5)
    np.testing.assert_allclose(res.lse, lse, atol=1e-5)


def test_plain_and_custom_scale_match_numpy():
    q, k, v = _qkv(1, t=3, s=3)
    np.testing.assert_allclose(A.attention(q, k, v), naive_attention(q, k, v)[0], atol=1e-5)
    np.testing.assert_allclose(A.attention(q, k, v, scale=0.3), naive_attention(q, k, v, scale=0.3)[0], atol=1e-5)


def test_additive_bias_matches_numpy_and_minus_inf_bias_is_a_mask():
    q, k, v = _qkv(3, b=2, t=3, s=4, h=4, kh=2)
    bias = np.asarray(jax.random.normal(jax.random.key(9), (2, 4, 3, 4)), np.float64)
    res = A.attention(q, k, v, bias=bias, return_lse=True)
    # float64 reference: softmax(scale * q.k + bias) v, per (batch, head, query)
    qn, kn, vn = (np.asarray(x, np.float64) for x in (q, k, v))
    logits = np.einsum("bthd,bshd->bhts", qn, np.repeat(kn, 2, axis=2)) / np.sqrt(8) + bias
    w = np.exp(logits - logits.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    np.testing.assert_allclose(res.out, np.einsum("bhts,bshd->bthd", w, np.repeat(vn, 2, axis=2)), atol=1e-5)
    np.testing.assert_allclose(res.lse, np.log(np.exp(logits).sum(-1)), atol=1e-5)
    # a bias of -inf on a key is the same as masking it; a broadcast bias [1, 1, 1, s] works
    block = np.zeros((1, 1, 1, 4), np.float32)
    block[..., 1] = -np.inf
    mask = np.ones((1, 1, 1, 4), bool)
    mask[..., 1] = False
    np.testing.assert_allclose(A.attention(q, k, v, bias=block), A.attention(q, k, v, mask=mask), atol=1e-6)
    with pytest.raises(ValueError, match="bias must be broadcastable"):
        A.attention(q, k, v, bias=np.zeros((2, 3, 3, 4)))


def test_extra_boolean_mask_per_head():
    q, k, v = _qkv(2, b=1, t=2, s=3, h=2, kh=1)
    mask = np.ones((1, 2, 2, 3), bool)
    mask[0, 1, :, 0] = False  # head 1 may not see key 0
    got = A.attention(q, k, v, mask=mask)
    ref0 = naive_attention(q[:, :, :1], k, v)[0]
    ref1 = naive_attention(q[:, :, 1:], k[:, 1:], v[:, 1:])[0]
    np.testing.assert_allclose(got[:, :, :1], ref0, atol=1e-5)
    np.testing.assert_allclose(got[:, :, 1:], ref1, atol=1e-5)


def test_fully_masked_rows_give_zeros_not_nan():
    q, k, v = _qkv(3)
    res = A.attention(q, k, v, kv_lengths=jnp.array([0, 3]), return_lse=True)
    assert np.all(np.isfinite(res.out))
    np.testing.assert_array_equal(res.out[0], 0.0)
    assert np.all(np.isneginf(res.lse[0]))
    # Gradients through a fully masked row are finite too.
    g = jax.grad(lambda q: A.attention(q, k, v, kv_lengths=jnp.array([0, 3])).sum())(q)
    assert np.all(np.isfinite(g))


def test_decode_attention_is_the_last_row_of_causal_attention():
    q, k, v = _qkv(4, t=1, s=9)
    lengths = jnp.array([9, 5])
    res = A.decode_attention(q[:, 0], k, v, lengths, return_lse=True)
    out, lse = naive_attention(q, k, v, kv_lengths=np.asarray(lengths))
    np.testing.assert_allclose(res.out, out[:, 0], atol=1e-5)
    np.testing.assert_allclose(res.lse, lse[..., 0], atol=1e-5)
    empty = A.decode_attention(q[:, 0], k, v, jnp.array([0, 0]))
    np.testing.assert_array_equal(empty, 0.0)


@pytest.mark.parametrize("splits", [[3, 6], [0, 4, 9], [2, 2, 5]])  # includes an empty chunk
def test_combine_partials_equals_attention_over_the_union(splits):
    q, k, v = _qkv(5, t=1, s=9)
    bounds = [0] + splits + [9]
    outs, lses = [], []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        mask = (np.arange(9) >= lo) & (np.arange(9) < hi)
        r = A.attention(q, k, v, mask=mask[None, None, None, :], return_lse=True)
        outs.append(r.out)
        lses.append(jnp.moveaxis(r.lse, 1, 2))  # [b, h, t] -> [b, t, h] to match outs [b, t, h, d]
    merged = A.combine_partials(jnp.stack(outs), jnp.stack(lses))
    full = A.attention(q, k, v, return_lse=True)
    np.testing.assert_allclose(merged.out, full.out, atol=1e-5)
    np.testing.assert_allclose(merged.lse, jnp.moveaxis(full.lse, 1, 2), atol=1e-5)


def test_combine_partials_all_empty_is_zero():
    outs = jnp.zeros((2, 3, 4))
    lses = jnp.full((2, 3), -jnp.inf)
    res = A.combine_partials(outs, lses)
    np.testing.assert_array_equal(res.out, 0.0)
    assert np.all(np.isneginf(res.lse))


def test_rope_matches_rotation_and_is_relative():
    x = jax.random.normal(jax.random.key(6), (1, 3, 2, 8))
    pos = np.array([[0, 5, 11]])
    got = np.asarray(A.rope(x, pos, base=100.0), np.float64)
    xs = np.asarray(x, np.float64)
    freqs = 100.0 ** (-np.arange(0, 8, 2) / 8)
    for ti, p in enumerate(pos[0]):
        c, s = np.cos(p * freqs), np.sin(p * freqs)
        x1, x2 = xs[0, ti, :, :4], xs[0, ti, :, 4:]
        np.testing.assert_allclose(got[0, ti], np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], -1), atol=1e-5)
    # <rope(q, m), rope(k, n)> depends on m - n only.
    q = jax.random.normal(jax.random.key(7), (1, 1, 1, 8))
    k = jax.random.normal(jax.random.key(8), (1, 1, 1, 8))
    dot = lambda m, n: float(jnp.sum(A.rope(q, jnp.array([[m]])) * A.rope(k, jnp.array([[n]]))))
    assert dot(3, 1) == pytest.approx(dot(10, 8), abs=1e-4)


@pytest.mark.parametrize("shapes, match", [
    (((1, 2, 3, 4), (1, 2, 2, 4), (1, 2, 2, 4)), "multiple of key/value heads"),
    (((1, 2, 4, 4), (1, 2, 2, 8), (1, 2, 2, 8)), "head dims differ"),
    (((2, 2, 4, 4), (1, 2, 2, 4), (1, 2, 2, 4)), "batch sizes differ"),
    (((2, 4, 4), (1, 2, 2, 4), (1, 2, 2, 4)), r"q \[b, t, h, d\]"),
])
def test_bad_shapes_name_the_problem(shapes, match):
    q, k, v = (jnp.zeros(s) for s in shapes)
    with pytest.raises(ValueError, match=match):
        A.attention(q, k, v)


def test_bad_mask_arguments():
    q, k, v = _qkv(9)
    with pytest.raises(ValueError, match="kv_lengths"):
        A.attention(q, k, v, kv_lengths=jnp.array([1, 2, 3]))
    with pytest.raises(ValueError, match="both q_segment_ids and kv_segment_ids"):
        A.attention(q, k, v, q_segment_ids=jnp.zeros((2, 5), int))
