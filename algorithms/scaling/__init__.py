"""Scaling laws and the training procedures they are fitted on (issue 5).

Modules (import them directly, e.g. `from algorithms.scaling import sparse_law`):
  sparse_law: the sparse data-constrained law L(N, U, D, s) (density factor, repetition terms),
    its 4-stage Huber / L-BFGS fit, compute-optimal allocation and the loss- and compute-optimal
    density analyses, with the paper's published constants.
  dynamic_sparse: dynamic sparse training (SET: magnitude prune, random regrow, zero re-init,
    optimizer-moment reset, cosine-decayed prune rate) for the decoder LM, as pure functions over
    the parameter pytree and the optax state, plus a small train driver.
"""
