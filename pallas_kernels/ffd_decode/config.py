"""Split configuration of the FFD kernel: frozen, validated, with a default."""

from __future__ import annotations

import dataclasses

from pallas_kernels._backend import splits_within_vmem


@dataclasses.dataclass(frozen=True, kw_only=True)
class FFDBlockSizes:
    """Tiling of `ffd_decode`.

    The page is the tile (``page_size`` tokens, fixed by the cache). Attributes:
      num_splits: contiguous page ranges per (sequence, KV head), one grid program each; the
        partial results are merged with the log-sum-exp combine. The official code uses 128,
        capped at the number of pages.
    """

    num_splits: int = 8

    def __post_init__(self):
        if not isinstance(self.num_splits, int) or self.num_splits < 1:
            raise ValueError(f"num_splits must be a positive int; got {self.num_splits!r}")

    def validate(self, implementation: str, *, page_size: int, head_dim: int, bits: int) -> None:
        """Backend rules: Triton dots need >= 16 along each dim; TPU tiles need sublane multiples of 8."""
        plane = head_dim // (8 // bits)
        if implementation == "pallas_triton" and (page_size < 16 or plane < 16 or page_size & (page_size - 1)):
            raise ValueError(f"Triton needs page_size a power of two >= 16 and head_dim * bits / 8 >= 16; got "
                             f"page_size={page_size}, head_dim={head_dim}, bits={bits}")
        if implementation == "pallas_tpu" and page_size % 8:
            raise ValueError(f"TPU needs page_size a multiple of 8; got page_size={page_size}")

    @classmethod
    def default(cls, *, num_pages: int, batch: int, kv_heads: int, page_vmem_bytes: int = 0) -> "FFDBlockSizes":
        """Enough splits for ~128 programs in flight, capped by the page count (and 128); with
        `page_vmem_bytes` (a page's VMEM in one program's blocks, TPU), more splits until a split's pages
        fit `_backend.TPU_BLOCK_VMEM_BUDGET` (2 splits of a 32k-token cache took 20 MiB > v5e's 16 MiB)."""
        want = max(1, 128 // max(batch * kv_heads, 1))
        splits = max(1, min(want, num_pages, 128))
        return cls(num_splits=splits_within_vmem(num_pages, page_vmem_bytes, splits, num_pages))
