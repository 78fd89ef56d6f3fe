"""The decoder LM section of an experiment's config: `models.TransformerConfig` less the vocabulary.

An experiment that trains a `models.Transformer` nests one of these as ``model`` (overridden on the
command line as ``--model.d-model 64``, ``--model.moe.num-experts 8``) and builds the model config
with ``c.model.transformer(tokenizer.vocab_size)``: the vocabulary comes from the experiment's task,
everything else from here. Checked on construction by building that `TransformerConfig`.
"""

from __future__ import annotations

import dataclasses

from models.transformer import MoEConfig, TransformerConfig

__all__ = ["LMConfig", "MoELMConfig"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class LMConfig:
    """A dense (gated-FFN) decoder LM's shape; the fields mean what they mean in `TransformerConfig`."""

    d_model: int = 64
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    d_ff: int = 192

    def __post_init__(self):
        self.transformer(1)  # TypeError / ValueError naming the field

    def transformer(self, vocab_size: int) -> TransformerConfig:
        """The `TransformerConfig` of this LM over ``vocab_size`` token ids."""
        return TransformerConfig(vocab_size=vocab_size, **self._fields())

    def _fields(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


@dataclasses.dataclass(frozen=True, kw_only=True)
class MoELMConfig(LMConfig):
    """A mixture-of-experts decoder LM (``ffn_type="moe"``): the dense shape plus its `MoEConfig`."""

    moe: MoEConfig = MoEConfig()

    def transformer(self, vocab_size: int) -> TransformerConfig:
        return TransformerConfig(vocab_size=vocab_size, ffn_type="moe", **self._fields())
