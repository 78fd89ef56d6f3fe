"""Shared argument checks: a clear error naming the argument, the expected and the actual value.

Every public entry point validates what it cannot compute correctly from (issue 26, section 1):
shapes and dtypes (static, so checked at trace time too), and values such as token ids, lengths
against a capacity, and NaN/inf hyper-parameters. Values are checked only when they are
*concrete*: a jax Tracer (inside `jax.jit`, `vmap`, `grad`, `lax.scan`) has no value at trace
time, so the value checks here do nothing for traced arguments, and the functions that use them say
in their docstrings what happens then (the value is not validated; callers such as
`algorithms.decoding.generate` check eagerly before they enter `jit`).

Dtype problems raise `TypeError`, bad values `ValueError`; both messages start with the
argument's name.

Examples:
  >>> import numpy as np
  >>> check_token_ids("tokens", np.array([[1, 2, 3]]), vocab_size=4)
  >>> check_token_ids("tokens", np.array([[1, 7]]), vocab_size=4)
  Traceback (most recent call last):
  ...
  ValueError: tokens must be token ids in [0, vocab_size=4); got max 7
  >>> check_lengths("lengths", [0, 5], capacity=4)
  Traceback (most recent call last):
  ...
  ValueError: lengths must lie in [0, capacity=4]; got max 5
  >>> check_finite("temperature", float("nan"))
  Traceback (most recent call last):
  ...
  ValueError: temperature must be finite; got temperature=nan
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "is_concrete",
    "concrete_value",
    "check_finite",
    "check_integer_dtype",
    "check_int",
    "check_token_ids",
    "check_lengths",
    "check_positive_finite",
]


def is_concrete(x: Any) -> bool:
    """True unless `x` is a jax Tracer (an argument being traced by jit/vmap/grad).

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> seen = []
      >>> _ = jax.jit(lambda x: seen.append(is_concrete(x)) or x)(1.0)
      >>> is_concrete(jnp.ones(2)), seen
      (True, [False])
    """
    return not isinstance(x, jax.core.Tracer)


def concrete_value(x: Any) -> np.ndarray | None:
    """`x` as a numpy array when it is concrete, else None (traced: nothing to check).

    Examples:
      >>> concrete_value([1, 2]).tolist()
      [1, 2]
    """
    if not is_concrete(x):
        return None
    try:
        return np.asarray(x)
    except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
        return None


def _dtype(x: Any) -> np.dtype:
    dt = getattr(x, "dtype", None)
    return np.dtype(dt) if dt is not None else np.asarray(x).dtype


def check_finite(name: str, value: Any) -> None:
    """Raises ValueError if a concrete `value` (scalar or array) holds NaN or +-inf.

    Use it for hyper-parameters (temperatures, learning rates, eps) and for inputs that one
    non-finite entry would silently corrupt. Traced values are not checked.

    Examples:
      >>> check_finite("learning_rate", 3e-4)
      >>> check_finite("x", [1.0, float("inf")])
      Traceback (most recent call last):
      ...
      ValueError: x must be finite; got 1 non-finite entry (first at index (1,): inf)
    """
    if not is_concrete(value):
        return
    if isinstance(value, jax.Array):  # reduce on the device; fetch the array only to report
        if not jnp.issubdtype(value.dtype, jnp.inexact) or bool(jnp.isfinite(value).all()):
            return
    arr = concrete_value(value)
    if arr is None or not np.issubdtype(arr.dtype, np.inexact):
        return
    bad = ~np.isfinite(arr)
    if not bad.any():
        return
    if arr.ndim == 0:
        raise ValueError(f"{name} must be finite; got {name}={arr.item()}")
    first = tuple(int(i) for i in np.argwhere(bad)[0])
    count = int(bad.sum())
    raise ValueError(f"{name} must be finite; got {count} non-finite entr{'y' if count == 1 else 'ies'} "
                     f"(first at index {first}: {arr[first].item()})")


def check_integer_dtype(name: str, x: Any) -> None:
    """Raises TypeError unless `x` (array, list or tracer) has an integer dtype (bool excluded).

    Static, so it also works on traced arrays.

    Examples:
      >>> import numpy as np
      >>> check_integer_dtype("tokens", np.zeros(3, np.float32))
      Traceback (most recent call last):
      ...
      TypeError: tokens must be an integer array (token ids); got dtype float32
    """
    dt = _dtype(x)
    if not np.issubdtype(dt, np.integer):
        raise TypeError(f"{name} must be an integer array (token ids); got dtype {dt}")


def check_int(name: str, value: Any) -> int:
    """Returns `value` as int; raises TypeError if it is not an integer (bool and 32.5 rejected).

    Integral numpy scalars are accepted; floats are rejected even when integral (4.0), as a shape
    must not silently truncate.

    Examples:
      >>> check_int("vocab_size", 32.5)
      Traceback (most recent call last):
      ...
      TypeError: vocab_size must be an int; got 32.5 (float)
    """
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int; got {value!r} ({type(value).__name__})")
    return int(value)


def check_token_ids(name: str, ids: Any, vocab_size: int | None) -> None:
    """Token ids must be an integer array with values in [0, vocab_size).

    The dtype is checked always (TypeError); the range only when `ids` is concrete (ValueError).
    `vocab_size=None` checks only that ids are >= 0. Under `jit` an out-of-range id is not
    detected here: `jnp.take` then returns NaN rows (embeddings) or clamps, so validate before
    entering `jit`.

    Examples:
      >>> check_token_ids("prompts", [[0, -1]], vocab_size=5)
      Traceback (most recent call last):
      ...
      ValueError: prompts must be token ids in [0, vocab_size=5); got min -1
    """
    check_integer_dtype(name, ids)
    arr = concrete_value(ids)
    if arr is None or arr.size == 0:
        return
    lo, hi = int(arr.min()), int(arr.max())
    expected = f"[0, vocab_size={vocab_size})" if vocab_size is not None else ">= 0"
    if lo < 0:
        raise ValueError(f"{name} must be token ids in {expected}; got min {lo}")
    if vocab_size is not None and hi >= vocab_size:
        raise ValueError(f"{name} must be token ids in {expected}; got max {hi}")


def check_lengths(name: str, lengths: Any, capacity: int | None) -> None:
    """Concrete lengths must lie in [0, capacity] (capacity None: only >= 0).

    Traced lengths are not checked: a length above the capacity then reads as "all entries" and
    a negative one as "no entries".

    Examples:
      >>> check_lengths("kv_lengths", [3, -1], capacity=4)
      Traceback (most recent call last):
      ...
      ValueError: kv_lengths must lie in [0, capacity=4]; got min -1
    """
    arr = concrete_value(lengths)
    if arr is None or arr.size == 0:
        return
    expected = f"[0, capacity={capacity}]" if capacity is not None else ">= 0"
    lo, hi = arr.min().item(), arr.max().item()
    if lo < 0:
        raise ValueError(f"{name} must lie in {expected}; got min {lo}")
    if capacity is not None and hi > capacity:
        raise ValueError(f"{name} must lie in {expected}; got max {hi}")


def check_positive_finite(name: str, value: Any) -> float:
    """A finite float > 0 (NaN and inf rejected); returns it as float.

    Examples:
      >>> check_positive_finite("sigma", 0.0)
      Traceback (most recent call last):
      ...
      ValueError: sigma must be a finite number > 0; got sigma=0.0
    """
    v = float(value)
    if not (math.isfinite(v) and v > 0):
        raise ValueError(f"{name} must be a finite number > 0; got {name}={v}")
    return v
