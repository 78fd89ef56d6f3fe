# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Long-context decoding: the Pallas core and Faster Flash Decoding (issue 3)
#
# How to call the kernel core and FFD and read their results:
#
# 1. **Faster Flash Decoding** (`primitives.ffd`, `algorithms.decoding.ffd`, `pallas_kernels.ffd_decode`): 2-bit key
#    scan, top-delta page selection, exact attention over the kept pages; the global top-k and Quest baselines.
# 2. **Quantized KV cache** (`primitives.quantization`, `pallas_kernels.kv_quant`): group-wise 2/4/8-bit codes and
#    decode attention that dequantizes each tile.
#
# The full reproduction is `python -m experiments run ffd`; kernel timings come from `python -m pallas_kernels.bench`.

# %%
import os
import sys

REPO_URL = os.environ.get("ICML26_REPO_URL", "")
if "google.colab" in sys.modules and REPO_URL:
    import subprocess

    subprocess.run([sys.executable, "-m", "pip", "install", "-q", f"git+{REPO_URL}"], check=True)

# %% tags=["parameters"]
SMOKE = os.environ.get("SMOKE", "0") == "1"

# %% [markdown]
# ## Faster Flash Decoding (FFD): top-delta page selection over 2-bit keys
#
# Liu et al., ICML 2026. The FFD cache (`primitives.ffd.build_cache`) pages the keys, stores a 2-bit
# code per key channel (per-page per-channel scales) plus a residual, keeps values exact and the
# current incomplete page exact. A decode step scans the codes, takes a reference maximum from the
# first and the last full page only, keeps every page whose best scan score is within `delta`
# (log2 units) of it, and attends exactly to the kept pages.

# %%
import math

import jax
import jax.numpy as jnp
import numpy as np

from algorithms.decoding import ffd
from primitives import ffd as ffd_ref

tokens = 1024 if SMOKE else 16384
problem = ffd_ref.synthetic_problem(jax.random.key(0), batch=1, tokens=tokens, kv_heads=4, group=4, head_dim=64,
                                    page_size=128, peaked_fraction=0.5, needle_gap=10.0, sink_gap=12.0)
cache = ffd_ref.build_cache(problem.keys, problem.values, problem.lengths, page_size=128)
exact = ffd_ref.dense_decode(problem.q, problem.keys, problem.values, problem.lengths)
print("peaked KV heads:", np.asarray(problem.peaked)[0], " codes", cache.codes.shape, cache.codes.dtype)

# %%
def rel_err(out):
    return float(jnp.max(jnp.linalg.norm(out - exact, axis=-1) / jnp.linalg.norm(exact, axis=-1)))


for delta in (2.0, 5.0, 10.0):
    out = ffd.decode(problem.q, cache, delta=delta)           # XLA fast path: gathered kept pages
    per_head = np.asarray(out.keep).mean(-1)[0]
    print(f"delta={delta:4.1f}  kept per KV head {np.round(per_head, 2)}  max rel error {rel_err(out.out):.2e}")
print("delta in natural-log units 5 ->", round(ffd_ref.delta_from_natural(5.0), 3), "log2 units")

# %% [markdown]
# The budget baselines take the same average number of pages everywhere: global top-k by scan maximum,
# and Quest's per-page min/max key bound. Top-delta keeps few pages on the peaked heads and all of them
# on the flat heads, which is where a fixed budget loses (the paper's distribution-adaptivity claim).

# %%
sel = ffd.select_pages(problem.q, cache, delta=5.0)
budget = ffd.pages_for_fraction(cache, float(ffd_ref.kept_fraction(sel.keep, cache)))
for selector in ("top_k", "quest"):
    out = ffd.decode(problem.q, cache, selector=selector, num_pages=budget, capacity=budget)
    print(f"{selector:6s} {budget} pages per head: max rel error {rel_err(out.out):.2e}")

# %% [markdown]
# The fused Pallas kernel makes the same selection; on a CPU it runs in the interpreter (slow, exact).
# On a GPU or TPU drop `interpret=True`. The decoder LM routes its decode steps through FFD with
# `TransformerConfig(decode_attention="ffd", ffd_delta=..., ffd_page_size=...)`.

# %%
from pallas_kernels.ffd_decode import FFDBlockSizes, ffd_decode as ffd_kernel

small = ffd_ref.build_cache(problem.keys[:, :128], problem.values[:, :128], jnp.array([120]), page_size=32)
got = ffd_kernel(problem.q, small, delta=5.0, implementation="pallas_triton", interpret=True,
                 block_sizes=FFDBlockSizes(num_splits=2))
want = ffd_ref.ffd_decode(problem.q, small, delta=5.0)
print("kernel == reference:", bool(jnp.allclose(got.out, want.out, atol=1e-5)),
      "same pages:", bool(jnp.all(got.keep == want.keep)))


# %% [markdown]
# ## Quantized KV cache: group-wise codes and decode attention over packed K/V
#
# `primitives.quantization.quantize` cuts the last axis into groups of `group_size` channels, stores one
# scale (and, asymmetric, one zero point) per group and packs 2, 4 or 8-bit codes into bytes. The
# rounding is defined bit-exactly by the reference, so the Pallas quantize kernel must reproduce its
# codes exactly. `pallas_kernels.kv_quant.quantized_decode_attention` reads the packed cache and
# dequantizes each tile inside the split-K loop.

# %%
from pallas_kernels import kv_quant
from primitives import attention as attn
from primitives import quantization as qz

S = 128 if SMOKE else 2048
kk, kv, kq = jax.random.split(jax.random.key(1), 3)
k = jax.random.normal(kk, (1, S, 2, 64))
v = jax.random.normal(kv, (1, S, 2, 64))
q = jax.random.normal(kq, (1, 8, 64))                      # 8 query heads over 2 KV heads
lengths = jnp.array([S - 3])
exact = attn.decode_attention(q, k, v, lengths)
for bits in (2, 4, 8):
    kt, vt = (qz.quantize(x, bits=bits, group_size=32, scheme="asymmetric") for x in (k, v))
    out = kv_quant.quantized_decode_attention(q, kt, vt, lengths, implementation="xla")
    err = float(jnp.max(jnp.linalg.norm(out - exact, axis=-1) / jnp.linalg.norm(exact, axis=-1)))
    print(f"{bits}-bit: {kt.bits_per_element:.2f} stored bits per element, decode rel error {err:.3f}")

# %% [markdown]
# The quantize kernel in the interpreter gives the reference's codes bit for bit:

# %%
x = jax.random.normal(jax.random.key(2), (8 if SMOKE else 40, 64))
ref_qt = qz.quantize(x, bits=4, group_size=32)
ker_qt = kv_quant.quantize(x, bits=4, group_size=32, implementation="pallas_triton", interpret=True)
print("codes identical:", bool(jnp.all(ref_qt.codes == ker_qt.codes)),
      " scales identical:", bool(jnp.all(ref_qt.scale == ker_qt.scale)))
