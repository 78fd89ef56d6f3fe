"""The prompt checks shared by `generate` and `vegas.speculative_generate`."""

import jax
import numpy as np
import pytest

from algorithms.decoding._prompts import check_prompts, resolve_key


def test_check_prompts_defaults_and_errors():
    prompts, lengths, b, p = check_prompts(np.zeros((2, 5), np.int32), None, max_new_tokens=1)
    assert (b, p) == (2, 5) and prompts.shape == (2, 5)
    assert lengths.dtype == np.int32 and lengths.tolist() == [5, 5]
    assert check_prompts(np.zeros((2, 5)), [1, 5], max_new_tokens=3)[1].tolist() == [1, 5]
    with pytest.raises(ValueError, match=r"prompts must be \[b, P\]; got shape \(5,\)"):
        check_prompts(np.zeros(5), None, max_new_tokens=1)
    with pytest.raises(ValueError, match="max_new_tokens must be >= 1; got 0"):
        check_prompts(np.zeros((2, 5)), None, max_new_tokens=0)
    with pytest.raises(ValueError, match=r"prompt_lengths must have shape \[b\]=\(2,\); got \(3,\)"):
        check_prompts(np.zeros((2, 5)), [1, 2, 3], max_new_tokens=1)
    with pytest.raises(ValueError, match=r"prompt_lengths must lie in \[1, P=5\]; got \[0, 6\]"):
        check_prompts(np.zeros((2, 5)), [0, 6], max_new_tokens=1)
    # Traced lengths are not range-checked (the caller may jit).
    jax.jit(lambda n: check_prompts(np.zeros((2, 5)), n, max_new_tokens=1)[1])(np.array([9, 9]))


def test_resolve_key():
    key = jax.random.key(3)
    assert resolve_key(key, False) is key
    assert resolve_key(None, True) is not None
    with pytest.raises(ValueError, match="PRNG key is required"):
        resolve_key(None, False)
