"""Solvers, online algorithms and games (issue 7).

Modules (import them directly, e.g. `from algorithms.optimization import online_covering`):
  online_covering: classical online covering algorithms, exact offline optima, prediction error, and the
    trust / lazy / robust prediction wrappers (Learning-Augmented Online Covering Problems).
  benchmark_game: the leaderboard Stackelberg game, best responses, equilibrium search and
    tune-before-test (Leaderboard Incentives).
"""
