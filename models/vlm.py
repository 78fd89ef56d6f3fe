"""A small vision(-audio)-language model: ViT patch encoder + audio frame encoder -> decoder LM.

Dimension legend: `b` batch, `t` tokens, `D` LM width, `E` ViT width, `P` image patches,
`S` audio frames, `F` samples per audio frame, `v` vocabulary, `L` LM layers.

Architecture (LLaVA / Idefics2 "fully autoregressive" style):

  * image encoder: `models.vit.ViT` (mean pooling, so no class token) -> its final-block patch
    states after the final LayerNorm [b, P, E] -> a 2-layer GELU MLP projector -> [b, P, D];
  * optional audio encoder: frames [b, S, F] -> a 2-layer GELU MLP + learned frame positions -> [b, S, D];
  * interleaving: the text `tokens` [b, t] carry placeholder ids (`image_token_id`, `audio_token_id`);
    the k-th image placeholder of a row is replaced by the k-th image embedding of that row (images
    [b, n_img, H, W, c] flatten to n_img * P embeddings in order; likewise audio), every other
    position by the LM's token embedding. The sequence then runs through the LM's own blocks,
    final norm and unembedding (`models.transformer.Transformer`, unchanged).

The LM is called with `input_embeddings=` (the interleaved sequence replaces its embedding lookup),
so every LM hook (`attention_bias`, the KV cache, `return_intermediates`) works unchanged; with no
placeholders the result equals `Transformer.__call__` on the tokens (tested).

Generation: `VLM.prefill` writes the multimodal prompt (all but its last token) into the LM's KV
cache; from there the continuation is text only, so `algorithms.decoding.generate(vlm.lm, last
tokens, cache=...)` decodes it (models may not import algorithms, so this module also has
`VLM.generate_greedy`, a jitted greedy loop over the LM's one-token cache steps).

Spec: /work/shared/papers/specs/rl_alignment_agents.md sections 9 (Hyper-ICL: interleaved
image-text demonstrations; residual streams for the anchor loss via `return_intermediates`) and
10 (staged perception: a patch encoder + decoder, vision tower trainable or frozen). [INFER] The
projector shapes, the audio encoder and the placeholder interleaving are this library's choices.

References:
  Liu et al., "Visual Instruction Tuning" (LLaVA), arXiv:2304.08485, 2023.
  Laurencon et al., "What matters when building vision-language models?" (Idefics2), arXiv:2405.02246, 2024.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from models.kv_cache import KVCache
from models.transformer import Transformer, TransformerConfig
from models.vit import ViT, ViTConfig
from primitives.validation import check_token_ids

__all__ = ["VLMConfig", "VLM", "VLMOutput"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class VLMConfig:
    """Shape of the VLM.

    Attributes:
      lm: the decoder LM's config.
      vit: the image encoder's config (`pooling` must be "mean": every token is a patch).
      image_token_id: placeholder id replaced by image embeddings.
      audio_token_id: placeholder id replaced by audio embeddings (None: no audio encoder).
      audio_frames: S, frames per audio clip.
      audio_frame_len: F, samples per frame.
      projector_hidden: hidden width of the projector MLPs (default: lm.d_model).
    """

    lm: TransformerConfig
    vit: ViTConfig
    image_token_id: int
    audio_token_id: int | None = None
    audio_frames: int = 0
    audio_frame_len: int = 0
    projector_hidden: int | None = None

    def __post_init__(self):
        if self.vit.pooling != "mean":
            raise ValueError(f"vit.pooling: expected 'mean' (patch tokens only), got {self.vit.pooling!r}")
        ids = [("image_token_id", self.image_token_id)] + (
            [] if self.audio_token_id is None else [("audio_token_id", self.audio_token_id)])
        for name, i in ids:
            if not isinstance(i, int) or not 0 <= i < self.lm.vocab_size:
                raise ValueError(f"{name}: expected an id in [0, {self.lm.vocab_size}), got {i!r}")
        if self.audio_token_id is not None:
            if self.audio_token_id == self.image_token_id:
                raise ValueError("audio_token_id: must differ from image_token_id")
            if self.audio_frames < 1 or self.audio_frame_len < 1:
                raise ValueError(f"audio_frames / audio_frame_len: expected >= 1 with an audio encoder, got "
                                 f"{self.audio_frames} / {self.audio_frame_len}")

    @property
    def num_image_tokens(self) -> int:
        return self.vit.num_patches


class VLMOutput(NamedTuple):
    """logits [b, t, v] float32 ([b, r, v] with `logits_at`); cache (or None); intermediates (or None:
    the LM's intermediates with `return_intermediates`, e.g. `residuals` [L+1, b, t, D])."""

    logits: jax.Array
    cache: KVCache | None
    intermediates: dict[str, Any] | None


def _linear(rngs: nnx.Rngs, fan_in: int, fan_out: int) -> nnx.Linear:
    return nnx.Linear(fan_in, fan_out, kernel_init=nnx.initializers.normal(1 / math.sqrt(fan_in)), rngs=rngs)


class VLM(nnx.Module):
    """ViT (+ audio MLP) -> projector -> decoder LM over interleaved placeholder sequences.

    Examples:
      >>> from flax import nnx
      >>> import jax.numpy as jnp
      >>> lm = TransformerConfig(vocab_size=12, d_model=16, num_layers=1, num_heads=2, num_kv_heads=1, d_ff=32)
      >>> vit = ViTConfig(image_size=8, patch_size=4, num_classes=1, d_model=8, num_heads=2, d_ff=16,
      ...                 num_layers=1, pooling="mean")
      >>> m = VLM(VLMConfig(lm=lm, vit=vit, image_token_id=3), rngs=nnx.Rngs(0))
      >>> toks = jnp.array([[1, 3, 3, 3, 3, 5, 6]])
      >>> m(toks, images=jnp.zeros((1, 1, 8, 8, 1))).logits.shape
      (1, 7, 12)
    """

    def __init__(self, config: VLMConfig, *, rngs: nnx.Rngs):
        self.config = config
        D = config.lm.d_model
        hid = config.projector_hidden or D
        self.lm = Transformer(config.lm, rngs=rngs)
        self.vit = ViT(config.vit, rngs=rngs)
        self.img_proj1 = _linear(rngs, config.vit.d_model, hid)
        self.img_proj2 = _linear(rngs, hid, D)
        if config.audio_token_id is not None:
            self.aud1 = _linear(rngs, config.audio_frame_len, hid)
            self.aud2 = _linear(rngs, hid, D)
            self.aud_pos = nnx.Param(jax.random.normal(rngs.params(), (config.audio_frames, hid)) * 0.02)

    @property
    def num_image_tokens(self) -> int:
        return self.config.num_image_tokens

    def encode_images(self, images: jax.Array) -> jax.Array:
        """images [b, n_img, H, W, c] -> embeddings [b, n_img * P, D] in the LM's space."""
        if images.ndim != 5:
            raise ValueError(f"images must be [b, n_img, H, W, c]; got shape {tuple(images.shape)}")
        b, n = images.shape[:2]
        out = self.vit(images.reshape((b * n,) + images.shape[2:]), return_intermediates=True)
        h = self.vit.final_norm(out.intermediates["residuals"][-1])  # [b*n, P, E]
        z = self.img_proj2(jax.nn.gelu(self.img_proj1(h)))
        return z.reshape(b, n * z.shape[1], z.shape[2])

    def encode_audio(self, audio: jax.Array) -> jax.Array:
        """audio [b, n_clip, S, F] -> embeddings [b, n_clip * S, D]."""
        c = self.config
        if c.audio_token_id is None:
            raise ValueError("audio: this VLM has no audio encoder (VLMConfig.audio_token_id is None)")
        if audio.ndim != 4 or tuple(audio.shape[2:]) != (c.audio_frames, c.audio_frame_len):
            raise ValueError(f"audio must be [b, n_clip, {c.audio_frames}, {c.audio_frame_len}]; "
                             f"got shape {tuple(audio.shape)}")
        b, n = audio.shape[:2]
        h = jax.nn.gelu(self.aud1(audio) + self.aud_pos[...])
        return self.aud2(h).reshape(b, n * c.audio_frames, -1)

    def embed(self, tokens: jax.Array, images: jax.Array | None = None,
              audio: jax.Array | None = None) -> jax.Array:
        """Input embeddings [b, t, D]: token embeddings with placeholders replaced in order."""
        c = self.config
        x = jnp.take(self.lm.embed[...], tokens, axis=0).astype(c.lm.compute_dtype)
        for name, media, tid, enc in (("images", images, c.image_token_id, self.encode_images),
                                      ("audio", audio, c.audio_token_id, self.encode_audio)):
            if media is None:
                continue
            feats = enc(media).astype(x.dtype)  # [b, m, D]
            if feats.shape[0] != tokens.shape[0]:
                raise ValueError(f"{name}: batch {feats.shape[0]} != tokens batch {tokens.shape[0]}")
            is_ph = tokens == tid
            if not isinstance(tokens, jax.core.Tracer):
                counts = jnp.sum(is_ph, axis=1)
                if bool(jnp.any(counts != feats.shape[1])):
                    raise ValueError(f"tokens: every row needs {feats.shape[1]} placeholders (id {tid}) for "
                                     f"the {name}; got counts {counts.tolist()}")
            idx = jnp.clip(jnp.cumsum(is_ph, axis=1) - 1, 0, feats.shape[1] - 1)
            gathered = jnp.take_along_axis(feats, idx[..., None], axis=1)
            x = jnp.where(is_ph[..., None], gathered, x)
        return x

    def __call__(self, tokens: jax.Array, *, images: jax.Array | None = None, audio: jax.Array | None = None,
                 positions: jax.Array | None = None, cache: KVCache | None = None,
                 num_valid: jax.Array | None = None, logits_at: jax.Array | None = None,
                 return_intermediates: bool = False, attention_bias=None) -> VLMOutput:
        """Runs the VLM on `tokens` [b, t] with placeholders for `images` [b, n_img, H, W, c] and
        `audio` [b, n_clip, S, F] (same argument meanings as `Transformer.__call__`)."""
        if tokens.ndim != 2:
            raise ValueError(f"tokens must be [b, t]; got shape {tokens.shape}")
        check_token_ids("tokens", tokens, self.config.lm.vocab_size)
        return self.run_embeddings(self.embed(tokens, images, audio), positions=positions, cache=cache,
                                   num_valid=num_valid, logits_at=logits_at,
                                   return_intermediates=return_intermediates, attention_bias=attention_bias)

    def run_embeddings(self, x: jax.Array, *, positions=None, cache: KVCache | None = None, num_valid=None,
                       logits_at=None, return_intermediates: bool = False,
                       attention_bias=None) -> VLMOutput:
        """The LM's forward from input embeddings x [b, t, D] (`Transformer.__call__(input_embeddings=)`;
        the other arguments mean what they mean there)."""
        out = self.lm(jnp.zeros(x.shape[:2], jnp.int32), input_embeddings=x, positions=positions, cache=cache,
                      num_valid=None if num_valid is None else jnp.asarray(num_valid, jnp.int32),
                      logits_at=logits_at, return_intermediates=return_intermediates,
                      attention_bias=attention_bias)
        return VLMOutput(out.logits, out.cache, out.intermediates)

    def prefill(self, tokens: jax.Array, prompt_lengths: jax.Array, *, images=None, audio=None,
                capacity: int) -> tuple[KVCache, jax.Array]:
        """Writes each row's prompt except its last token into a fresh cache of `capacity`.

        Returns (cache, last [b, 1] int32): the last prompt token per row (must be text, not a
        placeholder), to be fed as the first decode input, e.g. `generate(vlm.lm, last, cache=cache)`.
        """
        prompt_lengths = jnp.asarray(prompt_lengths, jnp.int32)
        if not isinstance(prompt_lengths, jax.core.Tracer) and bool(jnp.any(prompt_lengths < 2)):
            raise ValueError(f"prompt_lengths: expected >= 2 per row; got {prompt_lengths.tolist()}")
        last = jnp.take_along_axis(tokens, (prompt_lengths - 1)[:, None], axis=1).astype(jnp.int32)
        placeholders = [i for i in (self.config.image_token_id, self.config.audio_token_id) if i is not None]
        if not isinstance(last, jax.core.Tracer) and bool(jnp.any(jnp.isin(last, jnp.asarray(placeholders)))):
            raise ValueError("tokens: the last prompt token of every row must be text, not a placeholder")
        cache = self.lm.init_cache(tokens.shape[0], capacity)
        # prefill all t tokens; the cache advances by prompt_length - 1 (later entries are overwritten)
        out = self(tokens, images=images, audio=audio, cache=cache, num_valid=prompt_lengths - 1,
                   logits_at=jnp.zeros((tokens.shape[0], 1), jnp.int32))
        return out.cache, last

    def generate_greedy(self, tokens: jax.Array, prompt_lengths: jax.Array, *, max_new_tokens: int,
                        images=None, audio=None) -> jax.Array:
        """Greedy continuation [b, max_new_tokens] int32 of right-padded prompts (no stop tokens)."""
        if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens: expected an int >= 1, got {max_new_tokens!r}")
        cache, last = self.prefill(tokens, prompt_lengths, images=images, audio=audio,
                                   capacity=tokens.shape[1] + max_new_tokens)
        graphdef, state = nnx.split(self.lm)
        return _greedy(graphdef, state, cache, last, max_new_tokens=max_new_tokens)


@functools.partial(jax.jit, static_argnames=("graphdef", "max_new_tokens"))
def _greedy(graphdef, state, cache, last, *, max_new_tokens):
    def step(carry, _):
        cache, prev = carry
        out = nnx.merge(graphdef, state)(prev, cache=cache)
        tok = jnp.argmax(out.logits[:, -1], axis=-1).astype(jnp.int32)
        return (out.cache, tok[:, None]), tok

    _, toks = jax.lax.scan(step, (cache, last), None, length=max_new_tokens)
    return toks.T
