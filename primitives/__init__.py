"""Pure functions on arrays: no Flax, no state, no I/O.

Modules:
  attention: reference attention (GQA/MQA, masks, RoPE, decode, log-sum-exp merge).
  routing: MoE router logits, top-k gating, load-balance / z-losses, confidence, dispatch metadata.
  sampling: greedy, temperature, top-k, top-p samplers and the `Sampler` rule.
"""

from primitives import attention, routing, sampling
from primitives.attention import attention as dot_product_attention
from primitives.attention import combine_partials, decode_attention, rope
from primitives.sampling import Sampler, greedy, temperature_sample, top_k_sample, top_p_sample

__all__ = [
    "attention", "routing", "sampling", "dot_product_attention", "decode_attention", "combine_partials", "rope",
    "Sampler", "greedy", "temperature_sample", "top_k_sample", "top_p_sample",
]
