"""Block sizes of the kv_quant kernels: frozen, validated, with per-backend defaults."""

from __future__ import annotations

import dataclasses

from pallas_kernels._backend import is_power_of_two


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


@dataclasses.dataclass(frozen=True, kw_only=True)
class QuantDecodeBlockSizes:
    """Tiling of the quantized split-K decode kernel.

    Attributes:
      block_k: keys per inner-loop tile; each tile is dequantized in registers/VMEM right before
        its two matmuls (power of two >= 16 on Triton, multiple of 8 on TPU).
      num_splits: KV splits processed by separate grid programs, merged by the log-sum-exp combine.
    """

    block_k: int = 128
    num_splits: int = 4

    def __post_init__(self):
        if self.block_k < 1 or self.num_splits < 1:
            raise ValueError(f"block_k and num_splits must be >= 1; got {self}")

    def validate(self, implementation: str) -> None:
        if implementation == "pallas_triton" and (not is_power_of_two(self.block_k) or self.block_k < 16):
            raise ValueError(f"Triton needs block_k a power of two >= 16; got block_k={self.block_k}")
        if implementation == "pallas_tpu" and self.block_k % 8:
            raise ValueError(f"TPU needs block_k a multiple of 8; got block_k={self.block_k}")

    @classmethod
    def default(cls, *, seq_len: int, batch: int, implementation: str) -> "QuantDecodeBlockSizes":
        """Same policy as the dense decode kernel: ~128 programs in flight, capped by the tiles."""
        block_k = 128 if seq_len >= 128 or implementation != "pallas_triton" else 16
        block_k = min(block_k, max(16, 1 << max(seq_len - 1, 1).bit_length()))
        tiles = max(1, -(-seq_len // block_k))
        want = max(1, 128 // max(batch, 1))
        return cls(block_k=block_k, num_splits=max(1, min(want, tiles, 64)))
