"""CAMP: conflict-aware adaptive margin preference optimization (truthfulness vs helpfulness).

Every preference pair (y_a, y_b) of a prompt x carries two rating differences, one per objective:
Delta_T = T(y_a) - T(y_b) (truthfulness) and Delta_H = H(y_a) - H(y_b) (helpfulness), ratings in
[0, 1]. The pair is *conflicting* when the two objectives prefer different responses
(Delta_T * Delta_H < 0) and *consistent* otherwise (one of them may be 0).

CAMP (spec section 6(b)): orient every pair truthfulness-first (chosen = the response T prefers; on a
T tie, the one H prefers; a tie on both is dropped), then minimize the weighted margin-DPO loss

    L = w * [-log sigmoid(beta * h - gamma)],      h = the policy/reference log-ratio gap
    kappa = sigmoid(-Delta_T * Delta_H / tau)                        (conflict score, in (0, 1))
    gamma = gamma_0 * (1 - kappa) * |Delta_T + Delta_H| / 2  +  c * gamma_c * kappa * max(|Delta_T| - lam |Delta_H|, 0)
    w     = 1 - c * rho * kappa,              c = 1 on a conflicting pair, 0 otherwise

so consistent pairs are pushed by a margin that grows with the agreeing preference strength, while on
conflicting pairs the margin shrinks to the truthfulness gain net of the helpfulness cost and the
pair's weight drops; the conflict terms act only where the objectives conflict. With gamma_0 = 0 a
batch without conflicts is trained exactly by DPO.

Baselines over the same rated pairs (`method_loss`, `METHODS`):
  * "dpo_truth" / "dpo_help": DPO on the pairs one objective prefers (its ties dropped);
  * "mixture": the fixed-weight mixture w_T * L_DPO(T-pairs) + (1 - w_T) * L_DPO(H-pairs) (a pair
    both objectives rate is in both terms; on a conflicting pair the two terms pull opposite ways);
  * "modpo": MODPO with truthfulness as the preference and helpfulness as the margin reward,
    -log sigmoid((beta / w_T) * h - (w_H / w_T) * Delta_H) on the T-oriented pairs;
  * "camp_no_margin": the truthfulness-first orientation with plain DPO (CAMP with gamma_c = rho = 0),
    the ablation that isolates the adaptive margin;
  * "camp".

LM side: `sequence_logprobs` (summed completion log-probs of `models.Transformer` on the shared
`lm_batch` layout), `reference_logprobs` (the frozen reference, computed once), `train` (jitted
steps through `algorithms._loop.run_loop`: progress bar, orbax checkpoints, resume).

Dimension legend: `n` pairs, `t` tokens per sequence (inputs / targets of one response).

INFERRED (the paper's abstract is all the spec read; the equations are the spec's design):
  * the whole loss above, the conflict rule and the defaults beta 0.1, gamma_0 1.0, gamma_c 0.5,
    tau 0.1, lam 0.5 are the spec's design; rho = 0.5 is ours (the spec names w = 1 - rho * kappa
    without a value);
  * the conflict terms enter only on pairs flagged by the sign rule (the spec's kappa is 0.5 on
    one-sided ties, which would otherwise give those consistent pairs a conflict margin);
  * w is a per-pair loss weight, not a per-pair beta: under Adam a smaller beta weakens the KL anchor
    and lets the pair be pushed further, the opposite of "less optimization strength" (a `beta_fn`
    hook gives the per-pair-beta reading, spec 6(f));
  * the truthfulness-first orientation with a helpfulness tie-break; MODPO's helpfulness reward is the
    rating itself (MODPO uses a learned reward model) times `modpo_reward_scale`.

References:
  Zong, Zhang, Wang, "Conflict-Aware Adaptive Alignment for LLM Hallucination Mitigation", ICML 2026
    poster 60877 (no arXiv id found).
  Rafailov et al., "Direct Preference Optimization", arXiv:2305.18290, 2023.
  Zhou et al., "Beyond One-Preference-Fits-All Alignment: Multi-Objective Direct Preference
    Optimization", arXiv:2310.03708, 2023 (MODPO).
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np
import optax
from etils import epath
from flax import nnx

from algorithms._loop import run_loop
from algorithms.training import Checkpointer, FitResult, TrainState
from primitives import policy_losses, preference_losses
from primitives.validation import check_finite, is_concrete

__all__ = [
    "METHODS",
    "PAIR_KEYS",
    "CAMPConfig",
    "PreferenceConfig",
    "conflict_score",
    "detect_conflicts",
    "orient_pairs",
    "camp_margin_and_strength",
    "camp_loss",
    "method_loss",
    "sequence_logprobs",
    "reference_logprobs",
    "train",
]

METHODS = ("dpo_truth", "dpo_help", "mixture", "modpo", "camp_no_margin", "camp")

# A pair dataset: response a and response b of each pair in the `lm_batch` layout, and the ratings.
PAIR_KEYS = ("a_inputs", "a_targets", "a_mask", "b_inputs", "b_targets", "b_mask", "delta_t", "delta_h")


@dataclasses.dataclass(frozen=True, kw_only=True)
class CAMPConfig:
    """CAMP's hyper-parameters (spec section 6(b)).

    Attributes:
      beta: DPO inverse temperature (> 0).
      gamma_consistent: gamma_0, the margin scale of the agreeing preference strength (>= 0; 0 = plain
        DPO on consistent pairs).
      gamma_conflict: gamma_c, the margin scale of conflicting pairs (>= 0).
      tau: temperature of the conflict score kappa (> 0).
      lam: lambda, how much of the helpfulness loss offsets the truthfulness gain in the conflict margin.
      rho: weight reduction on conflicting pairs, w = 1 - rho * kappa (in [0, 1)).
    """

    beta: float = 0.1
    gamma_consistent: float = 1.0
    gamma_conflict: float = 0.5
    tau: float = 0.1
    lam: float = 0.5
    rho: float = 0.5

    def __post_init__(self):
        for name in ("beta", "tau"):
            v = getattr(self, name)
            check_finite(name, v)
            if not v > 0:
                raise ValueError(f"{name} must be > 0; got {name}={v!r}")
        for name in ("gamma_consistent", "gamma_conflict", "lam"):
            v = getattr(self, name)
            check_finite(name, v)
            if v < 0:
                raise ValueError(f"{name} must be >= 0; got {name}={v!r}")
        if not 0 <= self.rho < 1:
            raise ValueError(f"rho must lie in [0, 1) (the strength 1 - rho * kappa stays > 0); got rho={self.rho!r}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class PreferenceConfig:
    """Settings of every method of `METHODS` (one record, so all runs share one shape).

    Attributes:
      camp: CAMP's hyper-parameters; its `beta` is every method's DPO beta.
      truth_weight: w_T of the mixture and of MODPO (w_H = 1 - w_T), in (0, 1).
      modpo_reward_scale: MODPO's helpfulness reward is this times the H rating.
    """

    camp: CAMPConfig = CAMPConfig()
    truth_weight: float = 0.5
    modpo_reward_scale: float = 1.0

    def __post_init__(self):
        if not 0 < self.truth_weight < 1:
            raise ValueError(f"truth_weight must lie in (0, 1); got {self.truth_weight!r}")
        check_finite("modpo_reward_scale", self.modpo_reward_scale)

    @property
    def beta(self) -> float:
        return self.camp.beta


def _deltas(delta_t, delta_h) -> tuple[jax.Array, jax.Array]:
    dt, dh = jnp.asarray(delta_t, jnp.float32), jnp.asarray(delta_h, jnp.float32)
    if dt.ndim != 1 or dh.shape != dt.shape:
        raise ValueError(f"delta_t and delta_h must both be [n]; got {dt.shape} and {dh.shape}")
    check_finite("delta_t", delta_t)
    check_finite("delta_h", delta_h)
    return dt, dh


def detect_conflicts(delta_t: jax.Array, delta_h: jax.Array) -> jax.Array:
    """Per-pair conflict flag: the two objectives prefer different responses, Delta_T * Delta_H < 0.

    A pair where either objective is indifferent (a 0 difference) is consistent. The flag does not
    depend on the pair's orientation.

    Args:
      delta_t, delta_h: [n] rating differences T(y_a) - T(y_b) and H(y_a) - H(y_b).

    Returns:
      [n] bool.

    Examples:
      >>> detect_conflicts([1.0, 1.0, 0.0], [0.5, -0.5, -1.0]).tolist()
      [False, True, False]
    """
    dt, dh = _deltas(delta_t, delta_h)
    return dt * dh < 0


def conflict_score(delta_t: jax.Array, delta_h: jax.Array, *, tau: float = 0.1) -> jax.Array:
    """kappa = sigmoid(-Delta_T * Delta_H / tau) in (0, 1) (spec 6(b)).

    0.5 when either difference is 0, towards 1 when the objectives disagree strongly, towards 0 when
    they agree strongly; monotone in -Delta_T * Delta_H.

    Args:
      delta_t, delta_h: [n] rating differences.
      tau: > 0 temperature.

    Returns:
      [n] float32.
    """
    check_finite("tau", tau)
    if not tau > 0:
        raise ValueError(f"tau must be > 0; got tau={tau!r}")
    dt, dh = _deltas(delta_t, delta_h)
    return jax.nn.sigmoid(-dt * dh / tau)


def orient_pairs(delta_t: jax.Array, delta_h: jax.Array, *, primary: str = "truth") -> jax.Array:
    """The side of each pair that becomes the chosen response: +1 = y_a, -1 = y_b, 0 = no preference.

    "truth": by sign(Delta_T), helpfulness breaking a T tie (CAMP's truthfulness-first order);
    "truth_only" / "help_only": by that objective alone (its ties give 0).

    Args:
      delta_t, delta_h: [n] rating differences.
      primary: "truth", "truth_only" or "help_only".

    Returns:
      [n] float32 in {-1, 0, 1}.
    """
    dt, dh = _deltas(delta_t, delta_h)
    if primary == "truth":
        return jnp.where(dt != 0, jnp.sign(dt), jnp.sign(dh))
    if primary == "truth_only":
        return jnp.sign(dt)
    if primary == "help_only":
        return jnp.sign(dh)
    raise ValueError(f"primary must be one of ('truth', 'truth_only', 'help_only'); got {primary!r}")


def camp_margin_and_strength(delta_t: jax.Array, delta_h: jax.Array, config: CAMPConfig = CAMPConfig()
                             ) -> dict[str, jax.Array]:
    """CAMP's per-pair margin gamma and weight w from oriented rating differences (chosen - rejected).

    Args:
      delta_t, delta_h: [n] T(y_w) - T(y_l) and H(y_w) - H(y_l).
      config: CAMPConfig.

    Returns:
      {"margin": [n] gamma, "strength": [n] loss weight w, "kappa": [n] conflict score, "conflict": [n]
      bool}; a consistent pair has margin gamma_0 * (1 - kappa) * |Delta_T + Delta_H| / 2 and weight 1.
    """
    dt, dh = _deltas(delta_t, delta_h)
    conflict = dt * dh < 0
    c = conflict.astype(dt.dtype)
    kappa = jax.nn.sigmoid(-dt * dh / config.tau)
    g = jnp.maximum(jnp.abs(dt) - config.lam * jnp.abs(dh), 0.0)
    margin = (config.gamma_consistent * (1 - kappa) * jnp.abs(dt + dh) / 2
              + c * config.gamma_conflict * kappa * g)
    strength = 1.0 - c * config.rho * kappa
    return {"margin": margin, "strength": strength, "kappa": kappa, "conflict": conflict}


def _check_truth_first(dt, dh) -> None:
    """Concrete oriented differences must put the truthfulness-first choice first."""
    if not (is_concrete(dt) and is_concrete(dh)):
        return
    dt, dh = np.asarray(dt), np.asarray(dh)
    bad = np.flatnonzero((dt < 0) | ((dt == 0) & (dh <= 0)))
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"delta_t, delta_h: pairs must be oriented truthfulness-first (delta_t > 0, or delta_t == 0 "
                         f"and delta_h > 0; see orient_pairs); got {bad.size} pairs that are not, first at index {i}: "
                         f"delta_t={dt[i]}, delta_h={dh[i]}")


def camp_loss(policy_chosen_logp: jax.Array, policy_rejected_logp: jax.Array, ref_chosen_logp: jax.Array,
              ref_rejected_logp: jax.Array, delta_t: jax.Array, delta_h: jax.Array, *,
              config: CAMPConfig = CAMPConfig(), margin_fn: Callable | None = None,
              strength_fn: Callable | None = None, beta_fn: Callable | None = None,
              reduction: str = "none") -> jax.Array:
    """CAMP's loss per pair: w * [-log sigmoid(beta * h - gamma)] on truthfulness-first oriented pairs.

    Args:
      policy_chosen_logp, policy_rejected_logp, ref_chosen_logp, ref_rejected_logp: [n] sequence log-probs.
      delta_t, delta_h: [n] oriented rating differences (chosen - rejected): delta_t > 0, or
        delta_t == 0 and delta_h > 0.
      config: CAMPConfig.
      margin_fn, strength_fn: optional hooks `(delta_t, delta_h) -> [n]` replacing CAMP's margin gamma /
        weight w (the spec's `margin_fn`).
      beta_fn: optional hook `(delta_t, delta_h) -> [n]` > 0 multiplying beta per pair (the spec's
        `beta_fn`; default 1).
      reduction: "none" or "mean".

    Returns:
      [n] or scalar loss.

    Raises:
      ValueError: on shape mismatch, non-finite or wrongly oriented (concrete) differences.
    """
    if reduction not in preference_losses.REDUCTIONS:
        raise ValueError(f"reduction must be one of {preference_losses.REDUCTIONS}; got {reduction!r}")
    dt, dh = _deltas(delta_t, delta_h)
    if dt.shape[0] != jnp.shape(policy_chosen_logp)[0]:
        raise ValueError(f"delta_t must have one entry per pair, n={jnp.shape(policy_chosen_logp)[0]}; got {dt.shape}")
    _check_truth_first(delta_t, delta_h)
    parts = camp_margin_and_strength(dt, dh, config)
    margin = parts["margin"] if margin_fn is None else jnp.asarray(margin_fn(dt, dh), jnp.float32)
    strength = parts["strength"] if strength_fn is None else jnp.asarray(strength_fn(dt, dh), jnp.float32)
    beta = config.beta if beta_fn is None else config.beta * jnp.asarray(beta_fn(dt, dh), jnp.float32)
    per = strength * preference_losses.margin_dpo_loss(policy_chosen_logp, policy_rejected_logp, ref_chosen_logp,
                                                       ref_rejected_logp, beta=beta, margin=margin)
    if reduction == "none":
        return per
    return per.mean() if per.size else jnp.zeros((), per.dtype)


def _weighted_mean(loss, weight):
    return (loss * weight).sum() / jnp.maximum(weight.sum(), 1.0)


def _swap(side, a, b):
    """(chosen, rejected) by side: +1 -> (a, b), otherwise (b, a)."""
    return jnp.where(side > 0, a, b), jnp.where(side > 0, b, a)


def method_loss(method: str, logp_a: jax.Array, logp_b: jax.Array, ref_a: jax.Array, ref_b: jax.Array,
                delta_t: jax.Array, delta_h: jax.Array, *, config: PreferenceConfig = PreferenceConfig()
                ) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The batch loss of one preference method on unoriented pairs rated on both objectives.

    Pairs a method has no preference on (its ties) get weight 0; the loss is the mean over the rest
    (0 when none is left).

    Args:
      method: one of `METHODS`.
      logp_a, logp_b: [n] policy sequence log-probs of responses a and b.
      ref_a, ref_b: [n] reference sequence log-probs.
      delta_t, delta_h: [n] T(a) - T(b) and H(a) - H(b).
      config: PreferenceConfig.

    Returns:
      (scalar loss, metrics: "pairs_used" fraction, "conflict_fraction", "reward_accuracy" of the
      method's own orientation, "margin_mean").
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}; got {method!r}")
    dt, dh = _deltas(delta_t, delta_h)
    logp_a, logp_b, ref_a, ref_b = (jnp.asarray(x, jnp.float32) for x in (logp_a, logp_b, ref_a, ref_b))
    for name, x in (("logp_a", logp_a), ("logp_b", logp_b), ("ref_a", ref_a), ("ref_b", ref_b)):
        if x.shape != dt.shape:
            raise ValueError(f"{name} must be [n]={dt.shape} like delta_t; got {x.shape}")
    beta = config.beta
    conflict = dt * dh < 0

    def oriented(primary):
        side = orient_pairs(dt, dh, primary=primary)
        pw, pl = _swap(side, logp_a, logp_b)
        rw, rl = _swap(side, ref_a, ref_b)
        return side, (pw, pl, rw, rl), side * dt, side * dh

    def dpo(primary):
        side, lp, _, _ = oriented(primary)
        w = (side != 0).astype(jnp.float32)
        return _weighted_mean(preference_losses.dpo_loss(*lp, beta=beta), w), side, lp

    margin = jnp.zeros_like(dt)
    if method in ("dpo_truth", "dpo_help"):
        loss, side, lp = dpo("truth_only" if method == "dpo_truth" else "help_only")
    elif method == "mixture":
        wt = config.truth_weight
        loss_t, side, lp = dpo("truth_only")
        loss_h, side_h, _ = dpo("help_only")
        loss = wt * loss_t + (1 - wt) * loss_h
        side = jnp.where(side != 0, side, side_h)
    elif method == "modpo":
        wt = config.truth_weight
        side, lp, _, o_dh = oriented("truth_only")
        margin = (1 - wt) / wt * config.modpo_reward_scale * o_dh
        per = preference_losses.margin_dpo_loss(*lp, beta=beta / wt, margin=margin)
        loss = _weighted_mean(per, (side != 0).astype(jnp.float32))
    else:  # camp, camp_no_margin
        side, lp, o_dt, o_dh = oriented("truth")
        # Dropped pairs (a tie on both) are oriented (b, a) with zero differences; give them a valid
        # orientation for the check-free traced call and weight 0.
        keep = side != 0
        o_dt = jnp.where(keep, o_dt, 1.0)
        camp_cfg = config.camp if method == "camp" else dataclasses.replace(config.camp, gamma_conflict=0.0,
                                                                             gamma_consistent=0.0, rho=0.0)
        parts = camp_margin_and_strength(o_dt, o_dh, camp_cfg)
        margin = parts["margin"]
        per = parts["strength"] * preference_losses.margin_dpo_loss(*lp, beta=camp_cfg.beta, margin=margin)
        loss = _weighted_mean(per, keep.astype(jnp.float32))
    used = (side != 0).astype(jnp.float32)
    h = preference_losses.log_ratio_margin(*lp)
    metrics = {"pairs_used": used.mean(), "conflict_fraction": conflict.astype(jnp.float32).mean(),
               "reward_accuracy": _weighted_mean((h > 0).astype(jnp.float32), used),
               "margin_mean": _weighted_mean(margin, used)}
    return loss, metrics


# --- the LM side --------------------------------------------------------------------------------


def sequence_logprobs(graphdef: nnx.GraphDef, params: Any, inputs: jax.Array, targets: jax.Array,
                      mask: jax.Array) -> jax.Array:
    """Summed log-probs of the completion tokens, log pi(y | x), one forward pass of the decoder LM.

    Args:
      graphdef, params: the model (`nnx.split(model, nnx.Param)`, pure-dict params).
      inputs, targets: [n, t] int32 next-token pairs of `experiments.tasks.lm_batch` (prompt + response).
      mask: [n, t] 1 on the response's tokens (and its EOS).

    Returns:
      [n] float32.
    """
    if inputs.shape != targets.shape or mask.shape != inputs.shape or inputs.ndim != 2:
        raise ValueError(f"inputs, targets and mask must all be [n, t]; got {inputs.shape}, {targets.shape}, "
                         f"{mask.shape}")
    logits = nnx.merge(graphdef, params)(inputs).logits
    logp = policy_losses.token_logprobs(logits, targets)
    return policy_losses.sequence_logprob(logp, mask, reduction="sum")


@functools.partial(jax.jit, static_argnums=(0,))
def _seq_logprobs_jit(graphdef, params, inputs, targets, mask):
    return sequence_logprobs(graphdef, params, inputs, targets, mask)


def reference_logprobs(graphdef: nnx.GraphDef, params: Any, inputs: np.ndarray, targets: np.ndarray,
                       mask: np.ndarray, *, chunk: int = 1024) -> np.ndarray:
    """`sequence_logprobs` of many sequences in chunks (the last one padded, so one compilation); [n] numpy."""
    n = inputs.shape[0]
    out = []
    for start in range(0, n, chunk):
        idx = np.arange(start, start + chunk).clip(max=n - 1)
        out.append(np.asarray(_seq_logprobs_jit(graphdef, params, jnp.asarray(inputs[idx]), jnp.asarray(targets[idx]),
                                                jnp.asarray(mask[idx], jnp.float32)))[: min(chunk, n - start)])
    return np.concatenate(out) if out else np.zeros((0,), np.float32)


def _pair_loss(params, graphdef, batch, method, config):
    inputs = jnp.concatenate([batch["a_inputs"], batch["b_inputs"]])
    targets = jnp.concatenate([batch["a_targets"], batch["b_targets"]])
    mask = jnp.concatenate([batch["a_mask"], batch["b_mask"]])
    logp = sequence_logprobs(graphdef, params, inputs, targets, mask)
    n = batch["a_inputs"].shape[0]
    return method_loss(method, logp[:n], logp[n:], batch["ref_a"], batch["ref_b"], batch["delta_t"],
                       batch["delta_h"], config=config)


@functools.partial(jax.jit, static_argnames=("graphdef", "optimizer", "method", "config"), donate_argnums=(0,))
def _step(state: TrainState, batch, *, graphdef, optimizer, method, config):
    (loss, metrics), grads = jax.value_and_grad(_pair_loss, has_aux=True)(state.params, graphdef, batch, method,
                                                                           config)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    return TrainState(state.step + 1, params, opt_state), dict(metrics, loss=loss, grad_norm=optax.tree.norm(grads))


def _check_pairs(pairs: Mapping[str, np.ndarray]) -> int:
    missing = [k for k in PAIR_KEYS if k not in pairs]
    if missing:
        raise ValueError(f"pairs must have the keys {list(PAIR_KEYS)}; missing {missing}")
    n = len(pairs["delta_t"])
    for k in PAIR_KEYS:
        if len(pairs[k]) != n:
            raise ValueError(f"pairs[{k!r}] must have n={n} rows like pairs['delta_t']; got {len(pairs[k])}")
    if n == 0:
        raise ValueError("pairs: expected at least one pair; got 0")
    return n


def train(*, graphdef: nnx.GraphDef, params: Any, pairs: Mapping[str, np.ndarray], method: str,
          optimizer: optax.GradientTransformation, num_steps: int, batch_size: int,
          config: PreferenceConfig = PreferenceConfig(), ref_params: Any = None, seed: int = 0,
          workdir: str | os.PathLike | None = None, checkpoint_every: int = 100, log_every: int = 10,
          stop_after: int | None = None, progress: bool = True, desc: str | None = None,
          fingerprint: str | None = None) -> FitResult:
    """Preference-optimizes the LM with one method for `num_steps` steps under a frozen reference.

    Step i trains on `batch_size` pairs drawn without replacement by `default_rng([seed, i])`, so an
    interrupted run resumed from `workdir/ckpt` ends with the parameters of an uninterrupted one.

    Args:
      graphdef, params: the initial policy (e.g. the SFT model).
      pairs: dict with `PAIR_KEYS`: a_/b_ inputs, targets [n, t] int, masks [n, t], delta_t / delta_h [n].
      method: one of `METHODS`.
      optimizer: optax transformation (the same object across methods shares compilations).
      num_steps: optimizer steps.
      batch_size: pairs per step (at most n).
      config: PreferenceConfig.
      ref_params: the frozen reference (default: `params`).
      seed: data order seed.
      workdir: checkpoints in `workdir/ckpt`; None = none.
      checkpoint_every, log_every, stop_after, progress, desc, fingerprint: as in `run_loop`.

    Returns:
      FitResult (graphdef, final TrainState, logged metric rows, resume point).
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}; got {method!r}")
    n = _check_pairs(pairs)
    if not 1 <= batch_size <= n:
        raise ValueError(f"batch_size must lie in [1, n={n}]; got {batch_size}")
    ref_params = params if ref_params is None else ref_params
    data = {k: np.asarray(pairs[k]) for k in PAIR_KEYS}
    data["ref_a"] = reference_logprobs(graphdef, ref_params, data["a_inputs"], data["a_targets"], data["a_mask"])
    data["ref_b"] = reference_logprobs(graphdef, ref_params, data["b_inputs"], data["b_targets"], data["b_mask"])
    for k in ("a_mask", "b_mask", "delta_t", "delta_h", "ref_a", "ref_b"):
        data[k] = data[k].astype(np.float32)

    def step_fn(state, i):
        idx = np.random.default_rng([seed, i]).choice(n, batch_size, replace=False)
        batch = {k: jnp.asarray(v[idx]) for k, v in data.items()}
        return _step(state, batch, graphdef=graphdef, optimizer=optimizer, method=method, config=config)

    start = jax.tree.map(jnp.copy, params)
    state = TrainState(jnp.zeros((), jnp.int32), start, optimizer.init(start))
    out = run_loop(step_fn, state, num_steps=num_steps, stop_after=stop_after,
                   checkpointer=None if workdir is None else Checkpointer(epath.Path(workdir) / "ckpt"),
                   checkpoint_every=checkpoint_every, fingerprint=fingerprint, log_every=log_every,
                   progress=progress, desc=desc or method,
                   postfix=lambda row: {"loss": f"{row['loss']:.4f}", "acc": f"{row['reward_accuracy']:.2f}"})
    return FitResult(graphdef, out.state, out.history, out.resumed_from)
