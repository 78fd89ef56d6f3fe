"""MVProbe (multi-view probing of a weight matrix) and its baselines ProbeX and weight statistics (StatNN).

Spec: /work/shared/papers/specs/vision_weights_envs.md, section 5 (transcribes the official code of MVProbe,
``AI-hew-math/MVProbe`` ``probex.py`` variant "concat_all4_bigenc_proj4", and of ProbeX, ``eliahuhorwitz/ProbeX``).
References: MVProbe, arXiv 2605.23410 (ICML 2026); Horwitz et al., "Learning on Model Weights using Tree
Experts" (ProbeX), CVPR 2025, arXiv 2410.13569; Unterthiner et al., "Predicting Neural Network Accuracy from
Weights" (StatNN), arXiv 2002.11448.

Shapes: one weight matrix per model ``X [B, d_H, d_W]`` (PyTorch ``weight``: rows = output units), r probes,
p projection width, R representation width. MVProbe's four views (`probe_responses`):

    S_xu   = X U1            [B, d_H, r]   first-order, row side (what ProbeX sees)
    S_xxtu = X (X^T U2)      [B, d_H, r]   row Gram X X^T (never materialised)
    S_xtu  = X^T U3          [B, d_W, r]   first-order, column side
    S_xtxu = X^T (X U4)      [B, d_W, r]   column Gram X^T X

each standardised per sample over (rows, probes) with the unbiased std (`standardize`, the scaling-law fix:
the Gram views are O(dim sigma^2) larger than the first-order ones), then ``f_k = vec(ReLU(S~_k^T V_k))``
(V_k: [rows_k, p], no bias), ``rep = Linear(concat f_k)`` (4 r p -> R, no nonlinearity after the concat, as
the code) and ``logits = Linear(rep)``. Views left out of ``views`` are zeroed (the code's ablations).
ProbeX: ``t = Linear(vec(ReLU((X U)^T V)))``, ``logits = Linear(t)`` (no standardisation).

Symmetries (tested): permuting the rows of X (the layer's output units, a hidden-unit permutation) leaves
S_xtxu unchanged; permuting its columns (input units) leaves S_xxtu unchanged; the other views move
equivariantly with the probes.

Inferred: parameter initialisation of U and V (normal, std 1/sqrt(rows)); the StatNN feature set (mean,
std and quantiles of the entries and of their absolute values) and its MLP head width; training in
full epochs of shuffled minibatches with Adam + L2 (torch's Adam weight_decay), best-validation
checkpoint selection every ``eval_every`` epochs.
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

__all__ = ["VIEWS", "probe_responses", "standardize", "MVProbe", "ProbeX", "StatNN", "weight_statistics",
           "probe_loss", "probe_metric", "train_probe", "evaluate"]

VIEWS = ("xu", "xxtu", "xtu", "xtxu")


def _check_x(x, d_h=None, d_w=None):
    if x.ndim != 3:
        raise ValueError(f"x: expected weight matrices [B, d_H, d_W], got shape {x.shape}")
    if (d_h is not None and x.shape[1] != d_h) or (d_w is not None and x.shape[2] != d_w):
        raise ValueError(f"x: expected [B, {d_h}, {d_w}], got {x.shape}")


def probe_responses(x: jax.Array, u1: jax.Array, u2: jax.Array, u3: jax.Array, u4: jax.Array):
    """MVProbe's four raw probe responses (spec 5(b)).

    Args:
      x: ``[B, d_H, d_W]`` weight matrices.
      u1: ``[d_W, r]``; u2: ``[d_H, r]``; u3: ``[d_H, r]``; u4: ``[d_W, r]`` probes.

    Returns:
      ``(S_xu [B, d_H, r], S_xxtu [B, d_H, r], S_xtu [B, d_W, r], S_xtxu [B, d_W, r])``.
    """
    _check_x(x)
    d_h, d_w = x.shape[1:]
    for name, u, rows in (("u1", u1, d_w), ("u2", u2, d_h), ("u3", u3, d_h), ("u4", u4, d_w)):
        if u.ndim != 2 or u.shape[0] != rows:
            raise ValueError(f"{name}: expected [{rows}, r], got {u.shape}")
    xt = jnp.swapaxes(x, 1, 2)
    return x @ u1, x @ (xt @ u2), xt @ u3, xt @ (x @ u4)


def standardize(s: jax.Array, eps: float = 1e-8) -> jax.Array:
    """Per-sample standardisation over all but the batch axis: ``(s - mean) / (unbiased std + eps)``."""
    if s.ndim < 2:
        raise ValueError(f"s: expected [B, ...] with at least 2 dims, got {s.shape}")
    axes = tuple(range(1, s.ndim))
    n = int(np.prod(s.shape[1:]))
    if n < 2:
        raise ValueError(f"s: expected at least 2 entries per sample, got shape {s.shape}")
    m = s.mean(axes, keepdims=True)
    v = ((s - m) ** 2).sum(axes, keepdims=True) / (n - 1)
    return (s - m) / (jnp.sqrt(v) + eps)


def _normal(rngs, shape, fan):
    return nnx.Param(jax.random.normal(rngs.params(), shape) / np.sqrt(fan))


class MVProbe(nnx.Module):
    """The multi-view probe (spec 5(b)); ``views`` picks the branches kept (others zeroed)."""

    def __init__(self, d_h: int, d_w: int, n_out: int, *, n_probes: int = 128, proj_dim: int = 128,
                 rep_dim: int = 512, views: Sequence[str] = VIEWS, standardize: bool = True,
                 rngs: nnx.Rngs):
        bad = [v for v in views if v not in VIEWS]
        if bad or not views:
            raise ValueError(f"views: expected a non-empty subset of {VIEWS}, got {tuple(views)}")
        for name, val in (("d_h", d_h), ("d_w", d_w), ("n_out", n_out), ("n_probes", n_probes),
                          ("proj_dim", proj_dim), ("rep_dim", rep_dim)):
            if val < 1:
                raise ValueError(f"{name}: expected >= 1, got {val}")
        self.d_h, self.d_w, self.views, self.use_std = d_h, d_w, tuple(views), standardize
        r, p = n_probes, proj_dim
        self.u1, self.u2 = _normal(rngs, (d_w, r), d_w), _normal(rngs, (d_h, r), d_h)
        self.u3, self.u4 = _normal(rngs, (d_h, r), d_h), _normal(rngs, (d_w, r), d_w)
        self.v1, self.v2 = _normal(rngs, (d_h, p), d_h), _normal(rngs, (d_h, p), d_h)
        self.v3, self.v4 = _normal(rngs, (d_w, p), d_w), _normal(rngs, (d_w, p), d_w)
        self.encoder = nnx.Linear(4 * r * p, rep_dim, rngs=rngs)
        self.head = nnx.Linear(rep_dim, n_out, rngs=rngs)

    def responses(self, x: jax.Array):
        """The four (standardised unless disabled) responses, in `VIEWS` order."""
        _check_x(x, self.d_h, self.d_w)
        s = probe_responses(x, self.u1[...], self.u2[...], self.u3[...], self.u4[...])
        return tuple(standardize(t) for t in s) if self.use_std else s

    def features(self, x: jax.Array) -> jax.Array:
        """``[B, 4 r p]``: concat of ``vec(ReLU(S~_k^T V_k))``, left-out views zeroed."""
        vs = (self.v1, self.v2, self.v3, self.v4)
        out = []
        for name, s, v in zip(VIEWS, self.responses(x), vs):
            f = jax.nn.relu(jnp.swapaxes(s, 1, 2) @ v[...]).reshape(x.shape[0], -1)
            out.append(f if name in self.views else jnp.zeros_like(f))
        return jnp.concatenate(out, -1)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.head(self.encoder(self.features(x)))


class ProbeX(nnx.Module):
    """ProbeX (spec 5, background): ``Linear(Linear(vec(ReLU((X U)^T V))))``."""

    def __init__(self, d_h: int, d_w: int, n_out: int, *, n_probes: int = 128, proj_dim: int = 128,
                 rep_dim: int = 512, rngs: nnx.Rngs):
        for name, val in (("d_h", d_h), ("d_w", d_w), ("n_out", n_out), ("n_probes", n_probes),
                          ("proj_dim", proj_dim), ("rep_dim", rep_dim)):
            if val < 1:
                raise ValueError(f"{name}: expected >= 1, got {val}")
        self.d_h, self.d_w = d_h, d_w
        self.u = _normal(rngs, (d_w, n_probes), d_w)
        self.v = _normal(rngs, (d_h, proj_dim), d_h)
        self.encoder = nnx.Linear(n_probes * proj_dim, rep_dim, rngs=rngs)
        self.head = nnx.Linear(rep_dim, n_out, rngs=rngs)

    def features(self, x: jax.Array) -> jax.Array:
        _check_x(x, self.d_h, self.d_w)
        p = jax.nn.relu(jnp.swapaxes(x @ self.u[...], 1, 2) @ self.v[...])
        return p.reshape(x.shape[0], -1)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.head(self.encoder(self.features(x)))


_QS = (0.0, 0.25, 0.5, 0.75, 1.0)


def weight_statistics(x: jax.Array) -> jax.Array:
    """StatNN-style features of each matrix: mean, std and the 0/25/50/75/100 % quantiles of the entries and
    of their absolute values -> ``[B, 14]`` (feature set inferred from Unterthiner et al.)."""
    _check_x(x)
    flat = x.reshape(x.shape[0], -1)
    feats = []
    for a in (flat, jnp.abs(flat)):
        feats += [a.mean(-1), a.std(-1)] + [jnp.quantile(a, q, axis=-1) for q in _QS]
    return jnp.stack(feats, -1)


class StatNN(nnx.Module):
    """StatNN head: weight statistics ``[B, 14]`` (from `weight_statistics`, computed once outside the training
    loop since they hold no parameter) -> standardised with the training set's mean / std -> MLP (one hidden
    layer)."""

    def __init__(self, n_out: int, *, mean: jax.Array, std: jax.Array, hidden: int = 64, rngs: nnx.Rngs):
        if mean.shape != (14,) or std.shape != (14,):
            raise ValueError(f"mean, std: expected shape (14,), got {mean.shape}, {std.shape}")
        self.mean, self.std = nnx.Variable(jnp.asarray(mean)), nnx.Variable(jnp.asarray(std) + 1e-8)
        self.l1 = nnx.Linear(14, hidden, rngs=rngs)
        self.l2 = nnx.Linear(hidden, n_out, rngs=rngs)

    def __call__(self, stats: jax.Array) -> jax.Array:
        if stats.ndim != 2 or stats.shape[1] != 14:
            raise ValueError(f"stats: expected weight statistics [B, 14], got {stats.shape}")
        z = (stats - self.mean[...]) / self.std[...]
        return self.l2(jax.nn.relu(self.l1(z)))


def probe_loss(logits: jax.Array, y: jax.Array, loss: str) -> jax.Array:
    """Mean loss: ``"bce"`` (multi-hot y [B, K], BCE with logits as the Model Jungle task) or ``"ce"`` (int y [B])."""
    if loss == "bce":
        return optax.sigmoid_binary_cross_entropy(logits, y).mean()
    if loss == "ce":
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
    raise ValueError(f"loss: expected 'bce' or 'ce', got {loss!r}")


def probe_metric(logits: jax.Array, y: jax.Array, loss: str) -> jax.Array:
    """Accuracy: mean over all (model, class) binary decisions at 0.5 for ``"bce"``; argmax accuracy for ``"ce"``."""
    if loss == "bce":
        return jnp.mean((logits > 0) == (y > 0.5))
    if loss == "ce":
        return jnp.mean(jnp.argmax(logits, -1) == y)
    raise ValueError(f"loss: expected 'bce' or 'ce', got {loss!r}")


def evaluate(model: nnx.Module, x, y, loss: str) -> float:
    """The model's `probe_metric` on (x, y)."""
    return float(probe_metric(model(jnp.asarray(x)), jnp.asarray(y), loss))


def _probe_tx(lr: float, weight_decay: float) -> optax.GradientTransformation:
    """Adam + L2 weight decay (torch's Adam ``weight_decay``), the probes' optimiser."""
    return optax.chain(optax.add_decayed_weights(weight_decay), optax.adam(lr))


_BLOCK_CACHE: dict = {}


def _train_block(graphdef, loss: str, bs: int, eval_every: int, lr: float, weight_decay: float):
    """The jitted ``eval_every``-epoch training block of `train_probe`, memoised on its static settings so
    that repeated trainings (seeds, tasks with the same shapes) reuse one compiled function. The data are
    arguments, not closed over: ``block(p, o, k, rest, x_train, y_train, x_val, y_val) -> (p, o, loss, val)``."""
    key = (graphdef, loss, bs, eval_every, lr, weight_decay)
    try:
        hit = _BLOCK_CACHE.get(key)
    except TypeError:  # an unhashable graphdef: no memoisation
        key, hit = None, None
    if hit is not None:
        return hit
    tx = _probe_tx(lr, weight_decay)

    @jax.jit
    def block(p, o, k, rest, x_train, y_train, x_val, y_val):
        n = x_train.shape[0]
        nb = n // bs

        def loss_fn(p, xb, yb):
            return probe_loss(nnx.merge(graphdef, p, rest)(xb), yb, loss)

        def epoch(carry, k):
            p, o = carry
            idx = jax.random.permutation(k, n)[: nb * bs].reshape(nb, bs)

            def step(c, i):
                p, o = c
                l, g = jax.value_and_grad(loss_fn)(p, x_train[i], y_train[i])
                u, o = tx.update(g, o, p)
                return (optax.apply_updates(p, u), o), l

            (p, o), ls = jax.lax.scan(step, (p, o), idx)
            return (p, o), ls.mean()

        (p, o), ls = jax.lax.scan(epoch, (p, o), jax.random.split(k, eval_every))
        val = probe_metric(nnx.merge(graphdef, p, rest)(x_val), y_val, loss)
        return p, o, ls[-1], val

    if key is not None:
        if len(_BLOCK_CACHE) > 64:
            _BLOCK_CACHE.clear()
        _BLOCK_CACHE[key] = block
    return block


def train_probe(model: nnx.Module, x_train, y_train, x_val, y_val, *, loss: str, key: jax.Array,
                epochs: int = 300, lr: float = 3e-4, weight_decay: float = 1e-5, batch_size: int = 128,
                eval_every: int = 25) -> tuple[nnx.Module, dict]:
    """Trains a probe with Adam (+ L2 weight decay) on shuffled minibatches; keeps the best-validation state.

    Args:
      model: an `MVProbe`, `ProbeX` or `StatNN` (any nnx module mapping x -> logits).
      x_train, x_val: ``[n, d_H, d_W]`` weight matrices (``[n, 14]`` weight statistics for `StatNN`); y_train, y_val: multi-hot ``[n, K]`` ("bce") or int ``[n]``.
      loss: "bce" or "ce".
      key: PRNG key for the shuffles.
      epochs, lr, weight_decay, batch_size, eval_every: the recipe (MVProbe's code: 3000 epochs, 3e-4, 1e-5, 128, 25).

    Returns:
      ``(model at its best validation metric, {"epoch": [...], "val": [...], "train_loss": [...]})``.
    """
    if loss not in ("bce", "ce"):
        raise ValueError(f"loss: expected 'bce' or 'ce', got {loss!r}")
    x_train, y_train = jnp.asarray(x_train, jnp.float32), jnp.asarray(y_train)
    x_val, y_val = jnp.asarray(x_val, jnp.float32), jnp.asarray(y_val)
    n = x_train.shape[0]
    if y_train.shape[0] != n or y_val.shape[0] != x_val.shape[0]:
        raise ValueError(f"y_train, y_val: expected {n} and {x_val.shape[0]} rows, got {y_train.shape[0]} "
                         f"and {y_val.shape[0]}")
    if epochs < 1 or eval_every < 1 or batch_size < 1:
        raise ValueError(f"epochs, eval_every, batch_size: expected >= 1, got {epochs}, {eval_every}, {batch_size}")
    bs = min(batch_size, n)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    opt = _probe_tx(lr, weight_decay).init(params)
    block = _train_block(graphdef, loss, bs, eval_every, float(lr), float(weight_decay))

    best_val, best = -1.0, params
    hist = {"epoch": [], "val": [], "train_loss": []}
    done = 0
    while done < epochs:
        key, k = jax.random.split(key)
        params, opt, tl, val = block(params, opt, k, rest, x_train, y_train, x_val, y_val)
        done += eval_every
        hist["epoch"].append(done)
        hist["val"].append(float(val))
        hist["train_loss"].append(float(tl))
        if float(val) > best_val:
            best_val, best = float(val), params
    return nnx.merge(graphdef, best, rest), hist
