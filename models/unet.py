"""A small time-conditioned U-Net (Flax NNX) with optional SPADE conditioning, for IR-SDE denoisers.

Dimension legend: ``b`` images, ``H``/``W`` height and width (divisible by 2^(levels-1)), ``c`` state
channels, ``m`` conditioning channels fed at the input (``mu``, mask), ``s`` SPADE condition channels
(the obstacle state of PLMD), ``C_l`` channels of level l.

Spec: papers/specs/vision_weights_envs.md section 3 (b) and (g) 3. The official ``ConditionalUNet`` file
was not read; [INFER] everything below: the network predicts the noise ``eps_hat [b, H, W, c]`` from
``concat(x_t, cond)`` (IR-SDE convention: ``cond`` holds mu and, here, the known mask), a sinusoidal
embedding of the step t goes through a 2-layer MLP and is added (per channel) inside every residual
block, and when ``spade_channels > 0`` every residual block replaces its group norms' affine by SPADE:

    h <- GroupNorm(h) * (1 + gamma(S)) + beta(S),     gamma, beta = conv3x3(ReLU(conv3x3(S_resized)))

with S resized (average pooling) to the block's resolution. The gamma and beta output convs start at
zero, so an untrained SPADE block is the plain normalisation. Levels: ``channels[l]`` at resolution
H / 2^l; down by 2x2 average pooling, up by nearest upsampling with skip concatenation; 1x1 output conv
(zero-initialised, so eps_hat = 0 at initialisation).

References:
  Park, Liu, Wang, Zhu, "Semantic Image Synthesis with Spatially-Adaptive Normalization" (SPADE),
  arXiv:1903.07291, 2019.
  Ronneberger, Fischer, Brox, "U-Net", arXiv:1505.04597, 2015.

Example:
    >>> import jax.numpy as jnp
    >>> from flax import nnx
    >>> net = UNet(UNetConfig(in_channels=1, cond_channels=2, spade_channels=1, channels=(8, 16)), rngs=nnx.Rngs(0))
    >>> net(jnp.zeros((2, 8, 8, 1)), jnp.zeros((2, 8, 8, 2)), jnp.array([3, 5]), spade=jnp.zeros((2, 8, 8, 1))).shape
    (2, 8, 8, 1)
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from flax import nnx

__all__ = ["UNetConfig", "UNet", "SPADE", "group_norm", "timestep_embedding"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class UNetConfig:
    """Shape of a `UNet` (validated: ValueError naming the field).

    Attributes:
      in_channels: c, the state channels (also the output channels).
      cond_channels: m, channels concatenated to the input (0 = none).
      spade_channels: s, channels of the SPADE condition (0 = no SPADE, plain group norm with affine).
      channels: C_l per level (at least one level).
      num_groups: group-norm groups; must divide every C_l.
      time_dim: width of the time embedding.
      spade_hidden: hidden width of the SPADE convs.
    """

    in_channels: int = 1
    cond_channels: int = 0
    spade_channels: int = 0
    channels: tuple[int, ...] = (16, 32)
    num_groups: int = 4
    time_dim: int = 32
    spade_hidden: int = 16

    def __post_init__(self):
        for name in ("in_channels", "num_groups", "time_dim", "spade_hidden"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be an int >= 1, got {v!r}")
        for name in ("cond_channels", "spade_channels"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ValueError(f"{name} must be an int >= 0, got {v!r}")
        if not isinstance(self.channels, tuple) or not self.channels or any(
                not isinstance(c, int) or c < 1 for c in self.channels):
            raise ValueError(f"channels must be a non-empty tuple of ints >= 1, got {self.channels!r}")
        bad = [c for c in self.channels if c % self.num_groups]
        if bad:
            raise ValueError(f"num_groups={self.num_groups} must divide every entry of channels={self.channels}")


def group_norm(h: jax.Array, groups: int, eps: float = 1e-5) -> jax.Array:
    """Group normalisation without affine of ``h [b, H, W, C]`` (statistics per image and group)."""
    b, hh, ww, c = h.shape
    g = h.reshape(b, hh, ww, groups, c // groups)
    mean = g.mean((1, 2, 4), keepdims=True)
    var = g.var((1, 2, 4), keepdims=True)
    return ((g - mean) * jax.lax.rsqrt(var + eps)).reshape(b, hh, ww, c)


def timestep_embedding(t: jax.Array, dim: int, max_period: float = 10000.0) -> jax.Array:
    """Sinusoidal embedding ``[b] -> [b, dim]`` of integer steps."""
    half = dim // 2
    freqs = jnp.exp(-math.log(max_period) * jnp.arange(half, dtype=jnp.float32) / max(half, 1))
    args = jnp.asarray(t, jnp.float32)[:, None] * freqs[None]
    emb = jnp.concatenate([jnp.cos(args), jnp.sin(args)], -1)
    return jnp.pad(emb, ((0, 0), (0, dim - 2 * half)))


def _conv(c_in, c_out, k, rngs, *, zero=False):
    init = nnx.initializers.zeros_init() if zero else nnx.initializers.lecun_normal()
    return nnx.Conv(c_in, c_out, (k, k), padding="SAME", kernel_init=init, rngs=rngs)


def _resize_to(s: jax.Array, hw: tuple[int, int]) -> jax.Array:
    b, hh, ww, c = s.shape
    fh, fw = hh // hw[0], ww // hw[1]
    if fh == 1 and fw == 1:
        return s
    return s.reshape(b, hw[0], fh, hw[1], fw, c).mean((2, 4))


class SPADE(nnx.Module):
    """``group_norm(h) * (1 + gamma(S)) + beta(S)``; gamma, beta zero at initialisation."""

    def __init__(self, channels: int, spade_channels: int, hidden: int, groups: int, *, rngs: nnx.Rngs):
        self.shared = _conv(spade_channels, hidden, 3, rngs)
        self.gamma = _conv(hidden, channels, 3, rngs, zero=True)
        self.beta = _conv(hidden, channels, 3, rngs, zero=True)
        self.groups = groups

    def modulation(self, s: jax.Array, hw: tuple[int, int]) -> tuple[jax.Array, jax.Array]:
        a = jax.nn.relu(self.shared(_resize_to(s, hw)))
        return self.gamma(a), self.beta(a)

    def __call__(self, h: jax.Array, s: jax.Array) -> jax.Array:
        gamma, beta = self.modulation(s, h.shape[1:3])
        return group_norm(h, self.groups) * (1 + gamma) + beta


class _Norm(nnx.Module):
    def __init__(self, channels, cfg: UNetConfig, *, rngs):
        self.groups = cfg.num_groups
        if cfg.spade_channels:
            self.spade = SPADE(channels, cfg.spade_channels, cfg.spade_hidden, cfg.num_groups, rngs=rngs)
        else:
            self.spade = None
            self.scale = nnx.Param(jnp.ones((channels,)))
            self.shift = nnx.Param(jnp.zeros((channels,)))

    def __call__(self, h, s):
        if self.spade is not None:
            return self.spade(h, s)
        return group_norm(h, self.groups) * self.scale[...] + self.shift[...]


class _ResBlock(nnx.Module):
    def __init__(self, c_in, c_out, cfg: UNetConfig, *, rngs):
        self.norm1 = _Norm(c_in, cfg, rngs=rngs)
        self.conv1 = _conv(c_in, c_out, 3, rngs)
        self.temb = nnx.Linear(cfg.time_dim, c_out, rngs=rngs)
        self.norm2 = _Norm(c_out, cfg, rngs=rngs)
        self.conv2 = _conv(c_out, c_out, 3, rngs)
        self.skip = _conv(c_in, c_out, 1, rngs) if c_in != c_out else None

    def __call__(self, x, temb, s):
        h = self.conv1(jax.nn.silu(self.norm1(x, s)))
        h = h + self.temb(temb)[:, None, None, :]
        h = self.conv2(jax.nn.silu(self.norm2(h, s)))
        return h + (self.skip(x) if self.skip is not None else x)


class UNet(nnx.Module):
    """``eps_hat = UNet(x_t [b,H,W,c], cond [b,H,W,m], t [b], spade=S [b,H,W,s])`` -> ``[b, H, W, c]``."""

    def __init__(self, config: UNetConfig, *, rngs: nnx.Rngs):
        cfg = self.config = config
        ch = cfg.channels
        self.t1 = nnx.Linear(cfg.time_dim, cfg.time_dim, rngs=rngs)
        self.t2 = nnx.Linear(cfg.time_dim, cfg.time_dim, rngs=rngs)
        self.inp = _conv(cfg.in_channels + cfg.cond_channels, ch[0], 3, rngs)
        self.down = nnx.List([_ResBlock(ch[max(i - 1, 0)], ch[i], cfg, rngs=rngs) for i in range(len(ch))])
        self.mid = _ResBlock(ch[-1], ch[-1], cfg, rngs=rngs)
        self.up = nnx.List([_ResBlock(ch[i] + ch[i] if i == len(ch) - 1 else ch[i + 1] + ch[i], ch[i], cfg, rngs=rngs)
                            for i in reversed(range(len(ch)))])
        self.out_norm = _Norm(ch[0], cfg, rngs=rngs)
        self.out = _conv(ch[0], cfg.in_channels, 1, rngs, zero=True)

    def __call__(self, x: jax.Array, cond: jax.Array | None, t: jax.Array, *, spade: jax.Array | None = None) -> jax.Array:
        cfg = self.config
        if x.ndim != 4 or x.shape[-1] != cfg.in_channels:
            raise ValueError(f"x must be [b, H, W, {cfg.in_channels}], got {x.shape}")
        f = 2 ** (len(cfg.channels) - 1)
        if x.shape[1] % f or x.shape[2] % f:
            raise ValueError(f"H and W must be divisible by {f} (2^(levels-1)), got {x.shape[1:3]}")
        if cfg.cond_channels:
            if cond is None or cond.shape != x.shape[:3] + (cfg.cond_channels,):
                raise ValueError(f"cond must be {x.shape[:3] + (cfg.cond_channels,)}, got "
                                 f"{None if cond is None else cond.shape}")
            x = jnp.concatenate([x, cond], -1)
        if cfg.spade_channels and (spade is None or spade.shape != x.shape[:3] + (cfg.spade_channels,)):
            raise ValueError(f"spade must be {x.shape[:3] + (cfg.spade_channels,)}, got "
                             f"{None if spade is None else spade.shape}")
        t = jnp.broadcast_to(jnp.asarray(t).reshape(-1), (x.shape[0],))
        temb = self.t2(jax.nn.silu(self.t1(timestep_embedding(t, cfg.time_dim))))
        h = self.inp(x)
        skips = []
        for i, blk in enumerate(self.down):
            h = blk(h, temb, spade)
            skips.append(h)
            if i < len(self.down) - 1:
                b, hh, ww, c = h.shape
                h = h.reshape(b, hh // 2, 2, ww // 2, 2, c).mean((2, 4))
        h = self.mid(h, temb, spade)
        for j, blk in enumerate(self.up):
            if j > 0:
                h = jnp.repeat(jnp.repeat(h, 2, 1), 2, 2)
            h = blk(jnp.concatenate([h, skips[-1 - j]], -1), temb, spade)
        return self.out(jax.nn.silu(self.out_norm(h, spade)))
