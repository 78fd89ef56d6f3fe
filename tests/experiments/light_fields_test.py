"""Procedural light fields: exact parallax shifts, occlusion, labels and disparity, determinism, bad input."""

import numpy as np
import pytest

from experiments.tasks import light_fields as lf


def _canvas(size, margin, seed=0):
    return np.random.default_rng(seed).random((size + 2 * margin, size + 2 * margin))


@pytest.mark.parametrize("views", [3, 5])
def test_disparity_zero_gives_identical_views(views):
    size, margin = 12, 3
    tex = _canvas(size, margin)
    alpha = np.zeros_like(tex)
    alpha[4:12, 5:14] = 1.0
    bg = lf.Layer(np.ones_like(tex), _canvas(size, margin, 1), 0.0, 0)
    out, labels, disp = lf.render_light_field([bg, lf.Layer(alpha, tex, 0.0, 1)], size=size, views=views,
                                              margin=margin)
    assert out.shape == (views, views, size, size)
    for u in range(views):
        for v in range(views):
            np.testing.assert_array_equal(out[u, v], out[views // 2, views // 2])


@pytest.mark.parametrize("d", [1.0, -2.0, 3.0])
def test_integer_disparity_shifts_by_d_times_offset(d):
    size, views = 10, 5
    margin = int(abs(d)) * (views // 2)
    tex = _canvas(size, margin, 3)
    out, _, _ = lf.render_light_field([lf.Layer(np.ones_like(tex), tex, d, 0)], size=size, views=views,
                                      margin=margin)
    for iu, du in enumerate(lf.view_offsets(views)):
        for iv, dv in enumerate(lf.view_offsets(views)):
            sy, sx = int(d * du), int(d * dv)
            # view pixel (y, x) shows canvas point (y + m - d du, x + m - d dv): exact, no interpolation
            expected = tex[margin - sy:margin - sy + size, margin - sx:margin - sx + size]
            np.testing.assert_allclose(out[iu, iv], expected, rtol=0, atol=1e-6)
            # and the content moves by (d du, d dv) against the centre view (on the overlap)
            c = out[views // 2, views // 2]
            ys, xs = slice(max(sy, 0), size + min(sy, 0)), slice(max(sx, 0), size + min(sx, 0))
            yc, xc = slice(max(-sy, 0), size + min(-sy, 0)), slice(max(-sx, 0), size + min(-sx, 0))
            np.testing.assert_allclose(out[iu, iv][ys, xs], c[yc, xc], atol=1e-6)


def test_half_pixel_disparity_is_bilinear():
    size, margin = 8, 2
    tex = _canvas(size, margin, 5)
    out, _, _ = lf.render_light_field([lf.Layer(np.ones_like(tex), tex, 0.5, 0)], size=size, views=3, margin=margin)
    m = margin
    # view (1, 2): dv = +1, columns sample x + m - 0.5: the mean of the two neighbouring canvas columns
    expected = 0.5 * (tex[m:m + size, m - 1:m - 1 + size] + tex[m:m + size, m:m + size])
    np.testing.assert_allclose(out[1, 2], expected, atol=1e-6)


def test_occlusion_labels_and_disparity():
    size, margin, views = 12, 2, 3
    back_tex, front_tex = np.full((16, 16), 0.2), np.full((16, 16), 0.9)
    front = np.zeros((16, 16))
    front[6:10, 6:10] = 1.0  # canvas rows/cols 6..9 -> centre-view pixels 4..7
    layers = [lf.Layer(np.ones((16, 16)), back_tex, -1.0, 0), lf.Layer(front, front_tex, 1.0, 2)]
    out, labels, disp = lf.render_light_field(layers, size=size, views=views, margin=margin)
    want = np.zeros((size, size), np.int32)
    want[4:8, 4:8] = 2
    np.testing.assert_array_equal(labels, want)
    np.testing.assert_array_equal(disp, np.where(want == 2, 1.0, -1.0).astype(np.float32))
    # the front square occludes the back plane in every view, at its shifted position
    for iu, du in enumerate(lf.view_offsets(views)):
        for iv, dv in enumerate(lf.view_offsets(views)):
            sq = np.zeros((size, size), bool)
            sq[4 + du:8 + du, 4 + dv:8 + dv] = True
            np.testing.assert_allclose(out[iu, iv], np.where(sq, 0.9, 0.2), atol=1e-6)
    # drawing order matters: the front layer painted first is hidden by the (opaque) back plane
    out2, labels2, _ = lf.render_light_field(layers[::-1], size=size, views=views, margin=margin)
    np.testing.assert_allclose(out2, 0.2, atol=1e-6)
    assert (labels2 == 0).all()


def test_generator_deterministic_and_consistent():
    a = lf.make_light_fields(6, seed=3, size=16, views=3)
    b = lf.make_light_fields(6, seed=3, size=16, views=3)
    c = lf.make_light_fields(6, seed=4, size=16, views=3)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(a.views, c.views)
    assert a.views.dtype == np.float32 and a.labels.dtype == np.int32
    assert set(np.unique(a.labels)) <= set(range(lf.NUM_CLASSES))
    # disparity follows the class: background -2, near objects > 0, far objects -1, stripes in {-1, 0, 1}
    d, l = a.disparity, a.labels
    assert (d[l == 0] == lf.BACKGROUND_DISPARITY).all()
    assert (d[l == 1] > 0).all() and np.isin(d[l == 1], lf.NEAR_DISPARITIES).all()
    assert (d[l == 2] == -1.0).all()
    assert np.isin(d[l == 3], lf.STRIPE_DISPARITIES).all()
    # the centre view shows the texture of the front layer: the centre image equals views[:, 1, 1]
    assert a.views.shape == (6, 3, 3, 16, 16)


def test_bad_input():
    tex = np.zeros((14, 14))
    with pytest.raises(ValueError, match="views"):
        lf.render_light_field([lf.Layer(tex, tex, 0.0, 0)], size=10, views=4, margin=2)
    with pytest.raises(ValueError, match=r"layers\[0\].alpha"):
        lf.render_light_field([lf.Layer(np.zeros((3, 3)), tex, 0.0, 0)], size=10, views=3, margin=2)
    with pytest.raises(ValueError, match="layers"):
        lf.render_light_field([], size=10, views=3, margin=2)
    with pytest.raises(ValueError, match="size"):
        lf.make_light_fields(2, seed=0, size=8)
    with pytest.raises(ValueError, match="n must"):
        lf.make_light_fields(0, seed=0)
