"""The small learner of the active-learning loop and its evaluation: an NNX logistic/MLP head trained with optax,
vmapped over independent runs, plus balanced accuracy and the annotation saving at matched accuracy.

  Model:      `SmallHead` (linear logistic head, or one hidden ReLU layer; ``return_features`` gives the hidden
              layer, which the experiment uses as the frozen FM's embedding).
  Training:   `fit_heads(x, labels, weights, keys, ...)` -> stacked params of R heads trained in one vmapped,
              jitted full-batch Adam loop on a weighted (class-balanced by default) cross-entropy; unlabeled
              items carry weight 0, so every round has the same shapes and compiles once.
              `predict_probs(graphdef, params, x)` -> (R, n, K).
  Evaluation: `balanced_accuracy` (mean per-class recall), `labels_to_reach` (first budget where a curve reaches a
              target, linear interpolation on its running maximum), `annotation_saving`
              (``1 - n_method / n_baseline`` at a target accuracy).

Dimension legend: ``R`` runs (methods x seeds), ``n`` items, ``d`` input width, ``K`` classes.

Spec: /work/shared/papers/specs/vision_weights_envs.md section 6(b) ("Training between rounds": cross-entropy,
optionally class-reweighted; balanced accuracy vs labels) and 6(c) (saving ``1 - n_method / n_baseline``, [INFER]
DIRECT's convention). INFERRED: the head (the spec allows logistic regression or a 1-hidden-layer MLP), Adam with
full-batch steps, weight decay and inverse-frequency class weights.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from algorithms import training

__all__ = ["SmallHead", "sample_weights", "head_loss", "optimizer_config", "fit_heads", "predict_probs", "features", "balanced_accuracy", "labels_to_reach", "annotation_saving"]


class SmallHead(nnx.Module):
    """Logistic head (``hidden=0``) or one-hidden-layer ReLU MLP on (b, d) inputs -> (b, K) logits."""

    def __init__(self, in_dim: int, num_classes: int, *, hidden: int = 0, rngs: nnx.Rngs):
        if in_dim < 1 or num_classes < 2 or hidden < 0:
            raise ValueError(f"SmallHead needs in_dim >= 1, num_classes >= 2, hidden >= 0; got in_dim={in_dim}, "
                             f"num_classes={num_classes}, hidden={hidden}")
        self.hidden = nnx.Linear(in_dim, hidden, rngs=rngs) if hidden else None
        self.out = nnx.Linear(hidden or in_dim, num_classes, rngs=rngs)

    def __call__(self, x, *, return_features: bool = False):
        h = jax.nn.relu(self.hidden(x)) if self.hidden is not None else x
        logits = self.out(h)
        return (logits, h) if return_features else logits


def sample_weights(labels, weights, *, balanced: bool, num_classes: int):
    """The loss weights of one head's (n,) items: optionally class-balanced (each labeled item divided by its
    label's labeled count), then normalised to sum 1."""
    w = weights
    if balanced:
        counts = jnp.zeros(num_classes).at[labels].add((w > 0).astype(jnp.float32))
        w = w / jnp.maximum(counts[labels], 1.0)
    return w / jnp.maximum(w.sum(), 1e-12)


def head_loss(model: SmallHead, x, labels, weights, *, weight_decay: float):
    """One head's full-batch training loss: ``sum(weights * CE) + weight_decay * |params|^2`` (weights from
    `sample_weights`). The loss `fit_heads` minimises, and that of ``python -m experiments aot fm_active_learning``."""
    logits = model(x)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
    l2 = sum(jnp.sum(jnp.square(a)) for a in jax.tree.leaves(nnx.state(model, nnx.Param)))
    return jnp.sum(weights * ce) + weight_decay * l2


def optimizer_config(lr: float, steps: int) -> training.OptimizerConfig:
    """`fit_heads`'s optimizer as a `training.OptimizerConfig`: Adam at the constant ``lr`` (no decay, no clipping).

    `_fit` itself builds ``optax.adam(lr)`` because ``lr`` is traced there (one compiled program for every
    learning rate); `training.make_optimizer` of this config updates bit-identically (pinned by
    tests/experiments/aot_targets_other_test.py).
    """
    return training.OptimizerConfig.constant_adam(lr, steps)


@functools.partial(jax.jit, static_argnames=("graphdef", "steps", "balanced", "num_classes"))
def _fit(graphdef, params0, x, labels, weights, *, steps, lr, weight_decay, balanced, num_classes):
    opt = optax.adam(lr)

    def one(p0, x, y, w):
        w = sample_weights(y, w, balanced=balanced, num_classes=num_classes)

        def loss(p):
            return head_loss(nnx.merge(graphdef, p), x, y, w, weight_decay=weight_decay)

        def step(carry, _):
            p, s = carry
            g = jax.grad(loss)(p)
            u, s = opt.update(g, s, p)
            return (optax.apply_updates(p, u), s), None

        (p, _), _ = jax.lax.scan(step, (p0, opt.init(p0)), None, length=steps)
        return p

    return jax.vmap(one, in_axes=(0, 0 if x.ndim == 3 else None, 0, 0))(params0, x, labels, weights)


def fit_heads(x, labels, weights, keys, *, hidden: int = 0, steps: int = 200, lr: float = 0.05,
              weight_decay: float = 1e-3, balanced: bool = True, num_classes: int):
    """Trains R independent heads on shared inputs with per-run labels and weights.

    Args:
      x: (n, d) inputs shared by all runs, or (R, n, d) per-run inputs.
      labels: (R, n) int labels (any value where the weight is 0).
      weights: (R, n) non-negative sample weights (0 = unlabeled).
      keys: (R,) PRNG keys for the initialization.
      hidden: hidden width (0 = logistic regression).
      steps, lr, weight_decay: full-batch Adam steps, learning rate, L2 coefficient.
      balanced: divide each labeled item's weight by its label's labeled count (class-balanced CE).
      num_classes: K.

    Returns:
      ``(graphdef, params)`` with params stacked over R.
    """
    x = jnp.asarray(x, jnp.float32)
    labels = jnp.asarray(labels, jnp.int32)
    weights = jnp.asarray(weights, jnp.float32)
    if x.ndim not in (2, 3):
        raise ValueError(f"x must have shape (n, d) or (R, n, d), got {x.shape}")
    n = x.shape[-2]
    if labels.ndim != 2 or labels.shape != weights.shape or labels.shape[1] != n or (
            x.ndim == 3 and x.shape[0] != labels.shape[0]):
        raise ValueError(f"labels and weights must both have shape (R, {n}) (R = x.shape[0] for per-run x), got "
                         f"{labels.shape} and {weights.shape}")
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    d = x.shape[-1]
    graphdef, _ = nnx.split(SmallHead(d, num_classes, hidden=hidden, rngs=nnx.Rngs(0)))
    params0 = jax.vmap(lambda k: nnx.split(SmallHead(d, num_classes, hidden=hidden, rngs=nnx.Rngs(k)))[1])(keys)
    params = _fit(graphdef, params0, x, jnp.clip(labels, 0, num_classes - 1), weights, steps=steps, lr=lr,
                  weight_decay=weight_decay, balanced=balanced, num_classes=num_classes)
    return graphdef, params


@functools.partial(jax.jit, static_argnames=("graphdef",))
def predict_probs(graphdef, params, x):
    """Softmax probabilities of every stacked head on shared (n, d) or per-run (R, n, d) inputs -> (R, n, K)."""
    return jax.vmap(lambda p, xx: jax.nn.softmax(nnx.merge(graphdef, p)(xx), -1),
                    in_axes=(0, 0 if x.ndim == 3 else None))(params, x)


@functools.partial(jax.jit, static_argnames=("graphdef",))
def features(graphdef, params, x):
    """Logits and hidden features of every stacked head on shared (n, d) inputs -> ((R, n, K), (R, n, h))."""
    return jax.vmap(lambda p: nnx.merge(graphdef, p)(x, return_features=True))(params)


def balanced_accuracy(y_true, y_pred, num_classes: int) -> float:
    """Mean per-class recall over the classes present in ``y_true`` (macro recall)."""
    t, p = np.asarray(y_true), np.asarray(y_pred)
    if t.shape != p.shape or t.ndim != 1 or t.size == 0:
        raise ValueError(f"y_true and y_pred must be non-empty 1-D arrays of one shape, got {t.shape}, {p.shape}")
    rec = [np.mean(p[t == k] == k) for k in range(num_classes) if np.any(t == k)]
    return float(np.mean(rec))


def labels_to_reach(budgets, curve, target: float) -> float:
    """Labels a method needs to first reach ``target`` on its accuracy-vs-budget curve.

    Uses the running maximum of ``curve`` (accuracy attained so far) and interpolates linearly between the two
    budgets around the first crossing. Returns ``inf`` if the curve never reaches the target, ``budgets[0]`` if it
    starts there.
    """
    b = np.asarray(budgets, dtype=np.float64)
    c = np.maximum.accumulate(np.asarray(curve, dtype=np.float64))
    if b.ndim != 1 or b.shape != c.shape or b.size == 0 or np.any(np.diff(b) <= 0):
        raise ValueError(f"budgets must be increasing and match curve's shape, got {b.shape} and {c.shape}")
    hit = np.flatnonzero(c >= target)
    if hit.size == 0:
        return float("inf")
    i = int(hit[0])
    if i == 0:
        return float(b[0])
    frac = (target - c[i - 1]) / (c[i] - c[i - 1])
    return float(b[i - 1] + frac * (b[i] - b[i - 1]))


def annotation_saving(budgets, method_curve, baseline_curve, target: float) -> float:
    """``1 - n_method / n_baseline`` at ``target`` (`labels_to_reach` on each curve); ``-inf`` if the method never
    reaches the target, NaN if the baseline does not either; may be negative (method needs more)."""
    nm = labels_to_reach(budgets, method_curve, target)
    nb = labels_to_reach(budgets, baseline_curve, target)
    if not np.isfinite(nb):
        return float("nan")
    if not np.isfinite(nm):
        return float("-inf")
    return 1.0 - nm / nb
