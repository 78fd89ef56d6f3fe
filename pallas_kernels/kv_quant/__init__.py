"""Group-wise KV quantization: Pallas quantize / dequantize kernels and split-K decode attention over
packed K/V (2/4/8-bit, symmetric, midrise or asymmetric; reference: `primitives.quantization`)."""

from pallas_kernels.kv_quant.api import dequantize, quantize, quantized_decode_attention
from pallas_kernels.kv_quant.config import QuantDecodeBlockSizes, QuantizeBlockSizes
from pallas_kernels.kv_quant.cost import dequantize_cost, quant_decode_cost, quantize_cost, quantized_bytes

__all__ = ["quantize", "dequantize", "quantized_decode_attention", "QuantizeBlockSizes", "QuantDecodeBlockSizes",
           "quantize_cost", "dequantize_cost", "quant_decode_cost", "quantized_bytes"]
