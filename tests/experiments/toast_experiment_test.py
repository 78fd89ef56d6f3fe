"""The toast experiment's own logic: equal-MACs matching of the baselines, evaluation batching, paired SEs,
and the random / static channel choices of the TCS study (tiny models, no training)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from algorithms.compression import toast
from experiments import toast as exp
from models.vit import ViT, ViTConfig


def _cfg(**kw) -> ViTConfig:
    base = dict(image_size=16, patch_size=4, num_classes=10, d_model=16, num_heads=2, d_ff=32, num_layers=3)
    return ViTConfig(**{**base, **kw})


@pytest.mark.parametrize("n,cap", [(450, 128), (97, 128), (12, 5), (1, 4), (360, 100)])
def test_eval_batch_size_is_the_largest_divisor_below_cap(n, cap):
    b = exp.eval_batch_size(n, cap)
    assert n % b == 0 and b <= cap
    assert all(n % d for d in range(b + 1, min(n, cap) + 1))  # brute force: nothing larger divides


def test_paired_matches_hand_computation():
    a = np.array([1, 1, 0, 1, 0, 1])
    b = np.array([1, 0, 0, 0, 1, 1])
    d = np.array([0, 1, 0, 1, -1, 0], float)
    mean, se = exp.paired(a, b)
    assert mean == pytest.approx(d.mean())
    assert se == pytest.approx(math.sqrt(((d - d.mean()) ** 2).sum() / 5) / math.sqrt(6))
    assert exp.paired(a, a) == (0.0, 0.0)


def test_token_plan_is_the_latest_block_within_tolerance():
    cfg = _cfg(num_layers=4)
    dense = toast.count_macs(cfg).total
    for frac in (0.6, 0.75, 0.9):
        target = int(frac * dense)
        layer, plan = exp.choose_token_plan(cfg, target, 0.02)
        err = lambda p: abs(toast.count_macs(cfg, tokens_after=p).total - target) / target  # noqa: E731
        assert plan[layer] is not None and all(p is None for i, p in enumerate(plan) if i != layer)
        # Brute force over every later block and token count: none is within the tolerance.
        later = [(l, k) for l in range(layer + 1, cfg.num_layers) for k in range(2, cfg.num_tokens + 1)]
        within = [err(tuple(k if i == l else None for i in range(cfg.num_layers))) <= 0.02 for l, k in later]
        if err(plan) <= 0.02:
            assert not any(within)


def test_baselines_match_toast_macs():
    """Magnitude / random pruning at ffn_widths_matching cost what ToaSt (SCWP + TCS) costs, within one
    FFN unit of rounding per layer; the TCS study's four channel choices keep equal counts."""
    cfg = _cfg(d_model=32, num_heads=4, d_ff=128, num_layers=4)
    model = ViT(cfg, rngs=nnx.Rngs(0))
    c = exp.Config(model=exp.ModelSection(d_model=32, num_heads=4, d_ff=128, num_layers=4),
                   tcs=exp.TCSSection(last_blocks=2))
    tcs = exp._tcs(c, cfg.num_layers, 0.9, exp._last_blocks(c))
    pruned, _ = toast.scwp(model, 75.0)
    target = toast.count_macs(pruned.config, tcs=tcs).total
    widths = toast.ffn_widths_matching(cfg, tcs)
    mag = toast.magnitude_prune(model, 75.0, ffn_widths=widths)
    rnd = toast.random_prune(model, jax.random.key(1), 75.0, ffn_widths=widths)
    per_unit = 2 * cfg.num_tokens * cfg.d_model  # MACs of one FFN hidden unit
    for m in (mag, rnd):
        assert abs(toast.count_macs(m.config).total - target) <= per_unit * cfg.num_layers
        assert m.config.qk_dims == pruned.config.qk_dims and m.config.v_dims == pruned.config.v_dims
    # Random and static fc2 masks keep exactly TCS's channel counts.
    rng = np.random.default_rng(0)
    masks = exp.random_channel_masks(rng, {2: 128, 3: 128}, 0.9)
    assert all(int(np.asarray(m).sum()) == toast.kept_channels(128, 0.9) for m in masks.values())
    x = np.random.default_rng(1).random((8, 16, 16, 1)).astype(np.float32)
    static = exp.static_channel_masks(model, x, (2, 3), 0.9, c)
    assert all(int(np.asarray(m).sum()) == toast.kept_channels(128, 0.9) for m in static.values())


def test_static_masks_pick_the_top_tcs_importance_and_ratio_zero_keeps_all():
    cfg = _cfg()
    model = ViT(cfg, rngs=nnx.Rngs(3))
    c = exp.Config(model=exp.ModelSection(d_model=16, num_heads=2, d_ff=32, num_layers=3),
                   tcs=exp.TCSSection(last_blocks=1))
    x = np.random.default_rng(2).random((6, 16, 16, 1)).astype(np.float32)
    assert np.all(np.asarray(exp.static_channel_masks(model, x, (2,), 0.0, c)[2]) == 1.0)
    # Independent recomputation: block 2's FFN hidden activations from the intermediates.
    out = model(jnp.asarray(x), return_intermediates=True)
    h_in = out.intermediates["residuals"][2]
    blk = model.layers[2]
    a, _, row = blk.attn(blk.norm1(h_in), attn_row="cls")
    r = h_in + a
    hidden = jax.nn.gelu(blk.norm2(r) @ blk.w1[...] + blk.b1[...], approximate=False)
    hid = np.abs(np.asarray(hidden, np.float64))
    rw = np.asarray(row, np.float64).mean(0)[1:]
    P = hid.shape[1] - 1
    imp = 2.0 * hid[:, 0].mean(0) / (1 + P) + (hid[:, 1:] * rw[None, :, None]).mean((0, 1)) * P / (1 + P)
    keep = toast.kept_channels(32, 0.5)
    got = np.flatnonzero(np.asarray(exp.static_channel_masks(model, x, (2,), 0.5, c)[2]))
    assert set(got) == set(np.argsort(-imp, kind="stable")[:keep])


def test_config_rejects_bad_fields():
    with pytest.raises(ValueError, match=r"toast\.sparsity must be one of scwp\.sparsities"):
        exp.Config(toast=exp.ToaStSection(sparsity=60.0))
    with pytest.raises(ValueError, match=r"tcs\.last_blocks must lie in \[1, model\.num_layers=4\)"):
        exp.Config(tcs=exp.TCSSection(last_blocks=4))
    with pytest.raises(ValueError, match="couplings"):
        exp.Config(scwp=exp.SCWPSection(couplings=("coupled",)))


def test_data_shapes_and_digits():
    shapes = exp.Config(data=exp.DataSection(dataset="shapes", shapes_train=12, shapes_test=6))
    (xtr, ytr), (xte, yte) = exp._data(shapes)
    assert xtr.shape == (12, 32, 32, 1) and xte.shape == (6, 32, 32, 1)
    assert exp.vit_config(exp.Config(data=exp.DataSection(dataset="shapes")), 32).num_classes == 6
    (xtr, ytr), _ = exp._data(exp.Config())
    assert xtr.shape[1:] == (16, 16, 1) and exp.vit_config(exp.Config(), 16).num_classes == 10
    # Nearest-neighbour upsampling: every 2x2 block repeats one digit pixel.
    assert np.array_equal(xtr[:, ::2, ::2], xtr[:, 1::2, 1::2])
    batch = exp._batch_fn(exp.Config(train=exp.TrainSection(batch_size=5)), xtr, ytr, offset=0)
    b1, b2 = batch(3), batch(3)
    assert b1["image"].shape == (5, 16, 16, 1) and np.array_equal(b1["image"], b2["image"])


def test_cifar10_config_and_missing_tfds(monkeypatch):
    import sys

    c = exp.EXPERIMENT.config("paper")
    assert c.data.dataset == "cifar10" and exp.vit_config(c, 32).channels == 3
    with pytest.raises(ValueError, match="dataset must be one of"):
        exp.Config(data=exp.DataSection(dataset="cifar100"))
    with pytest.raises(ValueError, match="cifar_train must be >= 1; got 0"):
        exp.Config(data=exp.DataSection(cifar_train=0))
    # digits checkpoints keep their fingerprint; CIFAR-10's sizes join it on that dataset only
    assert "cifar_train" not in exp._fingerprint(exp.Config(), *exp._TRAIN_FIELDS)
    cifar = exp.Config(data=exp.DataSection(dataset="cifar10", cifar_train=500))
    assert '"cifar_train": 500' in exp._fingerprint(cifar, *exp._TRAIN_FIELDS)
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)  # makes `import tensorflow_datasets` fail
    with pytest.raises(ImportError, match=r"tensorflow-datasets.*\[data\]"):
        exp._data(c)


def test_cifar10_run_on_mock_data(mocked_tfds, tmp_path):
    """The paper preset's data path end to end at smoke size on TFDS's mock CIFAR-10 (RGB 32x32)."""
    import dataclasses

    smoke = exp.EXPERIMENT.config("smoke")
    c = dataclasses.replace(smoke, data=exp.DataSection(dataset="cifar10", data_dir=str(tmp_path / "tfds")),
                            train=dataclasses.replace(smoke.train, batch_size=4),
                            tcs=dataclasses.replace(smoke.tcs, calibration_size=4))
    (xtr, ytr), (xte, yte) = exp._data(c)
    assert xtr.shape == xte.shape == (6, 32, 32, 3) and xtr.dtype == np.float32 and xtr.max() <= 1.0
    out = exp.run(c, tmp_path / "run")
    assert out["metrics"]["dataset"] == "cifar10" and out["metrics"]["checks"]
    assert out["metrics"]["dense_macs"] == toast.count_macs(exp.vit_config(c, 32)).total  # 3 input channels


@pytest.mark.parametrize("kind", ["plain", "tcs", "tokens"])
def test_finetune_without_workdir_equals_fit(kind):
    """`toast.finetune` without a workdir (the step cached per structure, as every fine-tuning of the
    experiment runs) gives `fit`'s parameters and history: same initial state, step and data stream."""
    import functools

    from algorithms.training import OptimizerConfig, fit
    from models.vit import classification_loss

    cfg = _cfg(num_layers=2)
    model = ViT(cfg, rngs=nnx.Rngs(0))
    opt = OptimizerConfig(learning_rate=1e-3, warmup_steps=1, total_steps=3, weight_decay=0.05)
    rng = np.random.default_rng(0)
    xs, ys = rng.random((6, 4, 16, 16, 1)).astype(np.float32), rng.integers(0, 10, (6, 4))
    batch_fn = lambda i: {"image": xs[i], "label": ys[i]}  # noqa: E731
    tcs = toast.TCSConfig.uniform(2, fc2=0.5, layers=(1,), sample_ratio=0.5) if kind == "tcs" else None
    plan = (None, 8) if kind == "tokens" else None
    tuned, res = toast.finetune(model, batch_fn=batch_fn, num_steps=3, optimizer_config=opt, tcs=tcs,
                                tokens_after=plan, log_every=1)
    if kind == "tcs":
        ref_batch, loss = (lambda i: dict(batch_fn(i), tcs_seed=np.uint32(i))), toast.tcs_loss(tcs)
    else:
        ref_batch = batch_fn
        loss = (classification_loss if plan is None else
                functools.partial(classification_loss, token_hook=toast.token_pruning_hook(plan)))
    graphdef, state = nnx.split(model)
    ref = fit(model_fn=lambda rngs: nnx.merge(graphdef, state), optimizer_config=opt, batch_fn=ref_batch,
              num_steps=3, loss_fn=loss, log_every=1, progress=False)
    for a, b in zip(jax.tree.leaves(nnx.state(tuned)), jax.tree.leaves(nnx.state(ref.model()))):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)
    assert [r["step"] for r in res.history] == [r["step"] for r in ref.history] == [1, 2, 3]
    np.testing.assert_allclose([r["loss"] for r in res.history], [r["loss"] for r in ref.history], rtol=1e-6)
    # The caller's model is untouched (the cached step donates its own copy of the state).
    for a, b in zip(jax.tree.leaves(nnx.state(model)), jax.tree.leaves(state)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
