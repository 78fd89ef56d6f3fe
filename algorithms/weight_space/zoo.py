"""A model zoo of small MLPs trained with `jax.vmap` on dataset variants of an image classification set.

A "mini Model Jungle" (spec: /work/shared/papers/specs/vision_weights_envs.md, section 5(d), and section 4(d)
for the zoo conventions): every zoo member is a `ZooMLP` (Flax NNX, ``d_in -> h -> ... -> n_classes``) trained
on its own variant of a base dataset (the experiment passes scikit-learn's bundled digits), described by

  * ``classes``: the subset of ``num_subset_classes`` of the classes it was trained on (multi-hot over the
    output units; only training images of those classes are used, labels stay in the full label space);
  * ``rotation``: the images are rotated by ``rotation * 90`` degrees (exact `np.rot90` of the square image);
  * ``noise``: index into ``noise_levels``; that fraction of the training labels is replaced by a uniform
    draw from the model's class subset;
  * ``perm``: a label permutation applied to the training labels (identity unless ``permute_labels``); the
    ``classes`` multi-hot is of the *permuted* labels (the output units that saw data);
  * ``lr`` (log-uniform in ``lr_range``) and the init / minibatch seed.

All members are trained at once: one pure training function of (init state, member data) is `jax.vmap`-ed
over a chunk of members (tqdm over chunks), so a vmapped member equals that member trained alone (tested).
With ``shared_init`` every member is fine-tuned from one "pretrained" model (trained on all classes of the
unrotated, clean data), as the Model Jungle's members are fine-tuned from one backbone (spec 5(d) option);
otherwise each member starts from its own random init. The built zoo is a `Zoo` of numpy arrays cached as
``<cache_dir>/zoo-<fingerprint>.npz``, the fingerprint hashing the config and the data.

Weight-space symmetries: permuting the hidden units of an MLP (rows of a layer's kernel.T and the matching
columns of the next) leaves its function unchanged; `permute_hidden`, `random_permutation` (augmentation)
and `canonicalize` (sort every hidden layer's units by the norm of their incoming weights) act on the
per-layer ``(kernel, bias)`` lists returned by `Zoo.layers`.

Inferred (spec 5(d) is itself [INFER]): the variant families (class subset, rotation, label noise, label
permutation), their ranges, the minibatch Adam recipe and the shared-init option's pretraining length.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
import tqdm
from etils import epath
from flax import nnx

from algorithms import training

__all__ = ["ZooConfig", "ZooMLP", "Zoo", "sample_variants", "make_member_data", "member_loss",
           "member_optimizer_config", "train_members",
           "build_zoo", "mlp_apply", "permute_hidden", "random_permutation", "canonicalize", "fingerprint"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class ZooConfig:
    """What the zoo holds and how it is trained (every field enters the cache fingerprint)."""

    num_models: int = 400
    hidden: tuple[int, ...] = (32, 32)
    num_classes: int = 10
    num_subset_classes: int = 5
    rotations: tuple[int, ...] = (0, 1, 2, 3)
    noise_levels: tuple[float, ...] = (0.0, 0.3, 0.6)
    permute_labels: bool = False
    lr_range: tuple[float, float] = (3e-3, 1e-2)
    steps: int = 150
    batch_size: int = 128
    shared_init: bool = True
    pretrain_steps: int = 300
    chunk: int = 100
    seed: int = 0

    def __post_init__(self):
        if self.num_models < 1:
            raise ValueError(f"num_models: expected >= 1, got {self.num_models}")
        if not 1 <= self.num_subset_classes <= self.num_classes:
            raise ValueError(f"num_subset_classes: expected in [1, num_classes={self.num_classes}], "
                             f"got {self.num_subset_classes}")
        if not self.rotations or any(r not in (0, 1, 2, 3) for r in self.rotations):
            raise ValueError(f"rotations: expected a non-empty subset of (0, 1, 2, 3), got {self.rotations}")
        if not self.noise_levels or any(not 0.0 <= p < 1.0 for p in self.noise_levels):
            raise ValueError(f"noise_levels: expected values in [0, 1), got {self.noise_levels}")
        if not (0 < self.lr_range[0] <= self.lr_range[1]):
            raise ValueError(f"lr_range: expected 0 < lo <= hi, got {self.lr_range}")
        if self.steps < 1 or self.batch_size < 1 or self.chunk < 1:
            raise ValueError(f"steps, batch_size, chunk: expected >= 1, got {self.steps}, {self.batch_size}, "
                             f"{self.chunk}")
        if any(h < 1 for h in self.hidden):
            raise ValueError(f"hidden: expected positive widths, got {self.hidden}")


class ZooMLP(nnx.Module):
    """The zoo's MLP: ``sizes[0] -> ... -> sizes[-1]`` with ReLU between layers (x @ kernel + bias)."""

    def __init__(self, sizes: Sequence[int], *, rngs: nnx.Rngs):
        if len(sizes) < 2:
            raise ValueError(f"sizes: expected at least (d_in, d_out), got {tuple(sizes)}")
        self.layers = nnx.List([nnx.Linear(a, b, rngs=rngs) for a, b in zip(sizes[:-1], sizes[1:])])

    def __call__(self, x: jax.Array) -> jax.Array:
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < len(self.layers) - 1:
                x = jax.nn.relu(x)
        return x


def mlp_apply(layers: Sequence[tuple], x):
    """The MLP's logits from per-layer ``(kernel [d_in, d_out], bias [d_out])`` (numpy or jax), x [..., d_in]."""
    for i, (k, b) in enumerate(layers):
        x = x @ k + b
        if i < len(layers) - 1:
            x = jnp.maximum(x, 0) if isinstance(x, jax.Array) else np.maximum(x, 0)
    return x


def _check_layers(layers):
    if not layers:
        raise ValueError("layers: expected a non-empty list of (kernel, bias), got an empty one")
    for i, (k, b) in enumerate(layers):
        if k.ndim != 2 or b.shape != (k.shape[1],):
            raise ValueError(f"layers[{i}]: expected kernel [d_in, d_out] and bias [d_out], got "
                             f"{k.shape} and {b.shape}")
        if i and layers[i - 1][0].shape[1] != k.shape[0]:
            raise ValueError(f"layers[{i}]: kernel input width {k.shape[0]} != previous output width "
                             f"{layers[i - 1][0].shape[1]}")


def permute_hidden(layers: Sequence[tuple], perms: Sequence[np.ndarray]) -> list[tuple]:
    """Permutes every hidden layer's units: unit j of hidden layer l becomes unit ``perms[l][j]``'s old one.

    Args:
      layers: ``[(kernel [d_in, d_out], bias [d_out]), ...]`` of an MLP (numpy arrays).
      perms: one permutation of ``range(d_out)`` per hidden layer (``len(layers) - 1`` of them).

    Returns:
      The permuted layers; the MLP's function (`mlp_apply`) is unchanged.
    """
    _check_layers(layers)
    if len(perms) != len(layers) - 1:
        raise ValueError(f"perms: expected {len(layers) - 1} permutations (one per hidden layer), got {len(perms)}")
    out = [list(lb) for lb in layers]
    for l, p in enumerate(perms):
        p = np.asarray(p)
        if sorted(p.tolist()) != list(range(out[l][0].shape[1])):
            raise ValueError(f"perms[{l}]: expected a permutation of range({out[l][0].shape[1]}), got {p}")
        out[l][0], out[l][1] = out[l][0][:, p], out[l][1][p]
        out[l + 1][0] = out[l + 1][0][p, :]
    return [tuple(lb) for lb in out]


def random_permutation(rng: np.random.Generator, layers: Sequence[tuple]) -> list[tuple]:
    """Permutation augmentation: the same function with uniformly random hidden-unit orders."""
    _check_layers(layers)
    return permute_hidden(layers, [rng.permutation(k.shape[1]) for k, _ in layers[:-1]])


def canonicalize(layers: Sequence[tuple]) -> list[tuple]:
    """Canonical representative of the permutation orbit: each hidden layer's units sorted by descending
    L2 norm of their incoming weights and bias (ties broken by the bias; inferred choice of key)."""
    _check_layers(layers)
    out = [tuple(lb) for lb in layers]
    perms = []
    for l in range(len(layers) - 1):
        k, b = out[l]
        key = np.sqrt((np.asarray(k) ** 2).sum(0) + np.asarray(b) ** 2)
        p = np.lexsort((-np.asarray(b), -key))
        perms.append(p)
        out = permute_hidden(out, [p if i == l else np.arange(out[i][0].shape[1]) for i in range(len(out) - 1)])
    return out


class Zoo(NamedTuple):
    """A built zoo (numpy arrays; M members).

    Attributes:
      kernels: per layer ``[M, d_in, d_out]``.
      biases: per layer ``[M, d_out]``.
      classes: ``[M, num_classes]`` multi-hot of the (permuted) labels each member was trained on.
      rotation: ``[M]`` rotation index (multiples of 90 degrees).
      noise: ``[M]`` index into the config's ``noise_levels``.
      perm: ``[M, num_classes]`` label permutation.
      lr: ``[M]`` learning rate.
      train_acc, test_acc: ``[M]`` accuracy on the member's own (clean-label) task.
    """

    kernels: list[np.ndarray]
    biases: list[np.ndarray]
    classes: np.ndarray
    rotation: np.ndarray
    noise: np.ndarray
    perm: np.ndarray
    lr: np.ndarray
    train_acc: np.ndarray
    test_acc: np.ndarray

    @property
    def num_models(self) -> int:
        return self.classes.shape[0]

    def layers(self, i: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """Member i's ``[(kernel, bias), ...]``."""
        return [(k[i], b[i]) for k, b in zip(self.kernels, self.biases)]

    def layer_matrix(self, layer: int) -> np.ndarray:
        """Layer ``layer``'s weights as ``[M, d_out, d_in]`` (PyTorch's ``weight``, the probes' X = d_H x d_W)."""
        if not 0 <= layer < len(self.kernels):
            raise ValueError(f"layer: expected in [0, {len(self.kernels)}), got {layer}")
        return np.swapaxes(self.kernels[layer], 1, 2)


def sample_variants(config: ZooConfig) -> dict[str, np.ndarray]:
    """Draws every member's dataset descriptor and hyper-parameters (numpy; deterministic in config.seed)."""
    rng = np.random.default_rng([config.seed, 1])
    m, c = config.num_models, config.num_classes
    subsets = np.stack([rng.choice(c, config.num_subset_classes, replace=False) for _ in range(m)])
    perm = np.stack([rng.permutation(c) if config.permute_labels else np.arange(c) for _ in range(m)])
    classes = np.zeros((m, c), np.float32)
    for i in range(m):
        classes[i, perm[i, subsets[i]]] = 1.0
    lo, hi = np.log(config.lr_range[0]), np.log(config.lr_range[1])
    return {"subsets": subsets, "perm": perm, "classes": classes,
            "rotation": rng.choice(np.asarray(config.rotations), m),
            "noise": rng.integers(0, len(config.noise_levels), m),
            "lr": np.exp(rng.uniform(lo, hi, m)).astype(np.float32),
            "seeds": rng.integers(0, 2**31 - 1, m)}


def _rotated(x: np.ndarray) -> np.ndarray:
    """x [n, H, W(, C)] -> [4, n, H*W*C]: the images rotated by 0, 90, 180, 270 degrees, flattened."""
    if x.ndim < 3 or x.shape[1] != x.shape[2]:
        raise ValueError(f"x: expected square images [n, H, H(, C)], got {x.shape}")
    return np.stack([np.rot90(x, k, axes=(1, 2)).reshape(x.shape[0], -1) for k in range(4)]).astype(np.float32)


def make_member_data(config: ZooConfig, variants: dict, y: np.ndarray, *, train: bool) -> tuple[np.ndarray, ...]:
    """Per-member labels and sample weights on a split: ``(labels [M, n] int32, weights [M, n] float32)``.

    Weights are 1 on images of the member's class subset, 0 elsewhere; on the training split a fraction
    ``noise_levels[noise]`` of the labels is redrawn uniformly from the subset; labels are then permuted.
    """
    rng = np.random.default_rng([config.seed, 2 if train else 3])
    m, n = config.num_models, y.shape[0]
    labels = np.zeros((m, n), np.int32)
    weights = np.zeros((m, n), np.float32)
    for i in range(m):
        sub = variants["subsets"][i]
        w = np.isin(y, sub)
        lab = y.copy()
        if train:
            p = config.noise_levels[variants["noise"][i]]
            flip = rng.random(n) < p
            lab = np.where(flip, rng.choice(sub, n), lab)
        labels[i] = variants["perm"][i][lab]
        weights[i] = w
    return labels, weights


def member_loss(model: ZooMLP, x, labels, weights):
    """A member's minibatch loss: cross-entropy weighted by ``weights`` (1 on the member's classes), normalised by
    their sum. The loss of `train_members` and of ``python -m experiments aot mvprobe``."""
    logits = model(x)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
    return jnp.sum(ce * weights) / jnp.maximum(jnp.sum(weights), 1.0)


def member_optimizer_config(lr: float, steps: int) -> training.OptimizerConfig:
    """A member's optimizer as a `training.OptimizerConfig`: Adam at its constant ``lr`` (no decay, no clipping).

    `_train_one` itself applies ``optax.adam(1.0)`` scaled by the member's (traced, per-member) ``lr``: the same
    update up to float rounding (the scale is applied after Adam's unit step instead of inside it).
    """
    return training.OptimizerConfig.constant_adam(lr, steps)


def _loss(graphdef, state, x, labels, weights):
    return member_loss(nnx.merge(graphdef, state), x, labels, weights)


def _train_one(graphdef, state, x_rot, rotation, labels, weights, lr, key, *, steps, batch_size):
    """One member's training (pure; vmapped over members): minibatch Adam for `steps` steps."""
    x = x_rot[rotation]
    tx = optax.adam(1.0)
    opt = tx.init(state)
    n = x.shape[0]

    def step(carry, k):
        st, op = carry
        idx = jax.random.randint(k, (batch_size,), 0, n)
        g = jax.grad(_loss, argnums=1)(graphdef, st, x[idx], labels[idx], weights[idx])
        upd, op = tx.update(g, op, st)
        st = jax.tree.map(lambda p, u: p + lr * u, st, upd)
        return (st, op), None

    (state, _), _ = jax.lax.scan(step, (state, opt), jax.random.split(key, steps))
    return state


def _accuracy(graphdef, state, x, labels, weights):
    pred = jnp.argmax(nnx.merge(graphdef, state)(x), -1)
    return jnp.sum((pred == labels) * weights) / jnp.maximum(jnp.sum(weights), 1.0)


def train_members(graphdef, init_states, x_rot, rotation, labels, weights, lr, keys, *, steps, batch_size):
    """Trains a batch of members at once (`jax.vmap` of the single-member trainer).

    Args:
      graphdef: the `ZooMLP` graph definition (from `nnx.split`).
      init_states: the members' initial ``nnx.State``, stacked on a leading axis B.
      x_rot: ``[4, n, d_in]`` the images under each rotation (shared by all members).
      rotation: ``[B]`` int; labels, weights: ``[B, n]``; lr: ``[B]``; keys: ``[B]`` PRNG keys.

    Returns:
      The trained states, stacked ``[B, ...]``.
    """
    fn = jax.vmap(lambda s, r, lab, w, a, k: _train_one(graphdef, s, x_rot, r, lab, w, a, k,
                                                         steps=steps, batch_size=batch_size))
    return fn(init_states, rotation, labels, weights, lr, keys)


_train_members_jit = jax.jit(train_members, static_argnums=0, static_argnames=("steps", "batch_size"))


def fingerprint(config: ZooConfig, *arrays: np.ndarray) -> str:
    """16 hex digits hashing the config and the data (the cache key)."""
    h = hashlib.sha256(json.dumps(dataclasses.asdict(config), sort_keys=True).encode())
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:16]


def _split_states(sizes, keys):
    graphdef, _ = nnx.split(ZooMLP(sizes, rngs=nnx.Rngs(0)))
    states = [nnx.split(ZooMLP(sizes, rngs=nnx.Rngs(int(k))))[1] for k in keys]
    return graphdef, jax.tree.map(lambda *xs: jnp.stack(xs), *states)


def build_zoo(config: ZooConfig, train: tuple[np.ndarray, np.ndarray], test: tuple[np.ndarray, np.ndarray], *,
              cache_dir=None, progress: bool = True) -> Zoo:
    """Builds (or loads from ``cache_dir``) the zoo of `config` on the base data.

    Args:
      config: the zoo's settings.
      train, test: ``(images [n, H, H(, C)], labels [n] int in [0, num_classes))`` of the base dataset.
      cache_dir: where ``zoo-<fingerprint>.npz`` is read / written (None: no cache).
      progress: tqdm bar over member chunks.

    Returns:
      The `Zoo`.
    """
    (xtr, ytr), (xte, yte) = train, test
    for name, y in (("train labels", ytr), ("test labels", yte)):
        if y.min() < 0 or y.max() >= config.num_classes:
            raise ValueError(f"{name}: expected values in [0, {config.num_classes}), got [{y.min()}, {y.max()}]")
    fp = fingerprint(config, xtr, ytr, xte, yte)
    path = epath.Path(cache_dir) / f"zoo-{fp}.npz" if cache_dir is not None else None
    if path is not None and path.exists():
        with path.open("rb") as f:
            d = dict(np.load(f))
        nl = int(d["num_layers"])
        return Zoo([d[f"k{i}"] for i in range(nl)], [d[f"b{i}"] for i in range(nl)],
                   *(d[k] for k in Zoo._fields[2:]))
    v = sample_variants(config)
    xr_tr, xr_te = _rotated(xtr), _rotated(xte)
    sizes = (xr_tr.shape[-1], *config.hidden, config.num_classes)
    lab_tr, w_tr = make_member_data(config, v, ytr, train=True)
    lab_te, w_te = make_member_data(config, v, yte, train=False)
    # Clean-label training accuracy (the member's task without noise).
    lab_trc = np.stack([v["perm"][i][ytr] for i in range(config.num_models)]).astype(np.int32)
    if config.shared_init:
        graphdef, base = nnx.split(ZooMLP(sizes, rngs=nnx.Rngs(config.seed)))
        base = jax.tree.map(lambda a: a[0], _train_members_jit(
            graphdef, jax.tree.map(lambda a: a[None], base), xr_tr, jnp.zeros(1, jnp.int32),
            jnp.asarray(ytr[None], jnp.int32), jnp.ones((1, ytr.shape[0]), jnp.float32),
            jnp.full(1, 3e-3, jnp.float32), jax.random.split(jax.random.key(config.seed), 1),
            steps=config.pretrain_steps, batch_size=config.batch_size))
    out_states, tr_acc, te_acc = [], [], []
    for s in tqdm.trange(0, config.num_models, config.chunk, desc="zoo", disable=not progress):
        e = min(s + config.chunk, config.num_models)
        if config.shared_init:
            init = jax.tree.map(lambda a: jnp.broadcast_to(a, (e - s, *a.shape)), base)
        else:
            graphdef, init = _split_states(sizes, v["seeds"][s:e])
        keys = jax.vmap(jax.random.key)(jnp.asarray(v["seeds"][s:e] % (2**31 - 1), jnp.uint32))
        st = _train_members_jit(graphdef, init, xr_tr, jnp.asarray(v["rotation"][s:e], jnp.int32),
                                jnp.asarray(lab_tr[s:e]), jnp.asarray(w_tr[s:e]), jnp.asarray(v["lr"][s:e]),
                                keys, steps=config.steps, batch_size=config.batch_size)
        out_states.append(jax.device_get(st))
        for rot, lab, w, dst in ((xr_tr, lab_trc, w_tr, tr_acc), (xr_te, lab_te, w_te, te_acc)):
            xs = jnp.asarray(rot)[jnp.asarray(v["rotation"][s:e])]
            dst.append(np.asarray(jax.vmap(lambda st1, x1, l1, w1: _accuracy(graphdef, st1, x1, l1, w1))(
                st, xs, jnp.asarray(lab[s:e]), jnp.asarray(w[s:e]))))
    states = jax.tree.map(lambda *xs: np.concatenate(xs), *out_states)
    nl = len(sizes) - 1
    pure = nnx.to_pure_dict(states) if hasattr(nnx, "to_pure_dict") else states.to_pure_dict()
    kernels = [np.asarray(pure["layers"][i]["kernel"]) for i in range(nl)]
    biases = [np.asarray(pure["layers"][i]["bias"]) for i in range(nl)]
    zoo = Zoo(kernels, biases, v["classes"], v["rotation"].astype(np.int32), v["noise"].astype(np.int32),
              v["perm"].astype(np.int32), v["lr"], np.concatenate(tr_acc), np.concatenate(te_acc))
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        arrays = {f"k{i}": k for i, k in enumerate(kernels)} | {f"b{i}": b for i, b in enumerate(biases)}
        arrays |= {k: getattr(zoo, k) for k in Zoo._fields[2:]}
        with path.open("wb") as f:
            np.savez(f, num_layers=nl, **arrays)
    return zoo
