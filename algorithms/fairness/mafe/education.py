"""Education MAFE: a university and an employer along the education-to-employment pathway.

Our own instantiation "in the spirit of MAFE" [INFER, spec /work/shared/papers/specs/vision_weights_envs.md
section 7 (b) "Education MAFE"]. The population is M families with a group g and wealth w >= 0 (group 1 poorer
at the start). Each stage a new cohort (one child per family) is born with skill
``k = clip(innate + prep * tanh(w), 0, 1)``, innate ~ N(mean_innate, std_innate) for both groups, so wealth
feeds the next cohort's test preparation (intergenerational dynamics).

Agents and actions (vectors in [0, 1]):
  * university: (2B + 1,) = admission probability per observed test-score bin for group 0 (B) and group 1 (B),
    and the share of group 1's tuition covered by scholarships. Seats: at most ``seats * M`` admitted per stage
    (random priority); the ``quota`` intervention reserves that fraction of the admitted for group 1 by
    raising group 1's admission probability to at least ``quota_floor``; scholarships are paid from a
    ``scholarship_fund`` that never goes negative.
  * employer: (2B,) = hiring probability per observed skill-signal bin, without degree (B) and with (B).

One stage: test score = k + test_noise * N(0, 1); admitted students enrol with probability
``min(1, (w + cover * tuition) / tuition)`` (they must afford the rest); an enrolled student graduates with
probability k and gains ``skill_growth``; the employer sees ``k' + signal_noise * N(0, 1)`` and the degree;
a hire earns ``wage = wage_base + wage_skill * k'``; wealth ``w' = decay * w + wage * hired - tuition paid``.
Deterministic mode: events replaced by probabilities and the test/signal noise set to 0.

Components:
  university reward (graduates per capita, tuition revenue per capita, admitted_0, admitted_1);
             rate (admission rate per group); fair (admission-rate gap, graduation-rate gap).
  employer   reward (profit per capita = productivity - wage of hires, hires_0, hires_1);
             rate (hiring rate per group); fair (hiring-rate gap, mean-wage gap).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import struct

from algorithms.fairness.mafe import core

__all__ = ["EduParams", "EduState", "EducationMAFE", "education_policy"]


@struct.dataclass
class EduParams:
    """Continuous settings of the education MAFE (dynamics and interventions)."""

    p_group1: float = 0.3
    mean_wealth: tuple = (1.0, 0.3)
    mean_innate: float = 0.35
    std_innate: float = 0.15
    prep: float = 0.3
    test_noise: float = 0.1
    signal_noise: float = 0.1
    seats: float = 0.3
    tuition: float = 0.5
    skill_growth: float = 0.3
    wage_base: float = 0.3
    wage_skill: float = 0.7
    prod_base: float = 0.0
    prod_skill: float = 1.2
    prod_degree: float = 0.3
    decay: float = 0.7
    scholarship_fund: float = 5.0   # total per capita over the episode
    quota_floor: float = 0.0        # intervention: group 1's admission probability is at least this
    deterministic: float = 0.0


class EduState(NamedTuple):
    wealth: jax.Array   # (M,) >= 0
    group: jax.Array    # (M,) int32
    fund: jax.Array     # () remaining scholarship fund (total), >= 0
    last_wage: jax.Array  # (M,) wage of the last stage (0 when not hired)
    t: jax.Array


@dataclasses.dataclass(frozen=True)
class EducationMAFE(core.FairEnv):
    """Education MAFE with M families, B score bins, horizon T (see the module docstring)."""

    num_individuals: int = 2000
    num_bins: int = 4
    horizon: int = 50

    agents = ("university", "employer")
    component_names = {
        "university": {"reward": ("graduates", "tuition", "admitted_0", "admitted_1"),
                       "rate": ("admission_rate_0", "admission_rate_1"),
                       "fair": ("admission_gap", "graduation_gap")},
        "employer": {"reward": ("profit", "hires_0", "hires_1"),
                     "rate": ("hiring_rate_0", "hiring_rate_1"),
                     "fair": ("hiring_gap", "wage_gap")},
    }

    def __post_init__(self):
        core._check_population("EducationMAFE", self.num_individuals, self.horizon, self.num_bins)

    def default_params(self, **overrides) -> EduParams:
        bad = set(overrides) - {f.name for f in dataclasses.fields(EduParams)}
        if bad:
            raise ValueError(f"overrides must be EduParams fields, got unknown {sorted(bad)}")
        return EduParams(**overrides)

    def default_weights(self) -> dict:
        """university: graduates + tuition, penalised by admission gap; employer: profit, penalised by the
        hiring gap and the wage gap."""
        f = lambda *v: jnp.asarray(v, jnp.float32)  # noqa: E731
        return {"university": {"reward": f(1, 1, 0, 0), "fair": f(1, 0), "rate": f(0, 0)},
                "employer": {"reward": f(1, 0, 0), "fair": f(1, 1), "rate": f(0, 0)}}

    def action_dims(self) -> dict:
        return {"university": 2 * self.num_bins + 1, "employer": 2 * self.num_bins}

    def obs_dims(self) -> dict:
        return {"university": 2 * self.num_bins + 2, "employer": 2 * self.num_bins + 1}

    def init_state(self, key, params: EduParams) -> EduState:
        m = self.num_individuals
        kg, kw = jax.random.split(key)
        group = (jax.random.uniform(kg, (m,)) < params.p_group1).astype(jnp.int32)
        w = jnp.asarray(params.mean_wealth, jnp.float32)[group] * jax.random.exponential(kw, (m,))
        return EduState(w, group, jnp.asarray(params.scholarship_fund * m, jnp.float32), jnp.zeros((m,)),
                        jnp.zeros((), jnp.int32))

    def draw_noise(self, key, state, params) -> dict:
        m = self.num_individuals
        names = ("z_innate", "z_test", "z_signal", "u_admit", "u_priority", "u_enrol", "u_grad", "u_hire")
        ks = jax.random.split(key, len(names))
        return {n: (jax.random.normal(k, (m,)) if n.startswith("z_") else jax.random.uniform(k, (m,)))
                for n, k in zip(names, ks)}

    def skill(self, wealth, z_innate, params: EduParams):
        """The cohort's skill: clip(mean_innate + std_innate z + prep tanh(w), 0, 1)."""
        return jnp.clip(params.mean_innate + params.std_innate * z_innate + params.prep * jnp.tanh(wealth), 0, 1)

    def transition(self, state: EduState, actions, params: EduParams, noise):
        bsz, m = self.num_bins, self.num_individuals
        det = jnp.asarray(params.deterministic, jnp.float32)
        stoch = 1.0 - det
        g, w = state.group, state.wealth
        au = jnp.clip(jnp.asarray(actions["university"], jnp.float32), 0.0, 1.0)
        ae = jnp.clip(jnp.asarray(actions["employer"], jnp.float32), 0.0, 1.0).reshape(2, bsz)
        k = self.skill(w, noise["z_innate"] * stoch, params)
        test = k + params.test_noise * noise["z_test"] * stoch
        tb = core.score_bins(test, 0.0, 1.0, bsz)
        p_adm = au[:2 * bsz].reshape(2, bsz)[g, tb]
        p_adm = jnp.where(g == 1, jnp.maximum(p_adm, params.quota_floor), p_adm)
        want = core.bernoulli_or_mean(noise["u_admit"], p_adm, det)
        admitted = core.capped_by_priority(want, noise["u_priority"], params.seats * m, det)
        # scholarships: cover share of group 1's tuition, limited by the fund.
        tuition = params.tuition
        request = au[2 * bsz] * tuition * admitted * g
        total_req = jnp.sum(request)
        scale = jnp.where(total_req > 0, jnp.minimum(1.0, state.fund / jnp.maximum(total_req, 1e-12)), 0.0)
        cover = au[2 * bsz] * g * scale            # covered fraction of tuition per person
        p_enrol = jnp.clip((w + cover * tuition) / tuition, 0.0, 1.0)
        enrolled = admitted * core.bernoulli_or_mean(noise["u_enrol"], p_enrol, det)
        grad = enrolled * core.bernoulli_or_mean(noise["u_grad"], k, det)
        k2 = jnp.clip(k + grad * params.skill_growth, 0.0, 1.0)
        signal = k2 + params.signal_noise * noise["z_signal"] * stoch
        sb = core.score_bins(signal, 0.0, 1.0, bsz)
        p_hire = grad * ae[1, sb] + (1.0 - grad) * ae[0, sb]
        hired = core.bernoulli_or_mean(noise["u_hire"], p_hire, det)
        wage = params.wage_base + params.wage_skill * k2
        prod = params.prod_base + params.prod_skill * k2 + params.prod_degree * grad
        paid_tuition = enrolled * tuition * (1.0 - cover)
        scholarship = jnp.sum(enrolled * cover * tuition)
        new_w = jnp.maximum(params.decay * w + hired * wage - paid_tuition, 0.0)
        new_state = EduState(new_w, g, jnp.maximum(state.fund - scholarship, 0.0), hired * wage, state.t + 1)

        ones = jnp.ones((m,), jnp.float32)
        n_g = core.group_sum(ones, g)
        adm_g = core.group_sum(admitted, g)
        hire_g = core.group_sum(hired, g)
        adm_rate = core.safe_rate(adm_g, n_g)
        grad_rate = core.safe_rate(core.group_sum(grad, g), n_g)
        hire_rate = core.safe_rate(hire_g, n_g)
        wage_mean = core.safe_rate(core.group_sum(hired * wage, g), n_g)
        comps = {
            "university": {"reward": jnp.stack([jnp.sum(grad) / m, jnp.sum(enrolled * tuition) / m,
                                                adm_g[0], adm_g[1]]),
                           "rate": adm_rate,
                           "fair": jnp.stack([core.abs_gap(adm_rate), core.abs_gap(grad_rate)])},
            "employer": {"reward": jnp.stack([jnp.sum(hired * (prod - wage)) / m, hire_g[0], hire_g[1]]),
                         "rate": hire_rate,
                         "fair": jnp.stack([core.abs_gap(hire_rate), core.abs_gap(wage_mean)])},
        }
        return new_state, comps

    def observe(self, state: EduState, params: EduParams) -> dict:
        bsz, m = self.num_bins, self.num_individuals
        ones = jnp.ones((m,), jnp.float32)
        wb = core.score_bins(jnp.tanh(state.wealth), 0.0, 1.0, bsz)
        hist = (core.group_bin_sum(ones, state.group, wb, bsz) / m).ravel()
        t_frac = jnp.minimum(state.t / self.horizon, 1.0).astype(jnp.float32)[None]
        fund = jnp.clip(state.fund / jnp.maximum(params.scholarship_fund * m, 1e-9), 0.0, 1.0)[None]
        return {"university": jnp.concatenate([hist, fund, t_frac]).astype(jnp.float32),
                "employer": jnp.concatenate([hist, t_frac]).astype(jnp.float32)}

    def summary(self, state: EduState) -> dict:
        return {"mean_wealth": core.group_mean(state.wealth, state.group),
                "mean_wage": core.group_mean(state.last_wage, state.group)}


def education_policy(env: EducationMAFE) -> core.Policy:
    """Stationary sigmoid policy: university theta (2B + 1,) admission and scholarship logits; employer theta
    (2B,) hiring logits."""
    bsz = env.num_bins

    def apply(thetas, obs, t):
        return {"university": jax.nn.sigmoid(thetas["university"]), "employer": jax.nn.sigmoid(thetas["employer"])}

    return core.Policy(dims={"university": 2 * bsz + 1, "employer": 2 * bsz}, apply=apply,
                       init={"university": jnp.zeros((2 * bsz + 1,)), "employer": jnp.zeros((2 * bsz,))})
