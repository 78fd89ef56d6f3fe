"""The corruption suite: identity at severity 0, determinism, range, severity ordering, closed forms.

Independent references: scipy.ndimage.gaussian_filter for the Gaussian blur, a float64 numpy /
scipy.fft JPEG pipeline for the JPEG-like compression, noise moments against their closed forms
with tolerances from the sample count. All corruptions at severities (1, 3, 5) are computed once,
in one jitted function, for two keys.
"""

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.fft
import scipy.ndimage

from primitives import corruptions as C

NAMES = sorted(C.CORRUPTIONS)
SEVERITIES = (1, 3, 5)
RANDOM = {"gaussian_noise", "shot_noise", "impulse_noise", "speckle_noise", "motion_blur", "elastic_transform", "fog"}
# Not monotone in pixel distance by their reference parameters: saturate desaturates at 1-2 and
# over-saturates at 3-5; elastic's affine part shrinks (.08 -> .03 H) while its warp grows.
NON_MONOTONE = {"saturate", "elastic_transform"}


def smooth_images(b, h, w, c, seed=0):
    """Natural-ish images: one low-frequency pattern per channel, values in [0.2, 0.8]."""
    rng = np.random.default_rng(seed)
    yy, xx = np.meshgrid(np.linspace(0, 1, h), np.linspace(0, 1, w), indexing="ij")
    out = np.zeros((b, h, w, c))
    for i in range(b):
        for ch in range(c):
            f, ph = rng.uniform(0.5, 2.0, 2), rng.uniform(0, 2 * np.pi, 2)
            out[i, :, :, ch] = 0.5 + 0.3 * np.sin(2 * np.pi * f[0] * yy + ph[0]) * np.cos(2 * np.pi * f[1] * xx + ph[1])
    return out.astype(np.float32)


X = jnp.asarray(smooth_images(3, 12, 12, 3))


@pytest.fixture(scope="module")
def outputs():
    def all_outputs(x, key):
        keys = jax.random.split(key, x.shape[0])
        return {(n, s): jax.vmap(lambda im, k, n=n, s=s: C.CORRUPTIONS[n](im, k, s))(x, keys)
                for n in NAMES for s in SEVERITIES}

    fn = jax.jit(all_outputs)
    return fn(X, jax.random.key(0)), fn(X, jax.random.key(0)), fn(X, jax.random.key(1))


def test_registry_and_split():
    assert set(C.SEEN_CORRUPTIONS) | set(C.HELD_OUT_CORRUPTIONS) == set(C.CORRUPTIONS)
    assert not set(C.SEEN_CORRUPTIONS) & set(C.HELD_OUT_CORRUPTIONS)
    assert set(C.SEVERITY_PARAMS) == set(C.CORRUPTIONS)
    for name, fn in C.CORRUPTIONS.items():
        assert len(C.SEVERITY_PARAMS[name]) == C.MAX_SEVERITY
        assert list(inspect.signature(fn).parameters) == ["image", "key", "severity"]


@pytest.mark.parametrize("name", NAMES)
def test_severity_zero_is_identity(name):
    x = X[0]
    assert np.array_equal(np.asarray(C.CORRUPTIONS[name](x, jax.random.key(3), 0)), np.asarray(x))
    assert np.array_equal(np.asarray(C.corrupt(X, name, 0, jax.random.key(3))), np.asarray(X))


def test_range_shape_dtype(outputs):
    for (name, s), y in outputs[0].items():
        assert y.shape == X.shape and y.dtype == jnp.float32, (name, s)
        assert float(y.min()) >= 0.0 and float(y.max()) <= 1.0, (name, s)
        assert np.isfinite(np.asarray(y)).all(), (name, s)


def test_deterministic_given_key_and_random_ones_use_it(outputs):
    first, again, other = outputs
    for key in first:
        assert np.array_equal(np.asarray(first[key]), np.asarray(again[key])), key
        differs = not np.array_equal(np.asarray(first[key]), np.asarray(other[key]))
        assert differs == (key[0] in RANDOM), key


def test_batched_corrupt_matches_single_image_calls():
    key = jax.random.key(5)
    for name in ("gaussian_noise", "motion_blur"):
        batched = C.corrupt(X, name, 4, key)
        keys = jax.random.split(key, X.shape[0])
        for i in range(X.shape[0]):
            np.testing.assert_allclose(batched[i], C.CORRUPTIONS[name](X[i], keys[i], 4), atol=1e-5)


def test_severity_increases_distance(outputs):
    first = outputs[0]
    dist = {k: float(jnp.mean((v - X) ** 2)) for k, v in first.items()}
    for name in NAMES:
        assert dist[(name, 1)] > 0, name
        if name not in NON_MONOTONE:
            assert dist[(name, 1)] < dist[(name, 3)] < dist[(name, 5)], (name, [dist[(name, s)] for s in SEVERITIES])
    mean = [np.mean([dist[(n, s)] for n in NAMES]) for s in SEVERITIES]
    assert mean[0] < mean[1] < mean[2], mean


def test_gaussian_blur_matches_scipy():
    x = np.asarray(X[1], np.float64)
    for severity in (1, 5):
        sigma = C.SEVERITY_PARAMS["gaussian_blur"][severity - 1]
        ref = scipy.ndimage.gaussian_filter(x, sigma=(sigma, sigma, 0), mode="nearest", truncate=4.0)
        np.testing.assert_allclose(C.gaussian_blur(X[1], None, severity), ref, atol=2e-6)


def test_noise_moments_match_closed_forms():
    """Mean / variance of the noise on a flat grey image, tolerance 5 standard errors (n values)."""
    x = jnp.full((4, 32, 32, 3), 0.5)
    n = x.size
    key = jax.random.key(11)
    d = np.asarray(C.corrupt(x, "gaussian_noise", 3, key) - x, np.float64)
    sigma = C.SEVERITY_PARAMS["gaussian_noise"][2]
    assert abs(d.mean()) < 5 * sigma / np.sqrt(n)
    assert abs(d.var() / sigma ** 2 - 1) < 5 * np.sqrt(2 / n)
    rate = C.SEVERITY_PARAMS["shot_noise"][4]
    y = np.asarray(C.corrupt(x, "shot_noise", 5, key), np.float64)
    assert abs(y.mean() - 0.5) < 5 * np.sqrt(0.5 / rate / n)
    assert abs(y.var() / (0.5 / rate) - 1) < 5 * np.sqrt(2 / n)
    p = C.SEVERITY_PARAMS["impulse_noise"][4]
    hit = np.asarray(C.corrupt(x, "impulse_noise", 5, key)) != 0.5
    assert abs(hit.mean() - p) < 5 * np.sqrt(p * (1 - p) / n)


def test_contrast_and_brightness_closed_forms():
    x = X[2]
    a = C.SEVERITY_PARAMS["contrast"][2]
    mean = x.mean((0, 1), keepdims=True)
    np.testing.assert_allclose(C.contrast(x, None, 3), (x - mean) * a + mean, atol=1e-6)
    grey = X[0, ..., :1]  # one channel: V is the pixel, so brightness is clip(x + b)
    b = C.SEVERITY_PARAMS["brightness"][4]
    np.testing.assert_allclose(C.brightness(grey, None, 5), np.clip(grey + b, 0, 1), atol=1e-6)
    # RGB: hue and saturation are kept, V grows by b (colorsys as the HSV reference).
    import colorsys
    y = np.asarray(C.brightness(x, None, 2))
    for pixel_in, pixel_out in zip(np.asarray(x).reshape(-1, 3)[:20], y.reshape(-1, 3)[:20]):
        h, s, v = colorsys.rgb_to_hsv(*pixel_in)
        np.testing.assert_allclose(pixel_out, colorsys.hsv_to_rgb(h, s, min(v + 0.1, 1.0)), atol=1e-5)


def test_saturate_matches_colorsys_and_is_identity_on_grey():
    import colorsys
    x = np.asarray(X[1])
    a, b = C.SEVERITY_PARAMS["saturate"][3]
    y = np.asarray(C.saturate(X[1], None, 4))
    for pixel_in, pixel_out in zip(x.reshape(-1, 3)[:30], y.reshape(-1, 3)[:30]):
        h, s, v = colorsys.rgb_to_hsv(*pixel_in)
        np.testing.assert_allclose(pixel_out, colorsys.hsv_to_rgb(h, min(s * a + b, 1.0), v), atol=1e-5)
    grey = X[0, ..., :1]
    assert np.array_equal(np.asarray(C.saturate(grey, None, 5)), np.asarray(grey))


def _jpeg_reference(image: np.ndarray, quality: float) -> np.ndarray:
    """Float64 numpy + scipy.fft reference of the JPEG-like pipeline (RGB or grey)."""
    x = image.astype(np.float64) * 255
    h, w, c = x.shape
    if c == 3:
        x = x @ C._RGB_TO_YCC.T + C._YCC_OFFSET
        tables = [C._quant_table(C._LUMA_TABLE, quality)] + [C._quant_table(C._CHROMA_TABLE, quality)] * 2
    else:
        tables = [C._quant_table(C._LUMA_TABLE, quality)]
    x = np.pad(x - 128, ((0, -h % 8), (0, -w % 8), (0, 0)), mode="edge")
    out = np.zeros_like(x)
    for i in range(0, x.shape[0], 8):
        for j in range(0, x.shape[1], 8):
            for ch in range(c):
                coef = scipy.fft.dctn(x[i:i + 8, j:j + 8, ch], norm="ortho")
                coef = np.round(coef / tables[ch]) * tables[ch]
                out[i:i + 8, j:j + 8, ch] = scipy.fft.idctn(coef, norm="ortho")
    out = out[:h, :w] + 128
    if c == 3:
        out = (out - C._YCC_OFFSET) @ C._YCC_TO_RGB.T
    return np.clip(out / 255, 0, 1)


@pytest.mark.parametrize("channels", [1, 3])
def test_jpeg_like_matches_float64_reference(channels):
    rng = np.random.default_rng(0)
    x = np.clip(smooth_images(1, 12, 12, channels)[0] + 0.05 * rng.standard_normal((12, 12, channels)), 0, 1)
    x = x.astype(np.float32)
    for quality in (80, 40):
        ours = np.asarray(C.jpeg_like(jnp.asarray(x), quality))
        ref = _jpeg_reference(x, quality)
        # float32 vs float64 can round a coefficient at a tie the other way: allow rare outliers.
        close = np.abs(ours - ref) < 1e-3
        assert close.mean() > 0.97, (quality, close.mean())
        assert np.abs(ours - ref).mean() < 2e-3
    assert np.abs(np.asarray(C.jpeg_compression(jnp.asarray(x), None, 5)) - _jpeg_reference(x, 40)).mean() < 2e-3


def test_jpeg_quality_100_is_near_identity():
    x = jax.random.uniform(jax.random.key(0), (13, 10, 3))
    assert float(jnp.abs(C.jpeg_like(x, 100) - x).max()) < 4 / 255
    assert float(jnp.abs(C.jpeg_like(x, 10) - x).mean()) > float(jnp.abs(C.jpeg_like(x, 90) - x).mean())


def test_pixelate_area_resampling_of_an_exact_multiple():
    """12 -> 6 -> 12 (factor 0.5): 2x2 block means, repeated."""
    x = np.asarray(X[0])
    ours = np.asarray(C._resize_area(C._resize_area(X[0], 6, 6), 12, 12))
    blocks = x.reshape(6, 2, 6, 2, 3).mean((1, 3))
    np.testing.assert_allclose(ours, np.repeat(np.repeat(blocks, 2, 0), 2, 1), atol=1e-6)


@pytest.mark.parametrize("call, exc, match", [
    (lambda: C.corrupt(X, "snow", 1, jax.random.key(0)), ValueError, r"name must be one of .*got 'snow'"),
    (lambda: C.corrupt(X, "fog", 6, jax.random.key(0)), ValueError, r"severity must be in \[0, 5\].*got 6"),
    (lambda: C.corrupt(X, "fog", -1, jax.random.key(0)), ValueError, r"severity must be in \[0, 5\].*got -1"),
    (lambda: C.corrupt(X, "fog", 2.0, jax.random.key(0)), TypeError, r"severity must be an int; got 2.0"),
    (lambda: C.corrupt(X[0, :, :, 0], "fog", 1, jax.random.key(0)), ValueError, r"images must have shape"),
    (lambda: C.corrupt(jnp.ones((2, 4, 4, 1), jnp.int32), "fog", 1, jax.random.key(0)), TypeError,
     r"images must be a float array"),
    (lambda: C.corrupt(X * 2, "fog", 1, jax.random.key(0)), ValueError, r"images must have values in \[0, 1\]"),
    (lambda: C.gaussian_noise(X, jax.random.key(0), 1), ValueError, r"image must have shape \[h, w, c\]"),
    (lambda: C.jpeg_like(jnp.ones((8, 8, 2)) * 0.5, 50), ValueError, r"1 or 3 channels"),
    (lambda: C.jpeg_like(X[0], 0), ValueError, r"quality must be in \[1, 100\]"),
], ids=["name", "severity-6", "severity-neg", "severity-float", "shape", "int-images", "range", "single-shape",
        "jpeg-channels", "jpeg-quality"])
def test_bad_input(call, exc, match):
    with pytest.raises(exc, match=match):
        call()
