"""Generated moving-shape videos: bright squares and discs gliding (and bouncing) over a dark, static
background, the toy stand-in for the redundant video KV caches QVG compresses.

Each video has ``num_shapes`` shapes with random size, brightness and velocity; ``speed`` scales the
velocities (0: a still image repeated, the most redundant video), ``noise`` adds per-frame pixel
noise (the least redundant part). Pixels are float32 in [0, 1]. Deterministic in the seed.

`patchify` cuts frames into ``p x p`` patches (the model's tokens) and `unpatchify` inverts it.

Example:
    >>> v = moving_shapes(0, num_videos=2, frames=5, size=16)
    >>> v.shape, v.dtype, float(v.min()) >= 0.0, float(v.max()) <= 1.0
    ((2, 5, 16, 16), dtype('float32'), True, True)
    >>> p = patchify(v, 4)
    >>> p.shape, bool((unpatchify(p, 16) == v).all())
    ((2, 5, 16, 16), True)
"""

from __future__ import annotations

import numpy as np

__all__ = ["moving_shapes", "patchify", "unpatchify"]


def moving_shapes(seed: int, *, num_videos: int, frames: int, size: int = 32, num_shapes: int = 3,
                  speed: float = 1.0, noise: float = 0.0) -> np.ndarray:
    """Videos [num_videos, frames, size, size] float32 in [0, 1].

    Args:
      seed: numpy seed.
      num_videos, frames, size: output shape.
      num_shapes: shapes per video (squares and discs, radius 2 to size / 6 pixels).
      speed: velocity scale in pixels per frame (velocities uniform in [-1.5, 1.5] * speed).
      noise: standard deviation of Gaussian pixel noise (clipped to [0, 1] afterwards).
    """
    for name, value in (("num_videos", num_videos), ("frames", frames), ("size", size)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1; got {value}")
    if speed < 0 or noise < 0:
        raise ValueError(f"speed and noise must be >= 0; got speed={speed}, noise={noise}")
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32)
    out = np.zeros((num_videos, frames, size, size), np.float32)
    for n in range(num_videos):
        background = 0.1 + 0.1 * rng.random() * (xx / size)  # a faint static gradient
        radius = rng.uniform(2.0, max(2.5, size / 6), num_shapes)
        pos = rng.uniform(radius[:, None], size - radius[:, None], (num_shapes, 2))
        vel = rng.uniform(-1.5, 1.5, (num_shapes, 2)) * speed
        shade = rng.uniform(0.5, 1.0, num_shapes)
        square = rng.random(num_shapes) < 0.5
        for f in range(frames):
            img = background.copy()
            for s in range(num_shapes):
                dy, dx = yy - pos[s, 0], xx - pos[s, 1]
                inside = (np.maximum(abs(dy), abs(dx)) <= radius[s]) if square[s] else (dy**2 + dx**2 <= radius[s] ** 2)
                img = np.where(inside, shade[s], img)
            if noise:
                img = img + noise * rng.standard_normal(img.shape)
            out[n, f] = np.clip(img, 0.0, 1.0)
            pos += vel
            for axis in (0, 1):  # bounce off the walls
                low, high = pos[:, axis] < radius, pos[:, axis] > size - radius
                vel[low | high, axis] *= -1
                pos[:, axis] = np.clip(pos[:, axis], radius, size - radius)
    return out


def patchify(videos: np.ndarray, patch: int) -> np.ndarray:
    """[..., H, W] -> [..., (H/p)(W/p), p*p] row-major patches."""
    *lead, h, w = videos.shape
    if h % patch or w % patch:
        raise ValueError(f"patch must divide the frame size {h}x{w}; got patch={patch}")
    x = videos.reshape(*lead, h // patch, patch, w // patch, patch)
    x = np.moveaxis(x, -3, -2)  # [..., H/p, W/p, p, p]
    return x.reshape(*lead, (h // patch) * (w // patch), patch * patch)


def unpatchify(patches: np.ndarray, size: int) -> np.ndarray:
    """Inverse of :func:`patchify` for square frames of ``size`` pixels."""
    *lead, n, pp = patches.shape
    p = int(round(pp**0.5))
    g = size // p
    if p * p != pp or g * g != n:
        raise ValueError(f"patches [..., {n}, {pp}] do not tile a {size}x{size} frame")
    x = patches.reshape(*lead, g, g, p, p)
    x = np.moveaxis(x, -2, -3)
    return x.reshape(*lead, size, size)
