"""FLOPs / bytes model of one FFD decode step (pl.CostEstimate and the benchmark)."""

from __future__ import annotations

from pallas_kernels._common import Cost


def ffd_cost(*, batch: int, tokens: int, num_heads: int, num_kv_heads: int, head_dim: int, page_size: int,
             bits: int = 2, kept: float = 1.0, residual_itemsize: int = 4, v_itemsize: int = 4,
             q_itemsize: int = 4) -> Cost:
    """Scan every full page's codes and scales; residual and values only for the kept fraction.

    FLOPs: the scan ``2 b h s d`` plus, on kept pages, refinement and p.v ``2 * 2 b h s d kept``.
    Bytes: codes ``s d bits / 8`` and fp32 scales per page and KV head, then ``kept`` of the residual
    and the values; q and the partial outputs. (The exact current page is attended outside.)
    """
    elems = batch * tokens * num_kv_heads * head_dim
    scan = 2.0 * batch * num_heads * tokens * head_dim
    flops = scan + 2.0 * scan * kept
    pages = tokens // page_size
    read = elems * bits / 8 + batch * pages * num_kv_heads * head_dim * 4
    read += kept * elems * (residual_itemsize + v_itemsize)
    qo = 2.0 * batch * num_heads * head_dim * q_itemsize
    return Cost(flops=flops, bytes_accessed=read + qo, transcendentals=float(batch * num_heads * tokens * kept))
