"""experiments.data: the TFDS real-data path, offline.

Argument checks and the missing-extra error run everywhere. The rest needs tensorflow-datasets (the
``[data]`` extra, not installed in CI) and is skipped without it: mock CIFAR-10 / CIFAR-10-C / GSM8K
splits from ``tfds.testing.mock_data``, checked against TFDS's own reader under the same mock, and a
tiny image + text dataset really prepared in ``tmp_path`` (PNG-encoded with Pillow, so TensorFlow is
not needed) whose read-back must equal what was written. Nothing downloads.
"""

import importlib.util
import io
import sys

import numpy as np
import pytest

from experiments import data

def test_missing_tfds_names_the_data_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)  # makes `import tensorflow_datasets` fail
    with pytest.raises(ImportError, match=r"tensorflow-datasets.*\[data\]"):
        data.load("cifar10", "test")


@pytest.mark.parametrize("kwargs, match", [
    (dict(name="", split="test"), "name must be a non-empty"),
    (dict(name=3, split="test"), "name must be a non-empty"),
    (dict(name="cifar10", split=""), "split must be a non-empty"),
    (dict(name="cifar10", split="test", max_examples=0), "max_examples must be a positive int or None, got 0"),
    (dict(name="cifar10", split="test", max_examples=True), "max_examples must be a positive int"),
    (dict(name="cifar10", split="test", fields=("image",)), r"fields must be a pair"),
])
def test_bad_arguments_name_the_argument(kwargs, match):
    with pytest.raises(ValueError, match=match):
        data.load(**kwargs)


# --- mock_data: CIFAR-10, CIFAR-10-C and GSM8K without their files -----------------------------------


@pytest.mark.parametrize("name, split", [("cifar10", "train"), ("cifar10_corrupted/gaussian_noise_3", "test")])
def test_mock_cifar_images_match_tfds_reader(mocked_tfds, name, split, tmp_path):
    images, labels = data.load(name, split, data_dir=tmp_path)
    assert images.shape == (6, 32, 32, 3) and images.dtype == np.uint8
    assert labels.shape == (6,) and labels.dtype == np.int32
    assert labels.min() >= 0 and labels.max() < 10
    ref = mocked_tfds.data_source(name, split=split, download=False)
    np.testing.assert_array_equal(images, np.stack([ref[i]["image"] for i in range(6)]))
    np.testing.assert_array_equal(labels, [int(ref[i]["label"]) for i in range(6)])
    first = data.load(name, split, data_dir=tmp_path, max_examples=2)
    np.testing.assert_array_equal(first.inputs, images[:2])


def test_mock_gsm8k_text(mocked_tfds, tmp_path):
    questions, answers = data.load("gsm8k", "test", data_dir=tmp_path)
    assert questions.shape == answers.shape == (6,) and questions.dtype == object
    assert all(isinstance(q, str) and q for q in questions)
    ref = mocked_tfds.data_source("gsm8k", split="test", download=False)
    text = lambda v: v.decode() if isinstance(v, bytes) else v  # the mock yields str, real records bytes
    assert list(questions) == [text(ref[i]["question"]) for i in range(6)]
    assert list(answers) == [text(ref[i]["short_answer"]).strip() for i in range(6)]


@pytest.mark.parametrize("kwargs, match", [
    (dict(corruption="frosted_glass_blur", severity=1), "corruption must be a CIFAR-10-C corruption"),
    (dict(corruption="fog", severity=0), "severity must be an int in 1..5, got 0"),
    (dict(corruption="fog", severity=2.0), "severity must be an int in 1..5"),
])
def test_cifar10_c_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        data.cifar10_c_images(**kwargs)


@pytest.mark.parametrize("corruption, tfds_name", [("glass_blur", "frosted_glass_blur"),
                                                   ("elastic_transform", "elastic"), ("fog", "fog")])
def test_cifar10_helpers_scale_and_map_names(mocked_tfds, corruption, tfds_name, tmp_path):
    raw, labels = data.load("cifar10", "test", data_dir=tmp_path)
    images, labels2 = data.cifar10_images("test", data_dir=tmp_path)
    assert images.dtype == np.float32 and 0.0 <= images.min() and images.max() <= 1.0
    np.testing.assert_array_equal(images, raw.astype(np.float32) / 255.0)
    np.testing.assert_array_equal(labels, labels2)
    ref, _ = data.load(f"cifar10_corrupted/{tfds_name}_4", "test", data_dir=tmp_path, max_examples=3)
    got, _ = data.cifar10_c_images(corruption, 4, data_dir=tmp_path, max_examples=3, raw=True)
    assert got.dtype == np.uint8 and got.shape == (3, 32, 32, 3)
    np.testing.assert_array_equal(got, ref)
    scaled, _ = data.cifar10_c_images(corruption, 4, data_dir=tmp_path, max_examples=3)
    np.testing.assert_array_equal(scaled, ref.astype(np.float32) / 255.0)


# --- a tiny dataset really prepared on disk (no mock) ------------------------------------------------


_N = 5


def _image(i):
    return np.random.default_rng(i).integers(0, 256, (4, 4, 3), dtype=np.uint8)


@pytest.fixture(scope="module")
def prepared(tfds, tmp_path_factory):
    """Prepares two tiny ArrayRecord datasets, `tiny_images_data_test` and `tiny_text_data_test`."""
    from PIL import Image

    def png(array):
        buf = io.BytesIO()
        Image.fromarray(array).save(buf, format="PNG")
        return buf.getvalue()

    class TinyImagesDataTest(tfds.core.GeneratorBasedBuilder):
        # A one-part module name: for a dotted one TFDS 4.9 looks for the builder's source through
        # `importlib_resources`, which is not installed on Python >= 3.11.
        __module__ = "tiny_data_test_builders"
        VERSION = tfds.core.Version("1.0.0")

        def _info(self):
            return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
                "image": tfds.features.Image(shape=(4, 4, 3)),
                "label": tfds.features.ClassLabel(num_classes=_N)}), supervised_keys=("image", "label"))

        def _split_generators(self, dl_manager):
            return {"train": self._generate_examples(_N), "test": self._generate_examples(2)}

        def _generate_examples(self, n):
            for i in range(n):  # label i marks image i, so order after TFDS's shuffle does not matter
                yield i, {"image": png(_image(i)), "label": i}

    class TinyTextDataTest(tfds.core.GeneratorBasedBuilder):
        __module__ = "tiny_data_test_builders"
        VERSION = tfds.core.Version("1.0.0")

        def _info(self):
            return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict(
                {"question": tfds.features.Text(), "answer": tfds.features.Text()}))

        def _split_generators(self, dl_manager):
            return {"test": self._generate_examples()}

        def _generate_examples(self):
            for i in range(3):
                yield i, {"question": f"what is {i} + 1? é", "answer": str(i + 1)}

    root = tmp_path_factory.mktemp("tfds")
    for cls in (TinyImagesDataTest, TinyTextDataTest):
        cls(data_dir=str(root), file_format="array_record").download_and_prepare()
    return root


def test_prepared_images_read_back_exactly(prepared):
    images, labels = data.load("tiny_images_data_test", "train", data_dir=prepared)
    assert images.shape == (_N, 4, 4, 3) and images.dtype == np.uint8 and labels.dtype == np.int32
    assert sorted(labels.tolist()) == list(range(_N))
    for image, label in zip(images, labels):
        np.testing.assert_array_equal(image, _image(int(label)))
    assert len(data.load("tiny_images_data_test", "test", data_dir=prepared).targets) == 2
    assert len(data.load("tiny_images_data_test", "train", data_dir=prepared, max_examples=3).inputs) == 3


def test_prepared_text_with_explicit_fields(prepared):
    questions, answers = data.load("tiny_text_data_test", "test", data_dir=prepared, fields=("question", "answer"))
    pairs = sorted(zip(questions.tolist(), answers.tolist()))
    assert pairs == [(f"what is {i} + 1? é", str(i + 1)) for i in range(3)]
    with pytest.raises(ValueError, match="no pair of supervised keys"):
        data.load("tiny_text_data_test", "test", data_dir=prepared)


@pytest.mark.parametrize("kwargs, match", [
    (dict(split="validation"), r"split: dataset 'tiny_images_data_test' has splits"),
    (dict(split="train", fields=("image", "coarse_label")), r"fields: .*no feature\(s\) \['coarse_label'\]"),
])
def test_prepared_bad_split_or_field(prepared, kwargs, match):
    with pytest.raises(ValueError, match=match):
        data.load("tiny_images_data_test", data_dir=prepared, **kwargs)


def test_unprepared_dataset_does_not_download(tfds, tmp_path):
    with pytest.raises(FileNotFoundError, match=r"'cifar10' is not prepared in .*download=True"):
        data.load("cifar10", "test", data_dir=tmp_path)
    assert not any(tmp_path.rglob("*.array_record*")) and not (tmp_path / "downloads").exists()


def test_download_of_images_without_tensorflow_fails_before_downloading(tfds, tmp_path):
    if importlib.util.find_spec("tensorflow") is not None:
        pytest.skip("TensorFlow is installed: preparing CIFAR-10 would download it")
    with pytest.raises(ImportError, match=r"download=True: preparing 'cifar10' encodes its images with TensorFlow"):
        data.load("cifar10", "test", data_dir=tmp_path, download=True)
    assert not (tmp_path / "downloads").exists()


def test_unknown_dataset_names_the_argument(tfds, tmp_path):
    with pytest.raises(ValueError, match=r"name: no TFDS dataset 'no_such_dataset_xyz'"):
        data.load("no_such_dataset_xyz", "test", data_dir=tmp_path)
