"""Block sizes of the QVG kernels: frozen, validated, with per-backend rules."""

from __future__ import annotations

import dataclasses

from pallas_kernels._backend import is_power_of_two


@dataclasses.dataclass(frozen=True, kw_only=True)
class AssignBlockSizes:
    """Tiling of `kmeans_assign`.

    Attributes:
      block_s: points per grid program (power of two >= 16 on Triton, multiple of 8 on TPU); all
        centroids of the group are resident (k <= a few hundred, as in QVG).
    """

    block_s: int = 256

    def __post_init__(self):
        if self.block_s < 1:
            raise ValueError(f"block_s must be >= 1; got block_s={self.block_s}")

    def validate(self, implementation: str) -> None:
        if implementation == "pallas_triton" and (not is_power_of_two(self.block_s) or self.block_s < 16):
            raise ValueError(f"Triton needs block_s a power of two >= 16; got block_s={self.block_s}")
        if implementation == "pallas_tpu" and self.block_s % 8:
            raise ValueError(f"TPU needs block_s a multiple of 8; got block_s={self.block_s}")

    @classmethod
    def default(cls, *, points: int) -> "AssignBlockSizes":
        """256 points, shrunk to a power of two >= 16 for small groups."""
        return cls(block_s=max(16, min(256, 1 << max(points - 1, 1).bit_length())))


@dataclasses.dataclass(frozen=True, kw_only=True)
class QVGAttentionBlockSizes:
    """Tiling of `qvg_attention`.

    Attributes:
      block_k: span tokens per inner-loop tile; each tile's residual codes are unpacked and its
        labels turned into one-hot rows right before the matmuls (power of two >= 16 on Triton,
        multiple of 32 on TPU, where uint8 label and code tiles are (32, 128)).
    """

    block_k: int = 128

    def __post_init__(self):
        if self.block_k < 1:
            raise ValueError(f"block_k must be >= 1; got block_k={self.block_k}")

    def validate(self, implementation: str) -> None:
        if implementation == "pallas_triton" and (not is_power_of_two(self.block_k) or self.block_k < 16):
            raise ValueError(f"Triton needs block_k a power of two >= 16; got block_k={self.block_k}")
        if implementation == "pallas_tpu" and self.block_k % 32:
            raise ValueError(f"TPU needs block_k a multiple of 32; got block_k={self.block_k}")

    @classmethod
    def default(cls, *, seq_len: int) -> "QVGAttentionBlockSizes":
        return cls(block_k=max(32, min(128, 1 << max(seq_len - 1, 1).bit_length())))
