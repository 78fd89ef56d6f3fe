"""Block sizes of the QVG kernels: frozen, validated, with per-backend rules."""

from __future__ import annotations

import dataclasses
from typing import Sequence

from pallas_kernels._backend import is_power_of_two, splits_within_vmem, tpu_tile_bytes


@dataclasses.dataclass(frozen=True, kw_only=True)
class AssignBlockSizes:
    """Tiling of `kmeans_assign`.

    Attributes:
      block_s: points per grid program (power of two >= 16 on Triton, multiple of 128 on TPU, where
        the labels lie along lanes); all centroids of the group are resident (k <= a few hundred, as
        in QVG).
    """

    block_s: int = 256

    def __post_init__(self):
        if self.block_s < 1:
            raise ValueError(f"block_s must be >= 1; got block_s={self.block_s}")

    def validate(self, implementation: str) -> None:
        if implementation == "pallas_triton" and (not is_power_of_two(self.block_s) or self.block_s < 16):
            raise ValueError(f"Triton needs block_s a power of two >= 16; got block_s={self.block_s}")
        if implementation == "pallas_tpu" and self.block_s % 128:
            raise ValueError(f"TPU needs block_s a multiple of 128 (the labels lie along lanes); got "
                             f"block_s={self.block_s}")

    @classmethod
    def default(cls, *, points: int, implementation: str | None = None) -> "AssignBlockSizes":
        """256 points, shrunk to a power of two >= 16 (>= 128 on TPU) for small groups."""
        low = 128 if implementation == "pallas_tpu" else 16
        return cls(block_s=max(low, min(256, 1 << max(points - 1, 1).bit_length())))


@dataclasses.dataclass(frozen=True, kw_only=True)
class QVGAttentionBlockSizes:
    """Tiling of `qvg_attention`.

    Attributes:
      block_k: span tokens per inner-loop tile; each tile's residual codes are unpacked and its
        labels turned into one-hot rows right before the matmuls (power of two >= 16 on Triton,
        multiple of 128 on TPU, where the labels, scales and zero points lie with the tokens along
        the 128 lanes).
      num_splits: parts the span is cut into, one grid program each per (sequence, KV head), merged
        by the log-sum-exp combine; None chooses `default_splits` (on TPU: the fewest that fit VMEM).
    """

    block_k: int = 128
    num_splits: int | None = None

    def __post_init__(self):
        if self.block_k < 1:
            raise ValueError(f"block_k must be >= 1; got block_k={self.block_k}")
        if self.num_splits is not None and self.num_splits < 1:
            raise ValueError(f"num_splits must be >= 1 or None; got num_splits={self.num_splits}")

    def validate(self, implementation: str) -> None:
        if implementation == "pallas_triton" and (not is_power_of_two(self.block_k) or self.block_k < 16):
            raise ValueError(f"Triton needs block_k a power of two >= 16; got block_k={self.block_k}")
        if implementation == "pallas_tpu" and self.block_k % 128:
            raise ValueError(f"TPU needs block_k a multiple of 128 (tokens lie along the lanes of the label and "
                             f"scale blocks); got block_k={self.block_k}")

    @classmethod
    def default(cls, *, seq_len: int, implementation: str = "pallas_triton") -> "QVGAttentionBlockSizes":
        """128 tokens per tile (on Triton shrunk to a power of two >= 16 for short spans); splits chosen
        per call by `default_splits`."""
        if implementation == "pallas_tpu":
            return cls(block_k=128)
        return cls(block_k=max(16, min(128, 1 << max(seq_len - 1, 1).bit_length())))


def tpu_bytes_per_token(blocks: Sequence[tuple[int, int]]) -> int:
    """VMEM bytes one span token takes in a program's (double-buffered) blocks on TPU.

    Args:
      blocks: (rows, itemsize) of each [rows, tokens] block (labels [stages, tokens], codes [d/n, tokens],
        scales and zero points [d/G, tokens]): a token is one lane, its rows padded to whole sublane tiles
        (`_backend.tpu_tile_bytes`: 8 rows of 32 bits, e.g. 32 of uint8).
    """
    return 2 * sum(tpu_tile_bytes(rows, 1024, item) // 1024 for rows, item in blocks)  # the pipeline double-buffers


def default_splits(*, seq_len: int, block_k: int, programs: int, implementation: str, bytes_per_token: int) -> int:
    """Span splits when `num_splits` is None.

    TPU (v5e, v6e: one TensorCore per chip, the grid runs in sequence): the fewest splits (powers of two)
    whose blocks fit `_backend.TPU_BLOCK_VMEM_BUDGET` (`_backend.splits_within_vmem`); every further split
    costs a partial [rows, d] float32 output and another q C^T. Triton (the span stays in HBM): enough
    splits that `programs` (batch x KV heads) times splits fills about 128 SMs. Capped at one tile per split.
    """
    tiles = max(1, -(-seq_len // block_k))
    if implementation == "pallas_tpu":
        return splits_within_vmem(tiles, block_k * bytes_per_token, 1, tiles)
    want = max(1, 128 // max(programs, 1))
    return max(1, min(1 << (want.bit_length() - 1), tiles))
