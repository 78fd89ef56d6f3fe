"""Test-time rerouting of a mixture-of-experts LM: additive router-logit vectors fitted online.

Dimension legend: `b` sequences (each with its own bias), `B` rows of a fitting batch (several rows
may share one bias: retrieval neighbours), `T` tokens of a row, `L` layers, `E` experts, `v`
vocabulary, `N` new tokens, `m` adaptation interval, `n` selected layers `= ceil(rho * L)`.

The method ("Rewiring Experts on the Fly", arXiv:2510.14853): every MoE layer l computes router
logits `z_t^l = W_r^l h_t^l` [E]; rerouting adds one vector `delta^l` [E] per *selected* layer,
shared by all tokens of the sequence, `z'_t^l = z_t^l + delta^l`, and the model's usual gate
(softmax over the E experts, top-k, renormalised or not) runs on `z'`. All weights stay frozen.
Two phases alternate:

1. in-context routing optimisation: at prefill, and then after every `m` generated tokens,
   minimise the next-token cross-entropy of the sequence seen so far (prompt + generated text),
   `L(delta) = -1/(n-1) sum_t log p_{theta, delta}(x_{t+1} | x_{<=t}) + l2 * ||delta||^2`,
   for `steps` optimiser steps (Adam or SGD, optax) over the selected layers' vectors only,
   starting from the previous round's delta (warm start);
2. steered generation: re-prefill the KV cache of the whole context with the new delta (a cache
   filled under another delta is stale) and decode `m` tokens with delta fixed.

Layer selection: before each round, one forward pass on the current context (with the current
delta) scores every layer by its routing confidence, the mean over tokens of the top-k probability
mass (`primitives.routing.routing_confidence`; "top1", "margin" or "neg_entropy" also available),
and the `ceil(rho * L)` highest-scoring layers are adapted (ties go to the lower layer index).
Baselines in the same interface: `layers="none"` (no adaptation), `"all"`, `"random"` (a random
`ceil(rho * L)` layers per sequence and round); `oracle_bias` (fitted on the true continuation, an
upper bound) and `retrieval_bias` (C3PO-style: the nearest training examples by a sequence
embedding, the bias fitted on their next-token loss).

Gradient path: dL/d delta flows through the gate values of the chosen experts and the softmax over
all E experts; the top-k *choice* is piecewise constant, so delta changes which experts are used
only by crossing ranking boundaries over the steps. With softmax over all experts, adding `c * 1`
to delta changes nothing, so the gradient sums to zero over experts (tested).

The fitting step and the decode are `jax.jit`-compiled once per shape: the model enters as
`nnx.split` graph definition (static) and state (an argument), and the number of steps, learning
rate and L2 weight are traced, so sweeps over them do not recompile.

References:
  Su, Yang, Shen, Yin, Liu, Geiping, "Rewiring Experts on the Fly: Continuous Rerouting for Better
    Online Adaptation in Mixture-of-Expert Models", arXiv:2510.14853, 2025.
  Li, Li, Zhou, "C3PO: Critical-Layer, Core-Expert, Collaborative Pathway Optimization for
    Test-Time Expert Re-Mixing", 2025 (the retrieval baseline; simplified here, see
    `retrieval_bias`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from primitives import routing
from primitives.sampling import Sampler

__all__ = [
    "RerouteConfig",
    "FitInfo",
    "RerouteRound",
    "RerouteResult",
    "LAYER_MODES",
    "CONFIDENCE_KINDS",
    "num_selected_layers",
    "select_layers",
    "random_layers",
    "layer_confidence",
    "context_loss",
    "fit_router_bias",
    "adapt_on_context",
    "decode",
    "rerouted_generate",
    "continuation_nll",
    "oracle_bias",
    "sequence_embedding",
    "retrieval_bias",
]

LAYER_MODES = ("confidence", "all", "random", "none")
CONFIDENCE_KINDS = routing.CONFIDENCE_KINDS + ("neg_entropy",)
_OPTIMIZERS = ("adam", "sgd")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RerouteConfig:
    """Settings of test-time rerouting.

    Attributes:
      layers: which layers get a bias: "confidence" (the paper: the ceil(rho * L) most confident
        layers), "all", "random" (ceil(rho * L) random layers) or "none" (no adaptation).
      rho: fraction of layers adapted by "confidence" and "random", in (0, 1].
      steps: optimiser steps per adaptation round (>= 0).
      learning_rate: optimiser step size.
      interval: m, generated tokens between adaptation rounds; None = adapt at prefill only.
      l2: weight of the penalty l2 * ||delta||^2 (0 = none).
      confidence: layer score ("topk_mass", "top1", "margin" or "neg_entropy").
      optimizer: "adam" (moments reset every round) or "sgd".
      warm_start: start each round from the previous round's delta (else from zero).
      reselect: re-select layers every round (dynamic); else keep the prefill selection.
    """

    layers: str = "confidence"
    rho: float = 0.5
    steps: int = 5
    learning_rate: float = 5e-2
    interval: int | None = 128
    l2: float = 0.0
    confidence: str = "topk_mass"
    optimizer: str = "adam"
    warm_start: bool = True
    reselect: bool = True

    def __post_init__(self):
        if self.layers not in LAYER_MODES:
            raise ValueError(f"layers must be one of {LAYER_MODES}; got {self.layers!r}")
        if not 0.0 < self.rho <= 1.0:
            raise ValueError(f"rho must be in (0, 1]; got {self.rho}")
        if self.steps < 0:
            raise ValueError(f"steps must be >= 0; got {self.steps}")
        if self.learning_rate <= 0:
            raise ValueError(f"learning_rate must be > 0; got {self.learning_rate}")
        if self.interval is not None and self.interval < 1:
            raise ValueError(f"interval must be >= 1 or None; got {self.interval}")
        if self.l2 < 0:
            raise ValueError(f"l2 must be >= 0; got {self.l2}")
        if self.confidence not in CONFIDENCE_KINDS:
            raise ValueError(f"confidence must be one of {CONFIDENCE_KINDS}; got {self.confidence!r}")
        if self.optimizer not in _OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {_OPTIMIZERS}; got {self.optimizer!r}")


class FitInfo(NamedTuple):
    """Diagnostics of one fitting call.

    Attributes:
      loss_before: [b] per-bias mean next-token loss at the initial delta (without the L2 term).
      loss_after: [b] the same at the fitted delta.
      layer_mask: [L, b] bool, the layers that were adapted.
    """

    loss_before: np.ndarray
    loss_after: np.ndarray
    layer_mask: np.ndarray


class RerouteRound(NamedTuple):
    """One adaptation round of `rerouted_generate`.

    Attributes:
      context_lengths: [b] tokens of context the bias was fitted on.
      delta_init: [L, b, E] delta the round started from.
      delta: [L, b, E] delta after the round.
      info: the round's FitInfo (None when `layers="none"`).
    """

    context_lengths: np.ndarray
    delta_init: np.ndarray
    delta: np.ndarray
    info: FitInfo | None


class RerouteResult(NamedTuple):
    """Output of `rerouted_generate`.

    Attributes:
      tokens: [b, N] int32 generated tokens (`pad_id` after a row stopped).
      lengths: [b] generated tokens per row (a stop token counts).
      logits: [b, N, v] float32 logits each token was chosen from (0 after a row stopped).
      delta: [L, b, E] the final router biases.
      rounds: the adaptation rounds, in order (the first is the prefill round).
    """

    tokens: np.ndarray
    lengths: np.ndarray
    logits: np.ndarray
    delta: np.ndarray
    rounds: list[RerouteRound]


# ------------------------------------------------------------------------------------------------
# Layer selection.
# ------------------------------------------------------------------------------------------------

def num_selected_layers(num_layers: int, rho: float) -> int:
    """`ceil(rho * L)` (at least 1), robust to float round-off (`ceil(0.3 * 10)` is 3, not 4).

    Examples:
      >>> num_selected_layers(4, 0.5), num_selected_layers(10, 0.3), num_selected_layers(3, 0.01)
      (2, 3, 1)
    """
    if num_layers < 1:
        raise ValueError(f"num_layers must be >= 1; got {num_layers}")
    if not 0.0 < rho <= 1.0:
        raise ValueError(f"rho must be in (0, 1]; got {rho}")
    return max(1, min(num_layers, math.ceil(rho * num_layers - 1e-9)))


def select_layers(scores: jax.Array, rho: float) -> tuple[jax.Array, jax.Array]:
    """The `ceil(rho * L)` highest-scoring layers (ties: the lower layer index first).

    Args:
      scores: [..., L] per-layer scores (e.g. routing confidence).
      rho: fraction of layers to keep, in (0, 1].

    Returns:
      (indices [..., n] int32 in decreasing score order, mask [..., L] bool).

    Examples:
      >>> import jax.numpy as jnp
      >>> idx, mask = select_layers(jnp.array([0.2, 0.9, 0.5, 0.9]), 0.5)
      >>> idx.tolist(), mask.tolist()
      ([1, 3], [False, True, False, True])
    """
    scores = jnp.asarray(scores)
    if scores.ndim < 1:
        raise ValueError(f"scores must be [..., L]; got shape {scores.shape}")
    L = scores.shape[-1]
    n = num_selected_layers(L, rho)
    order = jnp.argsort(-scores.astype(jnp.float32), axis=-1, stable=True)[..., :n].astype(jnp.int32)
    mask = jnp.any(jax.nn.one_hot(order, L, dtype=jnp.bool_), axis=-2)
    return order, mask


def random_layers(key: jax.Array, batch_size: int, num_layers: int, rho: float) -> jax.Array:
    """[L, b] bool: `ceil(rho * L)` layers drawn uniformly without replacement per sequence."""
    n = num_selected_layers(num_layers, rho)
    u = jax.random.uniform(key, (batch_size, num_layers))
    _, mask = select_layers(u, n / num_layers)
    return mask.T


# ------------------------------------------------------------------------------------------------
# Jitted kernels of the method (model given as graphdef + state).
# ------------------------------------------------------------------------------------------------

def _token_ce(model, tokens, delta_rows):
    """[B, T-1] next-token cross-entropy of rows `tokens` [B, T] under biases [L, B, E]."""
    logits = model(tokens[:, :-1], router_biases=delta_rows).logits
    return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:])


def _group_loss(model, tokens, weights, bias_index, delta):
    """[b] per-bias weighted loss; weights [B, T-1] sum to 1 within each bias group."""
    ce = _token_ce(model, tokens, delta[:, bias_index])
    return jax.ops.segment_sum(jnp.sum(weights * ce, axis=-1), bias_index, num_segments=delta.shape[1])


@functools.partial(jax.jit, static_argnames=("graphdef", "optimizer"))
def _fit(graphdef, state, tokens, weights, bias_index, delta0, mask, steps, lr, l2, *, optimizer):
    model = nnx.merge(graphdef, state)
    m = mask.astype(jnp.float32)[..., None]  # [L, b, 1]

    def objective(delta):
        return jnp.sum(_group_loss(model, tokens, weights, bias_index, delta)) + l2 * jnp.sum(m * delta * delta)

    grad_fn = jax.grad(objective)
    opt = optax.scale_by_adam() if optimizer == "adam" else optax.identity()

    def body(_, carry):
        delta, opt_state = carry
        g = grad_fn(delta) * m
        u, opt_state = opt.update(g, opt_state, delta)
        return delta - lr * u * m, opt_state

    delta, _ = jax.lax.fori_loop(0, steps, body, (delta0, opt.init(delta0)))
    before = _group_loss(model, tokens, weights, bias_index, delta0)
    after = _group_loss(model, tokens, weights, bias_index, delta)
    return delta, before, after


@functools.partial(jax.jit, static_argnames=("graphdef", "kind", "k"))
def _confidence(graphdef, state, tokens, lengths, delta, *, kind, k):
    model = nnx.merge(graphdef, state)
    out = model(tokens, router_biases=delta, return_intermediates=True)
    valid = (jnp.arange(tokens.shape[1])[None, :] < lengths[:, None]).astype(jnp.float32)
    scores = []
    for aux in out.intermediates["ffn_aux"]:
        probs = aux["router_probs"]
        if kind == "neg_entropy":
            c = -routing.routing_entropy(probs)
        else:
            c = routing.routing_confidence(probs, k=k, kind=kind)
        scores.append(jnp.sum(valid * c, axis=1) / jnp.maximum(jnp.sum(valid, axis=1), 1.0))
    return jnp.stack(scores, axis=-1)  # [b, L]


@functools.partial(jax.jit, static_argnames=("graphdef", "num_tokens", "sampler"))
def _decode(graphdef, state, tokens, lengths, delta, key, *, num_tokens, sampler):
    """Prefill tokens[:, :lengths] with delta into a fresh cache, then decode num_tokens tokens."""
    model = nnx.merge(graphdef, state)
    b = tokens.shape[0]
    cache = model.init_cache(b, tokens.shape[1] + num_tokens)
    out = model(tokens, cache=cache, num_valid=lengths, router_biases=delta)
    first = out.logits[jnp.arange(b), lengths - 1]

    def step(carry, key):
        cache, logits = carry
        tok = sampler(logits, key).astype(jnp.int32)
        nxt = model(tok[:, None], cache=cache, router_biases=delta)
        return (nxt.cache, nxt.logits[:, 0]), (tok, logits)

    keys = jax.random.split(key, num_tokens)
    _, (toks, logits) = jax.lax.scan(step, (out.cache, first), keys)
    return toks.T, jnp.swapaxes(logits, 0, 1)


@functools.partial(jax.jit, static_argnames=("graphdef",))
def _cont_nll(graphdef, state, tokens, weights, delta):
    model = nnx.merge(graphdef, state)
    ce = _token_ce(model, tokens, delta)
    return jnp.sum(weights * ce, axis=-1), ce


@functools.partial(jax.jit, static_argnames=("graphdef",))
def _embed(graphdef, state, tokens, lengths):
    model = nnx.merge(graphdef, state)
    out = model(tokens, return_intermediates=True)
    h = out.intermediates["residuals"][-1].astype(jnp.float32)  # [b, T, D]
    valid = (jnp.arange(tokens.shape[1])[None, :] < lengths[:, None]).astype(jnp.float32)[..., None]
    return jnp.sum(h * valid, axis=1) / jnp.maximum(jnp.sum(valid, axis=1), 1.0)


# ------------------------------------------------------------------------------------------------
# Public functions.
# ------------------------------------------------------------------------------------------------

def _split(model):
    cfg = getattr(model, "config", None)
    if cfg is None or getattr(cfg, "ffn_type", None) != "moe":
        raise ValueError("model must be a models.Transformer with ffn_type='moe'")
    graphdef, state = nnx.split(model)
    return graphdef, state, cfg


def _check_tokens(tokens, lengths, name="tokens"):
    tokens = jnp.asarray(tokens, jnp.int32)
    if tokens.ndim != 2:
        raise ValueError(f"{name} must be [b, T]; got shape {tokens.shape}")
    lengths = jnp.asarray(lengths, jnp.int32)
    if lengths.shape != tokens.shape[:1]:
        raise ValueError(f"lengths must be [b]=({tokens.shape[0]},); got {lengths.shape}")
    ln = np.asarray(lengths)
    if ln.min() < 1 or ln.max() > tokens.shape[1]:
        raise ValueError(f"lengths must lie in [1, T={tokens.shape[1]}]; got min {ln.min()} max {ln.max()}")
    return tokens, lengths


def _zeros_delta(cfg, b):
    return jnp.zeros((cfg.num_layers, b, cfg.moe.num_experts), jnp.float32)


def _check_delta(delta, cfg, b, name="delta"):
    shape = (cfg.num_layers, b, cfg.moe.num_experts)
    if delta is None:
        return _zeros_delta(cfg, b)
    delta = jnp.asarray(delta, jnp.float32)
    if delta.shape == (cfg.num_layers, cfg.moe.num_experts):
        delta = jnp.broadcast_to(delta[:, None], shape)
    if delta.shape != shape:
        raise ValueError(f"{name} must be [L, b, E]={shape} or [L, E]; got {delta.shape}")
    return delta


def _normalize(weights, bias_index, b):
    """Rows' weights [B, T-1] scaled so each bias group sums to 1 (empty groups stay 0)."""
    w = np.asarray(weights, np.float64)
    tot = np.zeros(b)
    np.add.at(tot, np.asarray(bias_index), w.sum(-1))
    scale = np.where(tot > 0, 1.0 / np.maximum(tot, 1e-30), 0.0)
    return jnp.asarray(w * scale[np.asarray(bias_index)][:, None], jnp.float32)


def _context_weights(tokens_shape, lengths):
    """[b, T-1] 1 where the target tokens[j + 1] lies inside the context (j + 1 < length)."""
    j = np.arange(tokens_shape[1] - 1)[None, :]
    return (j + 1 < np.asarray(lengths)[:, None]).astype(np.float32)


def layer_confidence(model, tokens, lengths, *, delta=None, kind: str = "topk_mass") -> jax.Array:
    """[b, L] routing confidence of every layer, averaged over each sequence's first `lengths` tokens.

    Args:
      model: MoE `models.Transformer`.
      tokens: [b, T] right-padded tokens.
      lengths: [b] valid tokens per row.
      delta: [L, b, E] or [L, E] router biases in effect (None = zero).
      kind: "topk_mass" (top-k probability mass, k = the model's experts per token), "top1",
        "margin" or "neg_entropy".
    """
    if kind not in CONFIDENCE_KINDS:
        raise ValueError(f"kind must be one of {CONFIDENCE_KINDS}; got {kind!r}")
    graphdef, state, cfg = _split(model)
    tokens, lengths = _check_tokens(tokens, lengths)
    delta = _check_delta(delta, cfg, tokens.shape[0])
    return _confidence(graphdef, state, tokens, lengths, delta, kind=kind, k=cfg.moe.experts_per_token)


def context_loss(model, tokens, lengths, delta=None) -> jax.Array:
    """[b] mean next-token loss of each row's first `lengths` tokens under router biases `delta`."""
    graphdef, state, cfg = _split(model)
    tokens, lengths = _check_tokens(tokens, lengths)
    b = tokens.shape[0]
    delta = _check_delta(delta, cfg, b)
    w = _normalize(_context_weights(tokens.shape, lengths), np.arange(b), b)
    return _cont_nll(graphdef, state, tokens, w, delta)[0]


def _layer_mask(model, config, tokens, lengths, delta, key):
    graphdef, state, cfg = _split(model)
    L, b = cfg.num_layers, tokens.shape[0]
    if config.layers == "all":
        return jnp.ones((L, b), bool)
    if config.layers == "none":
        return jnp.zeros((L, b), bool)
    if config.layers == "random":
        if key is None:
            raise ValueError("layers='random' needs a PRNG key; pass key=")
        return random_layers(key, b, L, config.rho)
    scores = _confidence(graphdef, state, tokens, lengths, delta, kind=config.confidence, k=cfg.moe.experts_per_token)
    return select_layers(scores, config.rho)[1].T


def fit_router_bias(model, tokens, loss_weights, *, config: RerouteConfig, delta=None, layer_mask=None,
                    bias_index=None, num_biases: int | None = None) -> tuple[jax.Array, FitInfo]:
    """Fits router biases on a weighted next-token loss with all model weights frozen.

    Row r of `tokens` is scored under bias `bias_index[r]`; the loss of bias j is the weighted mean
    of its rows' token losses (weights normalised to sum to 1 per bias), plus `l2 * ||delta_j||^2`
    over the adapted layers. `config.steps` Adam/SGD steps of size `config.learning_rate` move
    only the entries of `layer_mask`.

    Args:
      model: MoE `models.Transformer` (unchanged).
      tokens: [B, T] rows.
      loss_weights: [B, T-1] weight of predicting tokens[:, j + 1] (0 = not in the loss).
      config: steps, learning rate, L2 weight and optimiser (`config.layers` is not used here).
      delta: [L, b, E] initial biases (warm start); None = zeros.
      layer_mask: [L, b] bool, the layers to adapt; None = all layers.
      bias_index: [B] int, which bias each row uses; None = row r uses bias r (B == b).
      num_biases: b when `delta` is None and `bias_index` is given (default max(bias_index) + 1).

    Returns:
      (delta [L, b, E], FitInfo).
    """
    graphdef, state, cfg = _split(model)
    tokens = jnp.asarray(tokens, jnp.int32)
    if tokens.ndim != 2:
        raise ValueError(f"tokens must be [B, T]; got shape {tokens.shape}")
    B, T = tokens.shape
    weights = np.asarray(loss_weights, np.float32)
    if weights.shape != (B, T - 1):
        raise ValueError(f"loss_weights must be [B, T-1]=({B}, {T - 1}); got {weights.shape}")
    bias_index = np.arange(B) if bias_index is None else np.asarray(bias_index, np.int32)
    if bias_index.shape != (B,):
        raise ValueError(f"bias_index must be [B]=({B},); got {bias_index.shape}")
    if delta is not None:
        b = np.shape(delta)[1] if np.ndim(delta) == 3 else (num_biases or int(bias_index.max()) + 1)
    else:
        b = num_biases or int(bias_index.max()) + 1
    if bias_index.min() < 0 or bias_index.max() >= b:
        raise ValueError(f"bias_index must lie in [0, b={b}); got [{bias_index.min()}, {bias_index.max()}]")
    delta = _check_delta(delta, cfg, b)
    mask = jnp.ones((cfg.num_layers, b), bool) if layer_mask is None else jnp.asarray(layer_mask, bool)
    if mask.shape != (cfg.num_layers, b):
        raise ValueError(f"layer_mask must be [L, b]=({cfg.num_layers}, {b}); got {mask.shape}")
    w = _normalize(weights, bias_index, b)
    new, before, after = _fit(graphdef, state, tokens, w, jnp.asarray(bias_index, jnp.int32), delta, mask,
                              jnp.int32(config.steps), jnp.float32(config.learning_rate), jnp.float32(config.l2),
                              optimizer=config.optimizer)
    return new, FitInfo(np.asarray(before), np.asarray(after), np.asarray(mask))


def adapt_on_context(model, tokens, lengths, *, config: RerouteConfig, delta=None, key=None,
                     layer_mask=None) -> tuple[jax.Array, FitInfo]:
    """One in-context routing-optimisation round: select layers, fit delta on the context's own loss.

    Args:
      model: MoE `models.Transformer`.
      tokens: [b, T] right-padded context (prompt + generated so far).
      lengths: [b] context lengths.
      config: the RerouteConfig (`layers`, `rho`, `confidence`, steps, ...).
      delta: [L, b, E] initial delta (warm start; it is also the bias the selection pass runs with).
      key: PRNG key (needed by `layers="random"`).
      layer_mask: [L, b] a fixed selection (skips the selection pass).

    Returns:
      (delta [L, b, E], FitInfo).
    """
    _, _, cfg = _split(model)
    tokens, lengths = _check_tokens(tokens, lengths)
    delta = _check_delta(delta, cfg, tokens.shape[0])
    if layer_mask is None:
        layer_mask = _layer_mask(model, config, tokens, lengths, delta, key)
    if config.layers == "none":
        return delta, FitInfo(np.asarray(context_loss(model, tokens, lengths, delta)),
                              np.asarray(context_loss(model, tokens, lengths, delta)), np.asarray(layer_mask))
    return fit_router_bias(model, tokens, _context_weights(tokens.shape, lengths), config=config, delta=delta,
                           layer_mask=layer_mask)


def decode(model, tokens, lengths, *, num_tokens: int, delta=None, sampler: Sampler = Sampler(),
           key=None) -> tuple[jax.Array, jax.Array]:
    """Re-prefills the context with `delta` into a fresh KV cache and decodes `num_tokens` tokens.

    Args:
      model: MoE `models.Transformer`.
      tokens: [b, T] right-padded context; lengths: [b].
      num_tokens: N >= 1 tokens to decode (no early stop).
      delta: [L, b, E] or [L, E] router biases (None = zero), used for the prefill and every step.
      sampler: a hashable `(logits, key) -> tokens` (default greedy).
      key: PRNG key (required unless greedy).

    Returns:
      (tokens [b, N] int32, logits [b, N, v] float32 the tokens were drawn from).
    """
    graphdef, state, cfg = _split(model)
    tokens, lengths = _check_tokens(tokens, lengths)
    if num_tokens < 1:
        raise ValueError(f"num_tokens must be >= 1; got {num_tokens}")
    if key is None:
        if not (isinstance(sampler, Sampler) and sampler.is_greedy):
            raise ValueError("a PRNG key is required for a non-greedy sampler; pass key=")
        key = jax.random.key(0)
    delta = _check_delta(delta, cfg, tokens.shape[0])
    return _decode(graphdef, state, tokens, lengths, delta, key, num_tokens=num_tokens, sampler=sampler)


def rerouted_generate(model, prompts, prompt_lengths=None, *, max_new_tokens: int, config: RerouteConfig,
                      key=None, sampler: Sampler = Sampler(), stop_tokens: tuple[int, ...] = (),
                      pad_id: int = 0, delta=None) -> RerouteResult:
    """Generation with continuous rerouting: adapt at prefill and after every `config.interval` tokens.

    Each round fits delta on the next-token loss of the whole context so far (prompt + generated),
    over the layers chosen by `config.layers`, starting from the previous delta when
    `config.warm_start`; then the KV cache is recomputed for the whole context under the new delta
    and `interval` tokens are decoded with delta fixed. `config.layers="none"` is plain generation.

    Args:
      model: MoE `models.Transformer` (its weights are never changed).
      prompts: [b, P] right-padded prompts.
      prompt_lengths: [b] (default P).
      max_new_tokens: N >= 1.
      config: RerouteConfig.
      key: PRNG key (random layers, sampling); default key(0).
      sampler: token sampler (default greedy).
      stop_tokens: ids that end a row (emitted, then `pad_id`).
      pad_id: written after a row stopped.
      delta: [L, b, E] initial delta (None = zero).

    Returns:
      RerouteResult.
    """
    _, _, cfg = _split(model)
    prompts = np.asarray(prompts, np.int32)
    if prompts.ndim != 2:
        raise ValueError(f"prompts must be [b, P]; got shape {prompts.shape}")
    b, P = prompts.shape
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1; got {max_new_tokens}")
    lengths = np.full((b,), P, np.int32) if prompt_lengths is None else np.asarray(prompt_lengths, np.int32).copy()
    _check_tokens(prompts, lengths, "prompts")
    key = jax.random.key(0) if key is None else key
    N, m = max_new_tokens, config.interval or max_new_tokens
    buf = np.full((b, P + N), pad_id, np.int32)
    buf[:, :P] = prompts
    out_tok = np.full((b, N), pad_id, np.int32)
    out_logits = np.zeros((b, N, cfg.vocab_size), np.float32)
    gen_len = np.zeros((b,), np.int32)
    stopped = np.zeros((b,), bool)
    delta = _check_delta(delta, cfg, b)
    stop = np.asarray(stop_tokens, np.int32)
    rounds, layer_mask, produced = [], None, 0
    while produced < N and not stopped.all():
        key, k_sel, k_dec = jax.random.split(key, 3)
        if config.layers != "none":
            init = delta if config.warm_start else jnp.zeros_like(delta)
            if layer_mask is None or config.reselect:
                layer_mask = _layer_mask(model, config, jnp.asarray(buf), jnp.asarray(lengths), init, k_sel)
            delta, info = adapt_on_context(model, buf, lengths, config=config, delta=init, layer_mask=layer_mask)
            rounds.append(RerouteRound(lengths.copy(), np.asarray(init), np.asarray(delta), info))
        chunk = min(m, N - produced)
        toks, logits = decode(model, buf, lengths, num_tokens=chunk, delta=delta, sampler=sampler, key=k_dec)
        toks, logits = np.asarray(toks), np.asarray(logits)
        for i in np.flatnonzero(~stopped):
            n_i = chunk
            if stop.size:
                hits = np.flatnonzero(np.isin(toks[i], stop))
                if hits.size:
                    n_i = int(hits[0]) + 1
                    stopped[i] = True
            out_tok[i, produced:produced + n_i] = toks[i, :n_i]
            out_logits[i, produced:produced + n_i] = logits[i, :n_i]
            buf[i, lengths[i]:lengths[i] + n_i] = toks[i, :n_i]
            lengths[i] += n_i
            gen_len[i] += n_i
        produced += chunk
    return RerouteResult(out_tok, gen_len, out_logits, np.asarray(delta), rounds)


def continuation_nll(model, tokens, prompt_lengths, cont_lengths, delta=None) -> np.ndarray:
    """[b] mean NLL of each row's continuation tokens[prompt_len : prompt_len + cont_len] (teacher forced)."""
    graphdef, state, cfg = _split(model)
    w = _continuation_weights(tokens, prompt_lengths, cont_lengths)
    b = np.shape(tokens)[0]
    delta = _check_delta(delta, cfg, b)
    return np.asarray(_cont_nll(graphdef, state, jnp.asarray(tokens, jnp.int32), _normalize(w, np.arange(b), b),
                                delta)[0])


def _continuation_weights(tokens, prompt_lengths, cont_lengths):
    T = np.shape(tokens)[1]
    p, c = np.asarray(prompt_lengths)[:, None], np.asarray(cont_lengths)[:, None]
    if (p < 1).any() or (p + c > T).any() or (c < 1).any():
        raise ValueError(f"need 1 <= prompt_lengths, cont_lengths >= 1 and prompt + cont <= T={T}")
    tgt = np.arange(1, T)[None, :]  # target index of column j
    return ((tgt >= p) & (tgt < p + c)).astype(np.float32)


def oracle_bias(model, tokens, prompt_lengths, cont_lengths, *, config: RerouteConfig, layer_mask=None,
                delta=None) -> tuple[jax.Array, FitInfo]:
    """An upper bound: delta fitted on the true continuation's NLL (it sees the answer).

    Args:
      model, tokens [b, T], prompt_lengths [b], cont_lengths [b]: as in `continuation_nll`.
      config: steps, learning rate, L2 (`layers` is ignored: `layer_mask` decides).
      layer_mask: [L, b] (default: all layers).
      delta: initial delta (default zero).
    """
    w = _continuation_weights(tokens, prompt_lengths, cont_lengths)
    return fit_router_bias(model, tokens, w, config=config, delta=delta, layer_mask=layer_mask)


def sequence_embedding(model, tokens, lengths) -> np.ndarray:
    """[b, D] mean of the final residual stream over each row's first `lengths` tokens (zero bias)."""
    graphdef, state, _ = _split(model)
    tokens, lengths = _check_tokens(tokens, lengths)
    return np.asarray(_embed(graphdef, state, tokens, lengths))


def retrieval_bias(model, tokens, lengths, bank_tokens, bank_lengths, *, config: RerouteConfig,
                   num_neighbors: int = 8, bank_embeddings=None, key=None) -> tuple[jax.Array, FitInfo, np.ndarray]:
    """C3PO-style baseline: fit each query's delta on its nearest training examples.

    Neighbours are the `num_neighbors` bank rows with the highest cosine similarity of
    `sequence_embedding`; the query's delta is fitted on their mean next-token loss over the layers
    `config.layers` selects on the query (the same selection as in-context rerouting, so only the
    data source differs).

    Args:
      model: MoE `models.Transformer`.
      tokens: [b, T] queries (prompts); lengths: [b].
      bank_tokens: [M, S] training examples; bank_lengths: [M].
      config: RerouteConfig.
      num_neighbors: neighbours per query (<= M).
      bank_embeddings: [M, D] precomputed `sequence_embedding` of the bank.
      key: PRNG key (random layer mode).

    Returns:
      (delta [L, b, E], FitInfo, neighbour indices [b, num_neighbors]).
    """
    tokens, lengths = _check_tokens(tokens, lengths)
    bank_tokens, bank_lengths = _check_tokens(bank_tokens, bank_lengths, "bank_tokens")
    M = bank_tokens.shape[0]
    if not 1 <= num_neighbors <= M:
        raise ValueError(f"num_neighbors must be in [1, M={M}]; got {num_neighbors}")
    q = sequence_embedding(model, tokens, lengths)
    e = sequence_embedding(model, bank_tokens, bank_lengths) if bank_embeddings is None else np.asarray(bank_embeddings)
    qn = q / np.maximum(np.linalg.norm(q, axis=1, keepdims=True), 1e-12)
    en = e / np.maximum(np.linalg.norm(e, axis=1, keepdims=True), 1e-12)
    nbr = np.argsort(-(qn @ en.T), axis=1, kind="stable")[:, :num_neighbors]
    b = tokens.shape[0]
    _, _, cfg = _split(model)
    delta0 = _zeros_delta(cfg, b)
    mask = _layer_mask(model, config, tokens, lengths, delta0, key)
    rows = nbr.reshape(-1)
    w = _context_weights(bank_tokens.shape, bank_lengths)[rows]
    delta, info = fit_router_bias(model, bank_tokens[rows], w, config=config, delta=delta0, layer_mask=mask,
                                  bias_index=np.repeat(np.arange(b), num_neighbors))
    return delta, info, nbr


def _tree_equal(a: Any, b: Any) -> bool:
    """Bitwise equality of two pytrees of arrays (used by the tests and the experiment's checks)."""
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    return len(la) == len(lb) and all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(la, lb))
