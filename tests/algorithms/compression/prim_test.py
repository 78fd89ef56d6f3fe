"""PRIM (reconstructed) token compression: budgets, exactness of the pruned forward against the full model
with the dropped tokens masked out (through the LM's `attention_bias` hook), keep-all == unpruned, the
frequency scores against a float64 DFT, cumulative-mass retention against brute force, FLOPs by hand,
fusion, token merging (identity, hand-computed weighted average), the pyramid schedule and the epsilon
rule (per-stage counts and kept sets against an eager float64 re-implementation on the full-length
masked model; epsilon counts against subset enumeration), and bad input."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from algorithms.compression import prim
from experiments.tasks import scenes as sc
from models.transformer import TransformerConfig
from models.vit import ViTConfig
from models.vlm import VLM, VLMConfig

TOK = sc.make_tokenizer()
IMG, AUD = TOK.encode(sc.IMAGE_TOKEN)[0], TOK.encode(sc.AUDIO_TOKEN)[0]
N_V, N_A = 16, 9  # 24 x 24 images in patches of 6; one audio frame per cell


def _model(layers=2, seed=0):
    lm = TransformerConfig(vocab_size=TOK.vocab_size, d_model=16, num_layers=layers, num_heads=4, num_kv_heads=2,
                           d_ff=32)
    vit = ViTConfig(image_size=24, patch_size=6, channels=3, num_classes=1, d_model=8, num_heads=2, d_ff=16,
                    num_layers=1, pooling="mean")
    cfg = VLMConfig(lm=lm, vit=vit, image_token_id=IMG, audio_token_id=AUD, audio_frames=9, audio_frame_len=16)
    # random weights drawn in numpy (no init compile; the tests need some model, not a trained one)
    graphdef, abstract = nnx.split(nnx.eval_shape(lambda: VLM(cfg, rngs=nnx.Rngs(seed))))
    rng = np.random.default_rng(seed)

    def draw(a):
        if len(a.shape) >= 2:
            return jnp.asarray(rng.normal(size=a.shape) / np.sqrt(a.shape[0]), a.dtype)
        return jnp.asarray(1.0 + 0.1 * rng.normal(size=a.shape), a.dtype)

    return nnx.merge(graphdef, jax.tree.map(draw, abstract))


_JIT = {}


def _fwd(m, plan, layout, qpos, in_lm=None):
    """`prim.pruned_forward`, jitted once per stage (one compile per shape instead of many eager ops)."""
    graphdef, state = nnx.split(m)
    key = ("fwd", in_lm, m.config.lm.num_layers)
    if key not in _JIT:
        _JIT[key] = jax.jit(lambda st, keep, x, q: prim.pruned_forward(
            nnx.merge(graphdef, st), prim.Plan(keep, x), layout, q, in_lm=in_lm))
    return _JIT[key](state, plan.keep, plan.x, qpos)


def _plan(m, x, layout, fraction, qmask, config=prim.PRIMConfig(), align=None):
    graphdef, state = nnx.split(m)
    key = ("plan", fraction, config, align is None, m.config.lm.num_layers)
    if key not in _JIT:
        _JIT[key] = jax.jit(lambda st, x, qm: prim.prim_plan(nnx.merge(graphdef, st), x, layout, fraction, qm,
                                                             config=config, align=align))
    return _JIT[key](state, x, qmask)


@pytest.fixture(scope="module")
def setup():
    m = _model()
    b = sc.make_batch(4, seed=0, image_tokens=N_V, audio_tokens=N_A, kinds=("count", "audio_visual", "compose"))
    pl = b["prompt_lengths"]
    T = int(pl.max())
    pos = np.arange(T)[None]
    tokens = jnp.asarray(np.where(pos < pl[:, None], b["tokens"][:, :T], TOK.pad_id))
    images, audio = jnp.asarray(b["images"])[:, None], jnp.asarray(b["audio"])[:, None]
    layout = prim.layout_from_tokens(tokens, image_token_id=IMG, audio_token_id=AUD)
    qmask = jnp.asarray((layout.modality[None] == prim.TEXT) & (pos >= 1) & (pos < pl[:, None]))
    x, logits = nnx.jit(lambda m, t, i, a: (m.embed(t, i, a), m(t, images=i, audio=a).logits))(m, tokens, images, audio)
    qpos = jnp.asarray(pl - 1)
    full = logits[jnp.arange(4), qpos]
    return dict(m=m, tokens=tokens, layout=layout, qmask=qmask, x=x, qpos=qpos, full=full)


def _masked_reference(m, tokens, x, qpos, keep_pre, keep_late=None, late_from=0):
    """The full-length LM with the dropped tokens' keys masked out (positions unchanged): keys outside
    keep_pre [b, t] bool in every layer, and outside keep_late in layers > late_from."""
    graphdef, state = nnx.split(m.lm)
    keep_late = keep_pre if keep_late is None else keep_late
    if ("ref", late_from) not in _JIT:
        def run(st, tokens, x, kp, kl):
            def bias(layer, q, k):
                keep = kp if layer <= late_from else kl
                return jnp.where(keep, 0.0, -1e9)[:, None, None, :] * jnp.ones((1, q.shape[2], q.shape[1], 1))
            return nnx.merge(graphdef, st)(tokens, input_embeddings=x, attention_bias=bias).logits
        _JIT["ref", late_from] = jax.jit(run)
    return _JIT["ref", late_from](state, tokens, x, keep_pre, keep_late)[jnp.arange(tokens.shape[0]), qpos]


def _mask_of(keep_idx, t):
    keep_idx = np.asarray(keep_idx)
    mask = np.zeros((keep_idx.shape[0], t), bool)
    np.put_along_axis(mask, keep_idx, True, axis=1)
    return jnp.asarray(mask)


# ------------------------------------------------------------------ budgets


@pytest.mark.parametrize("fraction", [0.2])
def test_plans_keep_exactly_the_budget_per_row_with_original_positions(setup, fraction):
    s = setup
    layout = s["layout"]
    B = prim.budget_count(fraction, N_V + N_A)
    assert B == max(1, round(fraction * 25))
    n_text = int(np.sum(layout.modality == prim.TEXT))
    for plan in (_plan(s["m"], s["x"], layout, fraction, s["qmask"]), prim.uniform_plan(s["x"], layout, fraction)):
        keep = np.asarray(plan.keep)
        assert keep.shape == (4, n_text + B)
        assert np.all(np.diff(keep, axis=1) > 0)  # ascending: relative order preserved, no duplicates
        mod = layout.modality[keep]
        np.testing.assert_array_equal((mod != prim.TEXT).sum(1), B)
        assert np.all(np.isin(np.flatnonzero(layout.modality == prim.TEXT), keep))  # every text token kept
        out = _fwd(s["m"], plan, layout, s["qpos"])
        np.testing.assert_array_equal(np.asarray(out.av_per_layer), B)
        np.testing.assert_array_equal(np.asarray(out.final_keep).sum(1), n_text + B)
    # FastV: all AV tokens in layers 0..K, exactly B after
    out = _fwd(s["m"], prim.full_plan(s["x"], layout), layout, s["qpos"], prim.InLMPrune(kind="fastv", layer=0, keep=B))
    np.testing.assert_array_equal(np.asarray(out.av_per_layer), [[25, B]] * 4)


def test_modality_budgets_sum_and_bounds():
    mv = jnp.array([1.0, 0.0, 0.5, 0.9, 0.2])
    ma = jnp.array([0.0, 1.0, 0.5, 0.1, 0.8])
    for B in (1, 2, 5, 11, 25):
        bv, ba = prim.modality_budgets(mv, ma, B, N_V, N_A, min_per_modality=2)
        bv, ba = np.asarray(bv), np.asarray(ba)
        np.testing.assert_array_equal(bv + ba, B)
        assert np.all((bv >= 0) & (bv <= N_V) & (ba >= 0) & (ba <= N_A))
        if B >= 4:
            assert np.all(bv >= 2) and np.all(ba >= 2)
    bv, ba = prim.modality_budgets(jnp.array([0.5]), jnp.array([0.5]), 10, N_V, N_A)
    assert (int(bv[0]), int(ba[0])) == (5, 5)
    bv, _ = prim.modality_budgets(jnp.array([0.9]), jnp.array([0.1]), 10, N_V, N_A, min_per_modality=1)
    assert int(bv[0]) == 9


def test_adaptive_retention_counts_between_bounds_and_attends_only_kept(setup):
    s = setup
    m, layout = s["m"], s["layout"]
    plan = _plan(m, s["x"], layout, 0.5, s["qmask"])
    B = prim.budget_count(0.5, 25)
    stage = prim.InLMPrune(kind="adaptive", layer=0, mass=0.6, r_min=0.25, r_max=0.75)
    out = _fwd(m, plan, layout, s["qpos"], stage)
    last = np.asarray(out.av_per_layer)[:, -1]
    assert np.all(last >= math.ceil(0.25 * B)) and np.all(last <= math.ceil(0.75 * B))
    fk = np.asarray(out.final_keep)
    np.testing.assert_array_equal((fk & (layout.modality != prim.TEXT)[None]).sum(1), last)
    # the padded rows compute exactly what their own kept set defines
    ref = _masked_reference(m, s["tokens"], plan.x, s["qpos"], _mask_of(plan.keep, s["tokens"].shape[1]),
                            jnp.asarray(fk), late_from=0)
    np.testing.assert_allclose(out.logits, ref, rtol=2e-4, atol=2e-4)


# ------------------------------------------------------------------ exactness


def test_keep_all_equals_unpruned_model(setup):
    s = setup
    m, layout, x, qpos = s["m"], s["layout"], s["x"], s["qpos"]
    pre = prim.PRIMConfig(relevance="embed")
    for plan in (prim.full_plan(x, layout), prim.uniform_plan(x, layout, 1.0),
                 _plan(m, x, layout, 1.0, s["qmask"]), _plan(m, x, layout, 1.0, s["qmask"], config=pre)):
        np.testing.assert_array_equal(plan.keep, np.arange(x.shape[1])[None].repeat(4, 0))
    out = _fwd(m, prim.full_plan(x, layout), layout, qpos)
    np.testing.assert_allclose(out.logits, s["full"], rtol=1e-5, atol=1e-5)
    out = _fwd(m, prim.full_plan(x, layout), layout, qpos, prim.InLMPrune(kind="fastv", layer=0, keep=25))
    np.testing.assert_allclose(out.logits, s["full"], rtol=1e-5, atol=1e-5)
    out = _fwd(m, prim.full_plan(x, layout), layout, qpos,
               prim.InLMPrune(kind="adaptive", layer=0, mass=1.0, r_min=1.0, r_max=1.0))
    np.testing.assert_allclose(out.logits, s["full"], rtol=1e-5, atol=1e-5)


def test_pre_lm_pruning_equals_full_model_with_dropped_tokens_masked(setup):
    s = setup
    m, layout, t = s["m"], s["layout"], s["tokens"].shape[1]
    fraction = 0.2
    fused = prim.PRIMConfig(fusion_gamma=0.5, freq_weight=0.7, video_window=4, audio_window=3)
    merged = prim.PRIMConfig(merge="similarity")
    align = (np.arange(16)[:, None] // 2 % 9) == np.arange(9)[None]
    for plan in (_plan(m, s["x"], layout, fraction, s["qmask"]), prim.uniform_plan(s["x"], layout, fraction),
                 _plan(m, s["x"], layout, fraction, s["qmask"], config=fused, align=align),
                 _plan(m, s["x"], layout, fraction, s["qmask"], config=merged)):
        out = _fwd(m, plan, layout, s["qpos"])
        ref = _masked_reference(m, s["tokens"], plan.x, s["qpos"], _mask_of(plan.keep, t))
        np.testing.assert_allclose(out.logits, ref, rtol=2e-4, atol=2e-4)
        assert float(jnp.abs(out.logits - s["full"]).max()) > 1e-4  # pruning changed something


def test_fastv_keeps_the_most_attended_tokens_and_equals_masked_model(setup):
    s = setup
    m, layout, x, qpos, tokens = s["m"], s["layout"], s["x"], s["qpos"], s["tokens"]
    K, B = 0, 5
    out = _fwd(m, prim.full_plan(x, layout), layout, qpos, prim.InLMPrune(kind="fastv", layer=K, keep=B))
    fk = np.asarray(out.final_keep)
    # the layer-K attention row of the query, from the q/k the model itself hands to the bias hook
    seen = {}

    def capture(layer, q, k):
        if layer == K:
            seen["q"], seen["k"] = np.asarray(q, np.float64), np.asarray(k, np.float64)
        return jnp.zeros((q.shape[0], q.shape[2], q.shape[1], k.shape[1]))

    m.lm(tokens, input_embeddings=x, attention_bias=capture)
    q = seen["q"]
    k = np.repeat(seen["k"], q.shape[2] // seen["k"].shape[2], axis=2)
    av = np.flatnonzero(layout.modality != prim.TEXT)
    for i in range(4):
        qi = q[i, int(qpos[i])]  # [h, d]
        sc_ = np.einsum("hd,shd->hs", qi, k[i]) / math.sqrt(q.shape[-1])
        sc_[:, int(qpos[i]) + 1:] = -np.inf
        p = np.exp(sc_ - sc_.max(1, keepdims=True))
        p = (p / p.sum(1, keepdims=True)).mean(0)
        top = av[np.argsort(-p[av], kind="stable")[:B]]
        np.testing.assert_array_equal(np.sort(np.flatnonzero(fk[i] & (layout.modality != prim.TEXT))), np.sort(top))
    ref = _masked_reference(m, tokens, x, qpos, jnp.ones(fk.shape, bool), jnp.asarray(fk), late_from=K)
    np.testing.assert_allclose(out.logits, ref, rtol=2e-4, atol=2e-4)


# ------------------------------------------------------------------ scores


def _freq_reference(x, window, cutoff):
    x = np.asarray(x, np.float64)
    b, n, D = x.shape
    out = np.zeros((b, n))
    for start in range(0, n, window):
        seg = x[:, start:start + window]
        w = seg.shape[1]
        j = np.arange(w)
        F = np.exp(-2j * np.pi * np.outer(j, j) / w)  # DFT matrix
        X = np.einsum("kj,bjd->bkd", F, seg)
        keep = np.array([min(k, w - k) >= cutoff for k in range(w)])
        y = np.einsum("jk,bkd->bjd", np.conj(F)[:, keep], X[:, keep]) / w
        assert np.abs(y.imag).max() < 1e-9
        out[:, start:start + w] = (y.real ** 2).sum(-1)
    return out


@pytest.mark.parametrize("window,cutoff", [(4, 1), (5, 2), (3, 1), (1, 1), (7, 4)])
def test_frequency_scores_match_float64_dft(window, cutoff):
    x = np.random.default_rng(0).normal(size=(2, 11, 3)).astype(np.float32)
    got = prim.frequency_scores(jnp.asarray(x), window=window, cutoff=cutoff)
    np.testing.assert_allclose(got, _freq_reference(x, window, cutoff), rtol=1e-4, atol=1e-5)
    if cutoff == 1:  # DC removal: distance to the window mean
        means = np.concatenate([np.repeat(x[:, s:s + window].mean(1, keepdims=True), x[:, s:s + window].shape[1], 1)
                                for s in range(0, 11, window)], axis=1)
        np.testing.assert_allclose(got, ((x - means) ** 2).sum(-1), rtol=1e-4, atol=1e-5)
    static = np.repeat(x[:, :1], 11, axis=1)  # a static sequence has all its energy at DC
    np.testing.assert_allclose(prim.frequency_scores(jnp.asarray(static), window=window, cutoff=cutoff), 0.0, atol=1e-5)


def test_cumulative_mass_count_is_minimal_and_monotone():
    rng = np.random.default_rng(1)
    probs = rng.dirichlet(np.ones(8) * 0.5, size=6)
    valid = rng.random((6, 8)) < 0.8
    valid[:, 0] = True
    prev = np.zeros(6, int)
    for p in (0.1, 0.3, 0.5, 0.7, 0.9, 1.0):
        got = np.asarray(prim.cumulative_mass_count(jnp.asarray(probs), jnp.asarray(valid), mass=p, lo=1, hi=8))
        for i in range(6):
            v = np.sort(np.where(valid[i], probs[i], 0.0) / np.where(valid[i], probs[i], 0.0).sum())[::-1]
            want = next(k for k in range(1, 9) if v[:k].sum() >= p - 1e-6)
            assert got[i] == want
        assert np.all(got >= prev)
        prev = got
    clipped = prim.cumulative_mass_count(jnp.asarray(probs), jnp.asarray(valid), mass=0.99, lo=2, hi=3)
    assert np.all((np.asarray(clipped) >= 2) & (np.asarray(clipped) <= 3))


def test_text_relevance_rows_sum_to_one_and_match_numpy():
    rng = np.random.default_rng(2)
    q, k = rng.normal(size=(2, 3, 2, 4)), rng.normal(size=(2, 5, 2, 4))
    qm = np.array([[True, True, False], [True, False, False]])
    got = np.asarray(prim.text_relevance(jnp.asarray(q, jnp.float32), jnp.asarray(qm), jnp.asarray(k, jnp.float32)))
    s = np.einsum("bqhd,bnhd->bqhn", q, k) / 2.0
    p = np.exp(s - s.max(-1, keepdims=True))
    p = (p / p.sum(-1, keepdims=True)).mean(2)
    want = np.stack([p[i][qm[i]].mean(0) for i in range(2)])
    np.testing.assert_allclose(got, want, rtol=1e-5)
    np.testing.assert_allclose(got.sum(-1), 1.0, rtol=1e-5)


def test_fusion_identity_at_zero_and_numpy_reference():
    rng = np.random.default_rng(3)
    v, a = rng.normal(size=(2, 4, 3)), rng.normal(size=(2, 2, 3))
    align = np.array([[1, 0], [1, 0], [0, 1], [0, 0]], bool)  # token 3 has no partner
    rv, ra = rng.dirichlet(np.ones(4), 2), rng.dirichlet(np.ones(2), 2)
    f32 = lambda z: jnp.asarray(z, jnp.float32)  # noqa: E731
    v0, a0 = prim.fuse_audio_visual(f32(v), f32(a), align, f32(rv), f32(ra), gamma=0.0)
    np.testing.assert_array_equal(v0, f32(v))
    np.testing.assert_array_equal(a0, f32(a))
    v2, a2 = prim.fuse_audio_visual(f32(v), f32(a), align, f32(rv), f32(ra), gamma=0.5)
    wv, wa = v.copy(), a.copy()
    for bi in range(2):
        for i in range(4):
            js = np.flatnonzero(align[i])
            if len(js):
                lg = v[bi, i] @ a[bi, js].T / np.sqrt(3) + np.log(ra[bi, js])
                w = np.exp(lg - lg.max()); w /= w.sum()
                wv[bi, i] += 0.5 * w @ a[bi, js]
        for j in range(2):
            is_ = np.flatnonzero(align[:, j])
            lg = a[bi, j] @ v[bi, is_].T / np.sqrt(3) + np.log(rv[bi, is_])
            w = np.exp(lg - lg.max()); w /= w.sum()
            wa[bi, j] += 0.5 * w @ v[bi, is_]
    np.testing.assert_allclose(v2, wv, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(a2, wa, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(v2[:, 3], v[:, 3], rtol=1e-6)


# ------------------------------------------------------------------ FLOPs


def test_modeled_flops_hand_count():
    cfg = TransformerConfig(vocab_size=10, d_model=8, num_layers=3, num_heads=2, num_kv_heads=1, d_ff=16)
    # per token per layer: q 8x2x4, k 8x1x4, v 8x1x4, o 2x4x8 = 64+32+32+64 = 192 MACs; FFN 3x8x16 = 384 MACs
    w = 2 * (192 + 384)
    N = [5, 5, 3]
    hd = 2 * 4
    want = sum(n * (w + 4 * n * hd) for n in N) + 2 * 8 * 10
    assert prim.modeled_flops(cfg, N) == pytest.approx(want)
    assert prim.modeled_flops(cfg, N, overhead=7.0) == pytest.approx(want + 7)
    # consistency with flops_per_token (3x forward, logits of every token; here of one row only)
    assert prim.modeled_flops(cfg, [6, 6, 6]) + 5 * 2 * 8 * 10 == pytest.approx(6 * cfg.flops_per_token(6) / 3)
    # scoring: layer-0 relevance with 2 queries and 5 keys; one in-LM row over 9 keys
    rel = 2 * 8 * 4 * (2 * 2 + 1 * 5) + 2 * 2 * 4 * 2 * 5
    assert prim.scoring_flops(cfg, relevance_queries=2, relevance_keys=5) == pytest.approx(rel)
    assert prim.scoring_flops(cfg, in_lm_keys=9) == pytest.approx(2 * 8 * 2 * 4 + 2 * 2 * 4 * 9)


# ------------------------------------------------------------------ bad input


def test_bad_input_raises_naming_the_argument(setup):
    s = setup
    for f in (0.0, -0.5, 1.5, float("nan")):
        with pytest.raises(ValueError, match="fraction"):
            prim.budget_count(f, 10)
        with pytest.raises(ValueError, match="fraction"):
            prim.prim_plan(s["m"], s["x"], s["layout"], f, s["qmask"])
        with pytest.raises(ValueError, match="fraction"):
            prim.uniform_plan(s["x"], s["layout"], f)
    with pytest.raises(ValueError, match="x"):
        prim.prim_plan(s["m"], s["x"][:, :-1], s["layout"], 0.5, s["qmask"])
    with pytest.raises(ValueError, match="query_mask"):
        prim.prim_plan(s["m"], s["x"], s["layout"], 0.5, s["qmask"][:, :-1])
    with pytest.raises(ValueError, match="query_pos"):
        prim.pruned_forward(s["m"], prim.full_plan(s["x"], s["layout"]), s["layout"], s["qpos"][:2])
    with pytest.raises(ValueError, match="in_lm.layer"):
        prim.pruned_forward(s["m"], prim.full_plan(s["x"], s["layout"]), s["layout"], s["qpos"],
                            in_lm=prim.InLMPrune(kind="fastv", layer=1, keep=3))
    with pytest.raises(ValueError, match="in_lm"):
        prim.pruned_forward(s["m"], prim.full_plan(s["x"], s["layout"]), s["layout"], s["qpos"],
                            in_lm=(prim.InLMPrune(kind="fastv", layer=0, keep=3),
                                   prim.InLMPrune(kind="fastv", layer=0, keep=2)))
    with pytest.raises(ValueError, match="x"):
        prim.frequency_scores(jnp.ones((3, 4)), window=2)
    with pytest.raises(ValueError, match="window"):
        prim.frequency_scores(jnp.ones((1, 3, 4)), window=0)
    with pytest.raises(ValueError, match="budget"):
        prim.modality_budgets(jnp.ones(2), jnp.ones(2), 26, N_V, N_A)
    with pytest.raises(ValueError, match="mass"):
        prim.InLMPrune(kind="adaptive", layer=0, mass=0.0)
    with pytest.raises(ValueError, match="r_min"):
        prim.InLMPrune(kind="adaptive", layer=0, r_min=0.8, r_max=0.5)
    with pytest.raises(ValueError, match="q_mask"):
        prim.text_relevance(jnp.ones((1, 2, 1, 4)), jnp.ones((1, 3), bool), jnp.ones((1, 5, 1, 4)))
    with pytest.raises(ValueError, match="align"):
        prim.fuse_audio_visual(jnp.ones((1, 4, 3)), jnp.ones((1, 2, 3)), np.ones((2, 4), bool), jnp.ones((1, 4)),
                               jnp.ones((1, 2)), gamma=0.1)
    with pytest.raises(ValueError, match="tokens"):
        prim.layout_from_tokens(np.array([[IMG, 5], [5, IMG]]), image_token_id=IMG, audio_token_id=AUD)
    with pytest.raises(ValueError, match="tokens_per_layer"):
        prim.modeled_flops(s["m"].config.lm, [1, 2, 3])


# ------------------------------------------------------------------ merging


def test_merge_keep_all_is_identity_and_matches_hand_computed_average(setup):
    s = setup
    m, layout, x = s["m"], s["layout"], s["x"]
    for mode in ("similarity", "mean"):
        plan = _plan(m, x, layout, 1.0, s["qmask"], config=prim.PRIMConfig(merge=mode))
        np.testing.assert_array_equal(plan.x, x)  # nothing pruned -> nothing merged
        xx = jnp.asarray(np.random.default_rng(4).normal(size=(2, 5, 3)), jnp.float32)
        np.testing.assert_array_equal(prim.merge_pruned(xx, jnp.ones((2, 5), bool), weights=mode), xx)
    # kept x0 = (1, 0), x2 = (0, 1); pruned x1 = (2, 1): cos 2/sqrt5 to x0, 1/sqrt5 to x2 -> into x0;
    # pruned x3 = (-2, 1): cos -2/sqrt5 to x0, 1/sqrt5 to x2 -> into x2; pruned x4 = (-1, -1): negative to both
    # -> into x0 (argmax -1/sqrt2 > ... tie broken by the lower index) with weight max(cos, 0) = 0.
    x = np.array([[[1.0, 0.0], [2.0, 1.0], [0.0, 1.0], [-2.0, 1.0], [-1.0, -1.0]]])
    keep = np.array([[True, False, True, False, False]])
    r5 = np.sqrt(5.0)
    want = x.copy()
    want[0, 0] = (x[0, 0] + 2 / r5 * x[0, 1]) / (1 + 2 / r5)
    want[0, 2] = (x[0, 2] + 1 / r5 * x[0, 3]) / (1 + 1 / r5)
    got = prim.merge_pruned(jnp.asarray(x, jnp.float32), jnp.asarray(keep))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    mean = x.copy()  # "mean": the plain group means {0, 1, 4} and {2, 3}
    mean[0, 0] = x[0, [0, 1, 4]].mean(0)
    mean[0, 2] = x[0, [2, 3]].mean(0)
    got = prim.merge_pruned(jnp.asarray(x, jnp.float32), jnp.asarray(keep), weights="mean")
    np.testing.assert_allclose(got, mean, rtol=1e-6, atol=1e-6)


def test_merge_changes_only_kept_tokens_of_each_modality(setup):
    s = setup
    m, layout, x = s["m"], s["layout"], s["x"]
    drop = _plan(m, x, layout, 0.3, s["qmask"])
    merged = _plan(m, x, layout, 0.3, s["qmask"], config=prim.PRIMConfig(merge="mean"))
    np.testing.assert_array_equal(drop.keep, merged.keep)  # merging never changes the selection or the budget
    keep_mask = np.asarray(_mask_of(drop.keep, x.shape[1]))
    diff = np.abs(np.asarray(merged.x) - np.asarray(x)).max(-1) > 0
    assert not np.any(diff & ~keep_mask) and np.any(diff)
    np.testing.assert_array_equal(np.asarray(merged.x)[:, layout.modality == prim.TEXT],
                                  np.asarray(x)[:, layout.modality == prim.TEXT])
    # each changed video token is the mean of itself and the pruned video tokens nearest to it (float64 check)
    xv, kv = np.asarray(x, np.float64)[:, layout.video], keep_mask[:, layout.video]
    for i in range(4):
        u = xv[i] / np.linalg.norm(xv[i], axis=-1, keepdims=True)
        kept = np.flatnonzero(kv[i])
        tgt = {j: kept[np.argmax(u[j] @ u[kept].T)] for j in np.flatnonzero(~kv[i])}
        for k in kept:
            group = [k] + [j for j, t in tgt.items() if t == k]
            np.testing.assert_allclose(np.asarray(merged.x)[i, layout.video[k]], xv[i, group].mean(0),
                                       rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------ pyramid and epsilon


@pytest.fixture(scope="module")
def setup3(setup):
    s = dict(setup)
    m = _model(layers=3, seed=1)
    x = nnx.jit(lambda m, t, i, a: m.embed(t, i, a))(m, s["tokens"], *_media(s))
    s.update(m=m, x=x)
    return s


def _media(s):
    b = sc.make_batch(4, seed=0, image_tokens=N_V, audio_tokens=N_A, kinds=("count", "audio_visual", "compose"))
    return jnp.asarray(b["images"])[:, None], jnp.asarray(b["audio"])[:, None]


def _reference_stages(m, tokens, x, qpos, keep0, layout, stages):
    """Eager float64 re-implementation on the FULL-length LM: each stage's selection is recomputed from the
    query's attention row (taken from the q/k the model hands to its `attention_bias` hook, dropped keys
    masked) and applied as a key mask to the later layers. Returns (logits at qpos, [b, L, t] keep masks)."""
    keep = np.asarray(keep0).copy()
    per_layer = []
    is_av = layout.modality != prim.TEXT

    def hook(layer, q, k):
        nonlocal keep
        now = keep.copy()
        per_layer.append(now)
        st = stages.get(layer)
        if st is not None:
            qn = np.asarray(q, np.float64)
            kn = np.repeat(np.asarray(k, np.float64), qn.shape[2] // k.shape[2], axis=2)
            new = now.copy()
            for i in range(qn.shape[0]):
                qi = int(qpos[i])
                sc_ = np.einsum("hd,shd->hs", qn[i, qi], kn[i]) / math.sqrt(qn.shape[-1])
                ok = now[i] & (np.arange(len(now[i])) <= qi)
                sc_ = np.where(ok[None], sc_, -np.inf)
                p = np.exp(sc_ - sc_.max(1, keepdims=True))
                p = (p / p.sum(1, keepdims=True)).mean(0)
                av = np.flatnonzero(now[i] & is_av)
                ranked = av[np.argsort(-p[av], kind="stable")]
                n = len(ranked)
                if st.kind == "fastv":
                    c = min(st.keep, n)
                elif st.kind == "adaptive":
                    pr = np.cumsum(p[ranked] / p[ranked].sum())
                    c = next(j for j in range(1, n + 1) if pr[j - 1] >= st.mass - 1e-6)
                    c = min(int(np.clip(c, max(1, math.ceil(st.r_min * n)), max(1, math.ceil(st.r_max * n)))), n)
                else:
                    asc = np.cumsum(np.sort(p[av]))
                    c = n - int(np.sum(asc < st.eps))
                new[i] = ~is_av & now[i]
                new[i, ranked[:c]] = True
            keep = new
        return jnp.asarray(np.where(now, 0.0, -1e9))[:, None, None, :] * jnp.ones((1, q.shape[2], q.shape[1], 1))

    logits = m.lm(tokens, input_embeddings=x, attention_bias=hook).logits
    return logits[jnp.arange(tokens.shape[0]), qpos], np.stack(per_layer, axis=1)


def test_pyramid_fixed_budgets_are_exact_per_stage(setup3):
    s = setup3
    m, layout, x, qpos = s["m"], s["layout"], s["x"], s["qpos"]
    stages = (prim.InLMPrune(kind="fastv", layer=0, keep=12), prim.InLMPrune(kind="fastv", layer=1, keep=5))
    out = _fwd(m, prim.full_plan(x, layout), layout, qpos, stages)
    np.testing.assert_array_equal(np.asarray(out.av_per_layer), [[25, 12, 5]] * 4)
    lk = np.asarray(out.layer_keep)
    np.testing.assert_array_equal((lk & (layout.modality != prim.TEXT)).sum(-1), [[25, 12, 5]] * 4)
    assert np.all(lk[:, 2] <= lk[:, 1])  # the second stage prunes what the first kept
    ref, ref_keep = _reference_stages(m, s["tokens"], x, qpos, np.ones(lk[:, 0].shape, bool), layout,
                                      {st.layer: st for st in stages})
    np.testing.assert_array_equal(lk, ref_keep)
    np.testing.assert_allclose(out.logits, ref, rtol=2e-4, atol=2e-4)


@pytest.mark.parametrize("second", ["adaptive", 0.3, 0.5])  # eps 0.5 drops every AV token of some rows
def test_pyramid_adaptive_and_epsilon_stages_equal_masked_reference(setup3, second):
    s = setup3
    m, layout, x, qpos = s["m"], s["layout"], s["x"], s["qpos"]
    plan = _plan(m, x, layout, 0.6, s["qmask"])
    B = prim.budget_count(0.6, 25)
    first = prim.InLMPrune(kind="adaptive", layer=0, mass=0.7, r_min=0.25, r_max=0.9)
    st2 = (prim.InLMPrune(kind="adaptive", layer=1, mass=0.6, r_min=0.25, r_max=0.75) if second == "adaptive"
           else prim.InLMPrune(kind="epsilon", layer=1, eps=second))
    out = _fwd(m, plan, layout, qpos, (first, st2))
    lk = np.asarray(out.layer_keep)
    ref, ref_keep = _reference_stages(m, s["tokens"], plan.x, qpos, np.asarray(_mask_of(plan.keep, lk.shape[-1])),
                                      layout, {0: first, 1: st2})
    np.testing.assert_array_equal(lk, ref_keep)  # every stage keeps exactly the reference's set (and count)
    counts = np.asarray(out.av_per_layer)
    np.testing.assert_array_equal(counts, (lk & (layout.modality != prim.TEXT)).sum(-1))
    assert np.all(counts[:, 0] == B) and np.all(counts[:, 2] <= counts[:, 1])
    assert np.all(counts[:, 1] <= math.ceil(0.9 * B)) and np.all(counts[:, 1] >= math.ceil(0.25 * B))
    assert np.any(counts[:, 2] < counts[:, 1]) and len(set(counts[:, 2].tolist())) > 1  # adaptive per row
    np.testing.assert_allclose(out.logits, ref, rtol=2e-4, atol=2e-4)


def test_epsilon_count_matches_subset_enumeration():
    rng = np.random.default_rng(5)
    n = 7
    probs = rng.dirichlet(np.ones(n + 3) * 0.6, size=8)[:, :n]  # raw rows: the rest of the mass is "text"
    valid = rng.random((8, n)) < 0.8
    valid[0] = False
    prev = np.full(8, n + 1)
    for eps in (0.0, 0.02, 0.1, 0.3, 0.6, 0.95):
        got = np.asarray(prim.epsilon_keep_count(jnp.asarray(probs, jnp.float32), jnp.asarray(valid), eps=eps))
        for i in range(8):
            v = np.flatnonzero(valid[i])
            # largest subset of the valid entries whose total mass is < eps (every subset enumerated)
            best = max((bin(mask).count("1") for mask in range(1 << len(v))
                        if sum(probs[i, v[j]] for j in range(len(v)) if mask >> j & 1) < eps), default=0)
            assert got[i] == len(v) - best, (eps, i)
        assert np.all(got <= prev)  # monotone: a larger eps drops at least as much
        prev = got
    small = np.full((1, 4), 0.01)  # total AV mass 0.04 < eps: every AV token dropped (the spec's literal rule)
    assert int(prim.epsilon_keep_count(jnp.asarray(small), jnp.ones((1, 4), bool), eps=0.05)[0]) == 0


def test_new_options_bad_input():
    with pytest.raises(ValueError, match="merge"):
        prim.PRIMConfig(merge="average")
    with pytest.raises(ValueError, match="weights"):
        prim.merge_pruned(jnp.ones((1, 3, 2)), jnp.ones((1, 3), bool), weights="max")
    with pytest.raises(ValueError, match="keep"):
        prim.merge_pruned(jnp.ones((1, 3, 2)), jnp.ones((1, 4), bool))
    with pytest.raises(ValueError, match="eps"):
        prim.InLMPrune(kind="epsilon", layer=0, eps=1.0)
    with pytest.raises(ValueError, match="eps"):
        prim.epsilon_keep_count(jnp.ones((1, 3)), jnp.ones((1, 3), bool), eps=-0.1)
    with pytest.raises(ValueError, match="kind"):
        prim.InLMPrune(kind="pyramid", layer=0)
