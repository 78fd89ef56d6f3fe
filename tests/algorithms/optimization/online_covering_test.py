"""Tests for algorithms.optimization.online_covering (classical online algorithms, exact optima, wrappers).

Independent references: brute force over all solutions on tiny instances, closed forms (fractional
updates, star / path / diamond Steiner instances, two-point Meyerson expectation by Monte Carlo with a
tolerance from the trial count), the LP relaxation (scipy linprog), and the proven worst-case bounds.
"""

import itertools
import math

import numpy as np
import pytest

from algorithms.optimization import online_covering as oc

SEEDS = range(3)


def _scenarios(seed):
    """Small instances of the four problems (exact optimum cheap) and their request counts."""
    rng = np.random.default_rng(seed)
    return [
        (oc.set_cover_scenario(rng, num_sets=15, num_elements=30, density=0.15, num_decoys=6), 12),
        (oc.facility_location_scenario(rng, num_points=30, opening_cost=0.5, num_decoys=6), 12),
        (oc.steiner_scenario(rng, num_vertices=25, radius=0.35, num_decoys=4), 7),
        (oc.parking_permit_scenario(rng, durations=(1, 7, 28, 112), costs=(1.0, 4.0, 10.0, 30.0)), 20),
    ]


def _predictions(rng, sc, req):
    k = req.size
    return {
        "exact": req.copy(),
        "noisy": oc.perturb_prediction(rng, req, pool=sc.candidates, p_miss=0.4, num_false=k // 2),
        "disjoint": oc.perturb_prediction(rng, req, pool=sc.candidates, p_miss=1.0, num_false=k),
        "decoys": np.concatenate([req, sc.decoys[: min(k, sc.decoys.size)]]),
        "empty": np.zeros(0, np.int64),
    }


@pytest.fixture(scope="module")
def cases():
    """(scenario, requests, predictions, OPT) for several seeds and all four problems."""
    out = []
    for seed in SEEDS:
        for sc, k in _scenarios(seed):
            rng = np.random.default_rng(100 + seed)
            req = oc.sample_requests(rng, sc, k)
            out.append((sc, req, _predictions(rng, sc, req), sc.problem.optimum(req)))
    return out


@pytest.fixture(scope="module")
def runs(cases):
    """Every algorithm and wrapper on every case, with the solution history recorded."""
    out = []
    for sc, req, preds, opt in cases:
        prob = sc.problem
        out.append((prob, req, "online", opt, oc.run_online(prob, req, seed=1, record=True)))
        for pname, pred in preds.items():
            sol = prob.offline(pred)
            for wname, fn in (("trust", oc.run_trust), ("lazy", oc.run_lazy), ("robust", oc.run_robust)):
                res = fn(prob, req, pred, seed=1, offline_solution=sol, record=True)
                out.append((prob, req, f"{wname}/{pname}", opt, res))
    return out


# ------------------------------------------------------------------------------- acceptance: feasibility
def test_every_output_feasible_monotone_and_no_better_than_optimum(runs):
    for prob, req, name, opt, res in runs:
        prev = np.zeros(prob.num_elements, bool)
        for t, mask in enumerate(res.history):
            assert prob.feasible(mask, req[: t + 1]), (prob.name, name, t)
            assert np.all(mask >= prev), f"{prob.name}/{name}: an element was removed at step {t}"
            assert np.isclose(res.cumulative_cost[t], prob.cost(mask)), (prob.name, name, t)
            prev = mask
        assert res.cost >= opt - 1e-9 * max(1.0, opt), (prob.name, name, res.cost, opt)


# ---------------------------------------------------------------------------- acceptance: robustness
def test_robust_within_constant_of_plain_online_and_lazy(cases):
    bound = oc.robust_constant(2.0)
    assert bound == pytest.approx(6.0)
    for sc, req, preds, _ in cases:
        for pred in preds.values():
            for seed in (0, 7):
                r = oc.run_robust(sc.problem, req, pred, seed=seed)
                on = oc.run_online(sc.problem, req, seed=seed).cost
                lazy = oc.run_lazy(sc.problem, req, pred, seed=seed).cost
                # The virtual runs are the plain algorithms with the same seed ...
                assert r.info["cost_fallback"] == pytest.approx(on)
                assert r.info["cost_primary"] == pytest.approx(lazy)
                # ... and the switch-before-pay rule keeps the cost within 6 x the better of them.
                assert r.cost <= bound * min(on, lazy) + 1e-9, (sc.problem.name, r.cost, on, lazy)


def test_robust_switches_away_from_a_bad_lazy_solution():
    """Predictions whose offline solution is one expensive shared element while few requests arrive:
    lazy pays that element, robust switches to ON before paying and stays within 6 x ON."""
    n = 100
    mem = np.zeros((n + 1, n), bool)
    mem[0] = True  # one big set of cost 50 covering everything ...
    mem[1 + np.arange(n), np.arange(n)] = True  # ... and singletons of cost 1
    sc_prob = oc.SetCoverProblem(mem, np.concatenate([[50.0], np.ones(n)]))
    park = oc.ParkingPermitProblem(336, (1, 7, 28, 336), (1.0, 4.0, 10.0, 80.0))
    for prob, req, pred in ((sc_prob, [3], np.arange(n)), (park, [5, 200], np.arange(336))):
        lazy = oc.run_lazy(prob, req, pred).cost
        on = oc.run_online(prob, req).cost
        rob = oc.run_robust(prob, req, pred)
        assert lazy >= 50.0 > 6 * on
        assert rob.info["switches"] >= 1 and rob.cost <= 6 * on


def test_trust_fails_on_expensive_false_predictions_but_lazy_and_robust_do_not():
    rng = np.random.default_rng(5)
    sc = oc.facility_location_scenario(rng, num_points=40, opening_cost=1.0, num_decoys=20)
    req = oc.sample_requests(rng, sc, 20)
    pred = np.concatenate([req, sc.decoys])
    opt = sc.problem.optimum(req)
    # Each decoy is > 2f from everything: OFF pays f per decoy on top of OPT(R).
    assert oc.run_trust(sc.problem, req, pred, seed=0).cost == pytest.approx(opt + 20 * 1.0, rel=1e-9)
    assert oc.run_lazy(sc.problem, req, pred, seed=0).cost == pytest.approx(opt, rel=1e-9)
    assert oc.run_robust(sc.problem, req, pred, seed=0).cost <= 6 * oc.run_online(sc.problem, req, seed=0).cost


def test_trust_guarantee_offline_plus_residual_online(cases):
    """ON serves at most eta_miss requests inside U, and U pays at least its upfront OFF(R_hat)."""
    for sc, req, preds, _ in cases:
        for pred in preds.values():
            res = oc.run_trust(sc.problem, req, pred, seed=3)
            assert res.info["n_online"] <= oc.prediction_error(req, pred).eta_miss
            assert res.cost >= res.info["offline_cost"] - 1e-9


# --------------------------------------------------------------------------- acceptance: consistency
def test_accurate_predictions_give_ratio_one(cases):
    for sc, req, preds, opt in cases:
        prob = sc.problem
        for fn in (oc.run_trust, oc.run_lazy):
            res = fn(prob, req, req, seed=0)
            assert res.cost == pytest.approx(opt, rel=1e-9), (prob.name, fn.__name__)
            assert res.info["n_online"] == 0  # ON is never invoked
        assert oc.run_robust(prob, req, req, seed=0).cost <= oc.robust_constant(2.0) * opt + 1e-9


def test_accurate_predictions_mean_ratio_near_one_robust():
    """With R_hat = R, the robust wrapper's mean ratio is near 1 and below the plain online ratio."""
    ratios_r, ratios_on = [], []
    for seed in range(6):
        for sc, k in _scenarios(seed):
            req = oc.sample_requests(np.random.default_rng(seed), sc, k)
            opt = sc.problem.optimum(req)
            ratios_r.append(oc.run_robust(sc.problem, req, req, seed=seed).cost / opt)
            ratios_on.append(oc.run_online(sc.problem, req, seed=seed).cost / opt)
    assert np.mean(ratios_r) <= 1.25
    assert np.mean(ratios_r) < np.mean(ratios_on)


# ------------------------------------------------------------------------------------- exact optima
def test_set_cover_milp_matches_brute_force():
    for seed in range(4):
        sc = oc.set_cover_scenario(np.random.default_rng(seed), num_sets=9, num_elements=12, density=0.25,
                                   num_decoys=0)
        prob = sc.problem
        req = oc.sample_requests(np.random.default_rng(seed), sc, 8)
        bits = ((np.arange(1 << 9)[:, None] >> np.arange(9)) & 1).astype(bool)
        feasible = (bits.astype(int) @ prob.membership[:, req].astype(int) > 0).all(1)
        best = (bits @ prob.element_costs)[feasible].min()
        assert prob.optimum(req) == pytest.approx(best)
        assert prob.offline(req).cost == pytest.approx(best)


def test_facility_location_milp_matches_brute_force():
    for seed, f in itertools.product(range(3), (0.2, 0.7)):
        rng = np.random.default_rng(seed)
        prob = oc.FacilityLocationProblem(rng.random((8, 2)), f)
        req = rng.choice(8, 6, replace=False)
        best = math.inf
        for size in range(1, 9):
            for fac in itertools.combinations(range(8), size):
                best = min(best, f * size + prob.dist[np.ix_(fac, req)].min(0).sum())
        assert prob.optimum(req) == pytest.approx(best)
        assert prob.offline(req).cost == pytest.approx(best)


def test_steiner_dreyfus_wagner_matches_brute_force_and_kmb_within_two():
    rng = np.random.default_rng(0)
    n = 8
    chords = [(u, v) for u in range(n) for v in range(u + 2, n)]
    for _ in range(3):
        extra = [chords[i] for i in rng.choice(len(chords), 4, replace=False)]
        edges = np.array([(i, i + 1) for i in range(n - 1)] + extra)  # a path plus 4 chords: 11 edges
        prob = oc.SteinerTreeProblem(n, edges, rng.uniform(0.5, 2.0, len(edges)), root=0)
        req = np.array([2, 5, 7, 3])
        best = math.inf
        for bits in range(1 << prob.num_elements):
            mask = np.array([(bits >> e) & 1 for e in range(prob.num_elements)], bool)
            c = prob.cost(mask)
            if c < best and prob.feasible(mask, req):
                best = c
        assert prob.optimum(req) == pytest.approx(best)
        exact = prob.offline(req)
        assert exact.cost == pytest.approx(best)
        assert prob.feasible(np.isin(np.arange(prob.num_elements), exact.elements), req)
        mask = np.isin(np.arange(prob.num_elements), prob._kmb(req))
        assert prob.feasible(mask, req)
        assert best - 1e-9 <= prob.cost(mask) <= 2 * (1 - 1 / 5) * best + 1e-9


def test_parking_dp_matches_brute_force_on_16_days():
    prob = oc.ParkingPermitProblem(16, (1, 2, 4, 8), (1.0, 1.7, 3.1, 5.5))
    big = np.arange(16, prob.num_elements)  # the 14 permits longer than a day
    bits = (np.arange(1 << big.size)[:, None] >> np.arange(big.size)) & 1  # every set of long permits
    contains = np.array([[big[i] in prob.permits_of(d) for d in range(16)] for i in range(big.size)]).astype(int)
    rng = np.random.default_rng(0)
    for _ in range(4):
        req = np.sort(rng.choice(16, rng.integers(3, 12), replace=False))
        covered = (bits @ contains[:, req]) > 0
        # ... completed optimally by day permits for the request days they leave uncovered.
        best = float((bits @ prob.element_costs[big] + (~covered).sum(1) * 1.0).min())
        assert prob.optimum(req) == pytest.approx(best)
        assert prob.offline(req).cost == pytest.approx(best)


def test_offline_responsibility_covers_each_request(cases):
    for sc, req, preds, _ in cases:
        prob = sc.problem
        for pred in preds.values():
            sol = prob.offline(pred)
            assert set(sol.responsible) == set(pred.tolist())
            for r, els in sol.responsible.items():
                assert np.all(np.isin(els, sol.elements))
                mask = np.zeros(prob.num_elements, bool)
                mask[els] = True
                assert prob.covered(mask, r)


# ------------------------------------------------------------------------------ classical algorithms
def test_fractional_set_cover_closed_form_single_set():
    # One element in one set of cost c: x <- x (1 + 1/c) + 1/c until x >= 1.
    for c, expected in ((1.0, 1.0), (2.0, 1.25), (4.0, 0.25 * 1.25 ** 3 + 0.25 * (1.25 ** 2 + 1.25 + 1))):
        xs, cost = oc.fractional_set_cover(np.ones((1, 1), bool), [c], [0])
        assert xs[-1, 0] == pytest.approx(expected)
        assert cost == pytest.approx(c * expected)


def test_fractional_set_cover_feasible_and_log_competitive_against_lp():
    for seed in range(5):
        sc = oc.set_cover_scenario(np.random.default_rng(seed), num_sets=20, num_elements=40, num_decoys=0)
        prob = sc.problem
        req = oc.sample_requests(np.random.default_rng(seed), sc, 30)
        xs, cost = oc.fractional_set_cover(prob.membership, prob.element_costs, req)
        for t, e in enumerate(req):
            assert xs[t][prob.sets_of[e]].sum() >= 1 - 1e-12  # every arrived element covered fractionally
        assert np.all(np.diff(xs, axis=0) >= 0)
        lp = oc.set_cover_lp(prob.membership, prob.element_costs, req)
        d_max = max(prob.sets_of[e].size for e in req)
        assert lp - 1e-9 <= cost <= 4 * math.log(1 + 3 * d_max) * lp


def test_imase_waxman_star_and_path_exact_costs():
    w = np.array([0.5, 1.0, 2.0, 3.0])
    star = oc.SteinerTreeProblem(5, [(0, i) for i in range(1, 5)], w, root=0)
    assert oc.run_online(star, [3, 1, 4]).cost == pytest.approx(2.0 + 0.5 + 3.0)
    path = oc.SteinerTreeProblem(5, [(i, i + 1) for i in range(4)], w, root=0)
    res = oc.run_online(path, [2, 4, 1])
    assert list(res.cumulative_cost) == pytest.approx([1.5, 6.5, 6.5])
    assert res.cost == pytest.approx(path.optimum([2, 4, 1]))  # greedy is optimal on trees


@pytest.mark.parametrize("levels", [1, 2, 3, 4])
def test_imase_waxman_diamond_lower_bound_grows_like_log_k(levels):
    prob, req = oc.diamond_adversary(levels)
    assert req.size == 2 ** levels
    assert oc.run_online(prob, req).cost == pytest.approx(1.0 + levels / 2)  # = 1 + log2(k) / 2
    if req.size <= 8:
        assert prob.optimum(req) == pytest.approx(1.0)  # all terminals on one s-t path
    assert oc.run_lazy(prob, req, req).cost == pytest.approx(1.0)  # the predicted request set helps


def test_meyerson_degenerate_cases():
    pts = np.random.default_rng(0).random((6, 2))
    res = oc.run_online(oc.FacilityLocationProblem(pts, 0.0), np.arange(6))
    assert res.cost == 0.0 and np.all(res.owned[:6])  # f = 0: a facility at every client
    res = oc.run_online(oc.FacilityLocationProblem(np.zeros((5, 2)), 3.0), np.arange(5))
    assert res.cost == pytest.approx(3.0) and res.owned[:5].sum() == 1  # coinciding clients: one facility


def test_meyerson_two_point_expectation_monte_carlo():
    f, d, n = 1.0, 0.3, 10_000
    prob = oc.FacilityLocationProblem(np.array([[0.0, 0.0], [d, 0.0]]), f)
    costs = np.array([oc.run_online(prob, [0, 1], seed=s).cost for s in range(n)])
    p = d / f
    expected = f + p * f + (1 - p) * d  # = f + 2d - d^2 / f
    se = (f - d) * math.sqrt(p * (1 - p) / n)
    assert abs(costs.mean() - expected) < 4 * se
    assert set(np.round(costs, 9)) == {round(f + f, 9), round(f + d, 9)}


def test_parking_primal_dual_within_k_of_optimum():
    for seed in range(5):
        sc = oc.parking_permit_scenario(np.random.default_rng(seed))
        req = oc.sample_requests(np.random.default_rng(seed), sc, 60)
        opt = sc.problem.optimum(req)
        assert opt - 1e-9 <= oc.run_online(sc.problem, req).cost <= len(sc.problem.durations) * opt + 1e-9


def test_online_set_cover_rounding_feasible_at_every_step():
    sc = oc.set_cover_scenario(np.random.default_rng(3), num_sets=25, num_elements=50, num_decoys=0)
    req = oc.sample_requests(np.random.default_rng(3), sc, 40)
    opt = sc.problem.optimum(req)
    for seed in range(5):
        res = oc.run_online(sc.problem, req, seed=seed, record=True)
        assert all(sc.problem.feasible(m, req[: t + 1]) for t, m in enumerate(res.history))
        assert res.cost >= opt - 1e-9


# ---------------------------------------------------------------------------------- prediction error
def test_prediction_error_counts_and_matching():
    assert oc.prediction_error([1, 2, 3, 4], [3, 4, 5]) == oc.PredictionError(eta_miss=2, eta_false=1, eta=3)
    d = np.abs(np.subtract.outer(np.arange(10.0), np.arange(10.0)))
    assert oc.matching_error([1, 2], [1, 2], d, unmatched_cost=5.0) == 0.0
    assert oc.matching_error([0, 5], [1, 9], d, unmatched_cost=2.0) == pytest.approx(1.0 + 2.0 + 2.0)
    assert oc.matching_error([0], [9], d, unmatched_cost=1.0) == pytest.approx(2.0)  # = unmatched * eta


# ------------------------------------------------------------------------------------------- errors
def test_bad_inputs_raise_named_errors():
    sc = oc.set_cover_scenario(np.random.default_rng(0), num_sets=5, num_elements=10, num_decoys=0)
    with pytest.raises(ValueError, match="requests must not repeat"):
        oc.run_online(sc.problem, [1, 1])
    with pytest.raises(ValueError, match="requests must lie in"):
        oc.run_online(sc.problem, [10])
    with pytest.raises(ValueError, match="predicted must lie in"):
        oc.run_lazy(sc.problem, [1], [99])
    with pytest.raises(ValueError, match="lam must be > 1"):
        oc.run_robust(sc.problem, [1], [1], lam=1.0)
    with pytest.raises(ValueError, match="offline_solution"):
        oc.run_trust(sc.problem, [1], [1, 2], offline_solution=sc.problem.offline([1]))
    with pytest.raises(ValueError, match="durations must be increasing"):
        oc.ParkingPermitProblem(30, (1, 7, 30), (1, 2, 3))
    with pytest.raises(ValueError, match="horizon must be"):
        oc.ParkingPermitProblem(30, (1, 7, 28), (1, 2, 3))
    with pytest.raises(ValueError, match="costs must"):
        oc.SetCoverProblem(np.ones((2, 2), bool), [1.0, 0.0])
    with pytest.raises(ValueError, match="parallel edges"):
        oc.SteinerTreeProblem(3, [(0, 1), (1, 0), (1, 2)], [1.0, 1.0, 1.0])
    with pytest.raises(ValueError, match="num_false"):
        oc.perturb_prediction(np.random.default_rng(0), [0, 1], pool=[0, 1, 2], p_miss=0.0, num_false=2)
    with pytest.raises(ValueError, match="problem must be one of"):
        oc.make_online(object(), np.random.default_rng(0))
