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
        On TPU, for an input with a token axis (see `api._token_axis`), tokens per program instead
        (a multiple of 128): each program quantizes [block_rows, Q, last_dim], every row of each token.
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

    @classmethod
    def tokens_minor_default(cls, *, length: int, rows: int, last_dim: int) -> "QuantizeBlockSizes":
        """The TPU tokens-minor kernels' tiling: `block_rows` tokens (a multiple of 128, they lie on lanes),
        each with `rows` rows of `last_dim` values. The largest of 512, 256, 128 tokens whose float32
        tile of values stays within 2 MiB, no more than the (128-rounded) length."""
        cap = max(128, -(-length // 128) * 128)
        for t in (512, 256):
            if t <= cap and t * rows * last_dim * 4 <= 2 * 2**20:
                return cls(block_rows=t)
        return cls(block_rows=128)


# Quantized decode runs the dense split-K decode shell, so it takes the dense shell's tiling: block_k keys
# per inner-loop tile (each dequantized right before its two matmuls), num_splits KV splits merged by the
# log-sum-exp combine, and the same defaults and backend rules.
QuantDecodeBlockSizes = DecodeBlockSizes


def tpu_block_bytes_per_key(arrays) -> int:
    """VMEM bytes one cached token takes in a program's blocks on TPU, summed over the cache arrays.

    `arrays`: the cache arrays as stored, [b, s, kh, x] each (codes, scales, zero points). The TPU
    kernel reads them transposed to [b, kh, x, s] (the "bkxs" layout: tokens on lanes), so a block
    [kh, x, split_len] is lane-dense and only x pads, to a sublane tile (`_backend.tpu_tile_bytes`: 8 rows
    of float32, 16 of bfloat16, 32 of uint8); an array with x = 1 is read as [kh, split_len] (kh pads). (The token-major blocks [split_len, kh, x] this replaced
    padded x to 128 lanes and kh to a sublane tile: 20 KiB per token for the production case of
    `pallas_kernels.aot`, which Mosaic's scoped allocation confirmed; 1088 bytes now.)
    """
    return sum(tpu_tile_bytes(a.shape[2], 128, a.dtype.itemsize) // 128 if a.shape[3] == 1
               else a.shape[2] * tpu_tile_bytes(a.shape[3], 128, a.dtype.itemsize) // 128 for a in arrays)


def quant_decode_default(*, seq_len: int, batch: int, cache, implementation: str) -> DecodeBlockSizes:
    """The dense shell's default tiling; on TPU `block_k` is 128 (tokens lie on lanes there) and the
    splits are doubled until each split's cache blocks fit `_backend.TPU_BLOCK_VMEM_BUDGET`
    (`_backend.splits_within_vmem`, with `tpu_block_bytes_per_key`)."""
    bs = DecodeBlockSizes.default(seq_len=seq_len, batch=batch, implementation=implementation)
    if implementation != "pallas_tpu":
        return bs
    bs = dataclasses.replace(bs, block_k=128)
    tiles = max(1, -(-seq_len // bs.block_k))
    splits = splits_within_vmem(seq_len, tpu_block_bytes_per_key(cache), min(bs.num_splits, tiles), tiles)
    return dataclasses.replace(bs, num_splits=splits)
