"""Mixture-of-experts routing as pure functions: logits, top-k gating, auxiliary losses, dispatch.

Dimension legend: `...` any leading token dims (e.g. `b, t`), `m` tokens (flattened), `D` router
input width, `E` experts, `k` experts per token (top-k), `n = m * k` token-expert assignments.

The pieces a MoE layer (`models.moe`) and the MoE papers need:

  * `router_logits(x, w_router, bias=None)`: `z = x @ W_r (+ b)` in float32. `bias` [E] is the
    additive per-layer router-logit vector of test-time rerouting (Su et al.); `None` and an
    all-zero bias give bitwise identical logits.
  * `top_k_gating(logits, k, renormalize=...)`: softmax over all E experts, the k largest
    probabilities, and their gate weights. `renormalize=True` divides the k selected
    probabilities by their sum (Mixtral / Qwen-MoE style, gates sum to 1);
    `renormalize=False` uses the raw softmax probabilities (OLMoE / Switch style, gates sum to
    the selected probability mass <= 1). Ties go to the lower expert id (`lax.top_k`).
  * `load_balancing_loss` (Switch/GShard: `E * sum_e f_e * P_e`, equal to 1 when perfectly
    balanced) and `router_z_loss` (ST-MoE: `mean_t logsumexp(z_t)^2`).
  * `routing_confidence` (top-k mass, top-1 probability or top-1 minus top-2 margin) and
    `routing_entropy` per token, the layer-selection scores of test-time rerouting.
  * `dispatch_metadata(indices, E)`: a stable sort of the `n = m * k` assignments by expert,
    the group sizes [E] and the inverse permutation, so that dropless expert compute is
    `sort_by_expert -> grouped matmul -> unsort -> gate-weighted combine`.

References:
  Fedus, Zoph, Shazeer, "Switch Transformers: Scaling to Trillion Parameter Models with Simple and
    Efficient Sparsity", arXiv:2101.03961, 2021 (load-balancing loss).
  Lepikhin et al., "GShard: Scaling Giant Models with Conditional Computation and Automatic
    Sharding", arXiv:2006.16668, 2020.
  Zoph et al., "ST-MoE: Designing Stable and Transferable Sparse Expert Models", arXiv:2202.08906,
    2022 (router z-loss).
  Su et al., "Rewiring Experts on the Fly: Continuous Rerouting for Better Online Adaptation in
    Mixture-of-Expert Models", arXiv:2510.14853, 2025 (additive router bias).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

__all__ = [
    "Routing",
    "Dispatch",
    "router_logits",
    "top_k_gating",
    "load_balancing_loss",
    "router_z_loss",
    "routing_confidence",
    "routing_entropy",
    "dispatch_metadata",
    "sort_by_expert",
    "unsort",
    "combine",
    "CONFIDENCE_KINDS",
]

CONFIDENCE_KINDS = ("topk_mass", "top1", "margin")


class Routing(NamedTuple):
    """Result of top-k gating.

    Attributes:
      indices: [..., k] int32 selected experts, in decreasing probability order.
      gates: [..., k] float32 gate weights of the selected experts.
      probs: [..., E] float32 softmax over all experts (what the auxiliary losses use).
    """

    indices: jax.Array
    gates: jax.Array
    probs: jax.Array


class Dispatch(NamedTuple):
    """Token-expert assignments sorted by expert (stable), for dropless grouped compute.

    Attributes:
      order: [n] int32, `order[j]` = flat assignment id (token * k + slot) of sorted row j.
      token_index: [n] int32, the token each sorted row reads (`order // k`).
      inverse: [n] int32, inverse permutation: sorted row of flat assignment i is `inverse[i]`.
      group_sizes: [E] int32 rows per expert; they sum to n.
      expert_ids: [n] int32 the expert of each sorted row (non-decreasing).
    """

    order: jax.Array
    token_index: jax.Array
    inverse: jax.Array
    group_sizes: jax.Array
    expert_ids: jax.Array


def router_logits(x: jax.Array, w_router: jax.Array, bias: jax.Array | None = None) -> jax.Array:
    """Router logits `x @ W_r (+ bias)`, computed in float32.

    Args:
      x: [..., D] router inputs (the normed residual stream entering the MoE FFN).
      w_router: [D, E] router weights.
      bias: optional [E] additive logit vector (shared by every token). None adds nothing; a
        zero vector leaves the logits bitwise unchanged (x + 0.0 == x in IEEE arithmetic).

    Returns:
      [..., E] float32 logits.

    Raises:
      ValueError: mismatched widths or a bias that is not [E].

    Examples:
      >>> import jax.numpy as jnp
      >>> z = router_logits(jnp.ones((2, 3)), jnp.eye(3)[:, :2], jnp.array([0.5, 0.0]))
      >>> z.tolist()
      [[1.5, 1.0], [1.5, 1.0]]
    """
    if w_router.ndim != 2:
        raise ValueError(f"w_router must be [D, E]; got shape {w_router.shape}")
    if x.ndim < 1 or x.shape[-1] != w_router.shape[0]:
        raise ValueError(f"x must be [..., D] with D={w_router.shape[0]} (w_router {w_router.shape}); got {x.shape}")
    z = jnp.matmul(x.astype(jnp.float32), w_router.astype(jnp.float32))
    if bias is not None:
        if bias.shape != (w_router.shape[1],):
            raise ValueError(f"bias must have shape [E]=({w_router.shape[1]},); got {bias.shape}")
        z = z + bias.astype(jnp.float32)
    return z


def top_k_gating(logits: jax.Array, k: int, *, renormalize: bool = True) -> Routing:
    """Softmax over all E experts, then the top-k experts and their gates.

    Args:
      logits: [..., E] router logits.
      k: experts per token, 1 <= k <= E.
      renormalize: True: gates = top-k probabilities / their sum (they sum to 1). False: gates =
        the raw top-k softmax probabilities (they sum to the selected mass). Either way the gates
        are differentiable through the softmax over all E experts, so an additive logit bias
        receives gradient in every coordinate, and (shift invariance) those gradients sum to 0.

    Returns:
      Routing(indices [..., k], gates [..., k], probs [..., E]).

    Examples:
      >>> import jax.numpy as jnp
      >>> r = top_k_gating(jnp.log(jnp.array([[0.5, 0.2, 0.3]])), 2, renormalize=False)
      >>> r.indices.tolist(), [round(g, 3) for g in r.gates[0].tolist()]
      ([[0, 2]], [0.5, 0.3])
      >>> [round(g, 3) for g in top_k_gating(jnp.log(jnp.array([0.5, 0.2, 0.3])), 2).gates.tolist()]
      [0.625, 0.375]
    """
    if logits.ndim < 1:
        raise ValueError(f"logits must be [..., E]; got shape {logits.shape}")
    num_experts = logits.shape[-1]
    if not 1 <= k <= num_experts:
        raise ValueError(f"k must be in [1, E={num_experts}]; got k={k}")
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
    top, indices = jax.lax.top_k(probs, k)
    if renormalize:
        top = top / jnp.sum(top, axis=-1, keepdims=True)
    return Routing(indices.astype(jnp.int32), top, probs)


def _token_mask(mask, shape):
    if mask is None:
        return jnp.ones(shape, jnp.float32)
    if mask.shape != shape:
        raise ValueError(f"mask must have the token shape {shape}; got {mask.shape}")
    return mask.astype(jnp.float32)


def load_balancing_loss(probs: jax.Array, indices: jax.Array, *, mask: jax.Array | None = None) -> jax.Array:
    """Switch/GShard load-balancing loss `E * sum_e f_e * P_e`.

    `f_e` is the fraction of the token-expert assignments (all k slots) that go to expert e
    (a count, not differentiable) and `P_e` the mean router probability of expert e (the
    differentiable part). With k = 1 this is exactly Switch's loss; dividing the counts by k
    keeps the perfectly balanced value at 1 for every k.

    Args:
      probs: [..., E] softmax router probabilities.
      indices: [..., k] selected experts.
      mask: optional [...] token weights (1 = real token, 0 = padding).

    Returns:
      scalar float32 (1.0 when both f and P are uniform; E when everything goes to one expert).

    Examples:
      >>> import jax.numpy as jnp
      >>> probs = jnp.full((4, 2), 0.5)
      >>> float(load_balancing_loss(probs, jnp.array([[0], [1], [0], [1]])))
      1.0
    """
    if indices.shape[:-1] != probs.shape[:-1]:
        raise ValueError(f"indices [..., k] {indices.shape} and probs [..., E] {probs.shape} disagree on tokens")
    num_experts, k = probs.shape[-1], indices.shape[-1]
    w = _token_mask(mask, probs.shape[:-1])
    denom = jnp.maximum(jnp.sum(w), 1.0)
    counts = jnp.sum(jax.nn.one_hot(indices, num_experts, dtype=jnp.float32) * w[..., None, None],
                     axis=tuple(range(indices.ndim)))
    f = jax.lax.stop_gradient(counts / (denom * k))
    p = jnp.sum(probs.astype(jnp.float32) * w[..., None], axis=tuple(range(probs.ndim - 1))) / denom
    return num_experts * jnp.sum(f * p)


def router_z_loss(logits: jax.Array, *, mask: jax.Array | None = None) -> jax.Array:
    """ST-MoE router z-loss: mean over tokens of `logsumexp(z)^2` (keeps router logits small).

    Examples:
      >>> import jax.numpy as jnp
      >>> round(float(router_z_loss(jnp.zeros((3, 4)))), 4)  # (log 4)^2
      1.9218
    """
    if logits.ndim < 1:
        raise ValueError(f"logits must be [..., E]; got shape {logits.shape}")
    w = _token_mask(mask, logits.shape[:-1])
    lse = jax.nn.logsumexp(logits.astype(jnp.float32), axis=-1)
    return jnp.sum(w * lse * lse) / jnp.maximum(jnp.sum(w), 1.0)


def routing_confidence(probs: jax.Array, *, k: int = 1, kind: str = "topk_mass") -> jax.Array:
    """Per-token routing confidence from the softmax over experts.

    Args:
      probs: [..., E] router probabilities.
      k: experts per token (used by "topk_mass").
      kind: "topk_mass" (sum of the k largest probabilities, the score of test-time rerouting's
        layer selection), "top1" (largest probability) or "margin" (top-1 minus top-2; needs E >= 2).

    Returns:
      [...] float32.

    Examples:
      >>> import jax.numpy as jnp
      >>> p = jnp.array([0.6, 0.3, 0.1])
      >>> [round(float(routing_confidence(p, k=2, kind=c)), 3) for c in CONFIDENCE_KINDS]
      [0.9, 0.6, 0.3]
    """
    if kind not in CONFIDENCE_KINDS:
        raise ValueError(f"kind must be one of {CONFIDENCE_KINDS}; got {kind!r}")
    num_experts = probs.shape[-1]
    need = {"topk_mass": k, "top1": 1, "margin": 2}[kind]
    if not 1 <= need <= num_experts:
        raise ValueError(f"kind={kind!r} with k={k} needs 1 <= {need} <= E={num_experts}")
    top = jax.lax.top_k(probs.astype(jnp.float32), need)[0]
    if kind == "margin":
        return top[..., 0] - top[..., 1]
    return jnp.sum(top, axis=-1)


def routing_entropy(probs: jax.Array) -> jax.Array:
    """Per-token entropy (nats) of the router distribution; 0 * log 0 = 0.

    Examples:
      >>> import jax.numpy as jnp
      >>> round(float(routing_entropy(jnp.array([0.5, 0.5, 0.0]))), 4)
      0.6931
    """
    p = probs.astype(jnp.float32)
    return -jnp.sum(jnp.where(p > 0, p * jnp.log(jnp.where(p > 0, p, 1.0)), 0.0), axis=-1)


def dispatch_metadata(indices: jax.Array, num_experts: int) -> Dispatch:
    """Sorts the m * k token-expert assignments by expert (stable: token order kept per expert).

    Args:
      indices: [m, k] int expert ids per token.
      num_experts: E.

    Returns:
      Dispatch (see its attributes). `group_sizes` sums to m * k.

    Examples:
      >>> import jax.numpy as jnp
      >>> d = dispatch_metadata(jnp.array([[1, 0], [1, 2]]), 3)
      >>> d.token_index.tolist(), d.group_sizes.tolist(), d.expert_ids.tolist()
      ([0, 0, 1, 1], [1, 2, 1], [0, 1, 1, 2])
    """
    if indices.ndim != 2:
        raise ValueError(f"indices must be [m, k]; got shape {indices.shape}")
    if num_experts < 1:
        raise ValueError(f"num_experts must be >= 1; got {num_experts}")
    k = indices.shape[1]
    flat = indices.reshape(-1).astype(jnp.int32)
    order = jnp.argsort(flat, stable=True).astype(jnp.int32)
    inverse = jnp.zeros_like(order).at[order].set(jnp.arange(order.shape[0], dtype=jnp.int32))
    group_sizes = jnp.bincount(flat, length=num_experts).astype(jnp.int32)
    return Dispatch(order, order // k, inverse, group_sizes, flat[order])


def sort_by_expert(x: jax.Array, dispatch: Dispatch) -> jax.Array:
    """Rows of x [m, D] replicated per assignment and grouped by expert: [n, D]."""
    if x.ndim != 2:
        raise ValueError(f"x must be [m, D]; got shape {x.shape}")
    return jnp.take(x, dispatch.token_index, axis=0)


def unsort(y_sorted: jax.Array, dispatch: Dispatch, k: int) -> jax.Array:
    """Inverse of the expert sort: [n, ...] sorted rows -> [m, k, ...] per token and slot.

    `unsort(sort_by_expert(x, d), d, k)[:, j] == x` for every slot j.
    """
    n = dispatch.order.shape[0]
    if y_sorted.shape[0] != n or n % k:
        raise ValueError(f"y_sorted must have n={n} rows (a multiple of k={k}); got shape {y_sorted.shape}")
    return jnp.take(y_sorted, dispatch.inverse, axis=0).reshape(n // k, k, *y_sorted.shape[1:])


def combine(y_sorted: jax.Array, gates: jax.Array, dispatch: Dispatch) -> jax.Array:
    """Gate-weighted sum of each token's expert outputs: [n, D] sorted rows, gates [m, k] -> [m, D].

    Accumulates in float32, returns y_sorted's dtype.
    """
    if gates.ndim != 2:
        raise ValueError(f"gates must be [m, k]; got shape {gates.shape}")
    per_slot = unsort(y_sorted, dispatch, gates.shape[1]).astype(jnp.float32)
    return jnp.einsum("mkD,mk->mD", per_slot, gates.astype(jnp.float32)).astype(y_sorted.dtype)
