"""Vegas kernels: verification attention that also emits the raw scores of chosen query rows and the
logsumexp of every row, and sparse decode attention over an index list plus a contiguous recent range
(references: `primitives.attention.attention` with the matching boolean masks).

Each op has the "xla" reference path and Pallas kernels for TPU (Mosaic) and GPU (Triton) sharing one
body (`kernel.py`); `config.py` holds the validated block sizes and `cost.py` the FLOPs/bytes models.
The sparse kernel runs over a compact buffer gathered by XLA before the kernel (see `api.py`).
"""

from pallas_kernels.vegas.api import (VerifyOutput, sparse_decode_attention, sparse_decode_mask,
                                      sparse_decode_reference, verify_attention, verify_reference)
from pallas_kernels.vegas.config import SparseDecodeBlockSizes, VerifyBlockSizes
from pallas_kernels.vegas.cost import sparse_decode_cost, verify_cost

__all__ = ["VerifyOutput", "verify_attention", "verify_reference", "sparse_decode_attention",
           "sparse_decode_reference", "sparse_decode_mask", "VerifyBlockSizes", "SparseDecodeBlockSizes",
           "verify_cost", "sparse_decode_cost"]
