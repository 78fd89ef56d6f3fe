"""Tests for algorithms.statistics.best_arm (SR, SySRs, baselines, hardness, synthetic benchmark).

References are independent of the implementation: exact rational brute force for the schedule, full
enumeration of prompt subsets / permutations on tiny pools (float64 Python) for the error
probabilities, Monte Carlo with tolerances from the number of runs, and hand-computed hardness terms.
"""

import fractions
import itertools
import math
from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from algorithms.statistics import best_arm as ba

F = fractions.Fraction


# ------------------------------------------------------------------------------------------
# Exact references (pure Python / numpy float64).
# ------------------------------------------------------------------------------------------

def _brute_schedule(n, k):
    lb = F(1, 2) + sum(F(1, i) for i in range(2, k + 1))
    out = []
    for phase in range(1, k):
        need = F(n - k) / (lb * (k + 1 - phase))
        m = 0
        while m < need:  # smallest integer >= need, by scanning
            m += 1
        out.append(max(m, out[-1]) if out else m)
    return out


def _brute_pulls(schedule, k):
    """Counts pulls by walking the phases: survivors times new samples per phase."""
    pulls, prev, survivors = 0, 0, k
    for n_k in schedule:
        pulls += (n_k - prev) * survivors
        prev, survivors = n_k, survivors - 1
    return pulls


def _select_prob(sums, best):
    """P(the survivor is a best arm) given per-phase sums [k, p], ties broken uniformly."""
    k, p = sums.shape

    def rec(active, phase):
        if phase == p:
            (a,) = active
            return float(best[a])
        m = min(sums[a, phase] for a in active)
        tied = [a for a in active if sums[a, phase] == m]
        return sum(rec(tuple(x for x in active if x != t), phase + 1) for t in tied) / len(tied)

    return rec(tuple(range(k)), 0)


def _exact_sysr_error(scores, schedule):
    scores = np.asarray(scores, np.float64)
    best = ba.best_arms(scores)
    n = scores.shape[1]
    total, count = 0.0, 0
    for perm in itertools.permutations(range(n)):
        perm = np.array(perm)
        sums = np.stack([scores[:, perm[:m]].sum(axis=1) for m in schedule], axis=1)
        total += _select_prob(np.round(sums, 9), best)
        count += 1
    return 1.0 - total / count


def _exact_sr_error(scores, schedule):
    """Independent per-arm orders: enumerate each arm's prefix-sum distribution, then combine."""
    scores = np.asarray(scores, np.float64)
    best = ba.best_arms(scores)
    k, n = scores.shape
    per_arm = []
    for a in range(k):
        c = Counter()
        for perm in itertools.permutations(range(n)):
            perm = np.array(perm)
            c[tuple(round(float(scores[a, perm[:m]].sum()), 9) for m in schedule)] += 1
        tot = sum(c.values())
        per_arm.append([(v, w / tot) for v, w in c.items()])
    prob = 0.0
    for combo in itertools.product(*per_arm):
        w = math.prod(x[1] for x in combo)
        prob += w * _select_prob(np.array([x[0] for x in combo]), best)
    return 1.0 - prob


def _exact_pair_error(scores, m, *, shared):
    """K = 2, m prompts per arm without replacement, the lower sum loses, ties at random."""
    y = np.asarray(scores, np.float64)
    best = int(np.argmax(y.mean(axis=1)))
    other = 1 - best
    subsets = list(itertools.combinations(range(y.shape[1]), m))
    if shared:
        d = np.array([y[best, list(s)].sum() - y[other, list(s)].sum() for s in subsets])
        return float(np.mean(d < -1e-9) + 0.5 * np.mean(np.abs(d) <= 1e-9))
    sb = np.array([y[best, list(s)].sum() for s in subsets])
    so = np.array([y[other, list(s)].sum() for s in subsets])
    d = sb[:, None] - so[None, :]
    return float(np.mean(d < -1e-9) + 0.5 * np.mean(np.abs(d) <= 1e-9))


def _tol(p, runs, z=4.0):
    return z * math.sqrt(max(p * (1 - p), 1e-4) / runs)


# ------------------------------------------------------------------------------------------
# Schedule.
# ------------------------------------------------------------------------------------------

def test_schedule_closed_form_matches_brute_force():
    for k in range(2, 9):
        for n in range(k, k + 90):
            sched = ba.phase_schedule(n, k)
            assert list(sched) == _brute_schedule(n, k), (n, k)
            pulls = ba.schedule_pulls(sched)
            assert pulls == _brute_pulls(sched, k) == sum(sched) + sched[-1]
            assert n - k <= pulls <= n, (n, k, pulls)
    assert ba.logbar(2) == 1.0 and ba.phase_schedule(12, 2) == (5,)  # K=2: ceil((n-2)/2)
    assert abs(ba.logbar(5) - (0.5 + 1 / 2 + 1 / 3 + 1 / 4 + 1 / 5)) < 1e-15


def test_reallocation_caps_and_spends_the_budget():
    for k in range(2, 7):
        for n_pool in (3, 7, 10):
            cap = ba.max_budget_without_reallocation(k, n_pool)
            brute_cap = max(n for n in range(k, 4 * k * n_pool) if ba.phase_schedule(n, k)[-1] <= n_pool)
            assert cap == brute_cap
            for n in range(k, k * n_pool + 2 * k):
                sched = ba.phase_schedule(n, k, num_prompts=n_pool, reallocate=True)
                pulls = ba.schedule_pulls(sched)
                assert len(sched) == k - 1 and all(a <= b for a, b in zip(sched, sched[1:]))
                assert max(sched) <= n_pool and pulls <= n
                if n >= k * n_pool:
                    assert sched == (n_pool,) * (k - 1)
                else:
                    assert pulls >= n - k  # spends the budget up to the ceiling slack
                if n <= cap:
                    if n < k * n_pool:
                        assert sched == ba.phase_schedule(n, k)  # unchanged when the pool suffices
                else:
                    with pytest.raises(ValueError, match="num_prompts"):
                        ba.phase_schedule(n, k, num_prompts=n_pool)


def test_schedule_rejects_bad_arguments():
    with pytest.raises(ValueError, match="num_arms"):
        ba.phase_schedule(10, 1)
    with pytest.raises(ValueError, match="budget"):
        ba.phase_schedule(3, 4)
    with pytest.raises(ValueError, match="num_prompts"):
        ba.phase_schedule(10, 3, reallocate=True)
    with pytest.raises(ValueError, match="schedules"):
        ba.successive_rejects(jax.random.key(0), jnp.zeros((3, 5)), jnp.zeros((3,), jnp.int32))
    with pytest.raises(ValueError, match="scores"):
        ba.successive_rejects(jax.random.key(0), jnp.zeros((5,)), jnp.zeros((4,), jnp.int32))
    with pytest.raises(ValueError, match="method"):
        ba.simulate("sr2", jax.random.key(0), np.zeros((3, 5)), [6], num_runs=2)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        ba.simulate("sr", jax.random.key(0), np.full((3, 5), 2.0), [6], num_runs=2)


# ------------------------------------------------------------------------------------------
# SR and SySRs: budget, schedule, synchronization.
# ------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def traces():
    k, n_pool = 5, 12
    scores = jnp.asarray(np.random.default_rng(0).integers(0, 2, (k, n_pool)), jnp.float32)
    budgets = [5, 17, 30, 44, 60, 80]  # the last ones need reallocation
    schedules = np.array([ba.phase_schedule(b, k, num_prompts=n_pool, reallocate=True) for b in budgets])
    keys = jax.random.split(jax.random.key(1), 200)
    run = jax.jit(jax.vmap(lambda kk, sy: ba.successive_rejects(kk, scores, schedules, synchronized=sy),
                           in_axes=(0, None)), static_argnums=1)
    return scores, budgets, schedules, run(keys, False), run(keys, True)


def test_sr_and_sysr_share_the_schedule_and_never_exceed_the_budget(traces):
    scores, budgets, schedules, sr, sy = traces
    for tr in (sr, sy):
        counts = np.asarray(tr.counts)  # [r, b, k]
        for j, (b, sched) in enumerate(zip(budgets, schedules)):
            expected = sorted(list(sched) + [sched[-1]])
            for r in range(counts.shape[0]):
                assert sorted(counts[r, j]) == expected  # one arm leaves per phase at n_k
                assert counts[r, j].sum() == ba.schedule_pulls(sched) <= b
            assert counts[:, j].max() <= scores.shape[1]
        sel, elim = np.asarray(tr.selected), np.asarray(tr.eliminated)
        for r in range(sel.shape[0]):
            for j in range(sel.shape[1]):
                assert sorted(list(elim[r, j]) + [sel[r, j]]) == list(range(scores.shape[0]))


def test_sysr_evaluates_all_survivors_on_identical_prompts(traces):
    scores, budgets, schedules, sr, sy = traces
    y = np.asarray(scores, np.float64)
    for tr, synchronized in ((sy, True), (sr, False)):
        order = np.asarray(tr.order)
        identical = np.all(order == order[:, :1, :])
        assert identical == synchronized  # SR's orders differ between arms
        if not synchronized:
            continue
        elim, counts = np.asarray(tr.eliminated), np.asarray(tr.counts)
        for r in range(order.shape[0]):
            for j, sched in enumerate(schedules):
                alive = set(range(y.shape[0]))
                for phase, n_k in enumerate(sched):
                    seen = {a: frozenset(order[r, a, :n_k]) for a in alive}
                    assert len(set(seen.values())) == 1  # same prompt set for every survivor
                    sums = {a: y[a, list(seen[a])].sum() for a in alive}
                    loser = int(elim[r, j, phase])
                    assert loser in alive and sums[loser] == min(sums.values())
                    assert counts[r, j, loser] == n_k
                    alive.remove(loser)


def test_sysr_is_invariant_to_a_prompt_constant_and_sr_is_not():
    k, n_pool, runs = 4, 24, 300
    rng = np.random.default_rng(3)
    y = rng.integers(0, 2, (k, n_pool)).astype(np.float32)
    c = rng.integers(0, 4, n_pool).astype(np.float32) / 4  # dyadic: every sum is exact in float32
    shifted = (y + c[None, :]) / 2
    sched = np.array([ba.phase_schedule(b, k) for b in (16, 30, 50)])
    keys = jax.random.split(jax.random.key(7), runs)

    def sel(scores, synchronized):
        f = jax.jit(jax.vmap(lambda kk, sc: ba.successive_rejects(kk, sc, sched, synchronized=synchronized),
                             in_axes=(0, None)))
        tr = f(keys, jnp.asarray(scores))
        return np.asarray(tr.selected), np.asarray(tr.eliminated)

    s0, e0 = sel(y, True)
    s1, e1 = sel(shifted, True)
    np.testing.assert_array_equal(s0, s1)
    np.testing.assert_array_equal(e0, e1)
    r0, _ = sel(y, False)
    r1, _ = sel(shifted, False)
    assert np.mean(r0 != r1) > 0.05


def test_identical_models_but_one_prompt():
    n_pool, j_star = 20, 7
    rng = np.random.default_rng(5)
    y = np.tile(rng.integers(0, 2, n_pool), (2, 1)).astype(np.float32)
    y[0, j_star], y[1, j_star] = 1.0, 0.0
    sched = np.array(ba.phase_schedule(22, 2))  # n_1 = 10 shared prompts
    keys = jax.random.split(jax.random.key(11), 4000)
    tr = jax.jit(jax.vmap(lambda kk: ba.synchronized_successive_rejects(kk, jnp.asarray(y), sched)))(keys)
    order, sel = np.asarray(tr.order), np.asarray(tr.selected)
    sampled = np.any(order[:, 0, :sched[0]] == j_star, axis=1)
    assert np.all(sel[sampled] == 0)  # deterministic once the differing prompt is seen
    exact = 0.5 * (1 - sched[0] / n_pool)
    assert abs(np.mean(sel != 0) - exact) < _tol(exact, keys.shape[0])
    sr = jax.jit(jax.vmap(lambda kk: ba.successive_rejects(kk, jnp.asarray(y), sched).selected))(keys)
    assert np.mean(np.asarray(sr) != 0) > 0.3  # SR's independent samples swamp the one-prompt gap


# ------------------------------------------------------------------------------------------
# Exact error probabilities on tiny pools vs Monte Carlo.
# ------------------------------------------------------------------------------------------

PAIR = np.array([[1, 1, 0, 1, 0.5, 1, 0, 1, 0, 0.5],
                 [1, 0, 0, 1, 0.5, 0, 1, 1, 0, 0.0]], np.float32)  # means 0.60 vs 0.45
RUNS = 100_000


@pytest.mark.parametrize("method,budget,shared", [("sysr", 12, True), ("sr", 12, False),
                                                  ("naive", 10, True), ("uniform", 10, False)])
def test_k2_error_equals_the_exact_hypergeometric_tail(method, budget, shared):
    m = ba.phase_schedule(12, 2)[0]
    assert m == 5 and 10 // 2 == m
    exact = _exact_pair_error(PAIR, m, shared=shared)
    sel = ba.simulate(method, jax.random.key(21), PAIR, [budget], num_runs=RUNS)
    assert abs(ba.error_probability(sel, PAIR)[0] - exact) < _tol(exact, RUNS)


@pytest.mark.parametrize("method,shared", [("ucbe", False), ("smart_ucbe", True)])
def test_ucbe_with_huge_exploration_is_round_robin(method, shared):
    """a -> inf makes UCB-E pull the least-pulled arm: at budget 2m it equals the m-per-arm uniform rule."""
    exact = _exact_pair_error(PAIR, 5, shared=shared)
    sel = ba.simulate(method, jax.random.key(22), PAIR, [10], num_runs=RUNS // 4, exploration=1e6)
    assert abs(ba.error_probability(sel, PAIR)[0] - exact) < _tol(exact, RUNS // 4)


def test_k3_error_equals_exhaustive_enumeration():
    y = np.array([[1, 0.5, 1, 0, 1, 0], [1, 0, 1, 0.5, 0, 0], [0, 1, 0, 0.5, 1, 0]], np.float32)  # .58 .42 .42
    sched = ba.phase_schedule(15, 3)
    assert sched == (3, 5)
    for method, exact in (("sysr", _exact_sysr_error(y, sched)), ("sr", _exact_sr_error(y, sched))):
        sel = ba.simulate(method, jax.random.key(23), y, [15], num_runs=RUNS)
        assert abs(ba.error_probability(sel, y)[0] - exact) < _tol(exact, RUNS), method


def test_full_budget_is_exact():
    y = np.asarray(ba.synthetic_benchmark(jax.random.key(3), num_models=5, num_prompts=16, noise_scale=1.0).scores)
    if ba.best_arms(y).sum() > 1:
        pytest.skip("tied pool means")
    k, n = y.shape
    for method in ("sysr", "sr", "ucbe"):  # reallocation to the whole pool; UCB-E exhausting every arm
        sel = ba.simulate(method, jax.random.key(4), y, [k * n], num_runs=50, exploration=1.0)
        assert ba.error_probability(sel, y)[0] == 0.0, method


# ------------------------------------------------------------------------------------------
# Independent models: SySRs equals SR (statistically).
# ------------------------------------------------------------------------------------------

def _fresh_benchmark_errors(noise_scale, runs=10_000, k=4, n_pool=30, budgets=(20, 40, 60)):
    sched = np.array([ba.phase_schedule(b, k) for b in budgets])

    def one(key):
        kb, k1, k2 = jax.random.split(key, 3)
        y = ba.synthetic_benchmark(kb, num_models=k, num_prompts=n_pool, noise_scale=noise_scale,
                                   best_accuracy=0.7, worst_accuracy=0.55).scores
        means = y.mean(axis=1)
        out = []
        for kk, sy in ((k1, True), (k2, False)):
            sel = ba.successive_rejects(kk, y, sched, synchronized=sy).selected
            out.append(means[sel] < means.max())
        return jnp.stack(out)

    err = np.asarray(jax.jit(jax.vmap(one))(jax.random.split(jax.random.key(31), runs)))  # [r, 2, b]
    return err.mean(axis=0), runs


def test_sysr_equals_sr_when_models_are_independent():
    (sysr, sr), runs = _fresh_benchmark_errors(float("inf"))
    for a, b in zip(sysr, sr):
        p = 0.5 * (a + b)
        assert abs(a - b) < 4 * math.sqrt(2 * p * (1 - p) / runs), (sysr, sr)
    (sysr_c, sr_c), _ = _fresh_benchmark_errors(0.3)  # the same test has power on similar models
    assert np.all(sr_c - sysr_c > 4 * np.sqrt(2 * 0.25 / runs))


def test_reproducible_and_independent_across_keys():
    y = np.asarray(ba.synthetic_benchmark(jax.random.key(0), num_models=6, num_prompts=50, noise_scale=1.0).scores)
    for method in ("sysr", "smart_ucbe"):
        a = ba.simulate(method, jax.random.key(1), y, [30, 60], num_runs=64)
        b = ba.simulate(method, jax.random.key(1), y, [30, 60], num_runs=64)
        c = ba.simulate(method, jax.random.key(2), y, [30, 60], num_runs=64)
        np.testing.assert_array_equal(a, b)
        assert np.any(a != c) and len(np.unique(a[0])) > 1
        np.testing.assert_array_equal(ba.simulate(method, jax.random.key(1), y, [30, 60], num_runs=64,
                                                  run_batch_size=24), a)


# ------------------------------------------------------------------------------------------
# Hardness, confidence budget, generator.
# ------------------------------------------------------------------------------------------

def test_hardness_terms_by_hand():
    y = np.array([[1, 1, 1, 0], [1, 1, 0, 0], [0, 0, 1, 0]], np.float64)  # means .75 .5 .25
    # H_2: gaps .25, .5 -> max(2 / .0625, 3 / .25) = 32.
    assert ba.hardness_sr(y) == pytest.approx(32.0)
    # D_1 = y0 - y1 = (0,0,1,0): Var = 3/16; D_2 = (1,1,0,0): Var = 1/4.
    h1 = (2 * 3 / 16 + 2 / 3 * 1.25 * 0.25) / 0.25 ** 2
    h2 = (2 * 1 / 4 + 2 / 3 * 1.5 * 0.5) / 0.5 ** 2
    assert ba.hardness_sysr(y) == pytest.approx(max(2 * max(h1, h2), 3 * min(h1, h2)))
    assert ba.error_bound(10, 3, 32.0) == pytest.approx(3 * math.exp(-7 / (4 / 3 * 32)))
    assert math.isinf(ba.hardness_sr(np.array([[1.0, 0.0], [0.0, 1.0]])))


def test_confidence_budget():
    fr = [0.1, 0.2, 0.3, 0.4, 0.5]
    acc = [0.5, 0.96, 0.9, 0.97, 1.0]
    assert ba.confidence_budget(fr, acc, 0.95) == 0.4
    assert ba.confidence_budget(fr, acc, 0.5) == 0.1
    assert ba.confidence_budget(fr, acc, 1.0) == 0.5
    assert math.isinf(ba.confidence_budget(fr, [0.5, 0.99, 0.98, 0.99, 0.98], 0.99))


def test_synthetic_benchmark_similarity_and_marginals():
    n_pool = 20_000
    target = np.linspace(0.75, 0.45, 4)
    out = {}
    for s in (0.0, 0.5, float("inf")):
        y = np.asarray(ba.synthetic_benchmark(jax.random.key(9), num_models=4, num_prompts=n_pool,
                                              noise_scale=s).scores)
        assert np.all(np.abs(y.mean(axis=1) - target) < 4 * np.sqrt(0.25 / n_pool)), s
        out[s] = y
    nested = out[0.0]
    assert np.all(nested[:-1] >= nested[1:])  # s = 0: a stronger model solves every prompt a weaker one solves
    corr = lambda y: np.corrcoef(y[0], y[1])[0, 1]  # noqa: E731
    assert abs(corr(out[float("inf")])) < 4 / math.sqrt(n_pool)
    assert corr(out[0.5]) > 0.3
    assert ba.hardness_sysr(out[0.5]) < ba.hardness_sr(out[0.5])
