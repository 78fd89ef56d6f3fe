"""Dem-HEC: entropy-guided fine-tuning ("repair") of a trained classifier for natural-corruption robustness.

Each step makes label-free high-entropy samples `x_he` by sign-gradient entropy ascent (random start) in an L-inf
ball of radius eps around the clean batch, then minimizes CE on clean and `x_he` + a symmetric instance-level
InfoNCE between projected `x_he` and clean embeddings + KD from a frozen snapshot of the starting model.
A term whose weight is 0 is not computed, so every ablation removes its term exactly.

  Config / model: `DemHECConfig`, `BaselineConfig`, `DemHECModel` (adds the 2-layer projection head, dropped after
                  training), `default_forward` (`model(x, return_features=True)`; pass `forward=` otherwise).
  Terms, samples: `prediction_entropy`, `feature_entropy`, `info_nce`, `distillation_loss`, `reliance_concentration`,
                  `high_entropy_samples`, `pgd_attack`.
  Losses:         `dem_hec_loss` / `make_dem_hec_loss`, `gaussian_noise_loss`, `pgd_loss`, `make_loss` (`METHODS`).
  Training:       `fine_tune` -> `FineTuneResult` (through `algorithms.training.fit`; per-image seeds in
                  `batch["seed"]` make a step a deterministic function of its data position).
  Evaluation:     `predict_logits`, `accuracy`, `corruption_accuracy`, `mean_corruption_accuracy`,
                  `entropy_by_severity`.
Baselines (clean CE, Gaussian noise, Madry PGD with the ascent's eps, K, alpha) share steps, batches and optimizer.
Models must hold only `nnx.Param` state (no BatchNorm statistics), so attacks and evaluations cannot change them.

Dimension legend: `b` images, `H`/`W`/`c` height, width, channels, `v` classes, `f` feature width, `p` projection width.

Spec: papers/specs/vision_weights_envs.md section 1 (method and defaults in 1(b), ambiguities in 1(g)).

INFERRED (the paper body and code are unavailable; everything beyond the two abstracts is [INFER]):
  * the objective above and its defaults (spec 1(b): "to be tuned; none come from the paper");
  * `entropy_kind="feat"` (normalized feature entropy, ambiguity 1) and `kd_on` clean / he / both (ambiguity 4);
  * the Gaussian baseline's per-image `sigma ~ U(0, sigma_max)` (the spec names the baseline only);
  * not built: L2 and "parametric" perturbation regions, EMA teacher, SupCon variant (ambiguities 2, 3, 5).

References:
  Dem-HEC (ICML 2026; OpenReview forum CVqYCYpq75), no arXiv id available.
  Madry et al., "Towards Deep Learning Models Resistant to Adversarial Attacks", arXiv:1706.06083, 2017.
  Hinton, Vinyals, Dean, "Distilling the Knowledge in a Neural Network", arXiv:1503.02531, 2015.
  van den Oord, Li, Vinyals, "Representation Learning with Contrastive Predictive Coding" (InfoNCE),
  arXiv:1807.03748, 2018.
  Hendrycks & Dietterich, "Benchmarking Neural Network Robustness to Common Corruptions and
  Perturbations", arXiv:1903.12261, 2019.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import zlib
from typing import Callable, Mapping, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from algorithms.training import FitResult, OptimizerConfig, fit
from models.cnn import classification_loss
from primitives import corruptions as corruptions_lib
from primitives.validation import check_finite, check_int, check_integer_dtype

__all__ = [
    "DemHECConfig",
    "BaselineConfig",
    "DemHECModel",
    "FineTuneResult",
    "METHODS",
    "default_forward",
    "prediction_entropy",
    "feature_entropy",
    "reliance_concentration",
    "info_nce",
    "distillation_loss",
    "high_entropy_samples",
    "pgd_attack",
    "dem_hec_loss",
    "make_dem_hec_loss",
    "gaussian_noise_loss",
    "pgd_loss",
    "make_loss",
    "fine_tune",
    "predict_logits",
    "accuracy",
    "corruption_accuracy",
    "mean_corruption_accuracy",
    "entropy_by_severity",
]

ENTROPY_KINDS = ("pred", "feat")
KD_ON = ("clean", "he", "both")
METHODS = ("dem_hec", "clean", "gaussian_noise", "pgd")

Forward = Callable[[nnx.Module, jax.Array], tuple[jax.Array, jax.Array]]
Batch = Mapping[str, jax.Array]


@dataclasses.dataclass(frozen=True, kw_only=True)
class DemHECConfig:
    """Dem-HEC hyper-parameters (spec defaults); validated on construction.

    Attributes:
      epsilon: L-inf radius of the entropy ascent (images in [0, 1]).
      steps: ascent steps K >= 1 (0 = the random start only, or x itself without it).
      step_size: alpha; None = 2.5 * epsilon / max(steps, 1).
      entropy_temperature: tau_H of the ascended prediction entropy.
      entropy_kind: "pred" (prediction entropy) or "feat" (normalised feature entropy).
      random_start: start from delta ~ U(-eps, eps) (else 0).
      he_weight: lambda_he, weight of CE on the high-entropy samples.
      contrastive_weight: lambda_con, weight of InfoNCE between high-entropy and clean embeddings.
      contrastive_temperature: tau_c.
      kd_weight: lambda_kd, weight of distillation from the teacher snapshot.
      kd_temperature: tau_kd.
      kd_on: "clean", "he" or "both": which inputs the teacher and student are compared on.
      projection_dim: p, output width of the contrastive projection head.
    """

    epsilon: float = 8.0 / 255.0
    steps: int = 3
    step_size: float | None = None
    entropy_temperature: float = 1.0
    entropy_kind: str = "pred"
    random_start: bool = True
    he_weight: float = 1.0
    contrastive_weight: float = 0.5
    contrastive_temperature: float = 0.1
    kd_weight: float = 1.0
    kd_temperature: float = 4.0
    kd_on: str = "clean"
    projection_dim: int = 128

    def __post_init__(self):
        for name in ("epsilon", "entropy_temperature", "he_weight", "contrastive_weight", "contrastive_temperature",
                     "kd_weight", "kd_temperature"):
            check_finite(name, getattr(self, name))
        for name in ("steps", "projection_dim"):
            check_int(name, getattr(self, name))
        if self.step_size is not None:
            check_finite("step_size", self.step_size)
            if self.step_size <= 0:
                raise ValueError(f"step_size must be > 0 (or None = 2.5 eps / steps); got {self.step_size}")
        if self.epsilon < 0:
            raise ValueError(f"epsilon must be >= 0; got {self.epsilon}")
        if self.steps < 0:
            raise ValueError(f"steps must be >= 0; got {self.steps}")
        if self.projection_dim < 1:
            raise ValueError(f"projection_dim must be >= 1; got {self.projection_dim}")
        for name in ("entropy_temperature", "contrastive_temperature", "kd_temperature"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0; got {getattr(self, name)}")
        for name in ("he_weight", "contrastive_weight", "kd_weight"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0 (0 removes the term); got {getattr(self, name)}")
        if self.entropy_kind not in ENTROPY_KINDS:
            raise ValueError(f"entropy_kind must be one of {ENTROPY_KINDS}; got {self.entropy_kind!r}")
        if self.kd_on not in KD_ON:
            raise ValueError(f"kd_on must be one of {KD_ON}; got {self.kd_on!r}")

    @property
    def alpha(self) -> float:
        """The ascent step size (step_size, or 2.5 eps / K)."""
        return self.step_size if self.step_size is not None else 2.5 * self.epsilon / max(self.steps, 1)


@dataclasses.dataclass(frozen=True, kw_only=True)
class BaselineConfig:
    """Baseline hyper-parameters; validated on construction.

    Attributes:
      noise_sigma_max: Gaussian augmentation draws sigma_i ~ U(0, noise_sigma_max) per image
        (0.1 = the largest sigma of the gaussian_noise corruption).
      noise_clean_weight: weight of the clean CE in the Gaussian-augmentation loss.
      pgd_epsilon, pgd_steps, pgd_step_size: PGD radius, steps and step size; None = Dem-HEC's
        epsilon, steps and alpha (the spec's "same eps").
      pgd_clean_weight: weight of the clean CE in the PGD loss (0 = Madry's objective).
    """

    noise_sigma_max: float = 0.1
    noise_clean_weight: float = 1.0
    pgd_epsilon: float | None = None
    pgd_steps: int | None = None
    pgd_step_size: float | None = None
    pgd_clean_weight: float = 0.0

    def __post_init__(self):
        for name in ("noise_sigma_max", "noise_clean_weight", "pgd_clean_weight", "pgd_epsilon", "pgd_step_size"):
            value = getattr(self, name)
            if value is not None:
                check_finite(name, value)
                if value < 0:
                    raise ValueError(f"{name} must be >= 0; got {value}")
        if self.pgd_steps is not None and check_int("pgd_steps", self.pgd_steps) < 0:
            raise ValueError(f"pgd_steps must be >= 0; got {self.pgd_steps}")

    def pgd(self, config: DemHECConfig) -> tuple[float, int, float]:
        """(epsilon, steps, step size) of the PGD baseline, defaulting to `config`'s."""
        eps = config.epsilon if self.pgd_epsilon is None else self.pgd_epsilon
        steps = config.steps if self.pgd_steps is None else self.pgd_steps
        alpha = self.pgd_step_size if self.pgd_step_size is not None else 2.5 * eps / max(steps, 1)
        return eps, steps, alpha


# ------------------------------------------------------------------------------------ model pieces


def default_forward(model: nnx.Module, images: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``model(images, return_features=True) -> (logits [b, v], features [b, f])`` (e.g. `models.cnn.CNN`)."""
    return model(images, return_features=True)


def _logits(model: nnx.Module, images: jax.Array) -> jax.Array:
    out = model(images)
    return out[0] if isinstance(out, tuple) else out


class DemHECModel(nnx.Module):
    """A classifier plus the contrastive projection head (2-layer MLP f -> f -> p), trained together.

    Calling it gives the classifier's logits, so it is itself a classifier; after fine-tuning keep
    `classifier` and discard `projection`.

    Args:
      classifier: the model being repaired.
      feature_dim: f, the width of the classifier's features.
      projection_dim: p.
      rngs: NNX rngs for the projection head.
    """

    def __init__(self, classifier: nnx.Module, feature_dim: int, projection_dim: int, *, rngs: nnx.Rngs):
        f, p = check_int("feature_dim", feature_dim), check_int("projection_dim", projection_dim)
        if f < 1 or p < 1:
            raise ValueError(f"feature_dim and projection_dim must be >= 1; got {f}, {p}")
        self.classifier = classifier
        init = jax.nn.initializers.he_normal()
        self.proj_w1 = nnx.Param(init(rngs.params(), (f, f), jnp.float32), out_sharding=(None, "mlp"),
                                 eager_sharding=False)
        self.proj_b1 = nnx.Param(jnp.zeros((f,), jnp.float32), out_sharding=("mlp",), eager_sharding=False)
        self.proj_w2 = nnx.Param(init(rngs.params(), (f, p), jnp.float32), out_sharding=("mlp", None),
                                 eager_sharding=False)
        self.proj_b2 = nnx.Param(jnp.zeros((p,), jnp.float32), out_sharding=(None,), eager_sharding=False)

    def projection(self, features: jax.Array) -> jax.Array:
        """The projection [b, p] of features [b, f] (not normalised)."""
        hidden = jax.nn.relu(features @ self.proj_w1[...] + self.proj_b1[...])
        return hidden @ self.proj_w2[...] + self.proj_b2[...]

    def __call__(self, images: jax.Array, **kwargs):
        return self.classifier(images, **kwargs)


# ------------------------------------------------------------------------------------ losses and diagnostics


def prediction_entropy(logits: jax.Array, temperature: float = 1.0) -> jax.Array:
    """H(softmax(logits / temperature)) [...] in nats for logits [..., v].

    Its gradient with respect to the (scaled) logits is ``-p * (log p + H)``.

    Examples:
      >>> import jax.numpy as jnp
      >>> round(float(prediction_entropy(jnp.zeros((4,)))), 6) == round(float(jnp.log(4.0)), 6)
      True
    """
    logp = jax.nn.log_softmax(logits.astype(jnp.float32) / temperature, -1)
    return -(jnp.exp(logp) * logp).sum(-1)


def feature_entropy(features: jax.Array, eps: float = 1e-12) -> jax.Array:
    """Normalised entropy of a non-negative embedding: q = h / sum h, -sum q log q / log f, in [0, 1].

    1 for a uniform h, 0 for a one-hot h; an all-zero row gives 0. The spec's "feature-space
    entropy" diagnostic [INFER].

    Args:
      features: [..., f] with f >= 2 and entries >= 0 (post-ReLU).
      eps: guards the division and the log.

    Returns:
      [...] in [0, 1].
    """
    f = features.shape[-1]
    if f < 2:
        raise ValueError(f"features must have width f >= 2; got shape {features.shape}")
    h = jnp.maximum(features.astype(jnp.float32), 0.0)
    q = h / jnp.maximum(h.sum(-1, keepdims=True), eps)
    return -jnp.where(q > 0, q * jnp.log(jnp.maximum(q, eps)), 0.0).sum(-1) / math.log(f)


def reliance_concentration(features: jax.Array, head_weights: jax.Array, predictions: jax.Array, k: int) -> jax.Array:
    """Top-k share of the predicted class's evidence: sum_top-k |h_i W_{i,y}| / sum_i |h_i W_{i,y}|.

    Args:
      features: h [b, f].
      head_weights: W [f, v], the linear head.
      predictions: y [b] int, usually the argmax prediction.
      k: how many features, 1 <= k <= f.

    Returns:
      [b] in [0, 1] (1 when k = f).
    """
    k = check_int("k", k)
    if not 1 <= k <= features.shape[-1]:
        raise ValueError(f"k must be in [1, f={features.shape[-1]}]; got {k}")
    contrib = jnp.abs(features * head_weights[:, predictions].T)  # [b, f]
    top = jax.lax.top_k(contrib, k)[0].sum(-1)
    return top / jnp.maximum(contrib.sum(-1), 1e-12)


def info_nce(z_a: jax.Array, z_b: jax.Array, temperature: float, *, symmetric: bool = True) -> jax.Array:
    """Instance InfoNCE between two views [b, p]: row i's positive is row i of the other view.

    l_i = -log exp(a_i . b_i / t) / sum_j exp(a_i . b_j / t) on L2-normalised rows, averaged over i;
    `symmetric` averages the a -> b and b -> a directions.

    Returns:
      Scalar loss.
    """
    if z_a.shape != z_b.shape or z_a.ndim != 2:
        raise ValueError(f"z_a and z_b must both be [b, p]; got {z_a.shape} and {z_b.shape}")
    a = z_a / jnp.maximum(jnp.linalg.norm(z_a, axis=-1, keepdims=True), 1e-12)
    b = z_b / jnp.maximum(jnp.linalg.norm(z_b, axis=-1, keepdims=True), 1e-12)
    sim = a @ b.T / temperature
    labels = jnp.arange(a.shape[0])
    forward = optax.softmax_cross_entropy_with_integer_labels(sim, labels).mean()
    if not symmetric:
        return forward
    return 0.5 * (forward + optax.softmax_cross_entropy_with_integer_labels(sim.T, labels).mean())


def distillation_loss(student_logits: jax.Array, teacher_logits: jax.Array, temperature: float) -> jax.Array:
    """tau^2 * mean_i KL(softmax(teacher_i / tau) || softmax(student_i / tau)); the teacher gets no gradient.

    Zero when student == teacher.
    """
    t = jax.lax.stop_gradient(teacher_logits.astype(jnp.float32)) / temperature
    s = student_logits.astype(jnp.float32) / temperature
    log_pt, log_ps = jax.nn.log_softmax(t, -1), jax.nn.log_softmax(s, -1)
    kl = (jnp.exp(log_pt) * (log_pt - log_ps)).sum(-1)
    return temperature ** 2 * kl.mean()


# ------------------------------------------------------------------------------------ perturbations


def _keys_from_seeds(seeds: jax.Array) -> jax.Array:
    check_integer_dtype("seeds", seeds)
    return jax.vmap(jax.random.key)(jnp.asarray(seeds).astype(jnp.uint32))


def _check_images(name: str, images) -> jax.Array:
    images = jnp.asarray(images)
    if images.ndim != 4:
        raise ValueError(f"{name} must have shape [b, H, W, c]; got {images.shape}")
    if not jnp.issubdtype(images.dtype, jnp.floating):
        raise TypeError(f"{name} must be a float array in [0, 1]; got dtype {images.dtype}")
    return images.astype(jnp.float32)


def _linf_ascent(objective: Callable[[jax.Array], jax.Array], images: jax.Array, keys: jax.Array, *,
                 epsilon: float, steps: int, step_size: float, random_start: bool) -> jax.Array:
    """Projected sign-gradient ascent of `objective(x) -> scalar` in the L-inf ball and [0, 1]."""
    if random_start:
        delta = jax.vmap(lambda k: jax.random.uniform(k, images.shape[1:], minval=-epsilon, maxval=epsilon))(keys)
    else:
        delta = jnp.zeros_like(images)
    delta = jnp.clip(images + delta, 0.0, 1.0) - images
    grad = jax.grad(lambda d: objective(images + d))
    for _ in range(steps):
        delta = jnp.clip(delta + step_size * jnp.sign(grad(delta)), -epsilon, epsilon)
        delta = jnp.clip(images + delta, 0.0, 1.0) - images
    return jax.lax.stop_gradient(images + delta)


def high_entropy_samples(model: nnx.Module, images: jax.Array, seeds: jax.Array, config: DemHECConfig = DemHECConfig(),
                         *, forward: Forward | None = None) -> jax.Array:
    """Label-free high-entropy samples: entropy ascent in the L-inf ball of radius `config.epsilon`.

    Maximises sum_i H(x_i + delta_i) by `config.steps` projected sign-gradient steps of size
    `config.alpha` (see the module docstring); every sample stays within eps of its image and in
    [0, 1]. The model's parameters are not changed and receive no gradient through the result.

    Args:
      model: classifier (images -> logits); with ``entropy_kind="feat"`` `forward(model, x)` must give
        (logits, features >= 0).
      images: x [b, H, W, c] in [0, 1].
      seeds: [b] integer per-image seeds of the random start.
      config: `DemHECConfig` (epsilon, steps, alpha, entropy_temperature, entropy_kind, random_start).
      forward: (model, images) -> (logits, features); default `default_forward`.

    Returns:
      x_he [b, H, W, c].
    """
    images = _check_images("images", images)
    keys = _keys_from_seeds(seeds)
    if config.entropy_kind == "pred":
        objective = lambda x: prediction_entropy(_logits(model, x), config.entropy_temperature).sum()  # noqa: E731
    else:
        fwd = forward or default_forward
        objective = lambda x: feature_entropy(fwd(model, x)[1]).sum()  # noqa: E731
    return _linf_ascent(objective, images, keys, epsilon=config.epsilon, steps=config.steps,
                        step_size=config.alpha, random_start=config.random_start)


def pgd_attack(model: nnx.Module, images: jax.Array, labels: jax.Array, seeds: jax.Array, *, epsilon: float,
               steps: int, step_size: float, random_start: bool = True) -> jax.Array:
    """Label-based L-inf PGD (Madry et al.): sign-gradient ascent of the cross-entropy, projected.

    Args:
      model: classifier (images -> logits).
      images: [b, H, W, c] in [0, 1].
      labels: [b] int.
      seeds: [b] integer per-image seeds of the random start.
      epsilon, steps, step_size: radius, steps, step.
      random_start: start at U(-eps, eps).

    Returns:
      x_adv [b, H, W, c] within eps of `images` and in [0, 1].
    """
    images = _check_images("images", images)
    check_integer_dtype("labels", labels)
    objective = lambda x: optax.softmax_cross_entropy_with_integer_labels(_logits(model, x), labels).sum()  # noqa: E731
    return _linf_ascent(objective, images, _keys_from_seeds(seeds), epsilon=epsilon, steps=steps,
                        step_size=step_size, random_start=random_start)


# ------------------------------------------------------------------------------------ objectives


def _check_batch(batch: Batch, *, needs_seed: bool) -> None:
    keys = ("image", "label", "seed") if needs_seed else ("image", "label")
    missing = [k for k in keys if k not in batch]
    if missing:
        raise ValueError(f"batch must have the keys {list(keys)}; missing {missing}, got keys {sorted(batch)}")
    check_integer_dtype('batch["label"]', batch["label"])
    if needs_seed:
        check_integer_dtype('batch["seed"]', batch["seed"])


def _ce(logits: jax.Array, labels: jax.Array) -> jax.Array:
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


def dem_hec_loss(model: nnx.Module, batch: Batch, config: DemHECConfig = DemHECConfig(), *,
                 teacher: nnx.Module | None = None, forward: Forward | None = None
                 ) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The Dem-HEC repair objective on one batch (module docstring, step 2).

    Args:
      model: a `DemHECModel` (needed when contrastive_weight > 0) or a plain classifier.
      batch: {"image": [b, H, W, c], "label": [b] int, "seed": [b] int (random starts)}.
      config: `DemHECConfig`.
      teacher: the frozen snapshot (images -> logits); needed when kd_weight > 0. It gets no gradient.
      forward: (classifier, images) -> (logits, features); default `default_forward`. Used when
        the contrastive term or the feature entropy needs features.

    Returns:
      (loss, metrics): metrics hold "loss", "ce_clean", "accuracy" and each computed term
      ("ce_he", "contrastive", "kd"), plus "entropy_clean" and "entropy_he" (mean prediction entropy).

    Raises:
      ValueError: missing batch keys, a contrastive term without a `DemHECModel`, KD without a teacher.
    """
    _check_batch(batch, needs_seed=True)
    classifier = model.classifier if isinstance(model, DemHECModel) else model
    if config.contrastive_weight > 0 and not isinstance(model, DemHECModel):
        raise ValueError("contrastive_weight > 0 needs a DemHECModel (classifier + projection head); "
                         f"got {type(model).__name__}")
    if config.kd_weight > 0 and teacher is None:
        raise ValueError("kd_weight > 0 needs the teacher snapshot; got teacher=None")
    fwd = forward or default_forward
    x, y = _check_images('batch["image"]', batch["image"]), batch["label"]
    b = x.shape[0]
    needs_he = (config.he_weight > 0 or config.contrastive_weight > 0
                or (config.kd_weight > 0 and config.kd_on != "clean"))
    needs_features = config.contrastive_weight > 0
    if needs_he:
        x_he = high_entropy_samples(classifier, x, batch["seed"], config, forward=fwd)
        inputs = jnp.concatenate([x, x_he])  # one forward pass: the models are batch-independent
    else:
        inputs = x
    if needs_features:
        logits_all, feats_all = fwd(classifier, inputs)
    else:
        logits_all, feats_all = _logits(classifier, inputs), None
    logits = logits_all[:b]
    ce_clean = _ce(logits, y)
    loss = ce_clean
    metrics = {"ce_clean": ce_clean, "accuracy": (jnp.argmax(logits, -1) == y).astype(jnp.float32).mean(),
               "entropy_clean": prediction_entropy(logits).mean()}
    if needs_he:
        logits_he = logits_all[b:]
        metrics["entropy_he"] = prediction_entropy(logits_he).mean()
    if config.he_weight > 0:
        metrics["ce_he"] = _ce(logits_he, y)
        loss = loss + config.he_weight * metrics["ce_he"]
    if needs_features:
        proj = model.projection(feats_all)
        metrics["contrastive"] = info_nce(proj[b:], proj[:b], config.contrastive_temperature)
        loss = loss + config.contrastive_weight * metrics["contrastive"]
    if config.kd_weight > 0:
        kd_inputs = {"clean": x, "he": inputs[b:], "both": inputs}[config.kd_on]
        student = {"clean": logits, "he": logits_all[b:], "both": logits_all}[config.kd_on]
        teacher_logits = jax.lax.stop_gradient(_logits(teacher, kd_inputs))
        metrics["kd"] = distillation_loss(student, teacher_logits, config.kd_temperature)
        loss = loss + config.kd_weight * metrics["kd"]
    metrics["loss"] = loss
    return loss, metrics


def gaussian_noise_loss(model: nnx.Module, batch: Batch, config: BaselineConfig = BaselineConfig()
                        ) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Gaussian-noise augmentation: clean_weight * CE(x) + CE(clip(x + sigma_i n)), sigma_i ~ U(0, sigma_max).

    `batch` as `dem_hec_loss` (the seeds draw sigma_i and n). Returns (loss, metrics).
    """
    _check_batch(batch, needs_seed=True)
    x, y = _check_images('batch["image"]', batch["image"]), batch["label"]
    keys = _keys_from_seeds(batch["seed"])

    def noisy(k, image):
        k_sigma, k_noise = jax.random.split(k)
        sigma = jax.random.uniform(k_sigma, (), maxval=config.noise_sigma_max)
        return jnp.clip(image + sigma * jax.random.normal(k_noise, image.shape), 0.0, 1.0)

    x_noisy = jax.vmap(noisy)(keys, x)
    logits_all = _logits(model, jnp.concatenate([x, x_noisy]))
    logits, logits_noisy = logits_all[: x.shape[0]], logits_all[x.shape[0]:]
    ce_clean, ce_noisy = _ce(logits, y), _ce(logits_noisy, y)
    loss = config.noise_clean_weight * ce_clean + ce_noisy
    return loss, {"loss": loss, "ce_clean": ce_clean, "ce_noisy": ce_noisy,
                  "accuracy": (jnp.argmax(logits, -1) == y).astype(jnp.float32).mean()}


def pgd_loss(model: nnx.Module, batch: Batch, config: BaselineConfig = BaselineConfig(),
             dem_hec_config: DemHECConfig = DemHECConfig()) -> tuple[jax.Array, dict[str, jax.Array]]:
    """PGD adversarial fine-tuning: clean_weight * CE(x) + CE(x_adv), x_adv from `pgd_attack`.

    eps, steps and step size default to `dem_hec_config`'s (`BaselineConfig.pgd`). Returns (loss, metrics).
    """
    _check_batch(batch, needs_seed=True)
    x, y = _check_images('batch["image"]', batch["image"]), batch["label"]
    eps, steps, alpha = config.pgd(dem_hec_config)
    x_adv = pgd_attack(model, x, y, batch["seed"], epsilon=eps, steps=steps, step_size=alpha)
    logits_all = _logits(model, jnp.concatenate([x, x_adv]))
    logits, logits_adv = logits_all[: x.shape[0]], logits_all[x.shape[0]:]
    ce_clean, ce_adv = _ce(logits, y), _ce(logits_adv, y)
    loss = config.pgd_clean_weight * ce_clean + ce_adv
    return loss, {"loss": loss, "ce_clean": ce_clean, "ce_adv": ce_adv,
                  "accuracy": (jnp.argmax(logits, -1) == y).astype(jnp.float32).mean()}


def make_dem_hec_loss(config: DemHECConfig, teacher: nnx.Module | None, *, forward: Forward | None = None):
    """`dem_hec_loss` as a `fit` loss `(model, batch) -> (loss, metrics)` with a frozen teacher snapshot.

    The teacher is split into (graphdef, parameter copies) now and rebuilt inside the loss, so later
    changes to the `teacher` object do not reach it and it receives no gradient.
    """
    frozen = None
    if teacher is not None:
        t_graph, t_state = nnx.split(teacher)
        frozen = (t_graph, jax.tree.map(jnp.array, t_state))  # copies

    def loss_fn(model, batch):
        t = None if frozen is None else nnx.merge(*frozen)
        return dem_hec_loss(model, batch, config, teacher=t, forward=forward)

    return loss_fn


def make_loss(method: str, *, config: DemHECConfig = DemHECConfig(), baseline: BaselineConfig = BaselineConfig(),
              teacher: nnx.Module | None = None, forward: Forward | None = None):
    """The `fit` loss of `method` in `METHODS` ("dem_hec", "clean", "gaussian_noise", "pgd")."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}; got {method!r}")
    if method == "dem_hec":
        return make_dem_hec_loss(config, teacher, forward=forward)
    if method == "clean":
        return classification_loss
    if method == "gaussian_noise":
        return lambda model, batch: gaussian_noise_loss(model, batch, baseline)
    return lambda model, batch: pgd_loss(model, batch, baseline, config)


# ------------------------------------------------------------------------------------ fine-tuning


class FineTuneResult(NamedTuple):
    """Output of `fine_tune`.

    Attributes:
      model: the fine-tuned classifier (the projection head, if any, dropped).
      history: the logged metric rows of `fit`.
      steps: optimizer steps taken (the train state's step counter).
      fit_result: the full `FitResult` (train state, graphdef of what was trained).
    """

    model: nnx.Module
    history: list[dict[str, float]]
    steps: int
    fit_result: FitResult


def _batch_fn(images: np.ndarray, labels: np.ndarray, batch_size: int, seed: int):
    n = images.shape[0]

    def batch_fn(position: int) -> dict[str, np.ndarray]:
        rng = np.random.default_rng([seed, position])
        idx = rng.choice(n, batch_size, replace=False)
        seeds = rng.integers(0, 2 ** 31 - 1, batch_size, dtype=np.int64).astype(np.uint32)
        return {"image": images[idx], "label": labels[idx], "seed": seeds}

    return batch_fn


def fine_tune(model: nnx.Module, images, labels, *, method: str, num_steps: int, batch_size: int = 64,
              optimizer_config: OptimizerConfig | None = None, config: DemHECConfig = DemHECConfig(),
              baseline: BaselineConfig = BaselineConfig(), forward: Forward | None = None, seed: int = 0,
              workdir: str | os.PathLike | None = None, checkpoint_every: int = 100, log_every: int = 10,
              progress: bool = False, fingerprint: str | None = None) -> FineTuneResult:
    """Fine-tunes a copy of `model` for exactly `num_steps` optimizer steps with `method`'s loss.

    Every method sees the same batches for the same `seed` (``batch_fn(position)`` draws
    `batch_size` distinct images with numpy's generator seeded by (seed, position), plus per-image
    seeds for the random parts), through `algorithms.training.fit` (jitted donated step, orbax
    checkpoints in `workdir/ckpt`, resume). For "dem_hec" the teacher is a frozen copy of `model`
    taken now, and a projection head (initialised from `seed`) is trained with the model when the
    contrastive weight is > 0. `model` itself is not modified.

    Args:
      model: classifier (images -> logits) holding only `nnx.Param` state.
      images: [n, H, W, c] float in [0, 1].
      labels: [n] int.
      method: one of `METHODS`.
      num_steps: optimizer steps (equal budget across methods).
      batch_size: images per step (<= n).
      optimizer_config: default AdamW, lr 1e-4 constant (no warmup, no decay), no weight decay.
      config: `DemHECConfig` (also PGD's default eps / steps / step).
      baseline: `BaselineConfig`.
      forward: (classifier, images) -> (logits, features); default `default_forward`.
      seed: data order, random starts, projection init.
      workdir: checkpoint directory (None = none).
      checkpoint_every, log_every, progress, fingerprint: as `fit`.

    Returns:
      `FineTuneResult`.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}; got {method!r}")
    num_steps, batch_size = check_int("num_steps", num_steps), check_int("batch_size", batch_size)
    images = np.asarray(images, np.float32)
    labels = np.asarray(labels)
    check_integer_dtype("labels", labels)
    if images.ndim != 4 or labels.shape != images.shape[:1]:
        raise ValueError(f"images must be [n, H, W, c] and labels [n]; got {images.shape} and {labels.shape}")
    if images.size and (images.min() < 0 or images.max() > 1):
        raise ValueError(f"images must have values in [0, 1]; got min {images.min():.4g}, max {images.max():.4g}")
    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1; got {num_steps}")
    if not 1 <= batch_size <= images.shape[0]:
        raise ValueError(f"batch_size must be in [1, n={images.shape[0]}]; got {batch_size}")
    graphdef, params, *rest = nnx.split(model, nnx.Param, ...)
    if rest and jax.tree.leaves(rest):
        raise ValueError("fine_tune supports models whose state is only nnx.Param (no BatchNorm statistics)")
    params = jax.tree.map(jnp.array, params)  # a snapshot: later edits of `model` do not leak in
    fwd = forward or default_forward
    with_projection = method == "dem_hec" and config.contrastive_weight > 0
    feature_dim = int(fwd(model, jnp.asarray(images[:1]))[1].shape[-1]) if with_projection else 0

    def model_fn(rngs: nnx.Rngs) -> nnx.Module:
        classifier = nnx.merge(graphdef, params)
        if with_projection:
            return DemHECModel(classifier, feature_dim, config.projection_dim, rngs=rngs)
        return classifier

    teacher = nnx.merge(graphdef, params) if method == "dem_hec" else None
    loss_fn = make_loss(method, config=config, baseline=baseline, teacher=teacher, forward=forward)
    if optimizer_config is None:
        optimizer_config = OptimizerConfig(learning_rate=1e-4, warmup_steps=0, total_steps=num_steps,
                                           end_lr_fraction=1.0, weight_decay=0.0)
    out = fit(model_fn=model_fn, optimizer_config=optimizer_config,
              batch_fn=_batch_fn(images, labels, batch_size, seed), num_steps=num_steps, workdir=workdir,
              loss_fn=loss_fn, seed=seed, checkpoint_every=checkpoint_every, log_every=log_every,
              progress=progress, desc=f"fine-tune {method}", fingerprint=fingerprint)
    trained = out.model()
    classifier = trained.classifier if isinstance(trained, DemHECModel) else trained
    return FineTuneResult(classifier, out.history, int(out.state.step), out)


# ------------------------------------------------------------------------------------ evaluation


@functools.partial(jax.jit, static_argnums=0)
def _state_logits(graphdef, state, images: jax.Array) -> jax.Array:
    """`_logits` of the model `nnx.merge(graphdef, state)`: one compiled program per model structure."""
    return _logits(nnx.merge(graphdef, state), images)


def predict_logits(model: nnx.Module, images, *, batch_size: int = 512) -> np.ndarray:
    """Logits [n, v] of images [n, H, W, c], jitted, in batches of `batch_size` (the last one padded).

    Compiled once per model structure and batch shape (repeat calls on models of the same structure,
    e.g. every fine-tuned arm, reuse the program)."""
    images = np.asarray(images, np.float32)
    if images.ndim != 4:
        raise ValueError(f"images must have shape [n, H, W, c]; got {images.shape}")
    batch_size = check_int("batch_size", batch_size)
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1; got {batch_size}")
    graphdef, state = nnx.split(model)
    n = images.shape[0]
    size = min(batch_size, max(n, 1))
    out = []
    for start in range(0, n, size):
        chunk = images[start:start + size]
        pad = size - chunk.shape[0]
        if pad:
            chunk = np.concatenate([chunk, np.zeros((pad,) + chunk.shape[1:], chunk.dtype)])
        out.append(np.asarray(_state_logits(graphdef, state, chunk))[: size - pad])
    return np.concatenate(out) if out else np.zeros((0, 0), np.float32)


def accuracy(model: nnx.Module, images, labels, *, batch_size: int = 512) -> float:
    """Top-1 accuracy of `model` on (images [n, H, W, c], labels [n])."""
    labels = np.asarray(labels)
    check_integer_dtype("labels", labels)
    logits = predict_logits(model, images, batch_size=batch_size)
    if logits.shape[0] != labels.shape[0]:
        raise ValueError(f"images and labels must have the same length; got {logits.shape[0]} and {labels.shape[0]}")
    return float((logits.argmax(-1) == labels).mean())


def _corruption_key(key: jax.Array, name: str, severity: int) -> jax.Array:
    """The key of (name, severity): independent of which other corruptions are evaluated."""
    return jax.random.fold_in(jax.random.fold_in(key, zlib.crc32(name.encode()) & 0x7FFFFFFF), severity)


def _check_names(names: Sequence[str]) -> tuple[str, ...]:
    names = tuple(names)
    if not names:
        raise ValueError("names must list at least one corruption")
    bad = [n for n in names if n not in corruptions_lib.CORRUPTIONS]
    if bad:
        raise ValueError(f"names must be keys of CORRUPTIONS {sorted(corruptions_lib.CORRUPTIONS)}; got {bad}")
    return names


def corruption_accuracy(model: nnx.Module, images, labels, *, key: jax.Array,
                        names: Sequence[str] = corruptions_lib.SEEN_CORRUPTIONS,
                        severities: Sequence[int] = (1, 2, 3, 4, 5), batch_size: int = 512
                        ) -> dict[tuple[str, int], float]:
    """Accuracy on every (corruption name, severity) of the test images.

    The corrupted set of (name, severity) uses ``fold_in(fold_in(key, crc32(name)), severity)``, so
    every model evaluated with the same key sees the same corrupted images.

    Returns:
      {(name, severity): accuracy}.
    """
    names = _check_names(names)
    images = np.asarray(images, np.float32)
    out = {}
    for name in names:
        for severity in severities:
            corrupted = corruptions_lib.corrupt(images, name, severity, _corruption_key(key, name, severity))
            out[(name, int(severity))] = accuracy(model, np.asarray(corrupted), labels, batch_size=batch_size)
    return out


def mean_corruption_accuracy(table: Mapping[tuple[str, int], float], names: Sequence[str] | None = None) -> float:
    """Mean of a `corruption_accuracy` table, over all entries or those whose name is in `names`."""
    values = [v for (n, _), v in table.items() if names is None or n in names]
    if not values:
        raise ValueError(f"no entries of the table match names={names!r}")
    return float(np.mean(values))


def entropy_by_severity(model: nnx.Module, images, *, key: jax.Array,
                        names: Sequence[str] = corruptions_lib.SEEN_CORRUPTIONS,
                        severities: Sequence[int] = (0, 1, 2, 3, 4, 5), temperature: float = 1.0,
                        batch_size: int = 512) -> np.ndarray:
    """Mean predictive entropy [len(names), len(severities)] of the model on corrupted images.

    Severity 0 is the clean set. Corrupted images are drawn as in `corruption_accuracy`.
    Average over axis 0 for the suite's curve.
    """
    names = _check_names(names)
    images = np.asarray(images, np.float32)
    out = np.zeros((len(names), len(severities)))
    for i, name in enumerate(names):
        for j, severity in enumerate(severities):
            corrupted = corruptions_lib.corrupt(images, name, severity, _corruption_key(key, name, severity))
            logits = predict_logits(model, np.asarray(corrupted), batch_size=batch_size)
            out[i, j] = float(np.mean(prediction_entropy(jnp.asarray(logits), temperature)))
    return out
