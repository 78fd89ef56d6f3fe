"""Block sizes of the kv_quant kernels: frozen, validated, with per-backend defaults."""

from __future__ import annotations

import dataclasses

from pallas_kernels._backend import is_power_of_two, splits_within_vmem, tpu_tile_bytes
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


def tpu_block_bytes_per_key(arrays) -> int:
    """VMEM bytes one cached token takes in a program's blocks on TPU, summed over the cache arrays.

    A block [split_len, kh, last] is laid out in tiles over its last two dims (`_backend.tpu_tile_bytes`):
    the narrow last dims of packed codes, scales and zeros pad to 128 lanes, which makes a quantized cache
    far larger in VMEM than in HBM. (Checked against Mosaic's scoped allocation for the production case in
    `pallas_kernels.aot`.)
    """
    return sum(tpu_tile_bytes(a.shape[-2], a.shape[-1], a.dtype.itemsize) for a in arrays)


def quant_decode_default(*, seq_len: int, batch: int, cache, implementation: str) -> DecodeBlockSizes:
    """The dense shell's default tiling, with more splits on TPU until each split's cache blocks fit
    `_backend.TPU_BLOCK_VMEM_BUDGET` (`_backend.splits_within_vmem`; the 40 MiB that 16 splits of a 32k-token cache took failed to compile)."""
    bs = DecodeBlockSizes.default(seq_len=seq_len, batch=batch, implementation=implementation)
    if implementation != "pallas_tpu":
        return bs
    tiles = max(1, -(-seq_len // bs.block_k))
    splits = splits_within_vmem(seq_len, tpu_block_bytes_per_key(cache), bs.num_splits, tiles)
    return dataclasses.replace(bs, num_splits=splits)
