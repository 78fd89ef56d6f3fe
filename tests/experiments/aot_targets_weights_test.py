"""`train_step` hooks whose optimizer is the run's own optax transformation (the target of
``python -m experiments aot <slug>``): each is the step its `run` trains, at every preset.

ppm: `algorithms.forecasting.ppm.train` now steps with `make_optimizer(config, steps_per_epoch)` (Adam's unit
step times the epoch's "type1" rate, looked up from the step count), the very function the hook calls; its
updates are bit-identical to the loop it replaced (``w - lr_e * scale_by_adam(g)`` with ``lr_e`` a float32
argument per epoch), pinned below. The expected model config, batch shapes and per-step rates are rebuilt
here from the config, independently of the hook. With libtpu installed the smallest smoke step compiles for
v5e 2x2.

weightclip: `algorithms.weight_space.weightclip.train_weightclip` now builds its optimizer with `make_optimizer(cfg)`
(clip + AdamW, one-cycle schedule) and its loss with `step_loss` (the model draw, the set draw and
``L_recon + w L_align``), both called by the hook; the loop's updates are unchanged (the expected chain below is
the one it wrote inline). The step samples its models inside, so the hook's batch is the training zoo it samples
from (one row per model).
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


def _ppm_expected(c):
    from models import ppm as M

    model = M.PPMConfig(seq_len=c.data.seq_len, pred_len=c.data.pred_len, d_model=c.model.d_model,
                        d_ff=c.model.d_ff)
    train_steps = int(0.7 * c.data.length)  # the 70% training split, windows of L + H at stride 1
    n = len(range(train_steps - (c.data.seq_len + c.data.pred_len) + 1))
    b = min(c.train.batch_size, n)
    per_epoch = n // b if not c.train.max_steps_per_epoch else min(n // b, c.train.max_steps_per_epoch)
    rates = [np.float32(c.train.learning_rate * c.train.lr_decay ** e) for e in range(c.train.epochs)]
    batch = {"x": ((b, c.data.seq_len, c.data.num_channels), jnp.float32),
             "y": ((b, c.data.pred_len, c.data.num_channels), jnp.float32), "key": ((b, 4), jnp.uint32)}
    return model, (per_epoch, rates), batch


def _weightclip_expected(c):
    import math

    from algorithms.weight_space import zoo as zoo_lib
    from experiments.tasks.digits import load_digits

    zc = zoo_lib.ZooConfig(num_models=c.zoo.num_models, hidden=c.zoo.hidden,
                           num_subset_classes=c.zoo.num_subset_classes, noise_levels=c.zoo.noise_levels,
                           steps=c.zoo.steps, batch_size=c.zoo.batch_size, shared_init=True,
                           pretrain_steps=c.zoo.pretrain_steps, seed=c.seed)
    v = zoo_lib.sample_variants(zc)
    # the held-out split: a dataset is (classes, rotation, noise); holdout_fraction of them (>= 2) are held out
    desc = [tuple(a) + (r, n) for a, r, n in zip(np.asarray(v["classes"]).tolist(), v["rotation"], v["noise"])]
    uniq = sorted(set(desc))
    ids = np.array([uniq.index(d) for d in desc])
    held = np.random.default_rng([c.seed, 31]).permutation(np.arange(len(uniq)))
    held = held[:max(2, int(round(c.zoo.holdout_fraction * len(uniq))))]
    m = int(np.sum(~np.isin(ids, held)))
    n = load_digits(seed=c.seed)[0][1].shape[0]
    sizes = (64, *c.zoo.hidden, 10)
    ts = max(sizes[:-1]) + 1
    t = sum(d_out * math.ceil((d_in + 1) / ts) for d_in, d_out in zip(sizes[:-1], sizes[1:]))
    model = {"tokensize": ts, "tokens": t, "d_x": 64, "model": dataclasses.asdict(c.model),
             "bias_init": c.train.bias_init}
    batch = {"tokens": ((m, t, ts), jnp.float32), "variant": ((m,), jnp.int32), "labels": ((m, n), jnp.int32),
             "weights": ((m, n), jnp.float32), "dataset_id": ((m,), jnp.int32), "key": ((m, 2), jnp.uint32)}
    sched = optax.cosine_onecycle_schedule(c.train.steps, c.train.lr)
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(sched, weight_decay=3e-9,
                                                                 mask=lambda p: jax.tree.map(lambda x: x.ndim > 1, p)))
    return model, tx, batch


# slug -> expected (model config, optimizer, global batch shapes); ppm's optimizer is given as (steps per epoch,
# float32 rate of each epoch), weightclip's as the optax chain its loop ran before the refactor
HOOKED = {"ppm": _ppm_expected, "weightclip": _weightclip_expected}


def test_the_hooked_experiments_define_a_train_step():
    for slug in HOOKED:
        assert registry.get(slug).train_step is not None, slug
        assert slug in aot.targets()


def _unit_and_update(tx, count):
    """(scale_by_adam's update, `tx`'s update) at step `count` of a fixed gradient, both from fresh moments."""
    p = {"w": jnp.linspace(-1.0, 1.0, 6), "s": jnp.asarray(0.5)}
    g = jax.tree.map(lambda x: jnp.cos(3 * x) + 0.2, p)
    adam = optax.scale_by_adam()
    unit, _ = adam.update(g, optax.tree.set(adam.init(p), count=jnp.int32(count)), p)
    upd, _ = tx.update(g, optax.tree.set(tx.init(p), count=jnp.int32(count)), p)
    return unit, upd


def _updates_at(tx, count):
    """`tx`'s update at step `count` of a fixed (large, so clipped) gradient: matrices, vectors and a scalar."""
    p = {"ae": {"w": jnp.linspace(-1.0, 1.0, 12).reshape(3, 4), "b": jnp.linspace(0.0, 1.0, 4)},
         "enc": {"w": jnp.ones((2, 5))}, "bias": jnp.asarray(-4.0)}
    g = jax.tree.map(lambda x: 3.0 * jnp.cos(3 * x) + 0.2, p)
    return tx.update(g, optax.tree.set(tx.init(p), count=jnp.int32(count)), p)[0]


@pytest.mark.parametrize("slug", sorted(HOOKED))
def test_every_preset_builds_the_step_run_trains(slug):
    exp = registry.get(slug)
    for preset in exp.presets:
        c = exp.config(preset)
        step = exp.train_step(c)
        model, opt, batch = HOOKED[slug](c)
        assert isinstance(step, aot.TrainStep) and not step.is_lm, preset
        assert step.model == model, preset
        assert step.batch_shapes() == batch, preset
        assert step.batch_size == next(iter(batch.values()))[0][0] > 0, preset
        per_epoch, rates = opt if slug == "ppm" else (None, None)
        assert isinstance(step.optimizer, optax.GradientTransformation), preset
        if slug == "weightclip":
            total = c.train.steps
            for count in (0, 1, total // 3, total - 1, total + 5):
                assert _tree_equal(_updates_at(step.optimizer, count), _updates_at(opt, count)), (preset, count)
            continue
        epochs = len(rates)
        for count in sorted({0, per_epoch - 1, per_epoch, (epochs - 1) * per_epoch - 1, (epochs - 1) * per_epoch,
                             epochs * per_epoch + 7} - {-1}):
            unit, upd = _unit_and_update(step.optimizer, count)
            rate = rates[min(count // per_epoch, epochs - 1)]
            for u, v in zip(jax.tree.leaves(unit), jax.tree.leaves(upd)):
                np.testing.assert_array_equal(np.asarray(v), -rate * np.asarray(u), err_msg=f"{preset} {count}")


def _tree_equal(a, b):
    return all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def test_ppm_optimizer_is_bit_identical_to_the_loop_it_replaced():
    from algorithms.forecasting import ppm as F

    cfg = F.TrainConfig(learning_rate=3e-3, lr_decay=0.7, epochs=3)
    per_epoch = 4
    tx = F.make_optimizer(cfg, per_epoch)
    adam = optax.scale_by_adam()
    p = {"w": jax.random.normal(jax.random.key(0), (7, 5)), "b": jnp.linspace(-1, 1, 5)}
    ours, theirs, o, s = p, p, tx.init(p), adam.init(p)

    @jax.jit
    def new(p, o, i):  # F.train's step now
        u, o = tx.update(jax.tree.map(lambda x: jnp.sin(x * (i + 1.0)) + 0.1 * x, p), o, p)
        return optax.apply_updates(p, u), o

    @jax.jit
    def old(p, s, lr, i):  # F.train's step before: scale_by_adam, then w - lr * u with the epoch's float32 lr
        u, s = adam.update(jax.tree.map(lambda x: jnp.sin(x * (i + 1.0)) + 0.1 * x, p), s, p)
        return jax.tree.map(lambda w, u: w - lr * u, p, u), s

    for i in range(cfg.epochs * per_epoch + 3):  # the last steps run past the final epoch
        epoch = min(i // per_epoch, cfg.epochs - 1) + 1
        ours, o = new(ours, o, i)
        theirs, s = old(theirs, s, jnp.float32(cfg.learning_rate * cfg.lr_decay ** (epoch - 1)), i)
        assert _tree_equal(ours, theirs), i
    assert F.epoch_steps(150, F.TrainConfig(batch_size=64)) == (64, 2)
    assert F.epoch_steps(40, F.TrainConfig(batch_size=64, max_steps_per_epoch=3)) == (40, 1)
    assert F.epoch_steps(1000, F.TrainConfig(batch_size=10, max_steps_per_epoch=3)) == (10, 3)


def test_ppm_run_trains_with_the_hooked_optimizer_loss_and_windows():
    from algorithms.forecasting import ppm as F
    from experiments import ppm

    train_src = inspect.getsource(F.train)
    assert "bs, steps_per_epoch = epoch_steps(n, config)" in train_src
    assert "opt = make_optimizer(config, steps_per_epoch)" in train_src
    assert "loss, parts = loss_fn(nnx.merge(graphdef, p, rest), x, y, k)" in train_src
    assert "return optax.apply_updates(p, updates), s, loss" in train_src
    assert "params, opt_state, loss = step(params, opt_state, x_tr[idx], y_tr[idx], jax.random.fold_in(ekey, i + 1))" \
        in train_src
    run_src = inspect.getsource(ppm._run_dataset)
    assert "mcfg, tcfg, lcfg = _model_config(c), _train_config(c), _loss_config(c)" in run_src
    assert "(xtr, ytr), (xva, yva), (xte, yte) = _splits(series, c)" in run_src
    assert "r = F.train(model, loss, (xtr, ytr), (xva, yva)" in run_src and "def fit(name, model, loss, config=tcfg)" \
        in run_src
    assert 'ppm = fit("PPM", M.PPM(mcfg, rngs=nnx.Rngs(c.seed)), F.make_ppm_loss(lcfg))' in run_src
    assert 'key = jax.random.key(c.seed, impl="rbg")' in inspect.getsource(ppm.run)
    for preset in ("smoke", "quick"):  # the windows run really trains on (paper: the same arithmetic, tested above)
        c = registry.get("ppm").config(preset)
        series = ppm.make_series(jax.random.key(0, impl="rbg"), length=c.data.length,
                                 num_channels=c.data.num_channels)
        xtr, ytr = ppm._splits(series, c)[0]
        expected = _ppm_expected(c)[2]
        assert ppm._num_train_windows(c) == xtr.shape[0]
        assert (xtr.shape[1:], ytr.shape[1:]) == (expected["x"][0][1:], expected["y"][0][1:])


def test_ppm_step_loss_is_the_hybrid_loss_with_the_step_key():
    from algorithms.forecasting import ppm as F
    from experiments import ppm
    from models import ppm as M

    c = registry.get("ppm").config("smoke")
    step = ppm.train_step(c)
    model = M.PPM(step.model, rngs=nnx.Rngs(c.seed))
    rng = np.random.default_rng(0)
    key = jax.random.fold_in(jax.random.key(4, impl="rbg"), 3)
    b = step.batch_size
    batch = {"x": jnp.asarray(rng.normal(size=(b, c.data.seq_len, c.data.num_channels)), jnp.float32),
             "y": jnp.asarray(rng.normal(size=(b, c.data.pred_len, c.data.num_channels)), jnp.float32),
             "key": jnp.broadcast_to(jax.random.key_data(key), (b, 4))}
    assert {k: (v.shape, v.dtype) for k, v in batch.items()} == step.batch_shapes()
    got, parts = step.loss_fn(model, batch)
    loss = F.make_ppm_loss(F.HybridLossConfig(tau=c.loss.tau, bandwidth=c.loss.bandwidth,
                                              num_samples=c.loss.train_samples, beta_kl=c.loss.beta_kl))
    want, want_parts = loss(model, batch["x"], batch["y"], key)
    assert float(got) == float(want) and parts.keys() == want_parts.keys()
    other, _ = step.loss_fn(model, dict(batch, key=jnp.broadcast_to(jax.random.key_data(
        jax.random.key(5, impl="rbg")), (b, 4))))
    assert float(other) != float(got)  # the key matters: the prior's noise is drawn from it
    built = nnx.state(step.build(nnx.Rngs(0)), nnx.Param)
    assert jax.tree.map(jnp.shape, built) == jax.tree.map(jnp.shape, nnx.state(model, nnx.Param))


def test_weightclip_run_trains_the_aligned_method_with_the_hooked_optimizer_and_loss():
    from algorithms.weight_space import weightclip as wc
    from experiments import weightclip

    src = inspect.getsource(wc.train_weightclip)
    assert "tx = make_optimizer(cfg)" in src
    assert ('return step_loss(nnx.merge(ae_g, p["ae"], ae_rest), nnx.merge(en_g, p["enc"]), p["bias"], tokens, '
            'tmask, pool,\n                         ids, k, cfg, batch_size=bs)') in src
    assert "(_, (r, a)), g = jax.value_and_grad(loss_fn, has_aux=True)(p, k)" in src
    assert "bs = min(cfg.batch_size, m)" in src
    train_src = inspect.getsource(weightclip._train)
    assert "ae = _ae(c, t.tokensize, t.positions, nnx.Rngs(c.seed + 1))" in train_src
    assert "enc = _encoder(c, data.xr_tr.shape[-1], nnx.Rngs(c.seed + 2))" in train_src
    assert "args = (data.tokens[data.tr], t.mask, sub, data.ds_id[data.tr])" in train_src
    assert "_aligned_train_config(c, obj)" in train_src and 'obj = "siglip" if method == "weightclip"' in train_src
    data_src = inspect.getsource(weightclip._Data)
    assert "self.ds_id, self.held_ds, self.tr, self.te = _split(c, zoo.classes, zoo.rotation, zoo.noise)" in data_src
    assert "self.tok = wc.WeightTokenizer.fit([k[self.tr] for k in zoo.kernels]" in data_src
    assert "symmetry=c.zoo.symmetry)" in data_src and "tokensize" not in data_src.split("WeightTokenizer.fit(")[1][:120]


def test_weightclip_step_loss_is_the_library_step_loss_over_the_pool():
    from algorithms.weight_space import weightclip as wc
    from experiments import weightclip

    c = registry.get("weightclip").config("smoke")
    step = weightclip.train_step(c)
    models = step.build(nnx.Rngs(0))
    assert isinstance(models.ae, wc.WeightAE) and isinstance(models.enc, wc.DatasetEncoder)
    assert float(models.bias[...]) == c.train.bias_init
    assert all(isinstance(v, nnx.Param) for _, v in nnx.iter_graph(models) if isinstance(v, nnx.Variable))
    rng = np.random.default_rng(0)
    shapes = step.batch_shapes()
    m, n = shapes["labels"][0]
    key = jax.random.key(11)
    batch = {"tokens": jnp.asarray(rng.normal(size=shapes["tokens"][0]), jnp.float32),
             "variant": jnp.asarray(rng.integers(0, 4, m), jnp.int32),
             "labels": jnp.asarray(rng.integers(0, 10, (m, n)), jnp.int32),
             "weights": jnp.asarray(rng.random((m, n)) < 0.3, jnp.float32),
             "dataset_id": jnp.asarray(rng.integers(0, 6, m), jnp.int32),
             "key": jnp.broadcast_to(jax.random.key_data(key), (m, 2))}
    assert {k: (v.shape, v.dtype) for k, v in batch.items()} == shapes
    got, parts = step.loss_fn(models, batch)
    recon, align = parts["recon"], parts["align"]
    (xtr, _), _ = weightclip.load_digits(seed=c.seed)
    x = np.stack([np.rot90(xtr, k, axes=(1, 2)).reshape(xtr.shape[0], -1) for k in range(4)]).astype(np.float32)
    cfg = wc.TrainConfig(steps=c.train.steps, batch_size=c.train.batch_size, set_size=c.train.set_size, lr=c.train.lr,
                         temperature=c.train.temperature, bias_init=c.train.bias_init,
                         siglip_reduction=c.train.siglip_reduction, align_weight=c.train.align_weight,
                         objective="siglip")
    mask = wc.tokenize([np.zeros((1, 64, c.zoo.hidden[0]))] + [np.zeros((1, a, b)) for a, b in zip(
        c.zoo.hidden, (*c.zoo.hidden[1:], 10))], [np.zeros((1, h)) for h in (*c.zoo.hidden, 10)], tokensize=65)[1]
    pool = wc.DatasetPool(jnp.asarray(x), batch["variant"], batch["labels"], batch["weights"])
    want, (want_recon, want_align) = wc.step_loss(models.ae, models.enc, models.bias[...], batch["tokens"],
                                                  jnp.asarray(mask), pool, batch["dataset_id"], key, cfg,
                                                  batch_size=min(c.train.batch_size, m))
    assert float(got) == float(want) and float(recon) == float(want_recon) and float(align) == float(want_align)
    assert float(align) > 0


@pytest.mark.parametrize("slug", sorted(HOOKED))
def test_one_smoke_step_runs_on_cpu_through_make_train_step(slug):
    """What `aot.compile_train_step` traces (init_train_state + make_train_step), run for real at smoke scale."""
    step = registry.get(slug).train_step(registry.get(slug).config("smoke"))
    graphdef, state, _ = training.init_train_state(step.build, step.optimizer)
    fn = training.make_train_step(graphdef, step.optimizer, loss_fn=step.loss_fn)
    rng = np.random.default_rng(0)
    batch = {k: jnp.asarray(rng.normal(size=shape), dtype) if jnp.issubdtype(dtype, jnp.floating)
             else jnp.zeros(shape, dtype) for k, (shape, dtype) in step.batch_shapes().items()}
    if "weights" in batch:  # every model's dataset holds every image
        batch["weights"] = jnp.ones_like(batch["weights"])
    impl = "rbg" if slug == "ppm" else None
    batch["key"] = jnp.broadcast_to(jax.random.key_data(jax.random.key(1, impl=impl)), batch["key"].shape)
    new, metrics = fn(state, batch)
    assert int(new.step) == 1 and np.isfinite(float(metrics["grad_norm"])) and float(metrics["grad_norm"]) > 0
    assert not _tree_equal(new.params, training.init_train_state(step.build, step.optimizer)[1].params)


def test_the_smallest_smoke_step_compiles_for_v5e(compile_smoke_step):
    compile_smoke_step(HOOKED)
