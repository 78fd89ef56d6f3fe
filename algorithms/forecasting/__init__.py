"""Probabilistic forecasting (issue 8): Parametric Prior Mapping (PPM).

Import the modules directly, e.g. `from algorithms.forecasting import ppm`.
"""
