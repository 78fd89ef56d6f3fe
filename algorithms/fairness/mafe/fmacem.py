"""F-MACEM: the Fair Multi-Agent Cross-Entropy Method, cooperative (shared J) and independent (alternating).

Spec: /work/shared/papers/specs/vision_weights_envs.md section 7 (b) "F-MACEM" [concept READ, details INFER].
Policies are low-dimensional parametric maps per agent (`core.Policy`); the joint parameter vector
``theta = [theta_1, ..., theta_N]`` is searched with a diagonal-Gaussian cross-entropy method:

    theta^(j) ~ N(mu, diag sigma^2), j = 1..N_cand                         (vmapped over candidates)
    J(theta) = mean over E episodes of core.episode_objective               (vmapped over seeds)
             = sum_n sum_t gamma^t w_n^R.c_R,n + sum_n eta_n.mean_t c_rate,n - lam sum_n sum_t gamma^t w_n^F.c_F,n
    elite = the top ceil(rho N_cand) candidates by J
    mu <- (1 - alpha) mu + alpha mean(elite);  sigma <- (1 - alpha) sigma + alpha std(elite) + eps_i

with the spec's defaults N_cand 64, rho 0.125, alpha 0.7, I 30, E 4 and eps_i decaying linearly 0.1 -> 0.
All candidates of one iteration share the same E episode keys (common random numbers) [INFER].
Cooperative F-MACEM maximises the shared J over all agents' parameters; the independent variant
(`independent_fmacem`) lets each agent n maximise its own J_n (only its terms) over theta_n with the others
fixed at their current means, alternating between agents for ``rounds`` rounds [INFER: the spec asks for
"each agent optimises its own J_n with others fixed, alternating"].
"""

from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import tqdm

from algorithms.fairness.mafe import core

__all__ = ["CEMResult", "cem_update", "cem", "make_objective", "fmacem", "independent_fmacem", "evaluate",
           "FMACEMResult"]


class CEMResult(NamedTuple):
    """mean: (D,) final mu. std: (D,) final sigma. history: {"best", "mean", "elite_mean"}: (I,) of J per
    iteration. num_elite: elite count per iteration."""

    mean: np.ndarray
    std: np.ndarray
    history: dict
    num_elite: int


def num_elite(num_candidates: int, elite_frac: float) -> int:
    """ceil(rho * N_cand), at least 1."""
    return max(1, int(math.ceil(elite_frac * num_candidates - 1e-9)))


def cem_update(mu: jax.Array, sigma: jax.Array, thetas: jax.Array, values: jax.Array, *, n_elite: int,
               alpha: float, noise: float | jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One cross-entropy update from evaluated candidates.

    Args:
      mu, sigma: (D,) current mean and standard deviation. thetas: (N, D) candidates. values: (N,) J.
      n_elite: number of elite candidates (top by J). alpha: smoothing in (0, 1]. noise: eps added to sigma.

    Returns:
      ``(mu', sigma', elite_idx)`` with elite_idx (n_elite,) the indices of the best candidates.
    """
    _, idx = jax.lax.top_k(values, n_elite)
    elite = thetas[idx]
    mu2 = (1.0 - alpha) * mu + alpha * jnp.mean(elite, 0)
    sigma2 = (1.0 - alpha) * sigma + alpha * jnp.std(elite, 0) + noise
    return mu2, sigma2, idx


_IT_CACHE: dict = {}
_OBJ_CACHE: dict = {}
_EVAL_CACHE: dict = {}


def _memo(cache: dict, refs: tuple, static: tuple, build):
    """Memoise ``build()`` on the identity of ``refs`` (kept alive in the cache) and the hashable ``static``,
    so that repeated CEM runs (a lambda sweep) reuse one compiled function."""
    key = (tuple(id(r) for r in refs), static)
    hit = cache.get(key)
    if hit is not None and all(a is b for a, b in zip(hit[0], refs)):
        return hit[1]
    if len(cache) > 256:
        cache.clear()
    val = build()
    cache[key] = (refs, val)
    return val


def _cem_iteration(fn, num_candidates: int, ne: int, alpha: float):
    """The jitted CEM iteration for objective ``fn(thetas, key, *args)`` (args dynamic: lam, base theta)."""
    def build():
        @jax.jit
        def it(mu, sigma, k, eps, *args):
            ks, ke = jax.random.split(k)
            thetas = mu + sigma * jax.random.normal(ks, (num_candidates, mu.shape[0]))
            vals = fn(thetas, ke, *args)
            mu2, sigma2, idx = cem_update(mu, sigma, thetas, vals, n_elite=ne, alpha=alpha, noise=eps)
            return mu2, sigma2, jnp.max(vals), jnp.mean(vals), jnp.mean(vals[idx])
        return it
    return _memo(_IT_CACHE, (fn,), (num_candidates, ne, alpha), build)


def _validate_cem(num_candidates, elite_frac, alpha, iterations, noise_start, noise_end):
    if int(num_candidates) < 2:
        raise ValueError(f"num_candidates must be >= 2, got {num_candidates}")
    if not 0.0 < float(elite_frac) <= 1.0:
        raise ValueError(f"elite_frac must lie in (0, 1], got {elite_frac}")
    if not 0.0 < float(alpha) <= 1.0:
        raise ValueError(f"alpha must lie in (0, 1], got {alpha}")
    if int(iterations) < 1:
        raise ValueError(f"iterations must be >= 1, got {iterations}")
    if float(noise_start) < 0 or float(noise_end) < 0:
        raise ValueError(f"noise_start and noise_end must be >= 0, got {noise_start}, {noise_end}")


def cem(objective: Callable[[jax.Array, jax.Array], jax.Array], key: jax.Array, mean0, std0, *,
        num_candidates: int = 64, elite_frac: float = 0.125, alpha: float = 0.7, iterations: int = 30,
        noise_start: float = 0.1, noise_end: float = 0.0, progress: bool = False, desc: str = "cem") -> CEMResult:
    """Diagonal-Gaussian cross-entropy maximisation of ``objective`` (spec defaults).

    Args:
      objective: ``objective(thetas: (N, D), key) -> (N,)`` values to maximise (jit-able).
      key: PRNG key. mean0: (D,) initial mean. std0: (D,) or scalar initial standard deviation.
      num_candidates, elite_frac, alpha, iterations: N_cand, rho, alpha, I.
      noise_start, noise_end: eps_i decays linearly from noise_start (i = 0) to noise_end (i = I - 1).

    Returns:
      `CEMResult`.
    """
    _validate_cem(num_candidates, elite_frac, alpha, iterations, noise_start, noise_end)
    mu = jnp.asarray(mean0, jnp.float32)
    if mu.ndim != 1 or mu.shape[0] < 1:
        raise ValueError(f"mean0 must be a non-empty vector (D,), got shape {mu.shape}")
    sigma = jnp.broadcast_to(jnp.asarray(std0, jnp.float32), mu.shape)
    ne = num_elite(num_candidates, elite_frac)

    fn, args = getattr(objective, "fn", None), getattr(objective, "args", ())
    if fn is None:
        fn, args = (lambda th, k: objective(th, k)), ()
    it = _cem_iteration(fn, num_candidates, ne, float(alpha))

    hist = {"best": [], "mean": [], "elite_mean": []}
    denom = max(iterations - 1, 1)
    for i in tqdm.trange(iterations, desc=desc, disable=not progress, leave=False):
        eps = noise_start + (noise_end - noise_start) * i / denom
        mu, sigma, best, mean, emean = it(mu, sigma, jax.random.fold_in(key, i), jnp.float32(eps), *args)
        for k, v in zip(("best", "mean", "elite_mean"), (best, mean, emean)):
            hist[k].append(float(v))
    return CEMResult(np.asarray(mu), np.asarray(sigma), {k: np.asarray(v) for k, v in hist.items()}, ne)


def make_objective(env: core.FairEnv, params: Any, policy: core.Policy, weights: core.Weights, *, lam: float,
                   gamma: float = 0.99, num_episodes: int = 4, agents: tuple[str, ...] | None = None,
                   base_theta=None, coords=None) -> Callable[[jax.Array, jax.Array], jax.Array]:
    """The F-MACEM objective ``(thetas (N, d), key) -> (N,)`` mean J over ``num_episodes`` shared episodes.

    Args:
      agents: whose terms enter J (None: all, the cooperative shared J; one agent: the independent J_n).
      base_theta, coords: search only ``coords`` (int indices into the flat theta), the others fixed at
        ``base_theta`` (used by the independent variant); None: thetas are full flat vectors.

    The compiled function is reused across calls with the same ``env``, ``params``, ``policy`` and
    ``weights`` objects (``lam`` and ``base_theta`` are runtime arguments), so a lambda sweep compiles once;
    do not mutate ``weights`` in place between calls.
    """
    if int(num_episodes) < 1:
        raise ValueError(f"num_episodes must be >= 1, got {num_episodes}")
    if not 0.0 < float(gamma) <= 1.0:
        raise ValueError(f"gamma must lie in (0, 1], got {gamma}")
    core._check_weights(env, weights)
    agents = None if agents is None else tuple(agents)
    coords_t = None if coords is None else tuple(int(i) for i in np.asarray(coords).ravel())

    def build():
        w = {a: {k: jnp.asarray(v, jnp.float32) for k, v in weights[a].items()} for a in weights}
        idx = None if coords_t is None else jnp.asarray(coords_t, jnp.int32)

        def one(theta, k, lam_, base):
            full = theta if idx is None else base.at[idx].set(theta)
            r = core.rollout(env, k, params, policy, full)
            return core.episode_objective(r["comps"], w, lam=lam_, gamma=gamma, agents=agents)["J"]

        def fn(thetas, key, lam_, base):
            keys = jax.random.split(key, num_episodes)
            return jnp.mean(jax.vmap(lambda th: jax.vmap(lambda k: one(th, k, lam_, base))(keys))(thetas), axis=1)
        return fn

    fn = _memo(_OBJ_CACHE, (env, params, policy, weights), (float(gamma), int(num_episodes), agents, coords_t),
               build)
    base = jnp.zeros((0,), jnp.float32) if base_theta is None else jnp.asarray(base_theta, jnp.float32)
    return _BoundObjective(fn, (jnp.float32(lam), base))


class _BoundObjective:
    """``objective(thetas, key)`` = ``fn(thetas, key, *args)``; `cem` compiles ``fn`` once and passes args."""

    def __init__(self, fn, args):
        self.fn, self.args = fn, args

    def __call__(self, thetas, key):
        return self.fn(thetas, key, *self.args)


class FMACEMResult(NamedTuple):
    """theta: (D,) final flat parameters (the CEM mean). history: per-phase CEM histories."""

    theta: np.ndarray
    history: list


def fmacem(env: core.FairEnv, params: Any, policy: core.Policy, weights: core.Weights, key: jax.Array, *,
           lam: float, gamma: float = 0.99, num_episodes: int = 4, num_candidates: int = 64,
           elite_frac: float = 0.125, alpha: float = 0.7, iterations: int = 30, std0: float = 1.0,
           noise_start: float = 0.1, noise_end: float = 0.0, agents: tuple[str, ...] | None = None,
           progress: bool = False) -> FMACEMResult:
    """Cooperative F-MACEM: every agent's parameters searched jointly for the shared J (spec defaults).

    ``agents`` restricts whose terms enter J (None: all agents, the shared objective).

    Returns:
      `FMACEMResult` with the flat theta (``policy.split(theta, env.agents)`` gives the per-agent parts).
    """
    obj = make_objective(env, params, policy, weights, lam=lam, gamma=gamma, num_episodes=num_episodes,
                         agents=agents)
    res = cem(obj, key, policy.flat_init(env.agents), std0, num_candidates=num_candidates,
              elite_frac=elite_frac, alpha=alpha, iterations=iterations, noise_start=noise_start,
              noise_end=noise_end, progress=progress, desc=f"F-MACEM lam={lam:g}")
    return FMACEMResult(res.mean, [res.history])


def independent_fmacem(env: core.FairEnv, params: Any, policy: core.Policy, weights: core.Weights,
                       key: jax.Array, *, lam: float, gamma: float = 0.99, num_episodes: int = 4,
                       num_candidates: int = 64, elite_frac: float = 0.125, alpha: float = 0.7,
                       iterations: int = 30, rounds: int = 2, std0: float = 1.0, noise_start: float = 0.1,
                       noise_end: float = 0.0, progress: bool = False) -> FMACEMResult:
    """Independent F-MACEM: each agent maximises its own J_n over theta_n, others fixed, alternating.

    Each of the ``rounds`` rounds runs, for every agent with parameters, ``ceil(iterations / rounds)`` CEM
    iterations on that agent's coordinates (restarting its sigma at ``std0`` and its mean at its current
    value), so each agent gets about ``iterations`` iterations in all.
    """
    if int(rounds) < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    theta = policy.flat_init(env.agents).astype(np.float32)
    offs, i = {}, 0
    for a in env.agents:
        offs[a] = np.arange(i, i + policy.dims[a])
        i += policy.dims[a]
    per = max(1, math.ceil(iterations / rounds))
    hist = []
    for r in range(rounds):
        for j, a in enumerate(env.agents):
            if policy.dims[a] == 0:
                continue
            obj = make_objective(env, params, policy, weights, lam=lam, gamma=gamma, num_episodes=num_episodes,
                                 agents=(a,), base_theta=theta, coords=offs[a])
            res = cem(obj, jax.random.fold_in(key, 1000 * r + j), theta[offs[a]], std0,
                      num_candidates=num_candidates, elite_frac=elite_frac, alpha=alpha, iterations=per,
                      noise_start=noise_start, noise_end=noise_end, progress=progress,
                      desc=f"independent {a} lam={lam:g}")
            theta = theta.copy()
            theta[offs[a]] = res.mean
            hist.append(res.history)
    return FMACEMResult(theta, hist)


def evaluate(env: core.FairEnv, params: Any, policy: core.Policy, theta, weights: core.Weights, key: jax.Array,
             *, lam: float, gamma: float = 0.99, num_episodes: int = 16) -> dict:
    """Fresh-episode evaluation of a flat theta: per-episode J, return, penalty (shared objective) and the
    per-stage summaries and components, all as numpy arrays with a leading (num_episodes,) axis."""
    core._check_weights(env, weights)

    def build():
        w = {a: {k: jnp.asarray(v, jnp.float32) for k, v in weights[a].items()} for a in weights}

        @jax.jit
        def run(keys, th, lam_, params_):
            def one(k):
                r = core.rollout(env, k, params_, policy, th)
                return core.episode_objective(r["comps"], w, lam=lam_, gamma=gamma), r
            return jax.vmap(one)(keys)
        return run

    run = _memo(_EVAL_CACHE, (env, policy, weights), (float(gamma),), build)
    obj, r = run(jax.random.split(key, num_episodes), jnp.asarray(theta, jnp.float32), jnp.float32(lam), params)
    return jax.tree.map(np.asarray, {**obj, "summary": r["summary"], "comps": r["comps"]})
