"""Batched autoregressive generation compiled as one loop.

Dimension legend: `b` batch, `P` padded prompt length, `N` max new tokens,
`v` vocabulary.

`generate` prefills a right-padded prompt block into a fresh KV cache, or appends
it to a given one (each row with its own prompt length; only the last prompt token
of each row is unembedded),
then runs a single `lax.while_loop` that decodes
one token per sequence per iteration until every row has emitted a stop token or
N tokens are out. The whole thing is one `jax.jit`: the model is split into a
static graph definition and its state, so it compiles once per (model
structure, shapes, sampler, stop tokens). The model is rebuilt from that state
inside each traced function (prefill, loop body), so no traced value of one
function leaks into another through the model object.

Greedy output equals re-running the full forward pass on the growing sequence
and taking the argmax at every step (tested).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Mapping, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from algorithms.decoding._prompts import check_prompts, resolve_key
from primitives.sampling import Sampler
from primitives.validation import check_token_ids

__all__ = ["GenerateOutput", "generate"]


class GenerateOutput(NamedTuple):
    """What `generate` returns.

    Attributes:
      tokens: [b, N] int32 generated tokens; `pad_id` after a row stopped.
      lengths: [b] int32 number of generated tokens per row (the stop token counts).
      logprobs: [b, N] float32 log-probability of each generated token under the
        distribution it was sampled from (`Sampler.log_probs` when the sampler is
        a `Sampler`, else the model's log-softmax); 0 at padding.
      stopped: [b] bool, True where a stop token ended the row.
    """

    tokens: jax.Array
    lengths: jax.Array
    logprobs: jax.Array
    stopped: jax.Array


def generate(
    model: nnx.Module,
    prompts: jax.Array,
    *,
    max_new_tokens: int,
    prompt_lengths: jax.Array | None = None,
    sampler: Callable[[jax.Array, jax.Array], jax.Array] = Sampler(),
    key: jax.Array | None = None,
    stop_tokens: tuple[int, ...] = (),
    pad_id: int = 0,
    model_kwargs: Mapping[str, Any] | None = None,
    cache: Any = None,
) -> GenerateOutput:
    """Generates up to `max_new_tokens` tokens for each prompt.

    Args:
      model: a decoder LM with `init_cache(batch, capacity)` and
        `__call__(tokens, *, cache, num_valid, logits_at, **model_kwargs)` returning an
        object with `.logits` and `.cache` (e.g. `models.Transformer`).
      prompts: [b, P] int right-padded prompt tokens, ids in [0, vocab_size) (padding included),
        checked here before the jitted loop (float ids: TypeError; out-of-range: ValueError).
      max_new_tokens: N >= 1.
      prompt_lengths: [b] real prompt lengths (>= 1); default P for every row.
      sampler: `(logits [b, v], key) -> tokens [b]`; a `Sampler` (hashable, so
        one compilation per distinct sampler) or any hashable callable.
      key: PRNG key; required unless the sampler is greedy.
      stop_tokens: token ids that end a row (the stop token is emitted).
      pad_id: written after a row has stopped.
      model_kwargs: extra array arguments passed to every model call
        (e.g. `head_mask`, `residual_deltas` of per-row or per-layer shape).
      cache: a KV cache that already holds a context per row (a shared system prompt, a
        document prefilled in chunks, a synthetic context for benchmarks); the prompts are
        appended after its `lengths`. It needs room for P + N more tokens per row. Default: a
        fresh cache of capacity P + N (`model.init_cache`).

    Returns:
      GenerateOutput.
    """
    prompts, prompt_lengths, b, p = check_prompts(prompts, prompt_lengths, max_new_tokens=max_new_tokens)
    check_token_ids("prompts", prompts, getattr(getattr(model, "config", None), "vocab_size", None))
    key = resolve_key(key, isinstance(sampler, Sampler) and sampler.is_greedy)
    if cache is not None:
        if cache.batch_size != b:
            raise ValueError(f"cache batch size {cache.batch_size} != prompts batch size {b}")
        if not isinstance(cache.lengths, jax.core.Tracer):
            room = cache.capacity - int(np.max(np.asarray(cache.lengths)))
            if room < p + max_new_tokens:
                raise ValueError(f"cache has room for {room} more tokens; P + max_new_tokens = "
                                 f"{p + max_new_tokens} are needed (capacity {cache.capacity})")
    graphdef, state = nnx.split(model)
    return _generate(
        graphdef, state, prompts, prompt_lengths, key, dict(model_kwargs or {}), cache,
        max_new_tokens=max_new_tokens, sampler=sampler,
        stop_tokens=tuple(int(s) for s in stop_tokens), pad_id=int(pad_id),
    )


@functools.partial(jax.jit, static_argnames=("graphdef", "max_new_tokens", "sampler", "stop_tokens", "pad_id"))
def _generate(graphdef, state, prompts, prompt_lengths, key, model_kwargs, cache, *,
              max_new_tokens, sampler, stop_tokens, pad_id):
    b, p = prompts.shape
    n = max_new_tokens
    stop = jnp.asarray(stop_tokens if stop_tokens else (-1,), jnp.int32)

    def log_probs(logits):
        if isinstance(sampler, Sampler):
            return sampler.log_probs(logits)
        return jax.nn.log_softmax(logits, axis=-1)

    def pick(logits, key):
        tok = sampler(logits, key).astype(jnp.int32)
        lp = jnp.take_along_axis(log_probs(logits), tok[:, None], axis=-1)[:, 0]
        return tok, lp

    model = nnx.merge(graphdef, state)
    if cache is None:
        cache = model.init_cache(b, p + n)
    out = model(prompts, cache=cache, num_valid=prompt_lengths, logits_at=(prompt_lengths - 1)[:, None],
                **model_kwargs)
    last_logits = out.logits[:, 0]
    key, sub = jax.random.split(key)
    tok, lp = pick(last_logits, sub)
    stopped = jnp.isin(tok, stop)
    tokens = jnp.full((b, n), pad_id, jnp.int32).at[:, 0].set(tok)
    logprobs = jnp.zeros((b, n), jnp.float32).at[:, 0].set(lp)
    lengths = jnp.ones((b,), jnp.int32)

    def cond(carry):
        i, _, _, _, _, stopped, _, _ = carry
        return jnp.logical_and(i < n, jnp.logical_not(jnp.all(stopped)))

    def body(carry):
        i, cache, prev, tokens, logprobs, stopped, lengths, key = carry
        # A fresh module per trace: decode steps may `sow` intermediates (FFD's kept fraction), and a
        # module built outside the loop cannot be mutated inside it.
        out = nnx.merge(graphdef, state)(prev[:, None], cache=cache, **model_kwargs)
        key, sub = jax.random.split(key)
        tok, lp = pick(out.logits[:, 0], sub)
        active = jnp.logical_not(stopped)
        tokens = tokens.at[:, i].set(jnp.where(active, tok, pad_id))
        logprobs = logprobs.at[:, i].set(jnp.where(active, lp, 0.0))
        lengths = lengths + active.astype(jnp.int32)
        stopped = jnp.logical_or(stopped, jnp.isin(tok, stop))
        return i + 1, out.cache, tok, tokens, logprobs, stopped, lengths, key

    carry = (jnp.int32(1), out.cache, tok, tokens, logprobs, stopped, lengths, key)
    _, _, _, tokens, logprobs, stopped, lengths, _ = jax.lax.while_loop(cond, body, carry)
    return GenerateOutput(tokens, lengths, logprobs, stopped)
