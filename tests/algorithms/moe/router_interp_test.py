"""Tests for algorithms.moe.router_interp (RouterInterp / SSH).

References: scikit-learn's metrics for detection scores, brute-force Python loops for precision /
coverage and for the greedy selection, float64 numpy for the linear logit decomposition, and
planted worlds with orthonormal feature directions where the per-expert feature sets are known.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from algorithms.moe import router_interp as ri
from models import sae as S


# ------------------------------------------------------------------------------------------------
# Detection metrics.
# ------------------------------------------------------------------------------------------------

def test_detection_metrics_match_sklearn_on_random_labels():
    from sklearn import metrics as skm

    rng = np.random.default_rng(0)
    for trial in range(20):
        n = int(rng.integers(5, 200))
        t = rng.random(n) < rng.uniform(0.1, 0.9)
        p = rng.random(n) < rng.uniform(0.05, 0.95)
        if t.all() or not t.any():
            t[0], t[-1] = True, False
        m = ri.detection_metrics(p, t)
        assert m["balanced_accuracy"] == pytest.approx(skm.balanced_accuracy_score(t, p))
        assert m["precision"] == pytest.approx(skm.precision_score(t, p, zero_division=0))
        assert m["recall"] == pytest.approx(skm.recall_score(t, p, zero_division=0))
        assert m["f1"] == pytest.approx(skm.f1_score(t, p, zero_division=0))


def test_detection_metrics_constant_and_oracle_predictors():
    t = np.random.default_rng(1).random(100) < 0.3
    for const in (np.zeros(100, bool), np.ones(100, bool)):
        assert ri.detection_metrics(const, t)["balanced_accuracy"] == 0.5
    m = ri.detection_metrics(t, t)
    assert m == {"balanced_accuracy": 1.0, "precision": 1.0, "recall": 1.0, "f1": 1.0}
    with pytest.raises(ValueError, match="same size"):
        ri.detection_metrics(t[:5], t)


# ------------------------------------------------------------------------------------------------
# Routing, centering, alignment.
# ------------------------------------------------------------------------------------------------

def test_topk_routing_matches_sorting_and_ties_go_low():
    logits = np.random.default_rng(0).normal(size=(30, 6))
    y = ri.topk_routing(logits, 2)
    assert (y.sum(1) == 2).all()
    for t in range(30):
        assert set(np.nonzero(y[t])[0]) == set(np.argsort(-logits[t])[:2])
    np.testing.assert_array_equal(ri.topk_routing(np.zeros((1, 4)), 2), [[True, True, False, False]])
    with pytest.raises(ValueError, match="k must be"):
        ri.topk_routing(logits, 7)


def test_adding_a_vector_to_every_router_row_changes_neither_routing_nor_scores():
    rng = np.random.default_rng(0)
    w = rng.normal(size=(8, 10))
    x = rng.normal(size=(500, 10))
    dec = rng.normal(size=(30, 10))
    codes = np.maximum(rng.normal(size=(500, 30)), 0)
    v = rng.normal(size=10) * 3.0
    np.testing.assert_array_equal(ri.route(w, x, 2), ri.route(w + v, x, 2))
    np.testing.assert_allclose(ri.alignment_scores(w, dec, codes), ri.alignment_scores(w + v, dec, codes),
                               atol=1e-10)
    # Uncentred scores do move: centering is what makes them invariant.
    assert not np.allclose(ri.alignment_scores(w, dec, codes, center=False),
                           ri.alignment_scores(w + v, dec, codes, center=False))


def test_linear_decomposition_and_alignment_is_the_mean_active_contribution():
    sae = S.TopKSAE(10, 24, k=4, rngs=nnx.Rngs(0), b_dec=np.linspace(-1, 1, 10))
    x = jax.random.normal(jax.random.key(1), (60, 10))
    out = sae(x)
    f, xh = np.asarray(out.latents, np.float64), np.asarray(out.reconstruction, np.float64)
    dec = np.asarray(sae.decoder_directions(), np.float64)
    bdec = np.asarray(sae.b_dec[...], np.float64)
    w = np.random.default_rng(0).normal(size=(5, 10))
    contrib = ri.feature_logit_contributions(w, dec, f)  # [n, F, E]
    np.testing.assert_allclose(xh @ w.T, contrib.sum(1) + w @ bdec, rtol=1e-5, atol=1e-5)
    a = ri.alignment_scores(w, dec, f, center=False)
    for i in range(24):
        rows = f[:, i] > 0
        want = contrib[rows, i, :].mean(0) if rows.any() else np.zeros(5)
        np.testing.assert_allclose(a[i], want, rtol=1e-10, atol=1e-12)
    ac = ri.alignment_scores(w, dec, f)
    np.testing.assert_allclose(ac, a - a.mean(1, keepdims=True), atol=1e-12)


def test_precision_coverage_brute_force():
    rng = np.random.default_rng(2)
    act = rng.random((80, 7)) < 0.3
    act[:, 3] = False  # a feature that never fires
    y = rng.random((80, 4)) < 0.4
    prec, cov = ri.precision_coverage(act, y)
    for i in range(7):
        for e in range(4):
            fires = [t for t in range(80) if act[t, i]]
            routed = [t for t in range(80) if y[t, e]]
            both = [t for t in fires if y[t, e]]
            assert prec[i, e] == pytest.approx(len(both) / len(fires) if fires else 0.0)
            assert cov[i, e] == pytest.approx(len(both) / len(routed) if routed else 0.0)


def test_l1_probe_selects_the_relevant_features():
    rng = np.random.default_rng(0)
    codes = np.maximum(rng.normal(size=(2000, 20)), 0)
    y = np.stack([(codes[:, 2] + codes[:, 5] > 1.0), (codes[:, 11] > 0.8)], 1)
    w = ri.probe_scores(codes, y, c=0.05)
    assert set(np.argsort(-w[:, 0])[:2]) == {2, 5}
    assert int(np.argmax(w[:, 1])) == 11
    assert np.count_nonzero(w[:, 1]) < 10  # sparse


# ------------------------------------------------------------------------------------------------
# Greedy selection.
# ------------------------------------------------------------------------------------------------

def _greedy_reference(act, y, scores, p_min, target, kmax, floor):
    order = sorted([i for i in range(len(scores)) if scores[i] > 0], key=lambda i: (-scores[i], i))
    sel, cov = [], set()
    pos = {t for t in range(len(y)) if y[t]}
    for i in order:
        new = {t for t in range(len(y)) if act[t, i]} - cov
        if not (new & pos):
            continue
        union = cov | new
        prec = len(new & pos) / len(new) if floor == "marginal" else len(union & pos) / len(union)
        if prec < p_min:
            continue
        sel.append(i)
        cov = union
        if len(cov & pos) / len(pos) >= target or len(sel) >= kmax:
            break
    return sel


@pytest.mark.parametrize("floor", ["marginal", "union"])
def test_greedy_respects_the_floor_and_matches_a_brute_force_reference(floor):
    rng = np.random.default_rng(3)
    for trial in range(15):
        n, F = 120, 25
        act = rng.random((n, F)) < rng.uniform(0.02, 0.2, F)
        y = rng.random(n) < 0.3
        y |= act[:, 0] | act[:, 1]
        scores = np.round(rng.normal(size=F), 1)  # rounded: ties exercise the index tie-break
        p_min = float(rng.uniform(0.3, 0.8))
        fs = ri.greedy_feature_set(act, y, scores, min_precision=p_min, target_recall=0.9, max_features=6,
                                   floor=floor)
        assert list(fs.features) == _greedy_reference(act, y, scores, p_min, 0.9, 6, floor)
        assert len(fs.features) <= 6
        assert np.all(fs.precision >= p_min - 1e-12)
        assert np.all(np.diff(fs.recall) >= 0)
        if fs.features:
            union = act[:, list(fs.features)].any(1)
            assert fs.precision[-1] == pytest.approx((union & y).sum() / union.sum())
            assert fs.recall[-1] == pytest.approx((union & y).sum() / y.sum())


def test_greedy_deterministic_tie_break_and_empty_label():
    act = np.zeros((4, 3), bool)
    act[:2, 1] = act[:2, 2] = True  # features 1 and 2 identical
    y = np.array([True, True, False, False])
    fs = ri.greedy_feature_set(act, y, np.array([0.0, 1.0, 1.0]), min_precision=0.5)
    assert fs.features == (1,)
    assert ri.greedy_feature_set(act, np.zeros(4, bool), np.ones(3)).features == ()
    with pytest.raises(ValueError, match="scores must have shape"):
        ri.greedy_feature_set(act, y, np.ones(2))


# ------------------------------------------------------------------------------------------------
# Planted worlds and exact recovery.
# ------------------------------------------------------------------------------------------------

ORACLE_WORLD = dict(num_sequences=40, seq_len=16, d_model=32, num_domains=3, vocab_size=12,
                    shared_vocab_fraction=0.25, num_groups=4, num_experts=4, top_k=1,
                    families=("domain", "token", "group"), orthogonal=True, router_fit="direct", router_noise=0.0)


def test_oracle_sae_recovers_planted_feature_sets_exactly():
    w = ri.planted_world(jax.random.key(0), kind="ssh", **ORACLE_WORLD)
    F = w.codes.shape[1]
    assert F == 3 + 12 + 12 and all(len(s) == 3 for s in w.planted_sets)
    assert (np.count_nonzero(w.codes, axis=1) == 3).all()
    sae = S.TopKSAE(32, F, k=3, rngs=nnx.Rngs(0))  # the oracle: decoder = planted directions
    sae.w_dec[...] = jnp.asarray(w.directions, jnp.float32)
    sae.w_enc[...] = jnp.asarray(w.directions.T, jnp.float32)
    codes = np.asarray(sae.encode(jnp.asarray(w.x)))
    np.testing.assert_allclose(codes, w.codes, atol=1e-5)
    scores = ri.alignment_scores(w.router_w, np.asarray(sae.decoder_directions()), codes)
    sets = ri.select_feature_sets(codes > 0, w.labels, scores, min_precision=0.6, target_recall=1.0,
                                  max_features=10)
    assert [tuple(sorted(s.features)) for s in sets] == [tuple(sorted(p)) for p in w.planted_sets]
    rec = ri.set_recovery([s.features for s in sets], w.planted_sets)
    assert rec["exact"] == 4 and rec["precision"] == rec["recall"] == 1.0
    ctx = ri.TokenContext(active=codes > 0, token_ids=w.token_ids, domain_ids=w.domain_ids)
    res = ri.evaluate_explanations(ri.explain_experts(sets), ctx, w.labels)
    assert res["mean"]["balanced_accuracy"] == 1.0


def test_single_domain_world_is_explained_by_one_domain():
    w = ri.planted_world(jax.random.key(1), kind="single_domain",
                         **{**ORACLE_WORLD, "num_experts": 6, "top_k": 2})
    assert w.planted_sets == tuple((e % 3,) for e in range(6))  # domain features come first
    assert (w.labels.sum(1) == 2).all()
    for e in range(6):
        np.testing.assert_array_equal(w.labels[:, e], w.domain_ids == e % 3)
    dom = ri.single_domain_explanations(w.domain_ids, w.labels, 3)
    assert [ex.items for ex in dom] == [(e % 3,) for e in range(6)]
    ctx = ri.TokenContext(domain_ids=w.domain_ids)
    assert ri.evaluate_explanations(dom, ctx, w.labels)["mean"]["balanced_accuracy"] == 1.0


def test_ssh_world_structure_and_held_out_sample_reuses_the_router():
    w = ri.planted_world(jax.random.key(2), kind="ssh", num_sequences=20, d_model=48, num_groups=4, num_domains=4,
                         vocab_size=32, num_experts=8, num_noise_features=16)
    te = ri.planted_world(jax.random.key(3), kind="ssh", num_sequences=10, d_model=48, num_groups=4, num_domains=4,
                          vocab_size=32, num_experts=8, num_noise_features=16, router_world=w)
    flat = [i for s in w.planted_sets for i in s]
    assert len(flat) == len(set(flat)) == 2 * 4 * 4  # disjoint, cover every combination feature
    assert all(w.feature_names[i].startswith(("grp", "prev grp")) for i in flat)
    np.testing.assert_array_equal(te.router_w, w.router_w)
    assert te.planted_sets == w.planted_sets
    np.testing.assert_allclose(np.linalg.norm(w.directions, axis=1), 1.0)
    np.testing.assert_array_equal(w.labels, ri.route(w.router_w, w.x, 2))
    np.testing.assert_allclose(w.x, w.codes @ w.directions, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="kind"):
        ri.planted_world(jax.random.key(0), kind="mixed")


# ------------------------------------------------------------------------------------------------
# Baselines, explainer, simulator.
# ------------------------------------------------------------------------------------------------

def test_token_statistics_recover_a_token_rule_and_bigram_learns_pairs():
    rng = np.random.default_rng(0)
    tok = rng.integers(0, 10, 3000)
    prev = rng.integers(0, 10, 3000)
    y = np.stack([np.isin(tok, [1, 4, 7]), (prev == 2) & (tok == 3)], 1)
    ex = ri.token_statistics_explanations(tok, y, 10, min_precision=0.9, target_recall=1.0)
    assert sorted(ex[0].items) == [1, 4, 7] and ex[0].kind == "tokens"
    bg = ri.BigramPredictor(10).fit(prev, tok, y)
    np.testing.assert_array_equal(bg.predict(prev, tok), y)
    # An unseen pair backs off to the token's routing rate.
    seen = set(zip(prev.tolist(), tok.tolist()))
    assert (5, 5) in seen or bg.probabilities(np.array([5]), np.array([5]))[0, 0] < 0.5
    with pytest.raises(ValueError, match="token_ids must be in"):
        bg.predict(np.array([0]), np.array([10]))


def test_explainer_and_simulator_rules():
    act = np.array([[1, 0, 0], [0, 1, 0], [0, 0, 1], [0, 0, 0]], bool)
    ctx = ri.TokenContext(active=act, token_ids=np.array([5, 6, 5, 7]), domain_ids=np.array([0, 1, 1, 0]))
    sim = ri.RuleBasedSimulator()
    exp = ri.RuleBasedExplainer()
    e1 = exp.explain(0, "features", [0, 2], ["a", "b"])
    assert e1.text == "expert 0 routes tokens that are a; or b"
    np.testing.assert_array_equal(sim.simulate(e1, ctx), [True, False, True, False])
    np.testing.assert_array_equal(sim.simulate(exp.explain(1, "tokens", [5], ["t"]), ctx), [True, False, True, False])
    np.testing.assert_array_equal(sim.simulate(exp.explain(2, "domains", [1], ["d"]), ctx), [False, True, True, False])
    np.testing.assert_array_equal(sim.simulate(exp.explain(3, "features", [], []), ctx), [False] * 4)
    desc = ri.describe_features(act, ctx.token_ids, ctx.domain_ids)
    assert desc[0] == "f0: tokens {5} in domain 0 (100%)"
    with pytest.raises(ValueError, match="kind"):
        exp.explain(0, "neurons", [0], ["x"])
    with pytest.raises(ValueError, match="context.active"):
        sim.simulate(e1, ri.TokenContext())


def test_single_feature_baseline_picks_the_best_feature():
    rng = np.random.default_rng(0)
    act = rng.random((500, 6)) < 0.2
    y = (act[:, 4] | (rng.random(500) < 0.02))[:, None]
    ex = ri.single_feature_explanations(act, y)
    assert ex[0].items == (4,)


def test_match_features_and_set_recovery():
    true = np.eye(4)
    learned = np.array([[1, 0.01, 0, 0], [0, 0, 1, 0], [1, 1, 1, 1]])
    np.testing.assert_array_equal(ri.match_features(learned, true), [0, 2, -1])
    rec = ri.set_recovery([(0, 1), (2,)], [(0,), (2, 3)], matching=np.array([0, 2, -1]))
    assert rec["per_expert_precision"] == [0.5, 0.0] and rec["per_expert_recall"] == [1.0, 0.0]
