"""Bidirectional WKV of Vision-RWKV (Bi-WKV): a chunked two-pass scan kernel over time, with the linear-time
XLA primitive (`primitives.linear_attention.bi_wkv`) as fallback and backward."""

from pallas_kernels.wkv.api import bi_wkv
from pallas_kernels.wkv.config import WKVBlockSizes
from pallas_kernels.wkv.cost import bi_wkv_cost, bi_wkv_quadratic_cost

__all__ = ["bi_wkv", "WKVBlockSizes", "bi_wkv_cost", "bi_wkv_quadratic_cost"]
