"""fm_active_learning experiment pieces: the matched-accuracy saving on synthetic curves (closed form), the
long-tailed pool and the frozen FM of one seed, and config errors naming the field."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from experiments import fm_active_learning as fal
from experiments import registry


def test_savings_closed_form_on_linear_curves():
    b = np.arange(10, 211, 20.0)
    curves = {fal.OURS: np.minimum(0.5 + 0.004 * (b - 10), 0.9),   # reaches 0.9 at 110 labels
              "random": 0.5 + 0.001 * (b - 10),                    # 0.7 at 210
              "margin": 0.5 + 0.002 * (b - 10)}                    # 0.9 at 210
    sv = fal.savings(b, curves)
    assert sv["target"] == pytest.approx(0.9) and sv["best_baseline"] == "margin"
    assert sv["n_ours"] == pytest.approx(110) and sv["n_best"] == pytest.approx(210)
    assert sv["saving"] == pytest.approx(1 - 110 / 210)
    assert sv["per_baseline"]["random"] is None
    sc = fal.saving_curve(b, curves)
    # at ours' level after one round (0.58 at 30 labels) margin needs 50 labels: saving 1 - 30 / 50
    assert sc[0]["n_ours"] == pytest.approx(30) and sc[0]["n_best"] == pytest.approx(50)
    assert sc[0]["saving"] == pytest.approx(0.4) and not sc[0]["censored"]


def test_saving_when_ours_is_worse_is_negative():
    b = np.array([10.0, 20.0, 30.0])
    sv = fal.savings(b, {fal.OURS: [0.5, 0.6, 0.7], "direct": [0.5, 0.8, 0.8]})
    assert sv["target"] == pytest.approx(0.7) and sv["n_ours"] == 30
    assert sv["n_best"] == pytest.approx(10 + 10 * 0.2 / 0.3) and sv["saving"] < 0


def test_seed_data_is_long_tailed_disjoint_and_the_fm_is_informative():
    smoke = fal.EXPERIMENT.config("smoke")
    c = dataclasses.replace(smoke, fm=dataclasses.replace(smoke.fm, steps=150))
    images, y = fal._digits()
    d = fal._make_seed(c, 0, images, y)
    counts = np.sort(d["counts"])[::-1]
    assert counts[0] / counts[-1] == pytest.approx(c.data.imbalance_ratio, rel=0.25)
    assert d["x"].shape == (counts.sum(), 64) and d["x_test"].shape == (10 * c.data.test_per_class, 64)
    np.testing.assert_array_equal(np.bincount(d["y"], minlength=10), d["counts"])
    np.testing.assert_array_equal(np.bincount(d["y_test"], minlength=10), c.data.test_per_class)
    # the minority classes are the rarest ones
    assert set(d["minority"].tolist()) == set(np.argsort(d["counts"])[: c.eval.num_minority].tolist())
    # the FM is better than chance (0.1) but not perfect; Q rows are distributions
    assert 0.4 < d["fm_pool_bacc"] < 0.99
    np.testing.assert_allclose(d["q"].sum(1), 1.0, atol=1e-6)


@pytest.mark.parametrize("section,field,value,match", [
    ("noise", "rates", (0.0, 0.95), r"noise.rates must be non-empty rates in \[0, 0.9\)"),
    ("al", "methods", ("margin", "random"), r"al.methods must contain 'fm_co_decision'"),
    ("noise", "kind", "blur", r"noise.kind must be one of"),
    ("eval", "num_minority", 10, r"eval.num_minority must lie in \[1, 10\), got 10"),
])
def test_config_errors_name_the_field(section, field, value, match):
    smoke = fal.EXPERIMENT.config("smoke")
    with pytest.raises(registry.ConfigError, match=match):
        dataclasses.replace(smoke, **{section: dataclasses.replace(getattr(smoke, section), **{field: value})})


def test_cache_key_keeps_the_flat_field_names():
    """Every setting but `progress` is in the cache key, under its pre-sections name (old caches stay valid)."""
    c = fal.EXPERIMENT.config("quick")
    fields = fal._cache_fields(c)
    leaves = [f.name for s in dataclasses.fields(c) if dataclasses.is_dataclass(getattr(c, s.name))
              for f in dataclasses.fields(getattr(c, s.name))]
    top = [f.name for f in dataclasses.fields(c) if not dataclasses.is_dataclass(getattr(c, f.name))]
    assert len(fields) == len(leaves) + len(top) - 1 and "progress" not in fields
    assert (fields["fm_lr"], fields["learner_steps"], fields["weight_decay"], fields["noise_rates"]) == (
        c.fm.lr, c.learner.steps, c.learner.weight_decay, c.noise.rates)
