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
# # RL post-training of LLMs
#
# How to call this library's on-policy RL engine and the RL-area papers built on it:
#
# - the GRPO engine and its pure losses;
# - Differential Smoothing: the DS advantage, an exact tabular toy, and the CountDown experiment;
# - IsoCompute: iso-compute sweeps, the compute-optimal frontier and a GRPO bandit surrogate;
# - SCM-GRPO: dependency-graph outputs, their checks and the rule-based structural reward;
# - N-MARS: the <UNDO> token, its rendering, augmentation, masked SFT and reward.
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
# ## Library map for RL post-training
#
# `primitives.policy_losses` holds the pure losses (group-normalized advantages, the clipped
# surrogate, KL estimators, pass@k); `algorithms.rl.grpo` is the on-policy engine shared by the
# RL papers (rollouts from the decoder LM, verifiable rewards from `experiments.tasks`, one
# GRPO step); each paper's method is a hook on top of that engine.

# %% [markdown]
# ## Differential Smoothing (DS-GRPO) on the GRPO engine
#
# "Differential Smoothing Mitigates Sharpening and Improves LLM Reasoning" (Gai, Zeng, Zhang, Raghunathan,
# arXiv:2511.19942) keeps GRPO but changes the advantage only by a stop-gradient log-prob term:
# A_i - gamma_p log pi_old(y_i) on correct samples (rarer correct solutions are rewarded more) and
# A_i + gamma_n log pi_old(y_i) on incorrect ones (the incorrect mass is sharpened). `algorithms.rl.grpo`
# is the shared on-policy engine (rollouts, verifiable rewards, clipped surrogate, KL, entropy terms);
# `algorithms.rl.differential_smoothing` holds the DS advantage hook, the entropy baselines and an exact
# tabular toy with closed-form expected updates and KL-regularized optima.

# %%
import jax.numpy as jnp
import numpy as np

from algorithms.rl import differential_smoothing as ds
from primitives import policy_losses

rewards = jnp.array([[1.0, 1.0, 0.0, 0.0]])  # one group: two correct, two incorrect samples
seq_logp = jnp.log(jnp.array([[0.5, 0.05, 0.5, 0.05]]))  # a likely and a rare sample of each kind
print("GRPO advantages:", np.round(np.asarray(policy_losses.group_advantages(rewards)), 3).tolist())
print("DS advantages:  ", np.round(np.asarray(ds.ds_advantages(rewards, seq_logp, gamma_p=0.1, gamma_n=0.05)), 3).tolist())
print("pass@8 from 64 samples with 3 correct:", float(policy_losses.pass_at_k(64, 3, 8)).__round__(3))

# %%
import jax
import matplotlib.pyplot as plt
import numpy as np

# Exact tabular toy: 64 trajectories, 16 correct, a skewed base policy; expected-update dynamics.
rng = np.random.default_rng(0)
logits = jnp.asarray(rng.normal(0, 2, 64), jnp.float32)
correct = jnp.asarray(np.isin(np.arange(64), rng.permutation(64)[:16]))
steps = 60 if SMOKE else 500
runs = {"GRPO": {}, "entropy bonus 0.3": {"entropy_coef": 0.3}, "entropy penalty 0.3": {"entropy_coef": -0.3},
        "DS gamma_p=1": {"gamma_p": 1.0}}
fig, axes = plt.subplots(1, 2, figsize=(9, 3))
for name, kw in runs.items():
    _, traj = ds.tabular_train(logits, correct, num_steps=steps, learning_rate=1.0, group_size=8, ks=(64,), **kw)
    axes[0].plot(traj.correct_mass, label=name)
    axes[1].plot(traj.distinct_correct[:, 0], label=name)
    print(f"{name:20s} C={float(traj.correct_mass[-1]):.3f}  E[distinct correct in 64]="
          f"{float(traj.distinct_correct[-1, 0]):.2f}")
axes[0].set(xlabel="step", ylabel="correct mass (pass@1)")
axes[1].set(xlabel="step", ylabel="distinct correct in 64 samples")
axes[0].legend(fontsize=7)
plt.show()

# %%
# The KL-regularized optimum pi_base * exp(r_DS / beta) / Z: uniform over correct answers when gamma_p = beta.
log_base = jax.nn.log_softmax(logits)
r = correct.astype(jnp.float32)
for gp in (0.0, 0.5, 1.0):
    p = ds.kl_regularized_optimum(log_base, ds.ds_reward(r, log_base, correct, gamma_p=gp, gamma_n=0.5), 1.0)
    m = ds.tabular_metrics(p, correct, ks=(64,))
    print(f"gamma_p={gp}: correct mass {float(m.correct_mass):.3f}, effective # correct "
          f"{float(m.effective_correct):.2f} (of 16)")

# %%
# The full reproduction (tabular toy + CountDown with a tiny transformer: SFT, then GRPO / DS / entropy arms).
import pathlib
import tempfile

from experiments import report

# The tests run every experiment's smoke preset on their own (tests/experiments/smoke_test.py), so a
# SMOKE run of this notebook only prints the command; otherwise this runs the quick preset
# (about 2 minutes on 2 CPU cores).
if SMOKE:
    print("python -m experiments run differential_smoothing --preset quick")
else:
    result = report.run_experiment("differential_smoothing", "quick", workdir=pathlib.Path(tempfile.mkdtemp()))
    print(result["verdict"])

# %% [markdown]
# ## IsoCompute: compute-optimal rollouts per problem
#
# "IsoCompute Playbook" (arXiv:2603.12151) splits a budget of C rollouts as C = n * B_p * M (rollouts
# per problem, problems per batch, update steps) and finds that the best n rises with C and then
# saturates. `algorithms.rl.compute_allocation` holds the sweep generator, the frontier, the
# saturating fit and a softmax-bandit surrogate of GRPO with Monte-Carlo and exact expected updates.

# %%
from algorithms.rl import compute_allocation as ca

# Why small n fails on hard problems: a group with only failures (or only successes) has zero advantage.
for n in (1, 4, 16, 64):
    print(f"n={n:3d}: P(group has a learning signal) at p=0.01: {float(ca.non_degenerate_prob(n, 0.01)):.3f}")
cfgs = ca.iso_compute_configs([2**10], [1, 4, 16, 64], [4, 16])
print("iso-compute configs for C=1024 (n, B_p, M):", [(c.n, c.num_problems, c.steps) for c in cfgs])

bandit = ca.make_bandit(jax.random.key(0), np.full(16, 0.05), num_answers=8, dim=8)
for n in (1, 4, 16):
    out = ca.train_bandit(jax.random.key(1), bandit, n=n, num_problems=8, steps=2**12 // (n * 8))
    print(f"C=4096, n={n:2d}: best mean correct mass {float(out['best']):.3f}")
# The full frontier on the bandit and on a tiny LM doing arithmetic, easy and hard splits:
# `python -m experiments run rl_compute_allocation --preset quick`.

# %% [markdown]
# ## SCM-GRPO: rule-based rewards on explicit dependency graphs
#
# Bu et al., *Grounding Multi-Hop Reasoning in Structural Causal Models via Group Relative Policy
# Optimization* (arXiv:2605.01482). For multi-hop fact verification the policy first writes a
# directed dependency graph (nodes = facts / intermediate conclusions, edges = "depends on", one sink
# `C` = the claim) and then a SUPPORTS / REFUTES verdict. GRPO is trained on a rule-based reward:
# a format gate (-1 if the output does not parse, has a cycle or a dangling edge, or a node that does not
# reach `C`), the label, and a label-gated depth term `g(d) = exp(-(d - d*)^2 / 2s^2)` that peaks at
# the claim's hop count `d*`, minus a conciseness penalty. The paper's exact reward was not available:
# `algorithms.rl.scm_grpo` implements our spec's design as a pluggable pure function.

# %%
from algorithms.rl import scm_grpo as scm

text = """<graph>
N1: e3 born_in e7
N2: e7 capital_of e2
N3: e3's birthplace is the capital of e2
E: N1 -> N3 ; N2 -> N3 ; N3 -> C
</graph>
<answer>SUPPORTS</answer>"""
parsed = scm.parse_graph_text(text)
print(parsed.graph, parsed.answer, "depth", scm.graph_depth(parsed.graph))

# The compact grammar of the CPU experiment: the entity reached after each hop, then the verdict.
for out in ["e4 e1 e6 | S", "e4 e1 | S", "e4 e1 e6 | R", "e4 e1 e4 | S", "e4 e1"]:
    p = scm.parse_compact(out)
    terms = scm.reward_terms(p, gold="SUPPORTS", hops=3)
    label_only = scm.scm_reward(p, gold="SUPPORTS", hops=3, config=scm.label_only_config())
    print(f"{out!r:18} reward {terms.reward:+.3f} (label-only {label_only:+.1f})  depth {terms.depth}  "
          f"error {terms.error}")

# %%
# The experiment: SFT on noisy-length chains, the accuracy-vs-chain-length diagnostic, then GRPO with the
# label-only vs the structural reward.
import pathlib
import tempfile

from experiments import report

# The tests run every experiment's smoke preset on their own (tests/experiments/smoke_test.py), so a
# SMOKE run of this notebook only prints the command; otherwise this runs the quick preset
# (about 4 minutes on 2 CPU cores).
if SMOKE:
    print("python -m experiments run scm_grpo --preset quick")
else:
    result = report.run_experiment("scm_grpo", "quick", workdir=pathlib.Path(tempfile.mkdtemp()))
    print(result["verdict"])

# %% [markdown]
# ## N-MARS: an <UNDO> token for non-monotonic decoding
#
# "N-MARS: Non-Monotonic AutoRegressive Sequence modelling with an <UNDO> token" (ICML 2026) adds one
# token, <UNDO>, that retracts the previous output token. The raw stream stays append-only (the model
# keeps its erased tokens in context); the output is *rendered* with a stack (an <UNDO> pops, a no-op on
# an empty output, the prompt is never erased). Training: sequence augmentation from the model's own
# deviations (y*_{<t} + deviation + <UNDO>^k + y*_{>=t}), masked SFT (no loss on the deviation tokens),
# then GRPO with a reward for correct rendered outputs, a bonus for effective <UNDO>s and a penalty for
# ineffective ones (the reward's exact form is our inference). `algorithms.rl.nmars` holds all of it;
# `experiments/nmars.py` compares plain SFT, unmasked augmentation, masked SFT and masked SFT + GRPO on
# sorting lists of numbers (most-significant-digit-first addition is an option, `task="msd_addition"`).

# %%
import numpy as np

from algorithms.rl import nmars

UNDO = 9
print(nmars.render([4, 7, 8, UNDO, UNDO, 5, 6], UNDO))      # [4, 5, 6]: two UNDOs erase the deviation 7 8
print(nmars.render([UNDO, 4, UNDO, UNDO, 5], UNDO))         # [5]: an UNDO on an empty output is a no-op
print(nmars.render([1, 3, UNDO, UNDO], UNDO, protected=1))  # [1]: the prompt (here 1 token) is protected

# %%
# Augmentation + masked-SFT loss mask. Any `logits_fn(tokens [b, T]) -> logits [b, T, v]` can deviate;
# here a stand-in "model" whose greedy guess is always token 5, so the hard positions are where y* != 5.
rng = np.random.default_rng(0)
tokens = np.array([[1, 3, 4, 6, 7, 8, 2, 0],   # BOS, prompt (3 4), answer (6 7 8), EOS, pad
                   [1, 5, 5, 5, 6, 5, 2, 0]])
fake_logits = lambda t: np.where(np.arange(11) == 5, 10.0, 0.0) + rng.normal(size=t.shape + (11,))
out = nmars.augment_batch(fake_logits, tokens, np.array([3, 3]), np.array([4, 4]), undo_id=10,
                          rng=np.random.default_rng(1), allowed_ids=range(3, 9), augment_fraction=1.0)
for i in range(2):
    z = out["tokens"][i, : out["lengths"][i]]
    print("z =", z.tolist(), " render ->", nmars.render(z[3:], 10), " loss mask on targets:",
          out["loss_mask"][i, : out["lengths"][i] - 1].astype(int).tolist())

# %%
# The GRPO reward: 1[correct] + alpha * effective UNDOs (if correct) - beta * ineffective UNDOs.
reward_fn = nmars.make_reward_fn(lambda problem: problem, undo_id=UNDO, eos_id=2, alpha=0.1, beta=0.05)
ref = [4, 5, 6]
rollouts = np.array([[4, 5, 6, 2, 0, 0],          # correct, no UNDO           -> 1.0
                     [4, 7, UNDO, 5, 6, 2],       # erased a wrong token       -> 1.1
                     [4, 5, UNDO, 5, 6, 2],       # erased a correct token     -> 0.95
                     [4, 7, UNDO, 5, 7, 2]])      # effective UNDO, still wrong -> 0.0
print(reward_fn([ref] * 4, rollouts, np.array([4, 6, 6, 6])))
print(nmars.undo_metrics(rollouts, np.array([4, 6, 6, 6]), [ref] * 4, undo_id=UNDO, eos_id=2))

# %%
# The reproduction: (A) plain SFT, (B) SFT on augmented traces without masking, (C) masked SFT,
# (D) C + GRPO, on sorting 8 numbers from [0, 50).
import pathlib
import tempfile

from experiments import report

# The tests run every experiment's smoke preset on their own (tests/experiments/smoke_test.py), so a
# SMOKE run of this notebook only prints the command; otherwise this runs the quick preset
# (about 4 minutes on 2 CPU cores).
if SMOKE:
    print("python -m experiments run nmars --preset quick")
else:
    result = report.run_experiment("nmars", "quick", workdir=pathlib.Path(tempfile.mkdtemp()))
    print(result["verdict"])
