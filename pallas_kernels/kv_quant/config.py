"""Block sizes of the kv_quant kernels: frozen, validated, with per-backend defaults."""

from __future__ import annotations

import dataclasses

from pallas_kernels._backend import is_power_of_two
from pallas_kernels.decode_attention.config import DecodeBlockSizes


@dataclasses.dataclass(frozen=True, kw_only=True)
class QuantizeBlockSizes:
    """Tiling of the Pallas `quantize` and `dequantize` kernels.

    Attributes:
      block_rows: rows (all leading dims flattened) per grid program; each program quantizes a
        [block_rows, last_dim] tile, all of its groups (power of two on Triton, multiple of 32 on TPU).
    """

    block_rows: int = 256

    def __post_init__(self):
        if self.block_rows < 1:
            raise ValueError(f"block_rows must be >= 1; got block_rows={self.block_rows}")

    def validate(self, implementation: str) -> None:
        if implementation == "pallas_triton" and not is_power_of_two(self.block_rows):
            raise ValueError(f"Triton needs block_rows a power of two; got block_rows={self.block_rows}")
        if implementation == "pallas_tpu" and self.block_rows % 32:
            # uint8 code tiles are (32, 128) on TPU.
            raise ValueError(f"TPU needs block_rows a multiple of 32; got block_rows={self.block_rows}")

    @classmethod
    def default(cls, *, rows: int, implementation: str) -> "QuantizeBlockSizes":
        """256 rows, shrunk (to a power of two >= 32) for small inputs."""
        return cls(block_rows=max(32, min(256, 1 << max(rows - 1, 1).bit_length())))


# Quantized decode runs the dense split-K decode shell, so it takes the dense shell's tiling: block_k keys
# per inner-loop tile (each dequantized right before its two matmuls), num_splits KV splits merged by the
# log-sum-exp combine, and the same defaults and backend rules.
QuantDecodeBlockSizes = DecodeBlockSizes
