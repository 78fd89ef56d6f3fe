"""The shared loop: resumed == uninterrupted, fingerprint checks, logging schedule, checkpointer ownership."""

import math

import jax.numpy as jnp
import numpy as np
import pytest

from algorithms._loop import run_loop
from algorithms.training import Checkpointer


def step_fn(state, i):
    """Deterministic in the step index, like a data stream drawn by position."""
    w = 0.9 * state["w"] + jnp.sin(jnp.float32(i) + jnp.arange(3, dtype=jnp.float32))
    return {"w": w, "n": state["n"] + 1}, {"norm": jnp.linalg.norm(w)}


def init():
    return {"w": jnp.zeros(3, jnp.float32), "n": jnp.zeros((), jnp.int32)}


def test_interrupted_then_resumed_equals_uninterrupted(tmp_path):
    full = run_loop(step_fn, init(), num_steps=6, progress=False)
    assert full.resumed_from is None and [r["step"] for r in full.history] == [1, 2, 3, 4, 5, 6]
    kwargs = dict(num_steps=6, progress=False, checkpoint_every=2, fingerprint="a",
                  checkpoint_meta=lambda done: {"position": done})
    first = run_loop(step_fn, init(), stop_after=3, checkpointer=Checkpointer(tmp_path), **kwargs)
    assert int(first.state["n"]) == 3
    ckpt = Checkpointer(tmp_path)
    assert ckpt.all_steps() == [2, 3]  # every 2 steps and the last one
    _, meta = ckpt.restore(init())
    ckpt.close()
    assert meta["position"] == 3 and meta["fingerprint"] == "a" and len(meta["history"]) == 3
    resumed = run_loop(step_fn, init(), checkpointer=Checkpointer(tmp_path), **kwargs)
    assert resumed.resumed_from == 3 and int(resumed.state["n"]) == 6
    np.testing.assert_array_equal(np.asarray(resumed.state["w"]), np.asarray(full.state["w"]))
    assert resumed.history == full.history


def test_fingerprint_mismatch_raises_and_a_fresh_directory_starts_fresh(tmp_path):
    run_loop(step_fn, init(), num_steps=4, stop_after=2, progress=False, checkpointer=Checkpointer(tmp_path / "a"),
             fingerprint="run-a")
    with pytest.raises(ValueError, match="belongs to a run with different settings.*fingerprint"):
        run_loop(step_fn, init(), num_steps=4, progress=False, checkpointer=Checkpointer(tmp_path / "a"),
                 fingerprint="run-b")
    fresh = run_loop(step_fn, init(), num_steps=4, progress=False, checkpointer=Checkpointer(tmp_path / "b"),
                     fingerprint="run-b")
    assert fresh.resumed_from is None and int(fresh.state["n"]) == 4
    # Other settings often mean other shapes: the fingerprint is compared before the state is restored,
    # so the error names the cause and the way out, not an orbax shape mismatch.
    wide = {"w": jnp.zeros(5, jnp.float32), "n": jnp.zeros((), jnp.int32)}
    with pytest.raises(ValueError, match=r"different settings.*--workdir"):
        run_loop(lambda st, i: (st, {}), wide, num_steps=4, progress=False,
                 checkpointer=Checkpointer(tmp_path / "a"), fingerprint="run-wide")


class _Recorder:
    """A checkpointer that keeps nothing and records whether it was closed."""

    directory = "memory"

    def __init__(self):
        self.saved, self.closed = [], False

    def latest_step(self):
        return None

    def save(self, step, state, meta):
        self.saved.append(step)

    def restore(self, state_like, shardings=None, step=None):
        raise AssertionError("nothing to restore")

    def close(self):
        self.closed = True


def test_logging_schedule_rows_timing_and_closing():
    rec = _Recorder()
    out = run_loop(step_fn, init(), num_steps=7, log_every=3, log_offset=1, checkpointer=rec, checkpoint_every=3,
                   row_fn=lambda done, m: {"episode": done - 1, **m}, progress=False)
    assert [r["episode"] for r in out.history] == [0, 3, 6]  # first, every 3rd after it, last
    assert isinstance(out.history[0]["norm"], float)
    assert rec.saved == [3, 6, 7] and rec.closed
    assert out.seconds_per_step >= 0 and not math.isnan(out.seconds_per_step)

    def failing(state, i):
        if i == 2:
            raise RuntimeError("boom")
        return step_fn(state, i)

    rec = _Recorder()
    with pytest.raises(RuntimeError, match="boom"):
        run_loop(failing, init(), num_steps=5, checkpointer=rec, checkpoint_every=1, progress=False)
    assert rec.saved == [1, 2] and rec.closed
    with pytest.raises(ValueError, match="num_steps"):
        run_loop(step_fn, init(), num_steps=0)
