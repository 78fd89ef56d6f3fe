"""Block sizes of the flash-attention prefill kernel."""

from __future__ import annotations

import dataclasses

from pallas_kernels._backend import is_power_of_two, next_power_of_two


@dataclasses.dataclass(frozen=True, kw_only=True)
class FlashBlockSizes:
    """Tiling of `flash_attention`: `block_q` query rows per program, `block_k` keys per loop tile."""

    block_q: int = 128
    block_k: int = 128

    def __post_init__(self):
        if self.block_q < 1 or self.block_k < 1:
            raise ValueError(f"block_q and block_k must be >= 1; got {self}")

    def validate(self, implementation: str) -> None:
        if implementation == "pallas_triton":
            for name in ("block_q", "block_k"):
                value = getattr(self, name)
                if not is_power_of_two(value) or value < 16:
                    raise ValueError(f"Triton needs {name} a power of two >= 16; got {name}={value}")
        if implementation == "pallas_tpu" and (self.block_q % 8 or self.block_k % 8):
            raise ValueError(f"TPU needs block_q and block_k multiples of 8; got {self}")

    @classmethod
    def default(cls, *, q_len: int, kv_len: int) -> "FlashBlockSizes":
        return cls(block_q=min(128, max(16, next_power_of_two(q_len))),
                   block_k=min(128, max(16, next_power_of_two(kv_len))))
