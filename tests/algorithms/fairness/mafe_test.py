"""Tests of the MAFE core and the three domain environments (spec 7 (e)); F-MACEM and scalarisation are in
mafe_fmacem_test.py, the PettingZoo adapter in mafe_pettingzoo_test.py."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from algorithms.fairness.mafe import core, fmacem
from algorithms.fairness.mafe.education import EducationMAFE, EduState
from algorithms.fairness.mafe.healthcare import HealthcareMAFE, HealthState
from algorithms.fairness.mafe.loan import LoanMAFE, LoanState, loan_policy

ENVS = {
    "loan": lambda m=40, t=6: LoanMAFE(num_individuals=m, num_bins=4, horizon=t),
    "health": lambda m=40, t=6: HealthcareMAFE(num_individuals=m, num_bins=3, horizon=t),
    "education": lambda m=40, t=6: EducationMAFE(num_individuals=m, num_bins=3, horizon=t),
}


def _random_actions(env, key):
    ks = jax.random.split(key, len(env.agents))
    return {a: jax.random.uniform(k, (d,)) for (a, d), k in zip(env.action_dims().items(), ks)}


def _leaves_equal(x, y):
    lx, ly = jax.tree.leaves(x), jax.tree.leaves(y)
    return len(lx) == len(ly) and all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(lx, ly))


def _leaves_close(x, y):
    lx, ly = jax.tree.leaves(x), jax.tree.leaves(y)
    return len(lx) == len(ly) and all(np.allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)
                                      for a, b in zip(lx, ly))


# ------------------------------------------------------------------------------------ purity, jit, vmap
@pytest.mark.parametrize("name", list(ENVS))
def test_reset_step_pure_jit_vmap(name):
    env = ENVS[name]()
    p = env.default_params()
    key = jax.random.key(3)
    s1, o1 = env.reset(key, p)
    s2, o2 = env.reset(key, p)
    assert _leaves_equal((s1, o1), (s2, o2))
    acts = _random_actions(env, jax.random.key(4))
    out1 = env.step(jax.random.key(5), s1, acts, p)
    assert _leaves_equal(out1, env.step(jax.random.key(5), s2, acts, p))  # same key => identical outputs
    out2 = jax.jit(env.step)(jax.random.key(5), s1, acts, p)
    assert _leaves_close(out1[0], out2[0])  # jit may fuse float ops differently
    for a in env.agents:
        for k in core.COMPONENT_KINDS:
            np.testing.assert_allclose(out1[2][a][k], out2[2][a][k], rtol=1e-5, atol=1e-5)
    # a different key gives a different population; vmap over keys equals the per-key calls.
    s3, _ = env.reset(jax.random.key(4), p)
    assert not _leaves_equal(s1, s3)
    keys = jax.random.split(jax.random.key(9), 3)
    vs, vo = jax.vmap(lambda k: env.reset(k, p))(keys)
    for i in range(3):
        si, oi = env.reset(keys[i], p)
        assert _leaves_equal(jax.tree.map(lambda x: x[i], (vs, vo)), (si, oi))
    for a in env.agents:
        assert o1[a].shape == (env.obs_dims()[a],) and o1[a].dtype == jnp.float32


# ------------------------------------------------------------------------------ conservation and bounds
@pytest.mark.parametrize("name", list(ENVS))
def test_conservation_bounds_budgets_capacity(name):
    env = ENVS[name](m=60, t=8)
    over = {"loan": {"subsidy_budget": 30.0, "agency_capital": 50.0},   # capital runs out mid-episode
            "health": {"capacity": 0.05}, "education": {"scholarship_fund": 0.2, "seats": 0.1}}[name]
    p = env.default_params(**over)
    state, _ = env.reset(jax.random.key(0), p)
    step = jax.jit(env.step)
    for t in range(env.horizon):
        acts = _random_actions(env, jax.random.key(100 + t))
        if name == "loan":
            acts["agency"] = acts["agency"].at[-1].set(0.0)
        if name == "education":
            acts["university"] = jnp.ones_like(acts["university"])
        prev = state
        state, obs, comps, done = step(jax.random.key(t), state, acts, p)
        assert bool(done) == (t + 1 == env.horizon)
        assert np.array_equal(np.asarray(state.group), np.asarray(prev.group))  # population conserved
        for a in env.agents:
            assert np.all(np.asarray(obs[a]) >= 0) and np.all(np.asarray(obs[a]) <= 1)
        if name == "loan":
            s = np.asarray(state.score)
            assert s.shape == (60,) and s.min() >= 300 and s.max() <= 850
            assert float(state.capital) >= 0 and float(state.capital) <= float(prev.capital)
            appr = comps["bank"]["reward"][1] + comps["bank"]["reward"][2]
            assert 0 <= float(appr) <= 60
        elif name == "health":
            h = np.asarray(state.health)
            assert h.min() >= 0 and h.max() <= 1 and np.all(np.asarray(state.income) >= 0)
            treated = float(comps["hospital"]["reward"][2] + comps["hospital"]["reward"][3])
            assert treated <= math.floor(0.05 * 60) + 1e-6
        else:
            assert float(state.fund) >= 0 and np.all(np.asarray(state.wealth) >= 0)
            admitted = float(comps["university"]["reward"][2] + comps["university"]["reward"][3])
            assert admitted <= math.floor(0.1 * 60) + 1e-6
    if name == "loan":
        assert float(state.capital) == 0.0  # the agency spent its capital and no more


# ------------------------------------------------------------------ components on a hand-built population
def test_loan_components_hand_built_population():
    env = LoanMAFE(num_individuals=4, num_bins=2, horizon=5)  # bins [300, 575), [575, 850]
    p = env.default_params(a=2.0, s0=500.0, b=0.0, c_income=0.0, gain=20.0, loss=40.0, drift=-2.0,
                           subsidy_budget=0.0)
    st = LoanState(score=jnp.array([700.0, 400.0, 700.0, 400.0]), income=jnp.ones(4),
                   group=jnp.array([0, 0, 1, 1]), capital=jnp.asarray(0.0), t=jnp.asarray(0))
    # bank: approve high-bin always, low-bin never for group 0; group 1 approves both bins; rate 0.1.
    bank = jnp.array([0.0, 1.0, 1.0, 1.0, 0.1 / 0.3])
    agency = jnp.array([0, 0, 0, 0, 1.0])
    rho_hi = 1 / (1 + math.exp(-4.0))   # 700: logit 2 * 2 = 4
    rho_lo = 1 / (1 + math.exp(2.0))    # 400: logit -2
    # individual 0 repays (u < rho_hi), 2 repays, 3 defaults (u >= rho_lo); 1 is not approved.
    noise = {"u_approve": jnp.array([0.5, 0.5, 0.5, 0.5]),
             "u_repay": jnp.array([rho_hi - 0.01, 0.0, 0.1, rho_lo + 0.05])}
    nxt, comps = env.transition(st, {"bank": bank, "agency": agency}, p, noise)
    np.testing.assert_allclose(nxt.score, [720.0, 398.0, 720.0, 360.0])
    b = comps["bank"]
    np.testing.assert_allclose(b["reward"], [(0.1 + 0.1 - 1.0) / 4, 1, 2, 0, 1], atol=1e-6)
    np.testing.assert_allclose(b["rate"], [0.5, 1.0, 0.0, 0.5], atol=1e-6)
    np.testing.assert_allclose(b["fair"], [0.5, abs((720 + 398) / 2 - (720 + 360) / 2) / 100, 0.5], atol=1e-5)
    np.testing.assert_allclose(comps["agency"]["reward"], [(20 - 2 + 20 - 40) / 4 / 100, 0.0], atol=1e-6)
    np.testing.assert_allclose(comps["agency"]["rate"], [559 / 850, 540 / 850], atol=1e-6)
    assert int(nxt.t) == 1


def test_health_and_education_components_hand_built():
    env = HealthcareMAFE(num_individuals=4, num_bins=2, horizon=3)
    p = env.default_params(p_ill0=0.0, p_ill_slope=1.0, capacity=0.5, premium_max=0.5, afford_k=1e6,
                           success_insured=1.0, success_uninsured=0.0, treat_gain=0.1, illness_loss=0.2,
                           recover=0.0, treat_cost=1.0)
    st = HealthState(health=jnp.array([0.2, 0.9, 0.2, 0.9]), base_income=jnp.ones(4), income=jnp.ones(4),
                     group=jnp.array([0, 0, 1, 1]), t=jnp.asarray(0))
    acts = {"insurer": jnp.array([1.0, 0.0, 0.4]), "hospital": jnp.ones(4)}  # only the low-health bin eligible
    u = jnp.array([0.5, 0.5, 0.5, 0.5])
    noise = {"u_ill": u, "u_enrol": jnp.zeros(4), "u_want": jnp.zeros(4),
             "u_priority": jnp.array([0.1, 0.0, 0.2, 0.9]), "u_success": jnp.zeros(4)}
    nxt, comps = env.transition(st, acts, p, noise)
    # ill: p = 1 - h -> 0.8 (ill) for 0 and 2, 0.1 (not) for 1 and 3; enrolled: 0 and 2; capacity 2: both treated.
    np.testing.assert_allclose(nxt.health, [0.3, 0.9, 0.3, 0.9], atol=1e-6)
    np.testing.assert_allclose(comps["insurer"]["reward"], [(2 * 0.2 - 2 * 1.0) / 4, 1, 1], atol=1e-6)
    np.testing.assert_allclose(comps["hospital"]["reward"], [1.0, 0.5, 1, 1], atol=1e-6)
    np.testing.assert_allclose(comps["hospital"]["fair"], [0.0, 0.0], atol=1e-6)
    np.testing.assert_allclose(nxt.income, [0.6 + 0.4 * 0.3 - 0.2, 0.6 + 0.36, 0.6 + 0.4 * 0.3 - 0.2, 0.96],
                               atol=1e-6)

    env = EducationMAFE(num_individuals=4, num_bins=2, horizon=3)
    p = env.default_params(mean_innate=0.4, std_innate=0.0, prep=0.0, test_noise=0.0, signal_noise=0.0,
                           seats=1.0, tuition=0.5, skill_growth=0.3, scholarship_fund=1.0)
    st = EduState(wealth=jnp.array([1.0, 0.0, 0.0, 1.0]), group=jnp.array([0, 0, 1, 1]), fund=jnp.asarray(4.0),
                  last_wage=jnp.zeros(4), t=jnp.asarray(0))
    # admit everyone, full scholarship for group 1; employer hires graduates only.
    acts = {"university": jnp.ones(5), "employer": jnp.array([0.0, 0.0, 1.0, 1.0])}
    zeros, half = jnp.zeros(4), jnp.full((4,), 0.5)
    noise = {"z_innate": zeros, "z_test": zeros, "z_signal": zeros, "u_admit": zeros, "u_priority": half,
             "u_enrol": half, "u_grad": jnp.array([0.1, 0.1, 0.1, 0.9]), "u_hire": zeros}
    nxt, comps = env.transition(st, acts, p, noise)
    # skill 0.4 for all; enrol: 0 (w=1 affords), 1 (w=0, no scholarship -> p=0) no, 2 and 3 covered -> yes.
    # graduate (u < 0.4): 0 and 2; hired: 0 and 2 with wage 0.3 + 0.7 * 0.7 = 0.79.
    np.testing.assert_allclose(comps["university"]["reward"], [0.5, 3 * 0.5 / 4, 2, 2], atol=1e-6)
    np.testing.assert_allclose(comps["employer"]["rate"], [0.5, 0.5], atol=1e-6)
    np.testing.assert_allclose(nxt.wealth, [0.7 + 0.79 - 0.5, 0.0, 0.79, 0.7], atol=1e-5)
    np.testing.assert_allclose(float(nxt.fund), 4.0 - 1.0, atol=1e-6)
    np.testing.assert_allclose(comps["university"]["fair"], [0.0, 0.0], atol=1e-6)


# ------------------------------------------------------------------- vectorised step == numpy reference
def _numpy_loan_step(st, actions, p, noise, bins):
    """Plain-Python float64 loop over individuals (independent reference of LoanMAFE.transition)."""
    score, inc, grp = (np.asarray(st.score, np.float64), np.asarray(st.income, np.float64),
                       np.asarray(st.group))
    m = len(score)
    ab, aa = np.asarray(actions["bank"], np.float64), np.asarray(actions["agency"], np.float64)
    rate = ab[2 * bins] * p.rate_max
    edges = np.linspace(300, 850, bins + 1)

    def binof(x):
        return int(min(max(np.searchsorted(edges, x, side="right") - 1, 0), bins - 1))

    new = score.copy()
    appr, dflt = np.zeros(2), np.zeros(2)
    profit = 0.0
    for i in range(m):
        obs = min(max(score[i] - p.report_bias * (1 - p.bias_correction) * grp[i], 300), 850)
        row = 0 if p.group_blind > 0.5 else grp[i]
        a = float(noise["u_approve"][i] < ab[row * bins + binof(obs)])
        rho = 1 / (1 + math.exp(-(p.a * (score[i] - p.s0) / 100 - p.b * rate + p.c_income * math.log(inc[i]))))
        r = float(noise["u_repay"][i] < rho)
        new[i] += a * r * p.gain - a * (1 - r) * p.loss + (1 - a) * p.drift
        appr[grp[i]] += a
        dflt[grp[i]] += a * (1 - r)
        profit += a * r * rate - a * (1 - r)
    shares = aa / aa.sum()
    budget = min(p.subsidy_budget * m, float(st.capital))
    cnt = np.zeros((2, bins))
    for i in range(m):
        cnt[grp[i], binof(score[i])] += 1
    spent = 0.0
    for i in range(m):
        g, b = grp[i], binof(score[i])
        boost = min(shares[g * bins + b] * budget / cnt[g, b], p.max_boost)
        new[i] += boost
        spent += boost
    new = np.clip(new, 300, 850)
    n = np.bincount(grp, minlength=2).astype(float)
    return new, float(st.capital) - spent, profit / m, appr / n


def test_loan_vectorised_step_equals_numpy_loop():
    env = LoanMAFE(num_individuals=30, num_bins=4, horizon=3)
    for over in ({}, {"group_blind": 1.0, "report_bias": 60.0, "bias_correction": 0.25, "subsidy_budget": 4.0}):
        p = env.default_params(**over)
        st, _ = env.reset(jax.random.key(1), p)
        acts = _random_actions(env, jax.random.key(2))
        noise = env.draw_noise(jax.random.key(3), st, p)
        nxt, comps = jax.jit(env.transition)(st, acts, p, noise)
        new, cap, profit, appr_rate = _numpy_loan_step(st, acts, p, noise, 4)
        np.testing.assert_allclose(nxt.score, new, rtol=1e-5, atol=1e-3)
        np.testing.assert_allclose(float(nxt.capital), cap, rtol=1e-5)
        np.testing.assert_allclose(float(comps["bank"]["reward"][0]), profit, atol=1e-5)
        np.testing.assert_allclose(comps["bank"]["rate"][:2], appr_rate, atol=1e-6)


def test_health_vectorised_step_equals_numpy_loop():
    env = HealthcareMAFE(num_individuals=25, num_bins=3, horizon=3)
    p = env.default_params(capacity=0.2, premium_subsidy=0.5)
    st, _ = env.reset(jax.random.key(1), p)
    acts = _random_actions(env, jax.random.key(2))
    noise = {k: np.asarray(v, np.float64) for k, v in env.draw_noise(jax.random.key(3), st, p).items()}
    nxt, comps = env.transition(st, acts, p, {k: jnp.asarray(v, jnp.float32) for k, v in noise.items()})
    h, y0, g = (np.asarray(x, np.float64) for x in (st.health, st.base_income, st.group))
    g = g.astype(int)
    ai, ah = np.asarray(acts["insurer"], np.float64), np.asarray(acts["hospital"], np.float64)
    prem = ai[3] * p.premium_max
    inc = np.asarray(st.income, np.float64)
    ill, enr, want = np.zeros(25), np.zeros(25), np.zeros(25)
    for i in range(25):
        b = min(int(h[i] * 3), 2)
        pe = prem * (1 - p.premium_subsidy * g[i])
        ill[i] = noise["u_ill"][i] < p.p_ill0 + p.p_ill_slope * (1 - h[i])
        enr[i] = noise["u_enrol"][i] < ai[b] / (1 + math.exp(-p.afford_k * (inc[i] - pe)))
        want[i] = ill[i] and noise["u_want"][i] < ah[int(enr[i]) * 3 + b]
    cap = int(math.floor(p.capacity * 25))
    order = [i for i in np.argsort(noise["u_priority"]) if want[i]][:cap]
    treated = np.zeros(25)
    treated[order] = 1
    new_h = h.copy()
    for i in range(25):
        ps = p.success_insured if enr[i] else p.success_uninsured
        s = treated[i] * (noise["u_success"][i] < ps)
        new_h[i] = min(max(h[i] + s * p.treat_gain - (ill[i] - s) * p.illness_loss + (1 - ill[i]) * p.recover, 0), 1)
    np.testing.assert_allclose(nxt.health, new_h, atol=1e-5)
    np.testing.assert_allclose(float(comps["hospital"]["reward"][2] + comps["hospital"]["reward"][3]),
                               treated.sum())
    assert treated.sum() <= cap


def test_education_vectorised_step_equals_numpy_loop():
    env = EducationMAFE(num_individuals=24, num_bins=3, horizon=3)
    p = env.default_params(seats=0.25, scholarship_fund=0.05, quota_floor=0.3)
    st, _ = env.reset(jax.random.key(1), p)
    st = st._replace(wealth=st.wealth * 0.5)
    acts = _random_actions(env, jax.random.key(2))
    nz = env.draw_noise(jax.random.key(3), st, p)
    nxt, comps = env.transition(st, acts, p, nz)
    n = {k: np.asarray(v, np.float64) for k, v in nz.items()}
    w, g = np.asarray(st.wealth, np.float64), np.asarray(st.group).astype(int)
    au, ae = np.asarray(acts["university"], np.float64), np.asarray(acts["employer"], np.float64)
    m, tu = 24, p.tuition

    def binof(x):
        return min(max(int(math.floor(x * 3)), 0), 2)

    k = np.clip(p.mean_innate + p.std_innate * n["z_innate"] + p.prep * np.tanh(w), 0, 1)
    want = np.zeros(m)
    for i in range(m):
        pa = au[g[i] * 3 + binof(k[i] + p.test_noise * n["z_test"][i])]
        if g[i] == 1:
            pa = max(pa, p.quota_floor)
        want[i] = n["u_admit"][i] < pa
    admitted = np.zeros(m)
    admitted[[i for i in np.argsort(n["u_priority"]) if want[i]][:int(math.floor(p.seats * m))]] = 1
    req = sum(au[6] * tu * admitted[i] * g[i] for i in range(m))
    scale = min(1.0, float(st.fund) / req) if req > 0 else 0.0
    new_w, hires = np.zeros(m), np.zeros(2)
    for i in range(m):
        cover = au[6] * g[i] * scale
        enr = admitted[i] * (n["u_enrol"][i] < min(max((w[i] + cover * tu) / tu, 0), 1))
        grad = enr * (n["u_grad"][i] < k[i])
        k2 = min(k[i] + grad * p.skill_growth, 1.0)
        hire = n["u_hire"][i] < ae[int(grad) * 3 + binof(k2 + p.signal_noise * n["z_signal"][i])]
        new_w[i] = max(p.decay * w[i] + hire * (p.wage_base + p.wage_skill * k2) - enr * tu * (1 - cover), 0)
        hires[g[i]] += hire
    np.testing.assert_allclose(nxt.wealth, new_w, atol=1e-5)
    np.testing.assert_allclose(comps["university"]["reward"][2] + comps["university"]["reward"][3], admitted.sum())
    np.testing.assert_allclose(comps["employer"]["reward"][1:], hires)


# ---------------------------------------------------------------------------------------- fairness metrics
def _mirrored_loan_state(scores, incomes):
    k = len(scores)
    return LoanState(score=jnp.asarray(np.concatenate([scores, scores]), jnp.float32),
                     income=jnp.asarray(np.concatenate([incomes, incomes]), jnp.float32),
                     group=jnp.asarray([0] * k + [1] * k, jnp.int32), capital=jnp.asarray(1e6, jnp.float32),
                     t=jnp.asarray(0))


def test_fairness_zero_for_identical_groups_and_symmetric_under_swap():
    rng = np.random.default_rng(0)
    scores, incomes = rng.uniform(350, 800, 10), rng.uniform(0.5, 1.5, 10)
    env = LoanMAFE(num_individuals=20, num_bins=4, horizon=3)
    p = env.default_params(deterministic=1.0)
    blind = jnp.concatenate([jnp.tile(jnp.array([0.2, 0.5, 0.7, 0.9]), 2), jnp.array([0.4])])
    even = jnp.ones(9).at[-1].set(0.0)
    noise = env.draw_noise(jax.random.key(0), None, p)
    _, comps = env.transition(_mirrored_loan_state(scores, incomes), {"bank": blind, "agency": even}, p, noise)
    for a in env.agents:
        np.testing.assert_allclose(comps[a]["fair"], 0.0, atol=1e-5)
    # swap: group 0 and group 1 distributions exchanged (p_1 = 0.5), with a group-aware bank whose rows swap too.
    s2 = rng.uniform(300, 700, 10)
    st = LoanState(score=jnp.asarray(np.concatenate([scores, s2]), jnp.float32),
                   income=jnp.ones(20), group=jnp.asarray([0] * 10 + [1] * 10), capital=jnp.asarray(1e6),
                   t=jnp.asarray(0))
    st_sw = st._replace(group=1 - st.group)
    aware = jnp.array([0.1, 0.3, 0.8, 1.0, 0.5, 0.6, 0.7, 0.9, 0.4])
    aware_sw = jnp.concatenate([aware[4:8], aware[:4], aware[8:]])
    ag = jnp.arange(9.0)
    ag_sw = jnp.concatenate([ag[4:8], ag[:4], ag[8:]])
    _, c1 = env.transition(st, {"bank": aware, "agency": ag}, p, noise)
    _, c2 = env.transition(st_sw, {"bank": aware_sw, "agency": ag_sw}, p, noise)
    for a in env.agents:
        np.testing.assert_allclose(c1[a]["fair"], c2[a]["fair"], rtol=1e-5, atol=1e-5)
        assert np.max(np.asarray(c1[a]["fair"])) > 1e-3  # not trivially zero
    np.testing.assert_allclose(c1["bank"]["rate"][:2], c2["bank"]["rate"][1::-1], atol=1e-6)


def test_gap_helpers():
    np.testing.assert_allclose(core.abs_gap(jnp.array([0.3, 0.7])), 0.4, atol=1e-7)
    np.testing.assert_allclose(core.ratio_gap(jnp.array([0.2, 0.8])), 0.75, atol=1e-7)
    assert float(core.ratio_gap(jnp.zeros(2))) == 0.0
    x, g = jnp.array([1.0, 2.0, 3.0, 4.0, 5.0]), jnp.array([0, 1, 1, 0, 1])
    np.testing.assert_allclose(core.group_sum(x, g), [5.0, 10.0])
    np.testing.assert_allclose(core.group_mean(x, g), [2.5, 10 / 3], rtol=1e-6)
    np.testing.assert_allclose(core.group_bin_sum(x, g, jnp.array([0, 1, 0, 0, 1]), 2), [[5, 0], [3, 7]])


# --------------------------------------------------------------------------- intervention monotonicity
def test_larger_subsidy_to_group1_weakly_reduces_score_gap():
    env = LoanMAFE(num_individuals=200, num_bins=4, horizon=3)
    agency_to_g1 = jnp.concatenate([jnp.zeros(4), jnp.ones(4), jnp.zeros(1)])
    bank = jnp.concatenate([jnp.full((8,), 0.6), jnp.array([0.3])])
    gaps = []
    for budget in (0.0, 1.0, 3.0, 10.0, 30.0):
        p = env.default_params(deterministic=1.0, subsidy_budget=budget, max_boost=25.0)
        st, _ = env.reset(jax.random.key(0), p)
        _, comps = env.transition(st, {"bank": bank, "agency": agency_to_g1}, p, env.draw_noise(jax.random.key(1), st, p))
        gaps.append(float(comps["bank"]["fair"][1]))
    assert all(b <= a + 1e-6 for a, b in zip(gaps, gaps[1:])), gaps
    assert gaps[-1] < gaps[0] - 0.05


def test_bias_correction_and_premium_subsidy_monotone():
    env = LoanMAFE(num_individuals=300, num_bins=5, horizon=2)
    bank = jnp.concatenate([jnp.array([0.0, 0.0, 0.5, 1.0, 1.0] * 2), jnp.array([0.3])])
    agency = jnp.zeros(11).at[-1].set(1.0)
    gaps = []
    for corr in (0.0, 0.5, 1.0):
        p = env.default_params(deterministic=1.0, report_bias=80.0, bias_correction=corr)
        st, _ = env.reset(jax.random.key(0), p)
        _, c = env.transition(st, {"bank": bank, "agency": agency}, p, env.draw_noise(jax.random.key(1), st, p))
        gaps.append(float(c["bank"]["fair"][0]))
    assert gaps[0] >= gaps[1] >= gaps[2] and gaps[0] > gaps[2]
    env = HealthcareMAFE(num_individuals=300, num_bins=3, horizon=2)
    cov = []
    for sub in (0.0, 0.5, 1.0):
        p = env.default_params(deterministic=1.0, premium_subsidy=sub)
        st, _ = env.reset(jax.random.key(0), p)
        _, c = env.transition(st, {"insurer": jnp.array([1, 1, 1, 0.8]), "hospital": jnp.full((6,), 0.5)}, p,
                              env.draw_noise(jax.random.key(1), st, p))
        cov.append(float(c["insurer"]["rate"][1]))
    assert cov[0] <= cov[1] <= cov[2] and cov[2] > cov[0]


# ----------------------------------------------------------------------------------------- bad input
def test_bad_input_errors_name_the_argument():
    with pytest.raises(ValueError, match="num_individuals"):
        LoanMAFE(num_individuals=1)
    with pytest.raises(ValueError, match="horizon"):
        HealthcareMAFE(horizon=0)
    with pytest.raises(ValueError, match="num_bins"):
        EducationMAFE(num_bins=0)
    env = LoanMAFE(num_individuals=10, num_bins=2, horizon=2)
    with pytest.raises(ValueError, match="overrides"):
        env.default_params(not_a_field=1.0)
    with pytest.raises(ValueError, match="fixed_agency"):
        loan_policy(env, fixed_agency="bogus")
    with pytest.raises(ValueError, match=r"actions\['bank'\] must have shape \(5,\)"):
        core.check_actions(env, {"bank": np.zeros(3), "agency": np.zeros(5)})
    with pytest.raises(ValueError, match="actions must have one entry per agent"):
        core.check_actions(env, {"bank": np.zeros(5)})
    w = env.default_weights()
    w["bank"] = {**w["bank"], "fair": np.ones(2)}
    with pytest.raises(ValueError, match=r"weights\['bank'\]\['fair'\] must have shape \(3,\)"):
        fmacem.make_objective(env, env.default_params(), loan_policy(env), w, lam=0.0)
    obj = lambda th, k: -jnp.sum(th ** 2, -1)  # noqa: E731
    for kw, pat in (({"num_candidates": 1}, "num_candidates"), ({"elite_frac": 0.0}, "elite_frac"),
                    ({"alpha": 1.5}, "alpha"), ({"iterations": 0}, "iterations"), ({"noise_start": -1.0}, "noise_start")):
        with pytest.raises(ValueError, match=pat):
            fmacem.cem(obj, jax.random.key(0), jnp.zeros(2), 1.0, **kw)
    with pytest.raises(ValueError, match="mean0"):
        fmacem.cem(obj, jax.random.key(0), jnp.zeros((2, 2)), 1.0)
    with pytest.raises(ValueError, match="num_episodes"):
        fmacem.make_objective(env, env.default_params(), loan_policy(env), env.default_weights(), lam=0.0,
                              num_episodes=0)
    with pytest.raises(ValueError, match="rounds"):
        fmacem.independent_fmacem(env, env.default_params(), loan_policy(env), env.default_weights(),
                                  jax.random.key(0), lam=0.0, rounds=0)
