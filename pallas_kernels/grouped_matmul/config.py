"""Block sizes of the grouped-matmul kernels: frozen, validated, with per-backend defaults."""

from __future__ import annotations

import dataclasses

from pallas_kernels._backend import TPU_BLOCK_VMEM_BUDGET, is_power_of_two, next_power_of_two, tpu_tile_bytes


def _round_up(x: int, b: int) -> int:
    return -(-x // b) * b


@dataclasses.dataclass(frozen=True, kw_only=True)
class GmmBlockSizes:
    """Tiling of `grouped_matmul` (and of its backward kernels).

    Attributes:
      block_m: rows per program (one row tile; a tile spanning a group boundary is computed once
        per group it touches, with the other rows masked).
      block_k: contraction width per step (a grid axis on TPU, an inner loop on Triton).
      block_n: output columns per program.
    """

    block_m: int = 128
    block_k: int = 128
    block_n: int = 128

    def __post_init__(self):
        if min(self.block_m, self.block_k, self.block_n) < 1:
            raise ValueError(f"block sizes must be >= 1; got {self}")

    def validate(self, implementation: str) -> None:
        if implementation == "pallas_triton":
            for name in ("block_m", "block_k", "block_n"):
                value = getattr(self, name)
                if not is_power_of_two(value) or value < 16:
                    raise ValueError(f"Triton needs {name} a power of two >= 16; got {name}={value}")
        if implementation == "pallas_tpu":
            if self.block_m % 8:
                raise ValueError(f"TPU needs block_m a multiple of 8; got block_m={self.block_m}")
            if self.block_k % 128 or self.block_n % 128:
                raise ValueError(f"TPU needs block_k and block_n multiples of 128; got {self}")

    def transposed(self) -> "GmmBlockSizes":
        """The tiling of the d_lhs pass (k and n swap roles)."""
        return dataclasses.replace(self, block_k=self.block_n, block_n=self.block_k)

    def tpu_vmem_bytes(self, itemsize: int) -> int:
        """Largest VMEM one program of the three TPU kernels takes (forward gmm, the d_lhs gmm on the
        transposed tiling, the d_rhs tgmm): double-buffered input and output blocks of `itemsize` bytes,
        the float32 accumulator and the float32 product of one step."""
        bm, bk, bn = self.block_m, self.block_k, self.block_n
        t = lambda r, c, s=itemsize: tpu_tile_bytes(r, c, s)
        gmm = lambda kk, nn: 2 * (t(bm, kk) + t(kk, nn) + t(bm, nn)) + 2 * t(bm, nn, 4)
        tgmm = 2 * (t(bm, bk) + t(bm, bn) + t(bk, bn)) + 2 * t(bk, bn, 4)
        return max(gmm(bk, bn), gmm(bn, bk), tgmm)

    @classmethod
    def default(cls, *, m: int, k: int, n: int, implementation: str, itemsize: int = 4) -> "GmmBlockSizes":
        """Per-backend default. TPU: block_m up to 512 rows, block_k / block_n the largest of 1024, 512, 256,
        128 dividing k / n rounded up to 128 (no padding copy of the weights beyond that), halved (the largest
        first, block_m last) until `tpu_vmem_bytes` fits `_backend.TPU_BLOCK_VMEM_BUDGET`."""
        if implementation == "pallas_tpu":
            sub = 8 * max(1, 4 // itemsize)  # rows of one (sublane x 32-bit) tile
            lanes = lambda x: next(b for b in (1024, 512, 256, 128) if _round_up(x, 128) % b == 0)
            bs = cls(block_m=min(512, max(sub, _round_up(m, sub))), block_k=lanes(k), block_n=lanes(n))
            while bs.tpu_vmem_bytes(itemsize) > TPU_BLOCK_VMEM_BUDGET:
                if max(bs.block_k, bs.block_n) > 128:
                    name = "block_k" if bs.block_k >= bs.block_n else "block_n"
                    bs = dataclasses.replace(bs, **{name: getattr(bs, name) // 2})
                elif bs.block_m > sub:
                    bs = dataclasses.replace(bs, block_m=max(sub, _round_up(bs.block_m // 2, sub)))
                else:
                    break
            return bs
        fit = lambda x, cap: min(cap, max(16, next_power_of_two(x)))
        return cls(block_m=fit(m, 64), block_k=fit(k, 64), block_n=fit(n, 64))
