"""Vision-RWKV (VRWKV) in Flax NNX: the block (Spatial-Mix with Q-Shift + Bi-WKV, Channel-Mix) and a small
dense-prediction backbone.

Dimension legend: ``b`` batch, ``H`` x ``W`` image, ``c`` image channels, ``p`` patch side, ``gh`` x ``gw``
patch grid, ``T`` tokens (= gh * gw, row-major), ``D`` width, ``K`` classes.

Block (spec papers/specs/vision_weights_envs.md section 2, "Background A", read from the official
Vision-RWKV code), pre-norm, with an extra LayerNorm ``ln0`` at layer 0:

    Spatial-Mix:  xx = QShift(x);  x_* = x mu_* + xx (1 - mu_*)  for * in k, v, r
                  k = x_k W_k, v = x_v W_v, r = x_r W_r             (no bias)
                  out = (sigmoid(r) * BiWKV(w / T, u / T, k, v)) W_o
    Channel-Mix:  out = sigmoid(x_r W_r) * (ReLU(x_k W_k)^2 W_v),   hidden = hidden_ratio * D
    x = x + SpatialMix(LN1(x));  x = x + ChannelMix(LN2(x))

with the "fancy" initialisation of w (spatial_decay), u (spatial_first) and the mu's (see `fancy_init`),
PyTorch's default Linear init (uniform +-1/sqrt(fan_in)) for the projections (what the official backbone
effectively runs; spec note), no key-norm, no layer-scale, no drop-path (VRWKV-T settings).
Bi-WKV runs through the dispatcher `pallas_kernels.wkv.bi_wkv` (``VRWKVConfig.wkv_implementation``:
"xla" = the linear-time scan, the CPU path; "pallas"/"auto" = the kernel) or, with "quadratic", through
the O(T^2) softmax oracle `primitives.linear_attention.bi_wkv_reference` (for tests).

Backbone (`VRWKVSegmenter`; [INFER] a light head for dense prediction, the paper uses UperNet + adapter):
non-overlapping p x p patch embedding, learned absolute position embedding, L blocks, a final
LayerNorm, and a per-token linear head to p * p * K logits reshaped (pixel shuffle) to [b, H, W, K].

References:
  Duan et al., "Vision-RWKV: Efficient and Scalable Visual Perception with RWKV-Like Architectures",
  arXiv:2403.02308, 2024.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from pallas_kernels import wkv as wkv_kernels
from primitives import linear_attention as la

__all__ = ["VRWKVConfig", "SpatialMix", "ChannelMix", "VRWKVBlock", "VRWKVSegmenter", "LayerNorm", "fancy_init",
           "bi_wkv_tokens", "patchify", "unpatchify_logits", "WKV_IMPLEMENTATIONS", "linear_param"]

WKV_IMPLEMENTATIONS = ("xla", "auto", "pallas", "quadratic")


@dataclasses.dataclass(frozen=True, kw_only=True)
class VRWKVConfig:
    """Shape of a VRWKV segmenter (errors name the field).

    Attributes:
      image_size: square image side H = W.
      patch_size: p; must divide image_size.
      channels: image channels c.
      num_classes: K.
      d_model: D (>= 4, for the four Q-Shift channel groups).
      num_layers: L.
      hidden_ratio: Channel-Mix hidden width / D.
      wkv_implementation: "xla" | "auto" | "pallas" (through `pallas_kernels.wkv.bi_wkv`) or "quadratic"
        (the O(T^2) oracle).
      norm_eps: LayerNorm epsilon (PyTorch's default 1e-5).
    """

    image_size: int
    patch_size: int
    channels: int = 1
    num_classes: int
    d_model: int
    num_layers: int
    hidden_ratio: int = 4
    wkv_implementation: str = "xla"
    norm_eps: float = 1e-5

    def __post_init__(self):
        for name in ("image_size", "patch_size", "channels", "num_classes", "d_model", "num_layers", "hidden_ratio"):
            val = getattr(self, name)
            if not isinstance(val, (int, np.integer)) or val < 1:
                raise ValueError(f"VRWKVConfig.{name} must be a positive int; got {val!r}")
        if self.image_size % self.patch_size:
            raise ValueError(f"VRWKVConfig.patch_size ({self.patch_size}) must divide VRWKVConfig.image_size "
                             f"({self.image_size})")
        if self.d_model < 4:
            raise ValueError(f"VRWKVConfig.d_model must be >= 4 (four Q-Shift groups); got {self.d_model}")
        if self.wkv_implementation not in WKV_IMPLEMENTATIONS:
            raise ValueError(f"VRWKVConfig.wkv_implementation must be one of {WKV_IMPLEMENTATIONS}; got "
                             f"{self.wkv_implementation!r}")

    @property
    def grid(self) -> int:
        return self.image_size // self.patch_size

    @property
    def num_tokens(self) -> int:
        return self.grid ** 2


def fancy_init(layer: int, num_layers: int, channels: int) -> dict[str, np.ndarray]:
    """Vision-RWKV's initial w, u, mu_k, mu_v, mu_r (each [channels], float32) for `layer` of `num_layers`.

    ``w_h = -5 + 8 (h / (C-1))^(0.7 + 1.3 l / (L-1))``, ``u_h = log(0.3) + 0.5 ((h+1) mod 3 - 1)``,
    ``mu_k = (h/C)^(1 - l/L)``, ``mu_v = mu_k + 0.3 l / (L-1)``, ``mu_r = (h/C)^(0.5 (1 - l/L))`` (spec,
    "Fancy init"; 0/0 ratios for L = 1 or C = 1 are taken as 0).
    """
    h = np.arange(channels, dtype=np.float64)
    r01 = layer / (num_layers - 1) if num_layers > 1 else 0.0
    r1a = 1.0 - layer / num_layers
    hc = h / (channels - 1) if channels > 1 else np.zeros_like(h)
    w = -5.0 + 8.0 * hc ** (0.7 + 1.3 * r01)
    u = math.log(0.3) + 0.5 * (((h + 1) % 3) - 1)
    frac = h / channels
    mu_k = frac ** r1a
    mu_v = frac ** r1a + 0.3 * r01
    mu_r = frac ** (0.5 * r1a)
    return {k: v.astype(np.float32) for k, v in dict(w=w, u=u, mu_k=mu_k, mu_v=mu_v, mu_r=mu_r).items()}


def linear_param(rngs: nnx.Rngs, fan_in: int, fan_out: int, axes=("embed", "mlp")) -> nnx.Param:
    """[fan_in, fan_out] weight, uniform +-1/sqrt(fan_in) (PyTorch's default Linear init)."""
    bound = 1.0 / math.sqrt(fan_in)
    return nnx.Param(jax.random.uniform(rngs.params(), (fan_in, fan_out), jnp.float32, -bound, bound),
                     out_sharding=axes, eager_sharding=False)


def _vec(value, axes=("embed",)) -> nnx.Param:
    return nnx.Param(jnp.asarray(value, jnp.float32), out_sharding=axes, eager_sharding=False)


class LayerNorm(nnx.Module):
    """LayerNorm over the last axis with learned scale and bias."""

    def __init__(self, dim: int, *, eps: float = 1e-5):
        self.scale = _vec(np.ones(dim, np.float32), ("norm",))
        self.bias = _vec(np.zeros(dim, np.float32), ("norm",))
        self.eps = eps

    def __call__(self, x: jax.Array) -> jax.Array:
        mean = jnp.mean(x, axis=-1, keepdims=True)
        var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
        return (x - mean) * jax.lax.rsqrt(var + self.eps) * self.scale[...] + self.bias[...]


def bi_wkv_tokens(w: jax.Array, u: jax.Array, k: jax.Array, v: jax.Array, *, implementation: str) -> jax.Array:
    """Bi-WKV of k, v [b, T, D] with per-channel w, u [D] (already divided by T), by `implementation`
    ("quadratic" = `primitives.linear_attention.bi_wkv_reference`; else `pallas_kernels.wkv.bi_wkv`)."""
    if implementation == "quadratic":
        return la.bi_wkv_reference(w, u, k, v)
    if implementation not in WKV_IMPLEMENTATIONS:
        raise ValueError(f"implementation must be one of {WKV_IMPLEMENTATIONS}; got {implementation!r}")
    return wkv_kernels.bi_wkv(w, u, k, v, implementation=implementation)


def shift_lerp(x: jax.Array, mu: jax.Array, *, height: int, width: int) -> jax.Array:
    """``x mu + QShift(x) (1 - mu)`` for tokens x [b, T, D] on a height x width grid."""
    xx = la.q_shift(x, height=height, width=width)
    return x * mu + xx * (1.0 - mu)


class SpatialMix(nnx.Module):
    """Spatial-Mix of Vision-RWKV: Q-Shift lerps, k/v/r projections, Bi-WKV, receptance gate, output projection."""

    def __init__(self, d_model: int, layer: int, num_layers: int, *, implementation: str = "xla", rngs: nnx.Rngs):
        init = fancy_init(layer, num_layers, d_model)
        self.spatial_decay = _vec(init["w"])
        self.spatial_first = _vec(init["u"])
        self.mu_k, self.mu_v, self.mu_r = _vec(init["mu_k"]), _vec(init["mu_v"]), _vec(init["mu_r"])
        self.w_k = linear_param(rngs, d_model, d_model, ("embed", "mlp"))
        self.w_v = linear_param(rngs, d_model, d_model, ("embed", "mlp"))
        self.w_r = linear_param(rngs, d_model, d_model, ("embed", "mlp"))
        self.w_o = linear_param(rngs, d_model, d_model, ("mlp", "embed"))
        self.implementation = implementation

    def __call__(self, x: jax.Array, *, height: int, width: int) -> jax.Array:
        """x [b, T, D] (T = height * width) -> [b, T, D]."""
        t = x.shape[-2]
        k = shift_lerp(x, self.mu_k[...], height=height, width=width) @ self.w_k[...]
        v = shift_lerp(x, self.mu_v[...], height=height, width=width) @ self.w_v[...]
        r = shift_lerp(x, self.mu_r[...], height=height, width=width) @ self.w_r[...]
        y = bi_wkv_tokens(self.spatial_decay[...] / t, self.spatial_first[...] / t, k, v,
                          implementation=self.implementation)
        return (jax.nn.sigmoid(r) * y) @ self.w_o[...]


class ChannelMix(nnx.Module):
    """Channel-Mix: ``sigmoid(x_r W_r) * (ReLU(x_k W_k)^2 W_v)`` with Q-Shift lerps."""

    def __init__(self, d_model: int, layer: int, num_layers: int, *, hidden_ratio: int = 4, rngs: nnx.Rngs):
        init = fancy_init(layer, num_layers, d_model)
        self.mu_k, self.mu_r = _vec(init["mu_k"]), _vec(init["mu_r"])
        hidden = hidden_ratio * d_model
        self.w_k = linear_param(rngs, d_model, hidden, ("embed", "mlp"))
        self.w_v = linear_param(rngs, hidden, d_model, ("mlp", "embed"))
        self.w_r = linear_param(rngs, d_model, d_model, ("embed", "mlp"))

    def __call__(self, x: jax.Array, *, height: int, width: int) -> jax.Array:
        xk = shift_lerp(x, self.mu_k[...], height=height, width=width)
        xr = shift_lerp(x, self.mu_r[...], height=height, width=width)
        return jax.nn.sigmoid(xr @ self.w_r[...]) * (jnp.square(jax.nn.relu(xk @ self.w_k[...])) @ self.w_v[...])


class VRWKVBlock(nnx.Module):
    """Pre-norm VRWKV block (extra ``ln0`` at layer 0): x + SpatialMix(LN1(x)), then x + ChannelMix(LN2(x))."""

    def __init__(self, d_model: int, layer: int, num_layers: int, *, hidden_ratio: int = 4,
                 implementation: str = "xla", eps: float = 1e-5, rngs: nnx.Rngs):
        self.ln0 = LayerNorm(d_model, eps=eps) if layer == 0 else None
        self.ln1 = LayerNorm(d_model, eps=eps)
        self.att = SpatialMix(d_model, layer, num_layers, implementation=implementation, rngs=rngs)
        self.ln2 = LayerNorm(d_model, eps=eps)
        self.ffn = ChannelMix(d_model, layer, num_layers, hidden_ratio=hidden_ratio, rngs=rngs)

    def __call__(self, x: jax.Array, *, height: int, width: int) -> jax.Array:
        """x [b, T, D] -> [b, T, D]; T must equal height * width."""
        if x.ndim != 3 or x.shape[1] != height * width:
            raise ValueError(f"x must have shape [b, T = height * width = {height * width}, D]; got {x.shape}")
        if self.ln0 is not None:
            x = self.ln0(x)
        x = x + self.att(self.ln1(x), height=height, width=width)
        return x + self.ffn(self.ln2(x), height=height, width=width)


def patchify(images: jax.Array, patch: int) -> jax.Array:
    """[b, H, W, c] -> [b, (H/p)(W/p), p*p*c], row-major patches (each row-major, channels last)."""
    b, h, w, c = images.shape
    x = images.reshape(b, h // patch, patch, w // patch, patch, c).transpose(0, 1, 3, 2, 4, 5)
    return x.reshape(b, (h // patch) * (w // patch), patch * patch * c)


def unpatchify_logits(x: jax.Array, *, grid: int, patch: int, classes: int) -> jax.Array:
    """[b, grid^2, p*p*K] per-token logits -> [b, grid*p, grid*p, K] (the inverse of `patchify`)."""
    b = x.shape[0]
    x = x.reshape(b, grid, grid, patch, patch, classes).transpose(0, 1, 3, 2, 4, 5)
    return x.reshape(b, grid * patch, grid * patch, classes)


class VRWKVSegmenter(nnx.Module):
    """Patch embedding -> position embedding -> L VRWKV blocks -> LayerNorm -> per-pixel logits.

    Examples:
      >>> from flax import nnx
      >>> import jax.numpy as jnp
      >>> cfg = VRWKVConfig(image_size=8, patch_size=4, num_classes=3, d_model=8, num_layers=1)
      >>> VRWKVSegmenter(cfg, rngs=nnx.Rngs(0))(jnp.zeros((2, 8, 8, 1))).shape
      (2, 8, 8, 3)
    """

    def __init__(self, config: VRWKVConfig, *, rngs: nnx.Rngs):
        c = config
        self.config = c
        self.patch_w = linear_param(rngs, c.patch_size ** 2 * c.channels, c.d_model, (None, "embed"))
        self.patch_b = _vec(np.zeros(c.d_model, np.float32))
        self.pos_embed = nnx.Param(0.02 * jax.random.normal(rngs.params(), (c.num_tokens, c.d_model)),
                                   out_sharding=(None, "embed"), eager_sharding=False)
        self.blocks = nnx.List([VRWKVBlock(c.d_model, l, c.num_layers, hidden_ratio=c.hidden_ratio,
                                           implementation=c.wkv_implementation, eps=c.norm_eps, rngs=rngs)
                                for l in range(c.num_layers)])
        self.norm = LayerNorm(c.d_model, eps=c.norm_eps)
        self.head_w = linear_param(rngs, c.d_model, c.patch_size ** 2 * c.num_classes, ("embed", None))
        self.head_b = _vec(np.zeros(c.patch_size ** 2 * c.num_classes, np.float32), (None,))

    def check_images(self, images: jax.Array, name: str = "images") -> None:
        c = self.config
        expected = (c.image_size, c.image_size, c.channels)
        if images.ndim != 4 or tuple(images.shape[1:]) != expected:
            raise ValueError(f"{name} must have shape [b, {expected[0]}, {expected[1]}, {expected[2]}]; got "
                             f"{tuple(images.shape)}")
        if not jnp.issubdtype(images.dtype, jnp.floating):
            raise TypeError(f"{name} must be a float array; got dtype {images.dtype}")

    def features(self, images: jax.Array) -> jax.Array:
        """images [b, H, W, c] -> token features [b, T, D] after the blocks (before the final norm)."""
        self.check_images(images)
        c = self.config
        x = patchify(images, c.patch_size) @ self.patch_w[...] + self.patch_b[...] + self.pos_embed[...]
        for block in self.blocks:
            x = block(x, height=c.grid, width=c.grid)
        return x

    def decode(self, tokens: jax.Array) -> jax.Array:
        """Token features [b, T, D] -> per-pixel logits [b, H, W, K] (final norm, linear head, pixel shuffle)."""
        c = self.config
        logits = self.norm(tokens) @ self.head_w[...] + self.head_b[...]
        return unpatchify_logits(logits, grid=c.grid, patch=c.patch_size, classes=c.num_classes)

    def __call__(self, images: jax.Array) -> jax.Array:
        """images [b, H, W, c] float -> logits [b, H, W, K]."""
        return self.decode(self.features(images))
