"""Lorentz (hyperboloid) model of hyperbolic space: the geometry of Hyper-ICL's anchor distillation.

Dimension legend: `...` any batch shape, `d` the intrinsic (tangent / spatial) dimension, so points
live in R^{d+1} with the time coordinate first. `c` > 0 is the curvature magnitude (curvature -c;
the spec calls it kappa).

    <x, y>_L = -x_0 y_0 + sum_{i>=1} x_i y_i                     Minkowski inner product   (10)
    H^d_c   = {x : <x, x>_L = -1/c, x_0 > 0},  origin o = (1/sqrt(c), 0, ..., 0)            (11)
    exp_o(u) = cosh(sqrt(c)|u|) o + sinh(sqrt(c)|u|)/(sqrt(c)|u|) (0, u)                   (13, 14)
    d(x, y)  = arccosh(-c <x, y>_L) / sqrt(c)                                              (15)
    anchor loss = mean over layers and tokens of d^2(exp_o(LN(h')), exp_o(LN(h)))           (16)

Spec: /work/shared/papers/specs/rl_alignment_agents.md, section 9 (Hyper-ICL), equations (10)-(16)
and its numerics note. The general exp/log maps at a point, the projections and parallel transport
are the textbook Lorentz-model formulas (Nickel & Kiela 2018; Chami et al. 2019), scaled to
curvature -c; Hyper-ICL itself uses only exp_o and the distance.

Numerics (float32 and float64; every function computes in its input's floating dtype):
  * arccosh(-c<x, y>_L) is evaluated as arccosh(1 + z) with z = (c/2)<x - y, x - y>_L clamped to
    >= 0 (equal on the hyperboloid, exact at x == y, where -c<x, y>_L - 1 cancels);
  * d^2 uses the series arccosh(1 + z)^2 = 2z - z^2/3 + 4z^3/45 for small z, so its gradient at
    x == y is finite (the limit), where the naive autodiff path is 0/0; `distance` is the safe
    square root of that (gradient 0 at x == y, finite elsewhere);
  * the norms inside exp_o / exp_x / log maps switch to Taylor series below the dtype's epsilon, so
    gradients at the origin and at zero tangent vectors are finite;
  * large norms overflow cosh in float32 past sqrt(c)|u| ~ 88: the caller keeps |u| moderate
    (Hyper-ICL's LN(h) has |u| ~ sqrt(d); compute the loss in float32, never bf16).

[INFER] Which layer norm feeds the anchor: a parameter-free LayerNorm (the spec's section 9 (f)).

References:
  Alipour Talemi, Kashiani, Afghah, "Attention Calibration with Hyperbolic Anchor Distillation for
  Multimodal In-Context Learning" (Hyper-ICL), arXiv:2606.04434, 2026.
  Nickel & Kiela, "Learning Continuous Hierarchies in the Lorentz Model of Hyperbolic Geometry",
  arXiv:1806.03417, 2018.
  Chami et al., "Hyperbolic Graph Convolutional Neural Networks", arXiv:1910.12933, 2019.

Examples:
  >>> import jax.numpy as jnp
  >>> p = expmap0(jnp.array([0.3, -0.4]), curvature=0.1)
  >>> bool(jnp.abs(minkowski_inner(p, p) + 1 / 0.1) < 1e-4)
  True
  >>> round(float(distance(origin(2, curvature=0.1), p, curvature=0.1)), 4)  # = |u| from the origin
  0.5
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from primitives.validation import check_positive_finite

__all__ = [
    "minkowski_inner",
    "origin",
    "project",
    "project_tangent",
    "expmap0",
    "logmap0",
    "expmap",
    "logmap",
    "squared_distance",
    "distance",
    "parallel_transport",
    "layer_norm",
    "anchor_loss",
]

# arccosh(1 + z)^2 switches to its series below this z (relative error of the cut series ~ z^3).
_SERIES_Z = 1e-4


def _float(name: str, x) -> jax.Array:
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"{name} must be a floating array; got dtype {x.dtype}")
    return x


def _point(name: str, x) -> jax.Array:
    x = _float(name, x)
    if x.ndim < 1 or x.shape[-1] < 2:
        raise ValueError(f"{name} must be [..., d+1] points with d >= 1; got shape {x.shape}")
    return x


def _curvature(curvature) -> float:
    return check_positive_finite("curvature", curvature)


def _tiny(dtype) -> float:
    return float(jnp.finfo(dtype).eps)


def minkowski_inner(x: jax.Array, y: jax.Array) -> jax.Array:
    """<x, y>_L = -x_0 y_0 + sum_i x_i y_i over the last axis: [..., d+1] x [..., d+1] -> [...]."""
    x, y = _point("x", x), _point("y", y)
    if x.shape[-1] != y.shape[-1]:
        raise ValueError(f"x and y must share the last dim; got x {x.shape}, y {y.shape}")
    return -x[..., 0] * y[..., 0] + jnp.sum(x[..., 1:] * y[..., 1:], axis=-1)


def origin(dim: int, *, curvature: float, dtype=jnp.float32) -> jax.Array:
    """The origin o = (1/sqrt(c), 0, ..., 0) of H^dim_c: [dim + 1]."""
    if not isinstance(dim, int) or dim < 1:
        raise ValueError(f"dim must be an int >= 1; got {dim!r}")
    c = _curvature(curvature)
    return jnp.zeros((dim + 1,), dtype).at[0].set(1.0 / math.sqrt(c))


def project(x: jax.Array, *, curvature: float) -> jax.Array:
    """Projects [..., d+1] onto H^d_c by recomputing the time coordinate from the spatial part.

    x_0 <- sqrt(1/c + |x_{1:}|^2), so <x, x>_L = -1/c and x_0 > 0 (the spatial part is kept).
    """
    x = _point("x", x)
    c = _curvature(curvature)
    spatial = x[..., 1:]
    x0 = jnp.sqrt(1.0 / c + jnp.sum(spatial * spatial, axis=-1, keepdims=True))
    return jnp.concatenate([x0, spatial], axis=-1)


def project_tangent(x: jax.Array, v: jax.Array, *, curvature: float) -> jax.Array:
    """Projects v [..., d+1] onto the tangent space at x in H^d_c: v + c <x, v>_L x (so <x, .>_L = 0)."""
    c = _curvature(curvature)
    return v + c * minkowski_inner(x, v)[..., None] * x


def _norm_parts(sq: jax.Array, c: float):
    """For squared norms sq >= 0: (cosh(sqrt(c) n), sinh(sqrt(c) n)/(sqrt(c) n)) with n = sqrt(sq).

    Below the dtype's epsilon both use their Taylor series, so the gradient at n = 0 is finite.
    """
    small = sq < _tiny(sq.dtype)
    n = jnp.sqrt(jnp.where(small, 1.0, sq))
    a = math.sqrt(c) * n
    cosh = jnp.where(small, 1.0 + 0.5 * c * sq, jnp.cosh(a))
    sinhc = jnp.where(small, 1.0 + c * sq / 6.0, jnp.sinh(a) / a)
    return cosh, sinhc


def expmap0(u: jax.Array, *, curvature: float) -> jax.Array:
    """Exponential map at the origin: tangent vectors u [..., d] (spatial coordinates) -> points [..., d+1].

    exp_o(u) = (cosh(sqrt(c)|u|)/sqrt(c), sinh(sqrt(c)|u|)/(sqrt(c)|u|) u)   (spec eq. 13-14).
    """
    u = _float("u", u)
    if u.ndim < 1:
        raise ValueError(f"u must be [..., d] tangent vectors; got shape {u.shape}")
    c = _curvature(curvature)
    cosh, sinhc = _norm_parts(jnp.sum(u * u, axis=-1, keepdims=True), c)
    return jnp.concatenate([cosh / math.sqrt(c), sinhc * u], axis=-1)


def logmap0(x: jax.Array, *, curvature: float) -> jax.Array:
    """Logarithmic map at the origin: points [..., d+1] -> tangent vectors [..., d] (inverse of expmap0).

    log_o(x) = arcsinh(sqrt(c)|x_s|)/(sqrt(c)|x_s|) x_s with x_s = x_{1:} (arcsinh of the spatial
    norm, which is exact near the origin where arccosh(sqrt(c) x_0) loses precision).
    """
    x = _point("x", x)
    c = _curvature(curvature)
    xs = x[..., 1:]
    sq = jnp.sum(xs * xs, axis=-1, keepdims=True)
    small = sq < _tiny(sq.dtype)
    a = math.sqrt(c) * jnp.sqrt(jnp.where(small, 1.0, sq))
    coef = jnp.where(small, 1.0 - c * sq / 6.0, jnp.arcsinh(a) / a)
    return coef * xs


def expmap(x: jax.Array, v: jax.Array, *, curvature: float) -> jax.Array:
    """Exponential map at x: a tangent vector v [..., d+1] at x [..., d+1] -> a point [..., d+1].

    exp_x(v) = cosh(sqrt(c)|v|_L) x + sinh(sqrt(c)|v|_L)/(sqrt(c)|v|_L) v, |v|_L = sqrt(<v, v>_L).
    v should satisfy <x, v>_L = 0 (use `project_tangent`).
    """
    c = _curvature(curvature)
    sq = jnp.maximum(minkowski_inner(v, v), 0.0)[..., None]
    cosh, sinhc = _norm_parts(sq, c)
    return cosh * x + sinhc * v


def _excess(x: jax.Array, y: jax.Array, c: float) -> jax.Array:
    """z = -c <x, y>_L - 1 >= 0 for points x, y of H_c, as (c/2) <x - y, x - y>_L.

    The identity holds on the hyperboloid; the difference form is exact (0) at x == y, where
    -c <x, y>_L - 1 cancels catastrophically (float32: ~eps * x_0^2). Clamped at 0.
    """
    diff = x - y
    return jnp.maximum(0.5 * c * minkowski_inner(diff, diff), 0.0)


def _arccosh_ratio(z: jax.Array) -> jax.Array:
    """arccosh(1 + z) / sqrt((1 + z)^2 - 1) for z >= 0 (-> 1 - z/3 at z = 0)."""
    small = z < _SERIES_Z
    a = jnp.where(small, 2.0, 1.0 + z)
    exact = jnp.arccosh(a) / jnp.sqrt(a * a - 1.0)
    return jnp.where(small, 1.0 - z / 3.0 + 2.0 * z * z / 15.0, exact)


def logmap(x: jax.Array, y: jax.Array, *, curvature: float) -> jax.Array:
    """Logarithmic map at x: the tangent vector at x [..., d+1] pointing to y with length d(x, y).

    log_x(y) = arccosh(a)/sqrt(a^2 - 1) (y - a x),  a = -c <x, y>_L (the inverse of `expmap`),
    with a - 1 computed as (c/2) <x - y, x - y>_L (see `squared_distance`).
    """
    c = _curvature(curvature)
    z = _excess(x, y, c)[..., None]
    return _arccosh_ratio(z) * (y - x - z * x)


def _arccosh_squared(z: jax.Array) -> jax.Array:
    """arccosh(1 + z)^2 for z >= 0, with a finite gradient at z = 0."""
    small = z < _SERIES_Z
    a = jnp.where(small, 2.0, 1.0 + z)
    exact = jnp.arccosh(a) ** 2
    return jnp.where(small, 2.0 * z - z * z / 3.0 + 4.0 * z ** 3 / 45.0, exact)


def squared_distance(x: jax.Array, y: jax.Array, *, curvature: float) -> jax.Array:
    """d(x, y)^2 = arccosh(-c <x, y>_L)^2 / c for points [..., d+1] of H_c (broadcasting) -> [...].

    -c <x, y>_L is evaluated as 1 + (c/2) <x - y, x - y>_L (equal on the hyperboloid; exactly 0 at
    x == y in any precision). Finite gradient everywhere, including x == y (spec section 9 numerics
    note).
    """
    c = _curvature(curvature)
    return _arccosh_squared(_excess(x, y, c)) / c


def distance(x: jax.Array, y: jax.Array, *, curvature: float) -> jax.Array:
    """Geodesic distance d(x, y) = arccosh(-c <x, y>_L) / sqrt(c) for points [..., d+1] -> [...].

    The square root is taken safely: the gradient is 0 at x == y (a subgradient) and finite elsewhere.
    """
    sq = squared_distance(x, y, curvature=curvature)
    pos = sq > 0
    return jnp.where(pos, jnp.sqrt(jnp.where(pos, sq, 1.0)), 0.0)


def parallel_transport(x: jax.Array, y: jax.Array, v: jax.Array, *, curvature: float) -> jax.Array:
    """Parallel transport of the tangent vector v at x to the tangent space at y (along the geodesic).

    PT_{x->y}(v) = v + c <y, v>_L / (1 - c <x, y>_L) (x + y); preserves <v, w>_L and maps
    T_x H to T_y H. (Not used by Hyper-ICL's loss; provided for completeness.)
    """
    c = _curvature(curvature)
    coef = c * minkowski_inner(y, v) / (1.0 - c * minkowski_inner(x, y))
    return v + coef[..., None] * (x + y)


def layer_norm(h: jax.Array, *, eps: float = 1e-5) -> jax.Array:
    """Parameter-free LayerNorm over the last axis: (h - mean) / sqrt(var + eps). [..., D] -> [..., D]."""
    h = _float("h", h)
    mean = jnp.mean(h, axis=-1, keepdims=True)
    var = jnp.mean((h - mean) ** 2, axis=-1, keepdims=True)
    return (h - mean) * jax.lax.rsqrt(var + eps)


def anchor_loss(student: jax.Array, teacher: jax.Array, *, curvature: float = 0.1,
                mask: jax.Array | None = None) -> jax.Array:
    """Hyper-ICL's layer-wise hyperbolic anchor loss (spec eq. 12-16).

    Each hidden state is layer-normed (parameter-free, [INFER]), lifted with exp_o, and the squared
    Lorentz distance between student and teacher is averaged over tokens (weighted by `mask`) within
    each layer, then over layers. Computed in float32 (or float64 for float64 inputs).

    Args:
      student: [L, b, t, D] hidden states of the demonstration-free student at the query tokens.
      teacher: [L, b, t, D] the teacher's hidden states at the same tokens (gradient is not stopped
        here; pass `jax.lax.stop_gradient(teacher)` for distillation).
      curvature: c > 0 (the paper's kappa = 0.1).
      mask: optional [b, t] weights (1 = a query token that counts).

    Returns:
      scalar loss.
    """
    student, teacher = _float("student", student), _float("teacher", teacher)
    if student.shape != teacher.shape or student.ndim != 4:
        raise ValueError(f"student and teacher must both be [L, b, t, D]; got {student.shape} and {teacher.shape}")
    dtype = jnp.promote_types(student.dtype, jnp.float32)
    ps = expmap0(layer_norm(student.astype(dtype)), curvature=curvature)
    pt = expmap0(layer_norm(teacher.astype(dtype)), curvature=curvature)
    sq = squared_distance(ps, pt, curvature=curvature)  # [L, b, t]
    if mask is None:
        return jnp.mean(sq)
    mask = jnp.asarray(mask, dtype)
    if mask.shape != student.shape[1:3]:
        raise ValueError(f"mask must be [b, t] = {student.shape[1:3]}; got {mask.shape}")
    per_layer = jnp.sum(sq * mask, axis=(1, 2)) / jnp.maximum(jnp.sum(mask), 1.0)
    return jnp.mean(per_layer)
