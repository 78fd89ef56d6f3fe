"""TopK sparse autoencoder (SAE) in Flax NNX, and its training loop.

The TopK SAE of Gao et al. (2024), as used by RouterInterp to decompose the activations an MoE router
reads into sparse features:

    pre = (x - b_dec) @ W_enc + b_enc                 # [n, F]   (b_dec is the pre-encoder bias)
    f   = post(TopK_k(pre))                           # [n, F]   exactly k latents kept per row
    x^  = f @ W_dec + b_dec                           # [n, d]   rows of W_dec: unit-norm directions d_i

`TopK_k` keeps the k largest pre-activations of each row (ties broken towards the lower index, as
`jax.lax.top_k` does) and zeroes the rest; its support has exactly k latents. `post` is ReLU by
default (the reference code of Gao et al. applies ReLU after TopK, so a kept latent whose
pre-activation is <= 0 reads as inactive) or the identity (`postact="identity"`: exactly k non-zeros).

Training (`train_sae`): Adam on the reconstruction MSE, plus the optional AuxK loss of Gao et al.
(the residual x - x^ reconstructed by the top `aux_k` *dead* latents, weight `aux_coef`, to revive
latents that have not fired for `dead_steps` steps). After every step the decoder rows are
re-normalised to unit norm, and before it the gradient component parallel to each decoder row is
projected out (Bricken et al. 2023; Gao et al. 2024), so that the step moves directions, not norms.
The encoder is initialised as the transpose of the decoder and b_dec as the data's geometric median.

Dimension legend: ``n`` tokens (rows), ``d`` input width, ``F`` number of latents, ``k`` active latents.

Example:
  >>> import jax
  >>> from flax import nnx
  >>> sae = TopKSAE(8, 32, k=3, rngs=nnx.Rngs(0))
  >>> out = sae(jax.random.normal(jax.random.key(1), (5, 8)))
  >>> out.latents.shape, out.reconstruction.shape, [int(s) for s in out.support.sum(-1)]
  ((5, 32), (5, 8), [3, 3, 3, 3, 3])

References:
  Gao, la Tour, Tillman, Goh, Troll, Radford, Sutskever, Leike, Wu, "Scaling and evaluating sparse
  autoencoders", arXiv:2406.04093, 2024.
  Bricken et al., "Towards Monosemanticity: Decomposing Language Models With Dictionary Learning",
  Transformer Circuits Thread, 2023.
  RouterInterp / SSH (ICML 2026): "RouterInterp and the Superposed Specialisation Hypothesis" (no arXiv id).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
import tqdm
from flax import nnx

__all__ = [
    "TopKSAE",
    "SAEOutput",
    "SAETrainConfig",
    "SAEHistory",
    "topk_activation",
    "geometric_median",
    "train_sae",
    "project_out_parallel",
    "encode_numpy",
]

POSTACTS = ("relu", "identity")


class SAEOutput(NamedTuple):
    """What `TopKSAE.__call__` returns.

    Attributes:
      latents: f [n, F], the sparse code (post-activation).
      support: [n, F] bool, the TopK support (exactly k True per row).
      pre_activations: [n, F], before TopK.
      reconstruction: x^ [n, d].
    """

    latents: jax.Array
    support: jax.Array
    pre_activations: jax.Array
    reconstruction: jax.Array


def topk_activation(pre: jax.Array, k: int, *, postact: str = "relu") -> tuple[jax.Array, jax.Array]:
    """Keeps the k largest entries of each row of `pre` [..., F]; returns (values, support mask).

    Ties go to the lower index (`jax.lax.top_k`). `postact="relu"` clamps the kept values at 0.

    Examples:
      >>> import jax.numpy as jnp
      >>> v, s = topk_activation(jnp.array([[0.5, -1.0, 2.0, 0.1]]), 2)
      >>> v.tolist(), s.tolist()
      ([[0.5, 0.0, 2.0, 0.0]], [[True, False, True, False]])
    """
    num = pre.shape[-1]
    if not 1 <= k <= num:
        raise ValueError(f"k must be in [1, {num}] (the number of latents), got {k}")
    if postact not in POSTACTS:
        raise ValueError(f"postact must be one of {POSTACTS}, got {postact!r}")
    _, idx = jax.lax.top_k(pre, k)
    flat = idx.reshape(-1, k)
    rows = jnp.arange(flat.shape[0])[:, None]
    support = jnp.zeros((flat.shape[0], num), bool).at[rows, flat].set(True).reshape(pre.shape)
    vals = jnp.where(support, pre, 0.0)
    if postact == "relu":
        vals = jax.nn.relu(vals)
    return vals, support


def geometric_median(x: np.ndarray, *, iters: int = 50, eps: float = 1e-8) -> np.ndarray:
    """Weiszfeld's iterations for the geometric median of the rows of `x` [n, d] (float64)."""
    x = np.asarray(x, np.float64)
    if x.ndim != 2 or x.shape[0] == 0:
        raise ValueError(f"x must be a non-empty [n, d] array, got shape {x.shape}")
    m = x.mean(0)
    for _ in range(iters):
        w = 1.0 / np.maximum(np.linalg.norm(x - m, axis=1), eps)
        m_new = (w[:, None] * x).sum(0) / w.sum()
        if np.linalg.norm(m_new - m) < 1e-7 * (1.0 + np.linalg.norm(m)):
            return m_new
        m = m_new
    return m


def project_out_parallel(grad: jax.Array, rows: jax.Array) -> jax.Array:
    """Removes from each row of `grad` [F, d] its component along the matching unit row of `rows`."""
    unit = rows / jnp.maximum(jnp.linalg.norm(rows, axis=-1, keepdims=True), 1e-12)
    return grad - jnp.sum(grad * unit, axis=-1, keepdims=True) * unit


class TopKSAE(nnx.Module):
    """TopK sparse autoencoder: f = post(TopK(W_enc^T (x - b_dec) + b_enc)), x^ = W_dec^T f + b_dec.

    Parameters (logical axes in brackets): `w_enc` [d, F] ("embed", "sae_latents"), `b_enc` [F],
    `w_dec` [F, d] (row i is the unit-norm decoder direction d_i), `b_dec` [d] (pre-encoder bias).

    Args:
      d_in: input width d.
      num_latents: F.
      k: active latents per row.
      postact: "relu" (default) or "identity" applied to the kept values.
      rngs: NNX rngs (`params` stream).
      b_dec: optional initial pre-encoder bias [d] (e.g. the data's geometric median).
    """

    def __init__(self, d_in: int, num_latents: int, *, k: int, rngs: nnx.Rngs, postact: str = "relu",
                 b_dec: jax.Array | np.ndarray | None = None):
        if d_in < 1 or num_latents < 1:
            raise ValueError(f"d_in and num_latents must be >= 1, got {d_in}, {num_latents}")
        if not 1 <= k <= num_latents:
            raise ValueError(f"k must be in [1, num_latents={num_latents}], got {k}")
        if postact not in POSTACTS:
            raise ValueError(f"postact must be one of {POSTACTS}, got {postact!r}")
        w = jax.random.normal(rngs.params(), (num_latents, d_in), jnp.float32)
        w = w / jnp.linalg.norm(w, axis=-1, keepdims=True)
        self.w_dec = nnx.Param(w, out_sharding=("sae_latents", "embed"), eager_sharding=False)
        self.w_enc = nnx.Param(w.T, out_sharding=("embed", "sae_latents"), eager_sharding=False)
        self.b_enc = nnx.Param(jnp.zeros((num_latents,), jnp.float32), out_sharding=("sae_latents",),
                               eager_sharding=False)
        if b_dec is None:
            b_dec = jnp.zeros((d_in,), jnp.float32)
        b_dec = jnp.asarray(b_dec, jnp.float32)
        if b_dec.shape != (d_in,):
            raise ValueError(f"b_dec must have shape ({d_in},), got {b_dec.shape}")
        self.b_dec = nnx.Param(b_dec, out_sharding=("embed",), eager_sharding=False)
        self.d_in, self.num_latents, self.k, self.postact = d_in, num_latents, k, postact

    def _check(self, x: jax.Array) -> None:
        if x.ndim < 1 or x.shape[-1] != self.d_in:
            raise ValueError(f"x must have shape [..., {self.d_in}], got {x.shape}")

    def pre_activations(self, x: jax.Array) -> jax.Array:
        self._check(x)
        return (x.astype(jnp.float32) - self.b_dec[...]) @ self.w_enc[...] + self.b_enc[...]

    def encode(self, x: jax.Array) -> jax.Array:
        """The sparse code f [..., F] of x [..., d]."""
        return topk_activation(self.pre_activations(x), self.k, postact=self.postact)[0]

    def decode(self, f: jax.Array) -> jax.Array:
        """x^ [..., d] from a code f [..., F]."""
        if f.shape[-1] != self.num_latents:
            raise ValueError(f"f must have shape [..., {self.num_latents}], got {f.shape}")
        return f @ self.w_dec[...] + self.b_dec[...]

    def __call__(self, x: jax.Array) -> SAEOutput:
        pre = self.pre_activations(x)
        f, support = topk_activation(pre, self.k, postact=self.postact)
        return SAEOutput(f, support, pre, self.decode(f))

    def decoder_directions(self) -> jax.Array:
        """The decoder directions d_i as rows [F, d]."""
        return self.w_dec[...]

    def normalize_decoder(self) -> None:
        """Re-normalises the decoder rows to unit norm (in place)."""
        w = self.w_dec[...]
        self.w_dec[...] = w / jnp.maximum(jnp.linalg.norm(w, axis=-1, keepdims=True), 1e-12)


@dataclasses.dataclass(frozen=True, kw_only=True)
class SAETrainConfig:
    """TopK SAE training settings.

    Attributes:
      num_latents: F.
      k: active latents per token.
      steps: optimizer steps.
      batch_size: tokens per step (without replacement: a fresh permutation per epoch).
      learning_rate: Adam learning rate (Gao et al. scale it as 2e-4 / sqrt(F / 2^14); we use a constant).
      warmup_steps: linear warm-up, then constant; the last 20% decays linearly to 0.
      postact: "relu" or "identity".
      aux_k: latents used by the AuxK loss (0, the default, disables it; Gao et al. use d / 2).
      aux_coef: weight of the AuxK loss (Gao et al.: 1/32).
      dead_steps: a latent is dead after this many steps without firing.
      project_decoder_grad: remove the gradient component parallel to the decoder rows.
      progress: tqdm progress bar.
    """

    num_latents: int = 1024
    k: int = 8
    steps: int = 2000
    batch_size: int = 1024
    learning_rate: float = 1e-3
    warmup_steps: int = 100
    postact: str = "relu"
    aux_k: int = 0
    aux_coef: float = 1.0 / 32.0
    dead_steps: int = 200
    project_decoder_grad: bool = True
    progress: bool = True


class SAEHistory(NamedTuple):
    """Training trace: per-step reconstruction MSE, normalised MSE (MSE / Var(x)), and dead fraction."""

    mse: np.ndarray
    nmse: np.ndarray
    dead_fraction: np.ndarray


_PARAM_NAMES = ("w_enc", "b_enc", "w_dec", "b_dec")


def _forward(p: dict, x: jax.Array, k: int, postact: str):
    pre = (x - p["b_dec"]) @ p["w_enc"] + p["b_enc"]
    f, support = topk_activation(pre, k, postact=postact)
    return pre, f, support, f @ p["w_dec"] + p["b_dec"]


def _sae_loss(p: dict, x: jax.Array, dead: jax.Array, k: int, postact: str, aux_k: int, aux_coef: float):
    pre, _, support, rec = _forward(p, x, k, postact)
    err = x - rec
    mse = jnp.mean(jnp.sum(err * err, axis=-1))
    total = mse
    if aux_k > 0:
        # AuxK (Gao et al.): reconstruct the stopped residual with the top-aux_k dead latents.
        pre_dead = jnp.where(dead[None, :], pre, -jnp.inf)
        vals, idx = jax.lax.top_k(pre_dead, min(aux_k, pre.shape[-1]))
        vals = jnp.where(jnp.isfinite(vals), jax.nn.relu(vals), 0.0)
        aux_rec = jnp.einsum("nk,nkd->nd", vals, p["w_dec"][idx])
        aux = jnp.mean(jnp.sum((jax.lax.stop_gradient(err) - aux_rec) ** 2, axis=-1))
        total = total + aux_coef * jnp.where(jnp.any(dead), aux, 0.0)
    return total, (mse, support)


@functools.lru_cache(maxsize=16)
def _optimizer(lr: float, warmup: int, steps: int) -> optax.GradientTransformation:
    warm = max(1, min(warmup, steps))
    decay_start = max(warm, int(0.8 * steps))
    schedule = optax.join_schedules(
        [optax.linear_schedule(0.0, lr, warm), optax.constant_schedule(lr),
         optax.linear_schedule(lr, 0.0, max(1, steps - decay_start))],
        [warm, decay_start])
    return optax.adam(schedule)


@functools.lru_cache(maxsize=16)
def _step_fn(tx: optax.GradientTransformation, k: int, postact: str, aux_k: int, aux_coef: float,
             dead_steps: int, project: bool):
    """One jitted training step (cached, so equal settings compile once per shape)."""

    @jax.jit
    def step(params, opt_state, last_fired, x):
        dead = last_fired >= dead_steps
        (_, (mse, support)), grads = jax.value_and_grad(_sae_loss, has_aux=True)(
            params, x, dead, k, postact, aux_k, aux_coef)
        if project:
            grads = {**grads, "w_dec": project_out_parallel(grads["w_dec"], params["w_dec"])}
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        w = params["w_dec"]
        params = {**params, "w_dec": w / jnp.maximum(jnp.linalg.norm(w, axis=-1, keepdims=True), 1e-12)}
        last_fired = jnp.where(jnp.any(support, axis=0), 0, last_fired + 1)
        return params, opt_state, last_fired, mse, jnp.mean(dead)

    return step


@functools.partial(jax.jit, static_argnames=("k", "postact"))
def _encode_fn(p: dict, x: jax.Array, *, k: int, postact: str) -> jax.Array:
    return _forward(p, x, k, postact)[1]


def encode_numpy(model: TopKSAE, x: np.ndarray, *, chunk: int = 8192) -> np.ndarray:
    """Codes [n, F] of many rows x [n, d], jitted and chunked (rows padded to the chunk size)."""
    x = np.asarray(x, np.float32)
    if x.ndim != 2 or x.shape[1] != model.d_in:
        raise ValueError(f"x must have shape [n, {model.d_in}], got {x.shape}")
    p = {name: getattr(model, name)[...] for name in _PARAM_NAMES}
    n = x.shape[0]
    chunk = max(1, min(chunk, n))
    out = []
    for i in range(0, n, chunk):
        xb = x[i:i + chunk]
        m = xb.shape[0]
        if m < chunk:
            xb = np.concatenate([xb, np.zeros((chunk - m, x.shape[1]), np.float32)])
        out.append(np.asarray(_encode_fn(p, jnp.asarray(xb), k=model.k, postact=model.postact))[:m])
    return np.concatenate(out) if out else np.zeros((0, model.num_latents), np.float32)


def train_sae(key: jax.Array, data: jax.Array | np.ndarray, config: SAETrainConfig = SAETrainConfig()
              ) -> tuple[TopKSAE, SAEHistory]:
    """Trains a TopK SAE on the rows of `data` [n, d] with Adam; returns (model, history).

    Each step: sample a batch (a fresh permutation per epoch), compute MSE (+ AuxK), project the
    decoder gradient orthogonally to the decoder rows (if configured), apply Adam (linear warm-up,
    constant, linear decay over the last 20% of steps), re-normalise the decoder rows to unit norm.

    Args:
      key: PRNG key (initialisation and batch order).
      data: [n, d] float activations.
      config: `SAETrainConfig`.

    Returns:
      The trained `TopKSAE` and an `SAEHistory` with one entry per step.

    Raises:
      ValueError: if `data` is not a finite 2-D array with n >= 1 or the config is invalid.
    """
    data = np.asarray(data, np.float32)
    if data.ndim != 2 or data.shape[0] < 1:
        raise ValueError(f"data must be [n, d] with n >= 1, got shape {data.shape}")
    if not np.all(np.isfinite(data)):
        raise ValueError("data must be finite")
    if config.steps < 1 or config.batch_size < 1:
        raise ValueError(f"steps and batch_size must be >= 1, got {config.steps}, {config.batch_size}")
    n, d = data.shape
    k_init, k_data = jax.random.split(key)
    median = geometric_median(data[: min(n, 20000)])
    model = TopKSAE(d, config.num_latents, k=config.k, rngs=nnx.Rngs(params=k_init), postact=config.postact,
                    b_dec=median)
    var = float(np.mean(np.sum((data - data.mean(0)) ** 2, axis=1)))
    tx = _optimizer(float(config.learning_rate), int(config.warmup_steps), int(config.steps))
    step = _step_fn(tx, config.k, config.postact, config.aux_k, float(config.aux_coef), config.dead_steps,
                    config.project_decoder_grad)
    params = {name: getattr(model, name)[...] for name in _PARAM_NAMES}
    opt_state = tx.init(params)

    bs = min(config.batch_size, n)
    per_epoch = n // bs
    last_fired = jnp.zeros((config.num_latents,), jnp.int32)
    trace = []
    rng = np.random.default_rng(np.asarray(jax.random.key_data(k_data)).ravel().tolist())  # batch order
    pos = per_epoch * bs  # forces a permutation at the first step
    for _ in tqdm.trange(config.steps, desc="sae", disable=not config.progress, leave=False):
        if pos + bs > per_epoch * bs:
            perm, pos = rng.permutation(n), 0
        x = jnp.asarray(data[perm[pos:pos + bs]])
        pos += bs
        params, opt_state, last_fired, mse, dead = step(params, opt_state, last_fired, x)
        trace.append(jnp.stack([mse, dead]))
    for name in _PARAM_NAMES:
        getattr(model, name)[...] = params[name]
    arr = np.asarray(jax.device_get(jnp.stack(trace)), np.float64)
    mses, deads = arr[:, 0], arr[:, 1]
    return model, SAEHistory(mses, mses / max(var, 1e-12), deads)


def count_active(latents: jax.Array) -> jax.Array:
    """Number of non-zero latents per row (L0)."""
    return jnp.sum(latents != 0, axis=-1)

