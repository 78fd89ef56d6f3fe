"""Robustness methods: Dem-HEC entropy-guided fine-tuning for natural-corruption robustness (``dem_hec``)
and the baselines it is compared with (clean, Gaussian-noise and PGD adversarial fine-tuning)."""

from algorithms.robustness import dem_hec

__all__ = ["dem_hec"]
