"""Statistical inference and evaluation (issue 8).

Modules (import them directly, e.g. `from algorithms.statistics import best_arm`):
  best_arm: Successive Rejects and Synchronized Successive Rejects (SySRs) for best-model
    identification, their baselines, hardness terms and a synthetic benchmark generator.
  conformal: the Prejudicial Trick for split conformal, CQR and RAPS, its closed forms (expected
    length, interval stability, subgroup coverage) and the improvement criteria.
  anytime_valid: GAAVI anytime-valid tests of the conditional mean function, their baselines and
    confidence sequences.
  ope_mnar: off-policy evaluation with rewards missing not at random: the shadow-variable bridge
    (min-max RKHS or sieve GMM), ProxFQE and the complete-case, MAR and oracle baselines.
"""
