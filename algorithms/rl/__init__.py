"""On-policy RL post-training of the decoder LM (issue 6).

Modules:
  grpo: the engine (rollouts with batched generation, verifiable rewards,
    group advantages, jitted clipped-surrogate updates with optional KL and
    entropy terms, a checkpointed training loop) and its plug-in points.
  differential_smoothing: DS-GRPO advantages, the entropy-bonus / penalty
    baselines and the exact tabular toy (Gai et al., arXiv:2511.19942).
  compute_allocation: IsoCompute (arXiv:2603.12151): iso-compute sweeps over
    (n, B_p, M), the compute-optimal frontier and its saturating fit, and a
    softmax-bandit surrogate of GRPO with Monte-Carlo and exact updates
    (import it directly: `from algorithms.rl import compute_allocation`; it
    pulls in scipy, which `import algorithms.rl` does not need).
  scm_grpo: SCM-GRPO (arXiv:2605.01482): dependency-graph parsing, DAG and
    sink checks, longest-path depth and the rule-based structural reward.
  nmars: N-MARS: the <UNDO> token (vocabulary extension, stack rendering,
    augmentation from the model's own deviations, masked SFT, the UNDO reward).
  staged_perception: staged perception -> reasoning post-training of a VLM: GRPO with images
    (prefill + `generate`), accuracy + format reward, stage schedules vs merged training at equal
    rollouts, checkpointed and resumable mid-stage (import it directly: it pulls in models.vlm).
"""

from algorithms.rl import differential_smoothing, grpo, nmars, scm_grpo
from algorithms.rl.differential_smoothing import ds_advantage_fn, ds_advantages
from algorithms.rl.grpo import (
    GRPOConfig,
    PromptBatch,
    RLResult,
    Rollout,
    grpo_advantage_fn,
    policy_logprobs,
    rl_step,
    sample_rollout,
    text_reward,
    train,
    update,
)

__all__ = [
    "grpo", "differential_smoothing", "scm_grpo", "nmars", "GRPOConfig", "PromptBatch", "Rollout", "RLResult",
    "grpo_advantage_fn", "text_reward", "policy_logprobs", "sample_rollout", "update", "rl_step", "train",
    "ds_advantages", "ds_advantage_fn",
]
