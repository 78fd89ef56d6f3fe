"""Block sizes of the flash-attention kernels (forward, dq, dk/dv)."""

from __future__ import annotations

import dataclasses

from pallas_kernels._backend import TPU_BLOCK_VMEM_BUDGET, is_power_of_two, next_power_of_two, tpu_tile_bytes


@dataclasses.dataclass(frozen=True, kw_only=True)
class FlashBlockSizes:
    """Tiling of `flash_attention`.

    `block_q` query rows and `block_k` keys per tile of the forward; `block_q_bwd`, `block_k_bwd` the same
    for both backward kernels (dq and dk/dv); None means the forward's. Compiled for TPU (not interpreted),
    the query blocks are also the lane blocks of the lane-dense [b, h, 1, t] logsumexp, so `block_q` and
    `block_q_bwd` must be multiples of 128 or cover the whole query length.
    """

    block_q: int = 128
    block_k: int = 128
    block_q_bwd: int | None = None
    block_k_bwd: int | None = None

    def __post_init__(self):
        for name, value in self._named():
            if value < 1:
                raise ValueError(f"{name} must be >= 1; got {name}={value} in {self}")

    def _named(self):
        return (("block_q", self.block_q), ("block_k", self.block_k), ("block_q_bwd", self.bwd_q),
                ("block_k_bwd", self.bwd_k))

    @property
    def bwd_q(self) -> int:
        return self.block_q if self.block_q_bwd is None else self.block_q_bwd

    @property
    def bwd_k(self) -> int:
        return self.block_k if self.block_k_bwd is None else self.block_k_bwd

    def validate(self, implementation: str, *, q_len: int | None = None, interpret: bool = True) -> None:
        """Raises ValueError for tiles the backend cannot take (`q_len` and `interpret` enable the TPU lane rule
        on the query blocks, which only the TPU compiler enforces)."""
        for name, value in self._named():
            if implementation == "pallas_triton" and (not is_power_of_two(value) or value < 16):
                raise ValueError(f"Triton needs {name} a power of two >= 16; got {name}={value}")
            if implementation == "pallas_tpu" and value % 8:
                raise ValueError(f"TPU needs {name} a multiple of 8; got {name}={value} in {self}")
        if implementation == "pallas_tpu" and not interpret and q_len is not None:
            for name, value in (("block_q", self.block_q), ("block_q_bwd", self.bwd_q)):
                if value % 128 and value < q_len:
                    raise ValueError(f"TPU needs {name} a multiple of 128 (it tiles the lanes of the logsumexp) or "
                                     f">= q_len={q_len}; got {name}={value}")

    def tpu_vmem_bytes(self, *, head_dim: int, itemsize: int) -> int:
        """Estimated VMEM of the largest of the three TPU kernels: double-buffered blocks, float32 scratch
        and the float32 [bq, bk] tile temporaries (logits, weights, their cotangents)."""

        def blocks(bq, bk):
            qd, kd = tpu_tile_bytes(bq, head_dim, itemsize), tpu_tile_bytes(bk, head_dim, itemsize)
            qd32, kd32 = tpu_tile_bytes(bq, head_dim, 4), tpu_tile_bytes(bk, head_dim, 4)
            col = tpu_tile_bytes(bq, 1, 4)  # [bq, 1] float32 running statistics pad to 128 lanes
            row = tpu_tile_bytes(1, bq, 4)  # [1, bq] lane-dense logsumexp / delta blocks
            tile = tpu_tile_bytes(bq, bk, 4)
            forward = 2 * (2 * qd + 2 * kd + row) + 2 * col + qd32 + 3 * tile + qd32 + 2 * kd32
            dq = 2 * (3 * qd + 2 * kd + 2 * row) + qd32 + 2 * col + 5 * tile + 2 * qd32 + 2 * kd32
            dkv = 2 * (2 * qd + 2 * row + 4 * kd) + 2 * kd32 + 5 * tile + 2 * qd32 + 4 * kd32
            return forward, dq, dkv

        fwd, _, _ = blocks(self.block_q, self.block_k)
        _, dq, dkv = blocks(self.bwd_q, self.bwd_k)
        return max(fwd, dq, dkv)

    @classmethod
    def default(cls, *, q_len: int, kv_len: int, head_dim: int = 128, itemsize: int = 2,
                implementation: str = "pallas_triton") -> "FlashBlockSizes":
        """Triton (and the interpreter's default): 128 x 128 tiles, smaller for short sequences. TPU: the
        largest square tiles of 512, 256 or 128 (capped by the padded lengths) whose estimated VMEM
        (`tpu_vmem_bytes`) fits `_backend.TPU_BLOCK_VMEM_BUDGET`; larger tiles mean fewer grid steps."""
        if implementation != "pallas_tpu":
            return cls(block_q=min(128, max(16, next_power_of_two(q_len))),
                       block_k=min(128, max(16, next_power_of_two(kv_len))))
        for size in (512, 256, 128):
            bs = cls(block_q=min(size, -(-q_len // 8) * 8), block_k=min(size, -(-kv_len // 8) * 8))
            if bs.tpu_vmem_bytes(head_dim=head_dim, itemsize=itemsize) <= TPU_BLOCK_VMEM_BUDGET:
                return bs
        return bs
