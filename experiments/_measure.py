"""Measurements shared by experiments: the machine's own matmul peak, model-FLOPs utilization, and
batched completion of prompt strings for evaluation."""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from algorithms.decoding import generate
from experiments.tasks.tokenizer import prompt_batch
from primitives.sampling import Sampler

__all__ = ["matmul_peak_flops", "steady_throughput", "complete_prompts"]


def matmul_peak_flops(dim: int = 1024, *, dtype=jnp.float32, repeats: int = 10) -> float:
    """Best measured FLOP/s of a jitted [dim, dim] @ [dim, dim] matmul on the default device.

    This is the ceiling model-FLOPs utilization is reported against on machines
    without a published peak (CPU). Best-of-`repeats` after one warm-up call.
    """
    a = jax.random.normal(jax.random.key(0), (dim, dim), dtype)
    b = jax.random.normal(jax.random.key(1), (dim, dim), dtype)
    f = jax.jit(lambda x, y: x @ y)
    f(a, b).block_until_ready()
    best = np.inf
    for _ in range(repeats):
        t = time.perf_counter()
        f(a, b).block_until_ready()
        best = min(best, time.perf_counter() - t)
    return 2.0 * dim**3 / best


def steady_throughput(history: list[dict[str, float]]) -> float:
    """Median examples/s over logged windows, skipping the first (it holds compilation)."""
    rates = [h["examples_per_s"] for h in history if "examples_per_s" in h]
    rates = rates[1:] if len(rates) > 1 else rates
    return float(np.median(rates)) if rates else float("nan")


def complete_prompts(model, tokenizer, prompts, *, max_new_tokens: int, sampler: Sampler = Sampler(),
                     key: jax.Array | None = None, chunk: int, prompt_len: int | None = None):
    """Generates one completion per prompt string, `chunk` prompts per `generate` call.

    The last chunk is padded with copies of its last prompt, so every call has the same shape and
    compiles once. Chunk i (starting at prompt `start`) samples with `fold_in(key, start)`.

    Args:
      model: the decoder LM.
      tokenizer: has `eos_id`, `pad_id` (and is what `prompt_batch` takes).
      prompts: prompt strings.
      max_new_tokens, sampler: generation settings (default sampler: greedy, no key needed).
      key: PRNG key for sampling samplers.
      chunk: prompts per call.
      prompt_len: padded prompt length (default: the longest prompt + 1 for BOS).

    Returns:
      (tokens [n, max_new_tokens] int np.ndarray, lengths [n] np.ndarray) for the n prompts.
    """
    prompts = list(prompts)
    prompt_len = max(len(p) for p in prompts) + 1 if prompt_len is None else prompt_len
    toks, lens = [], []
    for start in range(0, len(prompts), chunk):
        part = prompts[start:start + chunk]
        n = len(part)
        b = prompt_batch(tokenizer, part + [part[-1]] * (chunk - n), seq_len=prompt_len)
        kw = {} if key is None else {"key": jax.random.fold_in(key, start)}
        out = generate(model, jnp.asarray(b["tokens"]), prompt_lengths=jnp.asarray(b["prompt_lengths"]),
                       max_new_tokens=max_new_tokens, sampler=sampler, stop_tokens=(tokenizer.eos_id,),
                       pad_id=tokenizer.pad_id, **kw)
        toks.append(np.asarray(out.tokens)[:n])
        lens.append(np.asarray(out.lengths)[:n])
    return np.concatenate(toks), np.concatenate(lens)

