"""MAFE: multi-agent fair environments and F-MACEM (arXiv 2502.18534; spec section 7 of
/work/shared/papers/specs/vision_weights_envs.md).

  core: the Fair Dec-POMDP abstraction (`FairEnv`, component functions, group-wise segment sums,
    scalarisation, `lax.scan` rollouts, the F-MACEM episode objective).
  loan / healthcare / education: the three domain simulators, our own instantiations "in the spirit of MAFE"
    ([INFER]: the paper's per-domain dynamics were not available), each with its F-MACEM policy class.
  fmacem: the Fair Multi-Agent Cross-Entropy Method, cooperative (shared J) and independent (alternating).
  pettingzoo_env: `MAFEParallelEnv`, a PettingZoo ParallelEnv adapter (numpy in/out, gymnasium spaces).

The PettingZoo adapter is imported lazily (``from algorithms.fairness.mafe.pettingzoo_env import
MAFEParallelEnv``) so that the JAX core does not need pettingzoo.
"""

from algorithms.fairness.mafe import core, education, fmacem, healthcare, loan
from algorithms.fairness.mafe.core import FairEnv, Policy, episode_objective, rollout, scalarise
from algorithms.fairness.mafe.education import EducationMAFE, EduParams, education_policy
from algorithms.fairness.mafe.fmacem import cem, evaluate, fmacem as run_fmacem, independent_fmacem
from algorithms.fairness.mafe.healthcare import HealthcareMAFE, HealthParams, health_policy
from algorithms.fairness.mafe.loan import LoanMAFE, LoanParams, loan_policy

__all__ = ["core", "loan", "healthcare", "education", "fmacem", "FairEnv", "Policy", "rollout", "scalarise",
           "episode_objective", "LoanMAFE", "LoanParams", "loan_policy", "HealthcareMAFE", "HealthParams",
           "health_policy", "EducationMAFE", "EduParams", "education_policy", "cem", "run_fmacem",
           "independent_fmacem", "evaluate"]
