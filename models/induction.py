"""A long-context test LM whose weights are set by hand: a two-layer induction circuit that copies spans.

Dimension legend: ``D`` model width, ``C`` token-code width, ``Rd`` record-code width, ``v`` vocabulary,
``d`` head dim, ``R`` record size.

Sparse decoding methods (Vegas, FFD, Quest) only mean something on a model whose attention really
retrieves from far back. Training one from scratch on a 2-core CPU stays on the induction plateau, so
this module *constructs* one: a plain `models.Transformer` (2 layers, 2 heads, RoPE, RMSNorm, zero
FFNs) whose weights implement the textbook induction circuit exactly, deterministic from its
arguments, built in about a second, no training.

Residual stream layout (``D = 3C + 1 + Rd``): ``[code (C) | const (1) | prev (C) | out (C) | rec (Rd)]``.

  * Embedding: token ``t`` writes a random +-1 code ``c_t`` (C dims), a constant 1, and (record
    models) the +-1 code ``a_r`` of its record ``r = (t - NUM_SPECIAL) // R`` (specials: their own).
  * Layer 1, heads 0 and 1 (identical previous-token heads, each writing half): query and key both
    read the constant dim into the fast RoPE pairs (``theta_i >= 2.5e-4``), the query pre-rotated
    by ``-theta_i``, so the logit is ``gain * sum_i cos((delta - 1) theta_i)`` over query-key
    distance ``delta``: largest at ``delta = 1`` with a margin of ``prev_margin`` nats over every
    other key up to 17k tokens back. The value copies the code into the ``prev`` slot.
  * Layer 2, head 0 (induction head; without a record head, head 1 is an identical copy and each
    writes half, so that no head of the model attends uniformly): query = the current code, key =
    the ``prev`` slot, on the slow RoPE pairs (``theta_i <= 1e-5``, so position barely matters): it
    attends to the position *after* the earlier occurrence of the current token and copies that
    position's code into ``out``.
  * Layer 2, head 1 (record head, ``record_size > 0``): query and key = the record code: it attends
    uniformly to every token of the current token's record, for as long as the copy stays inside
    that record, and adds ``record_weight`` times their mean code to ``out`` (a bias towards the
    record's tokens, the way a topic head would).
  * Unembedding: ``logit_v = unembed_gain * c_v . out`` (after the final RMSNorm).
  * RMSNorm scales stay 1; each norm's factor ``sqrt(D / |x|^2)`` is known from the layout and folded
    into the weights that read the normalised stream.

On the span-copy task (`experiments.tasks.span_copy`: distinct item tokens, then ``QUERY x``; the
answer is the tokens that followed ``x``) greedy decoding copies exactly (tested at 2k and 8k tokens).
`fingerprint` hashes the parameters so results can cite the exact model.

References:
  Olsson et al., "In-context Learning and Induction Heads", arXiv:2209.11895, 2022.
  Elhage et al., "A Mathematical Framework for Transformer Circuits", Transformer Circuits Thread, 2021.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from models.transformer import Transformer, TransformerConfig

__all__ = ["InductionSpec", "induction_lm", "perturbed", "fingerprint", "NUM_SPECIAL", "PAD", "BOS", "QUERY"]

PAD, BOS, QUERY = 0, 1, 2
NUM_SPECIAL = 4          # ids below this are special tokens (3 is a spare separator)
_FAST_PAIRS = 24         # RoPE pairs 0..23 of the previous-token head: theta from 1 down to 2.5e-4
_SLOW_THETA = 1e-5       # induction and record heads use the pairs with theta <= this


@dataclasses.dataclass(frozen=True, kw_only=True)
class InductionSpec:
    """Arguments of the constructed LM (everything that determines its weights).

    Attributes:
      vocab_size: token ids; items are ``NUM_SPECIAL .. vocab_size - 1``.
      code_dim: C, width of the random +-1 token codes (copy margin grows like C).
      record_size: R > 0 adds the record head (tokens ``NUM_SPECIAL + r R .. + R - 1`` form record r);
        0 = no record head.
      record_code_dim: Rd, width of the record codes (used when ``record_size > 0``).
      head_dim: d; must hold the C (and Rd) dims on the slow RoPE pairs.
      rope_base: RoPE base; 1e10 puts ``theta_i <= 1e-5`` on the last half of the pairs at d=128.
      prev_margin: nats between the previous token and any other key in the previous-token head.
      copy_gain: induction logit per unit of code overlap (match scores C, random codes ~sqrt(C)).
      record_gain: record-head logit per unit of record-code overlap.
      record_weight: how much of the record's mean code the record head adds to ``out``.
      unembed_gain: output logit per unit of code overlap.
      seed: seed of the codes.
    """

    vocab_size: int = 16384
    code_dim: int = 64
    record_size: int = 0
    record_code_dim: int = 32
    head_dim: int = 128
    rope_base: float = 1e10
    prev_margin: float = 20.0
    copy_gain: float = 1.0
    record_gain: float = 1.0
    record_weight: float = 0.5
    unembed_gain: float = 1.0
    seed: int = 0

    def __post_init__(self):
        if self.vocab_size <= NUM_SPECIAL:
            raise ValueError(f"vocab_size must be > {NUM_SPECIAL}; got {self.vocab_size}")
        if self.record_size < 0:
            raise ValueError(f"record_size must be >= 0; got {self.record_size}")
        slow = self.slow_dims
        need = max(self.code_dim, self.record_code_dim if self.record_size else 0)
        if len(slow) < need:
            raise ValueError(f"head_dim={self.head_dim} with rope_base={self.rope_base:g} has {len(slow)} dims on "
                             f"RoPE pairs with theta <= {_SLOW_THETA:g}; code_dim/record_code_dim need {need}")
        if self.head_dim // 2 < _FAST_PAIRS:
            raise ValueError(f"head_dim must be >= {2 * _FAST_PAIRS}; got {self.head_dim}")

    @property
    def rec_dim(self) -> int:
        return self.record_code_dim if self.record_size else 0

    @property
    def d_model(self) -> int:
        return 3 * self.code_dim + 1 + self.rec_dim

    @property
    def slow_dims(self) -> np.ndarray:
        """Head dims (both halves of each pair) of the RoPE pairs with theta <= 1e-5."""
        half = self.head_dim // 2
        theta = self.rope_base ** (-np.arange(half) * 2.0 / self.head_dim)
        pairs = np.nonzero(theta <= _SLOW_THETA)[0]
        return np.concatenate([pairs, pairs + half])

    def config(self) -> TransformerConfig:
        return TransformerConfig(vocab_size=self.vocab_size, d_model=self.d_model, num_layers=2, num_heads=2,
                                 num_kv_heads=2, d_ff=1, head_dim=self.head_dim, rope_base=self.rope_base)


def _codes(spec: InductionSpec) -> tuple[np.ndarray, np.ndarray]:
    """Token codes [v, C] and record codes [v, Rd] (+-1; each special token is a record of its own, so
    every token's embedding has the same norm and the folded RMSNorm factors hold at every position)."""
    rng = np.random.default_rng(spec.seed)
    c = rng.choice([-1.0, 1.0], size=(spec.vocab_size, spec.code_dim))
    rec = np.zeros((spec.vocab_size, spec.rec_dim))
    if spec.record_size:
        n_records = -(-(spec.vocab_size - NUM_SPECIAL) // spec.record_size)
        a = rng.choice([-1.0, 1.0], size=(n_records + NUM_SPECIAL, spec.rec_dim))
        rec[:NUM_SPECIAL] = a[n_records:]
        rec[NUM_SPECIAL:] = a[(np.arange(NUM_SPECIAL, spec.vocab_size) - NUM_SPECIAL) // spec.record_size]
    return c, rec


def _prev_gain(spec: InductionSpec) -> float:
    """Gain of the previous-token head: ``prev_margin`` over the nearest competitor (distance 0 or 2)."""
    theta = spec.rope_base ** (-np.arange(_FAST_PAIRS) * 2.0 / spec.head_dim)
    return spec.prev_margin / float(np.sum(1.0 - np.cos(theta)))


def induction_lm(spec: InductionSpec = InductionSpec()) -> Transformer:
    """The constructed two-layer induction LM (see the module docstring), a `models.Transformer`."""
    C, Rd, d, D = spec.code_dim, spec.rec_dim, spec.head_dim, spec.d_model
    code, const, prev, out = (np.arange(C), C, np.arange(C + 1, 2 * C + 1), np.arange(2 * C + 1, 3 * C + 1))
    rec = np.arange(3 * C + 1, 3 * C + 1 + Rd)
    c, a = _codes(spec)
    tau = 1.0 / math.sqrt(d)
    s1 = math.sqrt(D / (C + 1 + Rd))            # RMSNorm factor at layer 1: |x|^2 = C + 1 + Rd
    s2 = math.sqrt(D / (2 * C + 1 + Rd))        # layer 2: the prev slot now holds a code too
    slow = spec.slow_dims

    embed = np.zeros((spec.vocab_size, D))
    embed[:, code], embed[:, const], embed[:, rec] = c, 1.0, a
    zeros = lambda *s: np.zeros(s)
    wq1, wk1, wv1, wo1 = zeros(D, 2, d), zeros(D, 2, d), zeros(D, 2, d), zeros(2, d, D)
    # Layer 1: <R(-theta) e, e> rotated by the distance gives cos((delta - 1) theta) per pair.
    theta = spec.rope_base ** (-np.arange(_FAST_PAIRS) * 2.0 / d)
    amp = math.sqrt(_prev_gain(spec) / tau) / s1
    half = d // 2
    for head in (0, 1):      # two identical heads, each writing half (no head attends uniformly)
        wq1[const, head, :_FAST_PAIRS] = amp * np.cos(theta)
        wq1[const, head, half:half + _FAST_PAIRS] = -amp * np.sin(theta)
        wk1[const, head, :_FAST_PAIRS] = amp
        wv1[code, head, np.arange(C)] = 1.0 / s1
        wo1[head, np.arange(C), prev] = 0.5

    wq2, wk2, wv2, wo2 = zeros(D, 2, d), zeros(D, 2, d), zeros(D, 2, d), zeros(2, d, D)
    g = math.sqrt(spec.copy_gain / tau) / s2
    for head in (0,) if spec.record_size else (0, 1):
        wq2[code, head, slow[:C]] = g
        wk2[prev, head, slow[:C]] = g
        wv2[code, head, np.arange(C)] = 1.0 / s2
        wo2[head, np.arange(C), out] = 1.0 if spec.record_size else 0.5
    if spec.record_size:
        gr = math.sqrt(spec.record_gain / tau) / s2
        wq2[rec, 1, slow[:Rd]] = gr
        wk2[rec, 1, slow[:Rd]] = gr
        wv2[code, 1, np.arange(C)] = 1.0 / s2
        wo2[1, np.arange(C), out] = spec.record_weight
    unembed = np.zeros((D, spec.vocab_size))
    unembed[out] = spec.unembed_gain * c.T      # final RMSNorm factor ~1: |x|^2 ~ 3C + 1 + Rd = D

    model = Transformer(spec.config(), rngs=nnx.Rngs(spec.seed))
    model.embed[...] = jnp.asarray(embed, jnp.float32)
    model.unembed[...] = jnp.asarray(unembed, jnp.float32)
    for layer, (wq, wk, wv, wo) in zip(model.layers, ((wq1, wk1, wv1, wo1), (wq2, wk2, wv2, wo2))):
        for name, w in zip(("wq", "wk", "wv", "wo"), (wq, wk, wv, wo)):
            getattr(layer.attn, name)[...] = jnp.asarray(w, jnp.float32)
        for name in ("w_gate", "w_up", "w_down"):
            p = getattr(layer.ffn, name)
            p[...] = jnp.zeros_like(p[...])
    return model


def fingerprint(model: nnx.Module) -> str:
    """12 hex digits of a SHA-256 over the model's parameters (names, shapes, float32 bytes)."""
    h = hashlib.sha256()
    for path, value in sorted(nnx.to_flat_state(nnx.state(model, nnx.Param)), key=lambda kv: str(kv[0])):
        arr = np.asarray(jax.device_get(value[...] if hasattr(value, "__getitem__") else value), np.float32)
        h.update(str(path).encode())
        h.update(str(arr.shape).encode())
        h.update(np.ascontiguousarray(arr).tobytes())
    return h.hexdigest()[:12]


def perturbed(model: Transformer, key: jax.Array, *, qk_scale: float = 0.5, noise: float = 0.05) -> Transformer:
    """A copy of the constructed LM whose attention is no longer hand-sharp.

    Every query and key projection is multiplied by ``qk_scale`` (attention logits by ``qk_scale**2``),
    then every entry of every parameter but the embedding gets Gaussian noise of standard deviation
    ``noise`` times that parameter's root mean square (the zeros of the construction included, so
    heads also pick up weak attention to unrelated keys and write into unrelated slots). The embedding
    is kept: noise on its constant dim scales the previous-token head's large logits (about 500 nats
    at the construction's gain) by a different factor per key, which alone destroys the circuit. Fine-tuning this model on the task (see
    `experiments._long_context`) gives the "not hand-sharp" workload.
    """
    if qk_scale <= 0 or noise < 0:
        raise ValueError(f"qk_scale must be > 0 and noise >= 0; got qk_scale={qk_scale}, noise={noise}")
    graphdef, state = nnx.split(model)
    flat = nnx.to_flat_state(state)
    keys = jax.random.split(key, len(flat))
    new = []
    for k, (path, var) in zip(keys, flat):
        x = var[...]
        if path[-1] in ("wq", "wk"):
            x = x * qk_scale
        if path[-1] != "embed":
            x = x + noise * jnp.sqrt(jnp.mean(x * x)) * jax.random.normal(k, x.shape, x.dtype)
        new.append((path, var.replace(x)))
    return nnx.merge(graphdef, nnx.from_flat_state(new))
