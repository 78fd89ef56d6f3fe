"""Differential Smoothing (DS-GRPO): smooth the correct mass, sharpen the incorrect one.

Dimension legend: `B` prompts, `G` samples per prompt, `M` trajectories of a
tabular policy.

The paper's reward (theory) and practical advantage:

    r_DS(tau) = r(tau) - gamma_p * log pi_base(tau)    if tau is correct
    r_DS(tau) = r(tau) + gamma_n * log pi_base(tau)    otherwise

    A^DS_i = A_i - gamma_p * sg[log pi_old(y_i | x)]   if r_i is correct
    A^DS_i = A_i + gamma_n * sg[log pi_old(y_i | x)]   otherwise

with A_i the GRPO group-standardized advantage and sg a stop-gradient. A rarer
correct sample (lower log-prob) gets a larger advantage, a rarer incorrect one
a smaller (more negative) one, so RL stops concentrating on the already likely
correct solutions while still pushing mass off the incorrect ones.

Contents:

  * `ds_advantages` (arrays) and `ds_advantage_fn` (the engine hook of
    `algorithms.rl.grpo`): the advantage-level form (default, the paper's
    DS-GRPO) or the reward-level form (r_DS, then group standardization);
    sequence log-prob as a sum or a length mean.
  * `entropy_bonus_config` / `entropy_penalty_config`: the global entropy
    baselines (a positive or negative `entropy_coef` on the GRPO loss).
  * The exact tabular toy: `grpo_expected_weights` (the expected GRPO
    advantage of a correct / incorrect sample as a function of the correct
    mass, from the binomial law of the group), `tabular_expected_gradient`
    (the exact expected policy-gradient of vanilla / entropy-regularized /
    DS-GRPO for a softmax policy over M trajectories), `tabular_train`, the
    metrics `tabular_metrics` (correct mass, pass@k = 1 - (1 - C)^k, expected
    distinct correct among k samples, effective number of correct solutions),
    `ds_reward` and `kl_regularized_optimum` (pi_base * exp(r / beta) / Z).

References:
  Gai, Zeng, Zhang, Raghunathan, "Differential Smoothing Mitigates Sharpening and
    Improves LLM Reasoning", arXiv:2511.19942.
  Shao et al., "DeepSeekMath", arXiv:2402.03300, 2024 (GRPO).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from algorithms.rl.grpo import GRPOConfig, Rollout
from primitives import policy_losses

__all__ = [
    "ds_advantages",
    "ds_advantage_fn",
    "entropy_bonus_config",
    "entropy_penalty_config",
    "ds_reward",
    "kl_regularized_optimum",
    "entropy_regularized_optimum",
    "grpo_expected_weights",
    "tabular_expected_gradient",
    "TabularMetrics",
    "tabular_metrics",
    "tabular_train",
]

LEVELS = ("advantage", "reward")


def _smoothing_term(seq_logp, correct, gamma_p, gamma_n):
    return jax.lax.stop_gradient(jnp.where(correct, -gamma_p * seq_logp, gamma_n * seq_logp))


def ds_advantages(rewards: jax.Array, seq_logp_old: jax.Array, *, gamma_p: float, gamma_n: float,
                  level: str = "advantage", correct_threshold: float = 1.0, normalize_std: bool = True,
                  eps: float = 1e-6) -> jax.Array:
    """DS-GRPO advantages.

    Args:
      rewards: [B, G] rewards.
      seq_logp_old: [B, G] sequence log-probs under the sampling (old) policy
        (or the base policy); no gradient flows through them.
      gamma_p: >= 0, smoothing on correct samples (entropy bonus there).
      gamma_n: >= 0, sharpening on incorrect samples (entropy penalty there).
      level: "advantage" adds the term after group standardization (DS-GRPO);
        "reward" adds it to the reward before (r_DS, the theory's form).
      correct_threshold: a sample is correct iff reward >= this.
      normalize_std: GRPO std normalization.
      eps: added to the group std.

    Returns:
      [B, G] float32; equals `group_advantages(rewards)` exactly when both gammas are 0.

    Examples:
      >>> import jax.numpy as jnp
      >>> r = jnp.array([[1.0, 1.0, 0.0, 0.0]])
      >>> lp = jnp.log(jnp.array([[0.5, 0.1, 0.5, 0.1]]))
      >>> a = ds_advantages(r, lp, gamma_p=0.1, gamma_n=0.1)
      >>> bool(a[0, 1] > a[0, 0]), bool(a[0, 3] < a[0, 2])  # rarer correct up, rarer incorrect down
      (True, True)
    """
    if level not in LEVELS:
        raise ValueError(f"level must be one of {LEVELS}; got {level!r}")
    if gamma_p < 0 or gamma_n < 0:
        raise ValueError(f"gamma_p and gamma_n must be >= 0; got {gamma_p}, {gamma_n}")
    rewards = jnp.asarray(rewards, jnp.float32)
    seq_logp_old = jnp.asarray(seq_logp_old, jnp.float32)
    if rewards.ndim != 2 or rewards.shape != seq_logp_old.shape:
        raise ValueError(f"rewards and seq_logp_old must both be [B, G]; got {rewards.shape} and "
                         f"{seq_logp_old.shape}")
    term = _smoothing_term(seq_logp_old, rewards >= correct_threshold, gamma_p, gamma_n)
    if level == "reward":
        return policy_losses.group_advantages(rewards + term, normalize_std=normalize_std, eps=eps)
    return policy_losses.group_advantages(rewards, normalize_std=normalize_std, eps=eps) + term


def ds_advantage_fn(*, gamma_p: float, gamma_n: float, logp_reduction: str = "mean", level: str = "advantage",
                    correct_threshold: float = 1.0, normalize_std: bool = True, eps: float = 1e-6):
    """The DS-GRPO advantage as a hook for `algorithms.rl.grpo.train` / `rl_step`.

    Uses the rollout's sampling-policy log-probs (pi_old, the paper's practical
    choice), summed ("sum" = log pi(y | x)) or length-averaged ("mean") over
    the completion tokens.

    Returns:
      `advantage_fn(rollout) -> [B, G]`.
    """
    if logp_reduction not in ("sum", "mean"):
        raise ValueError(f"logp_reduction must be 'sum' or 'mean'; got {logp_reduction!r}")

    def advantage_fn(rollout: Rollout) -> jax.Array:
        seq = policy_losses.sequence_logprob(rollout.old_logp, rollout.mask, reduction=logp_reduction)
        return ds_advantages(rollout.rewards, seq.reshape(rollout.rewards.shape), gamma_p=gamma_p,
                             gamma_n=gamma_n, level=level, correct_threshold=correct_threshold,
                             normalize_std=normalize_std, eps=eps)

    return advantage_fn


def entropy_bonus_config(config: GRPOConfig, coef: float) -> GRPOConfig:
    """GRPO with a global entropy bonus: maximize J + coef * H(pi) (coef >= 0)."""
    if coef < 0:
        raise ValueError(f"coef must be >= 0; got {coef}")
    return dataclasses.replace(config, entropy_coef=float(coef))


def entropy_penalty_config(config: GRPOConfig, coef: float) -> GRPOConfig:
    """GRPO with a global entropy penalty (entropy minimization): J - coef * H(pi) (coef >= 0)."""
    if coef < 0:
        raise ValueError(f"coef must be >= 0; got {coef}")
    return dataclasses.replace(config, entropy_coef=-float(coef))


# --- the exact tabular toy ----------------------------------------------------------------


def ds_reward(rewards: jax.Array, log_p_base: jax.Array, correct: jax.Array, *, gamma_p: float,
              gamma_n: float) -> jax.Array:
    """r_DS = r - gamma_p log pi_base on correct trajectories, r + gamma_n log pi_base otherwise ([M])."""
    return jnp.where(correct, rewards - gamma_p * log_p_base, rewards + gamma_n * log_p_base)


def kl_regularized_optimum(log_p_base: jax.Array, rewards: jax.Array, beta: float) -> jax.Array:
    """argmax_pi E_pi[r] - beta KL(pi || pi_base) = pi_base * exp(r / beta) / Z, as probabilities [M].

    Examples:
      >>> import jax.numpy as jnp
      >>> kl_regularized_optimum(jnp.log(jnp.array([0.5, 0.5])), jnp.array([0.0, jnp.log(3.0)]), 1.0).round(4).tolist()
      [0.25, 0.75]
    """
    if not beta > 0:
        raise ValueError(f"beta must be > 0; got {beta}")
    return jax.nn.softmax(jnp.asarray(log_p_base, jnp.float32) + jnp.asarray(rewards, jnp.float32) / beta)


def grpo_expected_weights(correct_mass, group_size: int, *, normalize_std: bool = True,
                          eps: float = 1e-6) -> tuple[jax.Array, jax.Array]:
    """Expected GRPO advantage of one sample given it is correct / incorrect (binary rewards).

    The other G - 1 samples of its group hold j ~ Binomial(G - 1, C) correct
    ones, C the policy's correct mass. A correct sample in a group of c correct
    has A = (1 - c/G) / (std + eps), an incorrect one A = -(c/G) / (std + eps),
    std = sqrt(c/G (1 - c/G)) (zero advantage for all-equal groups).

    Returns:
      (w_plus, w_minus): E[A | correct], E[A | incorrect], scalars.
    """
    if group_size < 2:
        raise ValueError(f"group_size must be >= 2; got {group_size}")
    g = group_size
    c = jnp.asarray(correct_mass, jnp.float32)
    j = jnp.arange(g, dtype=jnp.float32)  # 0..G-1 correct among the others
    log_binom = (jax.scipy.special.gammaln(jnp.float32(g)) - jax.scipy.special.gammaln(j + 1)
                 - jax.scipy.special.gammaln(g - j))
    c_safe = jnp.clip(c, 1e-30, 1 - 1e-7)
    pmf = jnp.exp(log_binom + j * jnp.log(c_safe) + (g - 1 - j) * jnp.log1p(-c_safe))

    def adv(num_correct, is_correct):
        mean = num_correct / g
        std = jnp.sqrt(mean * (1 - mean)) if normalize_std else jnp.ones_like(mean)
        centred = (1.0 - mean) if is_correct else -mean
        scale = (std + eps) if normalize_std else 1.0
        return jnp.where((num_correct == 0) | (num_correct == g), 0.0, centred / scale)

    return jnp.sum(pmf * adv(j + 1, True)), jnp.sum(pmf * adv(j, False))


def tabular_expected_gradient(logits: jax.Array, correct: jax.Array, *, group_size: int, gamma_p: float = 0.0,
                              gamma_n: float = 0.0, entropy_coef: float = 0.0,
                              normalize_std: bool = True) -> jax.Array:
    """Exact expected ascent direction of (DS-)GRPO for pi = softmax(logits) over M trajectories.

    Each trajectory is one "token", so the on-policy clipped surrogate's
    gradient is the policy gradient E_{tau ~ pi}[A(tau) grad log pi(tau)], with
    A(tau) = w_plus(C) - gamma_p log pi(tau) on correct and
    w_minus(C) + gamma_n log pi(tau) on incorrect trajectories (pi_old = pi),
    plus `entropy_coef` times grad H(pi). For softmax, grad_theta log pi(tau) =
    e_tau - pi, so the expectation is pi * (A - <pi, A>) and
    grad H = -pi * (log pi + H).

    Returns:
      [M] the ascent direction in logit space.
    """
    logits = jnp.asarray(logits, jnp.float32)
    logp = jax.nn.log_softmax(logits)
    p = jnp.exp(logp)
    c_mass = jnp.sum(jnp.where(correct, p, 0.0))
    w_plus, w_minus = grpo_expected_weights(c_mass, group_size, normalize_std=normalize_std)
    adv = jnp.where(correct, w_plus - gamma_p * logp, w_minus + gamma_n * logp)
    pg = p * (adv - jnp.sum(p * adv))
    entropy = -jnp.sum(p * logp)
    return pg + entropy_coef * (-p * (logp + entropy))


class TabularMetrics(NamedTuple):
    """Metrics of a tabular policy (scalars, or [T] over training).

    Attributes:
      correct_mass: C = total probability of correct trajectories (= pass@1).
      pass_at_k: 1 - (1 - C)^k for each k in `ks` ([..., K]).
      distinct_correct: expected number of distinct correct trajectories among
        k samples, sum_{tau correct} 1 - (1 - pi(tau))^k ([..., K]).
      effective_correct: exp of the entropy of pi restricted to and renormalized
        on the correct set (number of equally likely correct solutions).
    """

    correct_mass: jax.Array
    pass_at_k: jax.Array
    distinct_correct: jax.Array
    effective_correct: jax.Array


def tabular_metrics(probs: jax.Array, correct: jax.Array, ks: tuple[int, ...] = (1, 4, 16, 64)) -> TabularMetrics:
    """Correctness and diversity of a distribution `probs` [M] over trajectories."""
    probs = jnp.asarray(probs, jnp.float32)
    ks_arr = jnp.asarray(ks, jnp.float32)
    c_mass = jnp.sum(jnp.where(correct, probs, 0.0))
    pass_k = 1.0 - (1.0 - c_mass) ** ks_arr
    distinct = jnp.sum(jnp.where(correct[:, None], 1.0 - (1.0 - probs[:, None]) ** ks_arr[None, :], 0.0), axis=0)
    q = jnp.where(correct, probs, 0.0) / jnp.maximum(c_mass, 1e-30)
    h = -jnp.sum(jnp.where(q > 0, q * jnp.log(jnp.where(q > 0, q, 1.0)), 0.0))
    return TabularMetrics(c_mass, pass_k, distinct, jnp.exp(h))


def tabular_train(base_logits: jax.Array, correct: jax.Array, *, num_steps: int, learning_rate: float,
                  group_size: int, gamma_p: float = 0.0, gamma_n: float = 0.0, entropy_coef: float = 0.0,
                  normalize_std: bool = True, ks: tuple[int, ...] = (1, 4, 16, 64)):
    """Runs exact expected-update (DS-)GRPO on a softmax policy started at `base_logits`.

    theta <- theta + learning_rate * tabular_expected_gradient(theta).

    Returns:
      (final probabilities [M], TabularMetrics over the num_steps + 1 iterates).
    """
    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1; got {num_steps}")
    correct = jnp.asarray(correct, bool)
    base_logits = jnp.asarray(base_logits, jnp.float32)
    if base_logits.ndim != 1 or correct.shape != base_logits.shape:
        raise ValueError(f"base_logits and correct must both be [M]; got {base_logits.shape}, {correct.shape}")
    return _tabular_scan(base_logits, correct, jnp.float32(learning_rate), jnp.float32(gamma_p),
                         jnp.float32(gamma_n), jnp.float32(entropy_coef), num_steps=int(num_steps),
                         group_size=int(group_size), normalize_std=bool(normalize_std), ks=tuple(ks))


@functools.partial(jax.jit, static_argnames=("num_steps", "group_size", "normalize_std", "ks"))
def _tabular_scan(base_logits, correct, learning_rate, gamma_p, gamma_n, entropy_coef, *, num_steps, group_size,
                  normalize_std, ks):
    # Coefficients are traced, so a sweep over them compiles once.
    def step(theta, _):
        g = tabular_expected_gradient(theta, correct, group_size=group_size, gamma_p=gamma_p, gamma_n=gamma_n,
                                      entropy_coef=entropy_coef, normalize_std=normalize_std)
        theta = theta + learning_rate * g
        return theta, tabular_metrics(jax.nn.softmax(theta), correct, ks)

    theta, traj = jax.lax.scan(step, base_logits, None, length=num_steps)
    first = tabular_metrics(jax.nn.softmax(base_logits), correct, ks)
    traj = jax.tree.map(lambda a, b: jnp.concatenate([a[None], b]), first, traj)
    return jax.nn.softmax(theta), traj


def entropy_regularized_optimum(log_p_base: jax.Array, rewards: jax.Array, *, beta: float,
                                entropy_coef: float) -> jax.Array:
    """argmax_pi E_pi[r] + entropy_coef H(pi) - beta KL(pi || pi_base), probabilities [M].

    = pi_base^(beta / (beta + c)) exp(r / (beta + c)) / Z with c = entropy_coef
    (c > 0 entropy bonus, -beta < c < 0 entropy penalty): the global-entropy
    baselines' optimum, to compare with DS's `kl_regularized_optimum(log_p_base, r_DS, beta)`.
    """
    t = beta + entropy_coef
    if not beta > 0 or not t > 0:
        raise ValueError(f"need beta > 0 and beta + entropy_coef > 0; got beta={beta}, entropy_coef={entropy_coef}")
    return jax.nn.softmax((beta * jnp.asarray(log_p_base, jnp.float32) + jnp.asarray(rewards, jnp.float32)) / t)
