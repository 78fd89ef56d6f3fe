"""Measurements shared by experiments: the machine's own matmul peak, model-FLOPs utilization."""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["matmul_peak_flops", "steady_throughput"]


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
