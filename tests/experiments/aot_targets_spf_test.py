"""spf's `train_step` hook (the target of ``python -m experiments aot spf``): the step its `run` trains, at every
preset.

`run` trains a `NeuralSDE`'s raw parameter pytree through `spf.train_path_follower`, whose update now differentiates
`spf.episode_loss` (`spf_surrogate` for SPF, `pdm_objective` for PDM) and steps with `spf.make_optimizer` (Adam, cosine
decay when ``lr_decay < 1``), the very functions the hook calls; the loop's updates are bit-identical to the ones it
wrote inline before (``jax.grad(spf_surrogate)`` / ``jax.grad(pdm_objective)`` and ``optax.adam(schedule)``, written
out below). The hook wraps the pytree in `nnx.Param` leaves and carries the episode's key in the batch (the paths are
simulated inside the step). With libtpu installed the smoke step compiles for v5e 2x2.
"""

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from algorithms import training
from algorithms.optimization import stochastic_path_follower as S
from experiments import aot, registry
from experiments import spf as E

PRESETS = ("smoke", "quick", "loss_study", "paper")


def _tree_equal(a, b):
    return jax.tree.structure(a) == jax.tree.structure(b) and all(
        np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def _unit_updates(tx, counts):
    """The update of `tx` on a unit gradient of a scalar after `count` earlier unit steps, for each count."""
    p, out = jnp.zeros(()), []
    state = tx.init(p)
    for i in range(max(counts) + 1):
        u, state = tx.update(jnp.ones(()), state, p)
        if i in counts:
            out.append(float(u))
    return out


@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_builds_the_step_run_trains(preset):
    c = registry.get("spf").config(preset)
    step = registry.get("spf").train_step(c)
    t = c.train
    assert isinstance(step, aot.TrainStep) and not step.is_lm
    assert step.model == S.NeuralSDE(dim=c.dim, width=c.sde.width, depth=c.sde.depth,
                                     time_features=c.sde.time_features, horizon=c.horizon,
                                     sigma_init=c.sde.sigma_init)
    assert step.batch_size == t.num_paths and step.batch_shapes() == {"key": ((t.num_paths, 2), jnp.uint32)}
    if preset == "paper":
        assert step.batch_size % 4 == 0  # splits over a v5e:2x2
    expected = dict(method="spf", num_paths=t.num_paths, loss=t.spf_loss, malliavin_weight=t.malliavin_weight,
                    kappa=t.kappa, data_batch=t.data_batch)
    assert step.loss_fn.keywords["options"] == expected and step.loss_fn.func is E._step_loss
    assert step.loss_fn.keywords["ts"].shape == (c.num_steps + 1,) and step.loss_fn.keywords["x0"].shape == (c.dim,)
    sched = t.learning_rate if t.lr_decay == 1 else optax.cosine_decay_schedule(t.learning_rate, t.num_episodes,
                                                                                 alpha=t.lr_decay)
    counts = (0, 1, t.num_episodes // 2)
    assert _unit_updates(step.optimizer, counts) == _unit_updates(optax.adam(sched), counts)
    model = nnx.eval_shape(lambda: step.build(nnx.Rngs(0)))
    want = jax.eval_shape(lambda: step.model.init(jax.random.key(0)))
    assert [x.shape for x in jax.tree.leaves(nnx.state(model, nnx.Param))] == [x.shape for x in jax.tree.leaves(want)]
    assert all(isinstance(v, nnx.Param) for _, v in nnx.iter_graph(model) if isinstance(v, nnx.Variable))


@pytest.mark.parametrize("method,lr_decay", [("spf", 1.0), ("pdm", 0.1)])
def test_the_loop_is_bit_identical_to_the_inline_update_it_replaced(method, lr_decay):
    c = registry.get("spf").config("smoke")
    problem, ts, x0, sde, (ktrain, *_) = E._setting(c, "least_squares", E._problem_keys(c)[0]["least_squares"])
    opts = E._loss_options(c, method)
    n, lr = 3, 3e-3
    got = S.train_path_follower(problem, sde, x0, ts, ktrain, num_episodes=n, learning_rate=lr, lr_decay=lr_decay,
                                log_every=1, **opts)
    kinit, kloop = jax.random.split(ktrain)
    sched = lr if lr_decay == 1 else optax.cosine_decay_schedule(lr, n, alpha=lr_decay)
    opt = optax.adam(sched)

    @jax.jit
    def update(p, s, k):  # _make_update before the refactor
        if method == "spf":
            g, aux = jax.grad(S.spf_surrogate, has_aux=True)(
                p, problem, sde, x0, ts, k, num_paths=opts["num_paths"], loss=opts["loss"],
                malliavin_weight=opts["malliavin_weight"], kappa=opts["kappa"], data_batch=opts["data_batch"])
        else:
            g, aux = jax.grad(S.pdm_objective, has_aux=True)(p, problem, sde, x0, ts, k, num_paths=opts["num_paths"],
                                                             data_batch=opts["data_batch"])
        u, s = opt.update(g, s, p)
        return optax.apply_updates(p, u), s, aux

    p = sde.init(kinit)
    s = opt.init(p)
    for k in jax.random.split(kloop, n):
        p, s, _ = update(p, s, k)
    assert _tree_equal(got.params, p)


def test_run_trains_with_the_hooked_loss_options_and_optimizer():
    update_src = inspect.getsource(S._make_update)
    assert "opt = make_optimizer(learning_rate, num_episodes, lr_decay)" in update_src
    assert "jax.grad(episode_loss, has_aux=True)(p, problem, sde, x0, ts, k, method=method," in update_src
    train_src = inspect.getsource(E._train)
    assert "**_loss_options(c, method, malliavin_weight=malliavin_weight, loss=loss)" in train_src
    assert "spf.train_path_follower(" in train_src
    assert "_setting(c, name, key)" in inspect.getsource(E._run_problem)
    assert "_problem_keys(c)" in inspect.getsource(E.run)
    hook_src = inspect.getsource(E.train_step)
    assert "spf.make_optimizer(float(t.learning_rate), t.num_episodes, float(t.lr_decay))" in hook_src
    assert "options=_loss_options(c, \"spf\")" in hook_src
    assert "spf.episode_loss(model.raw(), problem, sde, x0, ts, key, **options)" in inspect.getsource(E._step_loss)


def test_step_loss_is_the_episode_loss_with_the_batch_key():
    c = registry.get("spf").config("smoke")
    step = registry.get("spf").train_step(c)
    problem, ts, x0, sde, (ktrain, *_) = E._setting(c, "least_squares", E._problem_keys(c)[0]["least_squares"])
    kinit, kloop = jax.random.split(jax.random.fold_in(ktrain, 0))
    model = step.build(nnx.Rngs(0))
    assert _tree_equal(model.raw(), sde.init(kinit))  # the first seed's initial parameters
    k = jax.random.split(kloop, 2)[1]
    batch = {"key": jnp.broadcast_to(jax.random.key_data(k), (step.batch_size, 2))}
    got, aux = step.loss_fn(model, batch)
    want, want_aux = S.spf_surrogate(sde.init(kinit), problem, sde, x0, ts, k, num_paths=c.train.num_paths,
                                     loss=c.train.spf_loss, malliavin_weight=c.train.malliavin_weight,
                                     kappa=c.train.kappa, data_batch=c.train.data_batch)
    assert float(got) == float(want) and _tree_equal(aux, want_aux)


def test_one_smoke_step_runs_on_cpu_through_make_train_step():
    """What `aot.compile_train_step` traces (init_train_state + make_train_step), run for real at smoke scale: one
    step equals the run's first episode (up to float rounding: another compilation of the same update)."""
    c = registry.get("spf").config("smoke")
    step = registry.get("spf").train_step(c)
    graphdef, state, _ = training.init_train_state(step.build, step.optimizer)
    fn = training.make_train_step(graphdef, step.optimizer, loss_fn=step.loss_fn)
    problem, ts, x0, sde, (ktrain, *_) = E._setting(c, "least_squares", E._problem_keys(c)[0]["least_squares"])
    key = jax.random.fold_in(ktrain, 0)
    _, kloop = jax.random.split(key)
    k0 = jax.random.split(kloop, 1)[0]
    new, metrics = fn(state, {"key": jnp.broadcast_to(jax.random.key_data(k0), (step.batch_size, 2))})
    assert int(new.step) == 1 and np.isfinite(float(metrics["grad_norm"])) and float(metrics["grad_norm"]) > 0
    run = S.train_path_follower(problem, sde, x0, ts, key, num_episodes=1, learning_rate=c.train.learning_rate,
                                lr_decay=c.train.lr_decay, **E._loss_options(c, "spf"))
    got = jax.tree.map(lambda v: v[...], new.params, is_leaf=lambda v: isinstance(v, nnx.Variable))
    for a, b in zip(jax.tree.leaves(run.params), jax.tree.leaves(got)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-5, atol=1e-6)
    assert not _tree_equal(got, step.build(nnx.Rngs(0)).raw())


def test_the_smoke_step_compiles_for_v5e(compile_smoke_step):
    _, _, row = compile_smoke_step(["spf"])
    assert row["batch"] == {"key": [row["batch_size"], 2]}
