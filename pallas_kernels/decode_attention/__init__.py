"""Split-K flash decoding (one query token per sequence over a KV cache), GQA, per-sequence lengths."""

from pallas_kernels.decode_attention.api import decode_attention
from pallas_kernels.decode_attention.config import DecodeBlockSizes
from pallas_kernels.decode_attention.cost import decode_cost

__all__ = ["decode_attention", "DecodeBlockSizes", "decode_cost"]
