"""Statistical inference and evaluation (issue 8).

Modules (import them directly, e.g. `from algorithms.statistics import best_arm`):
  best_arm: Successive Rejects and Synchronized Successive Rejects (SySRs) for best-model
    identification, their baselines, hardness terms and a synthetic benchmark generator.
"""
