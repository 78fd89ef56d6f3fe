"""Block sizes of the grouped-matmul kernels: frozen, validated, with per-backend defaults."""

from __future__ import annotations

import dataclasses

from pallas_kernels._backend import is_power_of_two, next_power_of_two


@dataclasses.dataclass(frozen=True, kw_only=True)
class GmmBlockSizes:
    """Tiling of `grouped_matmul` (and of its backward kernels).

    Attributes:
      block_m: rows per program (one row tile; a tile spanning a group boundary is computed once
        per group it touches, with the other rows masked).
      block_k: contraction width per inner-loop step.
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

    @classmethod
    def default(cls, *, m: int, k: int, n: int, implementation: str) -> "GmmBlockSizes":
        if implementation == "pallas_tpu":
            return cls(block_m=min(128, max(8, -(-m // 8) * 8)), block_k=128 if k <= 128 else 256,
                       block_n=128 if n <= 128 else 256)
        fit = lambda x, cap: min(cap, max(16, next_power_of_two(x)))
        return cls(block_m=fit(m, 64), block_k=fit(k, 64), block_n=fit(n, 64))
