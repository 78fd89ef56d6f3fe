"""Grouped matmul (megablox-style) for dropless mixture-of-experts: rows sorted by group times one
matrix per group, with a custom VJP (d_lhs by the same kernel, d_rhs by a transposed-grouped kernel)."""

from pallas_kernels.grouped_matmul.api import IMPLEMENTATIONS, grouped_matmul, tgmm
from pallas_kernels.grouped_matmul.config import GmmBlockSizes
from pallas_kernels.grouped_matmul.cost import dense_experts_cost, gmm_cost
from pallas_kernels.grouped_matmul.reference import gmm_dense_reference, gmm_reference, gmm_tiled, tgmm_reference

__all__ = ["grouped_matmul", "tgmm", "GmmBlockSizes", "gmm_cost", "dense_experts_cost", "gmm_reference",
           "gmm_dense_reference", "gmm_tiled", "tgmm_reference", "IMPLEMENTATIONS"]
