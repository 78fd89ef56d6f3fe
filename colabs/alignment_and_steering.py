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
# # Alignment and steering of the decoder LM
#
# How to call the methods of issue 29's papers and read their results:
#
# - preference losses (`primitives.preference_losses`) and CAMP (`algorithms.alignment.camp`):
#   conflict-aware adaptive margins between truthfulness and helpfulness preferences;
# - Style Modulation Heads (`algorithms.alignment.style_heads`): find a style direction, score the
#   heads that write it, steer only those heads (or the residual stream, the baseline);
# - SafeThink (`algorithms.decoding.safethink`): a safety monitor inside the decoding loop that
#   rejects an unsafe reasoning step and injects a short corrective prefix;
# - ROSA2 (`algorithms.alignment.rosa2`): over a multi-turn interaction, feedback is normalized into a
#   clarified instruction (words) and a small adapter takes one KL-regularized step (weights).
#
# Each section calls the method on tiny inputs, then reads the experiment's stored quick result
# (`results/<slug>/quick/result.json`, written by `python -m experiments run <slug> --preset quick`).
# Set RUN_EXPERIMENTS=1 to rerun an experiment's quick preset here (minutes on a CPU).

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
# ## 1. Preference losses and CAMP
#
# The losses are pure functions of summed sequence log-probs of the policy and a frozen reference.
# With margin 0, margin-DPO is DPO. CAMP orients each pair truthfulness-first and changes the margin
# and weight only where the two objectives disagree (`detect_conflicts`).

# %%
from algorithms.alignment import camp
from primitives import preference_losses as pl

pc, pr = jnp.array([-3.0, -5.0, -2.0]), jnp.array([-4.0, -4.0, -6.0])  # policy: chosen, rejected
rc, rr = jnp.array([-3.5, -4.5, -3.0]), jnp.array([-3.5, -4.5, -3.0])  # reference
print("DPO       ", pl.dpo_loss(pc, pr, rc, rr, beta=0.1))
print("margin-DPO", pl.margin_dpo_loss(pc, pr, rc, rr, beta=0.1, margin=0.0))
print("IPO       ", pl.ipo_loss(pc, pr, rc, rr, tau=0.1))

delta_t = jnp.array([1.0, 1.0, 0.5])   # truthfulness rating differences of three pairs
delta_h = jnp.array([0.5, -1.0, 0.0])  # helpfulness: the second pair conflicts
print("conflicting:", camp.detect_conflicts(delta_t, delta_h))
print("CAMP loss per pair:", camp.camp_loss(pc, pr, rc, rr, delta_t, delta_h))

# %%
camp_result = report.show_result("camp", rerun=RUN_EXPERIMENTS)

# %% [markdown]
# ## 2. Style Modulation Heads
#
# A style direction is a mean difference of activations between styles. `head_contributions` scores
# each head's share of that direction at a layer; `head_steering_deltas` adds it to the chosen heads
# only, through the decoder LM's `head_deltas` hook; `residual_steering_deltas` is the baseline.

# %%
from algorithms.alignment import style_heads as sh
from models import Transformer, TransformerConfig

cfg = TransformerConfig(vocab_size=16, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2, d_ff=64)
model = Transformer(cfg, rngs=nnx.Rngs(0))
rng = np.random.default_rng(0)
pos, neg = rng.integers(0, 16, (8, 6)), rng.integers(0, 16, (8, 6))
acts_pos, acts_neg = sh.hook_activations(model, pos), sh.hook_activations(model, neg)
vectors = sh.style_vectors(acts_pos, acts_neg)
layer = 1
z, scores = sh.head_contributions(vectors["attn_pre_o"][layer], vectors["attn_out"][layer],
                                  sh.output_projections(model)[layer])
heads = sh.top_heads(z, 2)
deltas = sh.head_steering_deltas(vectors["attn_pre_o"][layer], layer=layer, heads=heads, coef=4.0, num_layers=cfg.num_layers)
steered = model(jnp.asarray(pos), head_deltas=deltas).logits
print("hook points:", sorted(vectors), "| head z-scores at layer 1:", np.round(np.asarray(z), 2), "-> heads", heads)
print("mean |logit change| from steering 2 heads:", float(jnp.abs(steered - model(jnp.asarray(pos)).logits).mean()))

# %%
style_result = report.show_result("style_heads", rerun=RUN_EXPERIMENTS)

# %% [markdown]
# ## 3. SafeThink
#
# `safethink_generate` decodes like `generate`; at each step end (a delimiter token) a scorer gives
# p(safe) of the trace so far. Below tau the step is removed from the trace and the KV cache and the
# prefix is forced instead. A scorer that never fires gives exactly `generate`'s output.

# %%
from algorithms.decoding import generate
from algorithms.decoding import safethink as st
from primitives.sampling import Sampler

delims, prefix, unsafe_token = (3, 4), (10, 11), 7
weights = np.zeros(16, np.float32)
weights[unsafe_token] = -10.0  # any trace holding token 7 is unsafe
scorer = st.BagOfTokensScorer(jnp.asarray(weights), jnp.asarray(5.0))
config = st.SafeThinkConfig(prefix=prefix, step_delimiters=delims, tau=0.5, max_interventions=2)
prompts = rng.integers(0, 10, (4, 5)).astype(np.int32)
key = jax.random.key(1)
plain = generate(model, prompts, max_new_tokens=12, sampler=Sampler(temperature=1.0), key=key)
safe = st.safethink_generate(model, prompts, scorer=scorer, config=config, max_new_tokens=12,
                             sampler=Sampler(temperature=1.0), key=key)
for r in range(4):
    print("plain:", np.asarray(plain.tokens[r]).tolist(), "\nsafe: ", np.asarray(safe.tokens[r]).tolist(),
          f"({int(safe.interventions[r])} interventions, {int(safe.rejected_tokens[r])} rejected tokens)")

# %%
safethink_result = report.show_result("safethink", rerun=RUN_EXPERIMENTS)

# %% [markdown]
# ## 4. ROSA2
#
# The weight stream moves the policy toward the KL-regularized optimum pi*(y) ~ pi(y) exp(r(y) / beta)
# with one linearized step of an adapter, solving the Fisher system by conjugate gradient.

# %%
from algorithms.alignment import rosa2

p = jnp.array([0.5, 0.3, 0.2])  # the policy over three answers; the user says the first is wrong
print("reweighted optimum:", rosa2.kl_regularized_optimum(p, jnp.array([-1.0, 0.0, 0.0]), beta=1.0))
spd = jnp.array([[4.0, 1.0], [1.0, 3.0]])
solve = rosa2.conjugate_gradient(lambda x: spd @ x, jnp.array([1.0, 2.0]), max_iters=10)
print("CG solution:", solve.x, "vs", jnp.linalg.solve(spd, jnp.array([1.0, 2.0])))

# %%
rosa2_result = report.show_result("rosa2", rerun=RUN_EXPERIMENTS)
