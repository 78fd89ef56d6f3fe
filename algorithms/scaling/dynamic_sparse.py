"""Dynamic sparse training (SET-style) for the decoder LM: masks, prune/regrow, moment reset, a driver.

The recipe of the paper's released code (`sparselearning/core.py`, `scripts/train_llm_dst.sh`):

* every weight matrix except the embedding and the output projection carries a binary mask with
  the same density s in every layer (`sparse_init = uniform`); vectors (norm scales) stay dense.
  Here "weight matrix" is every parameter leaf with ndim >= 2 (the attention projections are stored
  as [D, h, d] tensors; each gets one mask over all its entries);
* every `update_frequency` steps, per matrix, the k = ceil(p_t nnz) smallest-magnitude active
  weights are pruned and k inactive positions are regrown at random; regrown weights start at zero
  and their Adam moments are reset (pruned weights' moments are zeroed too);
* p_t = p_0 (1 + cos(pi t / T)) / 2 decays from p_0 = 0.1 to 0 over training;
* gradients are masked before the optimizer and the mask is re-applied after every optimizer step,
  so every matrix keeps exactly round(s n) non-zeros (and Adam moments of inactive weights are 0).

Regrowth draws only from positions that were inactive *before* the update (pruned and regrown sets
are disjoint), so k is capped at the number of inactive entries n - nnz (binding only for s > 1/(1+p)).
The released code grows each inactive position with probability k / #inactive (an inexact count);
we grow exactly k so the density is exact.

Everything is a pure function of pytrees (the params dict of `nnx.to_pure_dict`, a same-structure
pytree of bool masks, the optax state), jit-friendly with traced densities and prune rates, so one
compiled step serves every density.

Dimension legend: `n` entries of one weight matrix, `nnz` its active entries, `b` batch, `t` tokens.

References:
  "When Data Is Scarce: Scaling Sparse Language Models with Repeated Training" (ICML 2026; no arXiv id
  found), code boqian333/sparse-dc-scaling. Mocanu et al., "Scalable training of artificial neural
  networks with adaptive sparse connectivity inspired by network science" (SET), arXiv:1707.04780.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable, Mapping, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from algorithms import training

__all__ = [
    "default_sparsify",
    "sparse_leaves",
    "target_nnz",
    "init_masks",
    "apply_masks",
    "mask_density",
    "count_nonzero",
    "prune_rate",
    "prune_and_regrow",
    "reset_moments",
    "DSTFunctions",
    "make_dst_functions",
    "DSTResult",
    "train_dst",
]

Path = tuple[str, ...]


def _key_str(k) -> str:
    for attr in ("key", "name", "idx"):
        if hasattr(k, attr):
            return str(getattr(k, attr))
    return str(k)


def default_sparsify(path: Path, leaf) -> bool:
    """True for the leaves DST masks: ndim >= 2 and not the embedding / output projection."""
    return getattr(leaf, "ndim", 0) >= 2 and path[0] not in ("embed", "unembed")


def sparse_leaves(params, predicate: Callable[[Path, Any], bool] = default_sparsify):
    """A bool pytree (Python bools) marking which leaves of `params` are sparsified."""
    return jax.tree_util.tree_map_with_path(lambda p, x: bool(predicate(tuple(_key_str(k) for k in p), x)), params)


def target_nnz(size: int, density: float) -> int:
    """round(density * size), at least 1: the exact non-zero count of a masked matrix."""
    if not 0.0 < density <= 1.0:
        raise ValueError(f"density must be in (0, 1]; got {density}")
    return max(1, int(round(density * size)))


def init_masks(key: jax.Array, params, density: float, *,
               predicate: Callable[[Path, Any], bool] = default_sparsify):
    """Uniform random masks with exactly `target_nnz(n, density)` ones per sparsified matrix.

    Args:
      key: PRNG key.
      params: parameter pytree.
      density: fraction of non-zero entries in (0, 1] (the same in every layer).
      predicate: `(path, leaf) -> bool`, which leaves get a mask (others: all True).

    Returns:
      A pytree of bool arrays shaped like `params`.

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> m = init_masks(jax.random.key(0), {"w": jnp.ones((4, 5)), "v": jnp.ones(3)}, 0.25,
      ...                predicate=lambda p, x: x.ndim == 2)
      >>> int(m["w"].sum()), bool(m["v"].all())
      (5, True)
    """
    if not isinstance(density, jax.core.Tracer) and not 0.0 < float(density) <= 1.0:
        raise ValueError(f"density must be in (0, 1]; got {density}")
    return _init_masks(key, params, jnp.asarray(density, jnp.float32), predicate)


def _masks_impl(key, params, density, predicate):
    flags, treedef = jax.tree.flatten(sparse_leaves(params, predicate))
    leaves = treedef.flatten_up_to(params)
    keys = jax.random.split(key, len(leaves))
    out = []
    for k, flag, x in zip(keys, flags, leaves):
        if not flag:
            out.append(jnp.ones(x.shape, bool))
            continue
        n = int(np.prod(x.shape))
        ranks = _rank(jax.random.uniform(k, (n,)))  # a uniformly random rank per entry
        nnz = jnp.maximum(1, jnp.round(density * n).astype(jnp.int32))  # == target_nnz(n, density)
        out.append((ranks < nnz).reshape(x.shape))
    return jax.tree.unflatten(treedef, out)


_init_masks = jax.jit(_masks_impl, static_argnums=(3,))


def apply_masks(tree, masks):
    """Zeroes the entries of every leaf of `tree` where its mask is False."""
    return jax.tree.map(lambda x, m: jnp.where(m, x, jnp.zeros_like(x)), tree, masks)


def count_nonzero(tree, flags=None) -> int:
    """Number of non-zero entries over the leaves (only those flagged True when `flags` is given)."""
    leaves = jax.tree.leaves(tree)
    fl = [True] * len(leaves) if flags is None else jax.tree.leaves(flags)
    return int(sum(np.count_nonzero(np.asarray(x)) for x, f in zip(leaves, fl) if f))


def mask_density(masks, flags) -> float:
    """Fraction of True entries over the sparsified leaves."""
    ms = [np.asarray(m) for m, f in zip(jax.tree.leaves(masks), jax.tree.leaves(flags)) if f]
    total = sum(m.size for m in ms)
    return float(sum(int(m.sum()) for m in ms) / total) if total else 1.0


def prune_rate(step: int, total_steps: int, initial_rate: float = 0.1) -> float:
    """Cosine-decayed prune rate p_t = p_0 (1 + cos(pi min(t, T) / T)) / 2 (p_0 at t = 0, 0 at t = T)."""
    if total_steps < 1:
        raise ValueError(f"total_steps must be >= 1; got {total_steps}")
    if not 0.0 <= initial_rate <= 1.0:
        raise ValueError(f"initial_rate must be in [0, 1]; got {initial_rate}")
    t = min(float(step), total_steps) / total_steps
    return initial_rate * 0.5 * (1.0 + math.cos(math.pi * t))


def _rank(scores: jax.Array) -> jax.Array:
    """Rank of every entry in ascending order of `scores` (ties broken by position)."""
    order = jnp.argsort(scores, stable=True)
    return jnp.zeros(scores.shape, jnp.int32).at[order].set(jnp.arange(scores.size, dtype=jnp.int32))


def _prune_regrow_leaf(key, w, m, rate):
    shape = w.shape
    w, m = w.reshape(-1), m.reshape(-1)
    n = m.size
    nnz = m.sum()
    k = jnp.minimum(jnp.ceil(rate * nnz).astype(jnp.int32), n - nnz)  # regrow only among inactive
    mag = jnp.where(m, jnp.abs(w), jnp.inf)
    pruned = m & (_rank(mag) < k)
    grow_score = jnp.where(m, jnp.inf, -jax.random.uniform(key, (n,)))  # inactive before: random order
    regrown = (~m) & (_rank(grow_score) < k)
    new_m = (m & ~pruned) | regrown
    new_w = jnp.where(new_m & ~regrown, w, 0.0).astype(w.dtype)
    return new_w.reshape(shape), new_m.reshape(shape), regrown.reshape(shape), pruned.reshape(shape)


def prune_and_regrow(key: jax.Array, params, masks, rate, *,
                     predicate: Callable[[Path, Any], bool] = default_sparsify):
    """One SET update: per matrix prune the k = ceil(rate nnz) smallest active weights, regrow k at random.

    Args:
      key: PRNG key.
      params: parameter pytree (already masked).
      masks: bool pytree like `params`.
      rate: prune rate in [0, 1] (may be traced).
      predicate: which leaves are sparse (the others are returned unchanged).

    Returns:
      (params, masks, regrown, pruned): new params (pruned and regrown entries are 0), new masks
      (same nnz per matrix), and bool pytrees of the regrown and the pruned positions.
    """
    return _prune_and_regrow(key, params, masks, jnp.asarray(rate, jnp.float32), predicate)


@functools.partial(jax.jit, static_argnums=(4,))
def _prune_and_regrow(key, params, masks, rate, predicate):
    flags, treedef = jax.tree.flatten(sparse_leaves(params, predicate))
    ws, ms = treedef.flatten_up_to(params), treedef.flatten_up_to(masks)
    keys = jax.random.split(key, len(ws))
    out_w, out_m, out_r, out_p = [], [], [], []
    for k, flag, w, m in zip(keys, flags, ws, ms):
        if flag:
            w, m, r, p = _prune_regrow_leaf(k, w, m, rate)
        else:
            r = p = jnp.zeros(m.shape, bool)
        out_w.append(w), out_m.append(m), out_r.append(r), out_p.append(p)
    un = lambda xs: jax.tree.unflatten(treedef, xs)  # noqa: E731
    return un(out_w), un(out_m), un(out_r), un(out_p)


def reset_moments(optimizer: optax.GradientTransformation, opt_state, keep):
    """Zeroes every parameter-shaped optimizer buffer (Adam mu, nu, ...) where `keep` is False.

    Pass `keep = masks & ~regrown` after `prune_and_regrow`: moments of regrown and of inactive
    weights become 0; step counters and other non-parameter state are untouched.
    """
    return optax.tree_map_params(optimizer, lambda x, k: jnp.where(k, x, jnp.zeros_like(x)), opt_state, keep,
                                 transform_non_params=lambda x: x)


class DSTFunctions(NamedTuple):
    """Jitted DST pieces for one model structure (compiled once, reused for every density).

    Attributes:
      graphdef: the model structure (`nnx.merge(graphdef, params)` rebuilds the model).
      optimizer: the optax transformation.
      init: `(seed, density) -> (TrainState, masks)`: fresh parameters (from `seed`, int32) and
        uniform masks of `density` (both traced), parameters already masked.
      train_step: `(TrainState, masks, batch) -> (TrainState, metrics)`: masked gradients, optimizer
        step, masks re-applied to the parameters.
      update: `(key, TrainState, masks, rate) -> (TrainState, masks, stats)`: prune/regrow with
        zero-initialised regrown weights and reset moments; stats count pruned/regrown entries
        ("pruned", "regrown") and hold their positions ("pruned_mask", "regrown_mask" pytrees).
      loss: `(params, batch) -> metrics` without gradients (evaluation).
    """

    graphdef: Any
    optimizer: Any
    init: Callable
    train_step: Callable
    update: Callable
    loss: Callable


def make_dst_functions(model_fn: Callable[[nnx.Rngs], nnx.Module], optimizer: optax.GradientTransformation, *,
                       loss_fn=training.next_token_loss,
                       predicate: Callable[[Path, Any], bool] = default_sparsify) -> DSTFunctions:
    """Builds the jitted DST init, train step, prune/regrow update and evaluation loss.

    Args:
      model_fn: builds the model from `nnx.Rngs` (only nnx.Param state).
      optimizer: the optax transformation (e.g. `training.make_optimizer(config)`).
      loss_fn: `(model, batch) -> (loss, metrics)`.
      predicate: which leaves are sparse.
    """
    graphdef, _ = nnx.split(nnx.eval_shape(lambda: model_fn(nnx.Rngs(0))), nnx.Param)

    def init(seed, density):
        key = jax.random.key(seed)
        model = model_fn(nnx.Rngs(jax.random.fold_in(key, 0)))
        params = nnx.to_pure_dict(nnx.split(model, nnx.Param)[1])
        masks = _masks_impl(jax.random.fold_in(key, 1), params, density, predicate)
        params = apply_masks(params, masks)
        return training.TrainState(jnp.zeros((), jnp.int32), params, optimizer.init(params)), masks

    def train_step(state: training.TrainState, masks, batch):
        def loss_of(params):
            return loss_fn(nnx.merge(graphdef, params), batch)

        (_, metrics), grads = jax.value_and_grad(loss_of, has_aux=True)(state.params)
        grads = apply_masks(grads, masks)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = apply_masks(optax.apply_updates(state.params, updates), masks)
        return training.TrainState(state.step + 1, params, opt_state), dict(metrics, grad_norm=optax.tree.norm(grads))

    def update(key, state: training.TrainState, masks, rate):
        params, new_masks, regrown, pruned = prune_and_regrow(key, state.params, masks, rate, predicate=predicate)
        keep = jax.tree.map(lambda m, r: m & ~r, new_masks, regrown)
        opt_state = reset_moments(optimizer, state.opt_state, keep)
        count = lambda t: sum(x.sum() for x in jax.tree.leaves(t))  # noqa: E731
        stats = {"pruned": count(pruned), "regrown": count(regrown), "pruned_mask": pruned, "regrown_mask": regrown}
        return training.TrainState(state.step, params, opt_state), new_masks, stats

    def evaluate(params, batch):
        return loss_fn(nnx.merge(graphdef, params), batch)[1]

    return DSTFunctions(graphdef, optimizer, jax.jit(init), jax.jit(train_step, donate_argnums=0),
                        jax.jit(update, donate_argnums=1), jax.jit(evaluate))


class DSTResult(NamedTuple):
    """Output of `train_dst`.

    Attributes:
      state: final TrainState (params exactly sparse).
      masks: final masks.
      history: logged rows {"step", "loss", ...} and the evaluations {"step", "eval": value}.
      evals: {step: eval_fn(params)} at the requested steps.
      nnz: non-zero entries of the sparsified leaves at the end.
      num_sparse: total entries of the sparsified leaves.
    """

    state: training.TrainState
    masks: Any
    history: list
    evals: dict
    nnz: int
    num_sparse: int


def train_dst(*, model_fn: Callable[[nnx.Rngs], nnx.Module] | None = None,
              optimizer_config: training.OptimizerConfig | None = None,
              batch_fn: Callable[[int], Mapping[str, np.ndarray]], num_steps: int, density: float,
              update_frequency: int = 100, initial_prune_rate: float = 0.1, seed: int = 0,
              eval_fn: Callable[[Any], float] | None = None, eval_steps: tuple[int, ...] = (),
              functions: DSTFunctions | None = None, log_every: int = 50,
              predicate: Callable[[Path, Any], bool] = default_sparsify,
              progress: bool = True, desc: str = "dst") -> DSTResult:
    """Trains a model with SET dynamic sparse training at a fixed density (density 1 = dense).

    Args:
      model_fn: builds the model from `nnx.Rngs` (only nnx.Param state); unused with `functions`.
      optimizer_config: `algorithms.training.OptimizerConfig` (the paper: weight decay 0, no
        clipping); unused with `functions` (which carry their optimizer).
      batch_fn: `position -> batch` ({"inputs", "targets", "loss_mask"} numpy arrays).
      num_steps: optimizer steps.
      density: target density in (0, 1].
      update_frequency: prune/regrow every this many steps (not at step 0; never when density = 1).
      initial_prune_rate: p_0 of the cosine-decayed prune rate (decays to 0 at num_steps).
      seed: parameter and mask seed.
      eval_fn: `params -> float`, called after the steps in `eval_steps` (0 = before training).
      eval_steps: steps after which to evaluate.
      functions: prebuilt `make_dst_functions(model_fn, optimizer)` (reuse them across runs and
        densities to compile once); None builds them.
      log_every: record train metrics every this many steps.
      predicate: which leaves are sparse.
      progress: tqdm bar.
      desc: bar label.

    Returns:
      DSTResult.
    """
    from tqdm.auto import tqdm

    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1; got {num_steps}")
    if update_frequency < 1:
        raise ValueError(f"update_frequency must be >= 1; got {update_frequency}")
    if not 0.0 < density <= 1.0:
        raise ValueError(f"density must be in (0, 1]; got {density}")
    if functions is None:
        if model_fn is None or optimizer_config is None:
            raise ValueError("train_dst needs model_fn and optimizer_config when functions is None")
        functions = make_dst_functions(model_fn, training.make_optimizer(optimizer_config), predicate=predicate)
    state, masks = functions.init(np.int32(seed), np.float32(density))
    num_updates = num_steps // update_frequency
    update_keys = jax.random.split(jax.random.fold_in(jax.random.key(seed), 2), max(num_updates, 1))
    flags = sparse_leaves(state.params, predicate)
    wanted = set(int(s) for s in eval_steps)
    evals, history = {}, []
    if 0 in wanted and eval_fn is not None:
        evals[0] = float(eval_fn(state.params))
    dynamic = density < 1.0 and initial_prune_rate > 0
    bar = tqdm(total=num_steps, desc=desc, disable=not progress, leave=False)
    try:
        for step in range(num_steps):
            state, metrics = functions.train_step(state, masks, {k: np.asarray(v) for k, v in batch_fn(step).items()})
            done = step + 1
            if dynamic and done % update_frequency == 0 and done < num_steps:
                rate = np.float32(prune_rate(done, num_steps, initial_prune_rate))
                state, masks, _ = functions.update(update_keys[done // update_frequency - 1], state, masks, rate)
            if done % log_every == 0 or done == num_steps:
                row = {k: float(v) for k, v in jax.device_get(metrics).items()}
                row["step"] = done
                history.append(row)
                bar.set_postfix(loss=f"{row['loss']:.3f}")
            if done in wanted and eval_fn is not None:
                evals[done] = float(eval_fn(state.params))
                history.append({"step": done, "eval": evals[done]})
            bar.update(1)
    finally:
        bar.close()
    num_sparse = sum(x.size for x, f in zip(jax.tree.leaves(state.params), jax.tree.leaves(flags)) if f)
    return DSTResult(state, masks, history, evals, count_nonzero(state.params, flags), int(num_sparse))
