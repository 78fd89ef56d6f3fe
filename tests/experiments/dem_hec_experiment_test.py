"""The dem_hec experiment's own logic: the check rules, the ViT feature hook, the cached evaluation."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats
from flax import nnx

from algorithms.robustness import dem_hec as dh
from experiments import dem_hec as exp
from models.cnn import CNN, CNNConfig
from models.vit import ViT, ViTConfig


def test_t_interval_matches_scipy_and_covers_at_its_level():
    rng = np.random.default_rng(0)
    v = rng.normal(size=3)
    mean, half = exp.t_interval(v)
    lo, hi = scipy.stats.t.interval(0.95, 2, loc=v.mean(), scale=scipy.stats.sem(v))
    assert mean == pytest.approx(v.mean()) and half == pytest.approx((hi - lo) / 2)
    # Monte Carlo: the 95% interval over 3 normal seeds covers the true mean 95% of the time.
    trials = 2000
    draws = rng.normal(loc=1.5, scale=2.0, size=(trials, 3))
    covered = 0
    for row in draws:
        m, h = exp.t_interval(row)
        covered += abs(m - 1.5) <= h
    tol = 4 * math.sqrt(0.95 * 0.05 / trials)
    assert abs(covered / trials - 0.95) < tol


@pytest.mark.parametrize("seed", range(6))
def test_paired_rule_is_a_one_sided_paired_t_test_without_the_image_term(seed):
    rng = np.random.default_rng(seed)
    b = rng.normal(size=3)
    a = b + rng.normal(loc=0.5 * seed - 0.5, scale=0.5, size=3)
    r = exp.paired_rule(a, b, None, t_level=0.95)
    p = scipy.stats.ttest_rel(a, b, alternative="greater").pvalue
    assert r["passed"] == (p < 0.05)
    assert r["diff"] == pytest.approx(np.mean(a - b))
    assert r["se_seed"] == pytest.approx(scipy.stats.sem(a - b))


def test_paired_rule_image_term_raises_the_threshold_to_two_image_standard_errors():
    a, b = np.array([0.70, 0.71, 0.72]), np.array([0.69, 0.70, 0.71])  # d = 0.01 exactly: SE_seed 0
    e = np.random.default_rng(1).normal(0.01, 0.2, size=450)
    r = exp.paired_rule(a, b, e, se_multiple=2.0)
    assert r["se_seed"] == pytest.approx(0.0, abs=1e-12)
    assert r["threshold"] == pytest.approx(2 * scipy.stats.sem(e))
    assert r["passed"] == (0.01 > 2 * scipy.stats.sem(e))
    assert exp.paired_rule(a, b, np.full(450, 0.01))["passed"]  # no spread: any positive d passes


def test_paired_rule_and_t_interval_reject_bad_input():
    with pytest.raises(ValueError, match="same length"):
        exp.paired_rule([1.0, 2.0], [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match=">= 2"):
        exp.t_interval([1.0])


def test_binomial_tolerance_closed_form():
    assert exp.binomial_tolerance(0.9, 450) == pytest.approx(2 * math.sqrt(0.09 / 450))
    assert exp.binomial_tolerance(1.0, 10) == 0.0
    with pytest.raises(ValueError, match="n >= 1"):
        exp.binomial_tolerance(0.5, 0)


def test_config_rejects_bad_fields():
    with pytest.raises(ValueError, match="seeds"):
        exp.Config(finetune=exp.FinetuneSection(seeds=(0,)))
    with pytest.raises(ValueError, match="ablation_archs"):
        exp.Config(archs=("cnn",), finetune=exp.FinetuneSection(ablation_archs=("vit",)))
    with pytest.raises(ValueError, match="overlap"):
        exp.Config(eval=exp.EvalSection(seen=("contrast",), held_out=("contrast",)))
    with pytest.raises(ValueError, match="severities"):
        exp.Config(eval=exp.EvalSection(severities=(0,)))


def test_vit_forward_features_are_the_heads_input():
    cfg = ViTConfig(image_size=8, patch_size=4, num_classes=3, d_model=8, num_heads=2, d_ff=16, num_layers=1)
    model = ViT(cfg, rngs=nnx.Rngs(0))
    x = jax.random.uniform(jax.random.key(1), (5, 8, 8, 1))
    logits, pooled = exp.vit_forward(model, x)
    np.testing.assert_allclose(logits, model(x).logits, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(pooled @ model.head_w[...] + model.head_b[...], logits, rtol=1e-5, atol=1e-5)


def test_cached_evaluation_matches_the_librarys_corruption_accuracy(tmp_path):
    smoke = exp.EXPERIMENT.config("smoke")
    c = dataclasses.replace(smoke, eval=dataclasses.replace(smoke.eval, seen=("contrast",), held_out=("defocus_blur",),
                                                            severities=(2, 4)))
    rng = np.random.default_rng(0)
    images = rng.uniform(size=(12, 8, 8, 1)).astype(np.float32)
    labels = rng.integers(0, 10, 12).astype(np.int32)
    model = CNN(CNNConfig(channels=(4,), hidden_dim=0, num_groups=1), rngs=nnx.Rngs(0))
    sets, corrupted = exp.corrupted_sets(c, images, tmp_path)
    row = exp.evaluate(model, 7, images, labels, corrupted, sets, c)
    table = dh.corruption_accuracy(model, images, labels, key=jax.random.key(c.eval.corruption_seed),
                                   names=("contrast", "defocus_blur"), severities=(2, 4))
    assert row["accuracy"] == {f"{n}/{s}": v for (n, s), v in table.items()}
    assert row["clean_accuracy"] == dh.accuracy(model, images, labels)
    assert row["seen_mca"] == pytest.approx(np.mean([table[("contrast", 2)], table[("contrast", 4)]]))
    ent = dh.entropy_by_severity(model, images, key=jax.random.key(c.eval.corruption_seed), names=("contrast",),
                                 severities=(0, 2))
    assert [row["clean_entropy"], row["entropy"]["contrast/2"]] == pytest.approx(ent[0].tolist(), rel=1e-5)
    # the cache returns the same sets
    sets2, corrupted2 = exp.corrupted_sets(c, images, tmp_path)
    assert sets2 == sets and np.array_equal(corrupted2, corrupted)


def test_evaluation_of_uint8_sets_and_any_set_grouping_agree():
    """CIFAR-10-C sets are stored as uint8 and scored a few sets at a time: same numbers as float sets."""
    smoke = exp.EXPERIMENT.config("smoke")
    c = dataclasses.replace(smoke, eval=dataclasses.replace(smoke.eval, seen=("contrast",), held_out=("defocus_blur",),
                                                            severities=(2, 4)))
    rng = np.random.default_rng(1)
    clean = rng.integers(0, 256, (12, 8, 8, 1)).astype(np.float32) / 255.0
    raw = rng.integers(0, 256, (4, 12, 8, 8, 1), dtype=np.uint8)
    labels = rng.integers(0, 10, 12).astype(np.int32)
    sets = [("contrast", 2), ("contrast", 4), ("defocus_blur", 2), ("defocus_blur", 4)]
    model = CNN(CNNConfig(channels=(4,), hidden_dim=0, num_groups=1), rngs=nnx.Rngs(0))
    ref = exp.evaluate(model, 60, clean, labels, raw.astype(np.float32) / 255.0, sets, c)  # one group of 5 sets
    for batch_size in (7, 24):  # one set per group / two sets per group
        row = exp.evaluate(model, batch_size, clean, labels, raw, sets, c)
        assert row["accuracy"] == ref["accuracy"] and row["img_seen"] == ref["img_seen"]
        assert row["entropy"] == pytest.approx(ref["entropy"], rel=1e-5)
    logits = dh.predict_logits(model, raw[3].astype(np.float32) / 255.0)  # an independent count
    assert ref["accuracy"]["defocus_blur/4"] == pytest.approx(float(np.mean(logits.argmax(-1) == labels)))


def test_cifar10_config_checks_corruption_names_against_cifar10_c():
    with pytest.raises(ValueError, match=r"seen must list corruptions of experiments\.data"):
        exp.Config(data=exp.DataSection(dataset="cifar10"),
                   eval=exp.EvalSection(seen=("elastic",), held_out=("saturate",)))
    with pytest.raises(ValueError, match=r"seen must list corruptions of primitives\.corruptions"):
        exp.Config(eval=exp.EvalSection(seen=("snow",)))  # digits: only the implemented corruptions
    with pytest.raises(ValueError, match="dataset must be one of"):
        exp.Config(data=exp.DataSection(dataset="imagenet"))
    with pytest.raises(ValueError, match="cifar_test must be >= 1; got 0"):
        exp.Config(data=exp.DataSection(cifar_test=0))
    c = exp.EXPERIMENT.config("paper")
    assert c.data.dataset == "cifar10" and len(c.eval.seen) == 15 and "snow" in c.eval.seen
    assert "spatter" in c.eval.held_out
    assert exp.cnn_config(c).in_channels == 3 and exp.vit_config(c, 32).channels == 3


def test_cifar10_without_tfds_names_the_data_extra(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)  # makes `import tensorflow_datasets` fail
    with pytest.raises(ImportError, match=r"tensorflow-datasets.*\[data\]"):
        exp._data(exp.EXPERIMENT.config("paper"))


def test_cifar10_run_on_mock_cifar10_c(mocked_tfds, tmp_path):
    """The paper preset's data path end to end at smoke size on TFDS's mock CIFAR-10 / CIFAR-10-C."""
    smoke = exp.EXPERIMENT.config("smoke")
    c = dataclasses.replace(smoke, data=exp.DataSection(dataset="cifar10", data_dir=str(tmp_path / "tfds")),
                            eval=dataclasses.replace(smoke.eval, seen=("snow", "glass_blur"), held_out=("spatter",)),
                            cnn=dataclasses.replace(smoke.cnn, train_steps=2), batch_size=4)
    train, (xte, yte) = exp._data(c)
    assert train[0].shape == (6, 32, 32, 3) and train[0].dtype == np.float32 and xte.shape == (6, 32, 32, 3)
    sets, corrupted = exp.corrupted_sets(c, xte, tmp_path)
    assert sets == [("snow", 3), ("glass_blur", 3), ("spatter", 3)]
    assert corrupted.shape == (3, 6, 32, 32, 3) and corrupted.dtype == np.uint8
    ref = mocked_tfds.data_source("cifar10_corrupted/frosted_glass_blur_3", split="test", download=False)
    np.testing.assert_array_equal(corrupted[1], np.stack([ref[i]["image"] for i in range(6)]))
    out = exp.run(c, tmp_path / "run")
    assert set(out["metrics"]["summary"]["cnn"]) >= {"base", "dem_hec", "clean", "pgd"}
    assert out["metrics"]["checks"] and "CIFAR-10 / CIFAR-10-C" in out["verdict"]
