"""A small Vision Transformer (ViT) in Flax NNX, built to be pruned and looked inside.

Dimension legend: `b` batch, `H`/`W` image height/width, `c` image channels, `p` patch size,
`P` patches (= (H/p) * (W/p)), `n` tokens (P, plus 1 with a class token), `D` model width,
`h` heads, `d` nominal head dim, `q` a layer's stored q/k width per head, `v` its stored v/o width
per head, `f` FFN hidden width, `K` classes, `L` layers.

Architecture (Dosovitskiy et al.; DeiT): non-overlapping p x p patches -> linear embedding,
an optional class token, learned position embeddings, L pre-norm blocks

    x = x + attn(LN(x))          multi-head self-attention through `primitives.attention.attention`
    x = x + fc2(gelu(fc1(LN(x)))) (non-causal, softmax scale d^{-1/2})

then a final LayerNorm, class-token or mean pooling, and a linear head.

Pruned widths (for `algorithms.compression.toast`): each layer's attention stores its weights
per head, `wq`/`wk` [D, h, q], `wv` [D, h, v], `wo` [h, v, D] (biases [h, q] / [h, v]), where the
per-head widths come from `ViTConfig.qk_dims` / `v_dims` (per layer, per head; default: all `d`).
A layer whose heads keep different widths stores the largest and multiplies each head's unused
slots by a static zero mask built from the config, so the model computes exactly what its kept
weights define and training never revives them. The softmax scale stays the *original*
`head_dim ** -0.5` after pruning, as in ToaSt's code (pruning removes terms from the dot product;
it does not rescale the rest). `ViTConfig.d_ffs` sets per-layer FFN widths (static FFN pruning).

What algorithms need from the model, all passed as arguments (no monkey-patching):

  * `head_mask` [L, h] or [L, b, h]: multiplies each head's output before the output projection;
  * `ffn_hook(layer, site, activations, attn_row) -> mask | None`: called at `site="fc1"` with
    the residual stream after attention [b, n, D] and at `site="fc2"` with the FFN hidden
    activations [b, n, f]; a returned mask ([D]/[f], or [b, D]/[b, f]) multiplies them. At "fc1"
    the masked stream *replaces the residual* (ToaSt's Token Channel Selection);
  * `token_hook(layer, x, attn_row) -> indices [b, k]`: after attention, keeps the listed
    tokens (in that order) for the FFN and every later block (token pruning baselines);
  * `attn_row` [b, n] is the head-averaged attention of the class token over the keys (class-token
    pooling), or, without a class token, the head- and query-averaged attention each key receives;
  * `return_intermediates=True`: residual streams after the embedding and every block, per-head
    attention outputs (after `head_mask`), and the attention rows.

Every parameter carries logical axis names, as in `models.transformer`.

References:
  Dosovitskiy et al., "An Image is Worth 16x16 Words: Transformers for Image Recognition at
  Scale", arXiv:2010.11929, 2020.
  Touvron et al., "Training data-efficient image transformers & distillation through attention"
  (DeiT), arXiv:2012.12877, 2020.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from primitives import attention as attn_lib
from primitives.validation import check_finite, check_int, check_integer_dtype, concrete_value

__all__ = ["ViTConfig", "ViT", "ViTOutput", "ViTAttention", "ViTBlock", "LayerNorm", "classification_loss",
           "FFNHook", "TokenHook", "POOLINGS"]

POOLINGS = ("cls", "mean")
FFN_SITES = ("fc1", "fc2")

FFNHook = Callable[[int, str, jax.Array, jax.Array | None], jax.Array | None]
TokenHook = Callable[[int, jax.Array, jax.Array | None], jax.Array]

_INT_FIELDS = ("image_size", "patch_size", "channels", "num_classes", "d_model", "num_heads", "d_ff", "num_layers")


def _check_widths(name: str, widths: Any, num_layers: int, num_heads: int, head_dim: int) -> None:
    """`widths` must be L tuples of h ints in [0, head_dim] (per-layer, per-head kept widths)."""
    if not isinstance(widths, tuple) or len(widths) != num_layers:
        raise ValueError(f"ViTConfig.{name} must be a tuple of num_layers={num_layers} per-layer tuples; "
                         f"got {widths!r}")
    for l, row in enumerate(widths):
        if not isinstance(row, tuple) or len(row) != num_heads:
            raise ValueError(f"ViTConfig.{name}[{l}] must be a tuple of num_heads={num_heads} ints; got {row!r}")
        for w in row:
            check_int(f"ViTConfig.{name}[{l}]", w)
            if not 0 <= w <= head_dim:
                raise ValueError(f"ViTConfig.{name}[{l}] entries must lie in [0, head_dim={head_dim}]; got {row}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ViTConfig:
    """Shape of the ViT, validated on construction (errors name the field, e.g. "ViTConfig.patch_size").

    Attributes:
      image_size: square image side H = W.
      patch_size: patch side p; must divide image_size.
      channels: image channels c.
      num_classes: classes K.
      d_model: residual width D.
      num_heads: heads h.
      head_dim: nominal per-head width d (default d_model // num_heads); the softmax scale is
        d ** -0.5 whatever the pruned widths.
      d_ff: FFN hidden width f (default of every layer).
      num_layers: blocks L.
      pooling: "cls" (class token, its final state feeds the head) or "mean" (no class token;
        mean of the final token states).
      dtype: compute dtype ("float32", "bfloat16", "float16"); parameters stay float32.
      norm_eps: LayerNorm epsilon.
      init_std: std of the position embeddings and class token.
      qk_dims: None (every head keeps `head_dim`) or per layer a tuple of per-head q/k widths in
        [0, head_dim] (a pruned model; written by `algorithms.compression.toast`).
      v_dims: the same for the v/o widths.
      d_ffs: None (every layer `d_ff`) or per-layer FFN widths >= 1.
    """

    image_size: int
    patch_size: int
    channels: int = 1
    num_classes: int
    d_model: int
    num_heads: int
    head_dim: int | None = None
    d_ff: int
    num_layers: int
    pooling: str = "cls"
    dtype: str = "float32"
    norm_eps: float = 1e-6
    init_std: float = 0.02
    qk_dims: tuple[tuple[int, ...], ...] | None = None
    v_dims: tuple[tuple[int, ...], ...] | None = None
    d_ffs: tuple[int, ...] | None = None

    def __post_init__(self):
        for name in _INT_FIELDS:
            check_int(f"ViTConfig.{name}", getattr(self, name))
            if getattr(self, name) < 1:
                raise ValueError(f"ViTConfig.{name} must be >= 1; got {getattr(self, name)}")
        if self.head_dim is not None:
            check_int("ViTConfig.head_dim", self.head_dim)
            if self.head_dim < 1:
                raise ValueError(f"ViTConfig.head_dim must be >= 1 or None; got {self.head_dim}")
        elif self.d_model % self.num_heads:
            raise ValueError(f"ViTConfig.d_model ({self.d_model}) must be divisible by ViTConfig.num_heads "
                             f"({self.num_heads}) unless head_dim is given")
        if self.image_size % self.patch_size:
            raise ValueError(f"ViTConfig.patch_size ({self.patch_size}) must divide ViTConfig.image_size "
                             f"({self.image_size})")
        if self.pooling not in POOLINGS:
            raise ValueError(f"ViTConfig.pooling must be one of {POOLINGS}; got {self.pooling!r}")
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"ViTConfig.dtype must be float32, bfloat16 or float16; got {self.dtype!r}")
        for name in ("norm_eps", "init_std"):
            check_finite(f"ViTConfig.{name}", getattr(self, name))
            if getattr(self, name) <= 0:
                raise ValueError(f"ViTConfig.{name} must be > 0; got {getattr(self, name)}")
        for name in ("qk_dims", "v_dims"):
            if getattr(self, name) is not None:
                _check_widths(name, getattr(self, name), self.num_layers, self.num_heads, self.resolved_head_dim)
        if self.d_ffs is not None:
            if not isinstance(self.d_ffs, tuple) or len(self.d_ffs) != self.num_layers:
                raise ValueError(f"ViTConfig.d_ffs must be a tuple of num_layers={self.num_layers} ints; "
                                 f"got {self.d_ffs!r}")
            for f in self.d_ffs:
                check_int("ViTConfig.d_ffs", f)
                if f < 1:
                    raise ValueError(f"ViTConfig.d_ffs entries must be >= 1; got {self.d_ffs}")

    @property
    def resolved_head_dim(self) -> int:
        return self.head_dim if self.head_dim is not None else self.d_model // self.num_heads

    @property
    def num_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    @property
    def num_tokens(self) -> int:
        return self.num_patches + (1 if self.pooling == "cls" else 0)

    @property
    def compute_dtype(self):
        return jnp.dtype(self.dtype)

    def layer_qk_dims(self, layer: int) -> tuple[int, ...]:
        """Per-head q/k widths of `layer`."""
        return self.qk_dims[layer] if self.qk_dims is not None else (self.resolved_head_dim,) * self.num_heads

    def layer_v_dims(self, layer: int) -> tuple[int, ...]:
        """Per-head v/o widths of `layer`."""
        return self.v_dims[layer] if self.v_dims is not None else (self.resolved_head_dim,) * self.num_heads

    def layer_d_ff(self, layer: int) -> int:
        """FFN hidden width of `layer`."""
        return self.d_ffs[layer] if self.d_ffs is not None else self.d_ff

    def num_params(self) -> int:
        """Parameter count (stored weights, including the zero-masked slots of ragged pruned layers)."""
        D, c, p, K = self.d_model, self.channels, self.patch_size, self.num_classes
        total = p * p * c * D + D + self.num_tokens * D + (D if self.pooling == "cls" else 0) + 2 * D + D * K + K
        for l in range(self.num_layers):
            q, v, f, h = max(self.layer_qk_dims(l)), max(self.layer_v_dims(l)), self.layer_d_ff(l), self.num_heads
            total += 4 * D + 2 * h * q * (D + 1) + h * v * (D + 1) + h * v * D + D + 2 * D * f + f + D
        return total


def _param(rngs: nnx.Rngs, shape: tuple[int, ...], axes: tuple[str | None, ...], std: float) -> nnx.Param:
    """A float32 normal(0, std) parameter with logical axis names."""
    return nnx.Param(std * jax.random.normal(rngs.params(), shape, jnp.float32), out_sharding=axes,
                     eager_sharding=False)


def _zeros(shape: tuple[int, ...], axes: tuple[str | None, ...]) -> nnx.Param:
    return nnx.Param(jnp.zeros(shape, jnp.float32), out_sharding=axes, eager_sharding=False)


class LayerNorm(nnx.Module):
    """y = (x - mean) / sqrt(var + eps) * scale + bias over the last axis, in float32."""

    def __init__(self, dim: int, *, eps: float = 1e-6):
        self.scale = nnx.Param(jnp.ones((dim,), jnp.float32), out_sharding=("norm",), eager_sharding=False)
        self.bias = _zeros((dim,), ("norm",))
        self.eps = eps

    def __call__(self, x: jax.Array) -> jax.Array:
        xf = x.astype(jnp.float32)
        mean = jnp.mean(xf, axis=-1, keepdims=True)
        var = jnp.mean(jnp.square(xf - mean), axis=-1, keepdims=True)
        y = (xf - mean) * jax.lax.rsqrt(var + self.eps)
        return (y * self.scale[...] + self.bias[...]).astype(x.dtype)


def _width_mask(widths: tuple[int, ...], stored: int) -> np.ndarray | None:
    """[h, stored] float mask of each head's used slots; None when every head uses all of them."""
    if all(w == stored for w in widths):
        return None
    return (np.arange(stored)[None, :] < np.asarray(widths)[:, None]).astype(np.float32)


def _per_head(mask: jax.Array) -> jax.Array:
    """[h] -> [1, 1, h, 1]; [b, h] -> [b, 1, h, 1]."""
    return mask[None, None, :, None] if mask.ndim == 1 else mask[:, None, :, None]


class ViTAttention(nnx.Module):
    """Non-causal multi-head self-attention with per-head (possibly pruned) q/k and v/o widths."""

    def __init__(self, config: ViTConfig, layer: int, *, rngs: nnx.Rngs):
        D, h, d = config.d_model, config.num_heads, config.resolved_head_dim
        self.qk_dims, self.v_dims = config.layer_qk_dims(layer), config.layer_v_dims(layer)
        q, v = max(self.qk_dims), max(self.v_dims)
        std = 1 / math.sqrt(D)
        self.wq = _param(rngs, (D, h, q), ("embed", "heads", "head_dim"), std)
        self.bq = _zeros((h, q), ("heads", "head_dim"))
        self.wk = _param(rngs, (D, h, q), ("embed", "heads", "head_dim"), std)
        self.bk = _zeros((h, q), ("heads", "head_dim"))
        self.wv = _param(rngs, (D, h, v), ("embed", "heads", "head_dim"), std)
        self.bv = _zeros((h, v), ("heads", "head_dim"))
        self.wo = _param(rngs, (h, v, D), ("heads", "head_dim", "embed"), 1 / math.sqrt(h * d))
        self.bo = _zeros((D,), ("embed",))
        self.scale = 1.0 / math.sqrt(d)
        self.dtype = config.compute_dtype
    def projections(self, x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        """(q [b, n, h, q], k [b, n, h, q], v [b, n, h, v]) with unused slots of ragged heads zeroed."""
        dt = self.dtype
        q = jnp.einsum("bnD,Dhd->bnhd", x, self.wq[...].astype(dt)) + self.bq[...].astype(dt)
        k = jnp.einsum("bnD,Dhd->bnhd", x, self.wk[...].astype(dt)) + self.bk[...].astype(dt)
        v = jnp.einsum("bnD,Dhd->bnhd", x, self.wv[...].astype(dt)) + self.bv[...].astype(dt)
        # Static zero masks of ragged pruned layers, rebuilt from the (static) widths at trace time.
        qk_mask, v_mask = _width_mask(self.qk_dims, q.shape[-1]), _width_mask(self.v_dims, v.shape[-1])
        if qk_mask is not None:
            q, k = q * jnp.asarray(qk_mask, dt), k * jnp.asarray(qk_mask, dt)
        if v_mask is not None:
            v = v * jnp.asarray(v_mask, dt)
        return q, k, v

    def __call__(self, x: jax.Array, *, head_mask: jax.Array | None = None,
                 attn_row: str | None = None) -> tuple[jax.Array, jax.Array, jax.Array | None]:
        """Returns (output [b, n, D], head outputs [b, n, h, v], attention row [b, n] or None).

        `attn_row`: None, "cls" (head-averaged attention of token 0 over the keys) or "received"
        (head- and query-averaged attention each key receives).
        """
        q, k, v = self.projections(x)
        dq, dv = q.shape[-1], v.shape[-1]
        width = max(dq, dv, 1)
        # The attention primitive takes one head width for q, k and v: zero-pad to the wider one
        # (zero q/k slots add 0 to the logits; zero v slots are sliced off).
        pad = lambda a: a if a.shape[-1] == width else jnp.pad(a, ((0, 0),) * 3 + ((0, width - a.shape[-1]),))
        heads = attn_lib.attention(pad(q), pad(k), pad(v), causal=False, scale=self.scale)[..., :dv]
        if head_mask is not None:
            heads = heads * _per_head(head_mask).astype(heads.dtype)
        wo = self.wo[...].astype(self.dtype)
        v_mask = _width_mask(self.v_dims, wo.shape[1])
        if v_mask is not None:
            wo = wo * jnp.asarray(v_mask, self.dtype)[:, :, None]
        out = jnp.einsum("bnhd,hdD->bnD", heads, wo) + self.bo[...].astype(self.dtype)
        row = None
        if attn_row is not None:
            qr = q[:, :1] if attn_row == "cls" else q
            logits = jnp.einsum("bthd,bshd->bhts", qr, k, preferred_element_type=jnp.float32) * self.scale
            probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
            row = probs[:, :, 0].mean(axis=1) if attn_row == "cls" else probs.mean(axis=(1, 2))
        return out, heads, row


class ViTBlock(nnx.Module):
    """Pre-norm block: x + attn(LN(x)); then (ffn hooks) x + fc2(gelu(fc1(LN(x))))."""

    def __init__(self, config: ViTConfig, layer: int, *, rngs: nnx.Rngs):
        D, f = config.d_model, config.layer_d_ff(layer)
        self.layer = layer
        self.norm1 = LayerNorm(D, eps=config.norm_eps)
        self.attn = ViTAttention(config, layer, rngs=rngs)
        self.norm2 = LayerNorm(D, eps=config.norm_eps)
        self.w1 = _param(rngs, (D, f), ("embed", "mlp"), 1 / math.sqrt(D))
        self.b1 = _zeros((f,), ("mlp",))
        self.w2 = _param(rngs, (f, D), ("mlp", "embed"), 1 / math.sqrt(f))
        self.b2 = _zeros((D,), ("embed",))
        self.dtype = config.compute_dtype
        self.row_kind = "cls" if config.pooling == "cls" else "received"

    def __call__(self, x: jax.Array, *, head_mask=None, ffn_hook: FFNHook | None = None,
                 token_hook: TokenHook | None = None, want_row: bool = False):
        need_row = want_row or ffn_hook is not None or token_hook is not None
        a, heads, row = self.attn(self.norm1(x), head_mask=head_mask, attn_row=self.row_kind if need_row else None)
        x = x + a
        if token_hook is not None:
            idx = jnp.asarray(token_hook(self.layer, x, row))
            if idx.ndim != 2 or idx.shape[0] != x.shape[0]:
                raise ValueError(f"token_hook must return [b={x.shape[0]}, k] token indices; got shape {idx.shape}")
            check_integer_dtype("token_hook indices", idx)
            x = jnp.take_along_axis(x, idx[:, :, None], axis=1)
            row = jnp.take_along_axis(row, idx, axis=1)
        if ffn_hook is not None:
            m = ffn_hook(self.layer, "fc1", x, row)
            if m is not None:
                x = x * _channel_mask(m, x)  # the residual stream itself keeps only the selected channels
        dt = self.dtype
        hidden = jax.nn.gelu(self.norm2(x) @ self.w1[...].astype(dt) + self.b1[...].astype(dt), approximate=False)
        if ffn_hook is not None:
            m = ffn_hook(self.layer, "fc2", hidden, row)
            if m is not None:
                hidden = hidden * _channel_mask(m, hidden)
        x = x + hidden @ self.w2[...].astype(dt) + self.b2[...].astype(dt)
        return x, heads, row


def _channel_mask(mask: jax.Array, x: jax.Array) -> jax.Array:
    """[C] -> [1, 1, C]; [b, C] -> [b, 1, C] (checked against x [b, n, C])."""
    mask = jnp.asarray(mask)
    b, _, C = x.shape
    if mask.shape not in ((C,), (b, C)):
        raise ValueError(f"ffn_hook must return a mask of shape ({C},) or ({b}, {C}); got {mask.shape}")
    return (mask[None, None] if mask.ndim == 1 else mask[:, None]).astype(x.dtype)


class ViTOutput(NamedTuple):
    """Result of a forward pass.

    Attributes:
      logits: [b, K] float32.
      intermediates: None, or (with `return_intermediates`) a dict with `residuals` (after the
        embedding and every block), `head_outputs` (per layer [b, n, h, v], after `head_mask`) and
        `attn_rows` (per layer [b, n] float32). Each is an array stacked over layers ([L+1, ...] /
        [L, ...]) when every layer has the same shape (always for an unpruned model without token
        pruning), else a tuple of per-layer arrays.
    """

    logits: jax.Array
    intermediates: dict[str, Any] | None


def _stack_or_tuple(arrays: list[jax.Array]) -> jax.Array | tuple[jax.Array, ...]:
    return jnp.stack(arrays) if len({a.shape for a in arrays}) == 1 else tuple(arrays)


class ViT(nnx.Module):
    """Vision Transformer classifier. See the module docstring for the hooks it exposes.

    Examples:
      >>> from flax import nnx
      >>> import jax.numpy as jnp
      >>> cfg = ViTConfig(image_size=8, patch_size=4, num_classes=3, d_model=8, num_heads=2,
      ...                 d_ff=16, num_layers=1)
      >>> ViT(cfg, rngs=nnx.Rngs(0))(jnp.zeros((2, 8, 8, 1))).logits.shape
      (2, 3)
    """

    def __init__(self, config: ViTConfig, *, rngs: nnx.Rngs):
        c = config
        D = c.d_model
        self.config = c
        self.patch_w = _param(rngs, (c.patch_size * c.patch_size * c.channels, D), (None, "embed"),
                              1 / math.sqrt(c.patch_size * c.patch_size * c.channels))
        self.patch_b = _zeros((D,), ("embed",))
        if c.pooling == "cls":
            self.cls_token = _param(rngs, (D,), ("embed",), c.init_std)
        self.pos_embed = _param(rngs, (c.num_tokens, D), (None, "embed"), c.init_std)
        self.layers = nnx.List([ViTBlock(c, l, rngs=rngs) for l in range(c.num_layers)])
        self.final_norm = LayerNorm(D, eps=c.norm_eps)
        self.head_w = _param(rngs, (D, c.num_classes), ("embed", None), 1 / math.sqrt(D))
        self.head_b = _zeros((c.num_classes,), (None,))

    def patchify(self, images: jax.Array) -> jax.Array:
        """[b, H, W, c] -> [b, P, p*p*c] patches in row-major patch order (each patch row-major, channels last)."""
        c = self.config
        expected = (c.image_size, c.image_size, c.channels)
        if images.ndim != 4 or tuple(images.shape[1:]) != expected:
            raise ValueError(f"images must have shape [b, {expected[0]}, {expected[1]}, {expected[2]}]; "
                             f"got {tuple(images.shape)}")
        if not jnp.issubdtype(images.dtype, jnp.floating):
            raise TypeError(f"images must be a float array; got dtype {images.dtype}")
        b, g, p = images.shape[0], c.image_size // c.patch_size, c.patch_size
        x = images.reshape(b, g, p, g, p, c.channels).transpose(0, 1, 3, 2, 4, 5)
        return x.reshape(b, g * g, p * p * c.channels)

    def embed(self, images: jax.Array) -> jax.Array:
        """Patch embedding, class token and position embeddings: [b, n, D]."""
        c, dt = self.config, self.config.compute_dtype
        x = self.patchify(images).astype(dt) @ self.patch_w[...].astype(dt) + self.patch_b[...].astype(dt)
        if c.pooling == "cls":
            cls = jnp.broadcast_to(self.cls_token[...].astype(dt), (x.shape[0], 1, c.d_model))
            x = jnp.concatenate([cls, x], axis=1)
        return x + self.pos_embed[...].astype(dt)

    def __call__(
        self,
        images: jax.Array,
        *,
        head_mask: jax.Array | None = None,
        ffn_hook: FFNHook | None = None,
        token_hook: TokenHook | None = None,
        return_intermediates: bool = False,
    ) -> ViTOutput:
        """Classifies `images` [b, H, W, c] (float).

        Args:
          images: [b, image_size, image_size, channels] float images.
          head_mask: [L, h] or [L, b, h] multipliers of the head outputs.
          ffn_hook: `(layer, site, activations, attn_row) -> mask or None` (see the module docstring).
          token_hook: `(layer, x, attn_row) -> [b, k] int token indices` kept after that layer's attention.
          return_intermediates: also return residuals, head outputs and attention rows.

        Returns:
          ViTOutput.

        Raises:
          ValueError / TypeError: naming the argument, for a wrong image shape or dtype, or a head
            mask of the wrong shape.
        """
        c = self.config
        x = self.embed(images)
        b = x.shape[0]
        if head_mask is not None:
            shapes = [(c.num_layers, c.num_heads), (c.num_layers, b, c.num_heads)]
            if tuple(head_mask.shape) not in shapes:
                raise ValueError(f"head_mask must have one of the shapes {shapes}; got {tuple(head_mask.shape)}")
        residuals, heads_all, rows = [x], [], []
        for l, layer in enumerate(self.layers):
            x, heads, row = layer(x, head_mask=None if head_mask is None else head_mask[l], ffn_hook=ffn_hook,
                                  token_hook=token_hook, want_row=return_intermediates)
            if return_intermediates:
                residuals.append(x)
                heads_all.append(heads)
                rows.append(row)
        x = self.final_norm(x)
        pooled = x[:, 0] if c.pooling == "cls" else x.mean(axis=1)
        logits = (pooled @ self.head_w[...].astype(c.compute_dtype) + self.head_b[...].astype(c.compute_dtype))
        intermediates = None
        if return_intermediates:
            intermediates = {"residuals": _stack_or_tuple(residuals), "head_outputs": _stack_or_tuple(heads_all),
                             "attn_rows": _stack_or_tuple(rows)}
        return ViTOutput(logits.astype(jnp.float32), intermediates)


CLASSIFICATION_KEYS = ("image", "label")


def classification_loss(model: ViT, batch: Mapping[str, jax.Array], *, ffn_hook: FFNHook | None = None,
                        token_hook: TokenHook | None = None) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Mean softmax cross-entropy of the labels; usable as `algorithms.training.fit(loss_fn=...)`.

    Args:
      model: a `ViT`.
      batch: {"image": [b, H, W, c] float, "label": [b] int in [0, num_classes)} (other keys ignored).
      ffn_hook, token_hook: passed to the model (bind them with `functools.partial`).

    Returns:
      (loss, {"loss", "accuracy"}).

    Raises:
      ValueError: a missing key, or labels of the wrong shape / concrete labels out of range.
      TypeError: non-integer labels.
    """
    missing = [k for k in CLASSIFICATION_KEYS if k not in batch]
    if missing:
        raise ValueError(f"batch must have the keys {list(CLASSIFICATION_KEYS)} for classification_loss; "
                         f"missing {missing}, got keys {sorted(batch)}")
    images, labels = batch["image"], batch["label"]
    check_integer_dtype('batch["label"]', labels)
    if labels.ndim != 1 or labels.shape[0] != images.shape[0]:
        raise ValueError(f'batch["label"] must have shape [b={images.shape[0]}]; got {tuple(labels.shape)}')
    arr = concrete_value(labels)  # values only when concrete (not traced inside the jitted step)
    if arr is not None and arr.size and (arr.min() < 0 or arr.max() >= model.config.num_classes):
        raise ValueError(f'batch["label"] must be class ids in [0, num_classes={model.config.num_classes}); '
                         f"got min {arr.min()}, max {arr.max()}")
    logits = model(images, ffn_hook=ffn_hook, token_hook=token_hook).logits
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
    accuracy = (jnp.argmax(logits, -1) == labels).astype(jnp.float32).mean()
    return loss, {"loss": loss, "accuracy": accuracy}
