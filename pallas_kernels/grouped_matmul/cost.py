"""FLOPs / bytes model of the grouped matmul (used for pl.CostEstimate and benchmark reports)."""

from __future__ import annotations

from pallas_kernels._common import Cost

__all__ = ["Cost", "gmm_cost", "dense_experts_cost"]


def gmm_cost(*, m: int, k: int, n: int, num_groups: int, itemsize: int = 4, out_itemsize: int | None = None,
             block_m: int = 0) -> Cost:
    """Grouped matmul of m rows: 2 m k n useful FLOPs (plus up to E-1 boundary-tile recomputations of
    `block_m` rows when `block_m` is given). Bytes: lhs and out once, every group's rhs once."""
    out_itemsize = itemsize if out_itemsize is None else out_itemsize
    extra_rows = max(num_groups - 1, 0) * block_m
    flops = 2.0 * (m + extra_rows) * k * n
    bytes_accessed = m * k * itemsize + num_groups * k * n * itemsize + m * n * out_itemsize
    return Cost(flops=flops, bytes_accessed=float(bytes_accessed), transcendentals=0.0)


def dense_experts_cost(*, tokens: int, k: int, n: int, num_groups: int, itemsize: int = 4) -> Cost:
    """Every token through every expert (the dense all-experts baseline): 2 tokens E k n FLOPs."""
    flops = 2.0 * tokens * num_groups * k * n
    bytes_accessed = tokens * k * itemsize + num_groups * k * n * itemsize + tokens * num_groups * n * itemsize
    return Cost(flops=flops, bytes_accessed=float(bytes_accessed), transcendentals=0.0)
