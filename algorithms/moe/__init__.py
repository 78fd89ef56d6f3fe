"""Mixture-of-experts methods (issue 5).

Modules (import them directly, e.g. `from algorithms.moe import router_interp`):
  router_interp: RouterInterp and the Superposed Specialisation Hypothesis: SAE-feature / expert
    alignment and predictiveness, greedy per-expert feature sets, rule-based explanations and
    simulators, detection metrics, baselines (token statistics, bigram, single feature, single
    domain) and planted-feature worlds with exact ground truth.
"""
