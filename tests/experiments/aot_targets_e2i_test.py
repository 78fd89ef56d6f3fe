"""E2I-VRWKV's `train_step` (the target of ``python -m experiments aot e2i_vrwkv``) is the step its `run` trains
first (variant ``full``, seed ``seeds[0]``): the same model (config and module), optimizer, loss and global
batch (names, shapes, dtypes) at every preset.

The expected values are rebuilt here from the config, independently of `train_step`; the optimizer is checked
bit for bit against the optax expression `train_segmenter` used before it went through
`training.OptimizerConfig` (AdamW, weight decay on every parameter, b2 0.999, no clipping, warmup + cosine to
0); a source check pins that the run's trainer uses the very helpers `train_step` uses. (Its step's TPU compile is
not repeated here: the paper preset's is in results/aot/train_steps.json, the Bi-WKV kernel's in the kernel
contract.)
"""

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from algorithms import training
from algorithms.vision import e2i_vrwkv as e2i
from experiments import aot, registry
from experiments import e2i_vrwkv as exp_mod
from experiments.tasks import light_fields as lf
from models import vrwkv as vr


def _old_optimizer(learning_rate, weight_decay, num_steps):
    """`train_segmenter`'s optimizer before the refactor, verbatim."""
    sched = optax.warmup_cosine_decay_schedule(0.0, learning_rate, max(1, num_steps // 10), num_steps)
    return optax.adamw(sched, weight_decay=weight_decay)


def _expected(c):
    """(model config, optimizer, batch shapes) of the full variant's step, rebuilt from the config."""
    d, m, t = c.data, c.model, c.train
    backbone = vr.VRWKVConfig(image_size=d.image_size, patch_size=m.patch_size, num_classes=lf.NUM_CLASSES,
                              d_model=m.d_model, num_layers=m.num_layers)
    model = e2i.E2IConfig(backbone=backbone, views=d.views, prior_dim=m.prior_dim)  # every block on
    opt = training.OptimizerConfig(learning_rate=t.learning_rate, warmup_steps=max(1, t.steps // 10),
                                   total_steps=t.steps, end_lr_fraction=0.0, weight_decay=t.weight_decay, b2=0.999,
                                   clip_norm=None, decay_all_params=True)
    b, s = t.batch_size, d.image_size
    batch = {"input": ((b, d.views, d.views, s, s), np.float32), "labels": ((b, s, s), np.int32)}
    return model, opt, batch


def _param_shapes(build) -> dict:
    state = nnx.state(nnx.eval_shape(lambda: build(nnx.Rngs(0))), nnx.Param)  # abstract: nothing allocated
    return {jax.tree_util.keystr(k): (v.shape, v.dtype) for k, v in jax.tree_util.tree_leaves_with_path(state)}


# function -> source fragments it must hold: the run trains through the helpers `train_step` uses
SOURCES = {
    (exp_mod, "run"): ["for v in c.variants:\n        for s in c.seeds:", "train_eval(c, v, s, train, test)"],
    (exp_mod, "train_eval"): ["model = make_model(c, variant, seed)",
                              "e2i.train_segmenter(model, _batch_fn(c, variant, seed, train.views, train.labels)",
                              "num_steps=c.train.steps, learning_rate=c.train.learning_rate",
                              "weight_decay=c.train.weight_decay"],
    (exp_mod, "make_model"): ["_model_fn(c, variant, image_size)(nnx.Rngs(seed))"],
    (exp_mod, "train_step"): ["variant, d = c.variants[0], c.data", "_batch_fn(c, variant, c.seeds[0], *stand_in)(0)",
                              "model=model_config(c, variant), model_fn=_model_fn(c, variant)",
                              "loss_fn=e2i.segmenter_loss",
                              "e2i.optimizer_config(c.train.learning_rate, c.train.weight_decay,\n"
                              "                                                                   c.train.steps)"],
    (e2i, "train_segmenter"): ["hyper = (float(learning_rate), float(weight_decay), int(num_steps))",
                               "opt_state = _optimizer(*hyper).init(params)", "_train_step(*state, rest, batch"],
    (e2i, "_train_step"): ["tx = _optimizer(*hyper)", "segmenter_loss(nnx.merge(graphdef, p, rest), batch)"],
    (e2i, "_optimizer"): ["training.make_optimizer(optimizer_config(learning_rate, weight_decay, num_steps))"],
}


def test_e2i_vrwkv_is_hooked_to_its_train_step():
    assert registry.get("e2i_vrwkv").train_step is exp_mod.train_step
    assert "e2i_vrwkv" in aot.targets()


def test_the_trainer_uses_the_shared_loss_and_optimizer():
    for (module, fn), fragments in SOURCES.items():
        src = inspect.getsource(getattr(module, fn))
        for fragment in fragments:
            assert fragment in src, (fn, fragment)


@pytest.mark.parametrize("preset", sorted(registry.get("e2i_vrwkv").presets))
def test_every_preset_builds_the_step_run_trains_first(preset):
    exp = registry.get("e2i_vrwkv")
    c = exp.config(preset)
    assert c.variants[0] == "full"  # what run trains first at every preset (its loop is variants x seeds)
    model, opt, batch = _expected(c)
    step = exp.train_step(c)
    assert isinstance(step, aot.TrainStep) and not step.is_lm and step.seq_len is None
    assert step.model == model
    assert step.optimizer == opt
    assert step.loss_fn is e2i.segmenter_loss
    got = {k: (shape, np.dtype(dtype)) for k, (shape, dtype) in step.batch_shapes().items()}
    assert got == {k: (shape, np.dtype(dtype)) for k, (shape, dtype) in batch.items()}
    assert step.batch_size == c.train.batch_size
    assert _param_shapes(step.model_fn) == _param_shapes(lambda rngs: e2i.E2IVRWKV(model, rngs=rngs))
    assert _param_shapes(step.model_fn) == _param_shapes(lambda rngs: exp_mod.make_model(c, "full", 0))


def test_the_first_batch_of_the_run_has_the_steps_shapes():
    c = registry.get("e2i_vrwkv").config("smoke")
    train, _ = exp_mod._data(c)
    real = exp_mod._batch_fn(c, "full", c.seeds[0], train.views, train.labels)(0)
    real_step = aot.TrainStep.from_batch(real, model=None, model_fn=lambda rngs: None)
    assert real_step.batch_shapes() == exp_mod.train_step(c).batch_shapes()


@pytest.mark.parametrize("num_steps", [2, 7, 25])
def test_the_optimizer_is_bit_identical_to_the_old_optax_expression(num_steps):
    key = jax.random.key(num_steps)
    params = {"w": jax.random.normal(key, (3, 4)), "b": jnp.linspace(-1.0, 1.0, 4), "s": jnp.float32(0.5)}
    new = training.make_optimizer(e2i.optimizer_config(3e-3, 1e-2, num_steps))
    old = _old_optimizer(3e-3, 1e-2, num_steps)
    p_new, p_old, s_new, s_old = params, params, new.init(params), old.init(params)
    for i in range(min(num_steps, 6)):
        grads = jax.tree.map(lambda x: jnp.sin(x * (i + 1)) + 0.1, p_old)
        u_new, s_new = new.update(grads, s_new, p_new)
        u_old, s_old = old.update(grads, s_old, p_old)
        p_new, p_old = optax.apply_updates(p_new, u_new), optax.apply_updates(p_old, u_old)
        for a, b in zip(jax.tree.leaves(p_new), jax.tree.leaves(p_old)):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert any(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(p_new), jax.tree.leaves(params)))


def test_train_segmenter_is_bit_identical_to_the_old_loop():
    """A few steps of `train_segmenter` on a tiny E2I model equal the pre-refactor loop (old optax AdamW, the
    per-pixel CE) written out here, bit for bit."""
    c = registry.get("e2i_vrwkv").config("smoke")
    train, _ = exp_mod._data(c)
    batch_fn = exp_mod._batch_fn(c, "full", 0, train.views, train.labels)
    n = 4
    model, hist = e2i.train_segmenter(exp_mod.make_model(c, "full", 0), batch_fn, num_steps=n,
                                      learning_rate=c.train.learning_rate, weight_decay=c.train.weight_decay,
                                      progress=False)
    graphdef, params, rest = nnx.split(exp_mod.make_model(c, "full", 0), nnx.Param, ...)
    tx = _old_optimizer(c.train.learning_rate, c.train.weight_decay, n)
    opt_state = tx.init(params)

    @jax.jit
    def step(params, opt_state, batch):
        def loss_of(p):
            return e2i.segmentation_loss(nnx.merge(graphdef, p, rest)(batch["input"]), batch["labels"])

        loss, grads = jax.value_and_grad(loss_of)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    for i in range(n):
        b = batch_fn(i)
        params, opt_state, loss = step(params, opt_state, {"input": jnp.asarray(b["input"]),
                                                           "labels": jnp.asarray(b["labels"])})
    got = nnx.state(model, nnx.Param)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert float(hist[-1]["loss"]) == float(loss)


def test_segmenter_loss_is_the_per_pixel_ce_of_the_model():
    c = registry.get("e2i_vrwkv").config("smoke")
    model = exp_mod.make_model(c, "plain", 0)
    x = jax.random.uniform(jax.random.key(1), (2, 16, 16, 1))
    labels = jax.random.randint(jax.random.key(2), (2, 16, 16), -1, lf.NUM_CLASSES)
    loss, metrics = e2i.segmenter_loss(model, {"input": x, "labels": labels})
    assert float(loss) == float(e2i.segmentation_loss(model(x), labels)) == float(metrics["loss"])


def test_a_single_training_step_runs():
    """train.steps = 1 crashed before (the old schedule had an empty cosine part); it is now one step at the
    warmup's learning rate 0 (the parameters do not move)."""
    with pytest.raises(Exception):
        _old_optimizer(1e-2, 1e-4, 1).update({"w": jnp.ones(2)}, _old_optimizer(1e-2, 1e-4, 1).init({"w": jnp.ones(2)}),
                                             {"w": jnp.ones(2)})
    tx = training.make_optimizer(e2i.optimizer_config(1e-2, 1e-4, 1))
    params = {"w": jnp.ones(2)}
    updates, _ = tx.update({"w": jnp.ones(2)}, tx.init(params), params)
    np.testing.assert_array_equal(np.asarray(updates["w"]), 0.0)
