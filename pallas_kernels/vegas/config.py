"""Block sizes of the Vegas kernels: frozen, validated, with per-backend defaults.

Both kernels tile the key axis the same way: the (padded) key axis is cut into `num_splits`
contiguous splits, one grid program per (batch, KV head, split), and each program walks its split
in `block_k`-key tiles with the online softmax. The partial results of the splits are merged with
the log-sum-exp combine (`primitives.attention.combine_partials`).

Backend rules (see PALLAS.md):
  * Triton: `block_k` a power of two >= 16 (every block dim a power of two, `dot` dims >= 16).
  * TPU: `block_k` a multiple of 128, because the kernels slice the lane (last) dim of a per-key
    row by tile: the verify kernel's score rows [rows, split] and the sparse kernel's validity row
    [1, split].
"""

from __future__ import annotations

import dataclasses

from pallas_kernels._backend import is_power_of_two, splits_within_vmem

__all__ = ["VerifyBlockSizes", "SparseDecodeBlockSizes"]


def _validate_common(cls_name: str, block_k: int, num_splits: int) -> None:
    if not isinstance(block_k, int) or block_k < 1:
        raise ValueError(f"{cls_name}.block_k must be an int >= 1; got block_k={block_k!r}")
    if not isinstance(num_splits, int) or num_splits < 1:
        raise ValueError(f"{cls_name}.num_splits must be an int >= 1; got num_splits={num_splits!r}")


def _validate_backend(cls_name: str, block_k: int, implementation: str) -> None:
    if implementation == "pallas_triton" and (not is_power_of_two(block_k) or block_k < 16):
        raise ValueError(f"{cls_name}.block_k: Triton needs a power of two >= 16; got block_k={block_k}")
    if implementation == "pallas_tpu" and block_k % 128:
        raise ValueError(f"{cls_name}.block_k: TPU needs a multiple of 128 (lane-dim tiles of the per-key "
                         f"rows); got block_k={block_k}")


def _default_tiling(keys: int, programs_per_split: int, implementation: str) -> tuple[int, int]:
    """(block_k, num_splits): 128-key tiles (smaller on Triton for short ranges), ~128 programs."""
    if implementation == "pallas_tpu":
        block_k = 128
    else:
        block_k = max(16, min(128, 1 << max(keys - 1, 1).bit_length()))
    tiles = max(1, -(-keys // block_k))
    want = max(1, 128 // max(programs_per_split, 1))
    return block_k, max(1, min(want, tiles, 64))


@dataclasses.dataclass(frozen=True, kw_only=True)
class VerifyBlockSizes:
    """Tiling of `verify_attention`.

    Attributes:
      block_k: cache keys per inner-loop tile; each tile yields one [R g, block_k] tile of the score
        rows (power of two >= 16 on Triton, multiple of 128 on TPU).
      num_splits: contiguous splits of the cache (split-K); one grid program per (batch, KV head,
        split), merged by log-sum-exp.
    """

    block_k: int = 128
    num_splits: int = 4

    def __post_init__(self):
        _validate_common("VerifyBlockSizes", self.block_k, self.num_splits)

    def validate(self, implementation: str) -> None:
        """Raises ValueError when the tiling breaks `implementation`'s block rules."""
        _validate_backend("VerifyBlockSizes", self.block_k, implementation)

    @classmethod
    def default(cls, *, seq_len: int, batch: int, kv_heads: int, implementation: str,
                tpu_bytes_per_key: int = 0) -> "VerifyBlockSizes":
        """128-key tiles; splits so that batch * KV heads * splits ~ 128 programs, capped by the tiles; on
        TPU, given the VMEM a program's blocks take per key (`tpu_bytes_per_key`), doubled further until a
        split fits `_backend.TPU_BLOCK_VMEM_BUDGET` (`_backend.splits_within_vmem`)."""
        block_k, splits = _default_tiling(seq_len, batch * kv_heads, implementation)
        if implementation == "pallas_tpu" and tpu_bytes_per_key:
            tiles = max(1, -(-seq_len // block_k))
            splits = splits_within_vmem(seq_len, tpu_bytes_per_key, splits, tiles)
        return cls(block_k=block_k, num_splits=splits)


@dataclasses.dataclass(frozen=True, kw_only=True)
class SparseDecodeBlockSizes:
    """Tiling of `sparse_decode_attention` over the compact gathered buffer of K + max_recent rows.

    Attributes:
      block_k: gathered rows per inner-loop tile (power of two >= 16 on Triton, multiple of 128 on
        TPU).
      num_splits: contiguous splits of the compact axis (split-K), merged by log-sum-exp.
    """

    block_k: int = 128
    num_splits: int = 1

    def __post_init__(self):
        _validate_common("SparseDecodeBlockSizes", self.block_k, self.num_splits)

    def validate(self, implementation: str) -> None:
        """Raises ValueError when the tiling breaks `implementation`'s block rules."""
        _validate_backend("SparseDecodeBlockSizes", self.block_k, implementation)

    @classmethod
    def default(cls, *, num_keys: int, batch: int, kv_heads: int,
                implementation: str) -> "SparseDecodeBlockSizes":
        """`num_keys` = K + max_recent; same rule as `VerifyBlockSizes.default`."""
        block_k, splits = _default_tiling(num_keys, batch * kv_heads, implementation)
        return cls(block_k=block_k, num_splits=splits)
