"""Policy-gradient losses for RL post-training of LMs, as pure functions.

Dimension legend: `B` prompts (groups), `G` samples per prompt (group size),
`b` sequences (usually B * G), `t` completion tokens, `v` vocabulary.

Contents:

  * `group_advantages`: GRPO's group-relative advantage
    (r - mean_group) / (std_group + eps), zero for a group whose rewards are
    all equal.
  * `token_logprobs`, `sequence_logprob`, `entropy_from_logits`: log-probs of
    chosen tokens, their masked sum or mean per sequence, and the per-position
    entropy of a softmax.
  * `clipped_surrogate`: the PPO/GRPO clipped objective as a loss, reduced as a
    token mean over the batch ("token_mean", DAPO/Dr.GRPO style) or as a mean
    over sequences of per-sequence token means ("sequence_mean", the original
    GRPO), with the clip fraction and approximate KL reported.
  * `k3_kl`: Schulman's low-variance unbiased estimator of KL(pi || pi_ref)
    from samples of pi, per token.
  * `masked_mean`: the two reductions used above, on any per-token quantity.
  * `pass_at_k`: the unbiased pass@k estimator 1 - C(n-c, k) / C(n, k) of Chen
    et al., in the stable product form; `count_distinct_correct`: how many
    different correct solutions a list of samples contains.

References:
  Shao et al., "DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open
    Language Models", arXiv:2402.03300, 2024 (GRPO).
  Schulman et al., "Proximal Policy Optimization Algorithms", arXiv:1707.06347, 2017.
  Schulman, "Approximating KL Divergence", blog note, 2020 (the k3 estimator).
  Chen et al., "Evaluating Large Language Models Trained on Code", arXiv:2107.03374,
    2021 (unbiased pass@k).
  Gai, Zeng, Zhang, Raghunathan, "Differential Smoothing Mitigates Sharpening and
    Improves LLM Reasoning", arXiv:2511.19942 (pass@k and distinct-correct metrics).
"""

from __future__ import annotations

from typing import Hashable, Iterable

import jax
import jax.numpy as jnp
import numpy as np

from primitives.validation import check_finite, check_token_ids

__all__ = [
    "REDUCTIONS",
    "group_advantages",
    "token_logprobs",
    "sequence_logprob",
    "entropy_from_logits",
    "masked_mean",
    "clipped_surrogate",
    "k3_kl",
    "pass_at_k",
    "count_distinct_correct",
]

REDUCTIONS = ("token_mean", "sequence_mean")


def group_advantages(rewards: jax.Array, *, normalize_std: bool = True, eps: float = 1e-6) -> jax.Array:
    """GRPO advantages: rewards centred (and optionally scaled) within each group.

    A_i = (r_i - mean_j r_j) / (std_j r_j + eps) over the G samples of one
    prompt (population std, as in GRPO implementations). A group whose rewards
    are all equal gets exactly zero advantage (the numerator is zero), so it
    contributes no gradient. With `normalize_std=False` only the mean is
    subtracted (Dr. GRPO).

    Args:
      rewards: [B, G] rewards, one row per prompt.
      normalize_std: divide by the group standard deviation.
      eps: added to the std.

    Returns:
      [B, G] float32 advantages; each row sums to zero.

    Raises:
      ValueError: if `rewards` is not 2-D.

    Examples:
      >>> import jax.numpy as jnp
      >>> group_advantages(jnp.array([[1.0, 0.0], [1.0, 1.0]])).round(3).tolist()
      [[1.0, -1.0], [0.0, 0.0]]
    """
    rewards = jnp.asarray(rewards, jnp.float32)
    if rewards.ndim != 2:
        raise ValueError(f"rewards must be [B, G]; got shape {rewards.shape}")
    centred = rewards - rewards.mean(axis=-1, keepdims=True)
    if not normalize_std:
        return centred
    return centred / (rewards.std(axis=-1, keepdims=True) + eps)


def token_logprobs(logits: jax.Array, tokens: jax.Array, *, temperature: float = 1.0) -> jax.Array:
    """Log-probabilities of `tokens` under softmax(logits / temperature).

    Args:
      logits: [..., t, v] logits predicting each token.
      tokens: [..., t] int token ids in [0, v).
      temperature: > 0; the policy being optimized is the temperature-scaled one.

    Returns:
      [..., t] float32 log-probs.

    Raises:
      TypeError: if `tokens` is not an integer array.
      ValueError: on shape mismatch, a non-finite temperature, or concrete token ids outside
        [0, v). Traced ids (inside `jit`) are not checked: an out-of-range id then gives NaN.
    """
    check_finite("temperature", temperature)
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0; got {temperature}")
    if logits.shape[:-1] != tokens.shape:
        raise ValueError(f"logits [..., t, v] and tokens [..., t] disagree: {logits.shape} vs {tokens.shape}")
    check_token_ids("tokens", tokens, logits.shape[-1])
    logp = jax.nn.log_softmax(logits.astype(jnp.float32) / temperature, axis=-1)
    return jnp.take_along_axis(logp, tokens[..., None].astype(jnp.int32), axis=-1)[..., 0]


def sequence_logprob(token_logp: jax.Array, mask: jax.Array, *, reduction: str = "sum") -> jax.Array:
    """Per-sequence log-probability: the masked sum ("sum") or mean ("mean") over tokens.

    Args:
      token_logp: [b, t] per-token log-probs.
      mask: [b, t] 1 on real completion tokens.
      reduction: "sum" = log pi(y | x); "mean" = length-normalized.

    Returns:
      [b] float32 (0 for an empty row).
    """
    if reduction not in ("sum", "mean"):
        raise ValueError(f"reduction must be 'sum' or 'mean'; got {reduction!r}")
    if token_logp.shape != mask.shape or token_logp.ndim != 2:
        raise ValueError(f"token_logp and mask must both be [b, t]; got {token_logp.shape} and {mask.shape}")
    mask = mask.astype(jnp.float32)
    total = (token_logp * mask).sum(-1)
    if reduction == "sum":
        return total
    return total / jnp.maximum(mask.sum(-1), 1.0)


def entropy_from_logits(logits: jax.Array, *, temperature: float = 1.0) -> jax.Array:
    """Entropy (nats) of softmax(logits / temperature) over the last axis.

    Safe for -inf logits (masked tokens contribute 0).

    Examples:
      >>> import jax.numpy as jnp
      >>> float(entropy_from_logits(jnp.zeros(4)))  # log 4
      1.3862943649291992
    """
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0; got {temperature}")
    logp = jax.nn.log_softmax(jnp.asarray(logits, jnp.float32) / temperature, axis=-1)
    p = jnp.exp(logp)
    return -jnp.sum(jnp.where(p > 0, p * logp, 0.0), axis=-1)


def masked_mean(x: jax.Array, mask: jax.Array, *, reduction: str = "token_mean") -> jax.Array:
    """Masked mean of a per-token quantity [b, t].

    "token_mean": sum(x * mask) / sum(mask) (every token weighs the same);
    "sequence_mean": the mean over sequences with at least one token of each
    sequence's token mean (every sequence weighs the same).
    """
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}; got {reduction!r}")
    if x.shape != mask.shape or x.ndim != 2:
        raise ValueError(f"x and mask must both be [b, t]; got {x.shape} and {mask.shape}")
    mask = mask.astype(jnp.float32)
    if reduction == "token_mean":
        return (x * mask).sum() / jnp.maximum(mask.sum(), 1.0)
    count = mask.sum(-1)
    per_seq = (x * mask).sum(-1) / jnp.maximum(count, 1.0)
    has = (count > 0).astype(jnp.float32)
    return (per_seq * has).sum() / jnp.maximum(has.sum(), 1.0)


def clipped_surrogate(
    logp: jax.Array,
    old_logp: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    *,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    reduction: str = "token_mean",
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The PPO/GRPO clipped surrogate, as a loss to minimize.

    Per token, with ratio rho = exp(logp - old_logp) and advantage A:

        loss_t = -min(rho * A, clip(rho, 1 - eps, 1 + eps_high) * A)

    reduced over the real tokens with `masked_mean`. At rho = 1 the value is
    -A and the gradient is -A * grad logp (plain policy gradient); the gradient
    is zero once the ratio has left the trust region in the direction the
    advantage pushes (rho > 1 + eps_high with A > 0, rho < 1 - eps with A < 0).

    Args:
      logp: [b, t] log-probs under the policy being optimized (differentiated).
      old_logp: [b, t] log-probs under the sampling policy (treated as constants).
      advantages: [b] per-sequence or [b, t] per-token advantages (constants).
      mask: [b, t] 1 on real completion tokens.
      clip_eps: lower clip range eps (> 0).
      clip_eps_high: upper clip range (default = clip_eps; DAPO's clip-higher
        uses a larger one).
      reduction: "token_mean" or "sequence_mean" (see `masked_mean`).

    Returns:
      (scalar loss, metrics) with metrics "clip_fraction" (share of real tokens
      whose ratio is clipped in the active direction), "approx_kl"
      (token mean of old_logp - logp) and "ratio_mean".

    Examples:
      >>> import jax.numpy as jnp
      >>> lp = jnp.zeros((2, 3)); m = jnp.ones((2, 3))
      >>> loss, _ = clipped_surrogate(lp, lp, jnp.array([1.0, -1.0]), m)
      >>> float(loss)
      0.0
    """
    if logp.ndim != 2 or logp.shape != old_logp.shape or logp.shape != mask.shape:
        raise ValueError(f"logp, old_logp and mask must all be [b, t]; got {logp.shape}, {old_logp.shape}, "
                         f"{mask.shape}")
    if not clip_eps > 0:
        raise ValueError(f"clip_eps must be > 0; got {clip_eps}")
    high = clip_eps if clip_eps_high is None else clip_eps_high
    if not high > 0:
        raise ValueError(f"clip_eps_high must be > 0; got {clip_eps_high}")
    advantages = jnp.asarray(advantages, jnp.float32)
    if advantages.shape == logp.shape[:1]:
        advantages = advantages[:, None]
    elif advantages.shape != logp.shape:
        raise ValueError(f"advantages must be [b]={logp.shape[:1]} or [b, t]={logp.shape}; got {advantages.shape}")
    advantages = jax.lax.stop_gradient(advantages)
    old_logp = jax.lax.stop_gradient(old_logp)
    mask = mask.astype(jnp.float32)
    # Padding may hold arbitrary log-probs: zero the log-ratio there so exp stays finite.
    log_ratio = jnp.where(mask > 0, logp - old_logp, 0.0)
    ratio = jnp.exp(log_ratio)
    unclipped = ratio * advantages
    clipped = jnp.clip(ratio, 1.0 - clip_eps, 1.0 + high) * advantages
    per_token = -jnp.minimum(unclipped, clipped)
    loss = masked_mean(per_token, mask, reduction=reduction)
    is_clipped = jnp.logical_or(
        jnp.logical_and(ratio > 1.0 + high, advantages > 0), jnp.logical_and(ratio < 1.0 - clip_eps, advantages < 0)
    ).astype(jnp.float32)
    denom = jnp.maximum(mask.sum(), 1.0)
    metrics = {
        "clip_fraction": (is_clipped * mask).sum() / denom,
        "approx_kl": (-log_ratio * mask).sum() / denom,
        "ratio_mean": (ratio * mask).sum() / denom,
    }
    return loss, metrics


def k3_kl(logp: jax.Array, ref_logp: jax.Array) -> jax.Array:
    """Per-token k3 estimate of KL(pi || pi_ref) from tokens sampled from pi.

    k3 = exp(ref_logp - logp) - (ref_logp - logp) - 1 >= 0; its expectation
    under pi is the exact KL, and it is 0 where the two policies agree.

    Args:
      logp: [...] log-probs of the sampled tokens under pi (differentiated).
      ref_logp: [...] log-probs of the same tokens under the reference.

    Returns:
      [...] float32 non-negative estimates.

    Examples:
      >>> import jax.numpy as jnp
      >>> float(k3_kl(jnp.log(0.5), jnp.log(0.5)))
      0.0
    """
    if jnp.shape(logp) != jnp.shape(ref_logp):
        raise ValueError(f"logp and ref_logp must have the same shape; got {jnp.shape(logp)} and "
                         f"{jnp.shape(ref_logp)}")
    d = jnp.asarray(ref_logp, jnp.float32) - jnp.asarray(logp, jnp.float32)
    return jnp.exp(d) - d - 1.0


def _pass_at_k_scalar(n: int, c: int, k: int) -> float:
    if n - c < k:
        return 1.0
    # 1 - C(n-c, k) / C(n, k) = 1 - prod_{i=n-c+1}^{n} (1 - k / i), no big binomials.
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1, dtype=np.float64)))


def pass_at_k(num_samples, num_correct, k: int) -> np.ndarray:
    """Unbiased pass@k from n samples of which c are correct: 1 - C(n-c, k) / C(n, k).

    The probability that at least one of k samples drawn without replacement
    from the n is correct, which is an unbiased estimate of the model's pass@k.
    Computed in the stable product form 1 - prod_{i=n-c+1}^{n} (1 - k/i) in
    float64, so it is exact for c = 0 (0.0), c = n (1.0) and n - c < k (1.0).

    Args:
      num_samples: n per problem (int or int array).
      num_correct: c per problem, 0 <= c <= n (broadcast against n).
      k: 1 <= k <= n.

    Returns:
      float64 array of the broadcast shape (a 0-d array for scalars).

    Raises:
      ValueError: if k < 1, k > n, c < 0 or c > n.

    Examples:
      >>> round(float(pass_at_k(10, 3, 1)), 6), float(pass_at_k(10, 0, 5)), float(pass_at_k(10, 8, 5))
      (0.3, 0.0, 1.0)
    """
    n, c = np.broadcast_arrays(np.asarray(num_samples), np.asarray(num_correct))
    if not (np.issubdtype(n.dtype, np.integer) and np.issubdtype(c.dtype, np.integer)):
        if not (np.all(n == np.round(n)) and np.all(c == np.round(c))):
            raise ValueError(f"num_samples and num_correct must be integers; got {n} and {c}")
    n, c = n.astype(np.int64), c.astype(np.int64)
    k = int(k)
    if k < 1:
        raise ValueError(f"k must be >= 1; got {k}")
    if np.any(n < k):
        raise ValueError(f"k={k} must not exceed num_samples; got num_samples min {int(n.min())}")
    if np.any(c < 0) or np.any(c > n):
        raise ValueError(f"num_correct must lie in [0, num_samples]; got num_correct {c.tolist()} for "
                         f"num_samples {n.tolist()}")
    out = np.array([_pass_at_k_scalar(int(ni), int(ci), k) for ni, ci in zip(n.ravel(), c.ravel())],
                   dtype=np.float64)
    return out.reshape(n.shape)


def count_distinct_correct(solutions: Iterable[Hashable], correct: Iterable[bool]) -> int:
    """Number of distinct solutions among the correct samples.

    Args:
      solutions: one hashable per sample (e.g. the decoded completion text).
      correct: whether each sample is correct (same length).

    Returns:
      The count of distinct `solutions[i]` with `correct[i]` true.

    Examples:
      >>> count_distinct_correct(["1+2", "2+1", "1+2", "3"], [True, True, True, False])
      2
    """
    solutions, correct = list(solutions), [bool(x) for x in correct]
    if len(solutions) != len(correct):
        raise ValueError(f"solutions and correct must have the same length; got {len(solutions)} and "
                         f"{len(correct)}")
    return len({s for s, ok in zip(solutions, correct) if ok})
