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
# # Mixture of experts and sparse scaling
#
# How to call this library's MoE layer and the methods of the MoE-area papers:
#
# - the MoE building blocks: routing primitives, the grouped-matmul kernel, an MoE decoder LM;
# - test-time rerouting (Rewiring Experts on the Fly): router-bias fitting on the context, continuous rerouted generation;
# - RouterInterp: SAE-feature explanations of experts and their detection scores;
# - sparse data-constrained scaling (When Data Is Scarce): the law, its fit, the optimal density, dynamic sparse training.
#
# Set SMOKE=1 for a fast run.

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

# %% [markdown]
# ## The MoE layer: routing primitives, grouped matmul, and an MoE decoder LM
#
# `primitives.routing` holds the pure routing functions (router logits with an optional additive
# bias, top-k softmax gating, load-balancing and z-losses, confidence and entropy, dispatch
# metadata); `pallas_kernels.grouped_matmul` computes every expert in one grouped matmul over
# rows sorted by expert (a Pallas kernel on GPU/TPU, `jax.lax.ragged_dot` or a tiled XLA path on
# CPU); `models.moe.MoEFFN` plugs into the decoder LM's FFN slot with `ffn_type="moe"`.

# %%
import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels.grouped_matmul import grouped_matmul, reference as gmm_ref
from primitives import routing

key = jax.random.key(0)
x = jax.random.normal(key, (12, 8))  # 12 tokens, width 8
w_router = jax.random.normal(jax.random.key(1), (8, 4))  # 4 experts
logits = routing.router_logits(x, w_router)
r = routing.top_k_gating(logits, 2)  # top-2, gates renormalized over the two
print("experts of token 0:", np.asarray(r.indices[0]).tolist(), "gates:", [f"{g:.3f}" for g in np.asarray(r.gates[0])])
print(f"load-balance loss {float(routing.load_balancing_loss(r.probs, r.indices)):.3f} (1.0 = perfectly balanced)")

d = routing.dispatch_metadata(r.indices, 4)  # sort the 24 token-expert pairs by expert
rows = routing.sort_by_expert(x, d)
w_experts = jax.random.normal(jax.random.key(2), (4, 8, 16))
y = grouped_matmul(rows, w_experts, d.group_sizes)  # one matmul per expert over its rows
y_ref = gmm_ref.gmm_dense_reference(rows, w_experts, d.group_sizes)
print("group sizes:", np.asarray(d.group_sizes).tolist(), " max |grouped - dense reference|:",
      f"{float(jnp.max(jnp.abs(y - y_ref))):.1e}")

# %%
from flax import nnx

from models import MoEConfig, Transformer, TransformerConfig

cfg = TransformerConfig(vocab_size=32, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2, d_ff=64,
                        ffn_type="moe", moe=MoEConfig(num_experts=8, experts_per_token=2))
model = Transformer(cfg, rngs=nnx.Rngs(0))
tokens = jax.random.randint(jax.random.key(3), (2, 10), 0, 32)
out = model(tokens, return_intermediates=True)
aux = out.intermediates["ffn_aux"][0]
print("logits", out.logits.shape, "router logits of layer 0", aux["router_logits"].shape,
      f"aux loss {float(out.aux_loss):.3f}")
# An additive router bias per layer (the handle test-time rerouting adapts): zero leaves logits unchanged.
zero = jnp.zeros((cfg.num_layers, cfg.moe.num_experts))
print("zero bias is a no-op:", bool(jnp.array_equal(model(tokens, router_biases=zero).logits, out.logits)))

# %% [markdown]
# ## Test-time rerouting ("Rewiring Experts on the Fly")
#
# `algorithms.moe.rerouting` fits one additive router-logit vector per selected layer on the
# next-token loss of the context seen so far (weights frozen), picks the layers by routing
# confidence, and re-fits every `interval` generated tokens, recomputing the KV cache each time.
# On the untrained MoE model from above the numbers mean nothing; the experiment trains a tiny
# MoE LM on a mixture of synthetic domains and evaluates shifted prompts.

# %%
from algorithms.moe import rerouting as rr

prompts = np.asarray(jax.random.randint(jax.random.key(4), (2, 12), 3, 32), np.int32)
lengths = np.array([12, 9], np.int32)  # right-padded prompts
conf = rr.RerouteConfig(layers="confidence", rho=0.5, steps=3, learning_rate=5e-2, interval=4)
delta, info = rr.adapt_on_context(model, prompts, lengths, config=conf)  # the prefill round
print("adapted layers per sequence:", info.layer_mask.T.astype(int).tolist(),
      " context loss", [f"{v:.3f}" for v in info.loss_before], "->", [f"{v:.3f}" for v in info.loss_after])
out = rr.rerouted_generate(model, prompts, lengths, max_new_tokens=8, config=conf)
print("generated:", out.tokens.tolist(), f"({len(out.rounds)} adaptation rounds)")
# Baselines, sweeps and the verdict: `python -m experiments run moe_rerouting --preset quick`.

# %% [markdown]
# ## RouterInterp: explaining experts by unions of SAE features (SSH)
#
# "RouterInterp and the Superposed Specialisation Hypothesis" explains each expert by the set of
# sparse-autoencoder features whose union predicts routing to it, and scores explanations by how
# well a simulator that reads them detects routing on held-out tokens. `models.sae` trains the TopK
# SAE on router inputs; `algorithms.moe.router_interp` scores features against router rows
# (centred across experts), builds the greedy per-expert feature sets and runs the detection
# metrics and baselines. A planted world gives exact ground truth; here we use its true features
# (an oracle SAE) to keep the cell fast.

# %%
import jax
import numpy as np

from algorithms.moe import router_interp as ri

kw = dict(kind="ssh", num_sequences=150 if SMOKE else 600, seq_len=16, d_model=32, num_domains=4, vocab_size=48,
          num_groups=6, num_experts=8, num_noise_features=16)
train = ri.planted_world(jax.random.key(0), **kw)
test = ri.planted_world(jax.random.key(1), router_world=train, **{**kw, "num_sequences": kw["num_sequences"] // 2})
act_tr, act_te = train.codes > 0, test.codes > 0
align = ri.alignment_scores(train.router_w, train.directions, train.codes)  # [F, E], rows centred over experts
sets = ri.select_feature_sets(act_tr, train.labels, align, min_precision=0.6, target_recall=0.95, max_features=16)
print("expert 0: planted", sorted(train.planted_sets[0]), "recovered", sorted(sets[0].features))
ctx = ri.TokenContext(active=act_te, token_ids=test.token_ids, domain_ids=test.domain_ids,
                      prev_token_ids=test.prev_token_ids)
feat = ri.evaluate_explanations(ri.explain_experts(sets), ctx, test.labels)
tok = ri.evaluate_explanations(ri.token_statistics_explanations(train.token_ids, train.labels, train.vocab_size),
                               ctx, test.labels)
print(f"held-out balanced accuracy: feature sets {feat['mean']['balanced_accuracy']:.3f}, "
      f"token statistics {tok['mean']['balanced_accuracy']:.3f}")
# With a learned SAE and the tiny MoE LM: `python -m experiments run router_interp --preset quick`.

# %% [markdown]
# ## Sparse data-constrained scaling law and dynamic sparse training
#
# "When Data Is Scarce: Scaling Sparse Language Models with Repeated Training" (ICML 2026; no arXiv id
# found; code `boqian333/sparse-dc-scaling`) fits L(N, U, D, s) = E + A f(s)/N'^α + B/D'^β, where the
# density factor f(s) and the repetition decay constants R_N*(s), R_D*(s) depend on the density s.
# `algorithms.scaling.sparse_law` evaluates the law with the published constants, runs the paper's
# 4-stage Huber/L-BFGS fit and the loss- and compute-optimal density analyses;
# `algorithms.scaling.dynamic_sparse` trains the decoder LM with SET (magnitude prune, random regrow,
# zero re-init, Adam moments reset, cosine prune-rate decay) at an exact density.

# %%
from algorithms.scaling import sparse_law as law

# Delayed saturation: repeated epochs keep paying off longer for sparse models (R_D* larger than dense).
for s in (1.0, 0.5, 0.25, 0.0625):
    print(f"density {s:<6g} R_D* = {float(law.r_d_star(s)):.2f}  f(s) = {float(law.density_factor(s)):.3f}")
# Fixed data (U = 1.3B tokens, 16 epochs), fixed total parameters: the loss-optimal density is interior.
for n_total in (1e8, 2e9):
    s_star, l_star = law.loss_optimal_density(n_total, 1.3e9, 16)
    print(f"N_total={n_total:.0e}: loss-optimal density {s_star:.2f} (predicted loss {l_star:.3f})")
# Fixed compute (free N/D split): more unique data -> sparser is compute-optimal.
for u in (1.3e9, 1.3e10):
    print(f"U={u:.1e}: compute-optimal density at C=1e20: {law.compute_optimal_density(1e20, u, num_densities=24)[0]:.2f}")

# %%
import numpy as np

# The 4-stage fit recovers the constants from data generated by the law (0.1% noise).
rng = np.random.default_rng(0)
rows = [(nt * s, u, u, s) for nt in (2e7, 1.5e8, 2e9) for s in (1.0, 0.5, 0.25) for u in (3e10, 1.2e11)]
rows += [(nt * s, 2.6e8, ep * 2.6e8, s) for nt in (2e7, 1.5e8, 2e9) for s in (1.0, 0.5, 0.25) for ep in (2, 4, 8, 16)]
N, U, D, S = map(np.array, zip(*rows))
y = law.loss(N, U, D, S) * np.exp(1e-3 * rng.standard_normal(N.size))
small = {1: {"a": (2.0, 6.0), "b": (2.0, 6.0), "e": (0.0, 1.0), "alpha": (0.2, 0.6)},
         2: {"epsilon": (0.0,), "mu": (1.0,), "c": (-0.5, 0.0)}, 3: {"gamma1": (5.0, 15.0), "gamma2": (5.0,)},
         4: {"c11": (1.0,), "c12": (1.0,), "c21": (1.0,), "c22": (1.0,)}}
fit = law.fit_law(N, U, D, S, y, config=law.FitConfig(grids=small, maxiter=100 if SMOKE else 300))
print(f"alpha: fitted {fit.params.alpha:.4f} vs true {law.PUBLISHED.alpha:.4f}; R^2 {fit.r2:.4f}")
print("R_D*(s) fitted:", [round(float(law.r_d_star(s, fit.params)), 2) for s in (1.0, 0.5, 0.25)])

# %%
import jax
import numpy as np
from flax import nnx
from algorithms import training
from algorithms.scaling import dynamic_sparse as ds
from models import Transformer, TransformerConfig

cfg = TransformerConfig(vocab_size=16, d_model=16, num_layers=1, num_heads=2, num_kv_heads=1, d_ff=32)
# The pure functions: masks at an exact density, one SET prune/regrow step (regrown weights start at 0).
params = nnx.to_pure_dict(nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)), nnx.Param)[1])
masks = ds.init_masks(jax.random.key(0), params, 0.25)
params = ds.apply_masks(params, masks)
params, masks, regrown, pruned = ds.prune_and_regrow(jax.random.key(1), params, masks, 0.1)
flags = ds.sparse_leaves(params)
print(f"mask density {ds.mask_density(masks, flags):.4f}; pruned = regrown = {ds.count_nonzero(regrown)} entries")

if not SMOKE:  # the driver: masked Adam steps, prune/regrow every 25 steps with a cosine-decayed rate
    steps = 200
    opt = training.OptimizerConfig(learning_rate=1e-2, warmup_steps=2, total_steps=steps, weight_decay=0.0,
                                   clip_norm=None)

    def batch_fn(i):  # learnable sequences: +1 mod 16 from a random start
        x = (np.random.default_rng(i).integers(0, 16, (8, 1)) + np.arange(17)) % 16
        return {"inputs": x[:, :-1], "targets": x[:, 1:], "loss_mask": np.ones((8, 16), np.float32)}

    res = ds.train_dst(model_fn=lambda r: Transformer(cfg, rngs=r), optimizer_config=opt, batch_fn=batch_fn,
                       num_steps=steps, density=0.25, update_frequency=25, progress=False)
    print(f"non-zeros in sparse matrices: {res.nnz}/{res.num_sparse} (target density 0.25), "
          f"final train loss {res.history[-1]['loss']:.3f}")
# Full grid, law fit and verdict: `python -m experiments run sparse_scaling --preset quick`.
