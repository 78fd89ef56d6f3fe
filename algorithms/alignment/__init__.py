"""Preference alignment of the decoder LM (issue 29).

Modules:
  camp: CAMP, conflict-aware adaptive margin preference optimization (truthfulness vs helpfulness):
    per-pair conflict detection and score, the adaptive margin / strength, the multi-objective
    baselines (DPO per objective, fixed-weight mixture, MODPO) over pairs rated on two objectives,
    and a jitted training loop on sequence log-probs under a frozen reference.
  hyper_icl: Hyper-ICL, a low-rank query-gated attention-logit adapter (through the LM's
    `attention_bias` hook) distilled from an in-context teacher with a Lorentz-model anchor loss.
  rosa2: ROSA2 words-and-weights co-adaptation over a multi-turn interaction: the feedback normalizer
    (words) and the ROSA one-step KL-regularized adapter update solved by conjugate gradient (weights).
  style_heads: Style Modulation Heads: layer-wise cosine localization of a style direction, head-wise
    contribution scores, steering a few heads' outputs, and residual-stream steering as the baseline.

The loss functions themselves (DPO, IPO, SimPO, margin-DPO) are in `primitives.preference_losses`.
"""

from algorithms.alignment import camp, hyper_icl, rosa2, style_heads
from algorithms.alignment.camp import (
    METHODS,
    CAMPConfig,
    PreferenceConfig,
    camp_loss,
    camp_margin_and_strength,
    conflict_score,
    detect_conflicts,
    method_loss,
    orient_pairs,
    sequence_logprobs,
    train,
)

__all__ = [
    "camp", "hyper_icl", "rosa2", "style_heads", "METHODS", "CAMPConfig", "PreferenceConfig", "camp_loss", "camp_margin_and_strength",
    "conflict_score", "detect_conflicts", "method_loss", "orient_pairs", "sequence_logprobs", "train",
]
