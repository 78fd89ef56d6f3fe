"""Dem-HEC: entropy ascent, the repair objective's terms, fine-tuning budgets, evaluation helpers.

Independent references: the closed-form entropy gradient -p (log p + H), the closed-form InfoNCE of
orthonormal views, float64 numpy KL, plain cross-entropy (`classification_loss`) for the objective
with every extra weight 0, and numpy accuracies from the logits.
"""

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from algorithms.robustness import dem_hec as D
from algorithms.training import Checkpointer
from models.cnn import CNN, CNNConfig, classification_loss

CFG = CNNConfig(num_classes=4, in_channels=1, channels=(4,), num_groups=2, hidden_dim=6)
B = 6
# Jitted entry points (eager op-by-op ascent loops are several times slower to run than to compile).
HE = nnx.jit(D.high_entropy_samples, static_argnums=(3,))
LOSS = nnx.jit(D.dem_hec_loss, static_argnums=(2,))
PGD = nnx.jit(D.pgd_attack, static_argnames=("epsilon", "steps", "step_size"))


def make_model(seed=0, head_scale=4.0):
    """A random CNN whose head is scaled up, so its predictions are confident (entropy can rise)."""
    model = CNN(CFG, rngs=nnx.Rngs(seed))
    model.head_w[...] = model.head_w[...] * head_scale
    return model


def make_batch(seed=0, b=B):
    r = np.random.default_rng(seed)
    return {"image": jnp.asarray(r.uniform(0, 1, (b, 6, 6, 1)), jnp.float32),
            "label": jnp.asarray(r.integers(0, CFG.num_classes, b), jnp.int32),
            "seed": jnp.asarray(r.integers(0, 2 ** 31 - 1, b), jnp.uint32)}


@pytest.fixture(scope="module")
def model():
    return make_model()


@pytest.fixture(scope="module")
def batch():
    return make_batch()


def params_of(m):
    return jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(m, nnx.Param)))


def test_entropy_gradient_closed_form():
    z = jax.random.normal(jax.random.key(0), (5, 7)) * 3
    grad = jax.vmap(jax.grad(D.prediction_entropy))(z)
    p = jax.nn.softmax(z)
    h = D.prediction_entropy(z)
    np.testing.assert_allclose(grad, -p * (jnp.log(p) + h[:, None]), atol=1e-5)


def test_high_entropy_samples_stay_in_ball_and_range_and_raise_entropy(model, batch):
    x = batch["image"]
    cfg = D.DemHECConfig(epsilon=0.1, steps=5, random_start=False)
    before = params_of(model)
    x_he = HE(model, x, batch["seed"], cfg)
    assert float(jnp.abs(x_he - x).max()) <= cfg.epsilon + 1e-6
    assert float(x_he.min()) >= 0.0 and float(x_he.max()) <= 1.0
    h0 = D.prediction_entropy(model(x))
    h1 = D.prediction_entropy(model(x_he))
    assert float(h1.mean()) > float(h0.mean()) + 1e-3, (h0, h1)
    assert int((h1 > h0).sum()) >= B - 1  # (almost) every image individually
    # With the random start (default) the ball and range hold as well; parameters are untouched.
    x_rs = HE(model, x, batch["seed"], D.DemHECConfig(epsilon=0.05))
    assert float(jnp.abs(x_rs - x).max()) <= 0.05 + 1e-6 and float(x_rs.min()) >= 0 and float(x_rs.max()) <= 1
    jax.tree.map(np.testing.assert_array_equal, before, params_of(model))
    # Label-free by signature.
    assert not any("label" in p for p in inspect.signature(D.high_entropy_samples).parameters)


def test_feature_entropy_ascent_raises_feature_entropy(model, batch):
    cfg = D.DemHECConfig(epsilon=0.1, steps=4, random_start=False, entropy_kind="feat")
    x_he = HE(model, batch["image"], batch["seed"], cfg)
    f0 = D.feature_entropy(model(batch["image"], return_features=True)[1]).mean()
    f1 = D.feature_entropy(model(x_he, return_features=True)[1]).mean()
    assert float(f1) > float(f0)


def test_feature_entropy_bounds_and_reliance():
    h = jnp.array([[1.0, 1.0, 1.0, 1.0], [0.0, 3.0, 0.0, 0.0], [1.0, 2.0, 3.0, 4.0]])
    fe = D.feature_entropy(h)
    np.testing.assert_allclose(fe[:2], [1.0, 0.0], atol=1e-6)
    q = np.array([1, 2, 3, 4]) / 10
    np.testing.assert_allclose(fe[2], -(q * np.log(q)).sum() / np.log(4), rtol=1e-5)
    w = jnp.array([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0], [1.0, 0.0]])
    share = D.reliance_concentration(h, w, jnp.array([0, 0, 0]), k=1)
    np.testing.assert_allclose(share, [0.25, 1.0, 0.4], atol=1e-6)


def test_pgd_attack_stays_in_ball_and_raises_the_loss(model, batch):
    x, y = batch["image"], batch["label"]
    x_adv = PGD(model, x, y, batch["seed"], epsilon=0.1, steps=4, step_size=0.04)
    assert float(jnp.abs(x_adv - x).max()) <= 0.1 + 1e-6 and float(x_adv.min()) >= 0 and float(x_adv.max()) <= 1
    ce = lambda z: float(classification_loss(model, {"image": z, "label": y})[0])  # noqa: E731
    assert ce(x_adv) > ce(x)


def test_info_nce_closed_form_and_symmetry():
    tau = 0.5
    eye = jnp.eye(4, 6)  # 4 orthonormal rows
    expected = np.log(1 + 3 * np.exp(-1 / tau))  # positive sim 1, negatives 0
    np.testing.assert_allclose(D.info_nce(eye, eye * 3.0, tau), expected, rtol=1e-5)
    a, b = jax.random.normal(jax.random.key(0), (2, 5, 3))
    np.testing.assert_allclose(D.info_nce(a, b, tau), D.info_nce(b, a, tau), rtol=1e-6)
    assert float(D.info_nce(a, a, tau)) < float(D.info_nce(a, b, tau))


def test_distillation_is_zero_for_equal_models_and_matches_float64_kl():
    s = jax.random.normal(jax.random.key(1), (5, 4))
    assert abs(float(D.distillation_loss(s, s, 4.0))) < 1e-6
    t = jax.random.normal(jax.random.key(2), (5, 4)) * 2
    pt = np.exp(np.asarray(t, np.float64) / 4)
    pt /= pt.sum(-1, keepdims=True)
    ps = np.exp(np.asarray(s, np.float64) / 4)
    ps /= ps.sum(-1, keepdims=True)
    np.testing.assert_allclose(D.distillation_loss(s, t, 4.0), 16 * (pt * np.log(pt / ps)).sum(-1).mean(), rtol=1e-5)


def test_objective_with_extra_weights_zero_is_cross_entropy(model, batch):
    cfg = D.DemHECConfig(he_weight=0.0, contrastive_weight=0.0, kd_weight=0.0)
    loss, _ = LOSS(model, batch, cfg)
    ce, _ = classification_loss(model, batch)
    assert float(loss) == pytest.approx(float(ce), abs=1e-6)


def test_kd_term_is_zero_when_student_is_teacher_and_teacher_gets_no_gradient(model, batch):
    cfg = D.DemHECConfig(contrastive_weight=0.0, kd_on="both", steps=1)
    _, metrics = LOSS(model, batch, cfg, teacher=model)
    assert abs(float(metrics["kd"])) < 1e-6
    graphdef, state = nnx.split(make_model(seed=1))

    def loss_of_teacher(teacher_state):
        return D.dem_hec_loss(model, batch, cfg, teacher=nnx.merge(graphdef, teacher_state))[0]

    grads = jax.jit(jax.grad(loss_of_teacher))(state)
    assert all(float(jnp.abs(g).max()) == 0.0 for g in jax.tree.leaves(grads))


def test_each_weight_zero_removes_exactly_its_term(model, batch):
    wrapped = D.DemHECModel(model, CFG.feature_dim, 8, rngs=nnx.Rngs(3))
    teacher = make_model(seed=2)
    full_cfg = D.DemHECConfig(he_weight=0.7, contrastive_weight=0.3, kd_weight=1.5, steps=1)
    full, m = LOSS(wrapped, batch, full_cfg, teacher=teacher)
    terms = {"he_weight": "ce_he", "contrastive_weight": "contrastive", "kd_weight": "kd"}
    total = m["ce_clean"] + sum(getattr(full_cfg, w) * m[t] for w, t in terms.items())
    assert float(full) == pytest.approx(float(total), rel=1e-6)
    for weight, term in terms.items():
        cfg = D.DemHECConfig(**{**dict(he_weight=0.7, contrastive_weight=0.3, kd_weight=1.5, steps=1), weight: 0.0})
        loss, metrics = LOSS(wrapped, batch, cfg, teacher=teacher)
        assert term not in metrics
        assert float(loss) == pytest.approx(float(full - getattr(full_cfg, weight) * m[term]), rel=1e-5, abs=1e-6)


@pytest.fixture(scope="module")
def data():
    r = np.random.default_rng(7)
    images = r.uniform(0, 1, (24, 6, 6, 1)).astype(np.float32)
    labels = r.integers(0, CFG.num_classes, 24).astype(np.int32)
    return images, labels


@pytest.mark.parametrize("method", D.METHODS)
def test_each_method_takes_exactly_n_optimizer_steps(method, model, data):
    before = params_of(model)
    cfg = D.DemHECConfig(steps=1, projection_dim=4)
    out = D.fine_tune(model, *data, method=method, num_steps=3, batch_size=8, config=cfg, log_every=1)
    assert out.steps == 3 and int(out.fit_result.state.step) == 3
    assert [row["step"] for row in out.history] == [1, 2, 3]
    assert isinstance(out.model, CNN)
    jax.tree.map(np.testing.assert_array_equal, before, params_of(model))  # the input model is not modified
    changed = jax.tree.leaves(jax.tree.map(lambda a, b: not np.array_equal(a, b), before, params_of(out.model)))
    assert any(changed)
    if method == "dem_hec":
        assert {"ce_he", "contrastive", "kd"} <= set(out.history[-1])


def test_fine_tune_checkpoints_and_resumes(model, data, tmp_path):
    kwargs = dict(method="dem_hec", num_steps=2, batch_size=8, config=D.DemHECConfig(steps=1, projection_dim=4),
                  workdir=tmp_path, checkpoint_every=1)
    first = D.fine_tune(model, *data, **kwargs)
    ckpt = Checkpointer(tmp_path / "ckpt")
    assert ckpt.latest_step() == 2
    ckpt.close()
    again = D.fine_tune(model, *data, **kwargs)
    assert again.fit_result.resumed_from == 2
    jax.tree.map(np.testing.assert_array_equal, params_of(first.model), params_of(again.model))


def test_evaluation_helpers(model, data):
    images, labels = data
    logits = np.asarray(model(jnp.asarray(images)))
    np.testing.assert_allclose(D.predict_logits(model, images, batch_size=5), logits, atol=1e-5)
    assert D.accuracy(model, images, labels, batch_size=7) == float((logits.argmax(-1) == labels).mean())
    key = jax.random.key(0)
    table = D.corruption_accuracy(model, images, labels, key=key, names=("contrast", "gaussian_noise"),
                                  severities=(0, 5))
    assert set(table) == {("contrast", 0), ("contrast", 5), ("gaussian_noise", 0), ("gaussian_noise", 5)}
    clean = D.accuracy(model, images, labels)
    assert table[("contrast", 0)] == table[("gaussian_noise", 0)] == clean
    assert D.mean_corruption_accuracy(table) == pytest.approx(np.mean(list(table.values())))
    assert D.mean_corruption_accuracy(table, ["contrast"]) == pytest.approx(
        (table[("contrast", 0)] + table[("contrast", 5)]) / 2)
    ent = D.entropy_by_severity(model, images, key=key, names=("gaussian_noise",), severities=(0, 3))
    assert ent.shape == (1, 2)
    np.testing.assert_allclose(ent[0, 0], D.prediction_entropy(jnp.asarray(logits)).mean(), rtol=1e-5)


@pytest.mark.parametrize("call, exc, match", [
    (lambda m, b, d: D.fine_tune(m, *d, method="mixup", num_steps=1), ValueError, r"method must be one of"),
    (lambda m, b, d: D.fine_tune(m, *d, method="clean", num_steps=0), ValueError, r"num_steps must be >= 1; got 0"),
    (lambda m, b, d: D.fine_tune(m, *d, method="clean", num_steps=1, batch_size=25), ValueError,
     r"batch_size must be in \[1, n=24\]; got 25"),
    (lambda m, b, d: D.fine_tune(m, d[0] * 2, d[1], method="clean", num_steps=1), ValueError,
     r"images must have values in \[0, 1\]"),
    (lambda m, b, d: D.fine_tune(m, d[0], d[1].astype(np.float32), method="clean", num_steps=1), TypeError,
     r"labels must be an integer array"),
    (lambda m, b, d: D.dem_hec_loss(m, {"image": b["image"], "label": b["label"]}, teacher=m), ValueError,
     r"missing \['seed'\]"),
    (lambda m, b, d: D.dem_hec_loss(m, b, D.DemHECConfig(kd_weight=0.0), teacher=m), ValueError,
     r"contrastive_weight > 0 needs a DemHECModel"),
    (lambda m, b, d: D.dem_hec_loss(m, b, D.DemHECConfig(contrastive_weight=0.0)), ValueError,
     r"kd_weight > 0 needs the teacher snapshot"),
    (lambda m, b, d: D.DemHECConfig(epsilon=-0.1), ValueError, r"epsilon must be >= 0; got -0.1"),
    (lambda m, b, d: D.DemHECConfig(steps=1.5), TypeError, r"steps must be an int; got 1.5"),
    (lambda m, b, d: D.DemHECConfig(entropy_kind="logit"), ValueError, r"entropy_kind must be one of"),
    (lambda m, b, d: D.DemHECConfig(kd_on="teacher"), ValueError, r"kd_on must be one of"),
    (lambda m, b, d: D.DemHECConfig(kd_temperature=0.0), ValueError, r"kd_temperature must be > 0; got 0.0"),
    (lambda m, b, d: D.DemHECConfig(he_weight=float("nan")), ValueError, r"he_weight must be finite"),
    (lambda m, b, d: D.BaselineConfig(noise_sigma_max=-1.0), ValueError, r"noise_sigma_max must be >= 0"),
    (lambda m, b, d: D.high_entropy_samples(m, b["image"][0], b["seed"]), ValueError,
     r"images must have shape \[b, H, W, c\]"),
    (lambda m, b, d: D.corruption_accuracy(m, *d, key=jax.random.key(0), names=("snow",)), ValueError,
     r"names must be keys of CORRUPTIONS"),
], ids=["method", "steps", "batch_size", "range", "float-labels", "no-seed", "contrastive-plain", "kd-no-teacher",
        "epsilon", "steps-float", "entropy_kind", "kd_on", "kd_temperature", "nan-weight", "sigma", "image-shape",
        "corruption-name"])
def test_bad_input(call, exc, match, model, batch, data):
    with pytest.raises(exc, match=match):
        call(model, batch, data)
