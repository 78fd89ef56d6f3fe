"""The prim experiment's own logic (no training): the in-LM stage schedule of each arm, the scoring FLOPs
that the modeled FLOPs add per stage (the pyramid's second stage and merging included, by hand), and
configuration errors naming the field."""

from __future__ import annotations

import numpy as np
import pytest

from algorithms.compression import prim
from experiments import prim as exp
from models.transformer import TransformerConfig


def test_stage_schedule_of_each_arm():
    c = exp.Config(model=exp.ModelSection(num_layers=4),
                   pruning=exp.PruningSection(prune_layer=2, pyramid_layer=1, eps=0.2))
    assert exp._in_lm_stages(c, "prim_pre") == () and exp._in_lm_stages(c, "uniform") == ()
    (single,) = exp._in_lm_stages(c, "prim")
    assert (single.kind, single.layer, single.mass) == ("adaptive", 2, c.pruning.retention_mass)
    assert exp._in_lm_stages(c, "prim_merge") == exp._in_lm_stages(c, "prim")
    first, second = exp._in_lm_stages(c, "prim_pyramid")
    assert (first.kind, first.layer, second.kind, second.layer) == ("adaptive", 1, "adaptive", 2)
    first, second = exp._in_lm_stages(c, "prim_eps")
    assert (first.layer, second.kind, second.layer, second.eps) == (1, "epsilon", 2, 0.2)


def test_overhead_counts_every_stage_and_merging_by_hand():
    cfg = TransformerConfig(vocab_size=10, d_model=8, num_layers=3, num_heads=2, num_kv_heads=1, d_ff=16)
    c = exp.Config(pruning=exp.PruningSection(relevance="layer0"))
    n_q, text = np.array([3]), np.array([6])
    av_layers = np.array([[20, 12, 5]])  # AV tokens at layers 0, 1, 2
    D, h, k, d = 8, 2, 1, 4
    rel = 2 * D * d * (h * 3 + k * 45) + 2 * h * d * 3 * 45  # layer-0 relevance, 3 queries x 45 AV keys
    row = lambda keys: 2 * D * h * d + 2 * h * d * keys  # noqa: E731  one query row of an in-LM stage
    got = exp._overhead(c, "prim_pyramid", cfg, n_q, 45, text, av_layers, 20)
    assert got[0] == pytest.approx(rel + row(6 + 20) + row(6 + 12))  # stages at layers 0 and 1
    got = exp._overhead(c, "prim", cfg, n_q, 45, text, av_layers, 20)
    assert got[0] == pytest.approx(rel + row(6 + 12))  # one stage at prune_layer = 1
    got = exp._overhead(c, "prim_merge", cfg, n_q, 45, text, av_layers, 20)
    assert got[0] == pytest.approx(rel + row(6 + 12) + 2 * D * (45 - 20) * 20)
    got = exp._overhead(c, "fastv", cfg, n_q, 45, text, av_layers, 20)
    assert got[0] == pytest.approx(row(6 + 12))
    assert exp._overhead(c, "uniform", cfg, n_q, 45, text, av_layers, 20)[0] == 0
    # the second stage's smaller layer-2 count lowers the modeled FLOPs (same first layers)
    assert prim.modeled_flops(cfg, text + np.array([20, 12, 5])) < prim.modeled_flops(cfg, text + np.array([20, 12, 12]))


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match="pyramid_layer"):
        exp.Config(pruning=exp.PruningSection(pyramid_layer=1, prune_layer=1))
    with pytest.raises(ValueError, match="ablation_fractions"):
        exp.Config(pruning=exp.PruningSection(ablation_fractions=(0.5,)))
    with pytest.raises(ValueError, match="methods"):
        exp.Config(pruning=exp.PruningSection(methods=("prim", "tome")))
    # no ablation arm: nothing to check
    exp.Config(pruning=exp.PruningSection(ablation_fractions=(0.5,), methods=("uniform", "prim")))
