"""SortingTask: disjoint hash split, sorted answers, one token per number, argument checks."""

import pytest

from experiments.tasks.sorting import SortingTask


def test_sorting_task_split_answers_and_tokens():
    task = SortingTask(length=5, num_values=20, test_fraction=0.2, seed=3)
    tok = task.tokenizer()
    train, train_ans = task.sample(200, split="train", seed=0)
    test, _ = task.sample(50, split="test", seed=0)
    assert not set(train) & set(test)
    assert all(task.split_of(p) == "train" for p in train) and all(task.split_of(p) == "test" for p in test)
    for p, a in zip(train, train_ans):
        nums = task.decode_numbers(p[:-1])
        assert task.decode_numbers(a) == sorted(nums) and len(tok.encode(p + a)) == 11
        assert task.is_correct(p, a)
    assert task.sample(10, split="train", seed=1) == task.sample(10, split="train", seed=1)
    assert task.max_seq_len == 1 + 6 + 5 + 1
    with pytest.raises(ValueError, match="num_values"):
        SortingTask(num_values=1)
    with pytest.raises(ValueError, match="prompt"):
        task.answer("abc")
