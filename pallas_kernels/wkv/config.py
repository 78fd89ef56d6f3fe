"""Block sizes of the Bi-WKV kernel: frozen, validated, with per-backend rules."""

from __future__ import annotations

import dataclasses

from pallas_kernels._backend import is_power_of_two, next_power_of_two


@dataclasses.dataclass(frozen=True, kw_only=True)
class WKVBlockSizes:
    """Tiling of `bi_wkv`.

    The kernel treats every (batch row, channel) pair as one independent sequence and lays the sequences
    out as [rows, lanes] tiles; one program scans a whole tile of sequences over all tokens.

    Attributes:
      rows: sequences per tile along the second-minor axis (TPU: a multiple of 8, the f32 sublanes;
        Triton: a power of two).
      lanes: sequences per tile along the minor axis (TPU: a multiple of 128; Triton: a power of two).
      block_t: tokens per chunk of the time loop: each `fori_loop` step handles `block_t` tokens with an
        unrolled body (any positive int; more unrolling, longer compile).
    """

    rows: int = 8
    lanes: int = 128
    block_t: int = 8

    def __post_init__(self):
        for name in ("rows", "lanes", "block_t"):
            val = getattr(self, name)
            if not isinstance(val, int) or val < 1:
                raise ValueError(f"{name} must be a positive int; got {name}={val!r}")

    def validate(self, implementation: str) -> None:
        if implementation == "pallas_triton":
            for name in ("rows", "lanes"):
                val = getattr(self, name)
                if not is_power_of_two(val):
                    raise ValueError(f"Triton needs {name} a power of two; got {name}={val}")
        if implementation == "pallas_tpu":
            if self.rows % 8:
                raise ValueError(f"TPU needs rows a multiple of 8; got rows={self.rows}")
            if self.lanes % 128:
                raise ValueError(f"TPU needs lanes a multiple of 128; got lanes={self.lanes}")

    @property
    def sequences(self) -> int:
        return self.rows * self.lanes

    @classmethod
    def default(cls, implementation: str, *, sequences: int) -> "WKVBlockSizes":
        """TPU: one (8, 128) f32 vreg of sequences per program. Triton: one row of up to 128 lanes, shrunk to
        the next power of two of the sequence count (small problems still spread over several programs)."""
        if implementation == "pallas_tpu":
            return cls(rows=8, lanes=128)
        return cls(rows=1, lanes=max(16, min(128, next_power_of_two(sequences))))
