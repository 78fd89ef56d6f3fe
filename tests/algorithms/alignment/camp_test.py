"""CAMP: conflict detection and score, adaptive margin / weight, the baselines' losses, the LM training loop."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from algorithms.alignment import camp
from models import Transformer, TransformerConfig
from primitives import preference_losses as pl

RNG = np.random.default_rng(0)
N = 12
PA, PB, RA, RB = (RNG.normal(-4.0, 1.5, N) for _ in range(4))
# Rated pairs of a question-world-like set: T/H differences in [-1, 1], some ties, some conflicts.
DT = np.array([1.0, 1.0, 0.0, -1.0, 0.5, -0.5, 0.0, 1.0, 0.0, -1.0, 0.5, 0.0])
DH = np.array([0.5, -0.5, 1.0, 0.5, -0.25, 0.25, -0.75, 0.0, 0.0, -0.5, 0.25, 0.25])
CONFLICT = np.array([False, True, False, True, True, True, False, False, False, False, False, False])


def _softplus(x):
    return np.logaddexp(0.0, x)


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


def test_conflicts_are_exactly_the_sign_disagreeing_pairs():
    np.testing.assert_array_equal(camp.detect_conflicts(DT, DH), CONFLICT)
    np.testing.assert_array_equal(camp.detect_conflicts(-DT, -DH), CONFLICT)  # orientation-free


def test_conflict_score_properties():
    tau = 0.1
    np.testing.assert_allclose(camp.conflict_score(DT, DH, tau=tau), _sigmoid(-DT * DH / tau), rtol=1e-6)
    half = camp.conflict_score(jnp.array([0.0, 0.7, 0.0]), jnp.array([0.3, 0.0, 0.0]), tau=tau)
    np.testing.assert_allclose(half, 0.5)
    extreme = camp.conflict_score(jnp.array([1.0, 1.0]), jnp.array([-1.0, 1.0]), tau=0.01)
    assert float(extreme[0]) > 0.999 and float(extreme[1]) < 1e-3
    x = jnp.linspace(-1, 1, 21)  # -Delta_T * Delta_H increasing
    k = np.asarray(camp.conflict_score(jnp.ones(21), -x, tau=tau))
    assert np.all(np.diff(k) > 0)


def test_orientation():
    np.testing.assert_array_equal(camp.orient_pairs(DT, DH), [1, 1, 1, -1, 1, -1, -1, 1, 0, -1, 1, 1])
    np.testing.assert_array_equal(camp.orient_pairs(DT, DH, primary="truth_only"), np.sign(DT))
    np.testing.assert_array_equal(camp.orient_pairs(DT, DH, primary="help_only"), np.sign(DH))


def _oriented():
    side = np.where(DT != 0, np.sign(DT), np.sign(DH))
    keep = side != 0
    s = side[keep]
    pw, pl_ = np.where(s > 0, PA[keep], PB[keep]), np.where(s > 0, PB[keep], PA[keep])
    rw, rl = np.where(s > 0, RA[keep], RB[keep]), np.where(s > 0, RB[keep], RA[keep])
    return (pw, pl_, rw, rl), s * DT[keep], s * DH[keep], CONFLICT[keep]


def test_margin_and_weight_closed_form():
    cfg = camp.CAMPConfig(beta=0.2, gamma_consistent=1.0, gamma_conflict=0.5, tau=0.1, lam=0.5, rho=0.5)
    _, dt, dh, conflict = _oriented()
    parts = camp.camp_margin_and_strength(dt, dh, cfg)
    kappa = _sigmoid(-dt * dh / 0.1)
    want = 1.0 * (1 - kappa) * np.abs(dt + dh) / 2 + conflict * 0.5 * kappa * np.maximum(np.abs(dt) - 0.5 * np.abs(dh), 0)
    np.testing.assert_allclose(parts["margin"], want, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(parts["strength"], 1 - conflict * 0.5 * kappa, rtol=1e-6)
    np.testing.assert_array_equal(parts["conflict"], conflict)
    assert np.all(np.asarray(parts["margin"]) >= 0)
    # Stronger agreement -> larger margin (consistent pairs).
    m = camp.camp_margin_and_strength(jnp.array([0.25, 0.5, 1.0]), jnp.array([0.25, 0.5, 1.0]), cfg)["margin"]
    assert np.all(np.diff(np.asarray(m)) > 0)


def test_camp_equals_dpo_without_conflicts():
    cfg = camp.CAMPConfig(beta=0.3, gamma_consistent=0.0)
    (pw, pl_, rw, rl), dt, dh, conflict = _oriented()
    keep = ~conflict
    got = camp.camp_loss(pw[keep], pl_[keep], rw[keep], rl[keep], dt[keep], dh[keep], config=cfg)
    np.testing.assert_allclose(got, pl.dpo_loss(pw[keep], pl_[keep], rw[keep], rl[keep], beta=0.3), rtol=1e-6)


def test_camp_changes_only_conflicting_pairs():
    cfg = camp.CAMPConfig()
    plain = dataclasses.replace(cfg, gamma_conflict=0.0, rho=0.0)
    lp, dt, dh, conflict = _oriented()
    a = np.asarray(camp.camp_loss(*lp, dt, dh, config=cfg))
    b = np.asarray(camp.camp_loss(*lp, dt, dh, config=plain))
    np.testing.assert_array_equal(a[~conflict], b[~conflict])
    assert np.all(a[conflict] != b[conflict])
    # Hooks replace the margin / weight / beta.
    hooked = camp.camp_loss(*lp, dt, dh, config=cfg, margin_fn=lambda t, h: jnp.zeros_like(t),
                            strength_fn=lambda t, h: jnp.ones_like(t), beta_fn=lambda t, h: 2 * jnp.ones_like(t))
    np.testing.assert_allclose(hooked, pl.dpo_loss(*lp, beta=2 * cfg.beta), rtol=1e-6)


def test_conflict_gradient_not_larger_than_an_equally_strong_consistent_pair():
    z = jnp.zeros(2)
    dt, dh = jnp.array([1.0, 1.0]), jnp.array([0.5, -0.5])  # same magnitudes, agree vs conflict
    g = jax.grad(lambda p: camp.camp_loss(p, z, z, z, dt, dh).sum())(z)
    assert abs(float(g[1])) <= abs(float(g[0]))


def _reference_method_loss(method, cfg: camp.PreferenceConfig):
    beta, wt = cfg.beta, cfg.truth_weight
    h_ab = (PA - RA) - (PB - RB)

    def dpo(delta):
        s = np.sign(delta)
        used = s != 0
        return _softplus(-beta * s * h_ab)[used].mean()

    if method == "dpo_truth":
        return dpo(DT)
    if method == "dpo_help":
        return dpo(DH)
    if method == "mixture":
        return wt * dpo(DT) + (1 - wt) * dpo(DH)
    if method == "modpo":
        s = np.sign(DT)
        used = s != 0
        z = beta / wt * s * h_ab - (1 - wt) / wt * cfg.modpo_reward_scale * s * DH
        return _softplus(-z)[used].mean()
    lp, dt, dh, _ = _oriented()
    c = cfg.camp if method == "camp" else dataclasses.replace(cfg.camp, gamma_conflict=0.0, gamma_consistent=0.0,
                                                              rho=0.0)
    return float(np.mean(np.asarray(camp.camp_loss(*lp, dt, dh, config=c))))


@pytest.mark.parametrize("method", camp.METHODS)
def test_method_losses_match_numpy(method):
    cfg = camp.PreferenceConfig(camp=camp.CAMPConfig(beta=0.4), truth_weight=0.3, modpo_reward_scale=2.0)
    loss, metrics = camp.method_loss(method, PA, PB, RA, RB, DT, DH, config=cfg)
    np.testing.assert_allclose(float(loss), _reference_method_loss(method, cfg), rtol=1e-5)
    np.testing.assert_allclose(float(metrics["conflict_fraction"]), CONFLICT.mean())
    assert 0 < float(metrics["pairs_used"]) <= 1


BAD = [
    (lambda: camp.camp_loss(jnp.zeros(2), jnp.zeros(2), jnp.zeros(2), jnp.zeros(2), jnp.array([1.0, -1.0]),
                            jnp.zeros(2)), r"oriented truthfulness-first .* first at index 1: delta_t=-1.0"),
    (lambda: camp.camp_loss(jnp.zeros(2), jnp.zeros(2), jnp.zeros(2), jnp.zeros(2), jnp.array([1.0, 0.0]),
                            jnp.array([0.0, 0.0])), r"first at index 1: delta_t=0.0, delta_h=0.0"),
    (lambda: camp.camp_loss(jnp.zeros(2), jnp.zeros(2), jnp.zeros(2), jnp.zeros(2), jnp.ones(3), jnp.ones(3)),
     r"delta_t must have one entry per pair, n=2"),
    (lambda: camp.detect_conflicts(jnp.ones(2), jnp.ones(3)), r"delta_t and delta_h must both be \[n\]"),
    (lambda: camp.detect_conflicts(jnp.array([1.0, float("nan")]), jnp.ones(2)), r"delta_t must be finite"),
    (lambda: camp.method_loss("dpo", *(jnp.zeros(2),) * 6), r"method must be one of"),
    (lambda: camp.method_loss("camp", jnp.zeros(3), *(jnp.zeros(2),) * 5), r"logp_a must be \[n\]=\(2,\)"),
    (lambda: camp.CAMPConfig(rho=1.0), r"rho must lie in \[0, 1\)"),
    (lambda: camp.CAMPConfig(tau=0.0), r"tau must be > 0"),
    (lambda: camp.CAMPConfig(gamma_conflict=-1.0), r"gamma_conflict must be >= 0"),
    (lambda: camp.PreferenceConfig(truth_weight=1.0), r"truth_weight must lie in \(0, 1\)"),
    (lambda: camp.orient_pairs(jnp.ones(2), jnp.ones(2), primary="help"), r"primary must be one of"),
]


@pytest.mark.parametrize("call,match", BAD)
def test_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# --- the LM side ---------------------------------------------------------------------------------

VOCAB, T = 10, 4
OPT = optax.adam(1e-2)


@pytest.fixture(scope="module")
def lm():
    cfg = TransformerConfig(vocab_size=VOCAB, d_model=16, num_layers=1, num_heads=2, num_kv_heads=1, d_ff=32)
    graphdef, params = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)), nnx.Param)
    return graphdef, nnx.to_pure_dict(params)


def _pairs(n=8):
    rng = np.random.default_rng(1)
    prompt = rng.integers(3, VOCAB, (n, 2))
    a_ans, b_ans = rng.integers(3, VOCAB, n), rng.integers(3, VOCAB, n)
    b_ans = np.where(b_ans == a_ans, (a_ans - 3 + 1) % (VOCAB - 3) + 3, b_ans)

    def seqs(ans):
        tokens = np.concatenate([np.ones((n, 1), int), prompt, ans[:, None], np.full((n, 1), 2)], 1)
        mask = np.zeros((n, T), np.float32)
        mask[:, 2:] = 1  # targets 2, 3 = the answer and EOS
        return tokens[:, :-1].astype(np.int32), tokens[:, 1:].astype(np.int32), mask

    ai, at, am = seqs(a_ans)
    bi, bt, bm = seqs(b_ans)
    return {"a_inputs": ai, "a_targets": at, "a_mask": am, "b_inputs": bi, "b_targets": bt, "b_mask": bm,
            "delta_t": np.tile([1.0, -1.0], n // 2).astype(np.float32),
            "delta_h": np.tile([0.5, 0.5], n // 2).astype(np.float32)}


def test_sequence_logprobs_equal_a_manual_forward_pass(lm):
    graphdef, params = lm
    p = _pairs()
    got = camp.sequence_logprobs(graphdef, params, jnp.asarray(p["a_inputs"]), jnp.asarray(p["a_targets"]),
                                 jnp.asarray(p["a_mask"]))
    logits = np.asarray(nnx.merge(graphdef, params)(jnp.asarray(p["a_inputs"])).logits, np.float64)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    tok = np.take_along_axis(logp, p["a_targets"][..., None], -1)[..., 0]
    np.testing.assert_allclose(got, (tok * p["a_mask"]).sum(1), rtol=1e-5)
    ref = camp.reference_logprobs(graphdef, params, p["a_inputs"], p["a_targets"], p["a_mask"], chunk=3)
    np.testing.assert_allclose(ref, got, rtol=1e-5)


def test_training_raises_the_preferred_margin_and_resumes(lm, tmp_path):
    graphdef, params = lm
    p = _pairs()
    kw = dict(graphdef=graphdef, params=params, pairs=p, method="camp", optimizer=OPT, batch_size=4, seed=3,
              progress=False, log_every=1)
    full = camp.train(num_steps=6, **kw)
    side = np.where(p["delta_t"] > 0, 1.0, -1.0)

    def gap(prm):
        la = camp.reference_logprobs(graphdef, prm, p["a_inputs"], p["a_targets"], p["a_mask"])
        lb = camp.reference_logprobs(graphdef, prm, p["b_inputs"], p["b_targets"], p["b_mask"])
        return side * (la - lb)

    assert gap(full.state.params).mean() > gap(params).mean() + 0.5
    assert full.history[-1]["reward_accuracy"] == 1.0
    part = camp.train(num_steps=6, stop_after=3, workdir=tmp_path, checkpoint_every=3, fingerprint="x", **kw)
    assert int(part.state.step) == 3
    resumed = camp.train(num_steps=6, workdir=tmp_path, checkpoint_every=3, fingerprint="x", **kw)
    assert resumed.resumed_from == 3
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), resumed.state.params,
                 full.state.params)


def test_train_bad_input(lm):
    graphdef, params = lm
    p = _pairs()
    with pytest.raises(ValueError, match=r"batch_size must lie in \[1, n=8\]; got 9"):
        camp.train(graphdef=graphdef, params=params, pairs=p, method="camp", optimizer=OPT, num_steps=1,
                   batch_size=9)
    with pytest.raises(ValueError, match=r"missing \['delta_h'\]"):
        camp.train(graphdef=graphdef, params=params, pairs={k: v for k, v in p.items() if k != "delta_h"},
                   method="camp", optimizer=OPT, num_steps=1, batch_size=2)
