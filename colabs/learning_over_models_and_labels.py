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
# # Learning over models and labels: model zoos, MVProbe, WeightCLIP, active learning with FM priors
#
# How to call the methods of issue 31's papers that exist so far and read their results:
#
# - the model zoo (`algorithms.weight_space.zoo`): small MLPs trained with `jax.vmap` on variants of
#   the bundled digits, and the hidden-unit permutation symmetry of their weights;
# - MVProbe (`algorithms.weight_space.mvprobe`): first-order and Gram views of a weight matrix, against
#   ProbeX, to predict what a model was trained on;
# - WeightCLIP (`algorithms.weight_space.weightclip`): a weight autoencoder whose per-token latents are
#   aligned with a dataset encoder by a SigLIP-style loss, for dataset-to-model retrieval and for
#   generating weights for an unseen dataset;
# - active learning under class imbalance and label noise (`algorithms.active_learning`): the
#   selection rules (margin, entropy, coreset, DIRECT) and the foundation-model-prior co-decision.
#
# Set RUN_EXPERIMENTS=1 to rerun the quick presets here (minutes).

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
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from experiments import report

print("JAX", jax.__version__, "on", jax.default_backend())

# %% [markdown]
# ## 1. Weight-space symmetry and the probes
#
# Permuting an MLP's hidden units gives another weight vector with the same function. ProbeX reads a
# weight matrix through learned probes; MVProbe adds row and column Gram views, which do not change
# when the hidden units of that matrix are permuted.

# %%
from algorithms.weight_space import mvprobe as mv
from algorithms.weight_space import zoo

rng = np.random.default_rng(0)
layers = [(rng.normal(size=(8, 6)), rng.normal(size=6)), (rng.normal(size=(6, 6)), rng.normal(size=6)),
          (rng.normal(size=(6, 3)), rng.normal(size=3))]
permuted = zoo.random_permutation(rng, layers)
x = rng.normal(size=(5, 8))
print("same function after permuting hidden units:",
      np.allclose(zoo.mlp_apply(layers, x), zoo.mlp_apply(permuted, x)))
print("canonical forms agree:", all(np.allclose(a[0], b[0]) for a, b in
                                    zip(zoo.canonicalize(layers), zoo.canonicalize(permuted))))

w = jnp.asarray(rng.normal(size=(4, 6, 6)), jnp.float32)  # four models' 6 x 6 hidden matrices
probe = mv.MVProbe(6, 6, 2, n_probes=4, proj_dim=4, rep_dim=8, rngs=nnx.Rngs(0))
probex = mv.ProbeX(6, 6, 2, n_probes=4, proj_dim=4, rep_dim=8, rngs=nnx.Rngs(0))
print("MVProbe logits", probe(w).shape, "| ProbeX logits", probex(w).shape)

# %%
mvprobe_result = report.show_result("mvprobe", rerun=RUN_EXPERIMENTS)

# %% [markdown]
# ## 2. WeightCLIP: a shared space for weights and datasets
#
# An MLP becomes a sequence of tokens (one row `[kernel[:, j], bias[j]]` per output unit, cut into
# pieces of `tokensize`); `detokenize` inverts it exactly. The SigLIP loss scores every (token, dataset)
# pair: positive when the token's model was trained on that dataset.

# %%
from algorithms.weight_space import weightclip as wc

kernels = [rng.normal(size=(3, 8, 6)).astype(np.float32), rng.normal(size=(3, 6, 4)).astype(np.float32)]
biases = [rng.normal(size=(3, 6)).astype(np.float32), rng.normal(size=(3, 4)).astype(np.float32)]
tokens, mask, positions = wc.tokenize(kernels, biases, tokensize=4)
k_back, b_back = wc.detokenize(tokens, [(8, 6), (6, 4)], tokensize=4)
print("tokens", tokens.shape, "| exact round trip:",
      all(np.allclose(a, b) for a, b in zip(kernels + biases, list(k_back) + list(b_back))))
z = jnp.asarray(rng.normal(size=(6, 8)), jnp.float32)   # six tokens' latents
d = jnp.asarray(rng.normal(size=(2, 8)), jnp.float32)   # two datasets' embeddings
pos = jnp.asarray(np.repeat(np.eye(2, dtype=bool), 3, axis=0))  # tokens 0-2 from dataset 0, 3-5 from 1
print("SigLIP alignment loss:", float(wc.siglip_alignment_loss(z, d, pos, temperature=10.0)))

# %%
weightclip_result = report.show_result("weightclip", rerun=RUN_EXPERIMENTS)

# %% [markdown]
# ## 3. Selecting what to label
#
# Every rule returns exactly `budget` new indices and never re-picks a labeled one. The annotator's
# noise is fixed per item (`noisy_annotations`).

# %%
from algorithms.active_learning import noise, selection

n, k = 200, 4
probs = rng.dirichlet(np.ones(k), size=n)
labeled = np.zeros(n, bool)
labeled[:10] = True
for name, pick in [("margin", selection.margin_select), ("entropy", selection.entropy_select)]:
    chosen = pick(probs, labeled, 5, rng=rng)
    print(f"{name:8s} picks {sorted(chosen.tolist())}")
print("coreset  picks", sorted(selection.k_center_greedy(rng.normal(size=(n, 3)), labeled, 5, rng=rng).tolist()))
labels = rng.integers(0, k, n)
noisy = noise.noisy_annotations(labels, 0.2, num_classes=k, rng=rng)
print(f"annotator flips {np.mean(noisy != labels):.2f} of labels at rate 0.2")

# %%
al_result = report.show_result("fm_active_learning", rerun=RUN_EXPERIMENTS)
