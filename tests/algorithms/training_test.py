"""Training: sharded == single device, interrupted+resumed == uninterrupted, schedule and mesh checks."""

import chex
import jax
import numpy as np
import pytest

from algorithms import training as T
from models import Transformer, TransformerConfig

CFG = TransformerConfig(vocab_size=16, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2, d_ff=64)
OPT = T.OptimizerConfig(learning_rate=1e-2, warmup_steps=2, total_steps=6)


def model_fn(rngs):
    return Transformer(CFG, rngs=rngs)


def batch_fn(position):
    """Deterministic in the position; the mask hides a ragged tail like real padding."""
    rng = np.random.default_rng([0, position])
    tokens = rng.integers(0, 16, (8, 9)).astype(np.int32)
    mask = (np.arange(8)[None] < rng.integers(4, 9, (8, 1))).astype(np.float32)
    return {"inputs": tokens[:, :-1], "targets": tokens[:, 1:], "loss_mask": mask}


@pytest.fixture(scope="module")
def single_device_run():
    return T.fit(model_fn=model_fn, optimizer_config=OPT, batch_fn=batch_fn, num_steps=6, log_every=1,
                 progress=False)


def test_sharded_2x2x2_equals_single_device(single_device_run):
    assert jax.device_count() >= 8, "conftest sets 8 simulated CPU devices"
    mesh_cfg = T.MeshConfig(data=2, fsdp=2, tensor=2)
    sharded = T.fit(model_fn=model_fn, optimizer_config=OPT, batch_fn=batch_fn, num_steps=6, log_every=1,
                    progress=False, mesh_config=mesh_cfg)
    losses1 = [h["loss"] for h in single_device_run.history]
    losses8 = [h["loss"] for h in sharded.history]
    np.testing.assert_allclose(losses8, losses1, atol=1e-5)
    chex.assert_trees_all_close(sharded.state.params, single_device_run.state.params, atol=1e-5, rtol=0)
    # The state really is distributed: a matrix is split over fsdp and tensor.
    wq = sharded.state.params["layers"][0]["attn"]["wq"]
    assert wq.sharding.spec == jax.sharding.PartitionSpec("fsdp", "tensor", None)
    assert len(wq.sharding.device_set) == 8


def test_interrupted_then_resumed_equals_uninterrupted(single_device_run, tmp_path):
    kwargs = dict(model_fn=model_fn, optimizer_config=OPT, batch_fn=batch_fn, num_steps=6, log_every=1,
                  progress=False, workdir=tmp_path, checkpoint_every=2)
    first = T.fit(**kwargs, stop_after=3)  # "crashes" after step 3; last checkpoint at step 2
    assert int(first.state.step) == 3
    ckpt = T.Checkpointer(tmp_path / "ckpt")
    assert ckpt.latest_step() == 3  # the final step of a run is always saved
    ckpt.close()
    resumed = T.fit(**kwargs)
    assert resumed.resumed_from == 3
    assert int(resumed.state.step) == 6
    chex.assert_trees_all_equal(resumed.state.params, single_device_run.state.params)
    assert [h["step"] for h in resumed.history] == [1, 2, 3, 4, 5, 6]
    np.testing.assert_allclose([h["loss"] for h in resumed.history],
                               [h["loss"] for h in single_device_run.history], atol=0)


def test_resume_from_a_mid_run_checkpoint(single_device_run, tmp_path):
    """Losing the steps after the last checkpoint replays them from the saved data position."""
    kwargs = dict(model_fn=model_fn, optimizer_config=OPT, batch_fn=batch_fn, num_steps=6, progress=False,
                  workdir=tmp_path, checkpoint_every=4)
    T.fit(**kwargs, stop_after=4)
    resumed = T.fit(**kwargs)
    assert resumed.resumed_from == 4
    chex.assert_trees_all_equal(resumed.state.params, single_device_run.state.params)


def test_resuming_a_different_run_is_refused(tmp_path):
    kwargs = dict(model_fn=model_fn, optimizer_config=OPT, batch_fn=batch_fn, num_steps=6, progress=False,
                  workdir=tmp_path)
    T.fit(**kwargs, stop_after=2, fingerprint="run-a")
    with pytest.raises(ValueError, match="belongs to a run with different settings"):
        T.fit(**kwargs, fingerprint="run-b")


def test_training_reduces_the_loss_on_a_fixed_batch():
    fixed = batch_fn(0)
    opt = T.OptimizerConfig(learning_rate=3e-3, warmup_steps=0, total_steps=40)
    run = T.fit(model_fn=model_fn, optimizer_config=opt, batch_fn=lambda _: fixed, num_steps=40, log_every=10,
                progress=False)
    assert run.history[-1]["loss"] < 0.5 * run.history[0]["loss"]


def test_schedule_warmup_then_cosine():
    cfg = T.OptimizerConfig(learning_rate=1.0, warmup_steps=10, total_steps=110, end_lr_fraction=0.1)
    sched = cfg.schedule()
    assert float(sched(0)) == 0.0
    assert float(sched(5)) == pytest.approx(0.5)
    assert float(sched(10)) == pytest.approx(1.0)
    assert float(sched(60)) == pytest.approx(0.1 + 0.9 * 0.5, rel=1e-5)  # cosine midpoint
    assert float(sched(110)) == pytest.approx(0.1)


def test_weight_decay_masks_matrices_unless_every_parameter_decays():
    import optax

    params = {"w": np.full((2, 3), 2.0), "b": np.full((3,), 2.0)}
    grads = {"w": np.full((2, 3), 0.5), "b": np.full((3,), -0.5)}
    for decay_all in (False, True):
        cfg = T.OptimizerConfig(learning_rate=0.1, warmup_steps=1, total_steps=5, weight_decay=0.3,
                                       clip_norm=None, decay_all_params=decay_all)
        mask = None if decay_all else {"w": True, "b": False}
        ref = optax.adamw(cfg.schedule(), b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=0.3, mask=mask)
        ours = T.make_optimizer(cfg)
        ref_state, our_state = ref.init(params), ours.init(params)
        for _ in range(3):
            u_ref, ref_state = ref.update(grads, ref_state, params)
            u_ours, our_state = ours.update(grads, our_state, params)
            for k in params:
                np.testing.assert_array_equal(u_ours[k], u_ref[k])
    # the field shows in the repr (a run's fingerprint) only when set
    assert "decay_all_params" not in repr(T.OptimizerConfig())
    assert "decay_all_params=True" in repr(T.OptimizerConfig(decay_all_params=True))


def test_mesh_shapes_and_errors():
    assert T.MeshConfig(data=-1, fsdp=2, tensor=2).shape(8) == (2, 2, 2)
    assert T.make_mesh(T.MeshConfig(data=-1)).shape["data"] == jax.device_count()
    with pytest.raises(ValueError, match="at most one mesh axis may be -1"):
        T.MeshConfig(data=-1, fsdp=-1).shape(8)
    with pytest.raises(ValueError, match="do not divide 8 devices"):
        T.MeshConfig(data=3, fsdp=2, tensor=2).shape(8)
    with pytest.raises(ValueError, match="warmup_steps"):
        T.OptimizerConfig(warmup_steps=20, total_steps=10)


def test_initialize_distributed_is_a_no_op_on_one_host(monkeypatch):
    for var in ("JAX_COORDINATOR_ADDRESS", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "TPU_WORKER_HOSTNAMES"):
        monkeypatch.delenv(var, raising=False)
    assert T.initialize_distributed() is False
