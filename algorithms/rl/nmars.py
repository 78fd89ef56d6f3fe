"""N-MARS: non-monotonic autoregressive decoding with a learned <UNDO> token.

<UNDO> retracts the previous output token: the raw stream the model emits is append-only (the model
keeps conditioning on its erased tokens), the rendered output is a stack (each <UNDO> pops one token,
an <UNDO> on an empty output is a no-op, the prompt is never erased). This module adds the token to a
trained decoder, trains it on sequences built from the model's own deviations, and rewards it in GRPO.

Public functions:
  * vocabulary: `add_undo_token` (one more embedding row, "semantic" / "random" / "zero" init; the
    <UNDO> id is the old vocabulary size V), `extend_config` (`vocab_size=V + 1`);
  * rendering: `render` (numpy), `render_batch` (jittable);
  * data and loss: `diff_augment` / `diff_augment_batch` (the paper's sequence-alignment augmentation
    of the model's own samples, Section 3.1 Eq. 2-5), `augment_batch` (the spec's inferred simpler
    variant: a deviation of k tokens, k <UNDO>s, then the reference), `msft_loss` (mSFT, Eq. 6: no loss
    on error tokens; `mask_deviations=False` is the control arm);
  * GRPO reward: `undo_stats`, `undo_reward`, `make_reward_fn` (a `reward_fn` for
    `algorithms.rl.grpo.train`);
  * decoding and metrics: `NoUndoSampler` (drops the <UNDO> logit column, so it draws the original
    model's tokens for the same key), `undo_metrics` (exact match, <UNDO> rate and precision, overhead).

Sources: the authors' paper sources (Section 3.1 Eq. 2-5, Section 3.2 Eq. 6, the appendix on
augmentations) and their released `sequence_alignment.py` (read, not copied). Where we differ or
choose: `experiments/nmars.py` samples at a temperature (Eq. 2; the released script decodes greedily); a region
whose error span is empty gets its corrections without <UNDO> (Eq. 5 with k_i = 0; the released code
drops them, which breaks render(y*) = y); the sample is cut at its first EOS; `spans="first"` and
`alignment="prefix"` are controls of ours. [INFER] the reward's form (`undo_reward`; the paper's R_inc
and R_pen of Section 3.3 are not reproduced term for term; every weight is an argument). Not
implemented: the "truncate the context" reading of <UNDO>.

Dimension legend: `b` sequences, `T` tokens of a full sequence, `N` generated (completion) tokens,
`L` reference answer tokens, `v` vocabulary, `D` model width.

Spec: `../shared/papers/specs/rl_alignment_agents.md`, section 4.

References:
  N-MARS: Non-Monotonic AutoRegressive Sequence modelling with an <UNDO> token,
    ICML 2026 (poster 61349; authors and arXiv id not available to us).
  Cundy, Ermon, "SequenceMatch: Imitation Learning for Autoregressive Sequence
    Modelling with Backtracking", arXiv:2306.05426, 2023 (<backspace>).
  Shao et al., "DeepSeekMath", arXiv:2402.03300, 2024 (GRPO).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from primitives.sampling import Sampler, greedy

__all__ = [
    "INITS",
    "MODES",
    "render",
    "render_batch",
    "add_undo_token",
    "extend_config",
    "NoUndoSampler",
    "augment_batch",
    "ALIGNMENTS",
    "SPANS",
    "DiffTrace",
    "diff_augment",
    "diff_augment_batch",
    "msft_loss",
    "UndoStats",
    "undo_stats",
    "undo_reward",
    "make_reward_fn",
    "undo_metrics",
]

INITS = ("semantic", "random", "zero")
MODES = ("token", "outcome")


# --- 1. rendering -------------------------------------------------------------------------------


def render(tokens: Sequence[int] | np.ndarray, undo_id: int, *, protected: int = 0) -> list[int]:
    """Renders a raw stream with stack semantics: each <UNDO> pops the last output token.

    Args:
      tokens: the raw stream (1-D ints).
      undo_id: the <UNDO> id.
      protected: the first `protected` tokens (a prompt) can never be popped; an
        <UNDO> that would erase them is a no-op, like an <UNDO> on an empty output.

    Returns:
      The rendered list of token ids (protected prefix included).

    Examples:
      >>> render([5, 6, 9, 7], undo_id=9)
      [5, 7]
      >>> render([9, 5, 9, 9, 6], undo_id=9)
      [6]
      >>> render([1, 5, 9, 9], undo_id=9, protected=1)
      [1]
    """
    arr = np.asarray(tokens)
    if arr.ndim != 1:
        raise ValueError(f"tokens: expected a 1-D sequence, got shape {arr.shape}")
    if protected < 0 or protected > arr.shape[0]:
        raise ValueError(f"protected: expected an int in [0, len(tokens)={arr.shape[0]}], got {protected}")
    out = [int(t) for t in arr[:protected]]
    for tok in arr[protected:].tolist():
        if tok == undo_id:
            if len(out) > protected:
                out.pop()
        else:
            out.append(int(tok))
    return out


@jax.jit
def _render_batch(tokens, lengths, undo_id, pad_id):
    b, n = tokens.shape
    rows = jnp.arange(b)

    def step(carry, inp):
        buf, ptr = carry
        tok, j = inp
        valid = j < lengths
        is_undo = tok == undo_id
        push = valid & ~is_undo
        pop = valid & is_undo
        buf = buf.at[rows, jnp.minimum(ptr, n - 1)].set(jnp.where(push, tok, buf[rows, jnp.minimum(ptr, n - 1)]))
        ptr = jnp.where(push, ptr + 1, jnp.where(pop, jnp.maximum(ptr - 1, 0), ptr))
        return (buf, ptr), None

    init = (jnp.full((b, n), pad_id, jnp.int32), jnp.zeros((b,), jnp.int32))
    (buf, ptr), _ = jax.lax.scan(step, init, (tokens.T, jnp.arange(n)))
    buf = jnp.where(jnp.arange(n)[None, :] < ptr[:, None], buf, pad_id)
    return buf, ptr


def render_batch(tokens: jax.Array, lengths: jax.Array, *, undo_id: int, pad_id: int = 0) -> tuple[jax.Array, jax.Array]:
    """Batched, jittable `render` of completions (nothing protected: completions never hold the prompt).

    Args:
      tokens: [b, N] int raw completions.
      lengths: [b] number of valid tokens per row (the rest is ignored).
      undo_id: the <UNDO> id.
      pad_id: written after each rendered row.

    Returns:
      (rendered [b, N] int32 padded with `pad_id`, rendered lengths [b] int32).
    """
    tokens = jnp.asarray(tokens, jnp.int32)
    lengths = jnp.asarray(lengths, jnp.int32)
    if tokens.ndim != 2 or lengths.shape != tokens.shape[:1]:
        raise ValueError(f"tokens, lengths: expected [b, N] and [b]; got {tokens.shape} and {lengths.shape}")
    return _render_batch(tokens, lengths, jnp.int32(undo_id), jnp.int32(pad_id))


# --- 0. vocabulary ------------------------------------------------------------------------------


def add_undo_token(params: dict, *, init: str = "semantic", semantic_ids: Sequence[int] | None = None,
                   key: jax.Array | None = None) -> tuple[dict, int]:
    """Appends an <UNDO> row to the embedding (and a column to an untied LM head).

    Args:
      params: a `models.Transformer` params pure dict with `embed` [V, D] and,
        when untied, `unembed` [D, V].
      init: "semantic" (mean of the `semantic_ids` rows; all rows when None),
        "random" (normal with the per-entry std of the existing rows; needs
        `key`) or "zero".
      semantic_ids: token ids whose mean initialises <UNDO> (semantic init).
      key: PRNG key for "random".

    Returns:
      (new params with vocabulary V + 1, undo_id = V). Other entries are
      untouched, so every old token keeps its logits exactly.
    """
    if init not in INITS:
        raise ValueError(f"init: expected one of {INITS}, got {init!r}")
    if "embed" not in params or getattr(params["embed"], "ndim", 0) != 2:
        raise ValueError(f"params: expected an 'embed' [V, D] entry; got keys {sorted(params)}")
    embed = jnp.asarray(params["embed"])
    v, d = embed.shape
    unembed = params.get("unembed")
    if unembed is not None and tuple(unembed.shape) != (d, v):
        raise ValueError(f"params['unembed']: expected shape [D, V]=({d}, {v}), got {tuple(unembed.shape)}")
    if init == "semantic":
        ids = np.arange(v) if semantic_ids is None or len(semantic_ids) == 0 else np.asarray(semantic_ids)
        if ids.min() < 0 or ids.max() >= v:
            raise ValueError(f"semantic_ids: expected ids in [0, V={v}), got {list(map(int, ids))}")
        row = embed[ids].mean(0)
        col = None if unembed is None else jnp.asarray(unembed)[:, ids].mean(1)
    elif init == "random":
        if key is None:
            raise ValueError("key: a PRNG key is required for init='random'")
        k1, k2 = jax.random.split(key)
        row = jax.random.normal(k1, (d,), embed.dtype) * embed.std()
        col = None if unembed is None else jax.random.normal(k2, (d,), unembed.dtype) * jnp.asarray(unembed).std()
    else:
        row = jnp.zeros((d,), embed.dtype)
        col = None if unembed is None else jnp.zeros((d,), unembed.dtype)
    new = dict(params)
    new["embed"] = jnp.concatenate([embed, row[None, :].astype(embed.dtype)], axis=0)
    if unembed is not None:
        new["unembed"] = jnp.concatenate([jnp.asarray(unembed), col[:, None].astype(unembed.dtype)], axis=1)
    return new, v


def extend_config(config: Any) -> Any:
    """The model config with one more token (`vocab_size + 1`) for <UNDO>."""
    return dataclasses.replace(config, vocab_size=config.vocab_size + 1)


@dataclasses.dataclass(frozen=True, kw_only=True)
class NoUndoSampler(Sampler):
    """A `Sampler` that never emits <UNDO> (the last id): p(UNDO) = 0.

    The <UNDO> column is dropped before sampling, so the draws equal those of
    the same `Sampler` on the model without <UNDO> for the same key.
    `log_probs` reports -inf for <UNDO>, consistently with what is sampled.

    Attributes:
      undo_id: the <UNDO> id; must be the last id (`logits.shape[-1] - 1`).
    """

    undo_id: int = -1

    def __post_init__(self):
        super().__post_init__()
        if self.undo_id < 1:
            raise ValueError(f"undo_id: expected the <UNDO> id (>= 1), got {self.undo_id}")

    def _base(self) -> Sampler:
        return Sampler(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p)

    def _check(self, logits):
        if logits.shape[-1] != self.undo_id + 1:
            raise ValueError(f"logits: expected the <UNDO> id {self.undo_id} to be the last of "
                             f"{self.undo_id + 1} ids, got vocabulary {logits.shape[-1]}")

    def filtered_logits(self, logits: jax.Array) -> jax.Array:
        self._check(logits)
        x = self._base().filtered_logits(logits[..., : self.undo_id])
        return jnp.concatenate([x, jnp.full(x.shape[:-1] + (1,), -jnp.inf, x.dtype)], axis=-1)

    def __call__(self, logits: jax.Array, key: jax.Array) -> jax.Array:
        self._check(logits)
        if self.is_greedy:
            return greedy(logits[..., : self.undo_id])
        return self._base()(logits[..., : self.undo_id], key)


# --- 2-3. augmentation and masked SFT ---------------------------------------------------------------


def _sample_restricted(logits: np.ndarray, allowed: np.ndarray, rng: np.random.Generator, temperature: float,
                       exclude: int | None = None) -> int:
    """Samples one id among `allowed` (minus `exclude`) from softmax(logits / temperature)."""
    ids = allowed if exclude is None else allowed[allowed != exclude]
    x = logits[ids].astype(np.float64) / temperature
    p = np.exp(x - x.max())
    return int(ids[rng.choice(len(ids), p=p / p.sum())])


def augment_batch(logits_fn: Callable[[np.ndarray], np.ndarray], tokens: np.ndarray, prompt_lengths: np.ndarray,
                  completion_lengths: np.ndarray, *, undo_id: int, rng: np.random.Generator,
                  allowed_ids: Sequence[int], augment_fraction: float = 0.5,
                  deviation_lengths: Sequence[int] = (1, 2, 3), position_mode: str = "hard",
                  temperature: float = 1.0, mask_deviations: bool = True, pad_id: int = 0,
                  seq_len: int | None = None) -> dict[str, np.ndarray]:
    """Turns clean references into error-correction traces from the model's own deviations.

    For each row chosen (probability `augment_fraction`), one position t of the
    completion is picked (`position_mode="hard"`: uniformly among the positions
    where the model's greedy top-1 disagrees with y*_t, any position when there
    is none; "random": any position), a deviation length k is drawn from
    `deviation_lengths`, the model samples ŷ_1 != y*_t and then ŷ_2..ŷ_k, each
    conditioned on y*_{<t} ⊕ ŷ_{<j} (at `temperature`, restricted to
    `allowed_ids`), and the row becomes y*_{<t} ⊕ ŷ ⊕ <UNDO>^k ⊕ y*_{>=t}.

    Args:
      logits_fn: `tokens [b, T] -> logits [b, T, v]` of the model that deviates
        (e.g. a jitted forward of the current or the warm-start model).
      tokens: [b, T] clean `[BOS] + prompt + completion + [EOS]` rows (right-padded).
      prompt_lengths: [b] index of the first completion token.
      completion_lengths: [b] completion tokens (EOS included).
      undo_id: the <UNDO> id.
      rng: numpy generator (the whole augmentation is deterministic in it).
      allowed_ids: ids a deviation may use (e.g. the answer alphabet).
      augment_fraction: share of rows augmented; the rest stay clean.
      deviation_lengths: the k to draw from (uniformly).
      position_mode: "hard" or "random".
      temperature: deviation sampling temperature (> 0).
      mask_deviations: mSFT (True): loss weight 0 on deviation targets; False:
        plain SFT on the augmented traces.
      pad_id: padding id.
      seq_len: output width T' (default T + 2 max(k)).

    Returns:
      A dict in the `experiments.tasks.lm_batch` layout: `tokens` [b, T'],
      `inputs` / `targets` / `loss_mask` [b, T'-1], `prompt_lengths` [b], plus
      `deviation_mask` [b, T'-1] (1 where the target is a deviation token),
      `num_undo` [b], `deviation_start` [b] (index of ŷ_1 in `tokens`, -1 when
      clean) and `lengths` [b] (real tokens per row).
    """
    tokens = np.asarray(tokens)
    prompt_lengths = np.asarray(prompt_lengths)
    completion_lengths = np.asarray(completion_lengths)
    if tokens.ndim != 2:
        raise ValueError(f"tokens: expected [b, T], got shape {tokens.shape}")
    b, t = tokens.shape
    if prompt_lengths.shape != (b,) or completion_lengths.shape != (b,):
        raise ValueError(f"prompt_lengths, completion_lengths: expected shape ({b},), got {prompt_lengths.shape} "
                         f"and {completion_lengths.shape}")
    if (prompt_lengths < 1).any() or (completion_lengths < 1).any() or (prompt_lengths + completion_lengths > t).any():
        raise ValueError("prompt_lengths, completion_lengths: expected >= 1 each and prompt + completion <= T")
    if not 0.0 <= augment_fraction <= 1.0:
        raise ValueError(f"augment_fraction: expected a value in [0, 1], got {augment_fraction}")
    ks = [int(k) for k in deviation_lengths]
    if not ks or min(ks) < 1:
        raise ValueError(f"deviation_lengths: expected a non-empty tuple of ints >= 1, got {deviation_lengths!r}")
    if position_mode not in ("hard", "random"):
        raise ValueError(f"position_mode: expected 'hard' or 'random', got {position_mode!r}")
    if not temperature > 0:
        raise ValueError(f"temperature: expected > 0, got {temperature}")
    allowed = np.unique(np.asarray(allowed_ids, np.int64))
    if allowed.size < 2:
        raise ValueError(f"allowed_ids: expected at least 2 ids, got {list(allowed)}")
    out_len = t + 2 * max(ks) if seq_len is None else int(seq_len)
    if out_len < t + 2 * max(ks):
        raise ValueError(f"seq_len: expected at least T + 2 max(k) = {t + 2 * max(ks)}, got {seq_len}")

    # Room for the deviation even when a completion ends at the last column (one shape for every pass).
    work = np.concatenate([tokens, np.full((b, max(ks)), pad_id, tokens.dtype)], axis=1)
    logits = np.asarray(logits_fn(work))
    top1 = logits.argmax(-1)  # top1[i, j] predicts tokens[i, j + 1]
    starts = np.full(b, -1, np.int64)
    kk = np.zeros(b, np.int64)
    devs = np.zeros((b, max(ks)), np.int64)
    for i in range(b):
        if rng.random() >= augment_fraction:
            continue
        p, c = int(prompt_lengths[i]), int(completion_lengths[i])
        cand = np.arange(p, p + c)
        if position_mode == "hard":
            hard = cand[top1[i, cand - 1] != tokens[i, cand]]
            cand = hard if hard.size else cand
        starts[i] = cand[rng.integers(cand.size)]
        kk[i] = ks[rng.integers(len(ks))]
        devs[i, 0] = _sample_restricted(logits[i, starts[i] - 1], allowed, rng, temperature,
                                        exclude=int(tokens[i, starts[i]]))
    for j in range(1, max(ks)):  # ŷ_{j+1} given y*_{<t} ⊕ ŷ_{1..j}: one forward pass for all rows
        rows = np.nonzero(kk > j)[0]
        if rows.size == 0:
            break
        ctx = work.copy()
        for i in rows:
            ctx[i, starts[i]:starts[i] + j] = devs[i, :j]
        lg = np.asarray(logits_fn(ctx))
        for i in rows:
            devs[i, j] = _sample_restricted(lg[i, starts[i] + j - 1], allowed, rng, temperature)

    out = np.full((b, out_len), pad_id, np.int32)
    loss_mask = np.zeros((b, out_len - 1), np.float32)
    dev_mask = np.zeros((b, out_len - 1), np.float32)
    lengths = np.zeros(b, np.int32)
    for i in range(b):
        p, c = int(prompt_lengths[i]), int(completion_lengths[i])
        ref = tokens[i, : p + c]
        if starts[i] < 0:
            row = ref
        else:
            s, k = int(starts[i]), int(kk[i])
            row = np.concatenate([ref[:s], devs[i, :k], np.full(k, undo_id), ref[s:]])
            dev_mask[i, s - 1:s - 1 + k] = 1.0  # targets[j] = tokens[j + 1]
        out[i, : len(row)] = row
        lengths[i] = len(row)
        loss_mask[i, p - 1:len(row) - 1] = 1.0
    if mask_deviations:
        loss_mask = loss_mask * (1.0 - dev_mask)
    return {"tokens": out, "inputs": out[:, :-1].copy(), "targets": out[:, 1:].copy(), "loss_mask": loss_mask,
            "prompt_lengths": prompt_lengths.astype(np.int32), "deviation_mask": dev_mask,
            "num_undo": kk.astype(np.int32), "deviation_start": starts.astype(np.int32), "lengths": lengths}


ALIGNMENTS = ("diff", "prefix")
SPANS = ("all", "first")
# Kinds of the tokens of a `diff_augment` trace.
MATCHED, ERROR, UNDO, CORRECTION = 0, 1, 2, 3


class DiffTrace(NamedTuple):
    """An error-correction trace y* built from a model sample and its reference (`diff_augment`).

    Attributes:
      tokens: y* (ids, <UNDO> included, no EOS).
      loss_mask: M_t per token of y*: 0 on error-span tokens, 1 elsewhere (paper Eq. 6).
      kinds: per token, MATCHED (a sample token inside a matching block), ERROR (a sample token
        outside every block, Eq. 4), UNDO, or CORRECTION (a reference token, Eq. 5).
      error_positions: indices in y* of the ERROR tokens (where `loss_mask` is 0).
      undo_positions: indices in y* of the <UNDO> tokens.
    """

    tokens: list
    loss_mask: list
    kinds: list
    error_positions: list
    undo_positions: list


def _matching_blocks(reference: list[int], sample: list[int], alignment: str) -> list[tuple[int, int, int]]:
    """(a, b, l) with reference[a:a+l] == sample[b:b+l], in order, ending with (len(ref), len(sample), 0)."""
    if alignment == "diff":
        import difflib

        sm = difflib.SequenceMatcher(None, reference, sample, autojunk=False)
        return [(m.a, m.b, m.size) for m in sm.get_matching_blocks()]
    j = 0
    while j < min(len(reference), len(sample)) and reference[j] == sample[j]:
        j += 1
    return [(0, 0, j), (len(reference), len(sample), 0)]


def diff_augment(sample: Sequence[int], reference: Sequence[int], *, undo_id: int, spans: str = "all",
                 alignment: str = "diff") -> DiffTrace:
    """The paper's sequence-alignment augmentation of one model sample (Section 3.1, Eq. 3-5).

    The sample y_hat is aligned to the reference y by its maximal matching blocks (`difflib`, as the
    authors' code does). Walking y_hat: a matched block is copied; the error span between two blocks
    (the y_hat tokens no block covers) is copied, followed by one <UNDO> per error token and by the
    reference tokens between the same two blocks (the correction). With `spans="first"`, after the
    first non-empty error span and its <UNDO>s the trace continues with the rest of the reference
    (one repair). In both cases `render(tokens) == reference`, and `loss_mask` is 0 exactly on the
    error tokens (mSFT: errors are context, never targets).

    Args:
      sample: [m] the model's completion (ids, cut before EOS, no <UNDO>).
      reference: [n] the reference completion (ids, no EOS, no <UNDO>).
      undo_id: the <UNDO> id.
      spans: "all" (paper Eq. 5: every divergence region is repaired) or "first".
      alignment: "diff" (maximal matching blocks, paper Eq. 3) or "prefix" (a control of ours: one
        block, the longest common prefix; everything after it in the sample is one error span).

    Returns:
      A `DiffTrace`. A correct sample gives tokens == reference and no <UNDO>.

    Examples:
      >>> t = diff_augment([1, 2, 7, 4], [1, 2, 3, 4], undo_id=9)
      >>> t.tokens, t.loss_mask
      ([1, 2, 7, 9, 3, 4], [1, 1, 0, 1, 1, 1])
      >>> diff_augment([1, 7, 3, 8], [1, 2, 3, 4], undo_id=9, spans="first").tokens
      [1, 7, 9, 2, 3, 4]
    """
    if spans not in SPANS:
        raise ValueError(f"spans: expected one of {SPANS}, got {spans!r}")
    if alignment not in ALIGNMENTS:
        raise ValueError(f"alignment: expected one of {ALIGNMENTS}, got {alignment!r}")
    s = [int(t) for t in np.asarray(sample).reshape(-1)]
    y = [int(t) for t in np.asarray(reference).reshape(-1)]
    if undo_id in s:
        raise ValueError(f"sample: expected no <UNDO> (id {undo_id}); render it first, got {s}")
    if undo_id in y:
        raise ValueError(f"reference: expected no <UNDO> (id {undo_id}), got {y}")
    tokens: list[int] = []
    kinds: list[int] = []

    def put(ids, kind):
        tokens.extend(ids)
        kinds.extend([kind] * len(ids))

    ra = sb = 0  # cursors in the reference and in the sample
    for a, b, size in _matching_blocks(y, s, alignment):
        err, corr = s[sb:b], y[ra:a]
        put(err, ERROR)
        put([undo_id] * len(err), UNDO)
        put(corr, CORRECTION)
        if err and spans == "first":
            put(y[a:], CORRECTION)
            break
        put(s[b:b + size], MATCHED)
        ra, sb = a + size, b + size
    mask = [0 if k == ERROR else 1 for k in kinds]
    return DiffTrace(tokens, mask, kinds, [i for i, k in enumerate(kinds) if k == ERROR],
                     [i for i, k in enumerate(kinds) if k == UNDO])


def diff_augment_batch(tokens: np.ndarray, prompt_lengths: np.ndarray, completion_lengths: np.ndarray,
                       samples: np.ndarray, sample_lengths: np.ndarray, *, undo_id: int, eos_id: int,
                       augment: np.ndarray | None = None, spans: str = "all", alignment: str = "diff",
                       mask_errors: bool = True, pad_id: int = 0, seq_len: int | None = None) -> dict[str, np.ndarray]:
    """`diff_augment` over a batch of clean rows and the model's samples for the same prompts.

    Row i becomes `tokens[i, :p] + diff_augment(sample_i, reference_i).tokens + [EOS]`, where the
    reference is the clean completion without its EOS and the sample is cut at its first EOS.

    Args:
      tokens: [b, T] clean `[BOS] + prompt + completion + [EOS]` rows (right-padded).
      prompt_lengths: [b] index of the first completion token.
      completion_lengths: [b] completion tokens, EOS included (the last one must be `eos_id`).
      samples: [b, N] the model's raw completions for the same prompts (no <UNDO>).
      sample_lengths: [b] valid tokens per sample (an EOS, if any, included).
      undo_id, eos_id: special ids.
      augment: [b] bool, rows to augment (default all); the other rows stay clean.
      spans, alignment: see `diff_augment`.
      mask_errors: mSFT (True): loss weight 0 on error targets; False: plain SFT on the traces.
      pad_id: padding id.
      seq_len: output width T' (default: the longest row); a row longer than it raises.

    Returns:
      The layout of `augment_batch`: `tokens` [b, T'], `inputs` / `targets` / `loss_mask` /
      `deviation_mask` (1 where the target is an error token) [b, T'-1], `prompt_lengths`,
      `num_undo`, `deviation_start` (index in `tokens` of the first error token, -1 if none) and
      `lengths` [b].
    """
    tokens, samples = np.asarray(tokens), np.asarray(samples)
    prompt_lengths, completion_lengths = np.asarray(prompt_lengths), np.asarray(completion_lengths)
    sample_lengths = np.asarray(sample_lengths)
    if tokens.ndim != 2 or samples.ndim != 2 or samples.shape[0] != tokens.shape[0]:
        raise ValueError(f"tokens, samples: expected [b, T] and [b, N], got {tokens.shape} and {samples.shape}")
    b, t = tokens.shape
    for name, arr in (("prompt_lengths", prompt_lengths), ("completion_lengths", completion_lengths),
                      ("sample_lengths", sample_lengths)):
        if arr.shape != (b,):
            raise ValueError(f"{name}: expected shape ({b},), got {arr.shape}")
    if (prompt_lengths < 1).any() or (completion_lengths < 1).any() or (prompt_lengths + completion_lengths > t).any():
        raise ValueError("prompt_lengths, completion_lengths: expected >= 1 each and prompt + completion <= T")
    if (sample_lengths < 0).any() or (sample_lengths > samples.shape[1]).any():
        raise ValueError(f"sample_lengths: expected values in [0, N={samples.shape[1]}], got {sample_lengths}")
    augment = np.ones(b, bool) if augment is None else np.asarray(augment, bool)
    if augment.shape != (b,):
        raise ValueError(f"augment: expected shape ({b},), got {augment.shape}")
    rows, masks, devs, n_undo, starts = [], [], [], np.zeros(b, np.int32), np.full(b, -1, np.int32)
    for i in range(b):
        p, c = int(prompt_lengths[i]), int(completion_lengths[i])
        if tokens[i, p + c - 1] != eos_id:
            raise ValueError(f"tokens: row {i} expected EOS ({eos_id}) at index {p + c - 1}, "
                             f"got {tokens[i, p + c - 1]}")
        ref = tokens[i, p:p + c - 1]
        if augment[i]:
            smp = samples[i, : int(sample_lengths[i])].tolist()
            smp = smp[: smp.index(eos_id)] if eos_id in smp else smp
            tr = diff_augment(smp, ref, undo_id=undo_id, spans=spans, alignment=alignment)
            comp, m = tr.tokens, tr.loss_mask
            n_undo[i] = len(tr.undo_positions)
            if tr.error_positions:
                starts[i] = p + tr.error_positions[0]
        else:
            comp, m = ref.tolist(), [1] * len(ref)
        rows.append(tokens[i, :p].tolist() + comp + [eos_id])
        masks.append(m + [1])
        devs.append([1 - x for x in m] + [0])
    width = max(len(r) for r in rows) if seq_len is None else int(seq_len)
    too_long = [i for i, r in enumerate(rows) if len(r) > width]
    if too_long:
        need = max(len(rows[i]) for i in too_long)
        raise ValueError(f"seq_len: expected at least {need} (row {too_long[0]}), got {width}")
    out = np.full((b, width), pad_id, np.int32)
    loss_mask = np.zeros((b, width - 1), np.float32)
    dev_mask = np.zeros((b, width - 1), np.float32)
    lengths = np.zeros(b, np.int32)
    for i, (r, m, d) in enumerate(zip(rows, masks, devs)):
        p = int(prompt_lengths[i])
        out[i, : len(r)] = r
        lengths[i] = len(r)
        # targets[j] = tokens[j + 1]: completion token k is the target at j = p - 1 + k.
        loss_mask[i, p - 1:p - 1 + len(m)] = m if mask_errors else 1.0
        dev_mask[i, p - 1:p - 1 + len(d)] = d
    return {"tokens": out, "inputs": out[:, :-1].copy(), "targets": out[:, 1:].copy(), "loss_mask": loss_mask,
            "prompt_lengths": prompt_lengths.astype(np.int32), "deviation_mask": dev_mask,
            "num_undo": n_undo, "deviation_start": starts, "lengths": lengths}


def msft_loss(logits: jax.Array, targets: jax.Array, loss_mask: jax.Array) -> jax.Array:
    """Masked next-token cross-entropy: mean over the targets with weight 1.

    The same quantity as `algorithms.training.next_token_loss` with the
    `loss_mask` of `augment_batch` (which is how the experiment trains); here as
    a function of the logits so the zero gradient on masked targets can be checked.

    Args:
      logits: [b, T, v]; targets: [b, T] int; loss_mask: [b, T] (0 on deviation targets).

    Returns:
      Scalar loss.
    """
    if logits.shape[:-1] != targets.shape or targets.shape != loss_mask.shape:
        raise ValueError(f"logits, targets, loss_mask: expected [b, T, v], [b, T], [b, T]; got {logits.shape}, "
                         f"{targets.shape}, {loss_mask.shape}")
    mask = loss_mask.astype(jnp.float32)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), targets)
    # where(): a masked target contributes exactly 0 (and a 0 gradient) even if its CE is inf.
    return jnp.where(mask > 0, ce * mask, 0.0).sum() / jnp.maximum(mask.sum(), 1.0)


# --- 4. reward and metrics ----------------------------------------------------------------------


class UndoStats(NamedTuple):
    """What one raw completion did.

    Attributes:
      rendered: the rendered output (EOS excluded).
      correct: rendered == reference.
      num_undo: <UNDO> tokens emitted.
      erased_wrong: <UNDO>s that popped a token differing from the reference at
        that rendered position (token-level "effective").
      erased_right: <UNDO>s that popped a correct token.
      noop: <UNDO>s on an empty output.
      raw_len: generated tokens (EOS included).
      stopped: whether an EOS ended the completion.
      undo_effective: one bool per <UNDO>, in order: True iff it erased a wrong token.
    """

    rendered: list
    correct: bool
    num_undo: int
    erased_wrong: int
    erased_right: int
    noop: int
    raw_len: int
    stopped: bool
    undo_effective: list


def undo_stats(completion: Sequence[int] | np.ndarray, length: int, reference: Sequence[int], *, undo_id: int,
               eos_id: int) -> UndoStats:
    """Renders a completion (stopping at EOS) and classifies each <UNDO> against the reference.

    Args:
      completion: [N] raw generated ids.
      length: valid tokens in `completion` (EOS included).
      reference: [L] the reference answer ids (no EOS).
      undo_id, eos_id: special ids.
    """
    comp = np.asarray(completion)[: int(length)].tolist()
    ref = [int(r) for r in reference]
    out: list[int] = []
    wrong = right = noop = 0
    eff: list[bool] = []
    stopped = False
    for tok in comp:
        if tok == eos_id:
            stopped = True
            break
        if tok == undo_id:
            if not out:
                noop += 1
                eff.append(False)
                continue
            popped = out.pop()
            pos = len(out)
            is_wrong = pos >= len(ref) or popped != ref[pos]
            wrong += is_wrong
            right += not is_wrong
            eff.append(bool(is_wrong))
        else:
            out.append(int(tok))
    return UndoStats(out, out == ref, wrong + right + noop, wrong, right, noop, len(comp), stopped, eff)


def undo_reward(stats: UndoStats, *, alpha: float = 0.05, beta: float = 0.05, max_undos: int = 8,
                mode: str = "token") -> float:
    """The N-MARS GRPO reward of one rollout ([INFER] form, see the module docstring).

        r = 1[correct] + alpha * n_eff * 1[correct] - beta * n_ineff

    mode "token": effective = erased a wrong token; ineffective = erased a
    correct token or popped nothing. mode "outcome": every <UNDO> is effective
    in a correct rollout and ineffective in a failed one. <UNDO>s after the
    first `max_undos` are always ineffective.
    """
    if mode not in MODES:
        raise ValueError(f"mode: expected one of {MODES}, got {mode!r}")
    if alpha < 0 or beta < 0:
        raise ValueError(f"alpha, beta: expected >= 0, got {alpha}, {beta}")
    if max_undos < 0:
        raise ValueError(f"max_undos: expected >= 0, got {max_undos}")
    capped = stats.undo_effective[:max_undos]
    over = stats.num_undo - len(capped)
    if mode == "token":
        n_eff = sum(capped)
        n_ineff = len(capped) - n_eff + over
    else:
        n_eff = len(capped) if stats.correct else 0
        n_ineff = over + (0 if stats.correct else len(capped))
    c = float(stats.correct)
    return c + alpha * n_eff * c - beta * n_ineff


def make_reward_fn(reference_fn: Callable[[Any], Sequence[int]], *, undo_id: int, eos_id: int,
                   alpha: float = 0.05, beta: float = 0.05, max_undos: int = 8, mode: str = "token"):
    """A batched `reward_fn(problems, completions [b, N], lengths [b]) -> [b]` for `grpo.train`.

    Args:
      reference_fn: `problem -> reference answer ids` (no EOS).
      undo_id, eos_id, alpha, beta, max_undos, mode: see `undo_reward`.
    """
    undo_reward(UndoStats([], True, 0, 0, 0, 0, 0, True, []), alpha=alpha, beta=beta, max_undos=max_undos,
                mode=mode)  # validates the arguments now

    def reward_fn(problems, completions, lengths):
        completions, lengths = np.asarray(completions), np.asarray(lengths)
        return np.array([undo_reward(undo_stats(completions[i], lengths[i], reference_fn(p), undo_id=undo_id,
                                                eos_id=eos_id), alpha=alpha, beta=beta, max_undos=max_undos,
                                     mode=mode)
                         for i, p in enumerate(problems)], np.float32)

    return reward_fn


def undo_metrics(completions: np.ndarray, lengths: np.ndarray, references: Sequence[Sequence[int]], *,
                 undo_id: int | None, eos_id: int) -> dict[str, float]:
    """Exact match of the rendered outputs and <UNDO> usage over a batch.

    Args:
      completions: [b, N] raw generations; lengths: [b].
      references: b reference answers (ids, no EOS).
      undo_id: the <UNDO> id (None for a model without one).
      eos_id: the EOS id.

    Returns:
      exact_match, undo_rate (<UNDO>s per raw token), undo_seq_frac (share of
      sequences with an <UNDO>), precision (share of <UNDO>s that erased a wrong
      token; nan without <UNDO>s), overhead (sum of raw tokens / sum of rendered
      tokens, EOS counted in both), and the raw counts.
    """
    completions, lengths = np.asarray(completions), np.asarray(lengths)
    if completions.ndim != 2 or lengths.shape != completions.shape[:1] or len(references) != len(lengths):
        raise ValueError(f"completions, lengths, references: expected [b, N], [b], b; got {completions.shape}, "
                         f"{lengths.shape}, {len(references)}")
    uid = -1 if undo_id is None else undo_id
    stats = [undo_stats(completions[i], lengths[i], references[i], undo_id=uid, eos_id=eos_id)
             for i in range(len(lengths))]
    raw = sum(s.raw_len for s in stats)
    rendered = sum(len(s.rendered) + s.stopped for s in stats)
    undos = sum(s.num_undo for s in stats)
    wrong = sum(s.erased_wrong for s in stats)
    return {
        "exact_match": float(np.mean([s.correct for s in stats])),
        "undo_rate": undos / max(raw, 1),
        "undo_seq_frac": float(np.mean([s.num_undo > 0 for s in stats])),
        "precision": wrong / undos if undos else float("nan"),
        "overhead": raw / max(rendered, 1),
        "num_undo": int(undos),
        "raw_tokens": int(raw),
    }
