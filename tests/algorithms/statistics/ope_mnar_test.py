"""Tests for algorithms.statistics.ope_mnar (simulator, bridge functions, ProxFQE and its baselines).

Ground truths are independent of the implementation: an exact dynamic program on a tabular MNAR MDP
(numpy, with its own sampler), the closed-form bridge b(s') = s'/c of a Gaussian toy, an explicit
saddle-point computation of the min-max objective, scikit-learn's KernelRidge and brute-force
leave-one-out, Monte Carlo conditional means, and the paper's published true values.
"""

import math

import jax
import numpy as np
import pytest
from scipy import optimize
from sklearn.kernel_ridge import KernelRidge

from algorithms.statistics import ope_mnar as om

FQE_METHODS = tuple(m for m in om.METHODS if m != "scope_is")  # the estimators that need no behaviour policy


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


# ------------------------------------------------------------------------------------------
# A tabular MNAR MDP: exact value by backward induction, its own numpy sampler.
# ------------------------------------------------------------------------------------------

K, ACTS, RVALS = 3, np.array([-1.0, 1.0]), np.array([0.0, 1.0, 2.0])


def _tabular(reward_coef=2.0, intercept=-1.5):
    rng = np.random.default_rng(0)
    p0 = np.array([0.5, 0.3, 0.2])
    trans = rng.dirichlet(np.ones(K) * 2.0, size=(K, 2))  # P(s' | s, a)  [K, 2, K]
    rew = np.full((K, 2, K, 3), 0.15)  # P(r | s, a, s'): r = level s' with prob 0.7
    for sp in range(K):
        rew[:, :, sp, sp] = 0.7
    logit = (intercept + 0.3 * np.arange(K)[:, None, None] - 0.2 * ACTS[None, :, None]
             + reward_coef * RVALS[None, None, :])
    obs = _sigmoid(logit)  # P(O = 1 | s, a, r)  [K, 2, 3]
    behaviour = np.array([0.3, 0.5, 0.7])  # P(A = +1 | s)
    target = np.array([[0.8, 0.3], [0.6, 0.2], [0.1, 0.9]])  # P(A = +1 | s, o_prev)  [K, 2]
    return dict(p0=p0, trans=trans, rew=rew, obs=obs, behaviour=behaviour, target=target)


def _exact_value(m, horizon, gamma=1.0):
    v_next = np.zeros((K, 2))  # V_{t+1}(s, o)
    for _ in range(horizon):
        q = np.zeros((K, 2))
        for s in range(K):
            for ai in range(2):
                for sp in range(K):
                    for ri in range(3):
                        pr = m["trans"][s, ai, sp] * m["rew"][s, ai, sp, ri]
                        po = m["obs"][s, ai, ri]
                        q[s, ai] += pr * (RVALS[ri] + gamma * (po * v_next[sp, 1] + (1 - po) * v_next[sp, 0]))
        pa = np.stack([1 - m["target"], m["target"]], axis=-1)  # [K, 2(o), 2(a)]
        v_next = np.einsum("soa,sa->so", pa, q)
    return float(m["p0"] @ v_next[:, 0])


def _sample_tabular(rng, m, n, horizon):
    def draw(probs):  # probs [n, c] -> indices
        return (rng.random(len(probs))[:, None] > np.cumsum(probs, axis=1)).sum(axis=1)

    s = draw(np.tile(m["p0"], (n, 1)))
    states, actions, rewards, observed = [s], [], [], []
    for _ in range(horizon):
        ai = (rng.random(n) < m["behaviour"][s]).astype(int)
        sp = draw(m["trans"][s, ai])
        ri = draw(m["rew"][s, ai, sp])
        o = rng.random(n) < m["obs"][s, ai, ri]
        states.append(sp), actions.append(ACTS[ai]), rewards.append(RVALS[ri]), observed.append(o)
        s = sp
    return om.Episodes(states=np.stack(states, 1)[:, :, None].astype(np.float64), actions=np.stack(actions, 1),
                       rewards=np.stack(rewards, 1), observed=np.stack(observed, 1))


def _onehot(idx, size):
    return np.eye(size)[np.asarray(np.round(idx), int)]


def _ai(a):
    return (np.asarray(a) > 0).astype(int)


def _q_features(x):  # x = [s, a]
    return _onehot(x[:, 0] * 2 + _ai(x[:, 1]), 2 * K)


_SIEVE = om.SieveBridge(
    h_features=lambda x: _onehot((x[:, 1] * 2 + _ai(x[:, 2])) * K + x[:, 0], 2 * K * K),  # x = [s', s, a]
    f_features=lambda x: _onehot((x[:, 1] * 2 + _ai(x[:, 2])) * 3 + x[:, 0], 2 * K * 3))  # x = [r, s, a]


def _tab_policy(m):
    def pol(states, o_prev):
        p = m["target"][np.round(states[:, 0]).astype(int), np.asarray(o_prev).astype(int)]
        return np.stack([1 - p, p], axis=1)

    return pol


def _tab_estimates(m, n, horizon, seed, methods=FQE_METHODS, imputation="missing"):
    data = _sample_tabular(np.random.default_rng(seed), m, n, horizon)
    res = om.evaluate(data, _tab_policy(m), methods=methods, bridge=_SIEVE, q_features=_q_features,
                      imputation=imputation)
    return {k: v.value for k, v in res.items()}


def test_tabular_exact_value_matches_monte_carlo_of_the_sampler():
    m = _tabular()
    truth = _exact_value(m, 3)
    rng = np.random.default_rng(1)  # on-policy rollout with the same primitives
    n, total = 200_000, 0.0
    s = (rng.random(n)[:, None] > np.cumsum(m["p0"])).sum(1)
    o = np.zeros(n, int)
    g = np.zeros(n)
    for _ in range(3):
        ai = (rng.random(n) < m["target"][s, o]).astype(int)
        sp = (rng.random(n)[:, None] > np.cumsum(m["trans"][s, ai], 1)).sum(1)
        ri = (rng.random(n)[:, None] > np.cumsum(m["rew"][s, ai, sp], 1)).sum(1)
        o = (rng.random(n) < m["obs"][s, ai, ri]).astype(int)
        g += RVALS[ri]
        s = sp
    total = g.mean()
    assert abs(total - truth) < 4 * g.std() / math.sqrt(n)


def test_tabular_prox_fqe_is_unbiased_and_baselines_are_biased_under_mnar():
    m = _tabular()
    truth = _exact_value(m, 3)
    est = {k: [] for k in FQE_METHODS}
    for seed in range(6):
        for k, v in _tab_estimates(m, 6000, 3, seed).items():
            est[k].append(v - truth)
    mean = {k: np.mean(v) for k, v in est.items()}
    se = {k: np.std(v, ddof=1) / math.sqrt(len(v)) for k, v in est.items()}
    assert abs(mean["prox_fqe"]) < 4 * se["prox_fqe"] + 0.01, (mean, se)
    assert abs(mean["oracle_fqe"]) < 4 * se["oracle_fqe"] + 0.01, (mean, se)
    for k in ("naive_fqe", "mar_impute_fqe", "mar_ipw_fqe"):  # observed rewards are the high ones
        assert mean[k] > 0.1 and mean[k] > 6 * se[k] + abs(mean["prox_fqe"]), (k, mean, se)


def test_tabular_bridge_for_every_row_is_also_unbiased():
    m = _tabular()
    truth = _exact_value(m, 3)
    errs = [_tab_estimates(m, 6000, 3, 20 + s, ("prox_fqe",), imputation="all")["prox_fqe"] - truth for s in range(4)]
    assert abs(np.mean(errs)) < 4 * np.std(errs, ddof=1) / 2 + 0.01, errs


def test_tabular_mar_control_makes_mar_corrections_unbiased():
    m = _tabular(reward_coef=0.0, intercept=0.0)
    truth = _exact_value(m, 3)
    errs = np.array([[v - truth for v in _tab_estimates(m, 6000, 3, seed, ("prox_fqe", "mar_impute_fqe",
                                                                            "mar_ipw_fqe")).values()]
                     for seed in range(4)])
    assert np.all(np.abs(errs.mean(0)) < 4 * errs.std(0, ddof=1) / 2 + 0.01), errs


def test_tabular_prox_fqe_is_consistent():
    m = _tabular()
    truth = _exact_value(m, 3)
    mae = {n: np.mean([abs(_tab_estimates(m, n, 3, 10 + s, ("prox_fqe",))["prox_fqe"] - truth)
                       for s in range(8)]) for n in (300, 4800)}
    assert mae[4800] < 0.5 * mae[300] and mae[4800] < 0.05, mae  # 16x the data: about 4x smaller error


# ------------------------------------------------------------------------------------------
# Bridge functions.
# ------------------------------------------------------------------------------------------

def _toy(n, c, seed):
    rng = np.random.default_rng(seed)
    r = rng.normal(size=n)
    sp = c * r + rng.normal(size=n)
    o = rng.random(n) < _sigmoid(1.0 + 2.0 * r)
    return r, sp, o


def test_sieve_bridge_recovers_closed_form_slope_on_gaussian_toy():
    c = 1.5
    r, sp, o = _toy(2000, c, 0)
    lin = lambda x: np.c_[np.ones(len(x)), x]  # noqa: E731
    fit = om.fit_bridge_sieve(sp[o, None], r[o, None], r[o], lin, lin)
    slope = fit(np.array([[1.0]]))[0] - fit(np.array([[0.0]]))[0]
    assert abs(slope * c - 1.0) < 0.05
    assert abs(fit(sp[:, None]).mean()) < 0.1  # E[R] = 0 over ALL rows
    assert r[o].mean() > 0.4  # the complete-case mean is biased
    # MNAR complete-case regression of R on S' has slope about c / (1 + c^2) != 1 / c.
    assert abs(np.polyfit(sp[o], r[o], 1)[0] * c - 1.0) > 0.25


def test_rkhs_bridge_recovers_gaussian_toy():
    c = 1.5
    r, sp, o = _toy(900, c, 1)
    fit = om.fit_bridge_rkhs_cv(sp[o, None], r[o, None], r[o])
    b = fit(sp[:, None])
    assert abs(b.mean()) < 0.1 < 0.25 < r[o].mean()
    central = np.abs(sp) < 1.5
    slope = np.polyfit(sp[central], b[central], 1)[0]
    assert abs(slope * c - 1.0) < 0.15, slope


def test_rkhs_closed_form_is_the_saddle_point_of_the_min_max_objective():
    rng = np.random.default_rng(2)
    n, gh, gf, alpha_scale = 20, 0.5, 0.7, 0.3
    xh, xf = rng.normal(size=(n, 1)), rng.normal(size=(n, 2))
    y = rng.normal(size=n)
    fit = om.fit_bridge_rkhs(xh, xf, y, gamma_h=gh, gamma_f=gf, alpha_scale=alpha_scale, scale=False)
    delta = 5.0 / n ** 0.4
    mu = alpha_scale * delta ** 4 / (2 * n ** 2 * delta ** 2)
    kh = np.exp(-gh * (xh - xh.T) ** 2)
    kf = np.exp(-gf * ((xf[:, None, :] - xf[None, :, :]) ** 2).sum(-1))

    def inner_sup(u):  # max_beta (2/n) u'Kf beta - (1/n) beta'Kf^2 beta - delta^2 beta'Kf beta, by a linear solve
        beta = np.linalg.lstsq(kf @ kf / n + delta ** 2 * kf, kf @ u / n, rcond=None)[0]
        return 2 / n * u @ kf @ beta - beta @ kf @ kf @ beta / n - delta ** 2 * beta @ kf @ beta

    def outer(a):
        return inner_sup(kh @ a - y) + mu * a @ kh @ a

    a_hat = optimize.minimize(outer, np.zeros(n), method="BFGS", options={"gtol": 1e-12, "maxiter": 5000}).x
    assert np.allclose(kh @ a_hat, fit(xh), atol=2e-4)
    assert outer(np.linalg.lstsq(kh, fit(xh), rcond=None)[0]) <= outer(a_hat) + 1e-8


def test_bridge_recovers_conditional_mean_reward_on_the_simulator():
    p = om.SimParams(intercept=0.3, reward_coef=2.5)
    ep = jax.tree.map(np.asarray, om.simulate(jax.random.key(0), p, num_episodes=450, horizon=8))
    o = ep.observed[:, 0]
    s, a, s1, r = ep.states[:, 0], ep.actions[:, 0], ep.states[:, 1], ep.rewards[:, 0]
    fit = om.fit_bridge_rkhs_cv(np.c_[s1, s, a][o], np.c_[r, s, a][o], r[o])
    # Truth E[R | s, a] by Monte Carlo over S' (U has mean 0), at test points drawn from the data.
    rng = np.random.default_rng(0)
    idx = rng.choice(len(s), 25, replace=False)
    errs = []
    for i in idx:
        sp = 0.9 * s[i] + 0.2 * a[i] + 0.1 * rng.normal(size=(4000, 2))
        z = (0.9 - 0.6 * a[i]) * s[i, 0] - 0.7 * s[i, 1] + 1.3 * sp[:, 0] + 2.0 * sp[:, 1] - 0.4 * a[i]
        truth = _sigmoid(z).mean()
        b = fit(np.c_[sp, np.tile(s[i], (4000, 1)), np.full(4000, a[i])]).mean()
        errs.append(b - truth)
    assert np.sqrt(np.mean(np.square(errs))) < 0.04, errs


def test_sieve_bridge_satisfies_sample_moments_when_just_identified():
    rng = np.random.default_rng(3)
    n = 400
    xf = rng.integers(0, 3, size=(n, 1)).astype(float)
    xh = (xf + rng.integers(0, 2, size=(n, 1))) % 3
    y = xf[:, 0] ** 2
    fit = om.fit_bridge_sieve(xh, xf, y, lambda x: _onehot(x[:, 0], 3), lambda x: _onehot(x[:, 0], 3))
    assert np.allclose(_onehot(xf[:, 0], 3).T @ (y - fit(xh)), 0.0, atol=1e-8)


# ------------------------------------------------------------------------------------------
# FQE engine on the simulator.
# ------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def small_sim():
    p = om.SimParams(intercept=-0.7)
    return p, jax.tree.map(np.asarray, om.simulate(jax.random.key(5), p, num_episodes=60, horizon=8))


def test_prox_fqe_equals_oracle_bitwise_without_missingness(small_sim):
    p, ep = small_sim
    full = ep._replace(observed=np.ones_like(ep.observed))
    res = om.evaluate(full, om.target_policy(p), methods=("prox_fqe", "oracle_fqe", "naive_fqe"))
    assert res["prox_fqe"].value == res["oracle_fqe"].value == res["naive_fqe"].value


def test_fqe_one_step_is_policy_average_of_kernel_ridge(small_sim):
    p, ep = small_sim
    one = om.Episodes(ep.states[:, :2], ep.actions[:, :1], ep.rewards[:, :1], ep.observed[:, :1])
    pol = om.target_policy(p)
    res = om.evaluate(one, pol, methods=("oracle_fqe",))
    lam = res["oracle_fqe"].info["krr_lambdas"][0]
    x = np.c_[one.states[:, 0], one.actions[:, 0]]
    design = om.KernelRidgeLOO(x)
    ref = KernelRidge(alpha=len(x) * lam, kernel="rbf", gamma=design.gamma).fit(design.z, one.rewards[:, 0])
    s0 = one.states[:, 0]
    q = np.stack([ref.predict(design.scaler(np.c_[s0, np.full(len(s0), a)])) for a in (-1.0, 1.0)], 1)
    expected = float((pol(s0, np.zeros(len(s0))) * q).sum(1).mean())
    assert abs(res["oracle_fqe"].value - expected) < 1e-8
    # The chosen lambda minimises brute-force leave-one-out error over the grid.
    y = one.rewards[:, 0]

    def loo(lm):
        errs = [KernelRidge(alpha=len(x) * lm, kernel="rbf", gamma=design.gamma)
                .fit(np.delete(design.z, i, 0), np.delete(y, i)).predict(design.z[i:i + 1])[0] - y[i]
                for i in range(len(x))]
        return np.mean(np.square(errs))

    grid = np.asarray(om.DEFAULT_KRR_LAMBDAS)
    near = grid[max(0, np.searchsorted(grid, lam) - 2): np.searchsorted(grid, lam) + 3]
    assert min(near, key=loo) == pytest.approx(lam)


# ------------------------------------------------------------------------------------------
# Simulator.
# ------------------------------------------------------------------------------------------

def test_simulator_missing_rates_match_the_paper():
    for c0, (lo, hi) in {0.3: (0.18, 0.22), -0.7: (0.35, 0.42), -1.5: (0.52, 0.56), -2.8: (0.76, 0.80)}.items():
        rate = om.missing_rate(jax.random.key(0), om.SimParams(intercept=c0), horizon=8, num_episodes=6250)
        assert lo <= rate <= hi, (c0, rate)


def test_true_values_match_the_paper_and_policy_reacts_to_missingness():
    paper = {-2.8: 5.581, -1.5: 5.228, -0.7: 4.895, 0.3: 4.480}  # Table (T = 8), 5000 rollouts each
    vals = {}
    for c0, ref in paper.items():
        v, se = om.true_value(jax.random.key(1), om.SimParams(intercept=c0), horizon=8, num_episodes=50_000)
        vals[c0] = v
        assert abs(v - ref) < 3 * math.hypot(se, 0.032), (c0, v, ref, se)  # 0.032: SE of 5000 rollouts
    assert vals[-2.8] - vals[0.3] > 0.8
    # A missingness-unaware target: the value no longer depends on the missingness (common random numbers).
    unaware = [om.true_value(jax.random.key(1), om.SimParams(intercept=c0, target_o_coef=0.0), horizon=8,
                             num_episodes=50_000)[0] for c0 in (-2.8, 0.3)]
    assert unaware[0] == pytest.approx(unaware[1], abs=1e-6)


def test_calibrate_intercept_hits_the_missing_rate():
    p = om.calibrate_intercept(jax.random.key(0), om.SimParams(reward_coef=6.0), 0.5, horizon=8, num_episodes=2000)
    assert abs(om.missing_rate(jax.random.key(9), p, horizon=8, num_episodes=6250) - 0.5) < 0.02


# ------------------------------------------------------------------------------------------
# Errors.
# ------------------------------------------------------------------------------------------

def test_bad_inputs_raise_clear_errors(small_sim):
    p, ep = small_sim
    pol = om.target_policy(p)
    with pytest.raises(ValueError, match="reward_type must be one of"):
        om.SimParams(reward_type="cubic")
    with pytest.raises(ValueError, match="num_episodes must be an int >= 1, got 0"):
        om.simulate(jax.random.key(0), p, num_episodes=0, horizon=2)
    with pytest.raises(ValueError, match="methods must be a non-empty subset"):
        om.evaluate(ep, pol, methods=("dr",))
    with pytest.raises(ValueError, match=r"data.observed must have shape \(60, 8\)"):
        om.evaluate(ep._replace(observed=ep.observed[:, :1]), pol)
    with pytest.raises(ValueError, match="data.actions must take values in action_values"):
        om.evaluate(ep, pol, action_values=(0.0, 1.0))
    with pytest.raises(ValueError, match="oracle_fqe needs all rewards"):
        om.evaluate(ep._replace(rewards=np.where(ep.observed, ep.rewards, np.nan)), pol, methods=("oracle_fqe",))
    with pytest.raises(ValueError, match=r"policy must return \[m, 2\] probabilities"):
        om.evaluate(ep, lambda s, o: np.ones((len(s), 3)) / 3)
    with pytest.raises(ValueError, match="xf must have 5 rows, got 4"):
        om.fit_bridge_rkhs(np.zeros((5, 1)), np.zeros((4, 1)), np.zeros(5), gamma_h=1.0, gamma_f=1.0)
    with pytest.raises(ValueError, match="target_missing_rate must lie in"):
        om.calibrate_intercept(jax.random.key(0), p, 1.5, horizon=2)


# ------------------------------------------------------------------------------------------
# SCOPE-style importance sampling baseline.
# ------------------------------------------------------------------------------------------

def _linear_q(x):
    return np.c_[np.ones(len(x)), x, x[:, :1] * x[:, -1:]]


def test_scope_shaping_telescopes_when_target_equals_behaviour(small_sim):
    _, ep = small_sim
    mu = om.behaviour_policy()
    res = om.evaluate(ep, lambda s, o: mu(s), methods=("scope_is",), behaviour=mu, q_features=_linear_q)
    # rho = 1 everywhere, so the potentials cancel per episode: the observed return with missing as 0.
    expected = float(np.where(ep.observed, ep.rewards.astype(np.float64), 0.0).sum(axis=1).mean())
    assert res["scope_is"].value == pytest.approx(expected, abs=1e-10)
    assert res["scope_is"].info["max_weight"] == pytest.approx(1.0)


def test_scope_is_unbiased_without_missingness_and_biased_under_mnar():
    horizon, n = 2, 4000
    pol, mu = None, om.behaviour_policy()
    out = {}
    for name, intercept in (("none", 12.0), ("mnar", -1.5)):  # missing rates ~0 and ~54%
        p = om.SimParams(intercept=intercept)
        pol = om.target_policy(p)
        ep = jax.tree.map(np.asarray, om.simulate(jax.random.key(11), p, num_episodes=n, horizon=horizon))
        truth, _ = om.true_value(jax.random.key(12), p, horizon=horizon, num_episodes=20_000)
        est = om.evaluate(ep, pol, methods=("scope_is",), behaviour=mu, q_features=_linear_q)["scope_is"].value
        out[name] = (ep, truth, est)
    ep, truth, est = out["none"]
    assert ep.observed.mean() > 0.999
    # Independent brute-force per-decision IS (no shaping) gives the Monte-Carlo tolerance.
    rows, a_idx = np.arange(n), (ep.actions > 0).astype(int)
    o_prev, rho, terms = np.zeros(n), np.ones(n), np.zeros(n)
    for t in range(horizon):
        rho = rho * pol(ep.states[:, t], o_prev)[rows, a_idx[:, t]] / mu(ep.states[:, t])[rows, a_idx[:, t]]
        terms += rho * np.where(ep.observed[:, t], ep.rewards[:, t], 0.0)
        o_prev = ep.observed[:, t].astype(float)
    se = terms.std(ddof=1) / np.sqrt(n)
    assert abs(terms.mean() - truth) < 4 * se
    assert abs(est - truth) < 4 * se
    # Missing rewards count as 0: under 54% MNAR missingness the estimate falls far below the truth.
    _, truth_m, est_m = out["mnar"]
    assert truth_m - est_m > 10 * se


def test_scope_is_needs_the_behaviour_policy(small_sim):
    p, ep = small_sim
    with pytest.raises(ValueError, match="behaviour="):
        om.evaluate(ep, om.target_policy(p), methods=("scope_is",))
