"""Block sizes of the split-K decode kernel: frozen, validated, with per-backend defaults."""

from __future__ import annotations

import dataclasses

from pallas_kernels._backend import is_power_of_two


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
