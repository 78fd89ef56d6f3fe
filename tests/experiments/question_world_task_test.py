"""The CAMP question world: ratings, parsing, splits, exact scores and the rated preference pairs."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from experiments.camp import build_pairs
from experiments.tasks.question_world import Question, QuestionWorld, Response

W = QuestionWorld(num_entities=10, num_relations=3, num_answers=5, known_fraction=0.6, seed=1)


def test_world_is_deterministic_with_the_known_fraction():
    qs = W.questions
    assert qs == QuestionWorld(num_entities=10, num_relations=3, num_answers=5, known_fraction=0.6, seed=1).questions
    assert len(qs) == 30 and sum(q.known for q in qs) == 18
    assert {(q.entity, q.relation) for q in qs} == set(itertools.product(range(10), range(3)))
    assert all(0 <= q.answer < 5 for q in qs)


def test_split_is_stratified_and_disjoint():
    a, b = W.split(0.5, seed=2)
    assert len(a) + len(b) == 30 and not set(a) & set(b)
    assert sum(q.known for q in a) == 9 and sum(not q.known for q in a) == 6


def test_text_round_trip_and_parse():
    tok = W.tokenizer()
    for r in (Response("answer", 3), Response("hedged", 0), Response("idk")):
        text = W.render(r)
        assert W.parse(tok.decode(tok.encode(text))) == r
    for junk in ("", "e1", "maybe", "a9", "maybe IDK", "a1 a2", "IDK IDK"):
        assert W.parse(junk) == Response("malformed")


def test_ratings_table_and_where_the_objectives_conflict():
    q = Question(0, 0, answer=2, known=True)
    rated = {name: W.ratings(q, r) for name, r in {
        "correct": Response("answer", 2), "hedged_correct": Response("hedged", 2), "wrong": Response("answer", 1),
        "hedged_wrong": Response("hedged", 1), "idk": Response("idk"), "junk": Response("malformed")}.items()}
    assert rated == {"correct": (1.0, 1.0), "hedged_correct": (1.0, 0.75), "wrong": (0.0, 0.5),
                     "hedged_wrong": (0.5, 0.25), "idk": (1.0, 0.0), "junk": (0.0, 0.0)}
    conflicts = {tuple(sorted((x, y))) for x, y in itertools.combinations(rated, 2)
                 if (rated[x][0] - rated[y][0]) * (rated[x][1] - rated[y][1]) < 0}
    # Truthfulness and helpfulness disagree only where a (more) wrong answer is rated more helpful.
    assert conflicts == {("idk", "wrong"), ("hedged_wrong", "wrong"), ("hedged_wrong", "idk")}


def test_scores_of_reference_policies():
    qs = W.questions
    oracle = [Response("answer", q.answer) if q.known else Response("idk") for q in qs]
    s = W.score(qs, oracle)
    assert s["truthfulness"] == 1.0 and s["helpfulness"] == 1.0 and s["hallucination_rate"] == 0.0
    assert s["abstain_rate_unknown"] == 1.0 and s["abstain_rate_known"] == 0.0
    idk = W.score(qs, [Response("idk")] * len(qs))
    assert idk["truthfulness"] == 1.0 and idk["helpfulness"] == 0.0
    wrong = [Response("answer", (q.answer + 1) % 5) for q in qs]
    w = W.score(qs, wrong)
    assert w["truthfulness"] == 0.0 and w["hallucination_rate"] == 1.0 and w["helpfulness"] == 0.0
    guess = [Response("answer", q.answer) if q.known else Response("hedged", (q.answer + 1) % 5) for q in qs]
    g = W.score(qs, guess)
    np.testing.assert_allclose(g["truthfulness"], (18 + 0.5 * 12) / 30)
    assert g["helpfulness"] == 1.0


def test_candidates_and_rated_pairs():
    known = Question(0, 0, answer=2, known=True)
    unknown = Question(0, 1, answer=4, known=False)
    assert W.candidates(known, [2, 2]) == [Response("answer", 2), Response("hedged", 2), Response("idk")]
    assert W.candidates(unknown, [1, 3, 1]) == [Response("answer", 1), Response("answer", 3), Response("hedged", 1),
                                                Response("hedged", 3), Response("idk")]
    pairs, stats = build_pairs(W, [known, unknown], {0: [2, 2], 1: [1, 3]})
    # known: 3 candidates -> 3 pairs, none conflicting; unknown: 10 pairs, 2 tied on both dropped
    # ((a1, a3) and (maybe a1, maybe a3)), all 8 others conflicting.
    assert stats["num_pairs"] == 11 and stats["pairs_known_questions"] == 3
    assert stats["conflict_fraction_known"] == 0.0 and stats["conflict_fraction_unknown"] == 1.0
    assert pairs["a_inputs"].shape == (11, 5) and pairs["delta_t"].shape == (11,)
    assert not np.any((pairs["delta_t"] == 0) & (pairs["delta_h"] == 0))


def test_bad_input():
    with pytest.raises(ValueError, match=r"num_answers must be >= 2"):
        QuestionWorld(num_answers=1)
    with pytest.raises(ValueError, match=r"known_fraction must lie in \[0, 1\]; got 1.5"):
        QuestionWorld(known_fraction=1.5)
    with pytest.raises(ValueError, match=r"fraction must lie in \(0, 1\]"):
        W.split(0.0)
    with pytest.raises(ValueError, match=r"responses: expected one per question \(30\); got 1"):
        W.score(W.questions, [Response("idk")])
    with pytest.raises(ValueError, match=r"only answer / hedged / idk"):
        W.render(Response("malformed"))
