"""The 8x8 handwritten digits of scikit-learn, split for image classification.

`sklearn.datasets.load_digits` ships with scikit-learn (1797 grey-level images
of the digits 0-9, pixel values 0..16), so it loads offline. The split is
stratified, so train and test have the same class proportions.

Example:
    >>> (x_train, y_train), (x_test, y_test) = load_digits()
    >>> x_train.shape, x_test.shape, y_train.dtype.name
    ((1347, 8, 8, 1), (450, 8, 8, 1), 'int32')
"""

from __future__ import annotations

import numpy as np
import sklearn.datasets
import sklearn.model_selection

__all__ = ["load_digits"]

_MAX_PIXEL = 16.0


def load_digits(
    *, test_fraction: float = 0.25, seed: int = 0, normalize: bool = True
) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """Loads the digits as NHWC images with a stratified train/test split.

    Args:
        test_fraction: fraction of the images in the test split, in (0, 1).
        seed: fixes the split.
        normalize: scale pixels from 0..16 to [0, 1]; otherwise keep 0..16.

    Returns:
        `((x_train, y_train), (x_test, y_test))` with images float32
        [n, 8, 8, 1] and labels int32 [n] in 0..9.

    Raises:
        ValueError: if `test_fraction` is not in (0, 1).
    """
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction: expected a value in (0, 1), got {test_fraction!r}")
    data = sklearn.datasets.load_digits()
    x = data.images.astype(np.float32)[..., None]
    if normalize:
        x /= _MAX_PIXEL
    y = data.target.astype(np.int32)
    x_train, x_test, y_train, y_test = sklearn.model_selection.train_test_split(
        x, y, test_size=test_fraction, random_state=seed, stratify=y
    )
    return (x_train, y_train), (x_test, y_test)
