"""Pure functions on arrays: no Flax, no hidden state (stateful tools are `(init, update)` pairs), no I/O.

Modules:
  attention: reference attention (GQA/MQA, masks, RoPE, decode, log-sum-exp merge).
  confidence_sequences: normal-mixture confidence sequences (mixture martingale, boundary, stopping rule).
  conformal: split conformal prediction (absolute residual, CQR, APS / RAPS sets, interval stability).
  corruptions: CIFAR-10-C style natural corruptions (noise, blur, digital, JPEG-like, elastic, fog), severities 0-5.
  diffusion: the mean-reverting SDE (IR-SDE) of PLMD: schedule, closed-form marginal, forward and reverse steps.
  drift_diffusion: first-passage times of a drift-diffusion model with signal-driven drift (IG, tangent, Volterra).
  ffd: Faster Flash Decoding reference: low-bit key pages, top-delta / top-k page selection, sparse decode.
  gaussian_sup: expected suprema of Gaussian vectors (quadrature, Monte Carlo, correlated variants).
  hyperbolic: Lorentz-model operations (exp/log maps, geodesic distance, parallel transport), Hyper-ICL's anchor loss.
  kmeans: batched Lloyd k-means with deterministic centroid updates.
  linear_attention: the bidirectional WKV of Vision-RWKV (quadratic reference, linear-time scans) and Q-Shift.
  malliavin: Euler-Maruyama paths, first variation, Malliavin derivative and adjoint sums.
  policy_losses: RL post-training losses (GRPO advantages, clipped surrogate, KL, pass@k).
  preference_losses: DPO, margin-DPO, IPO and SimPO on policy and reference log-probs.
  probabilistic_metrics: forecast scores (CRPS, PIT calibration, interval coverage, QICE).
  quantization: group-wise integer quantization with packed codes (symmetric / asymmetric).
  quest: Quest page selection (per-page key bounds, query-aware upper bounds, top pages).
  residual_quantization: progressive residual quantization (QVG): k-means stages, then a packed residual.
  routing: MoE router logits, top-k gating, load-balance / z-losses, confidence, dispatch metadata.
  sampling: greedy, temperature, top-k, top-p samplers and the `Sampler` rule.
  speculative: speculative decoding acceptance (greedy prefix match, rejection sampling).
  validation: argument checks shared by the public API (finite values, integer ids, lengths vs capacity).
"""

from primitives import attention, routing, sampling
from primitives.attention import attention as dot_product_attention
from primitives.attention import combine_partials, decode_attention, rope
from primitives.sampling import Sampler, greedy, temperature_sample, top_k_sample, top_p_sample

__all__ = [
    "attention", "routing", "sampling", "dot_product_attention", "decode_attention", "combine_partials", "rope",
    "Sampler", "greedy", "temperature_sample", "top_k_sample", "top_p_sample",
]
