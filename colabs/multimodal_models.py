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
# # Multimodal models: a small VLM, Hyper-ICL, staged perception training, PRIM token compression
#
# How to call the methods of issue 30's papers and read their results:
#
# - the small vision(-audio)-language model (`models.vlm`): a ViT and an audio-frame encoder projected
#   into the decoder LM's token space at placeholder tokens, on generated scenes of shapes with aligned
#   tones and exact-answer questions (`experiments.tasks.scenes`);
# - Hyper-ICL (`algorithms.alignment.hyper_icl`): a low-rank, query-gated calibration of the attention
#   logits, distilled from an in-context teacher with a Lorentz-model anchor loss (`primitives.hyperbolic`);
# - staged perception -> reasoning RL (`algorithms.rl.staged_perception`): GRPO on the VLM with stage
#   schedules against merged training at equal rollouts;
# - PRIM (`algorithms.compression.prim`, reconstructed from the abstract): text-conditioned,
#   frequency-aware pruning of audio and video tokens before the LM and attention-guided retention inside it.
#
# Each section calls the method on tiny inputs, then reads the experiment's stored quick result.
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
# ## 1. Scenes and the small VLM
#
# A scene is a 3 x 3 board of shapes; its image is rendered at 24 x 24 and its "audio" has one frame per
# cell (a tone whose frequency names the colour of a sounding object). Questions are answered exactly by
# counting. The VLM replaces the k-th `<image>` placeholder by the k-th patch embedding (and likewise
# for `<audio>`); with no placeholders it is the plain LM.

# %%
from experiments.tasks import scenes as sc
from models.transformer import TransformerConfig
from models.vit import ViTConfig
from models.vlm import VLM, VLMConfig

tok = sc.make_tokenizer()
IMG, AUD = tok.encode(sc.IMAGE_TOKEN)[0], tok.encode(sc.AUDIO_TOKEN)[0]
batch = sc.make_batch(4, seed=0, image_tokens=16, audio_tokens=9, kinds=("count", "audio_visual", "compose"))
for q, a in zip(batch["questions"][:3], batch["answers"][:3]):
    print(f"{sc.question_text(q)!r} -> {a}")

lm = TransformerConfig(vocab_size=tok.vocab_size, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2, d_ff=64)
vit = ViTConfig(image_size=24, patch_size=6, channels=3, num_classes=1, d_model=16, num_heads=2, d_ff=32,
                num_layers=1, pooling="mean")
vlm = VLM(VLMConfig(lm=lm, vit=vit, image_token_id=IMG, audio_token_id=AUD, audio_frames=9, audio_frame_len=16),
          rngs=nnx.Rngs(0))
prompt_lengths = jnp.asarray(batch["prompt_lengths"])
tokens = jnp.asarray(batch["tokens"][:, :int(prompt_lengths.max())])
images, audio = jnp.asarray(batch["images"])[:, None], jnp.asarray(batch["audio"])[:, None]
out = vlm(tokens, images=images, audio=audio)
print("logits", out.logits.shape, "| untrained greedy answer ids:",
      vlm.generate_greedy(tokens, prompt_lengths, max_new_tokens=2, images=images, audio=audio).tolist())

# %% [markdown]
# ## 2. Hyper-ICL: calibrating attention logits instead of reading demonstrations
#
# Per layer and head, `S~ = S + Diag(g) (Q U_q)(K U_k)^T / sqrt(r)` with a per-token gate `g`. With
# `U_k = 0` (the initialization) the student is exactly the base model. The anchor loss compares the
# student's and the in-context teacher's hidden states as points on a hyperboloid.

# %%
from algorithms.alignment import hyper_icl
from primitives import hyperbolic

text_lm = vlm.lm
ids = jnp.asarray(np.random.default_rng(0).integers(1, tok.vocab_size, (2, 6)), jnp.int32)
adapter = hyper_icl.init_adapter(jax.random.key(0), num_layers=lm.num_layers, num_heads=lm.num_heads,
                                 head_dim=lm.resolved_head_dim, rank=4)
base = hyper_icl.forward(text_lm, ids)
student = hyper_icl.forward(text_lm, ids, adapter)
print("U_k = 0 leaves the model unchanged:", bool(jnp.all(base.logits == student.logits)))
adapter["u_k"] = 0.3 * jax.random.normal(jax.random.key(1), adapter["u_k"].shape)
moved = hyper_icl.forward(text_lm, ids, adapter)
print("a trained-like U_k moves the logits by", float(jnp.max(jnp.abs(moved.logits - base.logits))))
p = hyperbolic.expmap0(jnp.array([0.0, 0.3, -0.2]), curvature=0.1)
q = hyperbolic.expmap0(jnp.array([0.0, -0.1, 0.4]), curvature=0.1)
print("Lorentz distance", float(hyperbolic.distance(p, q, curvature=0.1)),
      "| anchor loss (base vs calibrated states)", float(hyper_icl.hyperbolic_anchor_loss(base.hidden, moved.hidden)))

# %%
hyper_icl_result = report.show_result("hyper_icl", rerun=RUN_EXPERIMENTS)

# %% [markdown]
# ## 3. Staged perception then reasoning
#
# A schedule visits its stages in order (the vision tower frozen in the text-reasoning stage); merged
# training draws the same prompts, pooled and shuffled, for the same number of iterations. The reward is
# accuracy of the boxed answer plus a format term.

# %%
from algorithms.rl import staged_perception as sp

staged = sp.staged_schedule(("perception", "text_reasoning", "visual_reasoning"),
                            {"perception": 10, "text_reasoning": 40, "visual_reasoning": 50})
merged = sp.merged_schedule(staged)
print("staged:", [(s.name, s.iterations, "vision trains" if s.train_vision else "vision frozen") for s in staged.stages])
print("merged:", [(s.name, s.iterations) for s in merged.stages], "pooled from", [s.name for s in merged.pooled])
for completion in ("<think> two red </think> \\boxed 2", "\\boxed 2", "<think> </think> \\boxed 3"):
    print(f"reward({completion!r}, answer 2) = {sp.staged_reward(completion, '2'):.2f}")
# The perception data filter keeps what every filter model gets wrong from the image but right from a
# caption; the difficulty curriculum orders prompts easy -> hard by sampled pass rate (ties shuffled).
print("filter keeps:", sp.perception_filter(np.array([[0.0, 1.0, 0.0]]), np.array([[1.0, 1.0, 0.0]])))
print("easy -> hard:", sp.difficulty_order(np.array([0.25, 1.0, 0.75, 0.5])))

# %%
staged_result = report.show_result("staged_vlm", rerun=RUN_EXPERIMENTS)

# %% [markdown]
# ## 4. PRIM: pruning audio-visual tokens at equal budgets
#
# Every plan keeps all text tokens and a budget of the 25 audio-visual tokens; the pruned forward runs
# the LM on the kept tokens only (original positions). Uniform pruning keeps evenly spaced tokens; PRIM
# ranks them by the question's attention and their high-frequency energy; with `PRIMConfig(merge=...)`
# the pruned tokens are folded into their most similar kept token instead of dropped. `pruned_forward`
# also prunes inside the LM (`in_lm=`: cumulative-mass retention at one or several layers, the pyramid,
# or the epsilon drop rule); the `prim` experiment compares all of them at equal budgets.

# %%
from algorithms.compression import prim

layout = prim.layout_from_tokens(tokens, image_token_id=IMG, audio_token_id=AUD)
pos = np.arange(tokens.shape[1])[None]
query_mask = jnp.asarray((layout.modality[None] == prim.TEXT) & (pos >= 1) & (pos < np.asarray(prompt_lengths)[:, None]))
x = vlm.embed(tokens, images, audio)
query_pos = prompt_lengths - 1
full = out.logits[jnp.arange(4), query_pos]
for fraction in (1.0, 0.25):
    for name, plan in (("uniform", prim.uniform_plan(x, layout, fraction)),
                       ("PRIM", prim.prim_plan(vlm, x, layout, fraction, query_mask)),
                       ("PRIM+merge", prim.prim_plan(vlm, x, layout, fraction, query_mask,
                                                     config=prim.PRIMConfig(merge="similarity")))):
        res = prim.pruned_forward(vlm, plan, layout, query_pos)
        gap = float(jnp.max(jnp.abs(res.logits - full)))
        print(f"keep {fraction:.2f} {name:10s}: {plan.keep.shape[1]} of {tokens.shape[1]} tokens, "
              f"max logit change vs full {gap:.3f}")

# %%
prim_result = report.show_result("prim", rerun=RUN_EXPERIMENTS)
