"""Loan MAFE: a bank and a credit agency acting on a population's credit scores over T stages.

Our own instantiation "in the spirit of MAFE" [INFER, spec /work/shared/papers/specs/vision_weights_envs.md
section 7 (b) "Loan MAFE"], following the delayed-impact lending model of Liu et al. (2018). Individuals have a
group g in {0, 1} (P(g = 1) = p_group1), a credit score s in [300, 850] (group means differ) and an income.

Agents and actions (vectors in [0, 1]):
  * bank: (2B + 1,) = approval probability per observed-score bin for group 0 (B), for group 1 (B), and the
    interest rate as a fraction of ``rate_max``. With the ``group_blind`` intervention the group-0 row is used
    for everyone.
  * agency (credit agency / regulator): (2B + 1,) non-negative weights over the (group, true-score bin) cells and
    a last "keep" cell; normalised to shares of the per-stage subsidy budget ``subsidy_budget * M`` score points.
    A cell's share is split evenly among its members (at most ``max_boost`` points each); spending never
    exceeds the remaining ``agency_capital`` (budgets never go negative).

One stage: the bank sees observed scores (``report_bias`` points under-reported for group 1, a fraction
``bias_correction`` of it corrected) and approves; an approved individual repays with probability
``rho = sigmoid(a (s - s0) / 100 - b * rate_max * rate + c log(income))``; repaid => s += gain, default =>
s -= loss, not approved => s += drift; then the agency's credit-building subsidy raises scores; s is clipped to
[300, 850]. Deterministic (mean-field) mode: every event is replaced by its probability.

Components (per stage):
  bank   reward (profit per capita, approvals_0, approvals_1, defaults_0, defaults_1);
         rate (approval_rate_0, approval_rate_1, default_rate_0, default_rate_1);
         fair (approval-rate gap, mean-score gap / 100, default-rate gap).
  agency reward (mean score change / 100, subsidy spent per capita / 100);
         rate (mean_score_0 / 850, mean_score_1 / 850);
         fair (mean-score gap / 100, approval-rate gap).
Profit: an approved loan of principal 1 earns ``rate`` if repaid and loses 1 on default.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import struct

from algorithms.fairness.mafe import core

__all__ = ["LoanParams", "LoanState", "LoanMAFE", "loan_policy"]

S_MIN, S_MAX = 300.0, 850.0


@struct.dataclass
class LoanParams:
    """Continuous settings of the loan MAFE (dynamics and interventions); all fields are pytree leaves."""

    p_group1: float = 0.3
    mean_score: tuple = (650.0, 570.0)
    std_score: tuple = (70.0, 70.0)
    mean_log_income: tuple = (0.0, -0.2)
    std_log_income: float = 0.3
    a: float = 2.0            # repayment slope per 100 score points
    s0: float = 500.0         # score at which logit(rho) = 0 (before the rate term)
    b: float = 2.0            # repayment penalty per unit interest rate
    c_income: float = 0.5     # repayment bonus per unit log income
    gain: float = 20.0        # score change on repayment
    loss: float = 40.0        # score loss on default
    drift: float = -2.0       # score change when not approved
    rate_max: float = 0.3
    subsidy_budget: float = 2.0    # score points per capita per stage the agency may distribute
    agency_capital: float = 60.0   # total score points per capita over the episode
    max_boost: float = 20.0        # at most this many points per individual per stage
    group_blind: float = 0.0       # intervention: 1 => the bank's group-0 row applies to everyone
    report_bias: float = 0.0       # points by which group 1's observed score is under-reported
    bias_correction: float = 0.0   # intervention: fraction of report_bias removed
    deterministic: float = 0.0     # 1 => mean-field dynamics (events replaced by probabilities)


class LoanState(NamedTuple):
    score: jax.Array     # (M,) float32 in [300, 850]
    income: jax.Array    # (M,) float32 > 0
    group: jax.Array     # (M,) int32 in {0, 1}
    capital: jax.Array   # () agency's remaining score points (total, not per capita), >= 0
    t: jax.Array         # () int32 stage


@dataclasses.dataclass(frozen=True)
class LoanMAFE(core.FairEnv):
    """Loan MAFE with M individuals, B score bins and horizon T (see the module docstring)."""

    num_individuals: int = 2000
    num_bins: int = 6
    horizon: int = 50

    agents = ("bank", "agency")
    component_names = {
        "bank": {"reward": ("profit", "approvals_0", "approvals_1", "defaults_0", "defaults_1"),
                 "rate": ("approval_rate_0", "approval_rate_1", "default_rate_0", "default_rate_1"),
                 "fair": ("approval_gap", "score_gap", "default_gap")},
        "agency": {"reward": ("score_change", "spent"),
                   "rate": ("mean_score_0", "mean_score_1"),
                   "fair": ("score_gap", "approval_gap")},
    }

    def __post_init__(self):
        core._check_population("LoanMAFE", self.num_individuals, self.horizon, self.num_bins)

    def default_params(self, **overrides) -> LoanParams:
        bad = set(overrides) - {f.name for f in dataclasses.fields(LoanParams)}
        if bad:
            raise ValueError(f"overrides must be LoanParams fields, got unknown {sorted(bad)}")
        return LoanParams(**overrides)

    def default_weights(self) -> dict:
        """bank: profit, penalised by approval-rate gap + mean-score gap; agency: welfare (mean score change),
        penalised by the mean-score gap. Counts and rates get weight 0 (observables for other objectives)."""
        f = lambda *v: jnp.asarray(v, jnp.float32)  # noqa: E731
        return {"bank": {"reward": f(1, 0, 0, 0, 0), "fair": f(1, 1, 0), "rate": f(0, 0, 0, 0)},
                "agency": {"reward": f(1, 0), "fair": f(1, 0), "rate": f(0, 0)}}

    def action_dims(self) -> dict:
        return {"bank": 2 * self.num_bins + 1, "agency": 2 * self.num_bins + 1}

    def obs_dims(self) -> dict:
        return {"bank": 2 * self.num_bins + 1, "agency": 2 * self.num_bins + 2}

    def init_state(self, key, params: LoanParams) -> LoanState:
        m = self.num_individuals
        kg, ks, ki = jax.random.split(key, 3)
        group = (jax.random.uniform(kg, (m,)) < params.p_group1).astype(jnp.int32)
        mu = jnp.asarray(params.mean_score, jnp.float32)[group]
        sd = jnp.asarray(params.std_score, jnp.float32)[group]
        score = jnp.clip(mu + sd * jax.random.normal(ks, (m,)), S_MIN, S_MAX)
        li = jnp.asarray(params.mean_log_income, jnp.float32)[group] + params.std_log_income * jax.random.normal(ki, (m,))
        capital = jnp.asarray(params.agency_capital * m, jnp.float32)
        return LoanState(score, jnp.exp(li), group, capital, jnp.zeros((), jnp.int32))

    def observed_score(self, state: LoanState, params: LoanParams) -> jax.Array:
        """What the bank sees: group 1 under-reported by ``report_bias * (1 - bias_correction)`` points."""
        bias = params.report_bias * (1.0 - params.bias_correction)
        return jnp.clip(state.score - bias * state.group, S_MIN, S_MAX)

    def draw_noise(self, key, state, params) -> dict:
        ka, kr = jax.random.split(key)
        m = self.num_individuals
        return {"u_approve": jax.random.uniform(ka, (m,)), "u_repay": jax.random.uniform(kr, (m,))}

    def repay_prob(self, score, income, rate, params: LoanParams):
        """rho(s, rate) = sigmoid(a (s - s0) / 100 - b * rate + c log(income)), rate an absolute interest rate."""
        return jax.nn.sigmoid(params.a * (score - params.s0) / 100.0 - params.b * rate
                              + params.c_income * jnp.log(income))

    def transition(self, state: LoanState, actions, params: LoanParams, noise):
        bsz, m = self.num_bins, self.num_individuals
        det = jnp.asarray(params.deterministic, jnp.float32)
        g = state.group
        ab = jnp.clip(jnp.asarray(actions["bank"], jnp.float32), 0.0, 1.0)
        table = ab[:2 * bsz].reshape(2, bsz)
        table = jnp.where(params.group_blind > 0.5, jnp.stack([table[0], table[0]]), table)
        rate = ab[2 * bsz] * params.rate_max
        obs_bin = core.score_bins(self.observed_score(state, params), S_MIN, S_MAX, bsz)
        p_approve = table[g, obs_bin]
        approved = core.bernoulli_or_mean(noise["u_approve"], p_approve, det)
        rho = self.repay_prob(state.score, state.income, rate, params)
        repaid = core.bernoulli_or_mean(noise["u_repay"], rho, det)
        defaulted = approved * (1.0 - repaid)
        repaid_loan = approved * repaid
        delta = repaid_loan * params.gain - defaulted * params.loss + (1.0 - approved) * params.drift

        # agency: shares of the stage budget over (group, true bin) cells, split evenly within a cell.
        w = jnp.clip(jnp.asarray(actions["agency"], jnp.float32), 0.0, None)
        shares = w / jnp.maximum(jnp.sum(w), 1e-12)
        shares = jnp.where(jnp.sum(w) > 0, shares, jnp.zeros_like(shares).at[-1].set(1.0))
        stage_budget = jnp.minimum(params.subsidy_budget * m, state.capital)
        true_bin = core.score_bins(state.score, S_MIN, S_MAX, bsz)
        counts = core.group_bin_sum(jnp.ones((m,), jnp.float32), g, true_bin, bsz)
        cell_alloc = shares[:2 * bsz].reshape(2, bsz) * stage_budget
        per_person = jnp.minimum(core.safe_rate(cell_alloc, counts), params.max_boost)
        boost = per_person[g, true_bin]
        spent = jnp.sum(boost)

        new_score = jnp.clip(state.score + delta + boost, S_MIN, S_MAX)
        new_state = LoanState(new_score, state.income, g, jnp.maximum(state.capital - spent, 0.0), state.t + 1)

        ones = jnp.ones((m,), jnp.float32)
        n_g = core.group_sum(ones, g)
        appr_g = core.group_sum(approved, g)
        def_g = core.group_sum(defaulted, g)
        appr_rate = core.safe_rate(appr_g, n_g)
        def_rate = core.safe_rate(def_g, appr_g)
        mean_new = core.safe_rate(core.group_sum(new_score, g), n_g)
        profit = jnp.sum(repaid_loan * rate - defaulted) / m
        score_gap = core.abs_gap(mean_new) / 100.0
        comps = {
            "bank": {"reward": jnp.stack([profit, appr_g[0], appr_g[1], def_g[0], def_g[1]]),
                     "rate": jnp.concatenate([appr_rate, def_rate]),
                     "fair": jnp.stack([core.abs_gap(appr_rate), score_gap, core.abs_gap(def_rate)])},
            "agency": {"reward": jnp.stack([jnp.mean(new_score - state.score) / 100.0, spent / m / 100.0]),
                       "rate": mean_new / S_MAX,
                       "fair": jnp.stack([score_gap, core.abs_gap(appr_rate)])},
        }
        return new_state, comps

    def observe(self, state: LoanState, params: LoanParams) -> dict:
        bsz, m = self.num_bins, self.num_individuals
        ones = jnp.ones((m,), jnp.float32)
        t_frac = jnp.minimum(state.t / self.horizon, 1.0).astype(jnp.float32)[None]
        obs_hist = core.group_bin_sum(ones, state.group, core.score_bins(self.observed_score(state, params),
                                                                          S_MIN, S_MAX, bsz), bsz) / m
        true_hist = core.group_bin_sum(ones, state.group, core.score_bins(state.score, S_MIN, S_MAX, bsz), bsz) / m
        cap_frac = jnp.clip(state.capital / jnp.maximum(params.agency_capital * m, 1e-9), 0.0, 1.0)[None]
        return {"bank": jnp.concatenate([obs_hist.ravel(), t_frac]).astype(jnp.float32),
                "agency": jnp.concatenate([true_hist.ravel(), cap_frac, t_frac]).astype(jnp.float32)}

    def summary(self, state: LoanState) -> dict:
        return {"mean_score": core.group_mean(state.score, state.group)}


def loan_policy(env: LoanMAFE, *, group_aware: bool = False, fixed_agency: str | None = None) -> core.Policy:
    """The F-MACEM policy class of the loan MAFE (stationary, open-loop parameters).

    bank theta: (B,) approval logits per observed-score bin (group-blind; (2B,) with ``group_aware``, group 0
    then group 1) and 1 interest-rate logit -> sigmoid. agency theta: (2B + 1,) softmax logits over the
    (group, bin) cells and "keep" -> budget shares.

    Args:
      env: the loan env. group_aware: separate approval logits per group.
      fixed_agency: None (agency parameters searched), or "none" (agency keeps its budget) / "uniform" (equal
        shares over all cells): then the agency has no parameters (the bank-only baselines).
    """
    bsz = env.num_bins
    nb = 2 * bsz if group_aware else bsz
    dims = {"bank": nb + 1, "agency": 0 if fixed_agency else 2 * bsz + 1}
    if fixed_agency not in (None, "none", "uniform"):
        raise ValueError(f"fixed_agency must be None, 'none' or 'uniform', got {fixed_agency!r}")

    def apply(thetas, obs, t):
        tb = thetas["bank"]
        probs = jax.nn.sigmoid(tb[:nb])
        table = probs.reshape(2, bsz) if group_aware else jnp.concatenate([probs, probs])
        bank = jnp.concatenate([table.ravel(), jax.nn.sigmoid(tb[nb:nb + 1])])
        if fixed_agency == "none":
            agency = jnp.zeros((2 * bsz + 1,), jnp.float32).at[-1].set(1.0)
        elif fixed_agency == "uniform":
            agency = jnp.ones((2 * bsz + 1,), jnp.float32).at[-1].set(0.0)
        else:
            agency = jax.nn.softmax(thetas["agency"])
        return {"bank": bank, "agency": agency}

    init = {"bank": jnp.zeros((nb + 1,), jnp.float32), "agency": jnp.zeros((dims["agency"],), jnp.float32)}
    return core.Policy(dims=dims, apply=apply, init=init)
