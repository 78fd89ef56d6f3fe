"""staged_vlm experiment config: bad values are refused at construction naming the dotted field, the stage split,
and the cache keys' flat names (cached warm starts and arm runs stay valid)."""

from __future__ import annotations

import dataclasses

import pytest

from algorithms.rl import staged_perception as sp
from experiments import registry
from experiments import staged_vlm as exp


@pytest.mark.parametrize("section,field,value,match", [
    ("rl", "split", (0.5, 0.5, 0.0), r"rl.split must be 3 positive fractions; got \(0.5, 0.5, 0.0\)"),
    ("rl", "orders", (("perception", "text_reasoning"),), r"rl.orders must be permutations of"),
    ("rl", "orders", (sp.ABSTRACT_ORDER,), r"rl.orders must include the recipe's order"),
    ("rl", "iterations", 2, r"rl.iterations must be >= 3 \(one per stage\); got 2"),
    ("plan", "curriculum_k", 0, r"plan.curriculum_k must be >= 1; got 0"),
    ("eval", "examples", 0, r"eval.examples must be >= 1; got 0"),
])
def test_config_errors_name_the_dotted_field(section, field, value, match):
    smoke = exp.EXPERIMENT.config("smoke")
    with pytest.raises(registry.ConfigError, match=match):
        dataclasses.replace(smoke, **{section: dataclasses.replace(getattr(smoke, section), **{field: value})})


def test_stage_iterations_split_rl_iterations_by_largest_remainders():
    assert exp.EXPERIMENT.config("quick").stage_iterations == {"perception": 10, "text_reasoning": 40,
                                                               "visual_reasoning": 50}
    c = exp.Config(rl=exp.RLSection(iterations=3))
    assert c.stage_iterations == {"perception": 1, "text_reasoning": 1, "visual_reasoning": 1}


def test_flat_fields_name_every_setting_once():
    c = exp.EXPERIMENT.config("paper")
    flat = exp.flat_fields(c)

    def leaves(obj, prefix=""):
        for f in dataclasses.fields(obj):
            v = getattr(obj, f.name)
            yield from (leaves(v, f"{prefix}{f.name}.") if dataclasses.is_dataclass(v) else [f"{prefix}{f.name}"])

    assert sorted(exp._FLAT.values()) == sorted(leaves(c))
    assert (flat["sft_steps"], flat["rl_lr"], flat["eval_examples"], flat["orders"]) == (
        c.sft.steps, c.rl.lr, c.eval.examples, c.rl.orders)
