"""Real data for the ``paper`` presets, read through TensorFlow Datasets without TensorFlow.

`load(name, split)` returns one split of a public dataset as numpy arrays, ready for JAX:

- ``cifar10``, ``cifar100``, ``cifar10_1`` and ``cifar10_corrupted/<corruption>_<severity>``
  (CIFAR-10-C; test split only, e.g. ``"cifar10_corrupted/gaussian_noise_3"``):
  ``(images uint8 [N, 32, 32, 3], labels int32 [N])``;
- ``gsm8k``: ``(questions object [N] of str, answers object [N] of str)``, the answer being the final
  answer after ``####`` (pass ``fields=("question", "answer")`` for the worked solution);
- any other TFDS dataset whose ``supervised_keys`` name two features (or given ``fields``).

How it reads: ``tfds.builder(...).as_data_source(split)``, TFDS's random-access reader over
ArrayRecord files. That path needs ``tensorflow-datasets`` (the ``[data]`` extra:
``pip install -e '.[data]'``) but not TensorFlow; images are decoded with Pillow. Nothing is
downloaded unless the caller passes ``download=True``; without it a dataset that is not prepared
in ``data_dir`` (default ``~/tensorflow_datasets`` or ``$TFDS_DATA_DIR``) raises
`FileNotFoundError` that says how to prepare it.

Measured on this repository's CPU machine (tensorflow-datasets 4.9.10, Python 3.11): TFDS imports
and reads without TensorFlow, but *preparing* an image dataset (``download=True`` for CIFAR-10)
encodes the images with ``tf.image.encode_png`` and so needs ``pip install tensorflow`` (CPU is
enough) on the machine that prepares it, with ``file_format="array_record"`` (set here). Prepared
directories can then be copied to a TensorFlow-free machine (or a ``gs://`` bucket: ``data_dir`` goes
through ``etils.epath``). GSM8K's text features prepare without TensorFlow. Datasets prepared in the
default TFRecord format cannot be read here (TFRecord has no random access): re-prepare them with
``file_format="array_record"``.

Tests (tests/experiments/data_test.py) read mock CIFAR-10 / CIFAR-10-C / GSM8K splits from
``tfds.testing.mock_data`` and a tiny dataset actually prepared in a temporary directory, offline.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from typing import NamedTuple

import numpy as np
from tqdm.auto import tqdm

__all__ = ["Examples", "load", "SUPPORTED", "CIFAR10_C_MAIN", "CIFAR10_C_EXTRA", "cifar10_images", "cifar10_train_test",
           "cifar10_c_images"]

# Base dataset name -> (module that registers its TFDS builder, (input feature, target feature)).
SUPPORTED: dict[str, tuple[str, tuple[str, str]]] = {
    "cifar10": ("tensorflow_datasets.image_classification.cifar", ("image", "label")),
    "cifar100": ("tensorflow_datasets.image_classification.cifar", ("image", "label")),
    "cifar10_1": ("tensorflow_datasets.image_classification.cifar10_1", ("image", "label")),
    "cifar10_corrupted": ("tensorflow_datasets.image_classification.cifar10_corrupted", ("image", "label")),
    "gsm8k": ("tensorflow_datasets.text.gsm8k", ("question", "short_answer")),
}

# CIFAR-10-C (Hendrycks & Dietterich 2019) under the paper's names; TFDS spells two of them differently.
CIFAR10_C_MAIN: tuple[str, ...] = (
    "gaussian_noise", "shot_noise", "impulse_noise", "defocus_blur", "glass_blur", "motion_blur", "zoom_blur",
    "snow", "frost", "fog", "brightness", "contrast", "elastic_transform", "pixelate", "jpeg_compression")
CIFAR10_C_EXTRA: tuple[str, ...] = ("speckle_noise", "gaussian_blur", "spatter", "saturate")
_TFDS_CORRUPTION_NAME = {"glass_blur": "frosted_glass_blur", "elastic_transform": "elastic"}

_EXTRA_HINT = "install the [data] extra: pip install -e '.[data]' (or pip install 'tensorflow-datasets>=4.9')"


class Examples(NamedTuple):
    """One split as two aligned arrays: ``inputs[i]`` goes with ``targets[i]``.

    Images are ``uint8 [N, H, W, C]`` with ``int32 [N]`` class labels; text is ``object [N]`` of ``str``.
    Unpacks as a pair: ``images, labels = load("cifar10", "test")``.
    """

    inputs: np.ndarray
    targets: np.ndarray


def _import_tfds():
    try:
        import tensorflow_datasets as tfds
    except ImportError as err:
        raise ImportError(f"experiments.data needs tensorflow-datasets, which is not installed: {_EXTRA_HINT}."
                          ) from err
    return tfds


def _column(values: list, name: str, feature: str) -> np.ndarray:
    """Stacks one feature's values: arrays -> one array (int labels -> int32), bytes/str -> object of str."""
    first = values[0]
    if isinstance(first, (bytes, str)):
        out = np.empty(len(values), dtype=object)
        out[:] = [v.decode("utf-8") if isinstance(v, bytes) else v for v in values]
        if feature == "short_answer":  # GSM8K's "#### 42" leaves surrounding whitespace
            out[:] = [v.strip() for v in out]
        return out
    try:
        arr = np.stack([np.asarray(v) for v in values])
    except ValueError as err:
        raise ValueError(f"dataset {name!r}: feature {feature!r} has examples of different shapes "
                         f"({np.shape(values[0])} and others); load() returns dense arrays only") from err
    if np.issubdtype(arr.dtype, np.integer) and arr.ndim == 1:
        arr = arr.astype(np.int32)
    return arr


def load(name: str, split: str, *, data_dir: str | os.PathLike | None = None, download: bool = False,
         fields: tuple[str, str] | None = None, max_examples: int | None = None) -> Examples:
    """One split of a TFDS dataset as numpy arrays (see the module docstring for the datasets).

    Args:
        name: a TFDS name, with an optional config and version: ``"cifar10"``,
            ``"cifar10_corrupted/gaussian_noise_3"``, ``"gsm8k"``.
        split: ``"train"``, ``"test"``, ... (CIFAR-10-C has only ``"test"``).
        data_dir: where prepared datasets live (local or ``gs://``); TFDS's default when None.
        download: when True, download and prepare the dataset into ``data_dir`` first
            (ArrayRecord format; image datasets need TensorFlow for this step). When False (the
            default) nothing is downloaded and an unprepared dataset raises `FileNotFoundError`.
        fields: the (input, target) feature names; default from `SUPPORTED` or the dataset's
            ``supervised_keys``.
        max_examples: read only the first ``max_examples`` records of the split.

    Returns:
        `Examples(inputs, targets)`: images ``uint8 [N, H, W, C]`` and labels ``int32 [N]``, or
        text as ``object [N]`` arrays of ``str``.

    Raises:
        ImportError: tensorflow-datasets is not installed (names the ``[data]`` extra).
        FileNotFoundError: the dataset is not prepared in ``data_dir`` and ``download`` is False.
        ValueError: an unknown dataset, split or feature, or a bad ``max_examples``.
    """
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"name must be a non-empty TFDS dataset name such as 'cifar10', got {name!r}")
    if not isinstance(split, str) or not split.strip():
        raise ValueError(f"split must be a non-empty split name such as 'train' or 'test', got {split!r}")
    if max_examples is not None and (isinstance(max_examples, bool) or not isinstance(max_examples, int)
                                     or max_examples < 1):
        raise ValueError(f"max_examples must be a positive int or None, got {max_examples!r}")
    if fields is not None and (not isinstance(fields, (tuple, list)) or len(fields) != 2
                               or not all(isinstance(f, str) for f in fields)):
        raise ValueError(f"fields must be a pair of feature names (input, target), got {fields!r}")
    tfds = _import_tfds()
    from tensorflow_datasets.core.registered import DatasetNotFoundError

    base = name.split("/")[0].split(":")[0]
    if base in SUPPORTED:  # register the builder (TFDS imports its dataset modules lazily)
        importlib.import_module(SUPPORTED[base][0])
    try:
        builder = tfds.builder(name, data_dir=None if data_dir is None else os.fspath(data_dir))
    except DatasetNotFoundError as err:
        raise ValueError(f"name: no TFDS dataset {name!r} (supported here: {sorted(SUPPORTED)}, or any "
                         f"registered TFDS dataset with two supervised keys)") from err

    if download:
        if not builder.is_prepared() and importlib.util.find_spec("tensorflow") is None and any(
                isinstance(f, tfds.features.Image) for f in builder.info.features.values()):
            raise ImportError(f"download=True: preparing {name!r} encodes its images with TensorFlow, which is not "
                              f"installed. Run it once where `pip install tensorflow` is (CPU is enough) and copy "
                              f"{os.fspath(builder.data_dir)!r}, or install TensorFlow here.")
        builder.download_and_prepare(file_format="array_record")
    elif not builder.is_prepared():
        raise FileNotFoundError(
            f"dataset {name!r} is not prepared in {os.fspath(builder.data_dir)!r} and download=False. Prepare "
            f"it once with load({name!r}, {split!r}, data_dir=..., download=True) (downloads; image datasets "
            f"also need `pip install tensorflow` for that step) or copy a prepared ArrayRecord directory "
            f"there, or pass the data_dir that holds it.")

    features = builder.info.features
    if fields is None:
        if base in SUPPORTED:
            fields = SUPPORTED[base][1]
        elif builder.info.supervised_keys and len(builder.info.supervised_keys) == 2 \
                and all(isinstance(k, str) for k in builder.info.supervised_keys):
            fields = tuple(builder.info.supervised_keys)
        else:
            raise ValueError(f"name: dataset {name!r} has no pair of supervised keys; pass fields=(input, target) "
                             f"from its features {sorted(features.keys())}")
    missing = [f for f in fields if f not in features]
    if missing:
        raise ValueError(f"fields: dataset {name!r} has no feature(s) {missing}; its features are "
                         f"{sorted(features.keys())}")
    known_splits = list(builder.info.splits.keys())
    if known_splits and any(part.split("[")[0].strip() not in known_splits for part in split.split("+")):
        raise ValueError(f"split: dataset {name!r} has splits {known_splits}, got {split!r}")

    source = builder.as_data_source(split=split)
    n = len(source) if max_examples is None else min(max_examples, len(source))
    if n == 0:
        raise ValueError(f"split: {name!r} split {split!r} holds no examples")
    inputs, targets = [], []
    for i in tqdm(range(n), desc=f"reading {name}:{split}", disable=n < 5000, leave=False):
        example = source[i]  # one record at a time: TFDS's mocked data sources break __getitems__
        inputs.append(example[fields[0]])
        targets.append(example[fields[1]])
    return Examples(_column(inputs, name, fields[0]), _column(targets, name, fields[1]))


def cifar10_images(split: str, *, data_dir: str | os.PathLike | None = None,
                   max_examples: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """CIFAR-10 ``split`` as ``(float32 [N, 32, 32, 3] in [0, 1], int32 [N])``, the first ``max_examples``.

    The ``paper`` presets of the vision experiments (toast, dem_hec) read their data through this;
    errors are `load`'s (no download here: prepare the dataset once, see the module docstring).
    """
    images, labels = load("cifar10", split, data_dir=data_dir, max_examples=max_examples)
    return images.astype(np.float32) / 255.0, labels


def cifar10_train_test(*, num_train: int, num_test: int, data_dir: str | os.PathLike | None = None):
    """``((x_train, y_train), (x_test, y_test))``: the first ``num_train`` / ``num_test`` images of CIFAR-10's
    splits as `cifar10_images` returns them (the vision experiments' ``data.dataset="cifar10"``)."""
    return (cifar10_images("train", data_dir=data_dir, max_examples=num_train),
            cifar10_images("test", data_dir=data_dir, max_examples=num_test))


def cifar10_c_images(corruption: str, severity: int, *, data_dir: str | os.PathLike | None = None,
                     max_examples: int | None = None, raw: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """CIFAR-10-C's ``corruption`` at ``severity`` (1..5) as `cifar10_images` returns CIFAR-10.

    Image ``i`` is CIFAR-10 test image ``i`` corrupted, so the first ``max_examples`` line up with
    ``cifar10_images("test", max_examples=...)``. ``corruption`` is a name of `CIFAR10_C_MAIN` or
    `CIFAR10_C_EXTRA` (the paper's spelling: ``glass_blur``, ``elastic_transform``). ``raw=True``
    returns the stored ``uint8`` pixels (a quarter of the memory: all 95 sets are 2.9 GB).
    """
    known = CIFAR10_C_MAIN + CIFAR10_C_EXTRA
    if corruption not in known:
        raise ValueError(f"corruption must be a CIFAR-10-C corruption {known}, got {corruption!r}")
    if isinstance(severity, bool) or not isinstance(severity, (int, np.integer)) or not 1 <= severity <= 5:
        raise ValueError(f"severity must be an int in 1..5, got {severity!r}")
    name = f"cifar10_corrupted/{_TFDS_CORRUPTION_NAME.get(corruption, corruption)}_{int(severity)}"
    images, labels = load(name, "test", data_dir=data_dir, max_examples=max_examples)
    return (images if raw else images.astype(np.float32) / 255.0), labels
