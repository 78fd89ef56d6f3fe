"""`train_step` hooks of experiments that train a non-LM network by gradient steps (the target of
``python -m experiments aot <slug>``): each is the step its `run` trains, at every preset.

The expected model config, optimizer and global batch are rebuilt here from the config and the task,
independently of `train_step`; the source checks pin the loss and optimizer `run`'s trainer uses, each
hook's loss is checked against the library loss (or an independent float64 reference), and each
optimizer helper against the optax chain the loop runs: plmd's loop now calls the helper itself (bit for
bit the Adam it replaced); fm_active_learning's and eelma's loops keep ``optax.adam(lr)`` (bit-identical
updates), the zoo keeps Adam's unit step scaled by each member's lr (equal up to rounding). With libtpu
installed the smallest smoke step compiles for v5e 2x2.
"""

import dataclasses
import inspect

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from algorithms import training
from experiments import aot, registry


def _adam(lr, steps, *, b2):
    """Adam at a constant learning rate, no decay or clipping, written out field by field."""
    return training.OptimizerConfig(learning_rate=lr, warmup_steps=0, total_steps=steps, end_lr_fraction=1.0,
                                    weight_decay=0.0, b1=0.9, b2=b2, eps=1e-8, clip_norm=None)


def _plmd_expected(c):
    from algorithms.vision import plmd as plmd_lib
    from experiments.tasks import floorplans as fp

    model = plmd_lib.PLMDConfig(num_labels=fp.NUM_LABELS, wall_label=fp.WALL, T=c.model.T,
                                max_sigma=c.model.max_sigma, channels=c.model.channels, u_min=c.model.u_min,
                                u_max=c.model.u_max, lr=c.train.lr)
    maps = fp.make_dataset(c.seed * 1000 + 1, 2, n=c.data.grid, num_rooms=c.data.num_rooms, radius=c.data.radius,
                           walk_steps=c.data.walk_steps)
    b = c.train.batch_size
    # what plmd_lib.train feeds its step: jnp.asarray(labels[idx]), jnp.asarray(known[idx]), one rbg key
    batch = {"labels": ((b, c.data.grid, c.data.grid), jnp.asarray(maps["labels"]).dtype),
             "known": ((b, c.data.grid, c.data.grid), jnp.asarray(maps["known"]).dtype),
             "key": ((b, 4), jnp.uint32)}
    return model, _adam(c.train.lr, c.train.steps, b2=0.99), batch


def _fm_active_learning_expected(c):
    import sklearn.datasets

    digits = sklearn.datasets.load_digits()
    k = 10
    n_max = np.bincount(digits.target).min() - c.data.test_per_class - c.fm.source_per_class
    n = sum(max(2, int(round(n_max * c.data.imbalance_ratio ** (-r / (k - 1))))) for r in range(k))  # the pool
    d = digits.images[0].size
    batch = {"x": ((n, d), jnp.float32), "labels": ((n,), jnp.int32), "weights": ((n,), jnp.float32)}
    return {"in_dim": d, "num_classes": k, "hidden": c.learner.hidden}, _adam(c.learner.lr, c.learner.steps,
                                                                              b2=0.999), batch


def _eelma_expected(c):
    ids = ((c.train.batch_size,), jnp.int32)
    model = {"state_dim": c.model.embed_dim, "action_dim": c.model.embed_dim, "hidden": c.model.hidden,
             "proj_dim": c.model.proj_dim, "out_dim": c.model.out_dim}
    return model, _adam(c.train.learning_rate, c.train.num_steps, b2=0.999), {"s": ids, "a": ids, "f": ids}


def _mvprobe_expected(c):
    from algorithms.weight_space import zoo as zoo_lib
    from experiments import mvprobe

    lr = float(zoo_lib.sample_variants(mvprobe._zoo_config(c))["lr"][0])  # member 0's learning rate
    assert 3e-3 <= lr <= 1e-2  # ZooConfig's default lr_range
    b = c.zoo.batch_size
    batch = {"x": ((b, 64), jnp.float32), "labels": ((b,), jnp.int32), "weights": ((b,), jnp.float32)}
    return {"sizes": (64, *c.zoo.hidden, 10)}, _adam(lr, c.zoo.steps, b2=0.999), batch


# slug -> expected (model config, optimizer, global batch shapes) of a config
HOOKED = {"plmd": _plmd_expected, "fm_active_learning": _fm_active_learning_expected, "eelma": _eelma_expected,
          "mvprobe": _mvprobe_expected}


def test_the_hooked_experiments_define_a_train_step():
    for slug in HOOKED:
        assert registry.get(slug).train_step is not None, slug
        assert slug in aot.targets()


@pytest.mark.parametrize("slug", sorted(HOOKED))
def test_every_preset_builds_the_step_run_trains(slug):
    exp = registry.get(slug)
    for preset in exp.presets:
        c = exp.config(preset)
        step = exp.train_step(c)
        model, optimizer, batch = HOOKED[slug](c)
        assert isinstance(step, aot.TrainStep) and not step.is_lm, preset
        assert step.model == model, preset
        assert step.optimizer == optimizer, preset
        assert step.batch_shapes() == batch, preset
        assert step.batch_size == next(iter(batch.values()))[0][0] > 0, preset


def test_plmd_run_trains_with_the_hooked_optimizer_and_loss():
    from algorithms.vision import plmd as plmd_lib
    from experiments import plmd

    train_src = inspect.getsource(plmd_lib.train)
    assert "opt = training.make_optimizer(optimizer_config(config, steps=steps))" in train_src
    assert "return loss_fn(nnx.merge(graphdef, p), {\"labels\": lab, \"known\": kn}, key, config, sch)" in train_src
    run_src = inspect.getsource(plmd.run)
    assert "cfg = _plmd_config(c)" in run_src and "kw = _map_kwargs(c)" in run_src
    assert "plmd_lib.train(models, train, cfg, steps=c.train.steps, batch_size=c.train.batch_size" in run_src


def _tree_equal(a, b):
    return all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def _updates(tx, steps=5):
    """Parameters after `steps` updates of `tx` on fixed pseudo-gradients (matrices, vectors, a scalar)."""
    p = {"w": jax.random.normal(jax.random.key(0), (7, 5)), "b": jnp.linspace(-1, 1, 5), "s": jnp.asarray(0.3)}
    o = tx.init(p)

    @jax.jit
    def one(p, o, i):
        u, o = tx.update(jax.tree.map(lambda x: jnp.sin(x * (i + 1.0)) + 0.1 * x, p), o, p)
        return optax.apply_updates(p, u), o

    for i in range(steps):
        p, o = one(p, o, i)
    return p


def test_plmd_optimizer_helper_is_bit_identical_to_the_adam_it_replaced():
    from algorithms.vision import plmd as plmd_lib

    for lr in (2e-3, 2e-4):
        cfg = plmd_lib.PLMDConfig(lr=lr)
        ours = _updates(training.make_optimizer(plmd_lib.optimizer_config(cfg, steps=50)))
        assert _tree_equal(ours, _updates(optax.adam(lr, b1=0.9, b2=0.99)))


def test_plmd_step_loss_is_the_library_loss_with_the_step_key():
    from algorithms.vision import plmd as plmd_lib
    from experiments import plmd

    c = registry.get("plmd").config("smoke")
    step = plmd.train_step(c)
    cfg = step.model
    models = plmd_lib.init_models(cfg, seed=0)
    maps = plmd.fp.make_dataset(5, step.batch_size, **plmd._map_kwargs(c))
    key = jax.random.key(9, impl="rbg")
    batch = {"labels": jnp.asarray(maps["labels"]), "known": jnp.asarray(maps["known"]),
             "key": jnp.broadcast_to(jax.random.key_data(key), (step.batch_size, 4))}
    assert {k: (v.shape, v.dtype) for k, v in batch.items()} == step.batch_shapes()
    got, parts = step.loss_fn(models, batch)
    want, want_parts = plmd_lib.loss_fn(models, {"labels": batch["labels"], "known": batch["known"]}, key, cfg,
                                        cfg.schedule)
    assert float(got) == float(want) and parts.keys() == want_parts.keys()
    # and the hooked model is the run's: same parameter shapes as plmd_lib.init_models
    built = nnx.state(step.build(nnx.Rngs(0)), nnx.Param)
    assert jax.tree.map(jnp.shape, built) == jax.tree.map(jnp.shape, nnx.state(models, nnx.Param))


def test_fm_active_learning_run_trains_heads_with_the_hooked_loss_and_optimizer():
    from algorithms.active_learning import learner
    from experiments import fm_active_learning as fal

    fit_src = inspect.getsource(learner._fit)
    assert "opt = optax.adam(lr)" in fit_src  # lr is traced in _fit; optimizer_config matches it bit for bit below
    assert "w = sample_weights(y, w, balanced=balanced, num_classes=num_classes)" in fit_src
    assert "return head_loss(nnx.merge(graphdef, p), x, y, w, weight_decay=weight_decay)" in fit_src
    assert inspect.signature(learner.fit_heads).parameters["balanced"].default is True
    call = inspect.getsource(fal._run_noise).split("learner.fit_heads(x_runs")[1].split("num_classes=K)")[0]
    assert "hidden=c.learner.hidden" in call and "steps=c.learner.steps, lr=c.learner.lr" in call
    assert "weight_decay=c.learner.weight_decay" in call and "balanced" not in call
    for lr in (0.05, 0.02):
        ours = _updates(training.make_optimizer(learner.optimizer_config(lr, 200)))
        assert _tree_equal(ours, _updates(optax.adam(lr)))
    c = registry.get("fm_active_learning").config("smoke")
    assert fal._splits(c, 1, fal._digits()[1])[-1].size == fal.train_step(c).batch_size  # every seed's pool


def test_fm_active_learning_step_loss_is_the_balanced_weighted_ce_plus_l2():
    from algorithms.active_learning import learner

    c = registry.get("fm_active_learning").config("smoke")
    c = dataclasses.replace(c, learner=dataclasses.replace(c.learner, hidden=5))
    step = registry.get("fm_active_learning").train_step(c)
    model = step.build(nnx.Rngs(3))
    assert isinstance(model, learner.SmallHead)
    rng = np.random.default_rng(0)
    n, d = step.batch_size, step.example["x"][0][0]
    batch = {"x": jnp.asarray(rng.normal(size=(n, d)), jnp.float32), "labels": jnp.asarray(rng.integers(0, 10, n), jnp.int32),
             "weights": jnp.asarray((rng.random(n) < 0.2) * rng.choice([1.0, 0.2], n), jnp.float32)}
    got, _ = step.loss_fn(model, batch)
    # independent float64 reference: class-balanced weights summing to 1, CE, L2 on every parameter
    y, w = np.asarray(batch["labels"]), np.asarray(batch["weights"], np.float64)
    counts = np.bincount(y, weights=(w > 0).astype(np.float64), minlength=10)
    w = w / np.maximum(counts[y], 1.0)
    w = w / w.sum()
    logits = np.asarray(model(batch["x"]), np.float64)
    logp = logits - logits.max(1, keepdims=True)
    logp = logp - np.log(np.exp(logp).sum(1, keepdims=True))
    l2 = sum(float(np.sum(np.asarray(a, np.float64) ** 2)) for a in jax.tree.leaves(nnx.state(model, nnx.Param)))
    want = float(np.sum(w * -logp[np.arange(n), y]) + c.learner.weight_decay * l2)
    np.testing.assert_allclose(float(got), want, rtol=1e-5)


def test_eelma_run_trains_critics_with_the_hooked_loss_optimizer_and_tables():
    from algorithms.agents import eelma as eelma_lib
    from experiments import eelma

    src = inspect.getsource(eelma_lib.train_critics)
    assert "opt = optax.adam(learning_rate)" in src and "idx = jax.random.randint(key, (batch_size,), 0, n)" in src
    assert "return eelma_loss(nnx.merge(graphdef, p), state_table, action_table, s_i[idx], a_i[idx], f_i[idx])" in src
    run_src = inspect.getsource(eelma._run_env)
    assert "state_table, action_table = _tables(c, env)" in run_src
    assert ("num_steps=c.train.num_steps, batch_size=c.train.batch_size,\n" in run_src
            and "learning_rate=c.train.learning_rate,\n" in run_src
            and "hidden=c.model.hidden, proj_dim=c.model.proj_dim, out_dim=c.model.out_dim," in run_src)
    for lr in (1e-3, 3e-4):
        assert _tree_equal(_updates(training.make_optimizer(eelma_lib.optimizer_config(lr, 100))),
                           _updates(optax.adam(lr)))
    c = registry.get("eelma").config("smoke")
    step = eelma.train_step(c)
    largest = max(c.envs, key=lambda n: len(eelma._make_env(n).state_texts))
    env = eelma._make_env(largest)
    st = eelma_lib.hash_embed(env.state_texts, dim=c.model.embed_dim, seed=c.seed)
    at = eelma_lib.hash_embed(env.action_texts, dim=c.model.embed_dim, seed=c.seed + 1)
    model = step.build(nnx.Rngs(0))
    rng = np.random.default_rng(1)
    k = step.batch_size
    batch = {"s": jnp.asarray(rng.integers(0, len(env.state_texts), k), jnp.int32),
             "a": jnp.asarray(rng.integers(0, len(env.action_texts), k), jnp.int32),
             "f": jnp.asarray(rng.integers(0, len(env.state_texts), k), jnp.int32)}
    got, _ = step.loss_fn(model, batch)
    want, _ = eelma_lib.eelma_loss(model, st, at, batch["s"], batch["a"], batch["f"])
    assert float(got) == float(want)


def test_mvprobe_zoo_members_train_with_the_hooked_loss_and_an_equal_adam():
    from algorithms.weight_space import zoo as zoo_lib
    from experiments import mvprobe

    src = inspect.getsource(zoo_lib._train_one)
    assert "tx = optax.adam(1.0)" in src and "st = jax.tree.map(lambda p, u: p + lr * u, st, upd)" in src
    assert "idx = jax.random.randint(k, (batch_size,), 0, n)" in src
    assert "g = jax.grad(_loss, argnums=1)(graphdef, st, x[idx], labels[idx], weights[idx])" in src
    assert "return member_loss(nnx.merge(graphdef, state), x, labels, weights)" in inspect.getsource(zoo_lib._loss)
    assert "steps=config.steps, batch_size=config.batch_size)" in inspect.getsource(zoo_lib.build_zoo)
    assert "zoo = zoo_lib.build_zoo(_zoo_config(c)" in inspect.getsource(mvprobe.run)
    for lr in (3e-3, 8e-3):  # the member's update: Adam's unit step scaled by its lr (equal up to rounding)
        unit = optax.adam(1.0)
        scaled = optax.GradientTransformation(unit.init, lambda g, s, p=None: (
            jax.tree.map(lambda u: lr * u, unit.update(g, s, p)[0]), unit.update(g, s, p)[1]))
        ours = _updates(training.make_optimizer(zoo_lib.member_optimizer_config(lr, 150)))
        for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(_updates(scaled))):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)
    c = registry.get("mvprobe").config("smoke")
    step = mvprobe.train_step(c)
    model = step.build(nnx.Rngs(0))
    rng = np.random.default_rng(2)
    b = step.batch_size
    batch = {"x": jnp.asarray(rng.normal(size=(b, 64)), jnp.float32),
             "labels": jnp.asarray(rng.integers(0, 10, b), jnp.int32),
             "weights": jnp.asarray(rng.random(b) < 0.5, jnp.float32)}
    got, _ = step.loss_fn(model, batch)
    logits = np.asarray(model(batch["x"]), np.float64)
    logp = logits - logits.max(1, keepdims=True)
    logp = logp - np.log(np.exp(logp).sum(1, keepdims=True))
    w = np.asarray(batch["weights"], np.float64)
    want = np.sum(w * -logp[np.arange(b), np.asarray(batch["labels"])]) / max(w.sum(), 1.0)
    np.testing.assert_allclose(float(got), want, rtol=1e-5)


def test_the_smallest_smoke_step_compiles_for_v5e(compile_smoke_step):
    compile_smoke_step(HOOKED)
