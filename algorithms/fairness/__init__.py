"""Fairness in sequential, multi-agent decision making (issue 32).

Modules (import them directly, e.g. `from algorithms.fairness import mafe`):
  mafe: MAFE multi-agent fair environments (Fair Dec-POMDP core; loan, healthcare and education domains,
    our own instantiations), a PettingZoo ParallelEnv adapter, and F-MACEM (cooperative and independent).
"""
