"""`train_step` of the experiments that train in their own loop (not one `training.fit` call): nmars (the arms'
masked-SFT step), staged_vlm (the VLM's supervised warm-up), sparse_scaling (the widest grid run's DST step),
vegas and ffd (the ``tuned`` long-context workload's fine-tuning, `experiments._long_context`).

Each hook is checked against two independent things at every preset: the model, optimizer and global batch
rebuilt here from the config, and what `run`'s own trainer receives (its trainer is replaced by a spy that
records its arguments and stops it before any training). staged_vlm's optimizer, now a
`training.OptimizerConfig`, is checked bit for bit against the ``optax.adamw`` it replaced. With libtpu
installed the smallest smoke step is compiled for a v5e 2x2 slice.
"""

import dataclasses
import inspect
import types

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from algorithms import training
from algorithms.rl import staged_perception as sp
from algorithms.scaling import dynamic_sparse as ds
from experiments import _long_context as lc
from experiments import aot, ffd, nmars, registry, sparse_scaling, staged_vlm, vegas
from models.induction import InductionSpec
from models.transformer import TransformerConfig

SLUGS = ("nmars", "staged_vlm", "sparse_scaling", "vegas", "ffd")


class _Stop(Exception):
    """Raised by a spy once it has recorded what the trainer was given."""


def _presets(slug):
    exp = registry.get(slug)
    return [(p, exp.config(p)) for p in exp.presets]


def _param_shapes(model):
    """{path: (shape, dtype)} of a model's parameters (an abstract model from `nnx.eval_shape` or a real one)."""
    return {p: (tuple(v.shape), jnp.dtype(v.dtype)) for p, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}


def _built(step):
    """The hook's model, built abstractly."""
    return nnx.eval_shape(lambda: step.build(nnx.Rngs(0)))


def _tree_shapes(tree):
    return {jax.tree_util.keystr(p): (tuple(np.shape(x)), jnp.dtype(jnp.result_type(x)))
            for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _global_batch(step):
    return {k: (tuple(shape), jnp.dtype(dtype)) for k, (shape, dtype) in step.batch_shapes().items()}


def _batch_of(batch):
    return {k: (tuple(np.shape(v)), jnp.dtype(jnp.result_type(v))) for k, v in batch.items()}


def test_these_experiments_are_hooked():
    for slug in SLUGS:
        assert registry.get(slug).train_step is not None, slug
        assert slug in aot.targets(), slug


# --- nmars -----------------------------------------------------------------------------------------


def _nmars_width(c) -> int:
    """The arms' batch width (tokens): the clean row plus 2 k_max for the inferred deviations; for the diff
    augmentation at least prompt + sample (answer + EOS + extra) + as many <UNDO>s + the answer + EOS."""
    task, prompt_len, answer_len, _ = nmars._task(c)
    width = task.max_seq_len + 2 * max(c.augment.deviation_lengths)
    if c.augment.kind == "diff":
        sample = answer_len + 1 + c.augment.sample_extra_tokens
        width = max(width, prompt_len + 2 * sample + answer_len + 1)
    return width


def test_nmars_step_is_the_arms_masked_sft_step_at_every_preset():
    src = inspect.getsource(nmars._run_seed)
    # the arms A-C (C is N-MARS masked SFT) share one step: `fit`'s default masked loss, this optimizer
    assert "opt_cfg = _sft_optimizer(c)" in src and "training.make_train_step(ext_graphdef, optimizer)" in src
    assert "base_len, aug_len = _widths(c, seq_len, prompt_len, answer_len)" in src
    for preset, c in _presets("nmars"):
        step = nmars.train_step(c)
        vocab = nmars._task(c)[0].tokenizer().vocab_size
        assert step.is_lm and step.model == dataclasses.replace(c.model.transformer(vocab), vocab_size=vocab + 1)
        assert step.optimizer == training.OptimizerConfig(
            learning_rate=c.train.sft_lr, warmup_steps=min(100, c.train.sft_steps // 5),
            total_steps=c.train.sft_steps, weight_decay=0.01), preset
        assert (step.batch_size, step.seq_len) == (c.train.batch, _nmars_width(c) - 1), preset
        assert step.loss_fn is training.next_token_loss


def test_nmars_hook_matches_what_the_arms_are_given(monkeypatch, tmp_path):
    c = registry.get("nmars").config("smoke")  # no warm start: the arms are the first `_continue`
    seen = {}

    def spy(c_, name, step_fn, optimizer, params, batch_fn, steps, workdir, fingerprint):
        seen.update(name=name, params=_tree_shapes(params), batch=_batch_of(batch_fn(0)), steps=steps)
        raise _Stop

    monkeypatch.setattr(nmars, "_continue", spy)
    with pytest.raises(_Stop):
        nmars._run_seed(dataclasses.replace(c, seeds=()), tmp_path)
    step = nmars.train_step(c)
    assert seen["name"] == "A_sft" and seen["steps"] == c.train.sft_steps
    assert seen["batch"] == _global_batch(step)
    built = _param_shapes(_built(step))
    assert sorted(seen["params"].values(), key=repr) == sorted(built.values(), key=repr)


# --- staged_vlm ------------------------------------------------------------------------------------


def test_staged_vlm_step_is_the_warm_up_at_every_preset(monkeypatch, tmp_path):
    assert "opt = training.make_optimizer(_sft_optimizer(c))" in inspect.getsource(staged_vlm.warm_start)
    assert "_sft_batch_fn(c, tok)" in inspect.getsource(staged_vlm.warm_start)
    # warm_start builds its model with `make_model`; built abstractly here (the same shapes and dtypes, the spy
    # below records nothing else): an eager init of every preset's VLM compiled each initializer op per shape
    make_model = staged_vlm.make_model
    monkeypatch.setattr(staged_vlm, "make_model",
                        lambda c_, tok_, seed: nnx.eval_shape(lambda: make_model(c_, tok_, seed)))
    for preset, c in _presets("staged_vlm"):
        step = staged_vlm.train_step(c)
        tok = staged_vlm.make_tokenizer(c.data.grid)
        assert not step.is_lm and step.model == staged_vlm.vlm_config(c, tok), preset
        assert step.model.lm.vocab_size == tok.vocab_size and step.model.lm.d_model == c.model.d_model
        assert step.model.vit.d_model == c.model.vit_d_model and step.model.vit.num_layers == c.model.vit_layers
        assert step.optimizer == training.OptimizerConfig(
            learning_rate=c.sft.lr, warmup_steps=0, total_steps=c.sft.steps, end_lr_fraction=1.0, weight_decay=0.0,
            b1=0.9, b2=0.999, eps=1e-8, clip_norm=None), preset
        b = 4 * max(1, c.sft.batch // 4)  # an equal share of the 3 kinds + caption-view perception
        t = staged_vlm.prompt_len(c) + c.decode.max_new_tokens - 1
        s = c.data.image_size
        assert _global_batch(step) == {"inputs": ((b, t), jnp.int32), "targets": ((b, t), jnp.int32),
                                       "loss_mask": ((b, t), jnp.float32),
                                       "images": ((b, 1, s, s, 3), jnp.float32)}, preset

        seen = {}

        def spy(graphdef, params, batch_fn, *, steps, optimizer, progress=True):
            seen.update(params=_tree_shapes(params), batch=_batch_of(sp._sft_arrays(batch_fn(0))), steps=steps)
            raise _Stop

        monkeypatch.setattr(sp, "vlm_sft", spy)
        with pytest.raises(_Stop):
            staged_vlm.warm_start(c, tok, tmp_path / preset)
        assert seen["batch"] == _global_batch(step) and seen["steps"] == c.sft.steps, preset
        built = _param_shapes(_built(step))
        assert sorted(seen["params"].values(), key=repr) == sorted(built.values(), key=repr), preset


def test_staged_vlm_optimizer_config_is_bit_identical_to_the_adamw_it_replaced():
    c = registry.get("staged_vlm").config("smoke")
    c = dataclasses.replace(c, sft=dataclasses.replace(c.sft, steps=3))
    tok = staged_vlm.make_tokenizer(c.data.grid)
    graphdef, params = nnx.split(staged_vlm.make_model(c, tok, c.seed), nnx.Param)
    params = nnx.to_pure_dict(params)
    fresh = lambda: jax.tree.map(jnp.copy, params)  # noqa: E731  (every step donates its state)
    batch_fn = staged_vlm._sft_batch_fn(c, tok)
    old, old_losses = sp.vlm_sft(graphdef, fresh(), batch_fn, steps=3,
                                 optimizer=optax.adamw(c.sft.lr, weight_decay=0.0), progress=False)
    new_opt = training.make_optimizer(staged_vlm._sft_optimizer(c))
    new, new_losses = sp.vlm_sft(graphdef, fresh(), batch_fn, steps=3, optimizer=new_opt, progress=False)
    assert old_losses == new_losses
    for a, b in zip(jax.tree.leaves(old), jax.tree.leaves(new)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # and the hook's step (`make_train_step` with its loss) takes the warm-up's step
    step = staged_vlm.train_step(c)
    # the hook's optimizer settings are the warm-up's, so `make_optimizer` of them is the optimizer above: that
    # object is reused, and with it the compiled warm-up step (the optimizer is a static argument of the step)
    assert step.optimizer == staged_vlm._sft_optimizer(c)
    opt = new_opt
    state = training.TrainState(jnp.zeros((), jnp.int32), fresh(), opt.init(params))
    state, metrics = training.make_train_step(graphdef, opt, loss_fn=step.loss_fn)(state, sp._sft_arrays(batch_fn(0)))
    one, losses = sp.vlm_sft(graphdef, fresh(), batch_fn, steps=1, optimizer=opt, progress=False)
    assert float(metrics["loss"]) == pytest.approx(losses[0], rel=1e-6)
    for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(one)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


# --- sparse_scaling --------------------------------------------------------------------------------


def test_sparse_scaling_step_is_the_widest_grid_run_at_every_preset(monkeypatch, tmp_path):
    assert "opt_cfg = _optimizer(c)" in inspect.getsource(sparse_scaling._train_grid)
    for preset, c in _presets("sparse_scaling"):
        step = sparse_scaling.train_step(c)
        d = max(c.model.d_models)
        heads = max(1, d // c.model.head_dim)
        assert step.is_lm and step.model == TransformerConfig(
            vocab_size=c.data.vocab_size, d_model=d, num_layers=c.model.num_layers, num_heads=heads,
            num_kv_heads=heads, d_ff=c.model.ffn_multiplier * d, head_dim=c.model.head_dim), preset
        steps = max(1, c.data.unique_sequences // c.train.batch_size) * c.train.max_epochs
        assert step.optimizer == training.OptimizerConfig(
            learning_rate=c.train.learning_rate, warmup_steps=min(c.train.warmup_steps, steps), total_steps=steps,
            end_lr_fraction=1.0, weight_decay=0.0, clip_norm=None), preset
        assert (step.batch_size, step.seq_len) == (c.train.batch_size, c.data.seq_len), preset

        models, runs = [], []

        def make_fns(model_fn, optimizer, **kw):
            models.append(nnx.eval_shape(lambda: model_fn(nnx.Rngs(0))).config)
            return types.SimpleNamespace()  # compiled once per width: not asked again for the next density

        def train(**kw):  # records the run, returns a tiny stand-in result
            runs.append((kw["optimizer_config"], _batch_of(kw["batch_fn"](0)), kw["num_steps"], kw["density"]))
            w = {"w": np.ones((2, 2), np.float32)}
            return ds.DSTResult(training.TrainState(0, w, None), {"w": np.ones((2, 2), bool)}, [{"loss": 0.0}], {},
                                4, 4)

        monkeypatch.setattr(ds, "make_dst_functions", make_fns)
        monkeypatch.setattr(ds, "train_dst", train)
        sparse_scaling._train_grid(c, tmp_path / preset)
        assert len(models) == len(c.model.d_models) and len(runs) == len(c.model.d_models) * len(c.model.densities)
        assert max(models, key=lambda m: m.num_params()) == step.model, preset
        for opt, batch, num_steps, _ in runs:
            assert opt == step.optimizer and batch == _global_batch(step) and num_steps == steps, preset


# --- vegas, ffd ------------------------------------------------------------------------------------


@pytest.mark.parametrize("module", [vegas, ffd], ids=["vegas", "ffd"])
def test_vegas_and_ffd_step_is_the_tuned_workloads_fine_tuning(module, monkeypatch):
    slug = module.__name__.rsplit(".", 1)[1]
    assert ("lc.build(c.lm.workloads, vocab_size=c.lm.vocab_size, record_size=c.lm.record_size, tune=c.lm.tune,"
            in inspect.getsource(module.run))
    assert "opt = tune_optimizer(tc)" in inspect.getsource(lc.tuned_model)
    built = 0
    for preset, c in _presets(slug):
        if "tuned" not in c.lm.workloads:  # only the tuned workload is trained
            with pytest.raises(ValueError, match=f"^{slug} trains nothing"):
                module.train_step(c)
            continue
        step = module.train_step(c)
        tc = c.lm.tune
        cfg = InductionSpec(vocab_size=c.lm.vocab_size, record_size=tc.record_size).config()
        assert not step.is_lm and step.model == cfg and step.loss_fn is lc.answer_loss, preset
        assert step.optimizer == training.OptimizerConfig(
            learning_rate=tc.learning_rate, warmup_steps=max(1, tc.steps // 10), total_steps=tc.steps), preset
        b, a = tc.batch_size, tc.answer_len
        assert _global_batch(step) == {"inputs": ((b, tc.context_len + a - 1), jnp.int32),
                                       "at": ((b, a), jnp.int32), "targets": ((b, a), jnp.int32)}, preset

        seen = {}

        def fit(*, model_fn, optimizer_config, batch_fn, loss_fn, **kw):
            seen.update(model=model_fn(nnx.Rngs(0)), opt=optimizer_config, batch=_batch_of(batch_fn(0)), loss=loss_fn)
            raise _Stop

        monkeypatch.setattr(training, "fit", fit)
        with pytest.raises(_Stop):
            lc.build(("tuned",), vocab_size=c.lm.vocab_size, record_size=c.lm.record_size, tune=tc, workdir=None)
        assert seen["model"].config == step.model and seen["opt"] == step.optimizer and seen["loss"] is step.loss_fn
        assert seen["batch"] == _global_batch(step), preset
        shapes = _param_shapes(_built(step))
        assert _param_shapes(seen["model"]) == shapes, preset
        built += 1
    assert built >= 1 and "tuned" in registry.get(slug).config("paper").lm.workloads


# --- one compile -----------------------------------------------------------------------------------


def test_the_smallest_smoke_step_compiles_for_v5e(compile_smoke_step):
    compile_smoke_step(SLUGS)
