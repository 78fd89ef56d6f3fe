"""Offline preference-optimization losses (DPO family) as pure functions of sequence log-probs.

Every loss takes per-pair sequence log-probabilities (the sum over the completion's tokens of
log pi(y_t | x, y_<t), e.g. from `primitives.policy_losses.sequence_logprob`) of the chosen
response y_w and the rejected response y_l, and returns the per-pair loss [n] (or its mean with
``reduction="mean"``). Dimension legend: `n` preference pairs.

With the policy / reference log-ratio difference

    h = [log pi(y_w|x) - log pi_ref(y_w|x)] - [log pi(y_l|x) - log pi_ref(y_l|x)]     (`log_ratio_margin`)

the losses are

  * `dpo_loss`:        -log sigmoid(beta * h)                               (Rafailov et al., eq. 7)
  * `margin_dpo_loss`: -log sigmoid(beta * h - gamma), a per-pair target margin gamma and optionally
                       a per-pair beta (the ODPO / SimPO / CAMP family; gamma = 0 is DPO)
  * `ipo_loss`:        (h - 1 / (2 tau))^2                                   (Azar et al., eq. 17)
  * `simpo_loss`:      -log sigmoid(beta * (log pi(y_w|x) / |y_w| - log pi(y_l|x) / |y_l|) - gamma),
                       length-normalized policy log-probs, no reference       (Meng et al., eq. 6)

`-log sigmoid(z)` is computed as `softplus(-z)`, finite for any finite z. Limiting cases (tested):
margin-DPO with gamma = 0 is DPO; SimPO with gamma = 0 and |y_w| = |y_l| = L equals DPO with
beta / L and a reference that assigns both responses the same log-probability (pi_ref "uniform").

Spec: papers/specs/rl_alignment_agents.md section 6 (CAMP: margin DPO with per-sample margin and beta
hooks) and the cross-cutting note "margin-DPO loss with per-sample margin_fn / beta_fn hooks".

References:
  Rafailov et al., "Direct Preference Optimization: Your Language Model is Secretly a Reward Model",
    arXiv:2305.18290, 2023 (DPO).
  Azar et al., "A General Theoretical Paradigm to Understand Learning from Human Preferences",
    arXiv:2310.12036, 2023 (IPO).
  Meng, Xia, Chen, "SimPO: Simple Preference Optimization with a Reference-Free Reward",
    arXiv:2405.14734, 2024 (SimPO).
  Amini, Vieira, Cotterell, "Direct Preference Optimization with an Offset", arXiv:2402.10571, 2024
    (ODPO: DPO with a per-pair margin).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from primitives.validation import check_finite, is_concrete

__all__ = [
    "REDUCTIONS",
    "log_ratio_margin",
    "dpo_loss",
    "margin_dpo_loss",
    "ipo_loss",
    "simpo_loss",
    "implicit_reward_accuracy",
]

REDUCTIONS = ("none", "mean")


def _as_pairs(**arrays) -> list[jax.Array]:
    """Checks that every named argument is a 1-D [n] array of one common n; returns them as float arrays."""
    out, n = [], None
    for name, x in arrays.items():
        x = jnp.asarray(x)
        if not jnp.issubdtype(x.dtype, jnp.floating):
            x = x.astype(jnp.float32)
        if x.ndim != 1:
            raise ValueError(f"{name} must be [n] (one value per pair); got shape {x.shape}")
        if n is None:
            n = x.shape[0]
        elif x.shape[0] != n:
            raise ValueError(f"{name} must have n={n} entries like the first argument; got shape {x.shape}")
        out.append(x)
    return out


def _per_pair(name: str, value, n: int, dtype) -> jax.Array:
    """A scalar or [n] hyper-parameter (margin, beta) broadcast to [n]."""
    x = jnp.asarray(value, dtype)
    if x.ndim == 0:
        return jnp.broadcast_to(x, (n,))
    if x.shape != (n,):
        raise ValueError(f"{name} must be a scalar or [n]=({n},); got shape {x.shape}")
    return x


def _check_positive(name: str, value) -> None:
    """A concrete scalar or array hyper-parameter must be finite and > 0 (traced values are not checked)."""
    check_finite(name, value)
    if not is_concrete(value):
        return
    arr = np.asarray(value, np.float64)
    if not np.all(arr > 0):
        raise ValueError(f"{name} must be > 0; got {name}={arr.min() if arr.ndim else arr.item()!r}"
                         + (" (min)" if arr.ndim else ""))


def _reduce(loss: jax.Array, reduction: str) -> jax.Array:
    if reduction == "none":
        return loss
    return loss.mean() if loss.size else jnp.zeros((), loss.dtype)


def _check_reduction(reduction: str) -> None:
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}; got {reduction!r}")


def log_ratio_margin(policy_chosen_logp: jax.Array, policy_rejected_logp: jax.Array,
                     ref_chosen_logp: jax.Array, ref_rejected_logp: jax.Array) -> jax.Array:
    """h = [log pi(y_w) - log pi_ref(y_w)] - [log pi(y_l) - log pi_ref(y_l)] per pair, [n].

    beta * h is the difference of DPO's implicit rewards of the chosen and the rejected response.

    Raises:
      ValueError: if the four arguments are not [n] arrays of one length.
    """
    pw, pl, rw, rl = _as_pairs(policy_chosen_logp=policy_chosen_logp, policy_rejected_logp=policy_rejected_logp,
                               ref_chosen_logp=ref_chosen_logp, ref_rejected_logp=ref_rejected_logp)
    return (pw - rw) - (pl - rl)


def dpo_loss(policy_chosen_logp: jax.Array, policy_rejected_logp: jax.Array, ref_chosen_logp: jax.Array,
             ref_rejected_logp: jax.Array, *, beta: float = 0.1, reduction: str = "none") -> jax.Array:
    """DPO: -log sigmoid(beta * h), h = `log_ratio_margin(...)` (Rafailov et al. 2023, eq. 7).

    Args:
      policy_chosen_logp, policy_rejected_logp: [n] sequence log-probs under the policy.
      ref_chosen_logp, ref_rejected_logp: [n] sequence log-probs under the frozen reference.
      beta: > 0, the inverse temperature of the implicit reward (strength of the KL anchor).
      reduction: "none" -> [n] per-pair losses; "mean" -> their mean (0 for n = 0).

    Returns:
      [n] or scalar loss.

    Raises:
      ValueError: on shape mismatch, beta not finite and > 0, or an unknown reduction.

    Examples:
      >>> import jax.numpy as jnp
      >>> z = jnp.zeros(2)
      >>> [round(float(v), 4) for v in dpo_loss(z, z, z, z)]  # log 2 at h = 0
      [0.6931, 0.6931]
    """
    return margin_dpo_loss(policy_chosen_logp, policy_rejected_logp, ref_chosen_logp, ref_rejected_logp,
                           beta=beta, margin=0.0, reduction=reduction)


def margin_dpo_loss(policy_chosen_logp: jax.Array, policy_rejected_logp: jax.Array, ref_chosen_logp: jax.Array,
                    ref_rejected_logp: jax.Array, *, beta=0.1, margin=0.0, reduction: str = "none") -> jax.Array:
    """DPO with a target margin: -log sigmoid(beta * h - margin), per pair.

    The margin (ODPO's offset, SimPO's gamma, CAMP's adaptive gamma(x)) asks the implicit-reward gap
    beta * h to exceed `margin` before the pair stops pulling: a positive margin pushes the pair
    harder, a negative one satisfies it sooner. A per-pair `beta` scales the optimization strength of
    each pair (CAMP's `beta_fn` hook). margin = 0 with a scalar beta is `dpo_loss`.

    Args:
      policy_chosen_logp, policy_rejected_logp, ref_chosen_logp, ref_rejected_logp: [n] sequence log-probs.
      beta: > 0, scalar or [n].
      margin: scalar or [n] (any sign).
      reduction: "none" or "mean".

    Returns:
      [n] or scalar loss.

    Raises:
      ValueError: on shape mismatch, beta not finite and > 0, a non-finite margin, or an unknown reduction.
    """
    _check_reduction(reduction)
    _check_positive("beta", beta)
    check_finite("margin", margin)
    h = log_ratio_margin(policy_chosen_logp, policy_rejected_logp, ref_chosen_logp, ref_rejected_logp)
    n = h.shape[0]
    z = _per_pair("beta", beta, n, h.dtype) * h - _per_pair("margin", margin, n, h.dtype)
    return _reduce(jax.nn.softplus(-z), reduction)


def ipo_loss(policy_chosen_logp: jax.Array, policy_rejected_logp: jax.Array, ref_chosen_logp: jax.Array,
             ref_rejected_logp: jax.Array, *, tau: float = 0.1, reduction: str = "none") -> jax.Array:
    """IPO: (h - 1 / (2 tau))^2 per pair (Azar et al. 2023, eq. 17, one sample per pair).

    The squared loss regresses the log-ratio gap to the finite target 1 / (2 tau) instead of pushing
    it to infinity as DPO does on deterministic preferences; its minimizer is h = 1 / (2 tau).

    Args:
      policy_chosen_logp, policy_rejected_logp, ref_chosen_logp, ref_rejected_logp: [n] sequence log-probs.
      tau: > 0, the regularization strength (IPO's tau; the target gap is 1 / (2 tau)).
      reduction: "none" or "mean".

    Returns:
      [n] or scalar loss.

    Raises:
      ValueError: on shape mismatch, tau not finite and > 0, or an unknown reduction.

    Examples:
      >>> import jax.numpy as jnp
      >>> z = jnp.zeros(1)
      >>> float(ipo_loss(z, z, z, z, tau=0.5)[0])  # (0 - 1)^2
      1.0
    """
    _check_reduction(reduction)
    _check_positive("tau", tau)
    h = log_ratio_margin(policy_chosen_logp, policy_rejected_logp, ref_chosen_logp, ref_rejected_logp)
    return _reduce((h - 1.0 / (2.0 * tau)) ** 2, reduction)


def simpo_loss(policy_chosen_logp: jax.Array, policy_rejected_logp: jax.Array, chosen_lengths: jax.Array,
               rejected_lengths: jax.Array, *, beta: float = 2.0, gamma: float = 0.5,
               reduction: str = "none") -> jax.Array:
    """SimPO: -log sigmoid(beta * (logp_w / |y_w| - logp_l / |y_l|) - gamma) (Meng et al. 2024, eq. 6).

    Reference-free: the implicit reward is the policy's length-normalized (average per-token)
    log-probability; gamma is the target reward margin. With gamma = 0 and |y_w| = |y_l| = L it is
    `dpo_loss` with beta / L and equal reference log-probs for the two responses.

    Args:
      policy_chosen_logp, policy_rejected_logp: [n] summed sequence log-probs under the policy.
      chosen_lengths, rejected_lengths: [n] completion lengths in tokens (> 0).
      beta: > 0 reward scale (SimPO's defaults are 2-2.5).
      gamma: target margin (finite).
      reduction: "none" or "mean".

    Returns:
      [n] or scalar loss.

    Raises:
      ValueError: on shape mismatch, beta not finite and > 0, a non-finite gamma, concrete lengths
        that are not > 0, or an unknown reduction.
    """
    _check_reduction(reduction)
    _check_positive("beta", beta)
    check_finite("gamma", gamma)
    pw, pl, lw, ll = _as_pairs(policy_chosen_logp=policy_chosen_logp, policy_rejected_logp=policy_rejected_logp,
                               chosen_lengths=chosen_lengths, rejected_lengths=rejected_lengths)
    for name, x in (("chosen_lengths", chosen_lengths), ("rejected_lengths", rejected_lengths)):
        if is_concrete(x) and not np.all(np.asarray(x) > 0):
            raise ValueError(f"{name} must be > 0 (tokens per completion); got min {np.asarray(x).min()}")
    z = beta * (pw / lw.astype(pw.dtype) - pl / ll.astype(pl.dtype)) - gamma
    return _reduce(jax.nn.softplus(-z), reduction)


def implicit_reward_accuracy(policy_chosen_logp: jax.Array, policy_rejected_logp: jax.Array,
                             ref_chosen_logp: jax.Array, ref_rejected_logp: jax.Array) -> jax.Array:
    """Fraction of pairs whose implicit reward ranks the chosen response first (h > 0); a scalar.

    Raises:
      ValueError: if the four arguments are not [n] arrays of one length.
    """
    h = log_ratio_margin(policy_chosen_logp, policy_rejected_logp, ref_chosen_logp, ref_rejected_logp)
    return (h > 0).astype(jnp.float32).mean() if h.size else jnp.zeros((), jnp.float32)
