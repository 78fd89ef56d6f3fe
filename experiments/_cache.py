"""A per-unit JSON result cache, so that an interrupted experiment resumes from its workdir.

An experiment made of many independent units (a seed, a grid cell, a method) wraps each in
`cached(workdir, key, fn)`: the first call runs ``fn()`` and writes its JSON-able result to
``workdir/cache/<hash of key>.json``; a later call with the same key reads it back. The key must hold
everything the unit's result depends on (the relevant config fields, the seed, a version number to
bump when the code's output changes). Paths go through `etils.epath`, so the workdir may be remote.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Callable

from etils import epath

__all__ = ["cached", "key_hash"]


def key_hash(key: Any) -> str:
    """16 hex digits of the SHA-1 of ``key`` as sorted JSON (non-JSON values by ``str``)."""
    return hashlib.sha1(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]


def cached(workdir, key: Any, fn: Callable[[], Any]) -> Any:
    """``fn()``'s JSON result, computed once per ``key`` under ``workdir/cache/``.

    Example:
        >>> import tempfile
        >>> d = tempfile.mkdtemp()
        >>> cached(d, {"seed": 0}, lambda: {"acc": 0.5}), cached(d, {"seed": 0}, lambda: 1 / 0)
        ({'acc': 0.5}, {'acc': 0.5})
    """
    path = epath.Path(workdir) / "cache" / f"{key_hash(key)}.json"
    if path.exists():
        return json.loads(path.read_text())
    out = fn()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out))
    return out
