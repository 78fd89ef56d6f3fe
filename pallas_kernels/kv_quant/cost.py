"""FLOPs / bytes model of the kv_quant kernels (for pl.CostEstimate and benchmark reports)."""

from __future__ import annotations

from pallas_kernels._common import Cost


def quantized_bytes(*, elements: int, bits: int, group_size: int, scale_itemsize: int, asymmetric: bool) -> float:
    """Stored bytes of a group-quantized tensor: packed codes + scales (+ zero points)."""
    groups = elements / group_size
    return elements * bits / 8 + groups * scale_itemsize * (2 if asymmetric else 1)


def quantize_cost(*, elements: int, bits: int, group_size: int, in_itemsize: int, scale_itemsize: int = 4,
                  asymmetric: bool = False) -> Cost:
    """Read x once, write codes + scales. FLOPs: ~6 per element (abs/min-max reduce, divide, round
    (floor, compare), clip, shift-or)."""
    return Cost(flops=6.0 * elements,
                bytes_accessed=elements * in_itemsize + quantized_bytes(
                    elements=elements, bits=bits, group_size=group_size, scale_itemsize=scale_itemsize,
                    asymmetric=asymmetric),
                transcendentals=0.0)


def dequantize_cost(*, elements: int, bits: int, group_size: int, out_itemsize: int, scale_itemsize: int = 4,
                    asymmetric: bool = False) -> Cost:
    """Read codes + scales, write the values. FLOPs: ~4 per element (shift, mask, subtract/add, scale)."""
    return Cost(flops=4.0 * elements,
                bytes_accessed=elements * out_itemsize + quantized_bytes(
                    elements=elements, bits=bits, group_size=group_size, scale_itemsize=scale_itemsize,
                    asymmetric=asymmetric),
                transcendentals=0.0)


def quant_decode_cost(*, batch: int, kv_len: int, num_heads: int, num_kv_heads: int, head_dim: int,
                      k_bits: int, v_bits: int, k_group: int, v_group: int, k_scale_itemsize: int = 4,
                      v_scale_itemsize: int = 4, k_asymmetric: bool = False, v_asymmetric: bool = False, q_itemsize: int = 4) -> Cost:
    """One query token per sequence over a quantized cache of `kv_len` tokens.

    FLOPs: q.k and p.v (4 b h s d) plus dequantization (shift, mask, convert, subtract/add, scale:
    ~4 per cached element of K and of V, i.e. 8 per (token, kv head, channel)). Bytes: packed codes, scales and zero points of K and V, read
    once per KV head for the whole query-head group, plus q and the output.
    """
    elems = batch * kv_len * num_kv_heads * head_dim
    kv = (quantized_bytes(elements=elems, bits=k_bits, group_size=k_group, scale_itemsize=k_scale_itemsize,
                          asymmetric=k_asymmetric)
          + quantized_bytes(elements=elems, bits=v_bits, group_size=v_group, scale_itemsize=v_scale_itemsize,
                            asymmetric=v_asymmetric))
    qo = 2.0 * batch * num_heads * head_dim * q_itemsize
    flops = 4.0 * batch * num_heads * kv_len * head_dim + 8.0 * elems
    return Cost(flops=flops, bytes_accessed=kv + qo, transcendentals=float(batch * num_heads * kv_len))
