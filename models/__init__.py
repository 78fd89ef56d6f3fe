"""Flax NNX models composed from `primitives`.

Public names:
  TransformerConfig, Transformer, TransformerOutput: the decoder LM (models.transformer), with the
    config's nested sections AttentionConfig (+ FFDConfig) and MoEConfig;
    SparseDecode: its sparse-attention decode step (Vegas drafting).
  KVCache, init_cache: its explicit KV cache (models.kv_cache).
  MoEFFN, dense_moe_reference: the mixture-of-experts FFN, registered as ffn_type "moe" (models.moe).
  InductionSpec, induction_lm: a long-context test LM with hand-set weights that copies spans
    exactly (models.induction; the Vegas and FFD workloads).
  ViTConfig, ViT, ViTOutput, classification_loss: a Vision Transformer classifier with prunable
    per-head widths and FFN / token hooks (models.vit; ToaSt).

Modules imported directly (not re-exported): models.cnn (a small CNN classifier; Dem-HEC),
models.video (a chunk-autoregressive video transformer; QVG), models.vrwkv (Vision-RWKV blocks and a
segmenter; E2I-VRWKV), models.unet (a conditional U-Net with SPADE; PLMD), models.vlm (a small
vision-audio-language model over the decoder LM), models.sae (top-k sparse autoencoders; RouterInterp), models.ppm (PPM).
"""

from models.kv_cache import KVCache, init_cache
from models.transformer import (AttentionConfig, FFDConfig, MoEConfig, SparseDecode, Transformer, TransformerConfig,
                                TransformerOutput, register_ffn)
from models.moe import MoEFFN, dense_moe_reference  # noqa: E402  (importing registers ffn_type "moe")
from models.induction import InductionSpec, induction_lm
from models.vit import ViT, ViTConfig, ViTOutput, classification_loss

__all__ = ["KVCache", "init_cache", "Transformer", "TransformerConfig", "AttentionConfig", "FFDConfig", "MoEConfig",
           "TransformerOutput", "SparseDecode",
           "register_ffn", "MoEFFN", "dense_moe_reference", "InductionSpec", "induction_lm",
           "ViT", "ViTConfig", "ViTOutput", "classification_loss"]
