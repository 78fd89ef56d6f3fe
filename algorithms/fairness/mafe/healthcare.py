"""Healthcare MAFE: an insurer and a capacity-limited hospital acting on a population's health.

Our own instantiation "in the spirit of MAFE" [INFER, spec /work/shared/papers/specs/vision_weights_envs.md
section 7 (b) "Healthcare MAFE"]. Individuals have a group g (P(g = 1) = p_group1), health h in [0, 1] and a base
income y0 (group 1 lower on average); disposable income is ``y = y0 (0.6 + 0.4 h)`` minus premiums paid. The
optional public payer of the spec is the ``premium_subsidy`` intervention (fraction of group 1's premium paid
by the state).

Agents and actions (vectors in [0, 1]):
  * insurer: (B + 1,) = coverage eligibility probability per health bin (risk rating, group-blind) and the
    premium as a fraction of ``premium_max``.
  * hospital: (2B,) = treatment propensity of an ill patient per health bin, uninsured (B) then insured (B).
    At most ``capacity * M`` patients are treated per stage (random priority among requests).

One stage: an individual falls ill with probability ``p_ill0 + p_ill_slope (1 - h)``; enrols with
probability ``eligibility[bin(h)] * sigmoid(afford_k (y - premium_eff))``; an ill patient requests treatment with
the hospital's propensity; a treated patient recovers with probability ``success_insured`` or
``success_uninsured``; health moves by ``+treat_gain`` on success, ``-illness_loss`` when ill and not cured,
``+recover`` when healthy; h is clipped to [0, 1]. Deterministic (mean-field) mode replaces events by their
probabilities.

Components:
  insurer  reward (margin per capita = premiums - treat_cost * insured treatments, enrolled_0, enrolled_1);
           rate (coverage_rate_0, coverage_rate_1); fair (coverage-rate gap, mean-health gap).
  hospital reward (utilisation = treated / capacity, successful treatments per capita, treated_0, treated_1);
           rate (treatment rate among the ill, per group); fair (treatment-rate gap, mean-health gap).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import struct

from algorithms.fairness.mafe import core

__all__ = ["HealthParams", "HealthState", "HealthcareMAFE", "health_policy"]


@struct.dataclass
class HealthParams:
    """Continuous settings of the healthcare MAFE (dynamics and interventions)."""

    p_group1: float = 0.3
    mean_health: tuple = (0.75, 0.6)
    std_health: float = 0.15
    mean_log_income: tuple = (0.0, -0.4)
    std_log_income: float = 0.3
    p_ill0: float = 0.05
    p_ill_slope: float = 0.3
    success_insured: float = 0.8
    success_uninsured: float = 0.5
    treat_gain: float = 0.1
    illness_loss: float = 0.1
    recover: float = 0.01
    capacity: float = 0.1          # treatments per stage as a fraction of M
    premium_max: float = 0.5
    treat_cost: float = 1.0        # insurer's cost per insured treatment
    afford_k: float = 8.0
    premium_subsidy: float = 0.0   # intervention: public payer covers this fraction of group 1's premium
    deterministic: float = 0.0


class HealthState(NamedTuple):
    health: jax.Array       # (M,) in [0, 1]
    base_income: jax.Array  # (M,) > 0
    income: jax.Array       # (M,) >= 0, disposable income of the last stage
    group: jax.Array        # (M,) int32
    t: jax.Array


@dataclasses.dataclass(frozen=True)
class HealthcareMAFE(core.FairEnv):
    """Healthcare MAFE with M individuals, B health bins, horizon T (see the module docstring)."""

    num_individuals: int = 2000
    num_bins: int = 4
    horizon: int = 50

    agents = ("insurer", "hospital")
    component_names = {
        "insurer": {"reward": ("margin", "enrolled_0", "enrolled_1"),
                    "rate": ("coverage_rate_0", "coverage_rate_1"),
                    "fair": ("coverage_gap", "health_gap")},
        "hospital": {"reward": ("utilisation", "successes", "treated_0", "treated_1"),
                     "rate": ("treatment_rate_0", "treatment_rate_1"),
                     "fair": ("treatment_gap", "health_gap")},
    }

    def __post_init__(self):
        core._check_population("HealthcareMAFE", self.num_individuals, self.horizon, self.num_bins)

    def default_params(self, **overrides) -> HealthParams:
        bad = set(overrides) - {f.name for f in dataclasses.fields(HealthParams)}
        if bad:
            raise ValueError(f"overrides must be HealthParams fields, got unknown {sorted(bad)}")
        return HealthParams(**overrides)

    def default_weights(self) -> dict:
        """insurer: margin, penalised by coverage gap + health gap; hospital: successes, penalised by
        treatment-rate gap."""
        f = lambda *v: jnp.asarray(v, jnp.float32)  # noqa: E731
        return {"insurer": {"reward": f(1, 0, 0), "fair": f(1, 1), "rate": f(0, 0)},
                "hospital": {"reward": f(0, 1, 0, 0), "fair": f(1, 0), "rate": f(0, 0)}}

    def action_dims(self) -> dict:
        return {"insurer": self.num_bins + 1, "hospital": 2 * self.num_bins}

    def obs_dims(self) -> dict:
        return {"insurer": 2 * self.num_bins + 1, "hospital": 2 * self.num_bins + 1}

    def init_state(self, key, params: HealthParams) -> HealthState:
        m = self.num_individuals
        kg, kh, ki = jax.random.split(key, 3)
        group = (jax.random.uniform(kg, (m,)) < params.p_group1).astype(jnp.int32)
        h = jnp.clip(jnp.asarray(params.mean_health, jnp.float32)[group]
                     + params.std_health * jax.random.normal(kh, (m,)), 0.0, 1.0)
        y0 = jnp.exp(jnp.asarray(params.mean_log_income, jnp.float32)[group]
                     + params.std_log_income * jax.random.normal(ki, (m,)))
        return HealthState(h, y0, y0 * (0.6 + 0.4 * h), group, jnp.zeros((), jnp.int32))

    def draw_noise(self, key, state, params) -> dict:
        m = self.num_individuals
        names = ("u_ill", "u_enrol", "u_want", "u_priority", "u_success")
        ks = jax.random.split(key, len(names))
        return {n: jax.random.uniform(k, (m,)) for n, k in zip(names, ks)}

    def transition(self, state: HealthState, actions, params: HealthParams, noise):
        bsz, m = self.num_bins, self.num_individuals
        det = jnp.asarray(params.deterministic, jnp.float32)
        g, h = state.group, state.health
        ai = jnp.clip(jnp.asarray(actions["insurer"], jnp.float32), 0.0, 1.0)
        ah = jnp.clip(jnp.asarray(actions["hospital"], jnp.float32), 0.0, 1.0).reshape(2, bsz)
        hb = core.score_bins(h, 0.0, 1.0, bsz)
        premium = ai[bsz] * params.premium_max
        prem_eff = premium * (1.0 - params.premium_subsidy * g)
        ill = core.bernoulli_or_mean(noise["u_ill"], params.p_ill0 + params.p_ill_slope * (1.0 - h), det)
        p_enrol = ai[:bsz][hb] * jax.nn.sigmoid(params.afford_k * (state.income - prem_eff))
        enrolled = core.bernoulli_or_mean(noise["u_enrol"], p_enrol, det)
        prop = enrolled * ah[1, hb] + (1.0 - enrolled) * ah[0, hb]
        want = ill * core.bernoulli_or_mean(noise["u_want"], prop, det)
        cap = params.capacity * m
        treated = core.capped_by_priority(want, noise["u_priority"], cap, det)
        p_succ = enrolled * params.success_insured + (1.0 - enrolled) * params.success_uninsured
        success = treated * core.bernoulli_or_mean(noise["u_success"], p_succ, det)
        new_h = jnp.clip(h + success * params.treat_gain - (ill - success) * params.illness_loss
                         + (1.0 - ill) * params.recover, 0.0, 1.0)
        paid = enrolled * prem_eff
        new_income = jnp.maximum(state.base_income * (0.6 + 0.4 * new_h) - paid, 0.0)
        new_state = HealthState(new_h, state.base_income, new_income, g, state.t + 1)

        ones = jnp.ones((m,), jnp.float32)
        n_g = core.group_sum(ones, g)
        enr_g = core.group_sum(enrolled, g)
        ill_g = core.group_sum(ill, g)
        tr_g = core.group_sum(treated, g)
        cov_rate = core.safe_rate(enr_g, n_g)
        tr_rate = core.safe_rate(tr_g, ill_g)
        health_gap = core.abs_gap(core.safe_rate(core.group_sum(new_h, g), n_g))
        margin = (jnp.sum(enrolled * premium) - params.treat_cost * jnp.sum(treated * enrolled)) / m
        comps = {
            "insurer": {"reward": jnp.stack([margin, enr_g[0], enr_g[1]]), "rate": cov_rate,
                        "fair": jnp.stack([core.abs_gap(cov_rate), health_gap])},
            "hospital": {"reward": jnp.stack([jnp.sum(treated) / jnp.maximum(cap, 1e-9), jnp.sum(success) / m,
                                              tr_g[0], tr_g[1]]),
                         "rate": tr_rate, "fair": jnp.stack([core.abs_gap(tr_rate), health_gap])},
        }
        return new_state, comps

    def observe(self, state: HealthState, params: HealthParams) -> dict:
        bsz, m = self.num_bins, self.num_individuals
        hist = core.group_bin_sum(jnp.ones((m,), jnp.float32), state.group,
                                  core.score_bins(state.health, 0.0, 1.0, bsz), bsz).ravel() / m
        t_frac = jnp.minimum(state.t / self.horizon, 1.0).astype(jnp.float32)[None]
        o = jnp.concatenate([hist, t_frac]).astype(jnp.float32)
        return {"insurer": o, "hospital": o}

    def summary(self, state: HealthState) -> dict:
        return {"mean_health": core.group_mean(state.health, state.group),
                "mean_income": core.group_mean(state.income, state.group)}


def health_policy(env: HealthcareMAFE) -> core.Policy:
    """Stationary sigmoid policy: insurer theta (B + 1,) eligibility and premium logits; hospital theta (2B,)
    treatment-propensity logits."""
    bsz = env.num_bins

    def apply(thetas, obs, t):
        return {"insurer": jax.nn.sigmoid(thetas["insurer"]), "hospital": jax.nn.sigmoid(thetas["hospital"])}

    return core.Policy(dims={"insurer": bsz + 1, "hospital": 2 * bsz}, apply=apply,
                       init={"insurer": jnp.zeros((bsz + 1,)), "hospital": jnp.zeros((2 * bsz,))})
