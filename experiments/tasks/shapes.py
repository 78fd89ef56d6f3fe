"""Procedurally generated shape images for image classification (the class is the shape).

Each image is one bright shape on a dark background with a faint random gradient and optional pixel
noise; the shape's position, size and brightness are random. Classes:

    0 square      filled, side about 2r
    1 disc        filled, radius r
    2 h-bar       filled rectangle, width >= 2 x height
    3 v-bar       filled rectangle, height >= 2 x width
    4 triangle    filled, apex up (isosceles)
    5 ring        disc of radius r minus the disc of radius r - max(1.5, r / 3)

Pixels are float32 in [0, 1], layout NHWC with one channel. Deterministic in the seed; labels cycle
through the classes, so every class has floor or ceil(n / 6) images. Numpy only, nothing downloads.
The spec's harder alternative to the digits for ToaSt (papers/specs/inference_moe.md, section 5 (d)).

Example:
    >>> (x_train, y_train), (x_test, y_test) = load_shapes(num_train=60, num_test=12, size=32)
    >>> x_train.shape, y_test.shape, sorted(set(y_train.tolist())) == list(range(NUM_CLASSES))
    ((60, 32, 32, 1), (12,), True)
"""

from __future__ import annotations

import numpy as np

__all__ = ["CLASSES", "NUM_CLASSES", "make_shapes", "load_shapes"]

CLASSES = ("square", "disc", "h-bar", "v-bar", "triangle", "ring")
NUM_CLASSES = len(CLASSES)


def _shape_mask(label: int, size: int, rng: np.random.Generator) -> np.ndarray:
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32)
    r = rng.uniform(size / 8, size / 4)
    cy, cx = rng.uniform(r + 1, size - r - 2, 2)
    if label == 0:
        return (np.abs(yy - cy) <= r) & (np.abs(xx - cx) <= r)
    if label == 1:
        return (yy - cy) ** 2 + (xx - cx) ** 2 <= r ** 2
    if label in (2, 3):
        long_half = r
        short_half = rng.uniform(max(0.5, r / 8), r / 4)
        hy, hx = (short_half, long_half) if label == 2 else (long_half, short_half)
        return (np.abs(yy - cy) <= hy) & (np.abs(xx - cx) <= hx)
    if label == 4:
        top, bottom = cy - r, cy + r
        frac = (yy - top) / (bottom - top)  # 0 at the apex, 1 at the base
        return (yy >= top) & (yy <= bottom) & (np.abs(xx - cx) <= frac * r)
    if label == 5:
        d2 = (yy - cy) ** 2 + (xx - cx) ** 2
        inner = r - max(1.5, r / 3)
        return (d2 <= r ** 2) & (d2 > inner ** 2)
    raise ValueError(f"label must lie in [0, {NUM_CLASSES}); got {label}")


def make_shapes(seed: int, num_images: int, *, size: int = 32, noise: float = 0.05) -> tuple[np.ndarray, np.ndarray]:
    """`num_images` shape images: (images float32 [n, size, size, 1] in [0, 1], labels int32 [n]).

    Args:
      seed: numpy seed.
      num_images: n >= 1.
      size: image side, >= 16.
      noise: standard deviation of Gaussian pixel noise (clipped to [0, 1] afterwards), >= 0.

    Raises:
      ValueError: naming the argument, for n < 1, size < 16 or negative noise.
    """
    if num_images < 1:
        raise ValueError(f"num_images must be >= 1; got {num_images}")
    if size < 16:
        raise ValueError(f"size must be >= 16 (shapes need room); got {size}")
    if not noise >= 0:
        raise ValueError(f"noise must be >= 0; got {noise}")
    rng = np.random.default_rng(seed)
    labels = (np.arange(num_images) % NUM_CLASSES).astype(np.int32)
    rng.shuffle(labels)
    xx = np.arange(size, dtype=np.float32)[None, :] / size
    images = np.empty((num_images, size, size, 1), np.float32)
    for i, label in enumerate(labels):
        background = 0.05 + 0.15 * rng.random() * (xx if rng.random() < 0.5 else xx.T)
        img = np.where(_shape_mask(int(label), size, rng), rng.uniform(0.6, 1.0), np.broadcast_to(background,
                                                                                                 (size, size)))
        if noise:
            img = img + noise * rng.standard_normal(img.shape)
        images[i, :, :, 0] = np.clip(img, 0.0, 1.0)
    return images, labels


def load_shapes(*, num_train: int = 3000, num_test: int = 600, size: int = 32, noise: float = 0.05,
                seed: int = 0) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """Train and test splits from independent seeds, in `load_digits`'s layout:
    `((x_train, y_train), (x_test, y_test))`."""
    return (make_shapes(2 * seed, num_train, size=size, noise=noise),
            make_shapes(2 * seed + 1, num_test, size=size, noise=noise))
