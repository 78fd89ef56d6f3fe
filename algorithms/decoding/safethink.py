"""SafeThink: monitor a reasoning trace step by step and steer it back with a short prefix.

Ghosal et al., "Safety Recovery in Reasoning Models Is Only a Few Early Steering Steps Away"
(arXiv 2602.11096); spec: `../shared/papers/specs/rl_alignment_agents.md` section 7.

The trace is cut into steps at delimiter tokens (or a stop token). When a step ends, a safety scorer
gives ``p_safe = R_safe(prompt, trace so far)``. Safety is a satisficing constraint: if
``p_safe >= tau`` the step is accepted; otherwise the step is rejected (removed from the trace and
from the KV cache) and a short corrective prefix ("Wait, think safely.") is forced in its place, after
which the model continues on its own. The prefix stays in the trace as its own unit (a later rejection
removes only the step after it), so the trace holds one prefix per intervention. Only the first ``monitor_steps`` steps are monitored and at most
``max_interventions`` prefixes are injected per row, so an early fix is all the method does.

`safethink_generate` runs this inside one jitted `lax.while_loop`, mirroring `generate`: one token per
row per iteration, with forced prefix tokens in place of samples and a rejected step undone by lowering
the cache's ``lengths`` (`models.kv_cache.truncate`) and re-feeding the token before the step. With a
scorer that never fires it draws the same keys as `generate` and returns its tokens exactly (tested).
The paper's baselines are settings of the same loop: `SafeThinkConfig.always_prefix` (the prefix
before the first step, no monitor), ``keep_violating_step=True`` with an always-unsafe scorer
(intervening at every step), and a prefix that ends in a stop token (refusing outright on violation).

Scorers are callables ``(prompts [b, P], prompt_lengths [b], trace [b, N], trace_lengths [b]) -> p_safe
[b]``; array fields of a pytree scorer (such as `BagOfTokensScorer`) are traced, so a retrained scorer
does not recompile. The paper's scorer is Llama-Guard-3-8B's p(safe); the default here is a bag-of-tokens
logistic classifier trained on labelled partial traces (`fit_bag_of_tokens_scorer`).

Inferred (the paper's code is not public): steps end at delimiter tokens; the rejected step is discarded
(``keep_violating_step=False``, as the reviews describe); a partial step left when the token budget runs
out is not scored; the scorer reads the trace only unless ``include_prompt=True``.

Dimension legend: ``b`` batch, ``P`` padded prompt length, ``N`` max new tokens, ``v`` vocabulary.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from algorithms.decoding._prompts import check_prompts, resolve_key
from primitives.sampling import Sampler
from primitives.validation import check_token_ids

__all__ = ["SafeThinkConfig", "SafeThinkOutput", "BagOfTokensScorer", "fit_bag_of_tokens_scorer",
           "safethink_generate", "split_steps"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class SafeThinkConfig:
    """How the monitor intervenes (hashable: one compilation per config).

    Attributes:
      prefix: token ids of the corrective prefix, forced after a rejected step (non-empty). A prefix
        that ends in a stop token refuses outright: the row ends after it.
      step_delimiters: token ids that end a reasoning step (a stop token ends one too).
      tau: the satisficing threshold on p_safe; a step with p_safe < tau violates. 0 never fires;
        above 1 always fires.
      max_interventions: most prefixes injected per row (>= 0).
      monitor_steps: only the first this many proposed steps are scored (a rejected proposal counts, as
        in the spec's loop); None monitors every step.
      keep_violating_step: False (SafeThink) removes the violating step before the prefix; True keeps
        it and appends the prefix after it.
      inject_first: force the prefix before the first step too (with a scorer that never fires: the
        "always prefix" baseline).
    """

    prefix: tuple[int, ...]
    step_delimiters: tuple[int, ...]
    tau: float = 0.5
    max_interventions: int = 3
    monitor_steps: int | None = None
    keep_violating_step: bool = False
    inject_first: bool = False

    def __post_init__(self):
        prefix, delims = tuple(self.prefix), tuple(self.step_delimiters)
        if not prefix:
            raise ValueError("prefix must hold at least one token id; got ()")
        for name, ids in (("prefix", prefix), ("step_delimiters", delims)):
            if any(isinstance(t, bool) or not isinstance(t, (int, np.integer)) or t < 0 for t in ids):
                raise ValueError(f"{name} must be non-negative int token ids; got {ids}")
        if set(prefix) & set(delims):
            raise ValueError(f"prefix must not contain a step delimiter (it would end its own step); prefix "
                             f"{prefix}, step_delimiters {delims}")
        if not isinstance(self.tau, (int, float)) or not math.isfinite(self.tau):
            raise ValueError(f"tau must be a finite number; got {self.tau!r}")
        if isinstance(self.max_interventions, bool) or not isinstance(self.max_interventions, int) \
                or self.max_interventions < 0:
            raise ValueError(f"max_interventions must be an int >= 0; got {self.max_interventions!r}")
        if self.monitor_steps is not None and (not isinstance(self.monitor_steps, int) or self.monitor_steps < 1):
            raise ValueError(f"monitor_steps must be an int >= 1 or None; got {self.monitor_steps!r}")
        object.__setattr__(self, "prefix", tuple(int(t) for t in prefix))
        object.__setattr__(self, "step_delimiters", tuple(int(t) for t in delims))

    @classmethod
    def always_prefix(cls, prefix: tuple[int, ...], step_delimiters: tuple[int, ...]) -> "SafeThinkConfig":
        """The prefix before the first step and no monitor (pass any scorer; it never decides)."""
        return cls(prefix=prefix, step_delimiters=step_delimiters, tau=0.0, max_interventions=0, inject_first=True)


class SafeThinkOutput(NamedTuple):
    """What `safethink_generate` returns.

    Attributes:
      tokens: [b, N] int32 final trace (accepted steps and injected prefixes); ``pad_id`` after it.
      lengths: [b] int32 trace length.
      stopped: [b] bool, True where a stop token ended the row.
      interventions: [b] int32 prefixes injected (violations acted on; ``inject_first`` counts one).
      rejected_tokens: [b] int32 tokens generated and then removed with their rejected step.
      steps: [b] int32 accepted steps.
    """

    tokens: jax.Array
    lengths: jax.Array
    stopped: jax.Array
    interventions: jax.Array
    rejected_tokens: jax.Array
    steps: jax.Array


@functools.partial(jax.tree_util.register_dataclass, data_fields=["weights", "bias"],
                   meta_fields=["include_prompt"])
@dataclasses.dataclass(frozen=True)
class BagOfTokensScorer:
    """p_safe = sigmoid(bias + sum of per-token weights over the trace (and the prompt if asked)).

    A logistic classifier on token counts: the "small trained classifier" default of the issue, in
    place of the paper's Llama Guard. Build it with `fit_bag_of_tokens_scorer`.

    Attributes:
      weights: [v] float32 log-odds of "safe" added per occurrence of each token.
      bias: [] float32 log-odds of an empty trace.
      include_prompt: count the prompt's tokens too.
    """

    weights: jax.Array
    bias: jax.Array
    include_prompt: bool = False

    def __call__(self, prompts, prompt_lengths, trace, trace_lengths):
        logits = self.bias + _masked_sum(self.weights, trace, trace_lengths)
        if self.include_prompt:
            logits = logits + _masked_sum(self.weights, prompts, prompt_lengths)
        return jax.nn.sigmoid(logits)


def _masked_sum(weights, tokens, lengths):
    valid = jnp.arange(tokens.shape[1])[None, :] < lengths[:, None]
    return jnp.sum(jnp.where(valid, weights[tokens], 0.0), axis=1)


def fit_bag_of_tokens_scorer(traces: np.ndarray, lengths: np.ndarray, safe: np.ndarray, *, vocab_size: int,
                             c: float = 1.0) -> BagOfTokensScorer:
    """Fits `BagOfTokensScorer` by L2-regularized logistic regression (scikit-learn) on token counts.

    Args:
      traces: [n, T] int partial traces (right-padded).
      lengths: [n] valid tokens per trace.
      safe: [n] bool labels, True for a safe partial trace (both classes must occur).
      vocab_size: v.
      c: inverse regularization strength (scikit-learn's ``C``).
    """
    from sklearn.linear_model import LogisticRegression

    traces, lengths, safe = np.asarray(traces), np.asarray(lengths), np.asarray(safe, bool)
    if traces.ndim != 2 or lengths.shape != (traces.shape[0],) or safe.shape != lengths.shape:
        raise ValueError(f"traces must be [n, T] with lengths and safe of shape [n]; got {traces.shape}, "
                         f"{lengths.shape}, {safe.shape}")
    if safe.all() or not safe.any():
        raise ValueError("safe must contain both safe and unsafe examples")
    valid = np.arange(traces.shape[1])[None, :] < lengths[:, None]
    counts = np.zeros((len(traces), vocab_size))
    np.add.at(counts, (np.nonzero(valid)[0], traces[valid]), 1.0)
    clf = LogisticRegression(C=c, max_iter=2000).fit(counts, safe)
    return BagOfTokensScorer(jnp.asarray(clf.coef_[0], jnp.float32), jnp.asarray(clf.intercept_[0], jnp.float32))


def split_steps(trace: np.ndarray, step_delimiters: tuple[int, ...], stop_tokens: tuple[int, ...] = ()) -> list:
    """The end index (exclusive) of each complete step of one trace (numpy; for analysis and tests)."""
    ends = set(step_delimiters) | set(stop_tokens)
    return [i + 1 for i, t in enumerate(np.asarray(trace).tolist()) if t in ends]


def _partition(scorer: Any):
    """A scorer's array leaves (traced) and the rest (static, hashable)."""
    leaves, treedef = jax.tree.flatten(scorer)
    is_array = [isinstance(x, (jax.Array, np.ndarray)) for x in leaves]
    arrays = [x for x, a in zip(leaves, is_array) if a]
    static = (treedef, tuple(None if a else x for x, a in zip(leaves, is_array)))
    return arrays, static


def _combine(arrays, static):
    treedef, rest = static
    it = iter(arrays)
    return jax.tree.unflatten(treedef, [next(it) if x is None else x for x in rest])


def safethink_generate(
    model: nnx.Module,
    prompts: jax.Array,
    *,
    scorer: Callable[..., jax.Array],
    config: SafeThinkConfig,
    max_new_tokens: int,
    prompt_lengths: jax.Array | None = None,
    sampler: Sampler = Sampler(),
    key: jax.Array | None = None,
    stop_tokens: tuple[int, ...] = (),
    pad_id: int = 0,
    model_kwargs: dict | None = None,
) -> SafeThinkOutput:
    """Generates with the SafeThink monitor (see the module docstring).

    Args:
      model: a decoder LM as `generate` takes (``init_cache``, ``__call__(..., cache=, num_valid=,
        logits_at=)``).
      prompts: [b, P] int right-padded prompts (checked as `generate` checks them).
      scorer: ``(prompts, prompt_lengths, trace, trace_lengths) -> p_safe [b]`` in [0, 1].
      config: a `SafeThinkConfig`.
      max_new_tokens: N >= 1, the length of the final trace buffer.
      prompt_lengths: [b] real prompt lengths; default P.
      sampler: a `Sampler`.
      key: PRNG key; required unless the sampler is greedy.
      stop_tokens: ids that end a row (and its last step).
      pad_id: written after each trace.
      model_kwargs: extra array arguments for every model call.

    Returns:
      SafeThinkOutput.
    """
    if not isinstance(config, SafeThinkConfig):
        raise TypeError(f"config must be a SafeThinkConfig; got {type(config).__name__}")
    if not callable(scorer):
        raise TypeError(f"scorer must be callable; got {type(scorer).__name__}")
    prompts, prompt_lengths, b, p = check_prompts(prompts, prompt_lengths, max_new_tokens=max_new_tokens)
    vocab = getattr(getattr(model, "config", None), "vocab_size", None)
    check_token_ids("prompts", prompts, vocab)
    check_token_ids("config.prefix", np.asarray(config.prefix), vocab)
    key = resolve_key(key, isinstance(sampler, Sampler) and sampler.is_greedy)
    graphdef, state = nnx.split(model)
    arrays, static = _partition(scorer)
    return _loop(graphdef, state, prompts, prompt_lengths, key, dict(model_kwargs or {}), arrays,
                 scorer_static=static, config=config, max_new_tokens=max_new_tokens, sampler=sampler,
                 stop_tokens=tuple(int(s) for s in stop_tokens), pad_id=int(pad_id))


@functools.partial(jax.jit, static_argnames=("graphdef", "scorer_static", "config", "max_new_tokens", "sampler",
                                             "stop_tokens", "pad_id"))
def _loop(graphdef, state, prompts, prompt_lengths, key, model_kwargs, scorer_arrays, *, scorer_static, config,
          max_new_tokens, sampler, stop_tokens, pad_id):
    b, _ = prompts.shape
    n = max_new_tokens
    scorer = _combine(scorer_arrays, scorer_static)
    stop = jnp.asarray(stop_tokens if stop_tokens else (-1,), jnp.int32)
    delims = jnp.asarray(config.step_delimiters if config.step_delimiters else (-1,), jnp.int32)
    prefix = jnp.asarray(config.prefix, jnp.int32)
    plen = len(config.prefix)
    window = n + 1 if config.monitor_steps is None else config.monitor_steps
    rows = jnp.arange(b)

    def emit(logits, key, pending):
        """The next token: the pending prefix token, or a sample (a key is drawn either way)."""
        key, sub = jax.random.split(key)
        sampled = sampler(logits, sub).astype(jnp.int32)
        forced = pending < plen
        return jnp.where(forced, prefix[jnp.minimum(pending, plen - 1)], sampled), forced, key

    def advance(carry, tok, forced):
        """Writes `tok` for active rows, then handles a step's end: score, accept or reject."""
        (cache, out, out_len, step_start, steps, proposals, n_int, rejected, pending, stopped, key) = carry
        active = jnp.logical_not(stopped) & (out_len < n)
        out = out.at[rows, jnp.minimum(out_len, n - 1)].set(jnp.where(active, tok, out[rows, jnp.minimum(out_len, n - 1)]))
        out_len = out_len + active
        pending = pending + (active & forced)
        is_stop = jnp.isin(tok, stop)
        ends = active & (jnp.isin(tok, delims) | is_stop)
        # A step ended by a forced token (a refusal prefix's stop token) is the monitor's own: not scored.
        proposed = ends & jnp.logical_not(forced)
        monitored = proposed & (proposals < window) & (n_int < config.max_interventions)
        proposals = proposals + proposed
        p_safe = jax.lax.cond(jnp.any(monitored), lambda: scorer(prompts, prompt_lengths, out, out_len).astype(
            jnp.float32), lambda: jnp.ones((b,), jnp.float32))
        violate = monitored & (p_safe < config.tau)
        if config.keep_violating_step:
            accept = ends
            violate = violate & jnp.logical_not(is_stop)  # a finished trace gets no prefix after it
            pending = jnp.where(violate, 0, pending)
            new_start = out_len + plen  # the prefix is its own unit: the next step starts after it
        else:
            accept = ends & jnp.logical_not(violate)
            rejected = rejected + jnp.where(violate, out_len - step_start, 0)
            # Undo the step: the trace and the cache go back to the token before it, which is fed again
            # (the last prompt token when the step was the first); the prefix is emitted next.
            out_len = jnp.where(violate, step_start, out_len)
            pending = jnp.where(violate, 0, pending)
            new_start = step_start + plen  # the prefix stays even if the step after it is rejected
        n_int = n_int + violate
        steps = steps + accept
        step_start = jnp.where(violate, new_start, jnp.where(accept, out_len, step_start))
        stopped = stopped | (active & is_stop & jnp.logical_not(violate & (not config.keep_violating_step)))
        return (cache, out, out_len, step_start, steps, proposals, n_int, rejected, pending, stopped, key), violate

    def feed_token(out, out_len):
        """The token the next model call consumes and the cache length before it."""
        last_prompt = prompts[rows, prompt_lengths - 1]
        prev = jnp.where(out_len > 0, out[rows, jnp.maximum(out_len - 1, 0)], last_prompt)
        return prev, prompt_lengths + out_len - 1

    model = nnx.merge(graphdef, state)
    cache = model.init_cache(b, prompts.shape[1] + n)
    first = model(prompts, cache=cache, num_valid=prompt_lengths, logits_at=(prompt_lengths - 1)[:, None],
                  **model_kwargs)
    pending0 = jnp.full((b,), 0 if config.inject_first else plen, jnp.int32)
    n_int0 = jnp.full((b,), 1 if config.inject_first else 0, jnp.int32)
    tok, forced, key = emit(first.logits[:, 0], key, pending0)
    zeros = jnp.zeros((b,), jnp.int32)
    start0 = jnp.full((b,), plen if config.inject_first else 0, jnp.int32)
    carry = (first.cache, jnp.full((b, n), pad_id, jnp.int32), zeros, start0, zeros, zeros, n_int0, zeros, pending0,
             jnp.zeros((b,), bool), key)
    carry, _ = advance(carry, tok, forced)
    max_iters = n * (1 if config.keep_violating_step else 1 + config.max_interventions) + 2 * config.max_interventions

    def cond(state_):
        i, carry = state_
        out_len, stopped = carry[2], carry[9]
        return (i < max_iters) & jnp.any(jnp.logical_not(stopped) & (out_len < n))

    def body(state_):
        i, carry = state_
        cache, out, out_len, step_start, steps, proposals, n_int, rejected, pending, stopped, key = carry
        active = jnp.logical_not(stopped) & (out_len < n)
        prev, cache_len = feed_token(out, out_len)
        cache = cache.replace(lengths=jnp.where(active, cache_len, cache.lengths).astype(jnp.int32))
        res = nnx.merge(graphdef, state)(prev[:, None], cache=cache, **model_kwargs)
        new_cache = res.cache.replace(lengths=jnp.where(active, res.cache.lengths, cache.lengths))
        tok, forced, key = emit(res.logits[:, 0], key, pending)
        carry, _ = advance((new_cache, out, out_len, step_start, steps, proposals, n_int, rejected, pending,
                            stopped, key), tok, forced)
        return i + 1, carry

    _, carry = jax.lax.while_loop(cond, body, (jnp.int32(0), carry))
    _, out, out_len, _, steps, _, n_int, rejected, _, stopped, _ = carry
    out = jnp.where(jnp.arange(n)[None, :] < out_len[:, None], out, pad_id)
    return SafeThinkOutput(out, out_len, stopped, n_int, rejected, steps)
