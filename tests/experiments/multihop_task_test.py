"""The multi-hop verification task: claims checked by brute force against their knowledge base."""

from __future__ import annotations

import collections

import numpy as np
import pytest

from algorithms.rl import scm_grpo as scm
from experiments.tasks import lm_batch, prompt_batch
from experiments.tasks.multihop import MultiHopTask, WordTokenizer

TASK = MultiHopTask()


@pytest.fixture(scope="module")
def problems():
    return TASK.sample(600, seed=5)


def _compose(tails, start, relations):
    """Independent reference: walk the world table relation by relation."""
    x = start
    for r in relations:
        x = tails[r][x]
    return x


def test_claims_are_k_hop_with_gold_facts_present(problems):
    assert {p.hops for p in problems} == {2, 3, 4}
    for p in problems:
        assert len(p.relations) == p.hops and len(set(p.relations)) == p.hops
        assert len(p.facts) == TASK.num_facts
        # Every fact is a fact of the world.
        assert all(p.tails[f.relation][f.head] == f.tail for f in p.facts)
        # The k gold facts (x_{i-1}, r_i, x_i) are in the evidence.
        walk = [p.start]
        for r in p.relations:
            walk.append(p.tails[r][walk[-1]])
        facts = {(f.head, f.relation, f.tail) for f in p.facts}
        assert all((walk[i], p.relations[i], walk[i + 1]) in facts for i in range(p.hops))
        assert p.gold_chain == tuple(walk[1:])
        # Each entity heads at most one evidence fact (the walk is determined by the evidence).
        heads = [f.head for f in p.facts]
        assert len(heads) == len(set(heads))


def test_labels_are_true_and_false_under_the_kb(problems):
    labels = collections.Counter(p.label for p in problems)
    assert set(labels) == {"SUPPORTS", "REFUTES"} and min(labels.values()) > 200
    for p in problems:
        reached = _compose(p.tails, p.start, p.relations)
        assert (reached == p.claimed) == (p.label == "SUPPORTS")
        assert TASK.verify(p) == (p.label == "SUPPORTS")
        assert TASK.solve_from_evidence(p) == p.label
        # The claimed entity always occurs in the evidence (no "unseen entity" shortcut).
        assert p.claimed in {e for f in p.facts for e in (f.head, f.tail)}


def test_refutations_are_near_misses(problems):
    kinds = collections.Counter()
    for p in problems:
        if p.label != "REFUTES":
            continue
        walk = [p.start] + list(p.gold_chain)
        over = {f.tail for f in p.facts if f.head == walk[-1]}
        kinds["short" if p.claimed == walk[-2] else "over" if p.claimed in over else "other"] += 1
    assert kinds["short"] > 30 and kinds["over"] > 30


def test_deterministic_in_seed():
    a = TASK.sample(20, seed=3)
    assert a == TASK.sample(20, seed=3)
    assert a != TASK.sample(20, seed=4)
    assert a != MultiHopTask(seed=1).sample(20, seed=3)
    assert {p.hops for p in TASK.sample(10, seed=3, hops=4)} == {4}


def test_text_format_round_trips_and_fits(problems):
    tok = TASK.tokenizer()
    assert tok.vocab_size <= 100
    for p in problems[:100]:
        prompt, target = TASK.prompt(p), TASK.target(p)
        assert len(prompt.split()) <= TASK.max_prompt_len
        assert len(target.split()) <= TASK.max_target_len()
        assert tok.decode(tok.encode(prompt)) == prompt
        parsed = scm.parse_compact(target)
        assert parsed.ok and parsed.answer == p.label
        assert scm.check_graph(parsed.graph, allowed_nodes=p.node_ids) is None
        assert scm.graph_depth(parsed.graph) == p.hops
    b = lm_batch(tok, [TASK.prompt(p) for p in problems[:4]], [TASK.target(p) for p in problems[:4]],
                 seq_len=TASK.max_prompt_len + TASK.max_target_len() + 2)
    assert b["tokens"].shape == (4, TASK.max_prompt_len + TASK.max_target_len() + 2)
    pb = prompt_batch(tok, [TASK.prompt(p) for p in problems[:4]], seq_len=TASK.max_prompt_len + 1)
    assert (pb["prompt_lengths"] <= TASK.max_prompt_len + 1).all()


def test_word_tokenizer_errors():
    with pytest.raises(ValueError, match="repeated"):
        WordTokenizer(["a", "a"])
    with pytest.raises(ValueError, match="'zz'"):
        WordTokenizer(["a"]).encode("a zz")
    assert WordTokenizer(["a", "b"]).decode(np.array([1, 4, 3, 2, 4])) == "b a"


@pytest.mark.parametrize("kwargs, name", [({"min_hops": 5}, "min_hops"), ({"num_relations": 2}, "num_relations"),
                                          ({"num_facts": 3}, "num_facts"), ({"num_entities": 5}, "num_entities")])
def test_task_validation(kwargs, name):
    with pytest.raises(ValueError, match=name):
        MultiHopTask(**kwargs)
    with pytest.raises(ValueError, match="hops"):
        TASK.sample(2, seed=0, hops=7)
