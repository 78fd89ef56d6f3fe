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
# # Quickstart: the decoder LM, training, generation, checkpoints
#
# This notebook builds the library's decoder LM, trains it for a few steps on
# multi-digit addition, generates answers, and saves and restores a checkpoint.
# Everything it calls is public API (`models`, `algorithms`, `experiments.tasks`);
# the same code runs on CPU, GPU and TPU.

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
NUM_STEPS = 8 if SMOKE else 1500
D_MODEL = 32 if SMOKE else 128

# %%
import pathlib
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from algorithms import training
from algorithms.decoding import generate
from experiments.tasks import ArithmeticTask, prompt_batch
from models import Transformer, TransformerConfig
from primitives.sampling import Sampler

print("JAX", jax.__version__, "on", jax.default_backend(), "with", jax.device_count(), "device(s)")

# %% [markdown]
# ## 1. A task and a model
#
# `ArithmeticTask` writes problems like `"123+45="` with answers least-significant
# digit first; train and test problems are disjoint by a hash split. The model is a
# LLaMA-style decoder: RMSNorm, GQA attention with RoPE, a gated FFN.

# %%
task = ArithmeticTask(num_digits=2 if SMOKE else 3, reverse_answer=True)
tok = task.tokenizer()
config = TransformerConfig(vocab_size=tok.vocab_size, d_model=D_MODEL, num_layers=2, num_heads=4,
                           num_kv_heads=2, d_ff=3 * D_MODEL)
model = Transformer(config, rngs=nnx.Rngs(0))
print(f"{config.num_params():,} parameters; example problem:", task.sample(1, split="train", seed=0))

# %% [markdown]
# ## 2. Train
#
# `training.fit` runs the pure, jitted train step (AdamW, warmup + cosine,
# clipping), checkpoints into `workdir` and resumes from it if interrupted. Pass
# `mesh_config=training.MeshConfig(data=-1)` to shard the batch over all devices.

# %%
workdir = pathlib.Path(tempfile.mkdtemp())
run = training.fit(
    model_fn=lambda rngs: Transformer(config, rngs=rngs),
    optimizer_config=training.OptimizerConfig(learning_rate=3e-3, warmup_steps=min(100, NUM_STEPS),
                                              total_steps=NUM_STEPS),
    batch_fn=lambda position: task.train_batch(position, batch_size=64, seq_len=task.max_seq_len),
    num_steps=NUM_STEPS,
    workdir=workdir,
    checkpoint_every=max(NUM_STEPS // 2, 1),
    log_every=max(NUM_STEPS // 10, 1),
    progress=not SMOKE,
)
model = run.model()
print("loss by step:", [(h["step"], round(h["loss"], 3)) for h in run.history])

# %% [markdown]
# ## 3. Generate
#
# `generate` prefills right-padded prompts into a KV cache and decodes in one
# compiled `lax.while_loop`, stopping each row at EOS.

# %%
prompts, answers = task.sample(8, split="test", seed=1)
batch = prompt_batch(tok, prompts, seq_len=max(len(p) for p in prompts) + 1)
out = generate(model, jnp.asarray(batch["tokens"]), prompt_lengths=jnp.asarray(batch["prompt_lengths"]),
               max_new_tokens=task.num_digits + 3, stop_tokens=(tok.eos_id,))
for p, a, row in zip(prompts, answers, np.asarray(out.tokens)):
    guess = tok.decode(row)
    print(f"{p:>10s} {guess:>6s}  (answer {a}) {'ok' if task.is_correct(p, guess) else ''}")

# Sampling instead of greedy: temperature and nucleus filtering.
sampled = generate(model, jnp.asarray(batch["tokens"]), prompt_lengths=jnp.asarray(batch["prompt_lengths"]),
                   max_new_tokens=task.num_digits + 3, stop_tokens=(tok.eos_id,),
                   sampler=Sampler(temperature=0.8, top_p=0.9), key=jax.random.key(0))
print("sampled:", [tok.decode(r) for r in np.asarray(sampled.tokens)])

# %% [markdown]
# ## 4. Save and restore a checkpoint
#
# `training.Checkpointer` wraps orbax: it stores the train state with JSON
# metadata (data position, metric history) and restores onto the same shardings.

# %%
ckpt = training.Checkpointer(workdir / "ckpt")
print("checkpoints saved at steps:", ckpt.all_steps())
restored, meta = ckpt.restore(run.state)
ckpt.close()
same = jax.tree.all(jax.tree.map(lambda a, b: bool(jnp.array_equal(a, b)), restored.params, run.state.params))
print("restored step", int(restored.step), "| data position", meta["data_position"], "| params equal:", same)
assert same
