"""QVG kernels: k-means assignment (distances by one matmul, argmin) and attention over a
QVG-quantized span that never materializes the dequantized keys and values (reference: dequantize
with `algorithms.compression.qvg`, then `primitives.attention.attention`).

`qvg_attention` splits the span over a grid axis and keeps every per-token array lane-major, so a
program's blocks fit TPU VMEM at any span: compiled for v5e and v6e (device descriptions, libtpu
0.0.42.1) at batch 8 x 8 KV heads, d = 128, from 8k and 32k tokens (one split) up to 1M tokens
(32 splits), the largest tried; see `api.py`."""

from pallas_kernels.qvg.api import kmeans_assign, qvg_attention
from pallas_kernels.qvg.config import AssignBlockSizes, QVGAttentionBlockSizes
from pallas_kernels.qvg.cost import assign_cost, qvg_attention_cost

__all__ = ["kmeans_assign", "qvg_attention", "AssignBlockSizes", "QVGAttentionBlockSizes", "assign_cost",
           "qvg_attention_cost"]
