"""Flash-attention prefill (GQA, causal), forward and backward Pallas kernels."""

from pallas_kernels.flash_attention.api import flash_attention
from pallas_kernels.flash_attention.config import FlashBlockSizes
from pallas_kernels.flash_attention.cost import flash_cost

__all__ = ["flash_attention", "FlashBlockSizes", "flash_cost"]
