"""The two-style corpus of the Style Modulation Heads reproduction (experiments.tasks.style_corpus)."""

import numpy as np
import pytest

from experiments.tasks import style_corpus as sc


def test_styles_markers_and_content():
    corpus = sc.StyleCorpus(max_operand=5, marker_prob=0.5, seed=3)
    exs = corpus.sample(400, seed=1)
    assert {e.marked for e in exs} == {True, False}
    assert {e.style for e in exs if e.marked} == set(sc.STYLES)
    for e in exs:
        words = e.completion.split()
        assert sc.classify_style(words) == e.style
        assert sc.well_formed(words, e.style) and not sc.well_formed(words, [s for s in sc.STYLES if s != e.style][0])
        assert sc.answer_correct(words, e.a + e.b) and not sc.answer_correct(words, e.a + e.b + 1)
        assert 0 <= e.a <= 5 and 0 <= e.b <= 5
        first = e.prompt.split()[0]
        if e.marked:
            assert first == sc.MARKERS[e.style]
        else:
            assert first == "what" and e.style == corpus.default_style
    # Same seeds, same stream; another seed, another one.
    assert corpus.sample(20, seed=1) == exs[:20]
    assert corpus.sample(20, seed=2) != exs[:20]


def test_test_prompts_withhold_the_marker_and_batches_fit():
    corpus = sc.StyleCorpus()
    prompts, answers = corpus.test_prompts(50, seed=0)
    assert all(p.split()[0] == "what" for p in prompts)
    assert all(int(p.split()[2]) + int(p.split()[4]) == a for p, a in zip(prompts, answers))
    marked, _ = corpus.test_prompts(5, seed=0, style="casual")
    assert all(p.startswith("<casual> ") for p in marked)
    tok = corpus.tokenizer()
    b = corpus.train_batch(0, batch_size=64)
    assert b["tokens"].shape == (64, corpus.max_seq_len) and b["tokens"].max() < tok.vocab_size
    # The loss covers exactly the 7 answer words and the EOS of every row.
    np.testing.assert_array_equal(b["loss_mask"].sum(1), np.full(64, 8.0))
    full = [tok.decode(row) for row in b["tokens"]]
    assert all(sc.classify_style(t.split()) in sc.STYLES for t in full)


def test_classifier_edge_cases():
    assert sc.classify_style([]) == "none"
    assert sc.classify_style(["yo", "certainly", "7"]) == "none"  # a tie
    assert sc.classify_style(["yo", "da", "certainly"]) == "casual"
    assert sc.first_number(["yo", "da", "answr", "iz", "12", "3"]) == 12
    assert sc.first_number(["lol"]) is None
    assert not sc.well_formed("yo the answr iz 7 lol !".split())  # mixed styles
    assert sc.well_formed("yo da answr iz 7 lol !".split())
    assert not sc.well_formed("yo da answr iz lol lol !".split())


def test_bad_input():
    with pytest.raises(ValueError, match="max_operand"):
        sc.StyleCorpus(max_operand=0)
    with pytest.raises(ValueError, match="marker_prob"):
        sc.StyleCorpus(marker_prob=1.5)
    with pytest.raises(ValueError, match="default_style"):
        sc.StyleCorpus(default_style="pirate")
    with pytest.raises(ValueError, match="style"):
        sc.StyleCorpus().sample(3, seed=0, style="pirate")
    with pytest.raises(ValueError, match="n: expected"):
        sc.StyleCorpus().sample(-1, seed=0)
    with pytest.raises(ValueError, match="style"):
        sc.well_formed(["yo"], "pirate")
