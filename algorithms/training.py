"""LM training: a pure train step, sharded state on a named mesh, orbax checkpoints.

The pieces, each usable alone:

  * `make_optimizer(OptimizerConfig)`: AdamW with linear warmup + cosine decay
    and global-norm clipping (optax).
  * `make_mesh(MeshConfig)`: a `jax.sharding.Mesh` with axes
    ("data", "fsdp", "tensor"); -1 in one axis means "all remaining devices".
  * `init_train_state(model_fn, optimizer, mesh=..., rules=...)`: shapes from
    `nnx.eval_shape`, parameter shardings from the models' logical axis names
    and the config's rules, then the state is created *already sharded* by a
    jitted init with `out_shardings` (nothing is materialized on one device first).
  * `make_train_step(graphdef, optimizer, loss_fn)`: a pure function
    `(TrainState, batch) -> (TrainState, metrics)`, jitted with the state
    donated. Parameters are a plain nested dict; the model is rebuilt inside
    the loss with `nnx.merge`.
  * `Checkpointer`: orbax `CheckpointManager` saving the train state together
    with JSON metadata (the data position and the metric history), restoring
    onto the same shardings.
  * `fit(...)`: ties them together through the shared loop `algorithms._loop.run_loop`
    (tqdm progress bar, periodic checkpoints, automatic resume from `workdir`):
    a run interrupted after a checkpoint ends with the same parameters as an
    uninterrupted one (tested), because data is drawn by position
    (`batch_fn(position)`) and the position is checkpointed. On a multi-host job each process
    builds only its own rows of the global batch (`process_rows`) and `fit` assembles the global
    array from the processes' shards (`jax.make_array_from_process_local_data`; tested with two
    processes on CPU).
  * `initialize_distributed()`: the one place multi-host runs call
    `jax.distributed.initialize()`; the same command runs on every host.

Dimension legend for batches: `b` batch, `t` tokens.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from typing import Any, Callable, Iterable, Mapping, NamedTuple

import flax.linen as nn
from etils import epath
import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from algorithms._loop import run_loop
from models.transformer import DEFAULT_LOGICAL_AXIS_RULES, _repr_hiding_defaults
from primitives.validation import check_finite, check_token_ids

__all__ = [
    "OptimizerConfig",
    "MeshConfig",
    "TrainState",
    "make_optimizer",
    "make_mesh",
    "init_train_state",
    "make_train_step",
    "next_token_loss",
    "batch_sharding",
    "process_rows",
    "Checkpointer",
    "fit",
    "FitResult",
    "initialize_distributed",
    "MESH_AXES",
]

MESH_AXES = ("data", "fsdp", "tensor")
Batch = Mapping[str, jax.Array]
LossFn = Callable[[nnx.Module, Batch], tuple[jax.Array, dict[str, jax.Array]]]


@dataclasses.dataclass(frozen=True, kw_only=True)
class OptimizerConfig:
    """AdamW + warmup/cosine schedule + clipping.

    Attributes:
      learning_rate: peak learning rate.
      warmup_steps: linear warmup from 0 to the peak.
      total_steps: schedule length (cosine decays to end_lr_fraction * peak).
      end_lr_fraction: final learning rate as a fraction of the peak.
      weight_decay: decoupled weight decay, applied to matrices only (ndim >= 2) unless
        `decay_all_params`.
      b1, b2, eps: Adam moments.
      clip_norm: global gradient-norm clip; None disables clipping.
      decay_all_params: decay every parameter (biases and norm scales too), as plain ``optax.adamw``
        does; shown in the repr only when set, so existing fingerprints are unchanged.
    """

    learning_rate: float = 3e-4
    warmup_steps: int = 100
    total_steps: int = 1000
    end_lr_fraction: float = 0.1
    weight_decay: float = 0.01
    b1: float = 0.9
    b2: float = 0.95
    eps: float = 1e-8
    clip_norm: float | None = 1.0
    decay_all_params: bool = dataclasses.field(default=False, repr=False)

    __repr__ = _repr_hiding_defaults

    def __post_init__(self):
        for name in ("learning_rate", "end_lr_fraction", "weight_decay", "b1", "b2", "eps", "clip_norm"):
            if getattr(self, name) is not None:
                check_finite(name, getattr(self, name))
        if self.total_steps < 1:
            raise ValueError(f"total_steps must be >= 1; got {self.total_steps}")
        if not 0 <= self.warmup_steps <= self.total_steps:
            raise ValueError(f"warmup_steps must be in [0, total_steps={self.total_steps}]; got {self.warmup_steps}")
        if self.learning_rate <= 0:
            raise ValueError(f"learning_rate must be > 0; got {self.learning_rate}")

    @classmethod
    def constant_adam(cls, learning_rate: float, total_steps: int, *, b2: float = 0.999) -> "OptimizerConfig":
        """Plain Adam at a constant rate (optax's defaults b1 0.9, eps 1e-8; no weight decay, no clipping):
        `make_optimizer` of it updates bit-identically to ``optax.adam(learning_rate, b2=b2)``."""
        return cls(learning_rate=learning_rate, warmup_steps=0, total_steps=total_steps, end_lr_fraction=1.0,
                   weight_decay=0.0, b1=0.9, b2=b2, eps=1e-8, clip_norm=None)

    def schedule(self) -> optax.Schedule:
        return optax.warmup_cosine_decay_schedule(
            init_value=0.0,
            peak_value=self.learning_rate,
            warmup_steps=self.warmup_steps,
            # optax counts warmup inside decay_steps and needs a non-empty cosine part.
            decay_steps=max(self.total_steps, self.warmup_steps + 1),
            end_value=self.learning_rate * self.end_lr_fraction,
        )


def make_optimizer(config: OptimizerConfig) -> optax.GradientTransformation:
    """AdamW with the config's schedule, weight decay (on matrices only unless `decay_all_params`), and clipping."""
    adamw = optax.adamw(
        config.schedule(),
        b1=config.b1,
        b2=config.b2,
        eps=config.eps,
        weight_decay=config.weight_decay,
        mask=None if config.decay_all_params else (lambda params: jax.tree.map(lambda x: x.ndim >= 2, params)),
    )
    if config.clip_norm is None:
        return adamw
    return optax.chain(optax.clip_by_global_norm(config.clip_norm), adamw)


@dataclasses.dataclass(frozen=True, kw_only=True)
class MeshConfig:
    """Device mesh shape and the logical-axis rules that map parameters onto it.

    Attributes:
      data, fsdp, tensor: axis sizes; exactly one may be -1 (= the remaining
        devices). The product must equal the number of devices used.
      logical_axis_rules: (logical name, mesh axis or tuple of axes or None)
        pairs, as in MaxText/Flax. Batches are split over ("data", "fsdp").
    """

    data: int = -1
    fsdp: int = 1
    tensor: int = 1
    logical_axis_rules: tuple[tuple[str, Any], ...] = DEFAULT_LOGICAL_AXIS_RULES

    def shape(self, num_devices: int) -> tuple[int, int, int]:
        sizes = [self.data, self.fsdp, self.tensor]
        if sizes.count(-1) > 1:
            raise ValueError(f"at most one mesh axis may be -1; got data={self.data}, fsdp={self.fsdp}, tensor={self.tensor}")
        known = math.prod(s for s in sizes if s != -1)
        if any(s == 0 or s < -1 for s in sizes) or num_devices % known:
            raise ValueError(f"mesh axes {dict(zip(MESH_AXES, sizes))} do not divide {num_devices} devices")
        sizes = [num_devices // known if s == -1 else s for s in sizes]
        if math.prod(sizes) != num_devices:
            raise ValueError(f"mesh {dict(zip(MESH_AXES, sizes))} needs {math.prod(sizes)} devices; have {num_devices}")
        return tuple(sizes)


def make_mesh(config: MeshConfig = MeshConfig(), devices: Iterable[jax.Device] | None = None) -> jax.sharding.Mesh:
    """A mesh with axes ("data", "fsdp", "tensor") over `devices` (default: all)."""
    devices = list(jax.devices() if devices is None else devices)
    shape = config.shape(len(devices))
    return jax.make_mesh(shape, MESH_AXES, axis_types=(jax.sharding.AxisType.Auto,) * 3, devices=devices)


class TrainState(NamedTuple):
    """Everything a train step updates: a pytree of arrays.

    Attributes:
      step: scalar int32, number of optimizer steps taken.
      params: nested dict of parameter arrays (`nnx.to_pure_dict` layout).
      opt_state: the optax state.
    """

    step: jax.Array
    params: Any
    opt_state: Any


def _fit_spec(shape: tuple[int, ...], spec: P, mesh: jax.sharding.Mesh) -> P:
    """Drops mesh axes from dims they do not divide (that dim is then replicated)."""
    out = []
    for dim, axes in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec))):
        names = () if axes is None else (axes if isinstance(axes, tuple) else (axes,))
        size = math.prod(mesh.shape[a] for a in names)
        out.append(axes if names and dim % size == 0 else None)
    return P(*out)


def _param_shardings(abstract_params, logical_specs, mesh, rules):
    shardings = nn.logical_to_mesh_sharding(logical_specs, mesh, list(rules))
    return jax.tree.map(
        lambda x, s: NamedSharding(mesh, _fit_spec(x.shape, s.spec, mesh)),
        abstract_params,
        shardings,
    )


def batch_sharding(mesh: jax.sharding.Mesh) -> NamedSharding:
    """Sharding of batch arrays: leading dim over ("data", "fsdp"), the rest replicated."""
    return NamedSharding(mesh, P(("data", "fsdp")))


def process_rows(global_batch_size: int) -> slice:
    """The rows of a global batch that this process builds: a contiguous block of ``global_batch_size /
    jax.process_count()`` rows, in process order (the order `make_mesh` lays the data axes over hosts).

    On one process it is every row. A `fit` ``batch_fn`` that draws row ``i`` from ``(position, i)`` alone
    builds exactly the global batch's rows on every host count::

        def batch_fn(position):
            rows = training.process_rows(256)
            seqs = np.stack([draw_row(position, i) for i in range(rows.start, rows.stop)])
            return {"inputs": seqs[:, :-1], "targets": seqs[:, 1:], "loss_mask": np.ones_like(seqs[:, 1:])}

    Raises:
      ValueError: if ``global_batch_size`` is not a positive multiple of the process count.
    """
    count, index = jax.process_count(), jax.process_index()
    if isinstance(global_batch_size, bool) or not isinstance(global_batch_size, (int, np.integer)):
        raise TypeError(f"global_batch_size must be an int; got {type(global_batch_size).__name__}")
    if global_batch_size < 1 or global_batch_size % count:
        raise ValueError(f"global_batch_size must be a positive multiple of the process count {count}; "
                         f"got {global_batch_size}")
    local = global_batch_size // count
    return slice(index * local, (index + 1) * local)


def init_train_state(
    model_fn: Callable[[nnx.Rngs], nnx.Module],
    optimizer: optax.GradientTransformation,
    *,
    seed: int = 0,
    mesh: jax.sharding.Mesh | None = None,
    rules: tuple[tuple[str, Any], ...] = DEFAULT_LOGICAL_AXIS_RULES,
    abstract: bool = False,
) -> tuple[nnx.GraphDef, TrainState, Any]:
    """Creates the train state, sharded over `mesh` when one is given.

    With ``abstract=True`` nothing is computed or allocated: the state is a pytree of
    `jax.ShapeDtypeStruct` carrying the shardings, ready for
    ``make_train_step(...).trace(state, batch).lower().compile()`` on a mesh of device
    descriptions (a TPU slice compiled ahead of time on a CPU machine, see `experiments.aot`).

    Args:
      model_fn: builds the model from `nnx.Rngs`; must hold only `nnx.Param` state.
      optimizer: the optax transformation.
      seed: parameter init seed.
      mesh: device mesh; None = default device, no sharding.
      rules: logical-axis rules for the parameters' `out_sharding` names.
      abstract: return shapes, dtypes and shardings only.

    Returns:
      (graphdef, state, state_shardings); shardings is None without a mesh.
    """

    def init():
        model = model_fn(nnx.Rngs(seed))
        graphdef, params = nnx.split(model, nnx.Param)
        params = nnx.to_pure_dict(params)
        return TrainState(jnp.zeros((), jnp.int32), params, optimizer.init(params))

    abstract_model = nnx.eval_shape(lambda: model_fn(nnx.Rngs(seed)))
    graphdef, abstract_state, *rest = nnx.split(abstract_model, nnx.Param, ...)
    if rest and jax.tree.leaves(rest):
        raise ValueError("init_train_state supports models whose state is only nnx.Param")
    if mesh is None:
        return graphdef, (jax.eval_shape(init) if abstract else jax.jit(init)()), None

    logical = nnx.to_pure_dict(nnx.get_partition_spec(abstract_state))
    abstract_params = nnx.to_pure_dict(abstract_state)
    param_sh = _param_shardings(abstract_params, logical, mesh, rules)
    replicated = NamedSharding(mesh, P())
    shapes = jax.eval_shape(init)
    opt_sh = optax.tree_map_params(
        optimizer,
        lambda _, sharding: sharding,
        shapes.opt_state,
        param_sh,
        transform_non_params=lambda _: replicated,
    )
    shardings = TrainState(replicated, param_sh, opt_sh)
    if abstract:
        state = jax.tree.map(lambda a, sh: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sh), shapes, shardings)
        return graphdef, state, shardings
    state = jax.jit(init, out_shardings=shardings)()
    return graphdef, state, shardings


NEXT_TOKEN_KEYS = ("inputs", "targets", "loss_mask")


def _check_next_token_batch(batch: Batch, vocab_size: int | None = None) -> None:
    """The batch `next_token_loss` needs: its keys (ValueError naming the missing ones), integer
    `inputs`/`targets` (TypeError), and, when the arrays are concrete (not traced), ids in
    [0, vocab_size) (ValueError)."""
    missing = [k for k in NEXT_TOKEN_KEYS if k not in batch]
    if missing:
        raise ValueError(f"batch must have the keys {list(NEXT_TOKEN_KEYS)} (optional 'positions', 'segment_ids') "
                         f"for next_token_loss; missing {missing}, got keys {sorted(batch)}")
    for name in ("inputs", "targets"):
        check_token_ids(f'batch["{name}"]', batch[name], vocab_size)


def next_token_loss(model: nnx.Module, batch: Batch) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Masked next-token cross-entropy (plus the model's auxiliary loss).

    `batch` holds `inputs` [b, t], `targets` [b, t], `loss_mask` [b, t] and
    optionally `positions` / `segment_ids` [b, t]. A missing key raises ValueError naming it;
    float ids raise TypeError. Inside the jitted train step the ids are traced, so their range is
    not checked here: `fit` checks each batch eagerly (ids >= 0) before the step.
    """
    _check_next_token_batch(batch, getattr(getattr(model, "config", None), "vocab_size", None))
    out = model(batch["inputs"], positions=batch.get("positions"), segment_ids=batch.get("segment_ids"))
    logits = out.logits
    mask = batch["loss_mask"].astype(jnp.float32)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, batch["targets"])
    denom = jnp.maximum(mask.sum(), 1.0)
    loss = (ce * mask).sum() / denom
    correct = (jnp.argmax(logits, -1) == batch["targets"]).astype(jnp.float32)
    metrics = {"loss": loss, "token_accuracy": (correct * mask).sum() / denom, "aux_loss": out.aux_loss}
    return loss + out.aux_loss, metrics


def make_train_step(
    graphdef: nnx.GraphDef,
    optimizer: optax.GradientTransformation,
    *,
    loss_fn: LossFn = next_token_loss,
    shardings: Any = None,
    mesh: jax.sharding.Mesh | None = None,
    schedule: optax.Schedule | None = None,
) -> Callable[[TrainState, Batch], tuple[TrainState, dict[str, jax.Array]]]:
    """Builds the jitted pure step `(state, batch) -> (state, metrics)` (state donated).

    Args:
      graphdef: the model structure from `init_train_state`.
      optimizer: the same optax transformation used for the state.
      loss_fn: `(model, batch) -> (scalar loss, metrics)`.
      shardings: state shardings from `init_train_state` (None = unsharded).
      mesh: the mesh the state lives on (needed with shardings).
      schedule: if given, the learning rate is reported in the metrics.
    """

    def step(state: TrainState, batch: Batch):
        def loss_of(params):
            return loss_fn(nnx.merge(graphdef, params), batch)

        (_, metrics), grads = jax.value_and_grad(loss_of, has_aux=True)(state.params)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        metrics = dict(metrics, grad_norm=optax.tree.norm(grads))
        if schedule is not None:
            metrics["learning_rate"] = schedule(state.step)
        return TrainState(state.step + 1, params, opt_state), metrics

    if shardings is None:
        return jax.jit(step, donate_argnums=0)
    if mesh is None:
        raise ValueError("make_train_step needs the mesh when shardings are given")

    def step_on_mesh(state: TrainState, batch: Batch):
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):  # seen by `models.transformer.shard_batch`
            return step(state, batch)

    return jax.jit(
        step_on_mesh,
        in_shardings=(shardings, batch_sharding(mesh)),
        out_shardings=(shardings, NamedSharding(mesh, P())),
        donate_argnums=0,
    )


def _is_remote(path: epath.Path) -> bool:
    """Whether `path` names a remote filesystem (gs://, s3://, ...), which must not become a local path."""
    return "://" in str(path)


class Checkpointer:
    """Orbax checkpoints of a TrainState plus JSON metadata, in `directory`.

    Saves are asynchronous; `close()` (or leaving the `with` block) waits for
    them. Restoring needs the target shardings so arrays land where they were.
    """

    def __init__(self, directory: str | os.PathLike, *, max_to_keep: int = 2):
        # epath keeps a remote directory (gs://...) remote; pathlib would make it a local path.
        self.directory = epath.Path(directory)
        if not _is_remote(self.directory):
            self.directory = self.directory.absolute()
        self._manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True),
            item_names=("state", "meta"),
        )

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        return list(self._manager.all_steps())

    def save(self, step: int, state: TrainState, meta: Mapping[str, Any]) -> None:
        self._manager.save(
            step,
            args=ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(dict(meta))),
        )

    def metadata(self, step: int | None = None) -> dict:
        """The JSON metadata saved at `step` (default latest), without reading the state."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint in {self.directory}")
        return self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta

    def restore(self, state_like: TrainState, shardings: Any = None, step: int | None = None):
        """Restores (state, meta) at `step` (default latest) onto `state_like`'s structure."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint in {self.directory}")

        def abstract(x, s=None):
            return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s if s is not None else getattr(x, "sharding", None))

        target = jax.tree.map(abstract, state_like) if shardings is None else jax.tree.map(abstract, state_like, shardings)
        out = self._manager.restore(
            step, args=ocp.args.Composite(state=ocp.args.StandardRestore(target), meta=ocp.args.JsonRestore())
        )
        return out.state, out.meta

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class FitResult(NamedTuple):
    """Output of `fit`.

    Attributes:
      graphdef: the model structure; `nnx.merge(graphdef, state.params)` gives the model.
      state: the final TrainState.
      history: list of logged metric dicts (with "step" and "examples_per_s").
      resumed_from: the checkpoint step the run started from (None = fresh).
    """

    graphdef: nnx.GraphDef
    state: TrainState
    history: list[dict[str, float]]
    resumed_from: int | None

    def model(self) -> nnx.Module:
        return nnx.merge(self.graphdef, self.state.params)


def fit(
    *,
    model_fn: Callable[[nnx.Rngs], nnx.Module],
    optimizer_config: OptimizerConfig,
    batch_fn: Callable[[int], Mapping[str, np.ndarray]],
    num_steps: int,
    workdir: str | os.PathLike | None = None,
    mesh_config: MeshConfig | None = None,
    loss_fn: LossFn = next_token_loss,
    seed: int = 0,
    checkpoint_every: int = 100,
    log_every: int = 50,
    stop_after: int | None = None,
    progress: bool = True,
    desc: str = "train",
    fingerprint: str | None = None,
) -> FitResult:
    """Trains for `num_steps` optimizer steps, resuming from `workdir` if it has a checkpoint.

    Args:
      model_fn: builds the model from `nnx.Rngs`.
      optimizer_config: optimizer and schedule.
      batch_fn: `position -> batch` of numpy arrays; deterministic in the
        position, so resuming continues the exact data stream. It returns THIS process's rows of
        the global batch (`process_rows`); on one process that is the whole batch. With several
        processes `fit` assembles the global batch from every process's rows (leading dimension
        sharded over the mesh's ("data", "fsdp") axes), so no host builds the others' rows.
      num_steps: total optimizer steps of the run.
      workdir: where checkpoints go (`workdir/ckpt`), local or remote (`gs://...`, through
        `etils.epath`); None = no checkpoints.
      mesh_config: shard over a mesh (None = single default device; required with several processes).
      loss_fn: `(model, batch) -> (loss, metrics)`.
      seed: parameter init seed.
      checkpoint_every: save every this many steps (and at the end).
      log_every: record metrics every this many steps.
      stop_after: stop (as if interrupted) once this many total steps are done;
        for tests and for splitting long jobs.
      progress: show a tqdm progress bar.
      desc: progress bar label.
      fingerprint: a string identifying the run's settings (e.g. the repr of
        the experiment config). It is saved with each checkpoint; resuming
        from a checkpoint with a different fingerprint raises ValueError
        instead of silently continuing another run.

    Returns:
      FitResult.
    """
    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1; got {num_steps}")
    if mesh_config is None and jax.process_count() > 1:
        raise ValueError(f"mesh_config must be given on a multi-process job ({jax.process_count()} processes): "
                         "the batch is assembled from every process's rows over the mesh")
    optimizer = make_optimizer(optimizer_config)
    mesh = None if mesh_config is None else make_mesh(mesh_config)
    rules = DEFAULT_LOGICAL_AXIS_RULES if mesh_config is None else mesh_config.logical_axis_rules
    graphdef, state, shardings = init_train_state(model_fn, optimizer, seed=seed, mesh=mesh, rules=rules)
    train_step = make_train_step(graphdef, optimizer, loss_fn=loss_fn, shardings=shardings, mesh=mesh,
                                 schedule=optimizer_config.schedule())

    def put(batch):
        arrays = {k: np.asarray(v) for k, v in batch.items()}
        if mesh is None:
            return arrays
        # Each process holds its rows; the global array's leading dim is their concatenation in process order.
        sharding = batch_sharding(mesh)
        return {k: jax.make_array_from_process_local_data(sharding, v) for k, v in arrays.items()}

    # Throughput between logged rows; the data position is the step index.
    clock = {"t": None, "examples": 0}

    def step_fn(state, position):
        if clock["t"] is None:
            clock["t"] = time.perf_counter()
        batch = batch_fn(position)
        if loss_fn is next_token_loss:
            _check_next_token_batch(batch)  # eager: keys, dtypes, ids >= 0 (the model checks the rest traced)
        clock["examples"] += len(next(iter(batch.values()))) * jax.process_count()  # global examples
        return train_step(state, put(batch))

    def row_fn(done, metrics):
        now = time.perf_counter()
        row = dict(metrics, step=done, examples_per_s=clock["examples"] / max(now - clock["t"], 1e-9))
        clock["t"], clock["examples"] = now, 0
        return row

    out = run_loop(
        step_fn, state, num_steps=num_steps, stop_after=stop_after,
        checkpointer=None if workdir is None else Checkpointer(epath.Path(workdir) / "ckpt"),
        shardings=shardings, checkpoint_every=checkpoint_every,
        checkpoint_meta=lambda done: {"data_position": done}, fingerprint=fingerprint,
        log_every=log_every, row_fn=row_fn, progress=progress, desc=desc,
        postfix=lambda row: {"loss": f"{row['loss']:.4f}"})
    return FitResult(graphdef, out.state, out.history, out.resumed_from)


def initialize_distributed(
    *, coordinator_address: str | None = None, num_processes: int | None = None, process_id: int | None = None
) -> bool:
    """Initializes multi-host JAX when the environment is a multi-host job.

    Run the same command on every host. On Cloud TPU pods and SLURM/Open MPI
    clusters `jax.distributed.initialize()` detects everything itself; elsewhere
    pass the coordinator explicitly (or set JAX_COORDINATOR_ADDRESS,
    JAX_NUM_PROCESSES, JAX_PROCESS_ID). On a single host it does nothing.

    Returns:
      True if `jax.distributed` was initialized (now or before), else False.
    """
    if jax.distributed.is_initialized():
        return True
    coordinator_address = coordinator_address or os.environ.get("JAX_COORDINATOR_ADDRESS")
    if num_processes is None and "JAX_NUM_PROCESSES" in os.environ:
        num_processes = int(os.environ["JAX_NUM_PROCESSES"])
    if process_id is None and "JAX_PROCESS_ID" in os.environ:
        process_id = int(os.environ["JAX_PROCESS_ID"])
    tpu_hosts = [h for h in os.environ.get("TPU_WORKER_HOSTNAMES", "").split(",") if h]
    cluster = (
        int(os.environ.get("SLURM_NTASKS", "1")) > 1
        or int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1")) > 1
        or len(tpu_hosts) > 1
    )
    if coordinator_address is None and not cluster:
        return False
    jax.distributed.initialize(coordinator_address=coordinator_address, num_processes=num_processes,
                               process_id=process_id)
    return True
