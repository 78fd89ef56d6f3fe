"""Block sizes of the split-K decode kernel: frozen, validated, with per-backend defaults."""

from __future__ import annotations

import dataclasses

from pallas_kernels._backend import is_power_of_two, splits_within_vmem, tpu_tile_bytes


@dataclasses.dataclass(frozen=True, kw_only=True)
class DecodeBlockSizes:
    """Tiling of `decode_attention`.

    Attributes:
      block_k: keys per inner-loop tile (power of two, >= 16 on Triton).
      num_splits: number of KV splits (split-K); each split is one grid program
        per sequence and the partial results are merged with the log-sum-exp
        combine. More splits = more parallelism for short batches.
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
    def default(cls, *, seq_len: int, batch: int, implementation: str) -> "DecodeBlockSizes":
        """Splits so that batch * splits programs fill the chip, capped by the KV length."""
        block_k = 128 if seq_len >= 128 or implementation != "pallas_triton" else 16
        block_k = min(block_k, max(16, 1 << max(seq_len - 1, 1).bit_length()))
        tiles = max(1, -(-seq_len // block_k))
        want = max(1, 128 // max(batch, 1))  # ~128 programs in flight
        return cls(block_k=block_k, num_splits=max(1, min(want, tiles, 64)))


def tpu_dense_bytes_per_key(*, kv_heads: int, head_dim: int, itemsize: int, kv_layout: str) -> int:
    """VMEM bytes one cached token takes in a program's K and V blocks on TPU (`_backend.tpu_tile_bytes`
    of its [k, d] slab, twice): [split, k, d] blocks ("bskd") tile over (k, d), [k, split, d] ("bksd")
    blocks are dense. (8 KiB per key for 8 bfloat16 heads of 128 token-major, which is what Mosaic's
    scoped allocation came to: 32.00M for the 4096-key splits of a 64k cache, over v5e's 16M.)"""
    if kv_layout == "bskd":
        return 2 * tpu_tile_bytes(kv_heads, head_dim, itemsize)
    return 2 * kv_heads * -(-head_dim // 128) * 128 * itemsize


def decode_default(*, seq_len: int, batch: int, kv_heads: int, head_dim: int, itemsize: int, kv_layout: str,
                   implementation: str) -> DecodeBlockSizes:
    """`DecodeBlockSizes.default`, with the splits doubled on TPU until each split's K and V blocks fit
    `_backend.TPU_BLOCK_VMEM_BUDGET` (`_backend.splits_within_vmem`, `tpu_dense_bytes_per_key`)."""
    bs = DecodeBlockSizes.default(seq_len=seq_len, batch=batch, implementation=implementation)
    if implementation != "pallas_tpu":
        return bs
    tiles = max(1, -(-seq_len // bs.block_k))
    per_key = tpu_dense_bytes_per_key(kv_heads=kv_heads, head_dim=head_dim, itemsize=itemsize, kv_layout=kv_layout)
    return dataclasses.replace(bs, num_splits=splits_within_vmem(seq_len, per_key, bs.num_splits, tiles))
