"""EELMA: effective empowerment of an agent, estimated from its logged multi-turn interactions.

The *effective empowerment* of a policy pi (spec ``rl_alignment_agents.md`` section 11 (b)) is the
conditional mutual information between the agent's action and a geometrically discounted future state,

    E(pi) = E_{s_t, a_t, s_*} [ log p(s_* | s_t, a_t) - log p(s_* | s_t) ] = I(a_t ; s_* | s_t),
    s_* = s_{t + tau},  tau ~ Geom(1 - gamma) on {1, 2, ...}  (P(tau = k) = (1 - gamma) gamma^(k-1)),

with ``t`` drawn uniformly from the logged steps and ``t + tau`` truncated at the episode end (spec
(b) step 1). The estimator embeds the texts of states and actions with a fixed encoder, projects them
with a trainable MLP (theta), and trains two critics against one future encoder psi with in-batch
InfoNCE (K = batch size, negatives = the other samples' futures):

    f_sa[i, j] = phi_sa(z_s^i, z_a^i) . psi(z_*^j),      f_s[i, j] = phi_s(z_s^i) . psi(z_*^j),
    I_NCE = mean_i [ f[i, i] - log (1/K) sum_j exp f[i, j] ]   (<= log K, and <= the true MI),

maximising ``I_NCE^sa + I_NCE^s`` jointly. The read-out is the per-sample log-density ratio
``log p(s_*|s, a) / p(s_*|s)``: the spec's literal form ``f_sa[i, i] - f_s[i, i]`` keeps the critics'
additive offsets c(s, a) - c(s) (an InfoNCE critic is only defined up to them), so the estimate used
here is the spec's recommended fix (section 11 (f)): each score is normalised by its batch
log-mean-exp, ``r[i] = f[i, i] - log (1/K) sum_j exp f[i, j]``, and ``E^ = mean_i (r_sa[i] - r_s[i]) =
I_NCE^sa - I_NCE^s``. The literal dot-product difference is returned as ``raw_readout`` beside it.

Exact reference (`exact_effective_empowerment`): on a finite environment the joint law of
``(o(s_t), a_t, o(s_*))`` under the logging scheme is computed in closed form by the recursion
``G_1 = O, G_h = (1 - gamma) O + gamma P_pi G_{h-1}`` (the law of the truncated future observation
with ``h`` steps left), summed over the time-step occupancies; the policy may depend on a latent part
of the state (the agent's goal, which the observation ``o`` does not show), so the exact value is the
MI the estimator targets when the critics see only the observation text.

Inferred parts (the paper's code is not available; spec 11 marks them [INFER]):
  * the fixed text encoder: a signed feature-hashing bag of word unigrams, word bigrams and character
    trigrams (`hash_embed`), L2-normalised; the paper uses frozen Jina embeddings;
  * critic sizes (hidden 128, projection 64, output 64), Adam 1e-3, batch 256, gamma 0.9;
  * the normalised read-out (above) and the logging scheme (t uniform over pooled logged steps,
    truncation at the episode end);
  * the triples are given as indices into tables of embedded unique texts (states are deduplicated
    before embedding), which lets the projection run once per unique text.

Dimension legend: ``A`` independent critics (one per agent, trained in one vmapped program), ``N``
triples, ``K`` batch (InfoNCE negatives + 1), ``n`` observations (unique state texts), ``m`` actions,
``D`` embedding width, ``X`` latent-augmented states.

References:
  Song, Gore, Kleiman-Weiner, "Estimating the Empowerment of Language Model Agents", arXiv:2509.22504
  (ICML 2026). van den Oord, Li, Vinyals, "Representation Learning with Contrastive Predictive Coding",
  arXiv:1807.03748. Poole et al., "On Variational Bounds of Mutual Information", arXiv:1905.06922.
"""

from __future__ import annotations

import functools
import hashlib
import math
import re
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
import tqdm
from flax import nnx

from algorithms import training

__all__ = [
    "hash_embed",
    "sample_future_offsets",
    "sample_triples",
    "triples_from_logs",
    "infonce_terms",
    "infonce_bound",
    "EmpowermentCritic",
    "eelma_loss",
    "readout",
    "optimizer_config",
    "TrainedCritics",
    "train_critics",
    "EmpowermentEstimate",
    "estimate_empowerment",
    "conditional_mi",
    "exact_effective_empowerment",
    "ExactEmpowerment",
]


# ----------------------------------------------------------------------------------------------
# Fixed text encoder.
# ----------------------------------------------------------------------------------------------


def _features(text: str) -> list[str]:
    words = re.findall(r"[a-z0-9_]+|[^\sa-z0-9_]", text.lower())
    feats = [f"w:{w}" for w in words] + [f"b:{u}|{v}" for u, v in zip(words, words[1:])]
    padded = f"  {text.lower()}  "
    feats += [f"c:{padded[i:i + 3]}" for i in range(len(padded) - 2)]
    return feats


def hash_embed(texts: Sequence[str], *, dim: int = 256, seed: int = 0) -> np.ndarray:
    """Fixed (untrained) text embedding by signed feature hashing: `[len(texts), dim]` float32.

    Each text is the bag of its lower-cased word unigrams, word bigrams and character trigrams; every
    feature adds +-1 (sign and bucket from a BLAKE2 hash keyed by ``seed``) to one of ``dim`` buckets;
    rows are L2-normalised. Deterministic across processes. This stands in for the paper's frozen
    pretrained embedder (spec 11 (d): no pretrained embedder offline) [INFER].

    Args:
      texts: the strings to embed.
      dim: embedding width D (>= 8).
      seed: hash key; different seeds give independent encoders.

    Raises:
      ValueError: if ``dim < 8`` or ``texts`` is empty or holds a non-string.

    Example:
        >>> e = hash_embed(["You are at row 1, column 2.", "move north"], dim=64)
        >>> e.shape, bool(np.allclose(np.linalg.norm(e, axis=1), 1.0))
        ((2, 64), True)
    """
    if dim < 8:
        raise ValueError(f"dim must be >= 8, got {dim}")
    texts = list(texts)
    if not texts:
        raise ValueError("texts must hold at least one string, got an empty sequence")
    out = np.zeros((len(texts), dim), np.float64)
    key = seed.to_bytes(8, "little", signed=True)
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise ValueError(f"texts[{i}] must be a str, got {type(text).__name__}")
        for f in _features(text):
            h = int.from_bytes(hashlib.blake2b(f.encode(), digest_size=8, key=key).digest(), "little")
            out[i, h % dim] += 1.0 if (h >> 63) & 1 else -1.0
    norm = np.linalg.norm(out, axis=1, keepdims=True)
    return (out / np.where(norm > 0, norm, 1.0)).astype(np.float32)


# ----------------------------------------------------------------------------------------------
# Sampling (s_t, a_t, s_*) triples from logs.
# ----------------------------------------------------------------------------------------------


def _check_gamma(gamma: float) -> None:
    if not 0.0 <= gamma < 1.0:
        raise ValueError(f"gamma must lie in [0, 1), got {gamma}")


def sample_future_offsets(key: jax.Array, shape: Sequence[int], *, gamma: float) -> jax.Array:
    """Future offsets tau ~ Geom(1 - gamma) on {1, 2, ...}: ``P(tau = k) = (1 - gamma) gamma^(k-1)``.

    Mean ``1 / (1 - gamma)``; ``gamma = 0`` gives tau = 1 (the next state). Spec 11 (b) step 1.

    Returns:
      int32 array of ``shape``, every entry >= 1.

    Raises:
      ValueError: if ``gamma`` is outside [0, 1).
    """
    _check_gamma(gamma)
    if gamma == 0.0:
        return jnp.ones(tuple(shape), jnp.int32)
    u = jax.random.uniform(key, tuple(shape), minval=jnp.finfo(jnp.float32).tiny, maxval=1.0)
    # P(tau > k) = gamma^k  =>  tau = 1 + floor(log u / log gamma).
    tau = 1 + jnp.floor(jnp.log(u) / math.log(gamma))
    return jnp.clip(tau, 1, 2 ** 30).astype(jnp.int32)


def sample_triples(key: jax.Array, lengths, *, num_samples: int, gamma: float
                   ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Samples ``num_samples`` (episode, t, t_future) index triples from logged episodes.

    Episode ``e`` has ``lengths[e]`` actions (states ``0..lengths[e]``). ``(e, t)`` is uniform over all
    pooled logged steps (``t < lengths[e]``), ``t_future = min(t + tau, lengths[e])`` with tau from
    `sample_future_offsets` (truncation at the episode end, spec 11 (b) step 1).

    Args:
      key: PRNG key.
      lengths: `[E]` non-negative ints with a positive sum.
      num_samples: number of triples (>= 1).
      gamma: discount in [0, 1).

    Returns:
      ``(episode, t, t_future)``, int32 arrays of shape `[num_samples]`.

    Raises:
      ValueError: on a bad ``lengths``, ``num_samples`` or ``gamma``.
    """
    _check_gamma(gamma)
    lengths_np = np.asarray(lengths)
    if lengths_np.ndim != 1 or lengths_np.size == 0 or not np.issubdtype(lengths_np.dtype, np.integer):
        raise ValueError(f"lengths must be a non-empty 1-D integer array, got shape {lengths_np.shape} "
                         f"dtype {lengths_np.dtype}")
    if (lengths_np < 0).any() or lengths_np.sum() <= 0:
        raise ValueError(f"lengths must be >= 0 with a positive sum, got min {lengths_np.min()} sum "
                         f"{lengths_np.sum()}")
    if num_samples < 1:
        raise ValueError(f"num_samples must be >= 1, got {num_samples}")
    k_step, k_tau = jax.random.split(key)
    lengths_j = jnp.asarray(lengths_np, jnp.int32)
    ends = jnp.cumsum(lengths_j)
    flat = jax.random.randint(k_step, (num_samples,), 0, int(lengths_np.sum()))
    episode = jnp.searchsorted(ends, flat, side="right").astype(jnp.int32)
    t = (flat - (ends[episode] - lengths_j[episode])).astype(jnp.int32)
    tau = sample_future_offsets(k_tau, (num_samples,), gamma=gamma)
    t_future = jnp.minimum(t + tau, lengths_j[episode]).astype(jnp.int32)
    return episode, t, t_future


def triples_from_logs(key: jax.Array, states, actions, lengths, *, num_samples: int, gamma: float
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(state id, action id, future state id) triples from logged episodes.

    Args:
      states: `[E, T + 1]` state (text) ids; entries past an episode's end are ignored.
      actions: `[E, T]` action (text) ids.
      lengths: `[E]` episode lengths in actions (<= T).
      num_samples, gamma: as in `sample_triples`.

    Returns:
      ``(s, a, s_future)`` int arrays of shape `[num_samples]`.
    """
    states, actions, lengths = np.asarray(states), np.asarray(actions), np.asarray(lengths)
    if states.ndim != 2 or actions.ndim != 2 or states.shape != (actions.shape[0], actions.shape[1] + 1):
        raise ValueError(f"states must be [E, T + 1] and actions [E, T], got {states.shape} and {actions.shape}")
    if lengths.shape != (states.shape[0],) or (lengths > actions.shape[1]).any():
        raise ValueError(f"lengths must be [E] = [{states.shape[0]}] with entries <= T = {actions.shape[1]}, "
                         f"got shape {lengths.shape} max {lengths.max() if lengths.size else None}")
    e, t, tf = (np.asarray(x) for x in sample_triples(key, lengths, num_samples=num_samples, gamma=gamma))
    return states[e, t], actions[e, t], states[e, tf]


# ----------------------------------------------------------------------------------------------
# InfoNCE.
# ----------------------------------------------------------------------------------------------


def infonce_terms(scores: jax.Array) -> jax.Array:
    """Per-row InfoNCE terms ``f[i, i] - log (1/K) sum_j exp f[i, j]`` of a `[..., K, K]` score matrix.

    Row i pairs sample i's conditioning variable with every sample's future; the diagonal holds the
    positives. The mean over rows is the InfoNCE lower bound on the MI (van den Oord et al. 2018),
    and every term is <= log K. Returns `[..., K]`.

    Raises:
      ValueError: if ``scores`` is not square in its last two axes or has K < 2.
    """
    if scores.ndim < 2 or scores.shape[-1] != scores.shape[-2] or scores.shape[-1] < 2:
        raise ValueError(f"scores must be [..., K, K] with K >= 2, got shape {scores.shape}")
    k = scores.shape[-1]
    diag = jnp.diagonal(scores, axis1=-2, axis2=-1)
    return diag - jax.nn.logsumexp(scores, axis=-1) + math.log(k)


def infonce_bound(scores: jax.Array) -> jax.Array:
    """The InfoNCE bound (nats) of a `[..., K, K]` score matrix: the mean of `infonce_terms`."""
    return infonce_terms(scores).mean(-1)


# ----------------------------------------------------------------------------------------------
# Critics.
# ----------------------------------------------------------------------------------------------


class _MLP(nnx.Module):
    def __init__(self, d_in: int, hidden: int, d_out: int, *, rngs: nnx.Rngs):
        self.l1 = nnx.Linear(d_in, hidden, rngs=rngs)
        self.l2 = nnx.Linear(hidden, d_out, rngs=rngs)

    def __call__(self, x):
        return self.l2(jax.nn.gelu(self.l1(x)))


class EmpowermentCritic(nnx.Module):
    """The EELMA critic pair with a shared future encoder (spec 11 (b) steps 2-3).

    ``theta_s`` projects state embeddings (both s_t and s_*), ``theta_a`` action embeddings;
    ``phi_sa(z_s, z_a)``, ``phi_s(z_s)`` and ``psi(z_*)`` map them to `[.., out_dim]` vectors whose dot
    products are the critics' scores.
    """

    def __init__(self, state_dim: int, action_dim: int, *, hidden: int = 128, proj_dim: int = 64,
                 out_dim: int = 64, rngs: nnx.Rngs):
        for name, v in (("state_dim", state_dim), ("action_dim", action_dim), ("hidden", hidden),
                        ("proj_dim", proj_dim), ("out_dim", out_dim)):
            if v < 1:
                raise ValueError(f"{name} must be >= 1, got {v}")
        self.theta_s = _MLP(state_dim, hidden, proj_dim, rngs=rngs)
        self.theta_a = _MLP(action_dim, hidden, proj_dim, rngs=rngs)
        self.phi_sa = _MLP(2 * proj_dim, hidden, out_dim, rngs=rngs)
        self.phi_s = _MLP(proj_dim, hidden, out_dim, rngs=rngs)
        self.psi = _MLP(proj_dim, hidden, out_dim, rngs=rngs)

    def embed_tables(self, state_table: jax.Array, action_table: jax.Array):
        """Projected tables: ``(z_states [n, proj], z_actions [m, proj])``."""
        return self.theta_s(state_table), self.theta_a(action_table)

    def scores(self, z_s: jax.Array, z_a: jax.Array, z_f: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Score matrices ``(f_sa [K, K], f_s [K, K])`` of projected batches `[K, proj]` each."""
        g = self.psi(z_f)
        f_sa = self.phi_sa(jnp.concatenate([z_s, z_a], axis=-1)) @ g.T
        f_s = self.phi_s(z_s) @ g.T
        return f_sa, f_s

    def __call__(self, state_table, action_table, s, a, f):
        """Scores of a batch of triples given as indices `[K]` into the embedded text tables."""
        zs, za = self.embed_tables(state_table, action_table)
        return self.scores(zs[s], za[a], zs[f])


def eelma_loss(model: EmpowermentCritic, state_table, action_table, s, a, f) -> tuple[jax.Array, dict]:
    """Negative joint InfoNCE, ``-(I_NCE^sa + I_NCE^s)``, of one batch (spec 11 (b) step 3).

    Returns ``(loss, {"infonce_sa", "infonce_s"})``.
    """
    f_sa, f_s = model(state_table, action_table, s, a, f)
    i_sa, i_s = infonce_bound(f_sa), infonce_bound(f_s)
    return -(i_sa + i_s), {"infonce_sa": i_sa, "infonce_s": i_s}


def readout(model: EmpowermentCritic, state_table, action_table, s, a, f) -> dict[str, jax.Array]:
    """Per-sample empowerment read-out of a batch `[K]` of triples (nats).

    Returns ``{"empowerment": r_sa - r_s, "r_sa", "r_s", "raw": f_sa[i, i] - f_s[i, i]}``, each `[K]`,
    with ``r = infonce_terms(f) - log K`` the batch-normalised log-ratio (see the module docstring).
    The mean of ``empowerment`` equals ``I_NCE^sa - I_NCE^s``.
    """
    f_sa, f_s = model(state_table, action_table, s, a, f)
    k = f_sa.shape[-1]
    r_sa, r_s = infonce_terms(f_sa) - math.log(k), infonce_terms(f_s) - math.log(k)
    raw = jnp.diagonal(f_sa) - jnp.diagonal(f_s)
    return {"empowerment": r_sa - r_s, "r_sa": r_sa, "r_s": r_s, "raw": raw}


# ----------------------------------------------------------------------------------------------
# Training many independent critics at once.
# ----------------------------------------------------------------------------------------------


def optimizer_config(learning_rate: float, num_steps: int) -> training.OptimizerConfig:
    """`train_critics`' optimizer as a `training.OptimizerConfig`: Adam at the constant ``learning_rate``, no
    decay, no clipping (`training.make_optimizer` of it updates bit-identically to the ``optax.adam`` of
    `train_critics`, which keeps the optax state layout of its vmapped agents); the optimizer of
    ``python -m experiments aot eelma``."""
    return training.OptimizerConfig.constant_adam(learning_rate, num_steps)


class TrainedCritics(NamedTuple):
    """Output of `train_critics`.

    Attributes:
      graphdef: the critic's NNX graph definition.
      params: the parameters, every leaf with a leading `[A]` axis (one critic per agent).
      history: logged rows ``{"step", "loss", "infonce_sa", "infonce_s"}``, each value `[A]`.
    """

    graphdef: nnx.GraphDef
    params: nnx.State
    history: list[dict]


def _check_triples(state_table, action_table, s, a, f):
    state_table, action_table = jnp.asarray(state_table, jnp.float32), jnp.asarray(action_table, jnp.float32)
    if state_table.ndim != 2 or action_table.ndim != 2:
        raise ValueError(f"state_table and action_table must be [n, D] and [m, D'], got {state_table.shape} "
                         f"and {action_table.shape}")
    s, a, f = (np.asarray(x) for x in (s, a, f))
    if s.ndim == 1:
        s, a, f = s[None], a[None], f[None]
    if s.ndim != 2 or s.shape != a.shape or s.shape != f.shape:
        raise ValueError(f"s, a, f must share a shape [A, N] (or [N]), got {s.shape}, {a.shape}, {f.shape}")
    for name, x, hi in (("s", s, state_table.shape[0]), ("a", a, action_table.shape[0]),
                        ("f", f, state_table.shape[0])):
        if not np.issubdtype(x.dtype, np.integer) or x.min() < 0 or x.max() >= hi:
            raise ValueError(f"{name} must hold integer ids in [0, {hi}), got dtype {x.dtype} range "
                             f"[{x.min()}, {x.max()}]")
    return state_table, action_table, jnp.asarray(s, jnp.int32), jnp.asarray(a, jnp.int32), jnp.asarray(f, jnp.int32)


def train_critics(key: jax.Array, state_table, action_table, s, a, f, *, num_steps: int = 2000,
                  batch_size: int = 256, learning_rate: float = 1e-3, hidden: int = 128, proj_dim: int = 64,
                  out_dim: int = 64, log_every: int = 100, progress: bool = True,
                  desc: str = "eelma") -> TrainedCritics:
    """Trains ``A`` independent EELMA critic pairs (one per agent) in one vmapped, jitted program.

    Each step draws, per agent, ``batch_size`` triples uniformly (with replacement) from that agent's
    ``N`` training triples and takes an Adam step on `eelma_loss`. Spec 11 (b) [sizes INFER].

    Args:
      key: PRNG key (initialisation and batches).
      state_table: `[n, D]` embeddings of the unique state texts (shared by all agents).
      action_table: `[m, D']` embeddings of the unique action texts.
      s, a, f: `[A, N]` (or `[N]`: A = 1) ids of s_t, a_t and s_* (`triples_from_logs`).
      num_steps: Adam steps (>= 1); batch_size: K (>= 2); learning_rate: Adam step size (> 0).
      hidden, proj_dim, out_dim: critic sizes.
      log_every: steps per jitted chunk and per logged row.
      progress: show a tqdm bar.

    Returns:
      `TrainedCritics`.

    Raises:
      ValueError: on bad shapes, ids or hyper-parameters.
    """
    state_table, action_table, s, a, f = _check_triples(state_table, action_table, s, a, f)
    if num_steps < 1 or batch_size < 2 or not learning_rate > 0 or log_every < 1:
        raise ValueError(f"need num_steps >= 1, batch_size >= 2, learning_rate > 0, log_every >= 1; got "
                         f"{num_steps}, {batch_size}, {learning_rate}, {log_every}")
    num_agents, n = s.shape
    k_init, k_data = jax.random.split(key)
    make = functools.partial(EmpowermentCritic, state_table.shape[1], action_table.shape[1], hidden=hidden,
                             proj_dim=proj_dim, out_dim=out_dim)
    graphdef, _ = nnx.split(make(rngs=nnx.Rngs(0)))
    params = jax.vmap(lambda k: nnx.state(make(rngs=nnx.Rngs(params=k)), nnx.Param))(
        jax.random.split(k_init, num_agents))
    opt = optax.adam(learning_rate)
    opt_state = jax.vmap(opt.init)(params)

    def agent_step(p, o, key, s_i, a_i, f_i):
        idx = jax.random.randint(key, (batch_size,), 0, n)

        def loss(p):
            return eelma_loss(nnx.merge(graphdef, p), state_table, action_table, s_i[idx], a_i[idx], f_i[idx])

        (l, aux), g = jax.value_and_grad(loss, has_aux=True)(p)
        upd, o = opt.update(g, o, p)
        return optax.apply_updates(p, upd), o, dict(aux, loss=l)

    @functools.partial(jax.jit, static_argnums=3, donate_argnums=(0, 1))
    def chunk(p, o, key, steps):
        def body(carry, k):
            p, o = carry
            p, o, m = jax.vmap(agent_step)(p, o, jax.random.split(k, num_agents), s, a, f)
            return (p, o), m

        (p, o), m = jax.lax.scan(body, (p, o), jax.random.split(key, steps))
        return p, o, jax.tree.map(lambda x: x[-1], m)

    history, done = [], 0
    bar = tqdm.tqdm(total=num_steps, desc=desc, disable=not progress)
    while done < num_steps:
        steps = min(log_every, num_steps - done)
        params, opt_state, m = chunk(params, opt_state, jax.random.fold_in(k_data, done), steps)
        done += steps
        row = {k: np.asarray(v) for k, v in m.items()}
        history.append(dict(row, step=done))
        bar.update(steps)
        bar.set_postfix(I_sa=f"{row['infonce_sa'].mean():.3f}", I_s=f"{row['infonce_s'].mean():.3f}")
    bar.close()
    return TrainedCritics(graphdef, params, history)


class EmpowermentEstimate(NamedTuple):
    """Output of `estimate_empowerment` (nats; divide by ln 2 for bits).

    Attributes:
      empowerment: `[A]` mean read-out ``I_NCE^sa - I_NCE^s`` over the evaluation triples.
      se: `[A]` its standard error over evaluation batches (nan with a single batch).
      infonce_sa, infonce_s: `[A]` the two InfoNCE bounds on held-out batches.
      raw: `[A]` the spec's literal read-out ``mean_i f_sa[i, i] - f_s[i, i]`` (offset-contaminated).
      per_sample: `[A, M]` per-sample read-outs of the evaluated triples (the first M = batches * K).
      batch_size: K used for evaluation.
    """

    empowerment: np.ndarray
    se: np.ndarray
    infonce_sa: np.ndarray
    infonce_s: np.ndarray
    raw: np.ndarray
    per_sample: np.ndarray
    batch_size: int


def estimate_empowerment(critics: TrainedCritics, state_table, action_table, s, a, f, *,
                         batch_size: int = 256) -> EmpowermentEstimate:
    """Evaluates trained critics on (held-out) triples `[A, N]`: consecutive batches of ``batch_size``.

    The remainder ``N mod batch_size`` is dropped. Spec 11 (b) step 4 (normalised read-out).

    Raises:
      ValueError: on bad shapes or ``N < batch_size``.
    """
    state_table, action_table, s, a, f = _check_triples(state_table, action_table, s, a, f)
    num_agents, n = s.shape
    lead = jax.tree.leaves(critics.params)[0].shape[0]
    if lead != num_agents:
        raise ValueError(f"s must have one row per trained critic: expected A = {lead}, got {num_agents}")
    if batch_size < 2 or n < batch_size:
        raise ValueError(f"batch_size must be in [2, N = {n}], got {batch_size}")
    nb = n // batch_size
    shape = (num_agents, nb, batch_size)
    s, a, f = (x[:, :nb * batch_size].reshape(shape) for x in (s, a, f))

    @jax.jit
    def run(params, s, a, f):
        def one(p, s, a, f):
            model = nnx.merge(critics.graphdef, p)
            return jax.vmap(lambda s, a, f: readout(model, state_table, action_table, s, a, f))(s, a, f)

        return jax.vmap(one)(params, s, a, f)

    out = {k: np.asarray(v, np.float64) for k, v in run(critics.params, s, a, f).items()}
    emp = out["empowerment"]                      # [A, nb, K]
    batch_means = emp.mean(-1)
    se = batch_means.std(-1, ddof=1) / math.sqrt(nb) if nb > 1 else np.full(num_agents, np.nan)
    return EmpowermentEstimate(
        empowerment=emp.mean((1, 2)), se=se,
        infonce_sa=out["r_sa"].mean((1, 2)) + math.log(batch_size),
        infonce_s=out["r_s"].mean((1, 2)) + math.log(batch_size),
        raw=out["raw"].mean((1, 2)), per_sample=emp.reshape(num_agents, -1), batch_size=batch_size)


# ----------------------------------------------------------------------------------------------
# Exact effective empowerment by enumeration.
# ----------------------------------------------------------------------------------------------


def _xlogy_ratio(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Elementwise ``p log(p / q)`` with 0 log 0 = 0."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(p > 0, p * (np.log(np.where(p > 0, p, 1.0)) - np.log(np.where(q > 0, q, 1.0))), 0.0)


def conditional_mi(joint) -> tuple[float, np.ndarray, np.ndarray]:
    """``I(A; Y | S)`` (nats) of a joint probability table `[n_s, n_a, n_y]`.

    Returns ``(mi, per_s [n_s], per_sa [n_s, n_a])`` with ``per_s[s] = I(A; Y | S = s)`` and
    ``per_sa[s, a] = KL(p(y | s, a) || p(y | s))`` (0 where the condition has zero mass), so
    ``mi = sum_s p(s) per_s[s]`` and ``per_s[s] = sum_a p(a | s) per_sa[s, a]``.

    Raises:
      ValueError: if ``joint`` is not 3-D, has negative entries or does not sum to 1 (1e-6).
    """
    p = np.asarray(joint, np.float64)
    if p.ndim != 3 or (p < 0).any() or abs(p.sum() - 1.0) > 1e-6:
        raise ValueError(f"joint must be a 3-D probability table summing to 1, got shape {p.shape} "
                         f"sum {p.sum():.6g} min {p.min():.3g}")
    p_s = p.sum((1, 2))
    p_sa = p.sum(2)
    p_sy = p.sum(1)
    with np.errstate(divide="ignore", invalid="ignore"):
        cond_sa = np.where(p_sa[..., None] > 0, p / np.where(p_sa[..., None] > 0, p_sa[..., None], 1), 0.0)
        cond_s = np.where(p_s[:, None] > 0, p_sy / np.where(p_s[:, None] > 0, p_s[:, None], 1), 0.0)
    per_sa = _xlogy_ratio(cond_sa, np.broadcast_to(cond_s[:, None, :], cond_sa.shape)).sum(-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        p_a_given_s = np.where(p_s[:, None] > 0, p_sa / np.where(p_s[:, None] > 0, p_s[:, None], 1), 0.0)
    per_s = (p_a_given_s * per_sa).sum(-1)
    return float((p_s * per_s).sum()), per_s, per_sa


class ExactEmpowerment(NamedTuple):
    """Output of `exact_effective_empowerment` (nats).

    Attributes:
      empowerment: I(a_t; o(s_*) | o(s_t)) under the logging scheme.
      per_state: `[n]` I(a; s_* | o(s_t) = o) (0 for never-sampled observations).
      per_state_action: `[n, m]` KL(p(s_* | o, a) || p(s_* | o)).
      state_probs: `[n]` law of o(s_t) over the sampled steps.
      joint: `[n, m, n]` law of (o(s_t), a_t, o(s_*)).
      expected_length: expected number of logged steps per episode (finite horizon), else nan.
    """

    empowerment: float
    per_state: np.ndarray
    per_state_action: np.ndarray
    state_probs: np.ndarray
    joint: np.ndarray
    expected_length: float


def exact_effective_empowerment(transition, policy, *, gamma: float, initial, horizon: int | None,
                                observation=None, terminal=None) -> ExactEmpowerment:
    """Exact effective empowerment of a policy on a finite environment, by enumeration.

    The chain has ``X`` (possibly latent-augmented) states with `transition [X, m, X]` and
    `policy [X, m]`; the critic sees only ``observation[x]`` in ``0..n-1`` (identity by default).
    ``terminal`` states (bool `[X]`) end the episode: they are never a sampled s_t and are absorbing
    for the future (so ``s_* = s_{min(t + tau, end)}``).

    * ``horizon = T`` (finite, the logging scheme of `sample_triples`): an episode starts at
      ``x_0 ~ initial`` and logs steps ``t < min(T, end)``; a triple takes t uniform over the pooled
      logged steps, tau ~ Geom(1 - gamma), ``s_* = x_{min(t + tau, end, T)}``. With ``h = T - t`` steps
      left, the law of ``o(s_*)`` given ``x_{t+1}`` is ``G_h`` with ``G_1 = O`` and
      ``G_h = (1 - gamma) O + gamma P_pi G_{h-1}``, and ``p(o(s_*) | x_t, a) = P[x_t, a] G_{T-t}``.
    * ``horizon = None``: no truncation, s_t ~ ``initial`` (e.g. a visitation distribution) and
      ``G = (1 - gamma) (I - gamma P_pi)^{-1} O`` (the spec's closed form).

    Args:
      transition: `[X, m, X]` rows summing to 1.
      policy: `[X, m]` rows summing to 1.
      gamma: discount in [0, 1).
      initial: `[X]` distribution (of x_0, or of s_t when ``horizon`` is None).
      horizon: time limit T >= 1, or None.
      observation: `[X]` ints, the observed state of each x (default ``arange(X)``).
      terminal: `[X]` bool (default none).

    Returns:
      `ExactEmpowerment`.

    Raises:
      ValueError: naming the argument, on a shape or normalisation error.
    """
    _check_gamma(gamma)
    P = np.asarray(transition, np.float64)
    pi = np.asarray(policy, np.float64)
    if P.ndim != 3 or P.shape[0] != P.shape[2]:
        raise ValueError(f"transition must be [X, m, X], got shape {P.shape}")
    nx, m, _ = P.shape
    if (P < 0).any() or not np.allclose(P.sum(-1), 1.0, atol=1e-8):
        raise ValueError(f"transition rows must be probability vectors, got row sums in "
                         f"[{P.sum(-1).min():.6g}, {P.sum(-1).max():.6g}]")
    if pi.shape != (nx, m) or (pi < 0).any() or not np.allclose(pi.sum(-1), 1.0, atol=1e-8):
        raise ValueError(f"policy must be [X, m] = [{nx}, {m}] with rows summing to 1, got shape {pi.shape}")
    rho = np.asarray(initial, np.float64)
    if rho.shape != (nx,) or (rho < 0).any() or abs(rho.sum() - 1.0) > 1e-8:
        raise ValueError(f"initial must be a distribution of shape [{nx}], got shape {rho.shape}")
    obs = np.arange(nx) if observation is None else np.asarray(observation)
    if obs.shape != (nx,) or not np.issubdtype(obs.dtype, np.integer) or obs.min() < 0:
        raise ValueError(f"observation must be [{nx}] non-negative ints, got shape {obs.shape} dtype {obs.dtype}")
    n = int(obs.max()) + 1
    term = np.zeros(nx, bool) if terminal is None else np.asarray(terminal, bool)
    if term.shape != (nx,):
        raise ValueError(f"terminal must be [{nx}] bools, got shape {term.shape}")
    if horizon is not None and horizon < 1:
        raise ValueError(f"horizon must be >= 1 or None, got {horizon}")

    P = P.copy()
    P[term] = np.eye(nx)[term][:, None, :]                     # absorbing terminals
    P_pi = np.einsum("xa,xay->xy", pi, P)
    O = np.eye(n)[obs]                                          # [X, n]
    live = (~term).astype(np.float64)
    joint_x = np.zeros((nx, m, n))                              # sum over t of w_t(x) pi(a|x) p(o*|x,a)
    if horizon is None:
        G = (1.0 - gamma) * np.linalg.solve(np.eye(nx) - gamma * P_pi, O)
        w = rho * live
        joint_x = w[:, None, None] * pi[:, :, None] * (P.reshape(nx * m, nx) @ G).reshape(nx, m, n)
        expected_length = float("nan")
    else:
        Gs = [O]
        for _ in range(horizon - 1):
            Gs.append((1.0 - gamma) * O + gamma * P_pi @ Gs[-1])
        d = rho.copy()
        wsum = np.zeros(nx)
        for t in range(horizon):
            w = d * live
            if w.any():
                F = (P.reshape(nx * m, nx) @ Gs[horizon - t - 1]).reshape(nx, m, n)
                joint_x += w[:, None, None] * pi[:, :, None] * F
            wsum += w
            d = d @ P_pi
        expected_length = float(wsum.sum())
    total = joint_x.sum()
    if total <= 0:
        raise ValueError("initial puts no mass on a non-terminal state: no step is ever logged")
    joint = np.zeros((n, m, n))
    np.add.at(joint, obs, joint_x)
    joint /= total
    mi, per_s, per_sa = conditional_mi(joint)
    return ExactEmpowerment(mi, per_s, per_sa, joint.sum((1, 2)), joint, expected_length)
