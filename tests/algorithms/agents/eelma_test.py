"""EELMA: encoder, samplers, InfoNCE bound, exact effective empowerment and the trained estimator."""

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from algorithms.agents import eelma

LN2 = math.log(2.0)


# ----------------------------------------------------------------------------------------------
# Encoder and samplers.
# ----------------------------------------------------------------------------------------------


def test_hash_embed_is_fixed_normalised_and_separates_texts():
    texts = ["You are at row 1, column 2.", "You are at row 2, column 1.", "move north"]
    e = eelma.hash_embed(texts, dim=128)
    assert e.shape == (3, 128) and e.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(e, axis=1), 1.0, rtol=1e-6)
    np.testing.assert_array_equal(e, eelma.hash_embed(texts, dim=128))          # deterministic
    assert not np.allclose(e[0], e[1])                                            # word order of numbers matters
    assert not np.allclose(e, eelma.hash_embed(texts, dim=128, seed=1))          # seed changes the encoder


@pytest.mark.parametrize("kwargs,match", [(dict(texts=["a"], dim=4), "dim"), (dict(texts=[]), "texts"),
                                          (dict(texts=["a", 3]), r"texts\[1\]")])
def test_hash_embed_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        eelma.hash_embed(**kwargs)


@pytest.mark.parametrize("gamma", [0.0, 0.5, 0.9])
def test_future_offsets_are_geometric(gamma):
    n = 200_000
    tau = np.asarray(eelma.sample_future_offsets(jax.random.key(0), (n,), gamma=gamma))
    assert tau.min() >= 1
    mean, sd = 1 / (1 - gamma), math.sqrt(gamma) / (1 - gamma)
    assert abs(tau.mean() - mean) <= 5 * sd / math.sqrt(n) + 1e-9
    p1 = (tau == 1).mean()                      # P(tau = 1) = 1 - gamma
    assert abs(p1 - (1 - gamma)) <= 5 * math.sqrt(gamma * (1 - gamma) / n) + 1e-9


def test_sample_triples_respects_episode_bounds_and_pools_steps():
    lengths = np.array([3, 0, 5, 1])
    n = 40_000
    e, t, tf = (np.asarray(x) for x in eelma.sample_triples(jax.random.key(1), lengths, num_samples=n, gamma=0.7))
    assert (lengths[e] > 0).all() and (t >= 0).all() and (t < lengths[e]).all()
    assert (tf > t).all() and (tf <= lengths[e]).all()
    # (e, t) uniform over the 9 pooled steps.
    counts = np.bincount(e * 5 + t, minlength=20)
    expected = np.zeros(20)
    for ep, L in enumerate(lengths):
        expected[ep * 5: ep * 5 + L] = n / lengths.sum()
    assert np.abs(counts - expected).max() <= 5 * math.sqrt(n / lengths.sum())
    # Truncation: from the last step of episode 0 the future is its last state.
    assert (tf[(e == 0) & (t == 2)] == 3).all()


@pytest.mark.parametrize("kwargs,match", [
    (dict(lengths=np.array([0, 0]), num_samples=3, gamma=0.5), "positive sum"),
    (dict(lengths=np.array([1.5]), num_samples=3, gamma=0.5), "integer"),
    (dict(lengths=np.array([2]), num_samples=0, gamma=0.5), "num_samples"),
    (dict(lengths=np.array([2]), num_samples=3, gamma=1.0), "gamma"),
])
def test_sample_triples_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        eelma.sample_triples(jax.random.key(0), **kwargs)


def test_triples_from_logs_gathers_ids():
    states = np.array([[0, 1, 2, -1], [3, 4, -1, -1]])
    actions = np.array([[5, 6, -1], [7, -1, -1]])
    s, a, f = eelma.triples_from_logs(jax.random.key(0), states, actions, np.array([2, 1]), num_samples=500,
                                      gamma=0.5)
    pairs = {(0, 5), (1, 6), (3, 7)}
    assert set(zip(s.tolist(), a.tolist())) == pairs
    assert ((f > s) & (f <= np.where(s < 3, 2, 4))).all()
    with pytest.raises(ValueError, match="lengths"):
        eelma.triples_from_logs(jax.random.key(0), states, actions, np.array([4, 1]), num_samples=5, gamma=0.5)


# ----------------------------------------------------------------------------------------------
# InfoNCE.
# ----------------------------------------------------------------------------------------------


def test_infonce_never_exceeds_log_k():
    scores = 30.0 * jax.random.normal(jax.random.key(0), (50, 16, 16))
    scores = scores.at[:, jnp.arange(16), jnp.arange(16)].add(1e3)      # near-perfect critics
    terms = eelma.infonce_terms(scores)
    assert terms.shape == (50, 16)
    assert float(terms.max()) <= math.log(16) + 1e-5
    assert float(eelma.infonce_bound(jnp.zeros((4, 4)))) == pytest.approx(0.0, abs=1e-6)   # uninformative critic


@pytest.mark.parametrize("shape", [(3, 4), (5,), (1, 1)])
def test_infonce_bad_shape(shape):
    with pytest.raises(ValueError, match="scores"):
        eelma.infonce_terms(jnp.zeros(shape))


_PXY = np.array([[0.30, 0.05, 0.05], [0.05, 0.20, 0.05], [0.05, 0.05, 0.20]])


def _mi(pxy):
    px, py = pxy.sum(1, keepdims=True), pxy.sum(0, keepdims=True)
    return float((pxy * np.log(pxy / (px * py))).sum())


def _infonce_expectation(pxy, f, k):
    """E[I_NCE] with critic f over K i.i.d. pairs, by enumerating every batch (float64)."""
    cells = [(x, y) for x in range(3) for y in range(3)]
    total = 0.0
    for batch in itertools.product(cells, repeat=k):
        p = np.prod([pxy[x, y] for x, y in batch])
        xs, ys = [b[0] for b in batch], [b[1] for b in batch]
        s = np.array([[f[xi, yj] for yj in ys] for xi in xs])
        total += p * np.mean(np.diag(s) - np.log(np.exp(s).mean(1)))
    return total


def test_infonce_with_the_optimal_critic_matches_enumeration_and_approaches_the_mi():
    mi = _mi(_PXY)
    f = np.log(_PXY / _PXY.sum(1, keepdims=True) / _PXY.sum(0, keepdims=True))   # log p(y|x)/p(y)
    rng = np.random.default_rng(0)
    flat = _PXY.reshape(-1)

    def mc(k, batches):
        idx = rng.choice(9, size=(batches, k), p=flat)
        x, y = idx // 3, idx % 3
        s = jnp.asarray(f[x[:, :, None], y[:, None, :]])
        v = np.asarray(eelma.infonce_bound(s))
        return v.mean(), v.std(ddof=1) / math.sqrt(batches)

    exact = {}
    for k in (2, 3):
        exact[k] = _infonce_expectation(_PXY, f, k)
        assert exact[k] <= min(mi, math.log(k))                  # a lower bound on the MI, and <= log K
        m, se = mc(k, 20_000)
        assert abs(m - exact[k]) <= 4 * se
    # The gap log K - I_NCE >= 0 shrinks and the bound approaches the MI as K grows (MI << log K).
    assert exact[2] < exact[3] < mi
    m, se = mc(512, 60)
    assert m <= mi + 4 * se and mi - m < 0.03


# ----------------------------------------------------------------------------------------------
# Exact effective empowerment.
# ----------------------------------------------------------------------------------------------


def _fan_env(targets):
    """State 0 with len(targets) actions to absorbing states 1..; returns (P, policy)."""
    n, m = max(targets) + 1, len(targets)
    P = np.zeros((n, m, n))
    for a, t in enumerate(targets):
        P[0, a, t] = 1.0
    for s in range(1, n):
        P[s, :, s] = 1.0
    return P, np.full((n, m), 1.0 / m)


def _delta(n, i=0):
    d = np.zeros(n)
    d[i] = 1.0
    return d


@pytest.mark.parametrize("gamma", [0.0, 0.5, 0.9])
def test_exact_deterministic_fan_is_log_of_reachable_states(gamma):
    P, pi = _fan_env([1, 2, 3, 4])
    ex = eelma.exact_effective_empowerment(P, pi, gamma=gamma, initial=_delta(5), horizon=None)
    assert ex.empowerment == pytest.approx(math.log(4), abs=1e-10)
    P, pi = _fan_env([1, 2, 3, 3])                       # two actions collide: H(s') = 1.5 bits
    ex = eelma.exact_effective_empowerment(P, pi, gamma=gamma, initial=_delta(4), horizon=3,
                                           terminal=np.arange(4) > 0)
    assert ex.empowerment == pytest.approx(1.5 * LN2, abs=1e-10)
    assert ex.expected_length == pytest.approx(1.0)
    # Without terminals the absorbing states are logged too (t = 1, 2) and carry no information.
    diluted = eelma.exact_effective_empowerment(P, pi, gamma=gamma, initial=_delta(4), horizon=3)
    assert diluted.empowerment == pytest.approx(1.5 * LN2 / 3, abs=1e-10)
    np.testing.assert_allclose(ex.per_state_action[0], [2 * LN2, 2 * LN2, LN2, LN2], atol=1e-10)


def test_exact_is_zero_when_actions_do_not_matter():
    rng = np.random.default_rng(0)
    row = rng.dirichlet(np.ones(4), size=4)               # P(s' | s) whatever the action
    P = np.repeat(row[:, None, :], 3, axis=1)
    pi = rng.dirichlet(np.ones(3), size=4)
    for horizon in (None, 6):
        ex = eelma.exact_effective_empowerment(P, pi, gamma=0.8, initial=np.full(4, 0.25), horizon=horizon)
        assert ex.empowerment == pytest.approx(0.0, abs=1e-12)
    # ... and when the policy is deterministic (no action entropy), whatever the dynamics.
    P = rng.dirichlet(np.ones(4), size=(4, 3))
    ex = eelma.exact_effective_empowerment(P, np.eye(3)[[0, 2, 1, 1]], gamma=0.8, initial=np.full(4, 0.25),
                                           horizon=5)
    assert ex.empowerment == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("gamma", [0.3, 0.8])
def test_exact_reset_chain_matches_hand_computation(gamma):
    # 0 --a--> A, 0 --b--> B, A and B return to 0. Only tau = 1 reveals the action; odd tau > 1 lands
    # on A or B uniformly, even tau on 0.
    P = np.zeros((3, 2, 3))
    P[0, 0, 1] = P[0, 1, 2] = 1.0
    P[1, :, 0] = P[2, :, 0] = 1.0
    pi = np.full((3, 2), 0.5)
    ex = eelma.exact_effective_empowerment(P, pi, gamma=gamma, initial=_delta(3), horizon=None)
    q1 = 1 - gamma
    p_odd = 1 / (1 + gamma)
    q3 = p_odd - q1
    hand = (q1 + q3 / 2) * math.log((q1 + q3 / 2) / (p_odd / 2)) + (q3 / 2) * math.log((q3 / 2) / (p_odd / 2))
    assert ex.empowerment == pytest.approx(hand, rel=1e-10)


def test_exact_matches_monte_carlo_with_latent_goal_terminals_and_horizon():
    # Latent goal g in {0, 1} (hidden from the observation), 4 observed cells on a line, terminal when
    # the agent stands on its goal cell (cell 0 for g=0, cell 3 for g=1); noisy moves; horizon 5.
    n, m, T, gamma = 4, 3, 5, 0.7
    Pc = np.zeros((n, m, n))
    for s in range(n):
        for a, d in enumerate((-1, 1, 0)):
            Pc[s, a, min(max(s + d, 0), n - 1)] += 0.8
            Pc[s, a, s] += 0.2
    P = np.zeros((2 * n, m, 2 * n))
    P[:n, :, :n] = P[n:, :, n:] = Pc
    pi = np.zeros((2 * n, m))
    pi[:n] = [0.7, 0.1, 0.2]
    pi[n:] = [0.1, 0.7, 0.2]
    obs = np.tile(np.arange(n), 2)
    term = np.zeros(2 * n, bool)
    term[0] = term[n + 3] = True
    init = np.zeros(2 * n)
    init[[1, 2, n + 1, n + 2]] = 0.25
    ex = eelma.exact_effective_empowerment(P, pi, gamma=gamma, initial=init, horizon=T, observation=obs,
                                           terminal=term)
    # Simulate episodes, sample triples with the library's sampler, plug-in MI of (o, a, o*).
    rng = np.random.default_rng(0)
    E = 40_000
    x = np.zeros((E, T + 1), int)
    acts = np.zeros((E, T), int)
    x[:, 0] = rng.choice(2 * n, size=E, p=init)
    lengths = np.zeros(E, int)
    alive = np.ones(E, bool)
    for t in range(T):
        idx = np.nonzero(alive)[0]
        a = (rng.random(idx.size)[:, None] > np.cumsum(pi[x[idx, t]], 1)).sum(1)
        acts[idx, t] = a
        x[idx, t + 1] = (rng.random(idx.size)[:, None] > np.cumsum(P[x[idx, t], a], 1)).sum(1)
        lengths[idx] += 1
        alive[idx] = ~term[x[idx, t + 1]]
        x[~alive, t + 1:] = x[~alive, t + 1:t + 2] if t + 1 <= T else 0
    s, a, f = eelma.triples_from_logs(jax.random.key(0), obs[x], acts, lengths, num_samples=150_000, gamma=gamma)
    joint = np.zeros((n, m, n))
    np.add.at(joint, (s, a, f), 1.0)
    mi_hat, _, _ = eelma.conditional_mi(joint / joint.sum())
    assert np.abs(joint.sum((1, 2)) / joint.sum() - ex.state_probs).max() < 0.01
    assert ex.empowerment > 0.05
    assert abs(mi_hat - ex.empowerment) < 0.01 + n * m * n / (2 * 150_000)
    assert ex.expected_length == pytest.approx(lengths.mean(), abs=4 * lengths.std() / math.sqrt(E))


def test_conditional_mi_decomposes_and_matches_entropies():
    rng = np.random.default_rng(3)
    p = rng.dirichlet(np.ones(60)).reshape(3, 4, 5)
    mi, per_s, per_sa = eelma.conditional_mi(p)

    def h(q, axis):
        q = q / q.sum(axis, keepdims=True)
        return -(q * np.log(q)).sum(axis)

    h_y_s = (p.sum((1, 2)) * h(p.sum(1), -1)).sum()
    h_y_sa = (p.sum(2) * h(p, -1)).sum()
    assert mi == pytest.approx(h_y_s - h_y_sa, rel=1e-10)
    p_s = p.sum((1, 2))
    assert mi == pytest.approx((p_s * per_s).sum(), rel=1e-12)
    np.testing.assert_allclose(per_s, (p.sum(2) / p_s[:, None] * per_sa).sum(1), rtol=1e-12)


@pytest.mark.parametrize("change,match", [
    (dict(policy=np.full((3, 2), 0.4)), "policy"),
    (dict(transition=np.ones((3, 2, 3))), "transition"),
    (dict(initial=np.ones(3)), "initial"),
    (dict(gamma=1.0), "gamma"),
    (dict(horizon=0), "horizon"),
    (dict(observation=np.array([0, 1])), "observation"),
    (dict(terminal=np.ones(3, bool)), "no mass"),
])
def test_exact_bad_input(change, match):
    P, pi = _fan_env([1, 2])
    kwargs = dict(transition=P, policy=pi, gamma=0.5, initial=_delta(3), horizon=4) | change
    with pytest.raises(ValueError, match=match):
        eelma.exact_effective_empowerment(**kwargs)


def test_conditional_mi_bad_input():
    with pytest.raises(ValueError, match="joint"):
        eelma.conditional_mi(np.full((2, 2, 2), 0.5))


# ----------------------------------------------------------------------------------------------
# The trained estimator (two critics trained in one vmapped program).
# ----------------------------------------------------------------------------------------------


def test_trained_estimator_recovers_the_exact_value_and_vanishes_without_action_information():
    # s_t is 0 or 3 (each half the time); from 0 the uniform action a in {0, 1} leads to s_* = a + 1,
    # from 3 to 3. Exact I(a; s_* | s) = 0.5 log 2. Agent 2 logs shuffled actions: I = 0.
    P = np.zeros((4, 2, 4))
    P[0, 0, 1] = P[0, 1, 2] = 1.0
    P[1:, :, :] = np.eye(4)[1:, None, :]
    exact = eelma.exact_effective_empowerment(P, np.full((4, 2), 0.5), gamma=0.0,
                                              initial=np.array([0.5, 0, 0, 0.5]), horizon=None).empowerment
    assert exact == pytest.approx(0.5 * LN2)
    rng = np.random.default_rng(0)
    st, at = np.eye(8, dtype=np.float32)[:4], np.eye(8, dtype=np.float32)[:2]

    def data(n):
        s = rng.choice([0, 3], n)
        a = rng.integers(0, 2, n)
        f = np.where(s == 0, a + 1, 3)
        return np.stack([s, s]), np.stack([a, rng.permutation(a)]), np.stack([f, f])

    critics = eelma.train_critics(jax.random.key(0), st, at, *data(4000), num_steps=300, batch_size=64,
                                  hidden=32, proj_dim=16, out_dim=16, progress=False)
    assert len(critics.history) == 3 and critics.history[-1]["loss"].shape == (2,)
    est = eelma.estimate_empowerment(critics, st, at, *data(2048), batch_size=128)
    assert est.per_sample.shape == (2, 2048) and est.batch_size == 128
    assert (est.infonce_sa <= math.log(128) + 1e-6).all()
    assert abs(est.empowerment[0] - exact) < 0.05
    assert est.empowerment[0] <= exact + 3 * est.se[0] + 0.01
    assert abs(est.empowerment[1]) < 0.03
    np.testing.assert_allclose(est.empowerment, est.infonce_sa - est.infonce_s, atol=1e-5)


def test_estimator_bad_input():
    st, at = np.eye(4, dtype=np.float32), np.eye(2, dtype=np.float32)
    s = np.zeros((1, 8), int)
    with pytest.raises(ValueError, match="a must hold integer ids"):
        eelma.train_critics(jax.random.key(0), st, at, s, s + 2, s, num_steps=1, batch_size=4, progress=False)
    with pytest.raises(ValueError, match="share a shape"):
        eelma.train_critics(jax.random.key(0), st, at, s, s[:, :4], s, num_steps=1, batch_size=4, progress=False)
    with pytest.raises(ValueError, match="batch_size"):
        eelma.train_critics(jax.random.key(0), st, at, s, s, s, num_steps=1, batch_size=1, progress=False)
    critics = eelma.train_critics(jax.random.key(0), st, at, s, s, s, num_steps=1, batch_size=4, hidden=4,
                                  proj_dim=4, out_dim=4, progress=False)
    with pytest.raises(ValueError, match="one row per trained critic"):
        eelma.estimate_empowerment(critics, st, at, np.zeros((2, 8), int), np.zeros((2, 8), int),
                                   np.zeros((2, 8), int), batch_size=4)
    with pytest.raises(ValueError, match="batch_size"):
        eelma.estimate_empowerment(critics, st, at, s, s, s, batch_size=16)
    with pytest.raises(ValueError, match="hidden"):
        eelma.EmpowermentCritic(4, 2, hidden=0, rngs=__import__("flax").nnx.Rngs(0))
