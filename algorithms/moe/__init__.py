"""Mixture-of-experts methods (issue 5).

Modules (import them directly, e.g. `from algorithms.moe import router_interp`):
  router_interp: RouterInterp and the Superposed Specialisation Hypothesis: SAE-feature / expert
    alignment and predictiveness, greedy per-expert feature sets, rule-based explanations and
    simulators, detection metrics, baselines (token statistics, bigram, single feature, single
    domain) and planted-feature worlds with exact ground truth.
  rerouting: test-time rerouting ("Rewiring Experts on the Fly"): one additive router-logit vector
    per confidence-selected layer, fitted on the context's own next-token loss at prefill and every
    m generated tokens (KV cache recomputed); baselines all / random / no layers, an oracle fitted
    on the continuation and a C3PO-style retrieval baseline.
"""
