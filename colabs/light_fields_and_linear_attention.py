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
# # Light fields, linear-time attention and label-map diffusion
#
# How to call the pieces of issue 28 that exist so far:
#
# - the bidirectional WKV of Vision-RWKV (`primitives.linear_attention.bi_wkv`): linear in the number
#   of tokens and equal to its quadratic softmax form, stable where the naive exponentials overflow;
#   the Pallas kernel `pallas_kernels.wkv.bi_wkv` (interpret mode on a CPU);
# - E2I-VRWKV (`algorithms.vision.e2i_vrwkv`) on procedural light fields
#   (`experiments.tasks.light_fields`): segmenting the centre view of a grid of sub-aperture views
#   with geometry from the epipolar-plane images;
# - PLMD (`algorithms.vision.plmd`) on procedural floorplans (`experiments.tasks.floorplans`): a
#   mean-reverting SDE (`primitives.diffusion`) completes the obstacle map, then the semantic map
#   conditioned on it, keeping the observed cells fixed. (Its navigation agent is not built yet.)
#
# Set RUN_EXPERIMENTS=1 to rerun the experiment's quick preset here (minutes on a CPU).

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
SMOKE = os.environ.get("SMOKE", "0") == "1"
RUN_EXPERIMENTS = os.environ.get("RUN_EXPERIMENTS", "0") == "1" and not SMOKE

# %%
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from experiments import report

print("JAX", jax.__version__, "on", jax.default_backend())

# %% [markdown]
# ## 1. Bi-WKV: linear time, same answer as the quadratic form
#
# Per channel, token t attends to token i with weight exp(-(|t - i| - 1) w / T + k_i) (and a bonus
# exp(u + k_t) for itself). `bi_wkv` computes it with a forward and a backward scan carrying running
# maxima; `bi_wkv_reference` builds the T x T weights.

# %%
from pallas_kernels import wkv
from primitives import linear_attention as la

b, t, c = 2, 37, 16
key = jax.random.split(jax.random.key(0), 4)
w, u = jax.random.normal(key[0], (c,)), jax.random.normal(key[1], (c,))
k, v = 3 * jax.random.normal(key[2], (b, t, c)), jax.random.normal(key[3], (b, t, c))
linear, quadratic = la.bi_wkv(w, u, k, v), la.bi_wkv_reference(w, u, k, v)
kernel = wkv.bi_wkv(w, u, k, v, implementation="pallas", interpret=True)
print("max |linear - quadratic|:", float(jnp.abs(linear - quadratic).max()))
print("max |pallas (interpret) - quadratic|:", float(jnp.abs(kernel - quadratic).max()))
big = la.bi_wkv(w * 30, u, k * 40, v)
print("keys x40, decay x30: finite =", bool(jnp.isfinite(big).all()))
print("modeled FLOPs, Bi-WKV / quadratic form at 4096 tokens:",
      wkv.bi_wkv_cost(batch=1, seq_len=4096, channels=256).flops
      / wkv.bi_wkv_quadratic_cost(batch=1, seq_len=4096, channels=256).flops)

# %% [markdown]
# ## 2. Light fields and E2I-VRWKV
#
# A scene is a stack of textured layers at known disparities; view (u, v) shifts each layer by its
# disparity times the view offset, with occlusion. The model reads all views and returns per-pixel
# logits for the centre view.

# %%
from algorithms.vision import e2i_vrwkv as e2i
from experiments.tasks import light_fields as lf
from models.vrwkv import VRWKVConfig

scenes = lf.make_light_fields(4, seed=0, size=16, views=3)
print("views", scenes.views.shape, "labels", scenes.labels.shape, "classes present",
      np.unique(scenes.labels).tolist())
config = e2i.E2IConfig(backbone=VRWKVConfig(image_size=16, patch_size=4, num_classes=4, d_model=16, num_layers=1),
                       views=3, prior_dim=4)
model = e2i.E2IVRWKV(config, rngs=nnx.Rngs(0))
logits = model(jnp.asarray(scenes.views))
print("logits", logits.shape, "| parameters:", e2i.num_params(model))
plain = e2i.E2IVRWKV(dataclasses.replace(config, angular=False, ecma=False, epi_prior=False, gate=False),
                     rngs=nnx.Rngs(0))  # every light-field block off: plain VRWKV on the centre view
print("plain VRWKV logits", plain(jnp.asarray(scenes.views)).shape)

# %%
e2i_result = report.show_result("e2i_vrwkv", rerun=RUN_EXPERIMENTS)

# %% [markdown]
# ## 3. PLMD: completing a partially observed label map
#
# The IR-SDE moves a clean map x0 toward a degraded mean mu (here: the map with unknown cells blanked)
# and adds noise; `marginal_mean_std` is its closed form. A floorplan is seen along a random walk by
# ray casting, which never sees through walls.

# %%
from experiments.tasks import floorplans as fp
from primitives import diffusion

plan = fp.make_floorplan(np.random.default_rng(0), n=24, num_rooms=4)
path = fp.random_walk(np.random.default_rng(1), plan.labels, (int(np.argwhere(plan.labels == 0)[0][0]),
                                                               int(np.argwhere(plan.labels == 0)[0][1])), 10)
known = fp.observe(plan.labels, path, radius=6)
print(f"{len(plan.rooms)} rooms, {plan.doors.sum()} door cells, {known.mean():.0%} of cells observed")
schedule = diffusion.irsde_schedule(T=20, max_sigma=60 / 255)
x0 = jnp.asarray(plan.labels == 1, jnp.float32) * 2 - 1  # walls as +1, the rest -1
mu = jnp.where(jnp.asarray(known), x0, 0.0)
for t in (0, 10, 20):
    mean, std = diffusion.marginal_mean_std(x0, mu, t, schedule)
    print(f"t={t:2d}: |mean - mu| = {float(jnp.abs(mean - mu).mean()):.3f}, std = {float(std):.3f}")

# %%
plmd_result = report.show_result("plmd", rerun=RUN_EXPERIMENTS)
