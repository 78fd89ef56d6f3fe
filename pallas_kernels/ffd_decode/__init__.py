"""FFD decode: fused low-bit key scan, top-delta page selection and split-K attention."""

from pallas_kernels.ffd_decode.api import ffd_decode
from pallas_kernels.ffd_decode.config import FFDBlockSizes
from pallas_kernels.ffd_decode.cost import ffd_cost

__all__ = ["ffd_decode", "FFDBlockSizes", "ffd_cost"]
