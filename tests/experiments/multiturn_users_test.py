"""The simulated multi-turn users: task outputs, token layout, feedback rules and their noise rates."""

from __future__ import annotations

import math

import numpy as np
import pytest

from algorithms.alignment.rosa2 import CLOSER, CORRECT, HINT, WRONG
from experiments.tasks.multiturn_users import AMBIG, BOS, EOS, SEP, MultiTurnUsers, apply_intent

USERS = MultiTurnUsers(num_symbols=6, length=4, hint_rate=0.3, hint_noise=0.25, closer_noise=0.15, seed=3)


def _within(count: int, n: int, p: float, sigmas: float = 4.5) -> bool:
    return abs(count / n - p) <= sigmas * math.sqrt(p * (1 - p) / n) + 1e-12


def test_intents_on_a_known_example():
    x = np.array([[3, 0, 5, 1]])
    np.testing.assert_array_equal(apply_intent("reverse", x, 6), [[1, 5, 0, 3]])
    np.testing.assert_array_equal(apply_intent("sort", x, 6), [[0, 1, 3, 5]])
    np.testing.assert_array_equal(apply_intent("shift", x, 6), [[4, 1, 0, 2]])
    np.testing.assert_array_equal(apply_intent("rotate", x, 6), [[0, 5, 1, 3]])
    with pytest.raises(ValueError, match="intent"):
        apply_intent("double", x, 6)


def test_layout_prompts_targets_and_train_batch():
    u = USERS
    assert u.vocab_size == 5 + 4 + 6 and u.prompt_len == 7
    x = np.array([[3, 0, 5, 1], [1, 1, 2, 0]])
    p = u.prompts(np.array([-1, 2]), x)
    np.testing.assert_array_equal(p[0], [BOS, AMBIG, 3 + 9, 0 + 9, 5 + 9, 1 + 9, SEP])
    assert p[1, 1] == AMBIG + 1 + 2
    t = u.targets(x, np.array([1, 3]))
    np.testing.assert_array_equal(t, np.array([[0, 1, 3, 5], [1, 2, 0, 1]]) + 9)
    np.testing.assert_array_equal(u.outputs(x)[:, 1], np.sort(x, -1) + 9)
    b = u.train_batch(64, np.random.default_rng(0), ambiguous_fraction=0.5)
    assert b["inputs"].shape == (64, 11) and b["loss_mask"].shape == (64, 11)
    # Loss on the L answer tokens and EOS only; every target there is a symbol or EOS.
    assert (b["loss_mask"][:, 6:] == 1).all() and (b["loss_mask"][:, :6] == 0).all()
    assert (b["targets"][:, -1] == EOS).all() and (b["targets"][:, 6:10] >= 9).all()
    # The answer is the output of the intent named by the instruction token (when explicit).
    inputs = b["inputs"]
    explicit = inputs[:, 1] != AMBIG
    assert explicit.any() and (~explicit).any()
    for row in np.where(explicit)[0]:
        intent = inputs[row, 1] - AMBIG - 1
        np.testing.assert_array_equal(b["targets"][row, 6:10], u.targets(inputs[row, 2:6][None] - 9,
                                                                          np.array([intent]))[0])


def test_sampled_intents_and_first_instructions_follow_their_rates():
    n = 20000
    u = MultiTurnUsers(intent_probs=(0.1, 0.2, 0.3, 0.4), ambiguous_rate=0.3)
    x, intent = u.sample(n, np.random.default_rng(1))
    for i, p in enumerate((0.1, 0.2, 0.3, 0.4)):
        assert _within(int((intent == i).sum()), n, p)
    first = u.first_instructions(intent, np.random.default_rng(2))
    assert _within(int((first == -1).sum()), n, 0.3)
    np.testing.assert_array_equal(first[first >= 0], intent[first >= 0])


def test_feedback_rules_and_noise_rates():
    n = 40000
    u = USERS
    rng = np.random.default_rng(5)
    x, intent = u.sample(n, rng)
    targets = u.targets(x, intent)
    wrong = targets.copy()
    wrong[:, 0] = u.symbol_offset + (wrong[:, 0] - u.symbol_offset + 1) % u.num_symbols  # 3 of 4 positions right
    # Correct answers: always "correct", never a hint.
    kind, hint, match = u.feedback(0, targets, targets, intent, np.zeros(n, np.int32))
    assert (kind == CORRECT).all() and (hint == -1).all() and (match == 4).all()
    # Wrong answers, previous match 4 (so not closer): hints at hint_rate, else "wrong" except flips.
    kind, hint, match = u.feedback(1, wrong, targets, intent, np.full(n, 4, np.int32))
    assert (match == 3).all()
    is_hint = kind == HINT
    assert _within(int(is_hint.sum()), n, u.hint_rate)
    assert (hint[~is_hint] == -1).all()
    assert _within(int((hint[is_hint] == intent[is_hint]).sum()), int(is_hint.sum()), 1 - u.hint_noise)
    wrong_hints = hint[is_hint & (hint != intent)]
    others = intent[is_hint & (hint != intent)]
    for d in (1, 2, 3):  # a wrong hint is uniform over the other intents
        assert _within(int(((wrong_hints - others) % 4 == d).sum()), len(others), 1 / 3)
    rest = kind[~is_hint]
    assert set(np.unique(rest)) <= {WRONG, CLOSER}
    assert _within(int((rest == CLOSER).sum()), len(rest), u.closer_noise)
    # Previous match 0: the answer moved closer, so "closer" except flips.
    kind2, _, _ = u.feedback(1, wrong, targets, intent, np.zeros(n, np.int32))
    rest2 = kind2[kind2 != HINT]
    assert _within(int((rest2 == WRONG).sum()), len(rest2), u.closer_noise)
    # Deterministic in (seed, turn); another turn draws anew.
    again = u.feedback(1, wrong, targets, intent, np.full(n, 4, np.int32))
    np.testing.assert_array_equal(again[0], kind)
    other_turn = u.feedback(2, wrong, targets, intent, np.full(n, 4, np.int32))
    assert (other_turn[0] != kind).any()


def test_user_fn_is_the_feedback_on_the_problem_targets():
    x, intent = USERS.sample(8, np.random.default_rng(0))
    fn = USERS.user_fn(x, intent)
    t = USERS.targets(x, intent)
    for a, b in zip(fn(2, t, np.zeros(8, np.int32)), USERS.feedback(2, t, t, intent, np.zeros(8, np.int32))):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("kwargs,match", [
    ({"hint_rate": 1.5}, "hint_rate"), ({"hint_noise": 1.0}, "hint_noise"), ({"closer_noise": -0.1}, "closer_noise"),
    ({"ambiguous_rate": 2.0}, "ambiguous_rate"), ({"length": 1}, "length"), ({"num_symbols": 1}, "num_symbols"),
    ({"intents": ("reverse", "double")}, "intents"), ({"intents": ("sort",)}, "intents"),
    ({"intent_probs": (0.5, 0.5)}, "intent_probs"),
])
def test_bad_settings_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MultiTurnUsers(**kwargs)


def test_bad_inputs_raise():
    u = USERS
    x, intent = u.sample(4, np.random.default_rng(0))
    t = u.targets(x, intent)
    with pytest.raises(ValueError, match="answers"):
        u.feedback(0, t[:, :3], t, intent, np.zeros(4, np.int32))
    with pytest.raises(ValueError, match="intent"):
        u.feedback(0, t, t, intent[:3], np.zeros(4, np.int32))
    with pytest.raises(ValueError, match="turn"):
        u.feedback(-1, t, t, intent, np.zeros(4, np.int32))
    with pytest.raises(ValueError, match="x must"):
        u.prompts(np.zeros(4, int), x + 10)
    with pytest.raises(ValueError, match="x must"):
        u.outputs(x[:, :2])
    with pytest.raises(ValueError, match="intent must"):
        u.prompts(np.full(4, 7), x)
    with pytest.raises(ValueError, match="ambiguous_fraction"):
        u.train_batch(4, np.random.default_rng(0), ambiguous_fraction=1.5)
    with pytest.raises(ValueError, match="n must"):
        u.sample(0, np.random.default_rng(0))
