"""PRIM: cooperative dynamic token compression for an audio-visual LM (a RECONSTRUCTION, see below).

READ FIRST: only PRIM's abstract was available (no PDF, no code). It names (1) text-conditioned
early audio-visual fusion, (2) attention-guided, frequency-aware removal of audio and video tokens
before the LM and (3) task-adaptive token retention inside the LM. Every concrete operator here is
[INFERRED]: the spec's instantiation (papers/specs/inference_moe.md section 4 (b)), built from FastV /
PyramidDrop (attention-ranked pruning in the LM) and OmniZip-style audio-visual pruning before it.
Results obtained with this module are results of that design, not of the paper's exact algorithm.
Each function's docstring gives its equation.

Pipeline (`prim_plan`, then `pruned_forward`):
  1. `text_relevance`: rho over the AV tokens from the question's attention (the LM's first-layer
     q/k, or raw embeddings). DEVIATION from the spec: one softmax over video and audio jointly.
  2. `fuse_audio_visual`: text-conditioned fusion in time-aligned windows (gamma = 0: identity).
  3. `modality_budgets`: the budget B split between video and audio by relevance mass.
  4. `frequency_scores`: high-pass energy per window; mixed with rho, top b_v / b_a tokens kept.
     `merge_pruned` (optional) merges each pruned token into its most similar kept one.
  5. `InLMPrune(kind="adaptive")`: at layer K each row keeps the smallest set of AV tokens reaching
     attention mass p, within [r_min, r_max]; rows are gathered to a static cap and the extra slots
     isolated by segment ids. Several stages give PyramidDrop's schedule.
  6. `InLMPrune(kind="epsilon")`: drops the least-attended AV tokens whose raw mass is < eps.
Baselines at the same budget: `uniform_plan` (strided) and `InLMPrune(kind="fastv")`.

Kept tokens keep their original positions (RoPE, causal mask). `pruned_forward` runs its own layer
loop over the LM's public submodules, because `Transformer.__call__` cannot shorten the sequence
between layers (tested equal to the unpruned `VLM` at keep-all). `modeled_flops` and `scoring_flops`
give the compute model; it counts each row's own token count (what a ragged implementation runs),
while measured wall time runs the static cap.

Dimension legend: `b` batch, `t` sequence tokens, `n` AV tokens (n_v video, n_a audio), `q` question
tokens, `D` LM width, `h` heads, `d` head dim, `w` window, `L` layers, `B` AV token budget.

Missing / weak: merging is of pruned tokens into kept ones (not of static runs into one new token);
no KV-cache decode after pruning; the in-LM attention row is recomputed from the layer's weights.

References:
  Spec: /work/shared/papers/specs/inference_moe.md section 4 (PRIM: Song Li, Yongping Xiong, ICML 2026;
  abstract only).
  Chen et al., "An Image is Worth 1/2 Tokens After Layer 2" (FastV), arXiv:2403.06764, 2024.
  Xing et al., "PyramidDrop", arXiv:2410.17247, 2024.
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from primitives import attention as attn_lib

__all__ = [
    "TEXT", "VIDEO", "AUDIO", "PRIMConfig", "InLMPrune", "Layout", "Plan", "PrunedOutput",
    "budget_count", "layout_from_tokens", "modality_budgets", "text_relevance", "frequency_scores",
    "fuse_audio_visual", "merge_pruned", "cumulative_mass_count", "epsilon_keep_count", "keep_indices",
    "uniform_plan", "full_plan", "prim_plan",
    "pruned_forward", "scoring_flops", "modeled_flops",
]

TEXT, VIDEO, AUDIO = 0, 1, 2
_NEG = -1e30


# ------------------------------------------------------------------ configuration


@dataclasses.dataclass(frozen=True, kw_only=True)
class PRIMConfig:
    """PRIM's pre-LM stage (every field [INFERRED], spec 4 (b)).

    Attributes:
      relevance: "layer0" (the LM's first-layer rotated q/k, all heads) or "embed" (raw embeddings).
      fusion_gamma: gamma of the aligned-window fusion (0 = pure selection, the identity).
      freq_weight: lambda in [0, 1], weight of the frequency score against the relevance.
      video_window / audio_window: window lengths (tokens) of the frequency scores.
      freq_cutoff: lowest kept frequency index (>= 1; 1 removes the DC bin only).
      min_per_modality: b_min, tokens each modality keeps at least (when it has them and B allows).
      merge: "none" (pruned tokens dropped), "similarity" or "mean" (pruned tokens merged into their
        most similar kept token, `merge_pruned`).
    """

    relevance: str = "layer0"
    fusion_gamma: float = 0.0
    freq_weight: float = 0.5
    video_window: int = 6
    audio_window: int = 3
    freq_cutoff: int = 1
    min_per_modality: int = 1
    merge: str = "none"

    def __post_init__(self):
        if self.merge not in ("none", "similarity", "mean"):
            raise ValueError(f"merge: expected 'none', 'similarity' or 'mean', got {self.merge!r}")
        if self.relevance not in ("layer0", "embed"):
            raise ValueError(f"relevance: expected 'layer0' or 'embed', got {self.relevance!r}")
        if not (math.isfinite(self.fusion_gamma) and self.fusion_gamma >= 0):
            raise ValueError(f"fusion_gamma: expected a finite value >= 0, got {self.fusion_gamma!r}")
        if not 0.0 <= self.freq_weight <= 1.0:
            raise ValueError(f"freq_weight: expected a value in [0, 1], got {self.freq_weight!r}")
        for name in ("video_window", "audio_window", "freq_cutoff"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}: expected an int >= 1, got {v!r}")
        if not isinstance(self.min_per_modality, int) or self.min_per_modality < 0:
            raise ValueError(f"min_per_modality: expected an int >= 0, got {self.min_per_modality!r}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class InLMPrune:
    """One in-LM pruning stage after layer `layer` (0-based; layers > layer run on the kept tokens).

    Attributes:
      kind: "fastv" (keep the `keep` AV tokens most attended by the query row), "adaptive"
        (PRIM: the smallest set reaching attention mass `mass`, in [r_min, r_max] of those present) or
        "epsilon" (drop the least-attended AV tokens whose total raw attention mass is < `eps`).
      layer: K, the layer whose attention row ranks the tokens.
      keep: AV tokens kept by "fastv" (an int >= 1).
      mass: p in (0, 1] of "adaptive".
      r_min, r_max: bounds of "adaptive" as fractions in (0, 1] of the AV tokens present (r_min <= r_max).
      eps: epsilon in [0, 1) of "epsilon" (0 keeps every token).
    """

    kind: str
    layer: int
    keep: int = 1
    mass: float = 0.9
    r_min: float = 0.25
    r_max: float = 1.0
    eps: float = 0.1

    def __post_init__(self):
        if self.kind not in ("fastv", "adaptive", "epsilon"):
            raise ValueError(f"kind: expected 'fastv', 'adaptive' or 'epsilon', got {self.kind!r}")
        if not 0.0 <= self.eps < 1.0:
            raise ValueError(f"eps: expected a value in [0, 1), got {self.eps!r}")
        if not isinstance(self.layer, int) or self.layer < 0:
            raise ValueError(f"layer: expected an int >= 0, got {self.layer!r}")
        if not isinstance(self.keep, int) or self.keep < 1:
            raise ValueError(f"keep: expected an int >= 1, got {self.keep!r}")
        if not 0.0 < self.mass <= 1.0:
            raise ValueError(f"mass: expected a value in (0, 1], got {self.mass!r}")
        if not (0.0 < self.r_min <= self.r_max <= 1.0):
            raise ValueError(f"r_min, r_max: expected 0 < r_min <= r_max <= 1, got {self.r_min!r}, {self.r_max!r}")


class Layout(NamedTuple):
    """Static sequence layout shared by every row: `modality` [t] numpy int (TEXT / VIDEO / AUDIO)."""

    modality: np.ndarray

    @property
    def video(self) -> np.ndarray:
        return np.flatnonzero(self.modality == VIDEO)

    @property
    def audio(self) -> np.ndarray:
        return np.flatnonzero(self.modality == AUDIO)

    @property
    def num_av(self) -> int:
        return int(np.sum(self.modality != TEXT))


class Plan(NamedTuple):
    """Pre-LM selection: `keep` [b, t'] int32 kept sequence indices (ascending; every text token
    kept) and the input embeddings `x` [b, t, D] to gather from (fused when gamma > 0)."""

    keep: jax.Array
    x: jax.Array


class PrunedOutput(NamedTuple):
    """`logits` [b, v] float32 at the query row; `av_per_layer` [b, L] int32 AV tokens up to the query
    that each row's layer l really attends over (kept, not padding); `text_tokens` [b] int32 real text
    tokens up to the query; `final_keep` [b, t] bool over the FULL sequence: the tokens the last layer
    runs on (padding slots excluded); `layer_keep` [b, L, t] bool: the same for every layer."""

    logits: jax.Array
    av_per_layer: jax.Array
    text_tokens: jax.Array
    final_keep: jax.Array
    layer_keep: jax.Array


# ------------------------------------------------------------------ budgets and layouts


def budget_count(fraction: float, n: int) -> int:
    """B = max(1, round(fraction * n)) AV tokens for a kept `fraction` in (0, 1] of `n` tokens.

    Raises:
      ValueError: `fraction` outside (0, 1] or `n` < 1.
    """
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float, np.floating)) or not (
            0.0 < float(fraction) <= 1.0):
        raise ValueError(f"fraction: expected a kept fraction in (0, 1], got {fraction!r}")
    if not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"n: expected an int >= 1, got {n!r}")
    return int(min(n, max(1, round(float(fraction) * n))))


def layout_from_tokens(tokens, *, image_token_id: int, audio_token_id: int | None) -> Layout:
    """The layout of `tokens` [b, t] (placeholder ids -> VIDEO / AUDIO); every row must agree.

    Raises:
      ValueError: tokens not [b, t], or rows whose placeholders sit at different positions.
    """
    tokens = np.asarray(tokens)
    if tokens.ndim != 2:
        raise ValueError(f"tokens: expected [b, t], got shape {tokens.shape}")
    mod = np.full(tokens.shape, TEXT, np.int32)
    mod[tokens == image_token_id] = VIDEO
    if audio_token_id is not None:
        mod[tokens == audio_token_id] = AUDIO
    if not np.all(mod == mod[:1]):
        raise ValueError("tokens: every row must hold its image/audio placeholders at the same positions")
    return Layout(mod[0])


def modality_budgets(mass_v: jax.Array, mass_a: jax.Array, budget: int, n_v: int, n_a: int, *,
                     min_per_modality: int = 1) -> tuple[jax.Array, jax.Array]:
    """Per-row budgets (b_v [b], b_a [b]) int32 with b_v + b_a = `budget` exactly (spec 4 (b) 2).

    b_v = round(B m_v / (m_v + m_a)) clamped to [lo, hi], lo = max(B - n_a, min(b_min, n_v, B)),
    hi = max(lo, min(n_v, B - min(b_min, n_a, B))); b_a = B - b_v. Equal masses give B / 2 (rounded).

    Args:
      mass_v, mass_a: [b] nonnegative modality relevance masses (m_v = sum rho_v, m_a = sum rho_a).
      budget: B in [1, n_v + n_a].
      n_v, n_a: modality sizes (>= 0, not both 0).
      min_per_modality: b_min >= 0.

    Raises:
      ValueError: naming the argument, for a budget outside [1, n_v + n_a] or mismatched masses.
    """
    if n_v < 0 or n_a < 0 or n_v + n_a < 1:
        raise ValueError(f"n_v, n_a: expected sizes >= 0 with n_v + n_a >= 1, got {n_v}, {n_a}")
    if not isinstance(budget, (int, np.integer)) or not 1 <= budget <= n_v + n_a:
        raise ValueError(f"budget: expected an int in [1, {n_v + n_a}], got {budget!r}")
    if jnp.shape(mass_v) != jnp.shape(mass_a) or jnp.ndim(mass_v) != 1:
        raise ValueError(f"mass_v, mass_a: expected matching [b] arrays, got {jnp.shape(mass_v)} and "
                         f"{jnp.shape(mass_a)}")
    lo = max(budget - n_a, min(min_per_modality, n_v, budget))
    hi = max(lo, min(n_v, budget - min(min_per_modality, n_a, budget)))
    total = jnp.maximum(mass_v + mass_a, 1e-30)
    b_v = jnp.clip(jnp.round(budget * mass_v / total), lo, hi).astype(jnp.int32)
    return b_v, (budget - b_v).astype(jnp.int32)


# ------------------------------------------------------------------ scores


def text_relevance(q: jax.Array, q_mask: jax.Array, k: jax.Array) -> jax.Array:
    """rho [b, n] float32: mean over valid queries and heads of softmax_j(q . k_j / sqrt(d)).

    Args:
      q: [b, q, h, d] queries (question tokens); q_mask: [b, q] bool, which are real.
      k: [b, n, h, d] keys of the n AV tokens (heads already matched to q's).

    Every row of rho sums to 1: one softmax over video and audio tokens jointly. [INFERRED] DEVIATION
    from the spec, whose per-modality softmax makes m_v = m_a = 1 always, so `modality_budgets` would
    split every budget B / 2.

    Raises:
      ValueError: naming the argument for shapes that disagree.
    """
    if q.ndim != 4 or k.ndim != 4 or q.shape[0] != k.shape[0] or q.shape[2:] != k.shape[2:]:
        raise ValueError(f"q, k: expected [b, q, h, d] and [b, n, h, d] with the same b, h, d, got "
                         f"{q.shape} and {k.shape}")
    if q_mask.shape != q.shape[:2]:
        raise ValueError(f"q_mask: expected shape {q.shape[:2]}, got {q_mask.shape}")
    logits = jnp.einsum("bqhd,bnhd->bhqn", q.astype(jnp.float32), k.astype(jnp.float32)) / math.sqrt(q.shape[-1])
    p = jax.nn.softmax(logits, axis=-1).mean(axis=1)  # [b, q, n]
    w = q_mask.astype(jnp.float32)
    return jnp.einsum("bqn,bq->bn", p, w) / jnp.maximum(w.sum(-1, keepdims=True), 1.0)


def frequency_scores(x: jax.Array, *, window: int, cutoff: int = 1) -> jax.Array:
    """High-pass energy [b, n] float32 of each token along the sequence axis (spec 4 (b) 2, [INFERRED]).

    The n tokens of `x` [b, n, D] are cut into consecutive windows of `window` tokens (a last shorter
    window keeps its own length); within a window of length w, the DFT along the window axis keeps
    the bins k with min(k, w - k) >= `cutoff`, the inverse DFT gives the high-pass part y_j, and the
    score of token j is ||y_j||^2. With cutoff = 1 this is ||x_j - mean(window)||^2; a window of one
    token (or cutoff > w // 2) scores 0.

    Raises:
      ValueError: x not [b, n, D], window < 1 or cutoff < 1 (naming the argument).
    """
    if x.ndim != 3:
        raise ValueError(f"x: expected [b, n, D], got shape {x.shape}")
    if not isinstance(window, int) or window < 1:
        raise ValueError(f"window: expected an int >= 1, got {window!r}")
    if not isinstance(cutoff, int) or cutoff < 1:
        raise ValueError(f"cutoff: expected an int >= 1, got {cutoff!r}")
    x = x.astype(jnp.float32)
    outs = []
    for start in range(0, x.shape[1], window):
        seg = x[:, start:start + window]
        w = seg.shape[1]
        k = np.arange(w)
        keep = jnp.asarray(np.minimum(k, w - k) >= cutoff)
        spec = jnp.fft.fft(seg, axis=1) * keep[None, :, None]
        y = jnp.real(jnp.fft.ifft(spec, axis=1))
        outs.append(jnp.sum(y * y, axis=-1))
    return jnp.concatenate(outs, axis=1)


def fuse_audio_visual(v: jax.Array, a: jax.Array, align: np.ndarray, rho_v: jax.Array, rho_a: jax.Array, *,
                      gamma: float) -> tuple[jax.Array, jax.Array]:
    """Text-conditioned aligned-window fusion (spec 4 (b) 1, [INFERRED]).

    V'_i = V_i + gamma sum_j softmax_j(V_i . A_j / sqrt(D) + log rho_a_j | align[i, j]) A_j, and
    A'_j = A_j + gamma sum_i softmax_i(A_j . V_i / sqrt(D) + log rho_v_i | align[i, j]) V_i. A token
    with no aligned partner is unchanged; gamma = 0 returns the inputs.

    Args:
      v: [b, n_v, D] video tokens; a: [b, n_a, D] audio tokens.
      align: [n_v, n_a] bool, True where video token i and audio token j share a time window.
      rho_v, rho_a: [b, n_v], [b, n_a] nonnegative text relevances.
      gamma: fusion weight >= 0.

    Raises:
      ValueError: naming the argument for shapes that disagree or gamma < 0.
    """
    if v.ndim != 3 or a.ndim != 3 or v.shape[0] != a.shape[0] or v.shape[2] != a.shape[2]:
        raise ValueError(f"v, a: expected [b, n_v, D] and [b, n_a, D], got {v.shape} and {a.shape}")
    align = np.asarray(align, bool)
    if align.shape != (v.shape[1], a.shape[1]):
        raise ValueError(f"align: expected shape {(v.shape[1], a.shape[1])}, got {align.shape}")
    if rho_v.shape != v.shape[:2] or rho_a.shape != a.shape[:2]:
        raise ValueError(f"rho_v, rho_a: expected {v.shape[:2]} and {a.shape[:2]}, got {rho_v.shape} and {rho_a.shape}")
    if not (math.isfinite(gamma) and gamma >= 0):
        raise ValueError(f"gamma: expected a finite value >= 0, got {gamma!r}")
    if gamma == 0:
        return v, a
    m = jnp.asarray(align)
    s = jnp.einsum("bid,bjd->bij", v.astype(jnp.float32), a.astype(jnp.float32)) / math.sqrt(v.shape[-1])
    log_ra = jnp.log(jnp.maximum(rho_a, 1e-30))[:, None, :]
    log_rv = jnp.log(jnp.maximum(rho_v, 1e-30))[:, :, None]
    wa = jax.nn.softmax(jnp.where(m, s + log_ra, _NEG), axis=2) * jnp.any(m, axis=1)[None, :, None]
    wv = jax.nn.softmax(jnp.where(m, s + log_rv, _NEG), axis=1) * jnp.any(m, axis=0)[None, None, :]
    v2 = v + gamma * jnp.einsum("bij,bjd->bid", wa, a.astype(jnp.float32)).astype(v.dtype)
    a2 = a + gamma * jnp.einsum("bij,bid->bjd", wv, v.astype(jnp.float32)).astype(a.dtype)
    return v2, a2


def merge_pruned(x: jax.Array, keep: jax.Array, *, weights: str = "similarity") -> jax.Array:
    """Merges every pruned token into its most similar kept token (spec 4 (b) 2 merging, [INFERRED]).

    For a pruned j (keep[b, j] False) the target is t(j) = argmax over kept k of cos(x_j, x_k) (ties:
    lowest k); each kept token becomes the weighted average of itself (weight 1) and the tokens merged
    into it: x'_k = (x_k + sum_{t(j) = k} w_j x_j) / (1 + sum_{t(j) = k} w_j), with
    w_j = max(cos(x_j, x_{t(j)}), 0) for weights="similarity" and w_j = 1 for weights="mean" (the
    plain group mean). Pruned rows are returned unchanged (they are not gathered); with no pruned
    token, or no kept token to merge into, the output equals `x`.

    Args:
      x: [b, n, D] tokens of ONE modality; keep: [b, n] bool, the kept ones.
      weights: "similarity" or "mean".

    Returns:
      [b, n, D] in x's dtype.

    Raises:
      ValueError: naming the argument for shapes that disagree or an unknown `weights`.
    """
    if x.ndim != 3 or keep.shape != x.shape[:2]:
        raise ValueError(f"x, keep: expected [b, n, D] and [b, n], got {x.shape} and {keep.shape}")
    if weights not in ("similarity", "mean"):
        raise ValueError(f"weights: expected 'similarity' or 'mean', got {weights!r}")
    xf = x.astype(jnp.float32)
    unit = xf / jnp.maximum(jnp.linalg.norm(xf, axis=-1, keepdims=True), 1e-12)
    sim = jnp.einsum("bjd,bkd->bjk", unit, unit)  # [b, src, dst]
    sim_kept = jnp.where(keep[:, None, :], sim, -jnp.inf)
    tgt = jnp.argmax(sim_kept, axis=-1)  # [b, n]
    best = jnp.take_along_axis(sim, tgt[..., None], axis=-1)[..., 0]
    w = jnp.maximum(best, 0.0) if weights == "similarity" else jnp.ones_like(best)
    w = w * (~keep) * jnp.any(keep, axis=-1, keepdims=True)
    assign = jax.nn.one_hot(tgt, x.shape[1], dtype=jnp.float32) * w[..., None]  # [b, src, dst]
    num = xf + jnp.einsum("bjk,bjd->bkd", assign, xf)
    den = 1.0 + assign.sum(axis=1)[..., None]
    return jnp.where(keep[..., None], num / den, xf).astype(x.dtype)


def epsilon_keep_count(probs: jax.Array, valid: jax.Array, *, eps: float) -> jax.Array:
    """[b] int32: valid entries left after dropping the largest set of smallest `probs` whose total is
    < `eps` (spec 4 (b) 3, "drop AV tokens whose attention mass falls below eps", [INFERRED]).

    `probs` are NOT renormalised over the valid entries (raw attention of the query row, whose other
    mass sits on text tokens): if all valid entries sum to < eps, the count is 0.

    Args:
      probs: [b, n] nonnegative; valid: [b, n] bool; eps: in [0, 1).
    """
    if probs.shape != valid.shape or probs.ndim != 2:
        raise ValueError(f"probs, valid: expected matching [b, n], got {probs.shape} and {valid.shape}")
    if not 0.0 <= eps < 1.0:
        raise ValueError(f"eps: expected a value in [0, 1), got {eps!r}")
    srt = jnp.sort(jnp.where(valid, probs.astype(jnp.float32), jnp.inf), axis=-1)  # valid ascending, then inf
    n_valid = jnp.sum(valid, axis=-1)
    in_range = jnp.arange(probs.shape[1])[None, :] < n_valid[:, None]
    cum = jnp.cumsum(jnp.where(in_range, srt, 0.0), axis=-1)
    dropped = jnp.sum(in_range & (cum < eps), axis=-1)
    return (n_valid - dropped).astype(jnp.int32)


def cumulative_mass_count(probs: jax.Array, valid: jax.Array, *, mass: float, lo: jax.Array | int,
                          hi: jax.Array | int) -> jax.Array:
    """[b] int32: the smallest k such that the k largest of `probs` over `valid` entries, renormalised
    to sum 1, reach `mass`, clipped to [lo, hi] (spec 4 (b) 3).

    Args:
      probs: [b, n] nonnegative; valid: [b, n] bool; mass: p in (0, 1]; lo, hi: bounds (ints or [b]).
    """
    if probs.shape != valid.shape or probs.ndim != 2:
        raise ValueError(f"probs, valid: expected matching [b, n], got {probs.shape} and {valid.shape}")
    if not 0.0 < mass <= 1.0:
        raise ValueError(f"mass: expected a value in (0, 1], got {mass!r}")
    p = jnp.where(valid, probs.astype(jnp.float32), 0.0)
    p = p / jnp.maximum(p.sum(-1, keepdims=True), 1e-30)
    srt = -jnp.sort(-p, axis=-1)
    cum = jnp.cumsum(srt, axis=-1)
    # entries below the target (with a float tolerance) all need to be kept, plus the one that reaches it
    k = jnp.sum(cum < mass - 1e-6, axis=-1) + 1
    return jnp.clip(k, lo, hi).astype(jnp.int32)


# ------------------------------------------------------------------ plans


def keep_indices(keep_mask: jax.Array, count: int) -> jax.Array:
    """[b, count] int32 ascending indices of the True entries of `keep_mask` [b, t] (exactly `count`
    per row; ValueError for concrete rows with another count)."""
    if not isinstance(keep_mask, jax.core.Tracer):
        counts = np.asarray(jnp.sum(keep_mask, axis=-1))
        if np.any(counts != count):
            raise ValueError(f"keep_mask: expected {count} kept entries per row, got {counts.tolist()}")
    t = keep_mask.shape[-1]
    key = jnp.where(keep_mask, t - jnp.arange(t)[None, :], -1)
    return (t - jax.lax.top_k(key, count)[0]).astype(jnp.int32)


def _row_ranks(scores: jax.Array) -> jax.Array:
    """[b, n] rank of each entry in descending order (0 = largest; ties by lower index)."""
    order = jnp.argsort(-scores, axis=-1, stable=True)
    return jnp.argsort(order, axis=-1, stable=True)


def full_plan(x: jax.Array, layout: Layout) -> Plan:
    """Keeps every token (the unpruned model, and FastV's input)."""
    b, t = x.shape[:2]
    return Plan(jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32)[None], (b, t)), x)


def _proportional(budget: int, n_v: int, n_a: int) -> int:
    b_v = int(round(budget * n_v / (n_v + n_a)))
    return int(min(n_v, max(budget - n_a, b_v)))


def uniform_plan(x: jax.Array, layout: Layout, fraction: float) -> Plan:
    """Strided pruning: B = budget_count(fraction, n); each modality keeps its size share, evenly spaced
    (kept index floor((i + 1/2) n_m / b_m) of its tokens, i < b_m)."""
    n_v, n_a = len(layout.video), len(layout.audio)
    budget = budget_count(fraction, n_v + n_a)
    b_v = _proportional(budget, n_v, n_a)
    kept = [np.flatnonzero(layout.modality == TEXT)]
    for idx, bm in ((layout.video, b_v), (layout.audio, budget - b_v)):
        if bm:
            kept.append(idx[np.floor((np.arange(bm) + 0.5) * len(idx) / bm).astype(int)])
    keep = np.sort(np.concatenate(kept)).astype(np.int32)
    b = x.shape[0]
    return Plan(jnp.broadcast_to(jnp.asarray(keep)[None], (b, len(keep))), x)


def _layer0_qk(vlm, x: jax.Array, positions: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The first layer's rotated queries [b, t, h, d] and keys [b, t, h, d] (kv heads repeated)."""
    layer = vlm.lm.layers[0]
    c = vlm.config.lm
    h = layer.attn_norm(x)
    att = layer.attn
    wq, wk = att.wq[...].astype(x.dtype), att.wk[...].astype(x.dtype)
    q = attn_lib.rope(jnp.einsum("btD,Dhd->bthd", h, wq), positions, base=c.rope_base)
    k = attn_lib.rope(jnp.einsum("btD,Dkd->btkd", h, wk), positions, base=c.rope_base)
    return q, jnp.repeat(k, c.num_heads // c.num_kv_heads, axis=2)


def prim_plan(vlm, x: jax.Array, layout: Layout, fraction: float, query_mask: jax.Array, *,
              config: PRIMConfig = PRIMConfig(), align: np.ndarray | None = None) -> Plan:
    """PRIM's pre-LM stage: relevance, fusion, modality budgets, frequency-aware top-k per modality.

    Args:
      vlm: a `models.vlm.VLM` (its LM's first layer gives the relevance with relevance="layer0").
      x: [b, t, D] input embeddings (`vlm.embed(tokens, images, audio)`).
      layout: the static layout of the sequence.
      fraction: kept fraction of the AV tokens, in (0, 1]; B = budget_count(fraction, n).
      query_mask: [b, t] bool, the question tokens whose attention defines the relevance.
      config: `PRIMConfig`.
      align: [n_v, n_a] bool time alignment (needed when config.fusion_gamma > 0).

    Returns:
      Plan with B AV tokens + every text token per row (and the fused embeddings when gamma > 0).

    Raises:
      ValueError: naming the argument (fraction outside (0, 1], shapes, missing align).
    """
    n_v, n_a = len(layout.video), len(layout.audio)
    budget = budget_count(fraction, n_v + n_a)
    if x.ndim != 3 or x.shape[1] != len(layout.modality):
        raise ValueError(f"x: expected [b, {len(layout.modality)}, D], got shape {x.shape}")
    if query_mask.shape != x.shape[:2]:
        raise ValueError(f"query_mask: expected shape {x.shape[:2]}, got {query_mask.shape}")
    if config.fusion_gamma > 0 and align is None:
        raise ValueError("align: needed when config.fusion_gamma > 0")
    if not isinstance(config, PRIMConfig):
        raise ValueError(f"config: expected a PRIMConfig, got {type(config).__name__}")
    b, t = x.shape[:2]
    av = np.flatnonzero(layout.modality != TEXT)
    positions = jnp.broadcast_to(jnp.arange(t)[None], (b, t))
    if config.relevance == "layer0":
        q_all, k_all = _layer0_qk(vlm, x, positions)
    else:
        q_all, k_all = x[:, :, None, :], x[:, :, None, :]
    rho = text_relevance(q_all, query_mask, k_all[:, av])  # [b, n]
    is_v = layout.modality[av] == VIDEO
    vpos, apos = np.flatnonzero(is_v), np.flatnonzero(~is_v)
    rho_v, rho_a = rho[:, vpos], rho[:, apos]
    if config.fusion_gamma > 0 and n_v and n_a:
        v2, a2 = fuse_audio_visual(x[:, layout.video], x[:, layout.audio], align, rho_v, rho_a,
                                   gamma=config.fusion_gamma)
        x = x.at[:, layout.video].set(v2).at[:, layout.audio].set(a2)
    b_v, b_a = modality_budgets(rho_v.sum(-1), rho_a.sum(-1), budget, n_v, n_a,
                                min_per_modality=config.min_per_modality)
    keep = jnp.asarray(layout.modality == TEXT)[None].repeat(b, 0)
    lam = config.freq_weight
    for idx, rel, bm, window in ((layout.video, rho_v, b_v, config.video_window),
                                 (layout.audio, rho_a, b_a, config.audio_window)):
        if len(idx) == 0:
            continue
        f = frequency_scores(x[:, idx], window=window, cutoff=config.freq_cutoff)
        score = ((1 - lam) * rel / jnp.maximum(rel.max(-1, keepdims=True), 1e-30)
                 + lam * f / jnp.maximum(f.max(-1, keepdims=True), 1e-30))
        kept_m = _row_ranks(score) < bm[:, None]
        keep = keep.at[:, idx].set(kept_m)
        if config.merge != "none":
            x = x.at[:, idx].set(merge_pruned(x[:, idx], kept_m, weights=config.merge))
    n_keep = int(np.sum(layout.modality == TEXT)) + budget
    return Plan(keep_indices(keep, n_keep), x)


# ------------------------------------------------------------------ pruned forward


def _query_attention(layer, x, positions, segment_ids, query_index, config) -> jax.Array:
    """Attention probabilities [b, t] (mean over heads) of the row `query_index` [b] at this layer."""
    h = layer.attn_norm(x)
    att = layer.attn
    wq, wk = att.wq[...].astype(x.dtype), att.wk[...].astype(x.dtype)
    hq = jnp.take_along_axis(h, query_index[:, None, None], axis=1)  # [b, 1, D]
    qpos = jnp.take_along_axis(positions, query_index[:, None], axis=1)
    q = attn_lib.rope(jnp.einsum("btD,Dhd->bthd", hq, wq), qpos, base=config.rope_base)[:, 0]  # [b, h, d]
    k = attn_lib.rope(jnp.einsum("btD,Dkd->btkd", h, wk), positions, base=config.rope_base)
    k = jnp.repeat(k, config.num_heads // config.num_kv_heads, axis=2)
    s = jnp.einsum("bhd,bthd->bht", q.astype(jnp.float32), k.astype(jnp.float32)) / math.sqrt(q.shape[-1])
    ok = positions <= qpos
    if segment_ids is not None:
        ok = ok & (segment_ids == jnp.take_along_axis(segment_ids, query_index[:, None], axis=1))
    s = jnp.where(ok[:, None, :], s, _NEG)
    return jax.nn.softmax(s, axis=-1).mean(axis=1)


def _stages(in_lm, num_layers: int) -> dict:
    """{layer: InLMPrune} of `in_lm` (None, one stage, or a sequence with strictly increasing layers)."""
    if in_lm is None:
        return {}
    stages = (in_lm,) if isinstance(in_lm, InLMPrune) else tuple(in_lm)
    for st in stages:
        if not isinstance(st, InLMPrune):
            raise ValueError(f"in_lm: expected InLMPrune stages, got {type(st).__name__}")
    layers = [st.layer for st in stages]
    if any(b <= a for a, b in zip(layers, layers[1:])):
        raise ValueError(f"in_lm: expected strictly increasing stage layers, got {layers}")
    if stages and not layers[-1] < num_layers - 1:
        raise ValueError(f"in_lm.layer: expected < num_layers - 1 = {num_layers - 1} (later layers must remain), "
                         f"got {layers[-1]}")
    return {st.layer: st for st in stages}


def _ceil_table(r: float, n: int) -> jax.Array:
    """[n + 1] int32 lookup ceil(r m) for m = 0..n (Python arithmetic, so static and per-row bounds agree)."""
    return jnp.asarray([math.ceil(r * m) for m in range(n + 1)], jnp.int32)


def pruned_forward(vlm, plan: Plan, layout: Layout, query_pos: jax.Array, *,
                   in_lm=None) -> PrunedOutput:
    """Runs the LM on the plan's kept tokens (original positions), optionally pruning inside the LM.

    Args:
      vlm: a `models.vlm.VLM`.
      plan: `Plan` (keep [b, t'] ascending, x [b, t, D]); the query row must be kept.
      layout: the static layout of the full sequence.
      query_pos: [b] int, the full-sequence index of each row's query (last prompt) token; its logits
        are returned, and its attention at each stage's layer ranks the AV tokens.
      in_lm: None, one `InLMPrune`, or a sequence of them with strictly increasing layers (the pyramid
        schedule: each stage prunes what the previous one kept). A stage at layer K keeps its tokens
        for layers > K. Bounds of "adaptive" ([r_min, r_max]) and "fastv"'s `keep` apply to the AV
        tokens present in each row at that stage; rows whose count is below the stage's static cap
        carry padding slots, isolated by segment ids.

    Returns:
      PrunedOutput (logits at the query row; per-layer AV counts; text tokens up to the query).

    Raises:
      ValueError: naming the argument, for a stage layer outside [0, L - 1) or out of order.
    """
    lm, c = vlm.lm, vlm.config.lm
    stages = _stages(in_lm, c.num_layers)
    query_pos = jnp.asarray(query_pos, jnp.int32)
    keep = plan.keep
    b = keep.shape[0]
    t_full = len(layout.modality)
    if query_pos.shape != (b,):
        raise ValueError(f"query_pos: expected shape ({b},), got {query_pos.shape}")
    x = jnp.take_along_axis(plan.x, keep[:, :, None], axis=1)
    positions = keep
    mod = jnp.asarray(layout.modality)[keep]  # [b, t']
    av = mod != TEXT
    q_idx = jnp.sum(keep < query_pos[:, None], axis=1).astype(jnp.int32)
    text_tokens = jnp.sum((~av) & (positions <= query_pos[:, None]), axis=1).astype(jnp.int32)
    n_text = int(np.sum(layout.modality == TEXT))
    real = jnp.ones(keep.shape, bool)
    seg = None
    counts, layer_keep = [], []
    rows = jnp.arange(b)[:, None]
    for l, layer in enumerate(lm.layers):
        counts.append(jnp.sum(av & real & (positions <= query_pos[:, None]), axis=1))
        layer_keep.append(jnp.zeros((b, t_full), bool).at[rows, positions].set(real))
        x_in = x
        x = layer(x, positions, segment_ids=seg)[0]
        st = stages.get(l)
        if st is None:
            continue
        probs = _query_attention(layer, x_in, positions, seg, q_idx, c)
        valid = av & real
        n_valid = jnp.sum(valid, axis=1).astype(jnp.int32)
        n_slots = int(av.shape[1] - n_text)  # AV slots in the sequence (text is never dropped)
        if st.kind == "fastv":
            cap = min(st.keep, n_slots)
            count = jnp.minimum(n_valid, cap)
            padded = seg is not None
        elif st.kind == "adaptive":
            cap = max(1, math.ceil(st.r_max * n_slots))
            lo = jnp.minimum(jnp.maximum(1, _ceil_table(st.r_min, n_slots)[n_valid]), cap)
            hi = jnp.minimum(jnp.maximum(1, _ceil_table(st.r_max, n_slots)[n_valid]), cap)
            count = jnp.minimum(cumulative_mass_count(probs, valid, mass=st.mass, lo=lo, hi=hi), n_valid)
            padded = seg is not None or cap > min(max(1, math.ceil(st.r_min * n_slots)), cap)
        else:  # epsilon
            cap = n_slots
            count = epsilon_keep_count(probs, valid, eps=st.eps)
            padded = True
        # valid AV tokens first (by attention), then padding AV slots, then text: exactly `cap` AV slots kept
        rank = _row_ranks(jnp.where(valid, probs, jnp.where(av, -1.0, -2.0)))
        keep_mask = (~av) | (rank < cap)
        idx = keep_indices(keep_mask, n_text + cap)
        real_new = jnp.take_along_axis((~av) | (valid & (rank < count[:, None])), idx, axis=1)
        x = jnp.take_along_axis(x, idx[:, :, None], axis=1)
        positions = jnp.take_along_axis(positions, idx, axis=1)
        av = jnp.take_along_axis(av, idx, axis=1)
        q_idx = jnp.sum(idx < q_idx[:, None], axis=1).astype(jnp.int32)
        real = real_new
        if padded:
            seg = real.astype(jnp.int32)
    layer_keep = jnp.stack(layer_keep, axis=1)
    x = jnp.take_along_axis(x, q_idx[:, None, None], axis=1)
    h = lm.final_norm(x)
    if c.tie_embeddings:
        logits = jnp.einsum("btD,vD->btv", h, lm.embed[...].astype(c.compute_dtype))
    else:
        logits = h @ lm.unembed[...].astype(c.compute_dtype)
    return PrunedOutput(logits[:, 0].astype(jnp.float32), jnp.stack(counts, axis=1).astype(jnp.int32), text_tokens,
                        layer_keep[:, -1], layer_keep)


# ------------------------------------------------------------------ compute model


def scoring_flops(config, *, relevance_queries: int = 0, relevance_keys: int = 0, in_lm_keys: int = 0,
                  relevance: str = "layer0") -> float:
    """FLOPs of the scoring a method adds (2 per multiply-add; elementwise work not counted).

    Relevance ("layer0"): queries of `relevance_queries` tokens (2 D h d each) and keys of
    `relevance_keys` tokens (2 D k d each), then 2 h d per (query, key) pair; ("embed"): 2 D per pair.
    In-LM stage: one query row (2 D h d) against `in_lm_keys` keys (2 h d each; the keys themselves
    are the layer's own).
    """
    D, h, k, d = config.d_model, config.num_heads, config.num_kv_heads, config.resolved_head_dim
    if relevance == "layer0":
        rel = 2.0 * D * d * (h * relevance_queries + k * relevance_keys) + 2.0 * h * d * relevance_queries * relevance_keys
    else:
        rel = 2.0 * D * relevance_queries * relevance_keys
    lm_row = (2.0 * D * h * d + 2.0 * h * d * in_lm_keys) if in_lm_keys else 0.0
    return float(rel + lm_row)


def modeled_flops(config, tokens_per_layer, *, overhead: float = 0.0) -> float:
    """Forward FLOPs of a prefill whose layer l runs `tokens_per_layer[l]` tokens, plus one row's logits.

    From `TransformerConfig.flops_per_token` (which is 3x forward): per token and layer, the weight
    matmuls cost W = (fpt(0) / 6 - D v) / L * 2 FLOPs and attention over N tokens 4 N h d, so
    layer l costs N_l (W + 4 N_l h d); the logits of the query row cost 2 D v. `overhead` (FLOPs of
    the method's scoring) is added.

    Args:
      config: a `models.transformer.TransformerConfig`.
      tokens_per_layer: [L] token counts (numbers >= 0).
      overhead: extra FLOPs (>= 0).

    Raises:
      ValueError: tokens_per_layer not of length L, negative counts or overhead.
    """
    N = np.asarray(tokens_per_layer, np.float64)
    L = config.num_layers
    if N.shape != (L,):
        raise ValueError(f"tokens_per_layer: expected shape ({L},), got {N.shape}")
    if np.any(N < 0) or overhead < 0:
        raise ValueError(f"tokens_per_layer, overhead: expected values >= 0, got {N.tolist()}, {overhead}")
    D, v = config.d_model, config.vocab_size
    hd = config.num_heads * config.resolved_head_dim
    w_layer = 2.0 * (config.flops_per_token(0) / 6.0 - D * v) / L
    return float(np.sum(N * (w_layer + 4.0 * N * hd)) + 2.0 * D * v + overhead)
