"""QVG kernels: k-means assignment (distances by one matmul, argmin) and attention over a
QVG-quantized span that never materializes the dequantized keys and values (reference: dequantize
with `algorithms.compression.qvg`, then `primitives.attention.attention`)."""

from pallas_kernels.qvg.api import kmeans_assign, qvg_attention
from pallas_kernels.qvg.config import AssignBlockSizes, QVGAttentionBlockSizes
from pallas_kernels.qvg.cost import assign_cost, qvg_attention_cost

__all__ = ["kmeans_assign", "qvg_attention", "AssignBlockSizes", "QVGAttentionBlockSizes", "assign_cost",
           "qvg_attention_cost"]
