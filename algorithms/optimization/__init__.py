"""Solvers, online algorithms and games (issue 7).

Modules (import them directly, e.g. `from algorithms.optimization import online_covering`):
  online_covering: classical online covering algorithms, exact offline optima, prediction error, and the
    trust / lazy / robust prediction wrappers (Learning-Augmented Online Covering Problems).
  benchmark_game: the leaderboard Stackelberg game, best responses, equilibrium search and
    tune-before-test (Leaderboard Incentives).
  gaussian_sup: expected suprema of Gaussians under a variance budget: Algorithm 1 (PTAS, one set),
    Algorithm 3 (greedy over variance levels), brute force and a projected-gradient heuristic
    (Allocating Variance to Maximize Expectation).
  drift_diffusion: optimal signal timing through the closed-form first-passage approximation, a
    simulated watch-time environment and per-user maximum-likelihood fits (time-varying drift DDM).
  stochastic_path_follower: the Stochastic Path Follower (a neural SDE trained through Malliavin
    derivatives to track a drifting optimum) and its baselines PDM, online proximal SGD and a
    parametric path model.
"""
