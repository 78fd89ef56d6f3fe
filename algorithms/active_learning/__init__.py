"""Active learning under class imbalance and label noise with foundation-model priors (spec
vision_weights_envs.md section 6): the FM-prior co-decision (``fm_priors``), the selection baselines DIRECT, margin,
entropy, coreset and random (``selection``), the annotator noise model (``noise``) and the small learner with its
evaluation (``learner``)."""

from algorithms.active_learning import fm_priors, learner, noise, selection

__all__ = ["fm_priors", "learner", "noise", "selection"]
