# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.7
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Vision efficiency and robustness on a small ViT
#
# How to call this library's vision model and the methods of the vision papers:
#
# - `models.vit`: a small Vision Transformer with per-head (prunable) attention widths and hooks
#   for FFN channel selection and token pruning;
# - ToaSt (`algorithms.compression.toast`): coupled head-wise structured pruning of attention (SCWP),
#   fine-tuning of the pruned model, training-free Token Channel Selection (TCS) in the FFN, and an
#   exact MACs counter, compared with magnitude pruning at equal MACs;
# - Dem-HEC (`algorithms.robustness.dem_hec`) on the corruption suite `primitives.corruptions`:
#   entropy-guided fine-tuning of a small CNN (`models.cnn`) against clean fine-tuning.
#
# Everything runs on scikit-learn's bundled digits (nothing downloads). Set SMOKE=1 for a fast run.

# %%
# Setup. On Colab (or any fresh runtime) put a pip source of this library in REPO_URL: its
# repository's git URL ("https://github.com/OWNER/REPO.git"), a local path or a wheel; or set the
# ICML26_REPO_URL environment variable. The install pins the jax/jaxlib already installed (Colab's
# accelerator build): pip keeps them when they satisfy the library's range and fails, saying so,
# when they do not; it never replaces them. Elsewhere leave it empty (`make install` installs).
import os
import sys

REPO_URL = ""  # <- paste here, e.g. "https://github.com/OWNER/REPO.git"
REPO_URL = REPO_URL or os.environ.get("ICML26_REPO_URL", "")
if REPO_URL:
    import importlib.metadata
    import subprocess
    import tempfile

    pins = []
    for dist in ("jax", "jaxlib"):
        try:
            pins.append(f"{dist}=={importlib.metadata.version(dist)}")
        except importlib.metadata.PackageNotFoundError:
            pass
    with tempfile.NamedTemporaryFile("w", suffix="-constraints.txt", delete=False) as f:
        f.write("".join(pin + "\n" for pin in pins))
    git = "://" in REPO_URL and not REPO_URL.startswith("git+") and not REPO_URL.endswith((".whl", ".zip", ".gz"))
    source = "git+" + REPO_URL if git else REPO_URL
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "-c", f.name, source],
                         capture_output=True, text=True)
    if pip.returncode:
        raise RuntimeError(f"pip could not install {source} keeping the installed {', '.join(pins) or 'packages'}; "
                           f"if it names jax, this runtime's jax is outside the library's range (pyproject.toml): "
                           f"pick another runtime or install a jax in range first.\n{pip.stdout[-2000:]}{pip.stderr[-3000:]}")
    print("installed", source, "keeping", ", ".join(pins) or "no preinstalled jax")
elif "google.colab" in sys.modules:
    import importlib.util

    if importlib.util.find_spec("primitives") is None:
        raise RuntimeError("Set REPO_URL at the top of this cell to this library's git URL, then run it again.")

# %% tags=["parameters"]
# Parameters. SMOKE=1 (set by the tests) shrinks everything to seconds.
SMOKE = os.environ.get("SMOKE", "0") == "1"
TRAIN_STEPS = 4 if SMOKE else 1000
FINETUNE_STEPS = 2 if SMOKE else 80
D_MODEL = 16 if SMOKE else 64
NUM_LAYERS = 2 if SMOKE else 4

# %%
import jax
import numpy as np

from algorithms import training
from algorithms.compression import toast
from experiments.tasks import load_digits
from models.vit import ViT, ViTConfig, classification_loss

print("JAX", jax.__version__, "on", jax.default_backend(), "with", jax.device_count(), "device(s)")

# %% [markdown]
# ## 1. Data and a small ViT
#
# The 8x8 digits are upsampled to 16x16 and cut into 4x4 patches: 16 patch tokens plus a class token.
# `ViTConfig` validates the shape; `count_macs` counts every matmul's multiply-accumulates per image.

# %%
(x_train, y_train), (x_test, y_test) = load_digits()
upsample = lambda x: np.repeat(np.repeat(x, 2, axis=1), 2, axis=2)  # noqa: E731
x_train, x_test = upsample(x_train), upsample(x_test)
config = ViTConfig(image_size=16, patch_size=4, num_classes=10, d_model=D_MODEL, num_heads=4 if not SMOKE else 2,
                   d_ff=4 * D_MODEL, num_layers=NUM_LAYERS)
dense_macs = toast.count_macs(config)
print(f"{config.num_params():,} parameters, {dense_macs.total:,} MACs per image "
      f"(attention {sum(dense_macs.attention):,}, FFN {sum(dense_macs.ffn):,})")


def batch_fn(position, batch_size=64):
    rng = np.random.default_rng(position)
    idx = rng.integers(0, len(x_train), batch_size)
    return {"image": x_train[idx], "label": y_train[idx]}


# %% [markdown]
# ## 2. Train the dense model
#
# `training.fit` trains any NNX model with a `(model, batch) -> (loss, metrics)` loss;
# `classification_loss` is the ViT's cross-entropy.

# %%
run = training.fit(model_fn=lambda rngs: ViT(config, rngs=rngs),
                   optimizer_config=training.OptimizerConfig(learning_rate=2e-3, warmup_steps=max(1, TRAIN_STEPS // 10),
                                                             total_steps=TRAIN_STEPS, weight_decay=0.05),
                   batch_fn=batch_fn, num_steps=TRAIN_STEPS, loss_fn=classification_loss,
                   log_every=max(1, TRAIN_STEPS // 5), progress=not SMOKE)
dense = run.model()
dense_acc = toast.evaluate(dense, x_test, y_test, batch_size=90)
print(f"dense test accuracy {dense_acc:.3f}")

# %% [markdown]
# ## 3. ToaSt, part 1: SCWP (coupled head-wise structured pruning of attention)
#
# `scwp(model, sparsity)` scores each head dimension by the distance of its coupled rows ([Q|K] and
# [V|O^T]) from their geometric median and keeps the top `floor(d (100 - s) / 100)` dims of every head
# (block 0 stays dense). It returns the *folded* model, whose heads store only the kept dims, and the
# masks. `mask_attention` gives the same function with the dense shapes and zeroed weights.

# %%
SPARSITY = 75.0
pruned, masks = toast.scwp(dense, SPARSITY)
print("kept q/k dims per head, per layer:", pruned.config.qk_dims)
print("Q/K share one mask, V/O another; layer 1, head 0 keeps q/k dims", np.flatnonzero(masks.qk[1][0]))
pruned_macs = toast.count_macs(pruned.config).total
print(f"MACs {pruned_macs:,} ({pruned_macs / dense_macs.total:.0%} of dense), zero-shot accuracy "
      f"{toast.evaluate(pruned, x_test, y_test, batch_size=90):.3f}")

# %% [markdown]
# ## 4. ToaSt, part 2: Token Channel Selection in the FFN (training-free)
#
# `TCSConfig` sets per-block ratios: `fc1_ratios` drop residual channels before fc1 (and from the
# residual stream itself), `fc2_ratios` drop hidden units before fc2. The kept channels are scored on
# each forward pass from the class token and a few sampled patch tokens weighted by the class token's
# attention. Here r2 = 0.9 on the last block, as ToaSt's released schedules back-load TCS.

# %%
tcs = toast.TCSConfig.uniform(config.num_layers, fc2=0.9, layers=(config.num_layers - 1,), sample_ratio=0.2)
toast_macs = toast.count_macs(pruned.config, tcs=tcs).total
acc_tcs = toast.evaluate(pruned, x_test, y_test, tcs=tcs, batch_size=90)
print(f"SCWP + TCS: {toast_macs:,} MACs ({1 - toast_macs / dense_macs.total:.0%} fewer than dense), "
      f"zero-shot accuracy {acc_tcs:.3f}")

# %% [markdown]
# ## 5. Fine-tune the pruned model (with TCS active), and compare at equal MACs
#
# `finetune` runs `training.fit` from the pruned weights; the folded structure is kept by construction.
# The magnitude-pruning baseline prunes the same head dims by L1 norm and the FFN statically to the
# widths whose MACs match TCS's (`ffn_widths_matching`); it gets the same fine-tuning steps.

# %%
opt = training.OptimizerConfig(learning_rate=5e-4, warmup_steps=max(1, FINETUNE_STEPS // 10),
                               total_steps=FINETUNE_STEPS, weight_decay=0.05)
toast_model, _ = toast.finetune(pruned, batch_fn=batch_fn, num_steps=FINETUNE_STEPS, optimizer_config=opt, tcs=tcs,
                                progress=False)
magnitude = toast.magnitude_prune(dense, SPARSITY, ffn_widths=toast.ffn_widths_matching(config, tcs))
magnitude, _ = toast.finetune(magnitude, batch_fn=batch_fn, num_steps=FINETUNE_STEPS, optimizer_config=opt,
                              progress=False)
rows = {
    "dense": (dense_macs.total, dense_acc),
    "ToaSt (SCWP + TCS, fine-tuned)": (toast_macs, toast.evaluate(toast_model, x_test, y_test, tcs=tcs, batch_size=90)),
    "magnitude pruning (fine-tuned)": (toast.count_macs(magnitude.config).total,
                                       toast.evaluate(magnitude, x_test, y_test, batch_size=90)),
}
for name, (macs, acc) in rows.items():
    print(f"{name:32s} {macs:>10,} MACs ({macs / dense_macs.total:4.0%})  accuracy {acc:.3f}")

# %% [markdown]
# The full study (head sparsities x scores x couplings, TCS against random and static channels, token
# pruning, and the dense model fine-tuned for the same steps) is the `toast` experiment:
# `python -m experiments run toast --preset quick`.

# %% [markdown]
# ## Dem-HEC: entropy-guided fine-tuning for corruption robustness
#
# Dem-HEC (ICML 2026; only the abstracts were available, so the method is the spec's [INFER] reading of
# them) repairs a trained classifier with a short fine-tuning: it generates *high-entropy* samples by
# label-free entropy ascent inside an L-inf ball of radius eps, trains with cross-entropy on clean and
# high-entropy samples, pulls their embeddings together with an InfoNCE term, and distils from a frozen
# snapshot of the model to keep clean accuracy (`algorithms.robustness.dem_hec`). Robustness is measured on
# a deterministic CIFAR-10-C-style corruption suite in pure JAX (`primitives.corruptions`): every
# corruption is a function of (image, key, severity), severity 0 is the identity, 1-5 follow CIFAR-10-C.
#
# Below: corrupt a few digits at every severity, train a tiny CNN, fine-tune it with Dem-HEC and with
# clean fine-tuning for the same number of optimizer steps, and compare their mean corruption accuracy.
# The full comparison (CNN and ViT, Gaussian-noise and PGD baselines, the loss-term ablations, 3 seeds
# with confidence intervals) is `python -m experiments run dem_hec --preset quick`.

# %%
import jax
import numpy as np
from flax import nnx

from algorithms.robustness import dem_hec
from algorithms.training import OptimizerConfig, fit
from experiments.tasks import load_digits
from models.cnn import CNN, CNNConfig, classification_loss
from primitives import corruptions

(x_train, y_train), (x_test, y_test) = load_digits(seed=0)
upsample = lambda x: np.repeat(np.repeat(x, 2, 1), 2, 2)  # 8x8 -> 16x16, so blurs act on more than a pixel
x_train, x_test = upsample(x_train), upsample(x_test)
if SMOKE:
    x_test, y_test = x_test[:120], y_test[:120]
print("seen corruptions:", corruptions.SEEN_CORRUPTIONS)
print("held-out corruptions:", corruptions.HELD_OUT_CORRUPTIONS, "(saturate is the identity on grey images)")

# %%
# One digit under each corruption at severities 0 (identity) to 5, and its MSE to the clean digit (it grows with
# severity for most corruptions; pixelate at 16x16 pixels is not monotone for every image).
names = ("defocus_blur", "contrast", "pixelate", "jpeg_compression", "fog") + (() if SMOKE else ("gaussian_noise",))
digit = x_test[:1]
for name in names:
    mse = [float(np.mean((np.asarray(corruptions.corrupt(digit, name, s, jax.random.key(0))) - digit) ** 2))
           for s in range(6)]
    print(f"{name:18s} MSE to clean by severity 0..5: " + " ".join(f"{m:.4f}" for m in mse))

# %%
# A tiny base CNN, then two fine-tuning arms with the same steps, batches and optimizer.
base_steps, ft_steps = (150, 5) if SMOKE else (300, 60)
cnn_config = CNNConfig(in_channels=1, num_classes=10, channels=(8, 16) if SMOKE else (16, 32, 32), hidden_dim=32)


def batch_fn(position):
    idx = np.random.default_rng([0, position]).integers(0, len(x_train), 64)
    return {"image": x_train[idx], "label": y_train[idx]}


base = fit(model_fn=lambda rngs: CNN(cnn_config, rngs=rngs), loss_fn=classification_loss, batch_fn=batch_fn,
           num_steps=base_steps, optimizer_config=OptimizerConfig(learning_rate=3e-3, warmup_steps=base_steps // 10,
                                                                  total_steps=base_steps),
           progress=False).model()
ft_opt = OptimizerConfig(learning_rate=3e-4, warmup_steps=0, total_steps=ft_steps, end_lr_fraction=1.0,
                         weight_decay=0.0)
tuned = {method: dem_hec.fine_tune(base, x_train, y_train, method=method, num_steps=ft_steps, batch_size=64,
                                   optimizer_config=ft_opt, config=dem_hec.DemHECConfig(), seed=0).model
         for method in ("dem_hec", "clean")}

# %%
# Mean corruption accuracy (every model sees the same corrupted images for the same key) and clean accuracy.
severities = (1, 5) if SMOKE else (1, 3, 5)
key = jax.random.key(1234)
for label, model in (("base", base), ("Dem-HEC", tuned["dem_hec"]), ("clean FT", tuned["clean"])):
    table = dem_hec.corruption_accuracy(model, x_test, y_test, key=key, names=names, severities=severities)
    entropy = dem_hec.entropy_by_severity(model, x_test, key=key, names=names, severities=(0,) + severities)
    print(f"{label:9s} clean acc {dem_hec.accuracy(model, x_test, y_test):.3f}  "
          f"mean corruption acc {dem_hec.mean_corruption_accuracy(table):.3f}  "
          f"predictive entropy at severity 0/{'/'.join(map(str, severities))}: " + "/".join(f"{h:.2f}" for h in entropy.mean(0)))

# %% [markdown]
# ## Real data: CIFAR-10 and CIFAR-10-C through TFDS
#
# Both experiments' `paper` presets read real data through `experiments.data` (TensorFlow Datasets'
# random-access reader; the `[data]` extra, `pip install -e '.[data]'`, no TensorFlow needed to read):
# toast trains its ViT on CIFAR-10, and dem_hec evaluates on the published CIFAR-10-C images (Hendrycks &
# Dietterich's own corruptions, 15 seen and 4 held-out types at 5 severities) instead of
# `primitives.corruptions`. Nothing downloads: prepare the datasets once (`experiments.data.load(name, split,
# download=True)`, which needs TensorFlow for the image encoding) and pass their folder, local or `gs://`:
#
# ```
# python -m experiments run toast --preset paper --data.data-dir gs://my-bucket/tensorflow_datasets
# python -m experiments run dem_hec --preset paper --data.data-dir gs://my-bucket/tensorflow_datasets
# ```
#
# In Python, `experiments.data.cifar10_images("test")` and `experiments.data.cifar10_c_images("fog", 3)` return
# float32 images in [0, 1] and int32 labels (CIFAR-10-C image i is CIFAR-10 test image i, corrupted).
