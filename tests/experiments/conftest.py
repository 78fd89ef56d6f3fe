"""Fixtures shared by the experiment tests: TFDS's offline mock data (the ``[data]`` extra, skipped without it)."""

import pytest

TFDS_SKIP = "tensorflow-datasets is not installed (the [data] extra; CI installs only [test])"


@pytest.fixture(scope="module")
def tfds():
    return pytest.importorskip("tensorflow_datasets", reason=TFDS_SKIP)


@pytest.fixture
def mocked_tfds(tfds, monkeypatch):
    """TFDS's mock data (6 random examples per split), with every builder reporting itself prepared.

    Nothing is downloaded or read from disk: ``tfds.testing.mock_data`` serves each split from its
    feature spec (CIFAR-10 and every CIFAR-10-C config: uint8 [32, 32, 3] images, labels 0..9).
    """
    monkeypatch.setattr(tfds.core.DatasetBuilder, "is_prepared", lambda self: True)
    with tfds.testing.mock_data(num_examples=6):
        yield tfds
