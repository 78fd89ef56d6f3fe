"""Malliavin calculus on the Euler-Maruyama grid: first variation, Malliavin derivative, adjoint sums.

For an Ito SDE `dx_t = b(x_t, t) dt + s(x_t, t) dW_t` on a time grid
`t_0 < t_1 < ... < t_K`, the Euler-Maruyama scheme is

    x_{k+1} = x_k + b(x_k, t_k) dt_k + s(x_k, t_k) dW_k,      dW_k ~ N(0, dt_k I_m).

Its first variation (Jacobian flow) `J_k = d x_k / d x_0` is the Euler scheme of
`dJ_t = d_x b(x_t, t) J_t dt + sum_j d_x s_j(x_t, t) J_t dW^j_t`, `J_0 = I`:

    J_{k+1} = M_k J_k,   M_k = d/dx [x + b(x, t_k) dt_k + s(x, t_k) dW_k] at x = x_k,

so simulating `(x, J)` costs `n + n^2` SDE components, whatever parameterizes
`b` and `s`. On the grid the Malliavin derivative of `x_j` with respect to the
Brownian increment on `[t_i, t_{i+1})` is exactly

    D_{t_i} x_j = d x_j / d dW_i = J_j J_{i+1}^{-1} s(x_i, t_i)   for i < j   (0 for i >= j),

the discrete counterpart of the continuous-time formula
`D_s x_t = J_t J_s^{-1} s(x_s, s)` (`s <= t`), to which it converges at rate
O(dt) (the two differ by the one-step factor `M_i`). Weighted sums of these
derivatives, `sum_{j > i} (D_{t_i} x_j)^T g_j = s_i^T p_{i+1}`, need only the
adjoint `p_k = sum_{j >= k} (J_j J_k^{-1})^T g_j`, which `malliavin_adjoint`
computes from `J` by one reverse cumulative sum and `K` linear solves (no
backward SDE, no differentiation through the path).

Dimension legend: `K` Euler steps (the grid has `K + 1` times), `n` state
dimension, `m` noise dimension (`m = n` for diagonal noise).

Conventions: `drift(x, t) -> [n]`; `diffusion(x, t) -> [n]` (diagonal noise,
`s = diag(.)`, `m = n`) or `[n, m]` (general noise). All functions are pure,
jit/vmap friendly, and deterministic given the key or the increments.

References:
  Nualart, "The Malliavin Calculus and Related Topics", Springer, 2nd ed., 2006 (Ch. 2.2).
  Kloeden, Platen, "Numerical Solution of Stochastic Differential Equations", Springer, 1992.
  Amidzadeh, Viitasaari, Di Francesco, "Non-Parametric Optimization for Scalable Learning in
  Stochastic Decision Problems", ICML 2026 (OpenReview rD79qEJ5iR; no arXiv id).
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

__all__ = [
    "brownian_increments",
    "euler_maruyama",
    "malliavin_first_variation",
    "malliavin_derivative",
    "malliavin_adjoint",
]

Drift = Callable[[jax.Array, jax.Array], jax.Array]
Diffusion = Callable[[jax.Array, jax.Array], jax.Array]


def _check_grid(ts) -> None:
    if ts.ndim != 1 or ts.shape[0] < 2:
        raise ValueError(f"ts must be a 1-D time grid with at least 2 points [K+1]; got shape {ts.shape}")


def _check_x0(x0) -> None:
    if x0.ndim != 1:
        raise ValueError(f"x0 must be a state vector of shape [n]; got shape {x0.shape}")


def _noise_shape(diffusion: Diffusion, x0, t0) -> tuple[bool, int]:
    """(diagonal?, noise dim m) from the diffusion's output shape, checked against n."""
    n = x0.shape[0]
    out = jax.eval_shape(diffusion, x0, t0)
    if out.shape == (n,):
        return True, n
    if len(out.shape) == 2 and out.shape[0] == n:
        return False, out.shape[1]
    raise ValueError(f"diffusion(x, t) must return [n]=({n},) (diagonal) or [n, m] (general); got {out.shape}")


def _apply_noise(sig, dw, diagonal: bool):
    return sig * dw if diagonal else sig @ dw


def brownian_increments(key: jax.Array, ts: jax.Array, noise_dim: int, *, batch_shape: tuple[int, ...] = ()
                        ) -> jax.Array:
    """Brownian increments `dW_k ~ N(0, (t_{k+1} - t_k) I_m)` on a grid.

    Args:
      key: PRNG key.
      ts: time grid [K+1], increasing.
      noise_dim: m, the number of independent Brownian motions.
      batch_shape: leading batch dimensions (e.g. `(num_paths,)`).

    Returns:
      Increments of shape `batch_shape + (K, m)` (float32).

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> brownian_increments(jax.random.key(0), jnp.linspace(0., 1., 5), 2, batch_shape=(3,)).shape
      (3, 4, 2)
    """
    ts = jnp.asarray(ts, jnp.float32)
    _check_grid(ts)
    if noise_dim < 1:
        raise ValueError(f"noise_dim must be >= 1; got {noise_dim}")
    dt = jnp.diff(ts)
    z = jax.random.normal(key, tuple(batch_shape) + (dt.shape[0], noise_dim), jnp.float32)
    return z * jnp.sqrt(dt)[:, None]


def _resolve_increments(diffusion, x0, ts, key, dw):
    diagonal, m = _noise_shape(diffusion, x0, ts[0])
    k = ts.shape[0] - 1
    if dw is None:
        if key is None:
            raise ValueError("pass either key or dw (the Brownian increments [K, m]); got neither")
        dw = brownian_increments(key, ts, m)
    dw = jnp.asarray(dw, jnp.float32)
    if dw.shape != (k, m):
        raise ValueError(f"dw must have shape [K, m]={(k, m)} for a grid of {k + 1} times; got {dw.shape}")
    return dw, diagonal


def euler_maruyama(drift: Drift, diffusion: Diffusion, x0: jax.Array, ts: jax.Array, key: jax.Array | None = None,
                   *, dw: jax.Array | None = None) -> jax.Array:
    """Euler-Maruyama path of `dx = b dt + s dW` (one path; vmap for many).

    Args:
      drift: `b(x [n], t []) -> [n]`.
      diffusion: `s(x, t) -> [n]` (diagonal) or `[n, m]`.
      x0: initial state [n].
      ts: time grid [K+1].
      key: PRNG key for the increments (ignored when `dw` is given).
      dw: explicit Brownian increments [K, m] (common random numbers, finite differences).

    Returns:
      The path [K+1, n] with `x[0] = x0`.
    """
    x0 = jnp.asarray(x0, jnp.float32)
    ts = jnp.asarray(ts, jnp.float32)
    _check_x0(x0)
    _check_grid(ts)
    dw, diagonal = _resolve_increments(diffusion, x0, ts, key, dw)

    def step(x, inp):
        t, dt, w = inp
        x_next = x + drift(x, t) * dt + _apply_noise(diffusion(x, t), w, diagonal)
        return x_next, x_next

    _, xs = jax.lax.scan(step, x0, (ts[:-1], jnp.diff(ts), dw))
    return jnp.concatenate([x0[None], xs], axis=0)


def malliavin_first_variation(drift: Drift, diffusion: Diffusion, x0: jax.Array, ts: jax.Array,
                              key: jax.Array | None = None, *, dw: jax.Array | None = None
                              ) -> tuple[jax.Array, jax.Array]:
    """Euler path and its first-variation (Jacobian) flow `J_k = d x_k / d x_0`.

    Integrates the `n + n^2` components `(x, J)` jointly: `J_{k+1} = M_k J_k` with
    `M_k` the Jacobian in `x` of the Euler step (drift and noise terms), which is
    the Euler scheme of `dJ = d_x b J dt + sum_j d_x s_j J dW^j`, `J_0 = I`. The
    result is exactly the derivative of the discrete path with respect to `x0`.

    Args:
      drift: `b(x [n], t []) -> [n]`.
      diffusion: `s(x, t) -> [n]` (diagonal) or `[n, m]`.
      x0: initial state [n].
      ts: time grid [K+1].
      key: PRNG key for the increments (ignored when `dw` is given).
      dw: explicit Brownian increments [K, m].

    Returns:
      `(x [K+1, n], J [K+1, n, n])`.

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> ts = jnp.linspace(0., 1., 11)
      >>> x, J = malliavin_first_variation(lambda x, t: -x, lambda x, t: 0.0 * x + 0.5, jnp.ones(1), ts,
      ...                                  jax.random.key(0))
      >>> bool(jnp.allclose(J[-1, 0, 0], 0.9 ** 10))   # OU: J_K = (1 - k dt)^K, noise additive
      True
    """
    x0 = jnp.asarray(x0, jnp.float32)
    ts = jnp.asarray(ts, jnp.float32)
    _check_x0(x0)
    _check_grid(ts)
    dw, diagonal = _resolve_increments(diffusion, x0, ts, key, dw)
    n = x0.shape[0]

    def step(carry, inp):
        x, jac = carry
        t, dt, w = inp

        def euler(y):
            return y + drift(y, t) * dt + _apply_noise(diffusion(y, t), w, diagonal)

        x_next, m_k = euler(x), jax.jacfwd(euler)(x)
        jac_next = m_k @ jac
        return (x_next, jac_next), (x_next, jac_next)

    eye = jnp.eye(n, dtype=jnp.float32)
    _, (xs, js) = jax.lax.scan(step, (x0, eye), (ts[:-1], jnp.diff(ts), dw))
    return jnp.concatenate([x0[None], xs], 0), jnp.concatenate([eye[None], js], 0)


def malliavin_derivative(jac: jax.Array, sigma: jax.Array) -> jax.Array:
    """Malliavin derivatives `D_{t_i} x_j` of an Euler path from its first variation.

    `D[j, i] = J_j J_{i+1}^{-1} s(x_i, t_i)` for `i < j` and 0 otherwise: the exact
    derivative `d x_j / d dW_i` of the discrete path, i.e. the Malliavin derivative
    of the piecewise-constant interpolation on `[t_i, t_{i+1})`. It converges to
    `J_t J_s^{-1} s(x_s, s)` at rate O(dt). (The spec's signature was
    `malliavin_derivative(J, s, x)`; here the diffusion is passed already
    evaluated on the path, `sigma[i] = s(x_i, t_i)`.)

    Args:
      jac: first variation [K+1, n, n] from `malliavin_first_variation`.
      sigma: diffusion values at the left grid points, [K, n] (diagonal) or [K, n, m].

    Returns:
      D of shape [K+1, K, n, m] (memory O(K^2 n m): for diagnostics and tests;
      use `malliavin_adjoint` for weighted sums).
    """
    if jac.ndim != 3 or jac.shape[1] != jac.shape[2]:
        raise ValueError(f"jac must have shape [K+1, n, n]; got {jac.shape}")
    k1, n, _ = jac.shape
    if sigma.shape == (k1 - 1, n):
        sigma = jax.vmap(jnp.diag)(sigma)
    if sigma.ndim != 3 or sigma.shape[:2] != (k1 - 1, n):
        raise ValueError(f"sigma must have shape [K, n] or [K, n, m] with K={k1 - 1}, n={n}; got {sigma.shape}")
    # B_i = J_{i+1}^{-1} s_i  [K, n, m]
    right = jnp.linalg.solve(jac[1:], sigma)
    d = jnp.einsum("jab,ibm->jiam", jac, right)
    mask = jnp.arange(k1)[:, None] > jnp.arange(k1 - 1)[None, :]
    return jnp.where(mask[:, :, None, None], d, 0.0)


def malliavin_adjoint(jac: jax.Array, g: jax.Array) -> jax.Array:
    """Adjoint `p_k = sum_{j >= k} (J_j J_k^{-1})^T g_j` from the first variation.

    With `g_j` the gradient of a running cost at `x_j` (times its quadrature
    weight), `p_{k}` is the total derivative of `sum_j cost(x_j)` with respect to
    `x_k`; hence `sum_{j > i} (D_{t_i} x_j)^T g_j = s(x_i, t_i)^T p_{i+1}` and the
    derivative of the cost with respect to a drift perturbation at step `i` is
    `p_{i+1} dt_i`. Computed forward-only: a reverse cumulative sum of `J_j^T g_j`
    and one linear solve per step.

    Args:
      jac: [K+1, n, n] first variation.
      g: [K+1, n] weighted running-cost gradients.

    Returns:
      p: [K+1, n].
    """
    if jac.ndim != 3 or jac.shape[1] != jac.shape[2]:
        raise ValueError(f"jac must have shape [K+1, n, n]; got {jac.shape}")
    if g.shape != jac.shape[:2]:
        raise ValueError(f"g must have shape [K+1, n]={jac.shape[:2]}; got {g.shape}")
    jt_g = jnp.einsum("kab,ka->kb", jac, g)  # J_j^T g_j
    tail = jnp.cumsum(jt_g[::-1], axis=0)[::-1]  # sum_{j >= k}
    return jnp.linalg.solve(jnp.swapaxes(jac, -1, -2), tail[..., None])[..., 0]
