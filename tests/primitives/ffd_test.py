"""FFD reference: quantizer, score identity, selection properties, error bound, baselines."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models.kv_cache import write_tokens
from primitives import ffd

B, S, KH, G, D, BS = 2, 200, 2, 3, 16, 16


@pytest.fixture(scope="module")
def problem():
    kq, kk, kv = jax.random.split(jax.random.key(0), 3)
    q = jax.random.normal(kq, (B, KH * G, D))
    keys = jax.random.normal(kk, (B, S, KH, D))
    # A "needle": a page aligned with the queries of sequence 0, so selection is not trivial.
    keys = keys.at[0, 80:96].add(3.0 * q[0].reshape(KH, G, D).mean(1)[None])
    values = jax.random.normal(kv, (B, S, KH, D))
    lengths = jnp.array([S, 137])
    return q, keys, values, lengths


def _unpacked(codes, bits):
    """A cache's channel-major packed codes [..., d * bits / 8, bs] -> token-major codes [..., bs, d]."""
    return jnp.swapaxes(ffd.unpack_codes(codes, bits, axis=-2), -1, -2)


@pytest.fixture(scope="module")
def cache(problem):
    _, keys, values, lengths = problem
    return ffd.build_cache(keys, values, lengths, page_size=BS)


@pytest.mark.parametrize("bits", [2, 4])
def test_quantizer_codes_in_range_error_bound_and_exact_residual(problem, bits):
    _, keys, values, lengths = problem
    c = ffd.build_cache(keys, values, lengths, page_size=BS, bits=bits)
    assert c.codes.shape == (B, KH, c.num_pages, D * bits // 8, BS)  # channel-major pages
    codes = _unpacked(c.codes, bits)
    assert codes.dtype == jnp.uint8 and int(codes.max()) <= 2**bits - 1
    pages = np.asarray(keys[:, : c.num_pages * BS], np.float64).reshape(B, c.num_pages, BS, KH, D)
    pages = pages.transpose(0, 3, 1, 2, 4)  # head-major [b, k, p, bs, d]
    khat = np.asarray(ffd.dequantize_pages(codes, c.scales, bits), np.float64)
    scales = np.asarray(c.scales, np.float64)[..., None, :]
    assert np.all(np.abs(pages - khat) <= scales / 2 * (1 + 1e-6))
    # float32 residual: Khat + R reproduces the keys (up to one float32 rounding).
    np.testing.assert_allclose(khat + np.asarray(c.residual), pages, atol=1e-6)
    # numpy float64 reference of the quantizer (round half to even, as np.round).
    o = (2**bits - 1) / 2
    s_ref = np.maximum(np.abs(pages).max(axis=3) / o, 1e-8)
    np.testing.assert_allclose(np.asarray(c.scales), s_ref, rtol=1e-6)
    codes_ref = np.clip(np.round(pages / np.asarray(c.scales, np.float64)[..., None, :] + o), 0, 2**bits - 1)
    assert np.mean(codes_ref == np.asarray(codes)) > 0.999  # ties decided by float32 division aside


@pytest.mark.parametrize("bits", [2, 4])
@pytest.mark.parametrize("channels", [8, 16, 128])  # packed bytes 2-64: the byte path (not a multiple of 4) and the word path
def test_pack_unpack_round_trip_and_layout(bits, channels):
    codes = jax.random.randint(jax.random.key(1), (3, 5, channels), 0, 2**bits).astype(jnp.uint8)
    packed = ffd.pack_codes(codes, bits)
    assert packed.shape == (3, 5, channels * bits // 8) and packed.dtype == jnp.uint8
    np.testing.assert_array_equal(ffd.unpack_codes(packed, bits), codes)
    np.testing.assert_array_equal(jax.jit(ffd.unpack_codes, static_argnums=1)(packed, bits), codes)
    per = 8 // bits
    expect = sum(int(codes[0, 0, i * (channels // per)]) << (bits * i) for i in range(per))  # planar layout
    assert int(packed[0, 0, 0]) == expect
    # Along another axis (the cache's channel-major pages): the same bytes, that axis packed.
    cols = ffd.pack_codes(jnp.swapaxes(codes, 1, 2), bits, axis=1)  # [3, channels * bits / 8, 5]
    np.testing.assert_array_equal(cols, jnp.swapaxes(packed, 1, 2))
    np.testing.assert_array_equal(ffd.unpack_codes(cols, bits, axis=1), jnp.swapaxes(codes, 1, 2))
    np.testing.assert_array_equal(ffd.unpack_codes(cols, bits, axis=-2), jnp.swapaxes(codes, 1, 2))


@pytest.mark.parametrize("bits", [2, 4])
def test_unpack_every_byte_value(bits):
    """Every byte value unpacks to its fields (numpy), whichever path (32-bit words or bytes) runs."""
    per = 8 // bits
    byte_values = np.arange(256, dtype=np.uint8)
    for n in (4, 2):  # word path, byte path
        packed = np.resize(byte_values, (256 // n + 1) * n).reshape(-1, n)
        want = np.concatenate([(packed >> (bits * i)) & (2**bits - 1) for i in range(per)], axis=-1)
        np.testing.assert_array_equal(ffd.unpack_codes(jnp.asarray(packed), bits), want)
    for cols in (64, 63):  # packed along the rows (axis 0): word path, byte path
        packed = np.resize(byte_values, 5 * cols).reshape(5, cols)
        rows = np.concatenate([(packed >> (bits * i)) & (2**bits - 1) for i in range(per)], axis=0)
        np.testing.assert_array_equal(ffd.unpack_codes(jnp.asarray(packed), bits, axis=0), rows)


def test_scan_score_identity(problem, cache):
    q = problem[0]
    shat = ffd.scan_scores(q, cache)
    khat = ffd.dequantize_pages(_unpacked(cache.codes, 2), cache.scales, 2)
    qg = q.reshape(B, KH, G, D)
    direct = jnp.einsum("bkgd,bkptd->bkgpt", qg, khat) * ffd.LOG2E / math.sqrt(D)
    np.testing.assert_allclose(shat, direct, rtol=1e-5, atol=1e-5)


def test_infinite_delta_equals_dense_attention(problem, cache):
    q, keys, values, lengths = problem
    out = ffd.ffd_decode(q, cache, delta=math.inf)
    np.testing.assert_allclose(out.out, ffd.dense_decode(q, keys, values, lengths), atol=1e-5)
    assert bool(jnp.all(out.keep == cache.valid_pages[:, None, :]))


def test_kept_sets_nested_in_delta_and_reference_page_kept(problem, cache):
    q = problem[0]
    previous = None
    for delta in (0.0, 1.0, 2.0, 4.0, 8.0, 16.0):
        keep, th = ffd.top_delta_keep(q, cache, delta)
        if previous is not None:
            assert bool(jnp.all(previous <= keep)), delta
        previous = keep
        # The page attaining m_ref (page 0 or the last full page) is kept for every head group.
        m = ffd.page_maxima(ffd.scan_scores(q, cache), cache)  # [b, k, g, p]
        last = np.asarray(cache.full_pages) - 1
        for b in range(B):
            for k in range(KH):
                for g in range(G):
                    ref_page = 0 if m[b, k, g, 0] >= m[b, k, g, last[b]] else last[b]
                    assert bool(keep[b, k, ref_page])
    assert float(ffd.kept_fraction(ffd.top_delta_keep(q, cache, 0.0)[0], cache)) < 1.0


def test_gqa_group_keeps_page_when_any_head_passes(problem, cache):
    q = problem[0]
    delta = 2.0
    keep, th = ffd.top_delta_keep(q, cache, delta)
    m = np.asarray(ffd.page_maxima(ffd.scan_scores(q, cache), cache))  # [b, k, g, p]
    th = np.asarray(th).reshape(B, KH, G)
    per_head = m >= th[..., None]
    np.testing.assert_array_equal(np.asarray(keep), per_head.any(axis=2) & np.asarray(cache.valid_pages)[:, None])
    # Some page is kept for a head that does not pass by itself (the group decision is visible).
    assert np.any(np.asarray(keep)[:, :, None, :] & ~per_head)


@pytest.mark.parametrize("delta", [0.5, 2.0, 5.0])
def test_dropped_mass_bound(problem, cache, delta):
    """|o - o_exact| <= 2 max|v| M_dropped / (M_kept + M_dropped), masses with exact scores."""
    q, keys, values, lengths = problem
    out = ffd.ffd_decode(q, cache, delta=delta)
    exact = ffd.dense_decode(q, keys, values, lengths)
    logits = np.einsum("bkgd,bskd->bkgs", np.asarray(q, np.float64).reshape(B, KH, G, D),
                       np.asarray(keys, np.float64)) / math.sqrt(D)
    token_page = np.arange(S) // BS
    keep = np.asarray(out.keep)
    full = np.asarray(cache.full_pages)
    for b in range(B):
        valid_tok = np.arange(S) < int(lengths[b])
        in_full = token_page < full[b]
        kept_tok = np.zeros((KH, S), bool)
        kept_tok[:, in_full] = keep[b][:, token_page[in_full]]
        kept_tok |= (~in_full & valid_tok)[None]  # the current page is always attended
        w = np.exp(logits[b] - logits[b].max(axis=-1, keepdims=True)) * valid_tok
        m_kept = (w * kept_tok[:, None]).sum(-1)
        m_drop = (w * (~kept_tok[:, None] & valid_tok)).sum(-1)
        bound = 2 * np.abs(np.asarray(values[b])).max() * m_drop / (m_kept + m_drop)
        err = np.abs(np.asarray(out.out[b]) - np.asarray(exact[b])).reshape(KH, G, D).max(-1)
        assert np.all(err <= bound + 1e-5)


def test_residual_refinement_lowers_error(problem, cache):
    q, keys, values, lengths = problem
    exact = ffd.dense_decode(q, keys, values, lengths)
    with_r = ffd.ffd_decode(q, cache, delta=math.inf, use_residual=True).out
    without = ffd.ffd_decode(q, cache, delta=math.inf, use_residual=False).out
    assert float(jnp.abs(with_r - exact).max()) < 0.1 * float(jnp.abs(without - exact).max())


def test_fp8_residual_close_to_exact(problem):
    q, keys, values, lengths = problem
    c8 = ffd.build_cache(keys, values, lengths, page_size=BS, residual_dtype=jnp.float8_e4m3fn)
    out = ffd.ffd_decode(q, c8, delta=math.inf).out
    err = float(jnp.abs(out - ffd.dense_decode(q, keys, values, lengths)).max())
    assert err < 2e-2


def test_baselines_keep_requested_page_count_and_quest_bound_is_upper(problem, cache):
    q, keys, _, _ = problem
    for fn in (ffd.top_k_keep, ffd.quest_keep):
        keep = np.asarray(fn(q, cache, 3))
        np.testing.assert_array_equal(keep.sum(-1), np.full((B, KH), 3))
        assert not np.any(keep & ~np.asarray(cache.valid_pages)[:, None])
    # Quest's bound is >= every exact token logit of the page.
    qg = np.asarray(q, np.float64).reshape(B, KH, G, D)
    mn, mx = np.asarray(cache.page_min, np.float64), np.asarray(cache.page_max, np.float64)
    upper = np.maximum(qg[:, :, :, None] * mn[:, :, None], qg[:, :, :, None] * mx[:, :, None]).sum(-1)  # bkgp
    p = cache.num_pages
    pages = np.asarray(keys[:, : p * BS], np.float64).reshape(B, p, BS, KH, D)
    exact_max = np.einsum("bkgd,bptkd->bkgpt", qg, pages).max(-1)
    assert np.all(upper >= exact_max - 1e-4)
    # The needle page of sequence 0 is found by every selector.
    assert np.all(np.asarray(ffd.quest_keep(q, cache, 1))[0, :, 5])
    assert np.all(np.asarray(ffd.top_k_keep(q, cache, 1))[0, :, 5])


def test_empty_and_short_caches_have_no_nan():
    kq, kk = jax.random.split(jax.random.key(2))
    q = jax.random.normal(kq, (3, 4, 8))
    keys = jax.random.normal(kk, (3, 40, 2, 8))
    lengths = jnp.array([0, 5, 40])  # no tokens; only a current page; full pages and a current page
    c = ffd.build_cache(keys, keys, lengths, page_size=16)
    out = ffd.ffd_decode(q, c, delta=5.0)
    assert not bool(jnp.any(jnp.isnan(out.out)))
    np.testing.assert_array_equal(out.out[0], 0.0)
    np.testing.assert_allclose(out.out[1], ffd.dense_decode(q, keys, keys, lengths)[1], atol=1e-5)


def test_delta_converter_and_bytes_model():
    assert ffd.delta_from_natural(5.0) == pytest.approx(5.0 * math.log2(math.e))
    m = ffd.modeled_bytes(batch=1, tokens=65536, kv_heads=8, head_dim=128, kept=0.05)
    # Per cached element, in bytes: 2-bit codes, 5% of (fp8 residual + bf16 V), one fp32 scale per
    # 128-token page and channel, one exact bf16 page of K and V, against 2 + 2 bytes dense.
    expect = (2 / 8 + 0.05 * 3 + 4 / 128 + 4 * 128 / 65536) / 4
    assert m["ratio"] == pytest.approx(expect, rel=1e-9)
    assert m["ratio"] < 1 / 6


def test_bad_inputs_raise(problem):
    q, keys, values, lengths = problem
    with pytest.raises(ValueError, match="bits"):
        ffd.build_cache(keys, values, lengths, bits=3)
    with pytest.raises(ValueError, match="lengths"):
        ffd.build_cache(keys, values, lengths[:1])
    c = ffd.build_cache(keys, values, lengths, page_size=BS)
    with pytest.raises(ValueError, match="delta"):
        ffd.top_delta_keep(q, c, -1.0)
    with pytest.raises(ValueError, match="multiple"):
        ffd.scan_scores(q[:, :5], c)


# --- the CPU (XLA) fast path: int8 scan with a bound, exact check of candidates, gathered attention ---


@pytest.mark.parametrize("bits", [2, 4])
def test_int8_scan_bound_holds_and_candidates_cover_the_selection(problem, bits):
    q, keys, values, lengths = problem
    c = ffd.build_cache(keys, values, lengths, page_size=BS, bits=bits)
    assert c.scan_keys.dtype == jnp.int8
    khat = np.asarray(ffd.dequantize_pages(_unpacked(c.codes, bits), c.scales, bits), np.float64)
    a = np.asarray(c.scan_scales, np.float64)[..., None, None]
    k8 = np.asarray(c.scan_keys, np.float64)
    assert np.all(np.abs(khat - a * k8) <= a / 2 * (1 + 1e-5))  # the scan keys' rounding bound
    np.testing.assert_array_equal(c.scan_l1, np.abs(k8).sum(-1).max(-1))
    m, err = ffd.int8_page_maxima(q, c)
    exact = np.asarray(ffd.page_maxima(ffd.scan_scores(q, c), c))
    fin = np.isfinite(exact)
    np.testing.assert_array_equal(np.isfinite(np.asarray(m)), fin)
    assert np.all(np.abs(np.asarray(m)[fin] - exact[fin]) <= np.asarray(err)[fin])
    for delta in (0.0, 1.0, 3.0, math.inf):
        cand, _, th_cand = ffd.scan_candidates(q, c, delta)
        keep, th = ffd.top_delta_keep(q, c, delta)
        assert not np.any(np.asarray(keep) & ~np.asarray(cand)), delta
        np.testing.assert_array_equal(np.asarray(th_cand).reshape(th.shape), th)


def _sharp_problem():
    """Non-block-multiple lengths, sink and needle pages, so few pages are kept at moderate delta."""
    kq, kk, kv = jax.random.split(jax.random.key(5), 3)
    b, s, kh, g, d, bs = 2, 300, 2, 2, 32, 16
    q = 2.0 * jax.random.normal(kq, (b, kh * g, d))
    keys = jax.random.normal(kk, (b, s, kh, d))
    u = q.reshape(b, kh, g, d).mean(2)
    keys = keys.at[:, :3].add(1.5 * u[:, None]).at[:, 150:152].add(1.2 * u[:, None])
    values = jax.random.normal(kv, (b, s, kh, d))
    lengths = jnp.array([300, 221])
    return q, ffd.build_cache(keys, values, lengths, page_size=bs, residual_dtype=jnp.bfloat16)


@pytest.mark.parametrize("delta", [2.0, 6.0, math.inf])
def test_fast_path_equals_reference_selection_and_output(delta):
    q, c = _sharp_problem()
    want = ffd.ffd_decode(q, c, delta=delta)
    n_kept = int(jnp.max(jnp.sum(want.keep, -1)))  # per KV head
    n_cand = int(jnp.max(jnp.sum(ffd.scan_candidates(q, c, delta)[0], (1, 2))))  # per sequence
    # capacity None (all pages), exactly the candidate count (sparse branch), and the per-head kept
    # count when it is smaller (the exact fallback, which keeps up to `capacity` pages per KV head).
    for cap in sorted({None, max(n_cand, 1), max(n_kept, 1)}, key=lambda x: -1 if x is None else x):
        got = jax.jit(lambda q, c: ffd.fast_ffd_decode(q, c, delta=delta, capacity=cap))(q, c)
        np.testing.assert_array_equal(got.keep, want.keep, err_msg=f"capacity {cap}")
        np.testing.assert_allclose(got.out, want.out, atol=1e-5, err_msg=f"capacity {cap}")
        np.testing.assert_allclose(got.lse, want.lse, atol=1e-5, err_msg=f"capacity {cap}")
        np.testing.assert_array_equal(got.overflow, 0)
    if math.isfinite(delta):
        assert n_kept < c.num_pages  # the selection is not trivial


def test_fast_path_overflow_and_cache_without_scan_keys():
    q, c = _sharp_problem()
    want = ffd.ffd_decode(q, c, delta=math.inf)
    got = ffd.fast_ffd_decode(q, c, delta=math.inf, capacity=3)  # more kept pages than capacity
    np.testing.assert_array_equal(got.overflow, np.sum(want.keep, -1) - 3)
    assert np.all(np.sum(got.keep, -1) == 3) and not np.any(got.keep & ~want.keep)
    # fallback_capacity = every page: the same overflowing step keeps FFD's selection (a bfloat16 residual).
    full = ffd.fast_ffd_decode(q, c, delta=math.inf, capacity=3, fallback_capacity=c.num_pages)
    np.testing.assert_array_equal(full.keep, want.keep)
    np.testing.assert_array_equal(full.overflow, 0)
    np.testing.assert_allclose(full.out, want.out, atol=1e-5)
    with pytest.raises(ValueError, match="fallback_capacity must be a positive int"):
        ffd.fast_ffd_decode(q, c, fallback_capacity=0)
    bare = c._replace(scan_keys=None)  # the exact chunked scan only
    out = ffd.fast_ffd_decode(q, bare, delta=2.0)
    np.testing.assert_allclose(out.out, ffd.ffd_decode(q, c, delta=2.0).out, atol=1e-5)
    _, keys, values, lengths = (None,) + _sharp_inputs()
    assert ffd.build_cache(keys, values, lengths, page_size=16, scan_keys=False).scan_keys is None
    with pytest.raises(ValueError, match="scan_keys"):
        ffd.int8_page_maxima(q, bare)


@pytest.mark.parametrize("group", [1, 2])  # one query head per KV head: the int8 scan's padded product
@pytest.mark.parametrize("delta", [2.0, 6.0, math.inf])
def test_fast_path_with_exact_keys_equals_reference(group, delta):
    """Given the pages' exact keys, the overflow fallback scores every page as q.K - q.R and keeps FFD's
    selection and output at any capacity (capacity 1 forces it; the candidate count takes the sparse branch)."""
    kq, kk, kv = jax.random.split(jax.random.key(7), 3)
    b, s, kh, d, bs = 2, 300, 2, 32, 16
    q = 2.0 * jax.random.normal(kq, (b, kh * group, d))
    keys = jax.random.normal(kk, (b, s, kh, d))
    u = q.reshape(b, kh, group, d).mean(2)
    keys = keys.at[:, :3].add(1.5 * u[:, None]).at[:, 150:152].add(1.2 * u[:, None])
    values, lengths = jax.random.normal(kv, (b, s, kh, d)), jnp.array([300, 221])
    c = ffd.build_cache(keys, values, lengths, page_size=bs)
    pages = ffd.head_major_pages(keys, bs)
    want = ffd.ffd_decode(q, c, delta=delta)
    th = ffd.reference_threshold(q, c, delta)
    m, err = ffd.int8_page_maxima(q, c)
    n_cand = int(jnp.max(jnp.sum(ffd.scan_candidates(q, c, delta)[0], (1, 2))))
    lower = jnp.any(m - err >= th[..., None], axis=2)
    n_open = int(jnp.max(jnp.sum(jnp.any(m + err >= th[..., None], axis=2) & ~lower & c.valid_pages[:, None], (1, 2))))
    # capacity 1 (every page's exact scan unless at most one page is left open by the int8 bounds), the
    # open count (those exactly scanned, the rest settled by the bounds), the candidate count (gathered path)
    for cap in sorted({1, max(n_open, 1), max(n_cand, 1)}):
        got = jax.jit(lambda q, c, k: ffd.fast_ffd_decode(q, c, delta=delta, capacity=cap, keys=k))(q, c, pages)
        np.testing.assert_array_equal(got.keep, want.keep, err_msg=f"capacity {cap}")
        np.testing.assert_allclose(got.out, want.out, atol=1e-5, err_msg=f"capacity {cap}")
        np.testing.assert_allclose(got.lse, want.lse, atol=1e-5, err_msg=f"capacity {cap}")
        np.testing.assert_array_equal(got.overflow, 0)
    # past `capacity` open pages, every page's exact scan from the keys (the int8 bounds here leave at most
    # one open, so that branch is called directly)
    every = ffd._exact_keys_decode(q, c, pages, th)
    np.testing.assert_array_equal(every.keep, want.keep)
    np.testing.assert_allclose(every.out, want.out, atol=1e-5)
    if math.isfinite(delta):  # the fallback and the gathered path both ran; the selection is not trivial
        assert n_open < n_cand and 1 < n_cand and int(jnp.max(jnp.sum(want.keep, -1))) < c.num_pages
    with pytest.raises(ValueError, match="float32 residual"):
        ffd.fast_ffd_decode(q, c._replace(residual=c.residual.astype(jnp.bfloat16)), keys=pages)
    with pytest.raises(ValueError, match="keys must have"):
        ffd.fast_ffd_decode(q, c, keys=pages[:, :, 1:])


def _sharp_inputs():
    kk, kv = jax.random.split(jax.random.key(6))
    return jax.random.normal(kk, (1, 40, 1, 8)), jax.random.normal(kv, (1, 40, 1, 8)), jnp.array([37])


def test_a_cache_shorter_than_one_page_attends_exactly_to_its_current_page():
    """No full page (p = 0): no reference page, nothing to select; every path is exact dense attention."""
    from pallas_kernels.ffd_decode import ffd_decode as kernel_ffd
    from primitives import attention

    kk, kv, kq = jax.random.split(jax.random.key(5), 3)
    keys, values = jax.random.normal(kk, (2, 100, 2, 128)), jax.random.normal(kv, (2, 100, 2, 128))
    lengths, q = jnp.array([100, 37]), jax.random.normal(kq, (2, 4, 128))
    cache = ffd.build_cache(keys, values, lengths, page_size=128)
    assert cache.num_pages == 0
    assert bool(jnp.all(ffd.reference_threshold(q, cache, 5.0) == -jnp.inf))
    want = attention.decode_attention(q, keys, values, lengths)
    for out in (ffd.ffd_decode(q, cache).out, ffd.fast_ffd_decode(q, cache).out, kernel_ffd(q, cache).out):
        np.testing.assert_allclose(out, want, atol=1e-5)


def _valid_pages_equal(got: ffd.FFDCache, want: ffd.FFDCache):
    """Every field of the valid (full) pages and the current page equal (integers exactly, floats to
    float32 rounding: XLA may compute a division as a product with the reciprocal in one and not the other)."""
    full = np.asarray(want.full_pages)
    for name in ("codes", "scales", "residual", "page_min", "page_max", "scan_keys", "scan_scales", "scan_l1",
                 "values"):
        g, w = getattr(got, name), getattr(want, name)
        assert (g is None) == (w is None), name
        for row, n in enumerate(full):
            if g is not None:
                np.testing.assert_allclose(np.asarray(g[row, :, :n], np.float32), np.asarray(w[row, :, :n], np.float32),
                                           rtol=1e-6, atol=0, err_msg=name)
    for name in ("current_keys", "current_values", "lengths"):
        np.testing.assert_array_equal(np.asarray(getattr(got, name)), np.asarray(getattr(want, name)), err_msg=name)


@pytest.mark.parametrize("layout,bits,residual_dtype", [("bskd", 2, jnp.float32), ("bksd", 4, jnp.bfloat16),
                                                        ("bksd", 2, jnp.float8_e4m3fn)])
def test_incremental_pages_equal_a_rebuild_through_appends_and_rollback(layout, bits, residual_dtype):
    """update_pages after each append (padded prefill, one-token steps across page ends, wide appends,
    a rollback re-filled with other tokens) leaves paged_cache equal to build_cache of the dense cache."""
    b, s, kh, d, bs = 2, 45, 2, 8, 4  # 11 page slots; s not a multiple of bs
    keys = jnp.zeros((b, s, kh, d) if layout == "bskd" else (b, kh, s, d))
    values = jnp.zeros_like(keys)
    pages = ffd.init_pages(b, kh, s, d, page_size=bs, bits=bits, residual_dtype=residual_dtype)
    lengths = jnp.zeros((b,), jnp.int32)
    rng = np.random.default_rng(0)
    # (tokens written, valid tokens per row): a right-padded prefill, steps, verification-style appends
    # (row 0 goes 10 -> 16: two pages completed by 6 tokens, the most a window of 6 // 4 + 1 holds).
    appends = [(7, [5, 7]), (1, [1, 1]), (1, [1, 1]), (1, [1, 1]), (6, [6, 2]), ("rollback", [10, 12]), (6, [6, 6]),
               (12, [12, 12]), (1, [1, 1]), (16, [16, 14])]
    for width, valid in appends:
        if width == "rollback":
            lengths = jnp.minimum(lengths, jnp.asarray(valid, jnp.int32))
            continue
        new_k = jnp.asarray(rng.normal(size=(b, width, kh, d)), jnp.float32)
        new_v = jnp.asarray(rng.normal(size=(b, width, kh, d)), jnp.float32)
        keys = write_tokens(keys, new_k, lengths, layout=layout)
        values = write_tokens(values, new_v, lengths, layout=layout)
        new_lengths = lengths + jnp.asarray(valid, jnp.int32)
        pages = jax.jit(ffd.update_pages, static_argnames=("max_new_tokens", "layout"))(
            pages, keys, lengths, new_lengths, max_new_tokens=width, layout=layout)
        lengths = new_lengths
        want = ffd.build_cache(keys, values, lengths, page_size=bs, bits=bits, residual_dtype=residual_dtype,
                               layout=layout)
        _valid_pages_equal(ffd.paged_cache(pages, keys, values, lengths, layout=layout), want)
    assert int(lengths.max()) == s  # the last append ran into the capacity (its window's last slot dropped)


def test_paged_cache_and_update_pages_reject_mismatched_pages():
    pages = ffd.init_pages(1, 2, 32, 8, page_size=8)
    keys = jnp.zeros((1, 32, 3, 8))  # 3 KV heads, pages have 2
    with pytest.raises(ValueError, match="do not match"):
        ffd.paged_cache(pages, keys, keys, jnp.array([4]))
    with pytest.raises(ValueError, match="do not match"):
        ffd.update_pages(pages, keys, jnp.array([0]), jnp.array([4]), max_new_tokens=4)
    with pytest.raises(ValueError, match="max_new_tokens"):
        ffd.update_pages(pages, jnp.zeros((1, 32, 2, 8)), jnp.array([0]), jnp.array([4]), max_new_tokens=0)
    with pytest.raises(ValueError, match="residual_dtype"):
        ffd.init_pages(1, 2, 32, 8, page_size=8, residual_dtype=jnp.int8)
