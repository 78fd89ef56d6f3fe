"""Procedural Lambertian light fields of layered scenes, for light-field semantic segmentation (E2I-VRWKV).

Dimension legend: ``n`` scenes, ``U`` x ``V`` angular grid of sub-aperture views (rows u, columns v),
``H`` x ``W`` pixels, ``m`` margin of the layer canvases.

Renderer (`render_light_field`; spec papers/specs/vision_weights_envs.md section 2 (d)): a scene is a
back-to-front list of fronto-parallel layers, each an alpha mask and a texture on a canvas of
``(H + 2m) x (W + 2m)`` pixels, a disparity ``d`` (pixels per view step) and a class label. View
``(u, v)`` has the offset ``(du, dv) = (u - u_c, v - v_c)`` from the centre view ``(u_c, v_c) = (U // 2,
V // 2)``; in it, the layer's content moves by ``d * (du, dv)`` pixels (rows by ``d du``, columns by
``d dv``), i.e. view pixel ``(y, x)`` samples canvas point ``(y + m - d du, x + m - d dv)``, bilinearly
(exact for integer shifts). Layers are painted back to front (``out = a tex + (1 - a) out``), which
is exact occlusion. The centre view's label map and disparity map are those of the front-most layer
whose mask covers the pixel (mask >= 0.5).

Scene generator (`make_light_fields`, [INFER] following spec (d), "make geometry necessary"): classes

    0 background   full plane at disparity -2, smooth low-contrast texture
    1 near object  discs / rectangles at disparity +1 or +2, band-limited noise texture
    2 far object   the SAME shape and texture distribution as class 1, at disparity -1
    3 stripes      rectangles with a stripe texture, disparity drawn from {-1, 0, 1}

so classes 1 and 2 differ only in depth: a model that sees the centre view alone cannot tell them
apart better than by chance (up to the occlusion order they imply), and one reading the parallax
across views can. Integer disparities with integer view offsets make every shift exact. Pixels
are float32, layout ``[n, U, V, H, W]`` (grey). Numpy only, deterministic in the seed.

Example:
    >>> data = make_light_fields(4, seed=0, size=16, views=3)
    >>> data.views.shape, data.labels.shape, data.disparity.shape
    ((4, 3, 3, 16, 16), (4, 16, 16), (4, 16, 16))
"""

from __future__ import annotations

import math
from typing import NamedTuple, Sequence

import numpy as np

__all__ = ["Layer", "LightFields", "CLASSES", "NUM_CLASSES", "render_light_field", "make_light_fields",
           "view_offsets"]

CLASSES = ("background", "near object", "far object", "stripes")
NUM_CLASSES = len(CLASSES)
BACKGROUND_DISPARITY = -2.0
NEAR_DISPARITIES = (1.0, 2.0)
FAR_DISPARITIES = (-1.0,)
STRIPE_DISPARITIES = (-1.0, 0.0, 1.0)


class Layer(NamedTuple):
    """One fronto-parallel layer on a canvas of (H + 2m) x (W + 2m) pixels.

    Attributes:
      alpha: [H + 2m, W + 2m] coverage in [0, 1] (1 = opaque).
      texture: [H + 2m, W + 2m] intensity.
      disparity: pixels the layer moves per view step (positive = in front of the focal plane).
      label: class id.
    """

    alpha: np.ndarray
    texture: np.ndarray
    disparity: float
    label: int


class LightFields(NamedTuple):
    """A batch of rendered scenes.

    Attributes:
      views: [n, U, V, H, W] float32 sub-aperture images.
      labels: [n, H, W] int32 class of the centre view's visible layer.
      disparity: [n, H, W] float32 disparity of the centre view's visible layer.
    """

    views: np.ndarray
    labels: np.ndarray
    disparity: np.ndarray


def view_offsets(views: int) -> np.ndarray:
    """[views] offsets of the view indices from the centre index views // 2."""
    return np.arange(views) - views // 2


def _sample(canvas: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """Bilinear samples of `canvas` at float (rows [H], cols [W]) (outer grid), zero off the canvas."""
    h, w = canvas.shape
    r0, c0 = np.floor(rows).astype(int), np.floor(cols).astype(int)
    fr, fc = (rows - r0)[:, None], (cols - c0)[None, :]

    def at(r, c):
        ok = ((r >= 0) & (r < h))[:, None] & ((c >= 0) & (c < w))[None, :]
        return np.where(ok, canvas[np.clip(r, 0, h - 1)][:, np.clip(c, 0, w - 1)], 0.0)

    return ((1 - fr) * (1 - fc) * at(r0, c0) + (1 - fr) * fc * at(r0, c0 + 1)
            + fr * (1 - fc) * at(r0 + 1, c0) + fr * fc * at(r0 + 1, c0 + 1))


def render_light_field(layers: Sequence[Layer], *, size: int, views: int, margin: int,
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Renders back-to-front `layers` into views x views sub-aperture images of size x size.

    Args:
      layers: the layers, back to front (the first is painted first and occluded by the later ones).
      size: image side H = W.
      views: angular side U = V (odd, so that a centre view exists).
      margin: canvas margin m; every layer canvas must be (size + 2m) x (size + 2m).

    Returns:
      (views [U, V, H, W] float32, centre labels [H, W] int32 (-1 where no layer covers the pixel),
      centre disparity [H, W] float32 (nan where uncovered)).

    Raises:
      ValueError: naming the argument, for an even or non-positive `views`, a bad `size` or `margin`,
        no layers, or a layer canvas of the wrong shape.
    """
    if not isinstance(views, (int, np.integer)) or views < 1 or views % 2 == 0:
        raise ValueError(f"views must be a positive odd int (a centre view must exist); got views={views!r}")
    if not isinstance(size, (int, np.integer)) or size < 1:
        raise ValueError(f"size must be a positive int; got size={size!r}")
    if not isinstance(margin, (int, np.integer)) or margin < 0:
        raise ValueError(f"margin must be a non-negative int; got margin={margin!r}")
    if len(layers) == 0:
        raise ValueError("layers must hold at least one Layer; got none")
    shape = (size + 2 * margin, size + 2 * margin)
    for i, layer in enumerate(layers):
        for name in ("alpha", "texture"):
            if np.shape(getattr(layer, name)) != shape:
                raise ValueError(f"layers[{i}].{name} must have shape {shape} (size + 2 * margin); got "
                                 f"{np.shape(getattr(layer, name))}")
    off = view_offsets(views)
    pix = np.arange(size, dtype=np.float64) + margin
    out = np.zeros((views, views, size, size), np.float64)
    for layer in layers:
        d = float(layer.disparity)
        for iu, du in enumerate(off):
            for iv, dv in enumerate(off):
                rows, cols = pix - d * du, pix - d * dv
                a = _sample(np.asarray(layer.alpha, np.float64), rows, cols)
                t = _sample(np.asarray(layer.texture, np.float64), rows, cols)
                out[iu, iv] = a * t + (1 - a) * out[iu, iv]
    labels = np.full((size, size), -1, np.int32)
    disp = np.full((size, size), np.nan, np.float32)
    centre = (slice(margin, margin + size),) * 2
    for layer in layers:
        cover = np.asarray(layer.alpha)[centre] >= 0.5
        labels[cover] = layer.label
        disp[cover] = layer.disparity
    return out.astype(np.float32), labels, disp


def _smooth_noise(rng: np.random.Generator, shape: tuple[int, int], cutoff: float) -> np.ndarray:
    """Band-limited noise in [0, 1]: white noise low-passed at `cutoff` (cycles per pixel), min-max scaled."""
    f = np.fft.fft2(rng.standard_normal(shape))
    fy, fx = np.fft.fftfreq(shape[0])[:, None], np.fft.fftfreq(shape[1])[None, :]
    x = np.real(np.fft.ifft2(f * (np.hypot(fy, fx) <= cutoff)))
    return (x - x.min()) / max(x.max() - x.min(), 1e-9)


def _shape_mask(rng: np.random.Generator, side: int, lo: int, hi: int) -> np.ndarray:
    """A disc or rectangle (binary float mask) with a random centre inside [lo, hi) on a side x side canvas."""
    yy, xx = np.mgrid[0:side, 0:side]
    cy, cx = rng.uniform(lo, hi, 2)
    if rng.random() < 0.5:
        r = rng.uniform(3.0, 6.5)
        return ((yy - cy) ** 2 + (xx - cx) ** 2 <= r * r).astype(np.float64)
    hy, hx = rng.uniform(2.5, 6.5, 2)
    return ((np.abs(yy - cy) <= hy) & (np.abs(xx - cx) <= hx)).astype(np.float64)


def _scene(rng: np.random.Generator, size: int, margin: int, max_objects: int) -> list[Layer]:
    side = size + 2 * margin
    bg = 0.35 + 0.3 * _smooth_noise(rng, (side, side), 0.06)
    layers = [Layer(np.ones((side, side)), bg, BACKGROUND_DISPARITY, 0)]
    objects = []
    for _ in range(int(rng.integers(2, max_objects + 1))):
        cls = int(rng.integers(1, NUM_CLASSES))
        mask = _shape_mask(rng, side, margin + 3, margin + size - 3)
        if cls == 3:
            period = int(rng.integers(3, 6))
            yy, xx = np.mgrid[0:side, 0:side]
            coord = yy if rng.random() < 0.5 else xx
            tex = np.where((coord // period) % 2 == 0, 0.9, 0.1).astype(np.float64)
            d = float(rng.choice(STRIPE_DISPARITIES))
        else:  # near and far objects: the same shape and texture distribution
            tex = _smooth_noise(rng, (side, side), 0.25)
            d = float(rng.choice(NEAR_DISPARITIES if cls == 1 else FAR_DISPARITIES))
        objects.append(Layer(mask, tex, d, cls))
    # back to front: by disparity (far first); a stable sort keeps the draw order for equal disparities
    objects.sort(key=lambda layer: layer.disparity)
    return layers + objects


def make_light_fields(n: int, *, seed: int, size: int = 32, views: int = 3, max_objects: int = 4) -> LightFields:
    """`n` random layered scenes (see the module docstring), rendered to views x views images of size x size.

    Raises:
      ValueError: naming the argument, for n < 1, size < 16, an even views, or max_objects < 2.
    """
    if not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"n must be a positive int; got n={n!r}")
    if not isinstance(size, (int, np.integer)) or size < 16:
        raise ValueError(f"size must be an int >= 16 (objects have radius up to 6.5 px); got size={size!r}")
    if not isinstance(views, (int, np.integer)) or views < 1 or views % 2 == 0:
        raise ValueError(f"views must be a positive odd int; got views={views!r}")
    if max_objects < 2:
        raise ValueError(f"max_objects must be >= 2; got max_objects={max_objects}")
    max_d = max(abs(BACKGROUND_DISPARITY), *map(abs, NEAR_DISPARITIES + FAR_DISPARITIES + STRIPE_DISPARITIES))
    margin = int(math.ceil(max_d * (views // 2))) + 1
    rng = np.random.default_rng(seed)
    out_v = np.empty((n, views, views, size, size), np.float32)
    out_l = np.empty((n, size, size), np.int32)
    out_d = np.empty((n, size, size), np.float32)
    for i in range(n):
        out_v[i], out_l[i], out_d[i] = render_light_field(_scene(rng, size, margin, max_objects), size=size,
                                                          views=views, margin=margin)
    return LightFields(out_v, out_l, out_d)
