"""experiments/tasks/shapes.py: determinism, ranges, balance, and each class's geometry measured
independently from the noise-free pixels (bounding box, fill fraction, holes, row widths)."""

from __future__ import annotations

import numpy as np
import pytest

from experiments.tasks import shapes


def _mask(img: np.ndarray) -> np.ndarray:
    return img[..., 0] >= 0.55  # shapes are >= 0.6, backgrounds <= 0.2 when noise = 0


def test_deterministic_in_range_and_balanced():
    a, la = shapes.make_shapes(3, 50, size=32)
    b, lb = shapes.make_shapes(3, 50, size=32)
    c, _ = shapes.make_shapes(4, 50, size=32)
    assert np.array_equal(a, b) and np.array_equal(la, lb) and not np.array_equal(a, c)
    assert a.dtype == np.float32 and a.shape == (50, 32, 32, 1) and la.dtype == np.int32
    assert a.min() >= 0.0 and a.max() <= 1.0
    counts = np.bincount(la, minlength=shapes.NUM_CLASSES)
    assert counts.max() - counts.min() <= 1
    (xtr, ytr), (xte, yte) = shapes.load_shapes(num_train=12, num_test=6, size=32)
    assert xtr.shape == (12, 32, 32, 1) and yte.shape == (6,) and not np.array_equal(xtr[:6], xte)


def test_class_geometry_from_pixels():
    images, labels = shapes.make_shapes(0, 240, size=32, noise=0.0)
    for img, label in zip(images, labels):
        m = _mask(img)
        ys, xs = np.nonzero(m)
        assert ys.size > 0
        h, w = ys.max() - ys.min() + 1, xs.max() - xs.min() + 1
        fill = m.sum() / (h * w)
        name = shapes.CLASSES[label]
        if name == "square":
            assert abs(h - w) <= 1 and fill == 1.0
        elif name == "disc":
            assert abs(h - w) <= 1 and 0.6 < fill < 0.9  # pi / 4 ~ 0.785 on a pixel grid
        elif name == "h-bar":
            assert w >= 2 * h and fill == 1.0
        elif name == "v-bar":
            assert h >= 2 * w and fill == 1.0
        elif name == "triangle":
            widths = m.sum(1)[ys.min():ys.max() + 1]
            assert widths[-1] >= widths[0] and 0.35 < fill < 0.65  # apex up, about half the box
        elif name == "ring":
            centre = m[(ys.min() + ys.max()) // 2, (xs.min() + xs.max()) // 2]
            assert not centre and abs(h - w) <= 1  # hole in the middle


@pytest.mark.parametrize("kw,match", [(dict(num_images=0), "num_images"), (dict(size=8), "size"),
                                      (dict(noise=-0.1), "noise")])
def test_bad_input_names_the_argument(kw, match):
    args = dict(num_images=4, size=32, noise=0.0)
    args.update(kw)
    with pytest.raises(ValueError, match=match):
        shapes.make_shapes(0, args.pop("num_images"), **args)
