"""nmars experiment config: every section's bad value is refused at construction, naming its dotted field."""

from __future__ import annotations

import dataclasses

import pytest

from experiments import nmars as exp
from experiments import registry


@pytest.mark.parametrize("section,field,value,match", [
    ("task", "name", "reverse", r"task.name must be one of \('sort', 'msd_addition'\); got 'reverse'"),
    ("augment", "kind", "random", r"augment.kind must be one of \('inferred', 'diff'\); got 'random'"),
    ("augment", "diff_spans", "last", r"augment.diff_spans must be one of"),
    ("augment", "diff_alignment", "greedy", r"augment.diff_alignment must be one of"),
    ("augment", "sample_extra_tokens", -1, r"augment.sample_extra_tokens must be >= 0; got -1"),
])
def test_config_errors_name_the_dotted_field(section, field, value, match):
    smoke = exp.EXPERIMENT.config("smoke")
    with pytest.raises(registry.ConfigError, match=match):
        dataclasses.replace(smoke, **{section: dataclasses.replace(getattr(smoke, section), **{field: value})})
    with pytest.raises(registry.ConfigError, match=r"seeds must be distinct; got \(0, 0\)"):
        dataclasses.replace(smoke, seeds=(0, 0))


def test_study_preset_changes_only_the_augmentation_and_the_warm_start():
    quick, study = exp.EXPERIMENT.config("quick"), exp.EXPERIMENT.config(exp._STUDY)
    assert study.augment == dataclasses.replace(quick.augment, kind="diff", fraction=1.0)
    assert study.train == dataclasses.replace(quick.train, base_steps=exp.BASE_STEPS_WEAK)
    assert study == dataclasses.replace(quick, augment=study.augment, train=study.train, seeds=(0, 1, 2))
