"""Flax NNX models composed from `primitives`.

Public names:
  TransformerConfig, Transformer, TransformerOutput: the decoder LM (models.transformer).
  KVCache, init_cache: its explicit KV cache (models.kv_cache).
"""

from models.kv_cache import KVCache, init_cache
from models.transformer import Transformer, TransformerConfig, TransformerOutput, register_ffn

__all__ = ["KVCache", "init_cache", "Transformer", "TransformerConfig", "TransformerOutput", "register_ffn"]
