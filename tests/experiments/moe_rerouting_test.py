"""Tests of the moe_rerouting experiment's paired exact-match test (issue 33): McNemar's exact p-values against
a brute-force binomial sum and scipy, and the paired prompt set."""

import math

import numpy as np
import pytest
from scipy import stats

from experiments import moe_rerouting as mr
from experiments import registry


def _brute(treated, control):
    """Discordant counts and the one- and two-sided exact p-values by summing binomial(n, 1/2) terms."""
    b = sum(1 for x, y in zip(treated, control) if x and not y)
    c = sum(1 for x, y in zip(treated, control) if y and not x)
    n = b + c
    if n == 0:
        return b, c, 1.0, 1.0, 1.0
    pmf = [math.comb(n, k) / 2 ** n for k in range(n + 1)]
    p_gt = sum(pmf[b:])
    p_lt = sum(pmf[:b + 1])
    # Two-sided (scipy's rule): every outcome no more likely than the observed one.
    p_two = min(1.0, sum(q for q in pmf if q <= pmf[b] * (1 + 1e-7)))
    return b, c, p_gt, p_lt, p_two


@pytest.mark.parametrize("seed", range(6))
def test_mcnemar_exact_against_brute_force_and_scipy(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(5, 60))
    control = rng.random(n) < 0.3
    treated = np.where(rng.random(n) < 0.3, ~control, control)  # about 30% discordant pairs
    out = mr.mcnemar_exact(treated, control)
    b, c, p_gt, p_lt, p_two = _brute(treated.tolist(), control.tolist())
    assert (out["treated_only"], out["control_only"], out["n"]) == (b, c, n)
    np.testing.assert_allclose([out["p_greater"], out["p_less"], out["p_two_sided"]], [p_gt, p_lt, p_two],
                               rtol=1e-9)
    if b + c:
        assert out["p_greater"] == pytest.approx(stats.binomtest(b, b + c, 0.5, alternative="greater").pvalue)
    assert out["treated_rate"] == pytest.approx(treated.mean())
    assert out["control_rate"] == pytest.approx(control.mean())


def test_mcnemar_exact_known_values():
    # b = 10, c = 2: P(Bin(12, 1/2) >= 10) = (66 + 12 + 1) / 4096.
    treated = np.array([True] * 10 + [False] * 2 + [True] * 5 + [False] * 7)
    control = np.array([False] * 10 + [True] * 2 + [True] * 5 + [False] * 7)
    out = mr.mcnemar_exact(treated, control)
    assert out["p_greater"] == pytest.approx(79 / 4096)
    assert out["p_two_sided"] == pytest.approx(2 * 79 / 4096)
    # Concordant pairs do not matter; no discordant pair gives p = 1.
    same = mr.mcnemar_exact(control, control)
    assert same["p_greater"] == same["p_less"] == same["p_two_sided"] == 1.0


@pytest.mark.parametrize("treated, control", [([], []), ([True, False], [True]), ([[True]], [[False]])])
def test_mcnemar_exact_rejects_bad_shapes(treated, control):
    with pytest.raises(ValueError, match="treated and control"):
        mr.mcnemar_exact(np.asarray(treated, bool), np.asarray(control, bool))


def test_paired_set_holds_shifted_copy_arithmetic_answers():
    c = mr.Config(eval=mr.EvalSection(em_prompts_per_family=6), progress=False)
    data = mr._em_data(c)
    # Per 6 prompts: unseen lengths 6, rare domain 0, interleaved 6, distracting turn 4 (copy, arith of 3).
    assert data["tokens"].shape[0] == 16
    assert set(data["family"]) == {"unseen_lengths", "interleaved", "distracting_turn"}
    assert not any(d.startswith("markov") for d in data["domains"])
    assert np.all(data["cont_lengths"] >= 1)
    # The NLL set's shifted copy/arithmetic prompts are the first ones of the paired set, family by family.
    small = mr._eval_data(mr.Config(eval=mr.EvalSection(per_family=3), progress=False), mr.DomainTask(seed=0))
    for f in ("unseen_lengths", "interleaved"):
        rows_small = small["tokens"][small["family"] == f]
        rows_big = data["tokens"][data["family"] == f]
        np.testing.assert_array_equal(rows_small, rows_big[:len(rows_small)])


@pytest.mark.parametrize("section, field, value, message", [
    ("eval", "em_alpha", 0.0, r"eval\.em_alpha must be in \(0, 1\); got 0.0"),
    ("eval", "em_alpha", 1.0, r"eval\.em_alpha must be in \(0, 1\); got 1.0"),
    ("eval", "em_prompts_per_family", 0, r"eval\.em_prompts_per_family must be >= 1; got 0"),
    ("eval", "prompt_len", 7, r"eval\.prompt_len must be >= 8; got 7"),
    ("train", "steps", 0, r"train\.steps must be >= 1; got 0"),
    ("retrieval", "num_neighbors", 300, r"retrieval\.num_neighbors must be <= retrieval\.bank_size=256; got 300"),
    ("sweep", "intervals", (2, -1), r"sweep\.intervals must be >= 0; got \(2, -1\)"),
])
def test_config_validation_at_construction_names_the_field(section, field, value, message):
    sections = {"eval": mr.EvalSection, "train": mr.TrainSection, "retrieval": mr.RetrievalSection,
                "sweep": mr.SweepSection}
    with pytest.raises(registry.ConfigError, match=message) as e:
        mr.Config(**{section: sections[section](**{field: value})})
    assert e.value.field == f"{section}.{field}"
