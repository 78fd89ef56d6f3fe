"""Tests of experiments/tasks: each generator is checked against something
independent of it (re-parsing, Python's exact integer arithmetic, an `ast`-based
reference verifier, brute-force enumeration, scikit-learn's raw data)."""

from __future__ import annotations

import ast
import collections
import itertools
import re
from fractions import Fraction

import hypothesis
import hypothesis.strategies as st
import numpy as np
import pytest
import sklearn.datasets

from experiments.tasks import (
    ArithmeticTask,
    AssociativeRecallTask,
    CharTokenizer,
    CountdownProblem,
    CountdownTask,
    lm_batch,
    load_digits,
    prompt_batch,
)

ALPHABET = "0123456789+-*="
FAST = hypothesis.settings(max_examples=50, deadline=None, derandomize=True)


# --- tokenizer ----------------------------------------------------------------------


def test_tokenizer_ids():
    tok = CharTokenizer("ab=")
    assert (tok.pad_id, tok.bos_id, tok.eos_id) == (0, 1, 2)
    assert tok.vocab_size == 6
    assert tok.encode("ba==") == [4, 3, 5, 5]


def test_tokenizer_rejects_repeated_characters():
    with pytest.raises(ValueError, match=r"alphabet.*'a'"):
        CharTokenizer("abca")


def test_encode_names_unknown_character_and_text():
    with pytest.raises(ValueError, match=r"'x'.*'12x3'"):
        CharTokenizer(ALPHABET).encode("12x3")


@FAST
@hypothesis.given(text=st.text(alphabet=ALPHABET, max_size=20), tail=st.text(alphabet=ALPHABET, max_size=5))
def test_decode_inverts_encode(text, tail):
    tok = CharTokenizer(ALPHABET)
    ids = [tok.bos_id] + tok.encode(text) + [tok.eos_id] + tok.encode(tail) + [tok.pad_id] * 3
    assert tok.decode(ids) == text
    assert tok.decode(np.array(ids, np.int32)) == text
    assert tok.decode(ids, stop_at_eos=False) == text + tail


def test_decode_rejects_out_of_range_ids():
    tok = CharTokenizer(ALPHABET)
    with pytest.raises(ValueError, match="ids"):
        tok.decode([1, tok.vocab_size])
    with pytest.raises(ValueError, match="ids"):
        tok.decode([-1])


@FAST
@hypothesis.given(
    pairs=st.lists(
        st.tuples(st.text(alphabet=ALPHABET, max_size=6), st.text(alphabet=ALPHABET, max_size=6)),
        min_size=1,
        max_size=4,
    ),
    slack=st.integers(0, 3),
)
def test_lm_batch_layout(pairs, slack):
    tok = CharTokenizer(ALPHABET)
    prompts, completions = [p for p, _ in pairs], [c for _, c in pairs]
    seq_len = max(len(p) + len(c) for p, c in pairs) + 2 + slack
    batch = lm_batch(tok, prompts, completions, seq_len=seq_len)
    b = len(pairs)
    assert batch["tokens"].shape == (b, seq_len) and batch["tokens"].dtype == np.int32
    for key in ("inputs", "targets", "loss_mask"):
        assert batch[key].shape == (b, seq_len - 1)
    assert batch["loss_mask"].dtype == np.float32
    assert batch["prompt_lengths"].dtype == np.int32
    np.testing.assert_array_equal(batch["inputs"], batch["tokens"][:, :-1])
    np.testing.assert_array_equal(batch["targets"], batch["tokens"][:, 1:])
    for i, (prompt, completion) in enumerate(pairs):
        row = batch["tokens"][i]
        expected = [1] + tok.encode(prompt) + tok.encode(completion) + [2]
        assert row.tolist() == expected + [0] * (seq_len - len(expected))
        assert batch["prompt_lengths"][i] == 1 + len(prompt)
        # The loss covers exactly the completion and the EOS, in order, and
        # starts where the last prompt token (or BOS) is the input.
        mask = batch["loss_mask"][i]
        assert set(mask.tolist()) <= {0.0, 1.0}
        assert batch["targets"][i][mask == 1].tolist() == tok.encode(completion) + [2]
        first = int(np.argmax(mask))
        assert first == batch["prompt_lengths"][i] - 1
        assert tok.decode(row[batch["prompt_lengths"][i] :]) == completion


def test_lm_batch_too_long_names_seq_len_and_needed():
    tok = CharTokenizer(ALPHABET)
    with pytest.raises(ValueError, match=r"seq_len.* 9 tokens.*seq_len=8"):
        lm_batch(tok, ["12+3="], ["15"], seq_len=8)  # BOS + 5 + 2 + EOS = 9
    assert lm_batch(tok, ["12+3="], ["15"], seq_len=9)["tokens"].shape == (1, 9)
    with pytest.raises(ValueError, match="completions"):
        lm_batch(tok, ["1+1="], [], seq_len=8)


def test_prompt_batch():
    tok = CharTokenizer(ALPHABET)
    batch = prompt_batch(tok, ["1+1=", "12*3="], seq_len=7)
    assert batch["tokens"].tolist() == [
        [1] + tok.encode("1+1=") + [0, 0],
        [1] + tok.encode("12*3=") + [0],
    ]
    assert batch["prompt_lengths"].tolist() == [5, 6]
    with pytest.raises(ValueError, match=r"seq_len.*6.*seq_len=5"):
        prompt_batch(tok, ["12*3="], seq_len=5)


# --- arithmetic ---------------------------------------------------------------------


def _value(prompt: str) -> int:
    """The exact value of a generated prompt, by Python integer arithmetic."""
    a, op, b = re.fullmatch(r"(\d+)([-+*])(\d+)=", prompt).groups()
    return {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op]


@pytest.mark.parametrize("reverse", [False, True])
def test_arithmetic_answers_are_exact(reverse):
    task = ArithmeticTask(num_digits=4, operations=("+", "-", "*"), reverse_answer=reverse)
    prompts, answers = task.sample(300, split="train", seed=1)
    ops_seen = set()
    for prompt, answer in zip(prompts, answers):
        sign, digits = ("-", answer[1:]) if answer.startswith("-") else ("", answer)
        assert digits.isdigit()
        assert int(sign + (digits[::-1] if reverse else digits)) == _value(prompt)
        assert answer == task.answer(prompt)
        ops_seen.add(re.search(r"[-+*]", prompt).group())
    assert ops_seen == {"+", "-", "*"}
    assert any(a.startswith("-") for a in answers)


def test_arithmetic_reverse_examples():
    task = ArithmeticTask(operations=("+", "-"), reverse_answer=True)
    assert task.answer("95+7=") == "201"
    assert task.answer("3-45=") == "-24"
    assert task.answer("5-5=") == "0"


def test_arithmetic_is_correct():
    task = ArithmeticTask(operations=("*",))
    assert task.is_correct("12*12=", "144")
    assert task.is_correct("12*12=", " 144\n")
    assert not task.is_correct("12*12=", "145")
    assert not task.is_correct("12*12=", "1440")
    with pytest.raises(ValueError, match="prompt"):
        task.answer("12x12=")


def test_arithmetic_operand_lengths_are_uniform():
    task = ArithmeticTask(num_digits=3, test_fraction=0.0)
    prompts, _ = task.sample(900, split="train", seed=0)
    for side in (0, 1):
        lengths = collections.Counter(len(p[:-1].split("+")[side]) for p in prompts)
        assert set(lengths) == {1, 2, 3}
        # Binomial(900, 1/3): sd ~ 14; allow 5 sd.
        assert all(abs(count - 300) <= 70 for count in lengths.values()), lengths


def test_arithmetic_split_is_disjoint_and_has_the_right_size():
    task = ArithmeticTask(num_digits=2, test_fraction=0.2, seed=3)
    train, _ = task.sample(400, split="train", seed=0)
    test, _ = task.sample(400, split="test", seed=0)
    assert not set(train) & set(test)
    assert {task.split_of(p) for p in train} == {"train"}
    assert {task.split_of(p) for p in test} == {"test"}
    # Over all 100 * 100 problems, the test share is ~ Binomial(10^4, 0.2)/10^4.
    every = [f"{a}+{b}=" for a in range(100) for b in range(100)]
    share = np.mean([task.split_of(p) == "test" for p in every])
    assert abs(share - 0.2) < 4 * np.sqrt(0.2 * 0.8 / len(every))
    # Another seed holds out other problems.
    other = ArithmeticTask(num_digits=2, test_fraction=0.2, seed=4)
    assert [other.split_of(p) for p in every] != [task.split_of(p) for p in every]


@pytest.mark.parametrize("num_digits", [1, 2])
@pytest.mark.parametrize("ops", [("+",), ("-",), ("*",), ("+", "-", "*")])
def test_arithmetic_max_seq_len_by_brute_force(num_digits, ops):
    task = ArithmeticTask(num_digits=num_digits, operations=ops)
    numbers = range(10**num_digits)
    longest = max(
        1 + len(f"{a}{op}{b}=") + len(task.answer(f"{a}{op}{b}=")) + 1
        for a, b in itertools.product(numbers, numbers)
        for op in ops
    )
    assert task.max_seq_len == longest


def test_arithmetic_train_batch_is_deterministic_and_decodes():
    task = ArithmeticTask(num_digits=3, operations=("+", "*"), seed=5)
    tok = task.tokenizer()
    batch = task.train_batch(7, batch_size=16, seq_len=task.max_seq_len)
    again = task.train_batch(7, batch_size=16, seq_len=task.max_seq_len)
    other = task.train_batch(8, batch_size=16, seq_len=task.max_seq_len)
    for key in batch:
        np.testing.assert_array_equal(batch[key], again[key])
    assert not np.array_equal(batch["tokens"], other["tokens"])
    same = lm_batch(tok, *task.sample(16, split="train", seed=7), seq_len=task.max_seq_len)
    np.testing.assert_array_equal(batch["tokens"], same["tokens"])
    for i in range(16):
        p = batch["prompt_lengths"][i]
        prompt = tok.decode(batch["tokens"][i, :p])
        completion = tok.decode(batch["tokens"][i, p:])
        assert task.split_of(prompt) == "train"
        assert int(completion) == _value(prompt)


def test_arithmetic_bad_arguments():
    task = ArithmeticTask()
    with pytest.raises(ValueError, match="split.*'valid'"):
        task.sample(4, split="valid", seed=0)
    with pytest.raises(ValueError, match="split.*'test'.*test_fraction=0"):
        ArithmeticTask(test_fraction=0.0).sample(4, split="test", seed=0)
    with pytest.raises(ValueError, match="operations.*'/'"):
        ArithmeticTask(operations=("+", "/"))
    with pytest.raises(ValueError, match="num_digits.*0"):
        ArithmeticTask(num_digits=0)
    with pytest.raises(ValueError, match="test_fraction.*1.5"):
        ArithmeticTask(test_fraction=1.5)


def test_arithmetic_alphabet_covers_everything():
    task = ArithmeticTask(num_digits=3, operations=("+", "-", "*"), reverse_answer=True)
    prompts, answers = task.sample(200, split="train", seed=2)
    assert set("".join(prompts + answers)) <= set(task.alphabet)
    task.tokenizer().encode("".join(prompts + answers))


# --- countdown ----------------------------------------------------------------------


def _reference_value(expression: str) -> tuple[Fraction, list[int]] | None:
    """An independent evaluator: Python's `ast` with a whitelist, exact Fractions."""
    if re.search(r"(?<![0-9])0[0-9]", expression):  # leading zeros ("00" parses in Python)
        return None
    try:
        tree = ast.parse(expression.lstrip(" "), mode="eval")  # eval() strips too
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    numbers = []
    ops = {ast.Add: Fraction.__add__, ast.Sub: Fraction.__sub__, ast.Mult: Fraction.__mul__, ast.Div: Fraction.__truediv__}

    def value(node):
        if isinstance(node, ast.BinOp) and type(node.op) in ops:
            return ops[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.Constant) and type(node.value) is int:
            numbers.append(node.value)
            return Fraction(node.value)
        raise TypeError(node)

    try:
        return value(tree.body), numbers
    except (TypeError, ZeroDivisionError):
        return None


def _reference_verify(problem: CountdownProblem, expression: str) -> bool:
    result = _reference_value(expression)
    return (
        result is not None
        and sorted(result[1]) == sorted(problem.numbers)
        and result[0] == problem.target
    )


@pytest.fixture(scope="module")
def countdown():
    task = CountdownTask()
    return task, task.sample(100, seed=0)


def test_countdown_problems_are_valid_and_solvable(countdown):
    task, problems = countdown
    for problem in problems:
        assert len(problem.numbers) == 3
        assert all(1 <= x <= task.max_number for x in problem.numbers)
        assert 1 <= problem.target <= task.max_target
        assert task.verify(problem, problem.solution)
        assert _reference_verify(problem, problem.solution)
        assert task.reward(problem, problem.solution) == 1.0
    assert len({p.target for p in problems}) > 20  # not degenerate


def test_countdown_solve_agrees_with_reference(countdown):
    task, problems = countdown
    for problem in problems[:30]:
        solutions = task.solve(problem)
        assert problem.solution in solutions
        assert solutions == sorted(set(solutions))
        assert all(_reference_verify(problem, s) for s in solutions)
        assert all(len(s) <= task.max_solution_len for s in solutions)


def _all_fully_parenthesised(numbers):
    """Every expression tree over `numbers` (each used once), fully parenthesised."""
    if len(numbers) == 1:
        yield str(numbers[0])
        return
    for order in set(itertools.permutations(numbers)):
        for k in range(1, len(order)):
            for left in _all_fully_parenthesised(order[:k]):
                for right in _all_fully_parenthesised(order[k:]):
                    for op in "+-*/":
                        yield f"({left}{op}{right})"


@pytest.mark.parametrize("numbers", [(2, 5, 7), (3, 3, 8), (1, 9, 9)])
def test_countdown_solve_is_complete(numbers):
    """solve finds a solution for exactly the targets some expression reaches."""
    task = CountdownTask()
    reachable = set()
    for expression in _all_fully_parenthesised(numbers):
        result = _reference_value(expression)
        if result is not None and result[0].denominator == 1:
            reachable.add(int(result[0]))
    for target in range(-5, 120):
        problem = CountdownProblem(numbers=numbers, target=target, solution="")
        assert bool(task.solve(problem)) == (target in reachable), target


def test_countdown_verify_agrees_with_reference_on_mutations(countdown):
    task, problems = countdown
    rng = np.random.default_rng(0)
    chars = "0123456789+-*/() "
    accepted = rejected = 0
    for problem in problems:
        for _ in range(40):
            s = list(problem.solution)
            for _ in range(rng.integers(1, 4)):
                kind, at = rng.integers(3), rng.integers(len(s) + 1)
                if kind == 0:
                    s.insert(at, chars[rng.integers(len(chars))])
                elif kind == 1 and at < len(s):
                    del s[at]
                elif at < len(s):
                    s[at] = chars[rng.integers(len(chars))]
            candidate = "".join(s)
            got = task.verify(problem, candidate)
            assert got == _reference_verify(problem, candidate), candidate
            accepted += got
            rejected += not got
    assert accepted > 0 and rejected > 0  # e.g. "3+9+9" -> "9+3+9" stays correct


def test_countdown_verify_agrees_with_reference_on_fully_parenthesised():
    task = CountdownTask()
    problem = CountdownProblem(numbers=(2, 5, 7), target=24, solution="")
    results = []
    for expression in _all_fully_parenthesised((2, 5, 7)):
        assert task.verify(problem, expression) == _reference_verify(problem, expression)
        results.append(task.verify(problem, expression))
    assert any(results) and not all(results)


@pytest.mark.parametrize(
    "expression",
    [
        "",
        "3*7",  # a number missing
        "3*7+9+9",  # a number reused
        "3*7+8",  # a wrong number
        "3*7+09",  # leading zero
        "7*3-(-9)",  # unary minus (= 30 otherwise)
        "7*3+(+9)",
        "3*7++9",
        "(3*7+9",
        "3*7+9)",
        "3**7+9",
        "3*7//9",
        "3 7+9",
        "(3)(7)+9",
        "__import__('os')",
        "3.0*7+9",
        "30",
    ],
)
def test_countdown_verify_rejects(expression):
    problem = CountdownProblem(numbers=(3, 7, 9), target=30, solution="3*7+9")
    assert not CountdownTask().verify(problem, expression)
    assert CountdownTask().reward(problem, expression) == 0.0


def test_countdown_verify_accepts_equivalent_forms_and_spaces():
    task = CountdownTask()
    problem = CountdownProblem(numbers=(3, 7, 9), target=30, solution="3*7+9")
    for expression in ("3*7+9", " 9 + 7 * 3 ", "((3*7))+(9)", "(7*3)+9"):
        assert task.verify(problem, expression), expression
    assert task.reward(problem, " 9+3*7\n") == 1.0


def test_countdown_division_is_exact_and_zero_division_fails():
    task = CountdownTask()
    # 7/2*4 = 14 only with exact (not integer) division.
    assert task.verify(CountdownProblem((7, 2, 4), 14, ""), "7/2*4")
    assert not task.verify(CountdownProblem((7, 2, 4), 12, ""), "7/2*4")
    # Zero may be divided, never divided by; a zero division anywhere fails.
    assert task.verify(CountdownProblem((6, 3, 3), 0, ""), "(3-3)/6")
    assert not task.verify(CountdownProblem((6, 3, 3), 0, ""), "6/(3-3)")
    assert not task.verify(CountdownProblem((6, 3, 3, 1), 1, ""), "6/(3-3)+1")


def test_countdown_prompt_format_and_tokens(countdown):
    task, problems = countdown
    tok = task.tokenizer()
    for problem in problems:
        prompt = task.prompt(problem)
        numbers, target = re.fullmatch(r"([0-9,]+)>([0-9]+):", prompt).groups()
        assert tuple(int(x) for x in numbers.split(",")) == problem.numbers
        assert int(target) == problem.target
        assert len(prompt) <= task.max_prompt_len
    prompts = [task.prompt(p) for p in problems]
    batch = lm_batch(tok, prompts, [p.solution for p in problems], seq_len=task.max_seq_len)
    assert tok.decode(batch["tokens"][0]) == prompts[0] + problems[0].solution


def test_countdown_determinism_and_split():
    task = CountdownTask(test_fraction=0.3, seed=1)
    assert task.sample(20, seed=3) == task.sample(20, seed=3)
    assert task.sample(20, seed=3) != task.sample(20, seed=4)
    train = task.sample(200, seed=0, split="train")
    test = task.sample(100, seed=0, split="test")
    assert test and not {p.target for p in train} & {p.target for p in test}
    with pytest.raises(ValueError, match="split.*'dev'"):
        task.sample(2, seed=0, split="dev")
    with pytest.raises(ValueError, match="num_numbers.*1"):
        CountdownTask(num_numbers=1)


def test_countdown_four_numbers():
    task = CountdownTask(num_numbers=4, max_number=12, max_target=200)
    for problem in task.sample(5, seed=0):
        assert len(problem.numbers) == 4
        solutions = task.solve(problem)
        assert problem.solution in solutions
        assert all(_reference_verify(problem, s) for s in solutions[:50])
        assert max(map(len, solutions)) <= task.max_solution_len


# --- associative recall -------------------------------------------------------------


@pytest.mark.parametrize("scatter", [False, True])
@pytest.mark.parametrize("context_len", [30, 257])
def test_associative_recall_answers(scatter, context_len):
    task = AssociativeRecallTask(
        num_pairs=6, num_queries=4, context_len=context_len, num_keys=10, num_values=7,
        num_fillers=5, scatter=scatter, seed=2,
    )
    batch = task.batch(3, batch_size=32)
    tokens = batch["tokens"]
    b, t, q = 32, context_len, 4
    assert tokens.shape == (b, t) and tokens.dtype == np.int32
    assert batch["inputs"].shape == batch["targets"].shape == batch["loss_mask"].shape == (b, t - 1)
    assert batch["answers"].shape == batch["query_positions"].shape == (b, q)
    np.testing.assert_array_equal(batch["inputs"], tokens[:, :-1])
    np.testing.assert_array_equal(batch["targets"], tokens[:, 1:])
    assert tokens.min() >= 1 and tokens.max() < task.vocab_size
    np.testing.assert_array_equal(batch["loss_mask"].sum(axis=1), np.full(b, q))

    keys = range(task.key_start, task.value_start)
    values = range(task.value_start, task.filler_start)
    scattered_rows = interleaved_rows = 0
    for i in range(b):
        row = tokens[i].tolist()
        mask_positions = np.flatnonzero(batch["loss_mask"][i]).tolist()
        assert mask_positions == sorted(batch["query_positions"][i].tolist())
        assert row.count(task.query_id) == q
        # Pair blocks: a key not preceded by the query marker, then its value.
        definitions = {}
        for pos, token in enumerate(row):
            if token in keys and (pos == 0 or row[pos - 1] != task.query_id):
                assert token not in definitions  # keys are distinct
                assert row[pos + 1] in values
                definitions[token] = (pos, row[pos + 1])
        assert len(definitions) == task.num_pairs
        for j in range(q):
            pos, answer = int(batch["query_positions"][i, j]), int(batch["answers"][i, j])
            key = row[pos]
            assert row[pos - 1] == task.query_id and key in keys
            assert batch["targets"][i, pos] == answer
            assert definitions[key][1] == answer and definitions[key][0] < pos - 1
        queried = [row[p] for p in batch["query_positions"][i].tolist()]
        assert len(set(queried)) == q
        # Everything outside the blocks is filler.
        in_block = np.zeros(t, bool)
        for key, (pos, _) in definitions.items():
            in_block[pos : pos + 2] = True
        for pos in batch["query_positions"][i].tolist():
            in_block[pos - 1 : pos + 2] = True
        assert all(task.filler_start <= row[p] < task.vocab_size for p in np.flatnonzero(~in_block))
        if not scatter:
            assert all(row[2 * k] in keys for k in range(task.num_pairs))
        if scatter:
            scattered_rows += row[0] >= task.filler_start
            interleaved_rows += max(pos for pos, _ in definitions.values()) > min(
                batch["query_positions"][i].tolist()
            )
    if scatter:  # pairs are not all at the start, and queries come between them
        assert scattered_rows > 0 and interleaved_rows > 0


def test_associative_recall_determinism():
    task = AssociativeRecallTask(seed=4)
    a, b, c = task.batch(1, batch_size=8), task.batch(1, batch_size=8), task.batch(2, batch_size=8)
    for key in a:
        np.testing.assert_array_equal(a[key], b[key])
    assert not np.array_equal(a["tokens"], c["tokens"])
    assert not np.array_equal(a["tokens"], AssociativeRecallTask(seed=5).batch(1, batch_size=8)["tokens"])


def test_associative_recall_tight_fit_and_errors():
    tight = AssociativeRecallTask(num_pairs=3, num_queries=2, context_len=12)
    batch = tight.batch(0, batch_size=4)
    assert (batch["tokens"] < tight.filler_start).all()  # no room for fillers
    with pytest.raises(ValueError, match=r"context_len.*>= 15.*got 14"):
        AssociativeRecallTask(num_pairs=3, num_queries=3, context_len=14)
    with pytest.raises(ValueError, match=r"num_queries.*num_pairs=2.*3"):
        AssociativeRecallTask(num_pairs=2, num_queries=3, context_len=64)
    with pytest.raises(ValueError, match=r"num_keys.*num_pairs=8.*4"):
        AssociativeRecallTask(num_pairs=8, num_keys=4)


def test_associative_recall_vocab_layout():
    task = AssociativeRecallTask(num_keys=10, num_values=20, num_fillers=5)
    assert (task.key_start, task.value_start, task.filler_start) == (2, 12, 32)
    assert task.vocab_size == 37


# --- digits -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def digits():
    return load_digits(test_fraction=0.25, seed=0)


def test_digits_shapes_and_ranges(digits):
    (x_train, y_train), (x_test, y_test) = digits
    assert x_train.shape[1:] == x_test.shape[1:] == (8, 8, 1)
    assert x_train.dtype == x_test.dtype == np.float32
    assert y_train.dtype == y_test.dtype == np.int32
    assert len(x_train) + len(x_test) == 1797 and len(x_test) == 450
    assert x_train.min() == 0.0 and x_train.max() == 1.0
    assert set(y_train.tolist()) == set(y_test.tolist()) == set(range(10))


def test_digits_split_partitions_the_dataset(digits):
    (x_train, y_train), (x_test, y_test) = digits
    raw = sklearn.datasets.load_digits()
    full = collections.Counter(zip((img.tobytes() for img in (raw.images / 16).astype(np.float32)), raw.target.tolist()))
    ours = collections.Counter(
        zip((img[..., 0].tobytes() for img in np.concatenate([x_train, x_test])), np.concatenate([y_train, y_test]).tolist())
    )
    assert ours == full  # every example exactly once: disjoint and complete


def test_digits_stratified(digits):
    (_, y_train), (_, y_test) = digits
    for c in range(10):
        n_test, n_all = np.sum(y_test == c), np.sum(y_train == c) + np.sum(y_test == c)
        assert abs(n_test - 0.25 * n_all) <= 1, c


def test_digits_determinism_and_options(digits):
    (x_train, y_train), _ = digits
    (x_again, y_again), _ = load_digits(seed=0)
    np.testing.assert_array_equal(x_train, x_again)
    np.testing.assert_array_equal(y_train, y_again)
    (x_other, _), _ = load_digits(seed=1)
    assert not np.array_equal(x_train, x_other)
    (x_raw, _), _ = load_digits(seed=0, normalize=False)
    np.testing.assert_array_equal(x_raw, x_train * 16)
    with pytest.raises(ValueError, match="test_fraction.*1.0"):
        load_digits(test_fraction=1.0)


@pytest.mark.parametrize("reverse", [False, True])
def test_arithmetic_fixed_width_format(reverse):
    padded = ArithmeticTask(num_digits=3, operations=("+", "-", "*"), reverse_answer=reverse, pad_operands=True)
    plain = ArithmeticTask(num_digits=3, operations=("+", "-", "*"), reverse_answer=reverse)
    prompts, answers = padded.sample(300, split="train", seed=5)
    plain_prompts, _ = plain.sample(300, split="train", seed=5)
    width = {"+": 4, "-": 3, "*": 6}
    for p, a, q in zip(prompts, answers, plain_prompts):
        x, op, y = re.fullmatch(r"(\d+)([+\-*])(\d+)=", p).groups()
        assert len(x) == len(y) == 3
        assert q == f"{int(x)}{op}{int(y)}="  # same problems as the unpadded task
        value = {"+": int(x) + int(y), "-": int(x) - int(y), "*": int(x) * int(y)}[op]
        digits = a.lstrip("-")
        assert len(digits) == width[op]
        assert int(digits[::-1] if reverse else digits) == abs(value)
        assert a.startswith("-") == (value < 0)
        assert padded.split_of(p) == plain.split_of(q) == "train"
        assert len(p) + len(a) + 2 <= padded.max_seq_len
