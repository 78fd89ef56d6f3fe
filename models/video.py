"""A small chunk-autoregressive video transformer with an explicit per-layer KV history.

Dimension legend: ``b`` batch, ``F`` frames (one frame = one chunk), ``n`` patch tokens per frame,
``P`` pixels per patch, ``D`` model width, ``h`` heads, ``d`` head dim, ``s`` history tokens.

The tokens of frame ``f`` (patch pixels embedded, plus a learned spatial and a learned frame
embedding) attend to every token of frames ``<= f`` (block-causal attention) and their outputs
regress the patches of frame ``f + 1``. That is the chunk-wise generation of autoregressive video
models (Self-Forcing, LongCat-Video) without the diffusion sampler: generation is a loop of
:meth:`VideoTransformer.step` calls, each reading the keys and values of all earlier frames from a
cache and returning those of the new frame, which is where KV-cache quantization (QVG and its
baselines) plugs in.

Training uses :meth:`VideoTransformer.__call__` on whole clips (teacher forcing) with
:func:`next_frame_loss`; ``step`` over the same frames gives the same outputs (tested).

Example:
    >>> import jax.numpy as jnp
    >>> from flax import nnx
    >>> cfg = VideoConfig(patch_pixels=16, tokens_per_frame=4, max_frames=3, d_model=32, num_heads=2,
    ...                   num_layers=1)
    >>> model = VideoTransformer(cfg, rngs=nnx.Rngs(0))
    >>> pred, kv = model(jnp.zeros((2, 3, 4, 16)))
    >>> pred.shape, kv[0][0].shape                      # next-frame patches; layer 0 keys [b, F n, h, d]
    ((2, 3, 4, 16), (2, 12, 2, 16))
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from primitives import attention as attn

__all__ = ["VideoConfig", "VideoTransformer", "next_frame_loss"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class VideoConfig:
    """Shape of the video model.

    Attributes:
      patch_pixels: P, pixels per patch token (e.g. 16 for 4 x 4 patches).
      tokens_per_frame: n, patches per frame.
      max_frames: frames the frame embedding covers.
      d_model, num_heads, num_layers, mlp_ratio: transformer size (head dim = d_model / num_heads).
    """

    patch_pixels: int
    tokens_per_frame: int
    max_frames: int
    d_model: int = 128
    num_heads: int = 2
    num_layers: int = 2
    mlp_ratio: int = 4

    def __post_init__(self):
        if self.d_model % self.num_heads:
            raise ValueError(f"num_heads must divide d_model; got d_model={self.d_model}, num_heads={self.num_heads}")
        for name in ("patch_pixels", "tokens_per_frame", "max_frames", "num_layers", "mlp_ratio"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1; got {getattr(self, name)}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads


class _Block(nnx.Module):
    def __init__(self, cfg: VideoConfig, *, rngs: nnx.Rngs):
        d = cfg.d_model
        self.cfg = cfg
        self.ln1 = nnx.LayerNorm(d, rngs=rngs)
        self.qkv = nnx.Linear(d, 3 * d, rngs=rngs)
        self.proj = nnx.Linear(d, d, rngs=rngs)
        self.ln2 = nnx.LayerNorm(d, rngs=rngs)
        self.up = nnx.Linear(d, cfg.mlp_ratio * d, rngs=rngs)
        self.down = nnx.Linear(cfg.mlp_ratio * d, d, rngs=rngs)

    def qkv_heads(self, x):
        b, t, _ = x.shape
        q, k, v = jnp.split(self.qkv(self.ln1(x)), 3, axis=-1)
        shape = (b, t, self.cfg.num_heads, self.cfg.head_dim)
        return q.reshape(shape), k.reshape(shape), v.reshape(shape)

    def finish(self, x, o):
        x = x + self.proj(o.reshape(*x.shape[:2], -1))
        return x + self.down(jax.nn.gelu(self.up(self.ln2(x))))


class VideoTransformer(nnx.Module):
    """Predicts frame f + 1 from frames <= f (see the module docstring)."""

    def __init__(self, cfg: VideoConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.embed = nnx.Linear(cfg.patch_pixels, cfg.d_model, rngs=rngs)
        init = nnx.initializers.normal(0.02)
        self.space = nnx.Param(init(rngs.params(), (cfg.tokens_per_frame, cfg.d_model)))
        self.time = nnx.Param(init(rngs.params(), (cfg.max_frames, cfg.d_model)))
        self.blocks = nnx.List([_Block(cfg, rngs=rngs) for _ in range(cfg.num_layers)])
        self.ln = nnx.LayerNorm(cfg.d_model, rngs=rngs)
        self.head = nnx.Linear(cfg.d_model, cfg.patch_pixels, rngs=rngs)

    def _tokens(self, patches, frame_ids):
        """patches [b, f, n, P], frame ids [f] -> [b, f n, D]."""
        b, f, n, _ = patches.shape
        x = self.embed(patches) + self.space[...][None, None] + self.time[...][frame_ids][None, :, None]
        return x.reshape(b, f * n, -1)

    def __call__(self, patches: jax.Array, *, return_queries: bool = False):
        """Teacher-forced pass over whole clips.

        Args:
          patches: [b, F, n, P] frames as patch tokens.
          return_queries: also return every layer's queries [b, F n, h, d].

        Returns:
          (predictions [b, F, n, P] of frames 1..F, per layer (keys, values) [b, F n, h, d]), and the
          per-layer queries with `return_queries`.
        """
        b, f, n, _ = patches.shape
        if f > self.cfg.max_frames or n != self.cfg.tokens_per_frame:
            raise ValueError(f"patches must be [b, <= {self.cfg.max_frames}, {self.cfg.tokens_per_frame}, P]; "
                             f"got {patches.shape}")
        x = self._tokens(patches, jnp.arange(f))
        frame = jnp.repeat(jnp.arange(f), n)
        mask = (frame[:, None] >= frame[None, :])[None, None]  # block-causal [1, 1, T, T]
        kvs, queries = [], []
        for blk in self.blocks:
            q, k, v = blk.qkv_heads(x)
            kvs.append((k, v))
            queries.append(q)
            x = blk.finish(x, attn.attention(q, k, v, mask=mask))
        pred = self.head(self.ln(x)).reshape(b, f, n, -1)
        return (pred, kvs, queries) if return_queries else (pred, kvs)

    def step(self, patches: jax.Array, frame_index: int | jax.Array, history=None,
             history_length: int | jax.Array | None = None):
        """One chunk: the tokens of frame ``frame_index`` attend to themselves and to ``history``.

        Args:
          patches: [b, n, P] the frame.
          frame_index: its index (for the frame embedding).
          history: None or per layer (keys, values) [b, s, h, d] of the earlier frames (e.g. read
            back from a quantized cache), possibly padded to a fixed capacity s.
          history_length: valid history tokens (default: all s); entries past it are ignored, so a
            jitted step with a fixed-capacity history compiles once for every frame.

        Returns:
          (prediction [b, n, P] of the next frame, per layer (keys, values) [b, n, h, d] of this frame).
        """
        x = self._tokens(patches[:, None], jnp.asarray(frame_index)[None])
        b, n = x.shape[:2]
        lengths = None
        if history is not None:
            s = history[0][0].shape[1]
            valid = s if history_length is None else history_length
            lengths = jnp.full((b,), n, jnp.int32) + jnp.asarray(valid, jnp.int32)
        new = []
        for i, blk in enumerate(self.blocks):
            q, k, v = blk.qkv_heads(x)
            new.append((k, v))
            if history is not None:  # own tokens first, then the history: padding stays at the end
                k = jnp.concatenate([k, history[i][0].astype(k.dtype)], axis=1)
                v = jnp.concatenate([v, history[i][1].astype(v.dtype)], axis=1)
            x = blk.finish(x, attn.attention(q, k, v, kv_lengths=lengths))
        return self.head(self.ln(x)), new


def next_frame_loss(model: VideoTransformer, batch) -> tuple[jax.Array, dict]:
    """MSE of the predictions of frames 1..F-1 from frames 0..F-2; batch["patches"] [b, F, n, P]."""
    patches = batch["patches"]
    pred, _ = model(patches[:, :-1])
    loss = jnp.mean((pred - patches[:, 1:]) ** 2)
    return loss, {"loss": loss, "psnr": -10.0 * jnp.log10(jnp.maximum(loss, 1e-12))}
