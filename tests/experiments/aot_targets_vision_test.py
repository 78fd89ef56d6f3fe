"""The vision, video and VLM experiments' `train_step` (the target of ``python -m experiments aot <slug>``) is
the step their `run` trains through `training.fit`: the same model (config and module), optimizer schedule,
loss and global batch (names, shapes, dtypes), at every preset.

The expected values are rebuilt here from the config (and, where the data is on this machine, from the data
`run` loads), independently of `train_step`; a source check pins that `run`'s trainer passes `fit` the very
helpers `train_step` uses. With libtpu installed the smallest smoke step is compiled for a v5e 2x2 slice.
(``e2i_vrwkv``'s hook is pinned in aot_targets_e2i_test.py.)
"""

import importlib
import inspect

import jax
import numpy as np
import pytest
from flax import nnx

from algorithms import training
from experiments import aot, registry


def _opt(lr, steps, weight_decay, *, warmup=None):
    return training.OptimizerConfig(learning_rate=lr, warmup_steps=max(1, steps // 10) if warmup is None else warmup,
                                    total_steps=steps, weight_decay=weight_decay)


def _qvg(m, c):
    from models.video import VideoConfig, VideoTransformer, next_frame_loss

    v, t = c.video, c.train
    tokens, pixels = (v.size // v.patch) ** 2, v.patch ** 2
    model = VideoConfig(patch_pixels=pixels, tokens_per_frame=tokens, max_frames=t.frames, d_model=c.model.d_model,
                        num_heads=c.model.num_heads, num_layers=c.model.num_layers)
    batch = {"patches": ((t.batch_size, t.frames, tokens, pixels), np.float32)}
    return model, VideoTransformer, next_frame_loss, _opt(t.learning_rate, max(1, t.steps), 0.0), batch


def _image_side(m, c, side_by_dataset):
    side = side_by_dataset[c.data.dataset]
    if c.data.dataset != "cifar10":  # the data is on this machine: the run's images have this side
        (xtr, ytr), _ = m._data(c)
        assert xtr.shape[1:] == (side, side, 1) and xtr.dtype == np.float32 and ytr.dtype == np.int32
    return side


def _toast(m, c):
    from experiments.tasks import shapes
    from models.vit import ViT, ViTConfig, classification_loss

    cifar = c.data.dataset == "cifar10"
    side = _image_side(m, c, {"digits": 8 * c.data.upsample, "shapes": c.data.shapes_size, "cifar10": 32})
    channels = 3 if cifar else 1
    model = ViTConfig(image_size=side, patch_size=c.model.patch_size, channels=channels,
                      num_classes=shapes.NUM_CLASSES if c.data.dataset == "shapes" else 10, d_model=c.model.d_model,
                      num_heads=c.model.num_heads, d_ff=c.model.d_ff, num_layers=c.model.num_layers)
    b = c.train.batch_size
    batch = {"image": ((b, side, side, channels), np.float32), "label": ((b,), np.int32)}
    return model, ViT, classification_loss, _opt(c.train.learning_rate, c.train.steps, c.train.weight_decay), batch


def _prim(m, c):
    from experiments.tasks import scenes as sc
    from models.vlm import VLM

    d, tok = c.data, sc.make_tokenizer(c.data.grid)
    model = m.vlm_config(c)  # the config `train` builds (pinned below); its parts checked field by field here
    assert model.lm.vocab_size == tok.vocab_size and (model.lm.d_model, model.lm.num_layers) == (
        c.model.d_model, c.model.num_layers)
    assert (model.vit.image_size, model.vit.patch_size, model.vit.channels) == (d.image_size, d.patch_size, 3)
    assert (model.audio_frames, model.audio_frame_len) == (d.grid * d.grid, d.slot_len)
    seq = m._train_pool(c)["inputs"].shape[1]  # the pool's longest example (the test patches in the pool it made)
    b = c.train.batch_size
    batch = {"inputs": ((b, seq), np.int32), "targets": ((b, seq), np.int32), "loss_mask": ((b, seq), np.float32),
             "images": ((b, 1, d.image_size, d.image_size, 3), np.float32),
             "audio": ((b, 1, d.grid * d.grid, d.slot_len), np.float32)}
    opt = _opt(c.train.learning_rate, c.train.steps, 0.01, warmup=min(50, c.train.steps // 5))
    return model, VLM, m._loss, opt, batch


def _dem_hec_arch(m, c, arch):
    from models import cnn as cnn_lib
    from models import vit as vit_lib

    side = _image_side(m, c, {"digits": 8 * c.data.upsample, "cifar10": 32})
    channels = 3 if c.data.dataset == "cifar10" else 1
    if arch == "cnn":
        model = cnn_lib.CNNConfig(in_channels=channels, num_classes=10, channels=c.cnn.channels,
                                  hidden_dim=c.cnn.hidden_dim,
                                  num_groups=4 if all(ch % 4 == 0 for ch in c.cnn.channels) else 1)
        cls, loss, sec = cnn_lib.CNN, cnn_lib.classification_loss, c.cnn
    else:
        model = vit_lib.ViTConfig(image_size=side, patch_size=c.vit.patch_size, channels=channels, num_classes=10,
                                  d_model=c.vit.d_model, num_heads=c.vit.num_heads, d_ff=c.vit.d_ff,
                                  num_layers=c.vit.num_layers)
        cls, loss, sec = vit_lib.ViT, vit_lib.classification_loss, c.vit
    b = c.batch_size
    batch = {"image": ((b, side, side, channels), np.float32), "label": ((b,), np.int32)}
    return model, cls, loss, _opt(sec.learning_rate, sec.train_steps, c.weight_decay), batch


def _dem_hec(m, c):
    return _dem_hec_arch(m, c, c.archs[0])  # run trains archs[0]'s base first (pinned below)


# slug -> (expected (model config, module class, loss, optimizer, batch shapes), {function of the module: source
# fragments it must hold}: run's trainer passes `fit` the helpers that `train_step` uses)
HOOKED = {
    "qvg": (_qvg, {"train_model": ["model_fn=_model_fn(c), optimizer_config=_optimizer(c)",
                                   "batch_fn=_batch_fn(c)", "loss_fn=next_frame_loss"],
                   "run": ["train_model(c, workdir)"],
                   "train_step": ["_batch_fn(c)(0)", "model_fn=_model_fn(c)", "loss_fn=next_frame_loss",
                                  "optimizer=_optimizer(c)"]}),
    "toast": (_toast, {"train_dense": ["model_fn=_model_fn(vit_config(c, image_size)), optimizer_config=_optimizer(c)",
                                       "batch_fn=_batch_fn(c, *train, offset=0)", "loss_fn=classification_loss"],
                       "run": ["image_size = train[0].shape[1]", "train_dense(c, train, image_size, workdir)"],
                       "train_step": ["_batch_fn(c, *stand_in, offset=0)(0)", "model_fn=_model_fn(cfg)",
                                      "loss_fn=classification_loss", "optimizer=_optimizer(c)"]}),
    "prim": (_prim, {"train": ["batch_fn = _batch_fn(c, _train_pool(c))", "cfg = vlm_config(c)",
                               "model_fn=_model_fn(cfg), optimizer_config=_optimizer(c), batch_fn=batch_fn",
                               "loss_fn=_loss"],
                     "_train_pool": ["_data(c, c.data.train_pool, seed=1000 + c.seed)"],
                     "train_step": ["_batch_fn(c, _train_pool(c))(0)", "model_fn=_model_fn(cfg)", "loss_fn=_loss",
                                    "optimizer=_optimizer(c)"]}),
    "dem_hec": (_dem_hec, {"train_base": ["_, model_fn, loss_fn = _base_model(c, arch, xtr.shape[1])",
                                          "fit(model_fn=model_fn, optimizer_config=_base_optimizer(c, arch), "
                                          "batch_fn=_base_batch_fn(c, xtr, ytr)", "loss_fn=loss_fn"],
                           "sweep": ["for arch in c.archs:\n        t = time.perf_counter()\n"
                                     "        base = train_base(c, arch, train, workdir)"],
                           "base_train_step": ["cfg, model_fn, loss_fn = _base_model(c, arch, h)",
                                               "_base_batch_fn(c, *stand_in)(0)", "optimizer=_base_optimizer(c, arch)"],
                           "train_step": ["base_train_step(c, c.archs[0])"]}),
}


def _param_shapes(build) -> dict:
    state = nnx.state(nnx.eval_shape(lambda: build(nnx.Rngs(0))), nnx.Param)  # abstract: nothing allocated
    return {jax.tree_util.keystr(k): (v.shape, v.dtype) for k, v in jax.tree_util.tree_leaves_with_path(state)}


def _check_step(step, expected, what):
    model, cls, loss, opt, batch = expected
    assert isinstance(step, aot.TrainStep) and not step.is_lm and step.seq_len is None, what
    assert step.model == model, what
    assert step.optimizer == opt, what
    assert step.loss_fn is loss, what
    got = {k: (shape, np.dtype(dtype)) for k, (shape, dtype) in step.batch_shapes().items()}
    assert got == {k: (shape, np.dtype(dtype)) for k, (shape, dtype) in batch.items()}, what
    assert step.batch_size == next(iter(batch.values()))[0][0], what
    assert _param_shapes(step.model_fn) == _param_shapes(lambda rngs: cls(model, rngs=rngs)), what


def test_these_experiments_are_hooked_to_their_train_step():
    for slug in HOOKED:
        module = importlib.import_module(f"experiments.{slug}")
        assert registry.get(slug).train_step is module.train_step, slug
        assert slug in aot.targets(), slug


@pytest.mark.parametrize("slug", sorted(HOOKED))
def test_every_preset_builds_the_step_run_trains(slug, monkeypatch):
    expected, sources = HOOKED[slug]
    exp = registry.get(slug)
    module = importlib.import_module(f"experiments.{slug}")
    for fn, fragments in sources.items():
        src = inspect.getsource(getattr(module, fn))
        for fragment in fragments:
            assert fragment in src, (slug, fn, fragment)
    for preset in exp.presets:
        c = exp.config(preset)
        if slug == "prim":  # one training pool per preset (seconds at the paper size) for both sides
            pool = module._data(c, c.data.train_pool, seed=1000 + c.seed)
            monkeypatch.setattr(module, "_train_pool", lambda cfg, c=c, pool=pool: pool if cfg == c else None)
        _check_step(exp.train_step(c), expected(module, c), (slug, preset))
        if slug == "dem_hec":  # the other architecture's base step, which run trains next
            for arch in c.archs:
                _check_step(module.base_train_step(c, arch), _dem_hec_arch(module, c, arch), (slug, preset, arch))


def test_the_first_batch_of_the_run_has_the_steps_shapes():
    """The stand-in batches of toast and dem_hec have the shapes of the batches the run draws from its data."""
    for slug, batch_fn in (("toast", lambda m, c, tr: m._batch_fn(c, *tr, offset=0)),
                           ("dem_hec", lambda m, c, tr: m._base_batch_fn(c, *tr))):
        module = importlib.import_module(f"experiments.{slug}")
        c = registry.get(slug).config("smoke")
        train, _ = module._data(c)
        real = aot.TrainStep.from_batch(batch_fn(module, c, train)(0), model=None, model_fn=lambda rngs: None)
        assert real.batch_shapes() == registry.get(slug).train_step(c).batch_shapes(), slug


def test_the_smallest_smoke_step_compiles_for_v5e(compile_smoke_step):
    slug, step, row = compile_smoke_step(HOOKED)
    assert row["model"] == type(step.model).__name__, slug
