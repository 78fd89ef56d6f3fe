"""The one training loop: resume, progress bar, periodic checkpoints, metric history.

`training.fit`, `rl.grpo.train` and the `optimization.stochastic_path_follower`
trainers all call `run_loop`; each supplies a pure `step_fn(state, i)` and
decides what a logged row holds.
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable, Mapping, NamedTuple, Protocol

import jax

__all__ = ["run_loop", "LoopResult", "LoopCheckpointer"]

Metrics = Mapping[str, Any]


class LoopCheckpointer(Protocol):
    """What `run_loop` needs from a checkpointer (e.g. `algorithms.training.Checkpointer`)."""

    directory: Any

    def latest_step(self) -> int | None: ...

    def metadata(self, step: int | None = None) -> dict: ...

    def save(self, step: int, state: Any, meta: Mapping[str, Any]) -> None: ...

    def restore(self, state_like: Any, shardings: Any = None, step: int | None = None) -> tuple[Any, dict]: ...

    def close(self) -> None: ...


class LoopResult(NamedTuple):
    """Output of `run_loop`.

    Attributes:
      state: the final state.
      history: the logged rows, those restored from the checkpoint first.
      resumed_from: the number of steps done by the checkpoint the run resumed
        from (None = fresh start).
      seconds_per_step: wall time per step of this call, the first step
        (compilation) excluded; nan when no step ran.
    """

    state: Any
    history: list[dict[str, Any]]
    resumed_from: int | None
    seconds_per_step: float


def _default_row(done: int, metrics: dict[str, float]) -> dict[str, Any]:
    return dict(metrics, step=done)


def run_loop(
    step_fn: Callable[[Any, int], tuple[Any, Metrics]],
    state: Any,
    *,
    num_steps: int,
    stop_after: int | None = None,
    checkpointer: LoopCheckpointer | None = None,
    shardings: Any = None,
    checkpoint_every: int = 100,
    checkpoint_meta: Callable[[int], Mapping[str, Any]] | None = None,
    fingerprint: str | None = None,
    log_every: int = 1,
    log_offset: int = 0,
    row_fn: Callable[[int, dict[str, float]], dict[str, Any]] = _default_row,
    progress: bool = True,
    desc: str = "train",
    postfix: Callable[[dict[str, Any]], Mapping[str, str]] | None = None,
) -> LoopResult:
    """Runs `state, metrics = step_fn(state, i)` for `i` in `[start, end)`, resuming and checkpointing.

    With a checkpointer holding a checkpoint, the loop restores the latest one
    (state and history) and continues after it; the checkpoint's step number is
    the number of steps it had done. Steps must therefore be deterministic in
    `i` (draw data and keys from `i`), so that an interrupted run resumed from its
    checkpoint ends with the state of an uninterrupted one.

    Args:
      step_fn: `(state, i) -> (state, metrics)`, `i` the 0-based step index;
        `metrics` maps names to scalars (device arrays or floats).
      state: the initial state (also the structure checkpoints restore onto).
      num_steps: total steps of the run (the progress bar's length).
      stop_after: stop (as if interrupted) once this many steps are done.
      checkpointer: saves `(state, meta)` and restores it; None = no
        checkpoints. `run_loop` closes it when it returns or raises.
      shardings: target shardings of the restored state (None = the state's own).
      checkpoint_every: save after every this many done steps and after the last.
      checkpoint_meta: `done -> dict` of extra JSON metadata saved with each
        checkpoint (next to "history" and "fingerprint").
      fingerprint: identifies the run's settings; saved with each checkpoint.
        Resuming from a checkpoint with another fingerprint raises ValueError
        (use a fresh checkpoint directory) instead of continuing another run.
      log_every: log a row when `(done - log_offset) % log_every == 0` and after
        the last step, `done` being the number of steps done.
      log_offset: see `log_every` (1 logs the first step and every
        `log_every`-th after it).
      row_fn: `(done, metrics as floats) -> row` appended to the history;
        called only at logged steps (default: the metrics plus "step": done).
      progress: show a tqdm progress bar.
      desc: the bar's label.
      postfix: `row -> {name: text}` shown on the bar at logged steps.

    Returns:
      LoopResult.

    Raises:
      ValueError: num_steps < 1, or the checkpoint's fingerprint differs.

    Examples:
      >>> out = run_loop(lambda s, i: (s + i, {"s": s + i}), 0, num_steps=4, log_every=2, progress=False)
      >>> out.state, [r["step"] for r in out.history], out.history[-1]["s"]
      (6, [2, 4], 6.0)
    """
    from tqdm.auto import tqdm

    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1; got {num_steps}")
    if log_every < 1 or checkpoint_every < 1:
        raise ValueError(f"log_every and checkpoint_every must be >= 1; got {log_every}, {checkpoint_every}")
    history: list[dict[str, Any]] = []
    start, resumed_from = 0, None
    try:
        if checkpointer is not None and checkpointer.latest_step() is not None:
            saved = checkpointer.latest_step()
            # Compare settings before restoring: a run with other shapes cannot be restored onto this state.
            saved_fingerprint = checkpointer.metadata(saved).get("fingerprint")
            if saved_fingerprint != fingerprint:
                raise ValueError(
                    f"the checkpoint at step {saved} in {checkpointer.directory} belongs to a run with different "
                    f"settings (saved fingerprint {saved_fingerprint!r}, this run {fingerprint!r}); pass another "
                    f"work directory (CLI: --workdir DIR) or delete that one to start fresh")
            state, meta = checkpointer.restore(state, shardings)
            start = resumed_from = int(saved)
            history = list(meta["history"])
        end = num_steps if stop_after is None else min(num_steps, stop_after)
        bar = tqdm(total=num_steps, initial=start, desc=desc, disable=not progress, leave=False)
        t0 = None
        try:
            for i in range(start, end):
                state, metrics = step_fn(state, i)
                done = i + 1
                if i == start:  # time from here on: the first step compiles
                    jax.block_until_ready(state)
                    t0 = time.perf_counter()
                if (done - log_offset) % log_every == 0 or done == end:
                    row = row_fn(done, {k: float(v) for k, v in jax.device_get(dict(metrics)).items()})
                    history.append(row)
                    if postfix is not None:
                        bar.set_postfix(**postfix(row))
                if checkpointer is not None and (done % checkpoint_every == 0 or done == end):
                    meta = {} if checkpoint_meta is None else dict(checkpoint_meta(done))
                    checkpointer.save(done, state, dict(meta, history=history, fingerprint=fingerprint))
                bar.update(1)
        finally:
            bar.close()
        jax.block_until_ready(state)
        ran = end - start
        seconds = math.nan if t0 is None else (time.perf_counter() - t0) / max(ran - 1, 1)
    finally:
        if checkpointer is not None:
            checkpointer.close()
    return LoopResult(state, history, resumed_from, seconds)
