"""An on-policy GRPO engine for the decoder LM: rollouts, rewards, advantages, clipped updates.

One RL iteration (`rl_step`; `train` runs many, with checkpoints and resume):
  1. `sample_rollout`: G completions per prompt by `algorithms.decoding.generate`, with `old_logp`;
  2. the task's `reward_fn` scores them on the host;
  3. an `advantage_fn` gives constant advantages, [B, G] or [B, G, N] (default `grpo_advantage_fn`);
  4. `update`: `num_inner_steps` jitted optimizer steps on `policy_losses.clipped_surrogate`, plus
     `kl_coef` x k3 KL to a frozen reference and minus `entropy_coef` x mean token entropy.
Helpers: `GRPOConfig`, `PromptBatch`, `Rollout`, `RLResult`, `init_state` (a `training.TrainState`),
`assemble_sequences`, `policy_logprobs`, `text_reward` (per-sample text verifier -> batched reward).
Everything differentiable is a pure function of `(graphdef, params)` (`nnx.to_pure_dict` params).

Plugging in a task or method:
  * `prompt_fn(iteration) -> PromptBatch(problems, tokens [B, P], lengths [B])`, deterministic in the iteration;
  * `reward_fn(problems, completions [b, N], lengths [b]) -> [b]` (`problems` repeated per sample; shaping here);
  * `advantage_fn(rollout) -> [B, G] or [B, G, N]`, e.g. `algorithms.rl.differential_smoothing.ds_advantage_fn`.
KL / entropy coefficients are traced: runs differing only in them share one compilation. Runnable example:
`tests/algorithms/rl/grpo_test.py`.

Dimension legend: `B` prompts per batch, `G` samples per prompt, `b = B * G` sequences (groups
contiguous), `P` padded prompt length, `N` max new tokens, `v` vocabulary.

Spec: papers/specs/rl_alignment_agents.md section 1 (DS-GRPO, the first user) and its cross-cutting
implementation notes (group advantages, clipped surrogate, k3 KL).

INFERRED (engine choices, not from the papers):
  * the optimized policy is the temperature-scaled softmax, so ratios compare like with like;
  * the stop token belongs to the completion and gets a gradient;
  * `entropy_coef > 0` is a global entropy bonus, `< 0` a penalty; minibatches are contiguous slices.

References:
  Shao et al., "DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open
    Language Models", arXiv:2402.03300, 2024 (GRPO).
  Schulman et al., "Proximal Policy Optimization Algorithms", arXiv:1707.06347, 2017.
  Gai, Zeng, Zhang, Raghunathan, "Differential Smoothing Mitigates Sharpening and
    Improves LLM Reasoning", arXiv:2511.19942 (the engine's first user).
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from etils import epath
from flax import nnx

from algorithms._loop import run_loop
from algorithms.decoding.generate import generate
from algorithms.training import Checkpointer, FitResult, TrainState
from primitives import policy_losses
from primitives.sampling import Sampler

__all__ = [
    "GRPOConfig",
    "PromptBatch",
    "Rollout",
    "RLResult",
    "grpo_advantage_fn",
    "text_reward",
    "assemble_sequences",
    "policy_logprobs",
    "sample_rollout",
    "init_state",
    "update",
    "rl_step",
    "train",
]


@dataclasses.dataclass(frozen=True, kw_only=True)
class GRPOConfig:
    """Settings of the GRPO engine.

    Attributes:
      group_size: G samples per prompt (>= 2 for group advantages).
      max_new_tokens: N, the completion budget.
      temperature: sampling temperature (> 0); the optimized policy is the
        temperature-scaled softmax, so ratios compare like with like.
      stop_tokens: token ids that end a completion (the stop token is part of
        the completion and gets a gradient).
      pad_id: written after a completion stopped.
      clip_eps: lower PPO clip range.
      clip_eps_high: upper clip range (None = clip_eps).
      reduction: "token_mean" or "sequence_mean" (see `policy_losses.masked_mean`).
      kl_coef: weight of the k3 KL to the reference policy (0 = no reference).
      entropy_coef: weight of the policy's mean token entropy in the objective
        (> 0 global entropy bonus, < 0 global entropy penalty).
      num_inner_steps: optimizer steps per rollout batch (PPO epochs x minibatches).
      num_minibatches: the b sequences are split into this many contiguous
        minibatches, visited in turn (must divide b).
      normalize_std: GRPO std normalization in the default advantage.
      adv_eps: added to the group std.
    """

    group_size: int = 8
    max_new_tokens: int = 16
    temperature: float = 1.0
    stop_tokens: tuple[int, ...] = ()
    pad_id: int = 0
    clip_eps: float = 0.2
    clip_eps_high: float | None = None
    reduction: str = "token_mean"
    kl_coef: float = 0.0
    entropy_coef: float = 0.0
    num_inner_steps: int = 1
    num_minibatches: int = 1
    normalize_std: bool = True
    adv_eps: float = 1e-6

    def __post_init__(self):
        if self.group_size < 1:
            raise ValueError(f"group_size must be >= 1; got {self.group_size}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1; got {self.max_new_tokens}")
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0 for on-policy RL; got {self.temperature}")
        if self.reduction not in policy_losses.REDUCTIONS:
            raise ValueError(f"reduction must be one of {policy_losses.REDUCTIONS}; got {self.reduction!r}")
        if self.kl_coef < 0:
            raise ValueError(f"kl_coef must be >= 0; got {self.kl_coef}")
        if self.num_inner_steps < 1 or self.num_minibatches < 1:
            raise ValueError(f"num_inner_steps and num_minibatches must be >= 1; got {self.num_inner_steps}, "
                             f"{self.num_minibatches}")
        if not self.clip_eps > 0:
            raise ValueError(f"clip_eps must be > 0; got {self.clip_eps}")

    @property
    def sampler(self) -> Sampler:
        return Sampler(temperature=self.temperature)


class PromptBatch(NamedTuple):
    """A batch of prompts from a task's `prompt_fn`.

    Attributes:
      problems: B per-prompt objects handed to the reward function.
      tokens: [B, P] int32 right-padded prompt tokens (BOS included).
      lengths: [B] int32 real prompt lengths.
    """

    problems: Sequence[Any]
    tokens: np.ndarray
    lengths: np.ndarray


class Rollout(NamedTuple):
    """G completions per prompt with everything the update and advantages need.

    Attributes:
      prompt_tokens: [b, P] prompts, each repeated G times (groups contiguous).
      prompt_lengths: [b].
      completions: [b, N] int32 sampled tokens (pad after the stop token).
      mask: [b, N] float32, 1 on generated tokens (the stop token included).
      old_logp: [b, N] float32 log-probs under the sampling policy (0 at pads).
      rewards: [B, G] float32.
    """

    prompt_tokens: jax.Array
    prompt_lengths: jax.Array
    completions: jax.Array
    mask: jax.Array
    old_logp: jax.Array
    rewards: jax.Array

    @property
    def group_size(self) -> int:
        return int(self.rewards.shape[1])


RewardFn = Callable[[Sequence[Any], np.ndarray, np.ndarray], np.ndarray]
AdvantageFn = Callable[[Rollout], jax.Array]


def grpo_advantage_fn(*, normalize_std: bool = True, eps: float = 1e-6) -> AdvantageFn:
    """The default advantage: GRPO group standardization of the rewards, [B, G]."""

    def advantage_fn(rollout: Rollout) -> jax.Array:
        return policy_losses.group_advantages(rollout.rewards, normalize_std=normalize_std, eps=eps)

    return advantage_fn


def text_reward(tokenizer, score: Callable[[Any, str], float]) -> RewardFn:
    """A batched reward from a per-sample verifier on decoded text.

    Args:
      tokenizer: has `decode(ids) -> str` (stops at EOS), e.g. `CharTokenizer`.
      score: `(problem, completion_text) -> float`, e.g. `CountdownTask.reward`.

    Returns:
      `reward_fn(problems, completions, lengths) -> [b] float32`.
    """

    def reward_fn(problems, completions, lengths):
        completions, lengths = np.asarray(completions), np.asarray(lengths)
        return np.array([score(p, tokenizer.decode(completions[i, : lengths[i]]))
                         for i, p in enumerate(problems)], np.float32)

    return reward_fn


def assemble_sequences(prompt_tokens: jax.Array, prompt_lengths: jax.Array, completions: jax.Array,
                       *, pad_id: int = 0) -> tuple[jax.Array, jax.Array]:
    """Writes each completion right after its prompt's last real token.

    Args:
      prompt_tokens: [b, P] right-padded prompts.
      prompt_lengths: [b].
      completions: [b, N].
      pad_id: fills the tail.

    Returns:
      (tokens [b, P + N], positions [b, N]) where `positions[i, j]` is the index
      of completion token j in `tokens[i]`, so the logits at `positions - 1`
      predict the completion.
    """
    b, p = prompt_tokens.shape
    n = completions.shape[1]
    full = jnp.concatenate([prompt_tokens.astype(jnp.int32), jnp.full((b, n), pad_id, jnp.int32)], axis=1)
    positions = prompt_lengths.astype(jnp.int32)[:, None] + jnp.arange(n, dtype=jnp.int32)[None, :]
    full = full.at[jnp.arange(b)[:, None], positions].set(completions.astype(jnp.int32))
    # Prompt padding after the last real token is overwritten or lies after the completion.
    return full, positions


def policy_logprobs(graphdef: nnx.GraphDef, params: Any, prompt_tokens: jax.Array, prompt_lengths: jax.Array,
                    completions: jax.Array, *, temperature: float, pad_id: int = 0,
                    with_entropy: bool = False):
    """Per-token log-probs (and entropies) of completions under the policy, one forward pass.

    Args:
      graphdef, params: the policy (`nnx.split(model, nnx.Param)` with pure-dict params).
      prompt_tokens: [b, P]; prompt_lengths: [b]; completions: [b, N].
      temperature: the policy's sampling temperature.
      pad_id: padding id.
      with_entropy: also return the entropy [b, N] of the next-token distribution.

    Returns:
      logp [b, N] float32, or (logp, entropy) with `with_entropy`.
    """
    tokens, positions = assemble_sequences(prompt_tokens, prompt_lengths, completions, pad_id=pad_id)
    logits = nnx.merge(graphdef, params)(tokens).logits
    rows = jnp.arange(tokens.shape[0])[:, None]
    logits = logits[rows, positions - 1]  # [b, N, v]
    logp = policy_losses.token_logprobs(logits, completions, temperature=temperature)
    if not with_entropy:
        return logp
    return logp, policy_losses.entropy_from_logits(logits, temperature=temperature)


def sample_rollout(graphdef: nnx.GraphDef, params: Any, prompts: PromptBatch, key: jax.Array, *,
                   config: GRPOConfig, reward_fn: RewardFn) -> Rollout:
    """Samples G completions per prompt and scores them.

    Args:
      graphdef, params: the current (sampling) policy.
      prompts: the task's `PromptBatch` of B prompts.
      key: PRNG key for sampling.
      config: engine settings (group size, temperature, stop tokens, ...).
      reward_fn: `(problems per sample, completions [b, N], lengths [b]) -> [b]`.

    Returns:
      A `Rollout` with b = B * G rows.
    """
    tokens, lengths = np.asarray(prompts.tokens), np.asarray(prompts.lengths)
    if tokens.ndim != 2 or lengths.shape != tokens.shape[:1] or len(prompts.problems) != tokens.shape[0]:
        raise ValueError(f"prompts: expected tokens [B, P], lengths [B] and B problems; got {tokens.shape}, "
                         f"{lengths.shape} and {len(prompts.problems)} problems")
    g = config.group_size
    rep_tokens = jnp.asarray(np.repeat(tokens, g, axis=0), jnp.int32)
    rep_lengths = jnp.asarray(np.repeat(lengths, g, axis=0), jnp.int32)
    out = generate(nnx.merge(graphdef, params), rep_tokens, prompt_lengths=rep_lengths,
                   max_new_tokens=config.max_new_tokens, sampler=config.sampler, key=key,
                   stop_tokens=config.stop_tokens, pad_id=config.pad_id)
    mask = (jnp.arange(config.max_new_tokens)[None, :] < out.lengths[:, None]).astype(jnp.float32)
    problems = [p for p in prompts.problems for _ in range(g)]
    rewards = np.asarray(reward_fn(problems, np.asarray(out.tokens), np.asarray(out.lengths)), np.float32)
    if rewards.shape != (len(problems),):
        raise ValueError(f"reward_fn must return [b]=({len(problems)},) rewards; got shape {rewards.shape}")
    return Rollout(rep_tokens, rep_lengths, out.tokens, mask, out.logprobs,
                   jnp.asarray(rewards.reshape(-1, g)))


def init_state(params: Any, optimizer: optax.GradientTransformation) -> TrainState:
    """A fresh TrainState (step 0) holding a copy of `params` (the update donates its state)."""
    params = jax.tree.map(jnp.copy, params)
    return TrainState(jnp.zeros((), jnp.int32), params, optimizer.init(params))


@dataclasses.dataclass(frozen=True)
class UpdateSettings:
    """The static (compile-time) part of GRPOConfig for the update."""

    temperature: float
    pad_id: int
    clip_eps: float
    clip_eps_high: float | None
    reduction: str
    num_inner_steps: int
    num_minibatches: int

    @classmethod
    def of(cls, c: GRPOConfig) -> "UpdateSettings":
        return cls(c.temperature, c.pad_id, c.clip_eps, c.clip_eps_high, c.reduction, c.num_inner_steps,
                   c.num_minibatches)


def objective(logp, ent, mb, kl_coef, entropy_coef, s: UpdateSettings):
    """GRPO's loss on a minibatch from the policy's token log-probs `logp` and entropies `ent` [b, N].

    `clipped_surrogate` - entropy_coef x entropy + kl_coef x k3 KL to `mb["ref_logp"]`, all `masked_mean`
    over `mb["mask"]`. Returns (loss, metrics). Shared by every policy whose log-probs come another way
    (e.g. `algorithms.rl.staged_perception`'s VLM with images).
    """
    mask = mb["mask"]
    surrogate, metrics = policy_losses.clipped_surrogate(logp, mb["old_logp"], mb["advantages"], mask,
                                                         clip_eps=s.clip_eps, clip_eps_high=s.clip_eps_high,
                                                         reduction=s.reduction)
    entropy = policy_losses.masked_mean(ent, mask, reduction=s.reduction)
    loss = surrogate - entropy_coef * entropy
    metrics = dict(metrics, surrogate=surrogate, entropy=entropy)
    # Always computed (ref_logp = old_logp without a reference, kl_coef = 0), so runs with and
    # without the KL term share one compilation.
    kl = policy_losses.masked_mean(policy_losses.k3_kl(logp, mb["ref_logp"]), mask, reduction=s.reduction)
    loss = loss + kl_coef * kl
    metrics["kl_ref"] = kl
    metrics["loss"] = loss
    return loss, metrics


def _loss(params, graphdef, mb, kl_coef, entropy_coef, s: UpdateSettings):
    logp, ent = policy_logprobs(graphdef, params, mb["prompt_tokens"], mb["prompt_lengths"], mb["completions"],
                                temperature=s.temperature, pad_id=s.pad_id, with_entropy=True)
    return objective(logp, ent, mb, kl_coef, entropy_coef, s)


@functools.partial(jax.jit, static_argnames=("graphdef", "optimizer", "settings"), donate_argnums=(0,))
def _update(state: TrainState, batch: dict, kl_coef, entropy_coef, *, graphdef, optimizer, settings):
    b = batch["completions"].shape[0]
    m = settings.num_minibatches
    size = b // m

    def one_step(state, i):
        start = (i % m) * size
        mb = jax.tree.map(lambda x: jax.lax.dynamic_slice_in_dim(x, start, size, axis=0), batch)
        (_, metrics), grads = jax.value_and_grad(_loss, has_aux=True)(
            state.params, graphdef, mb, kl_coef, entropy_coef, settings)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        metrics["grad_norm"] = optax.tree.norm(grads)
        return TrainState(state.step + 1, params, opt_state), metrics

    state, metrics = jax.lax.scan(one_step, state, jnp.arange(settings.num_inner_steps))
    # First inner step = on-policy values (ratio 1); last = after the trust-region steps.
    out = {k: v[0] for k, v in metrics.items()}
    out.update({f"{k}_last": v[-1] for k, v in metrics.items() if k in ("clip_fraction", "approx_kl", "loss")})
    return state, out


def update(state: TrainState, rollout: Rollout, advantages: jax.Array, *, graphdef: nnx.GraphDef,
           optimizer: optax.GradientTransformation, config: GRPOConfig,
           ref_params: Any = None) -> tuple[TrainState, dict]:
    """`config.num_inner_steps` optimizer steps on one rollout batch (jitted, state donated).

    Args:
      state: TrainState of the policy.
      rollout: the batch (its `old_logp` anchors the ratios).
      advantages: [B, G] or [B, G, N] from the advantage function (constants).
      graphdef: the policy's structure.
      optimizer: the optax transformation of `state.opt_state` (pass the same
        object every call: it is a static argument of the compiled update).
      config: engine settings.
      ref_params: frozen reference policy params; required when kl_coef > 0.

    Returns:
      (new state, metrics of the first inner step plus "*_last" of the last).
    """
    b, n = rollout.completions.shape
    if b % config.num_minibatches:
        raise ValueError(f"num_minibatches={config.num_minibatches} must divide the b={b} sequences")
    adv = jnp.asarray(advantages, jnp.float32)
    groups = rollout.rewards.shape
    if adv.shape == groups:
        adv = adv.reshape(b)
    elif adv.shape == groups + (n,):
        adv = adv.reshape(b, n)
    else:
        raise ValueError(f"advantages must be [B, G]={groups} or [B, G, N]={groups + (n,)}; got {adv.shape}")
    batch = {"prompt_tokens": rollout.prompt_tokens, "prompt_lengths": rollout.prompt_lengths,
             "completions": rollout.completions, "mask": rollout.mask, "old_logp": rollout.old_logp,
             "advantages": adv}
    if config.kl_coef > 0:
        if ref_params is None:
            raise ValueError("ref_params: a reference policy is required when kl_coef > 0")
        batch["ref_logp"] = _ref_logprobs(graphdef, ref_params, rollout, config)
    else:
        batch["ref_logp"] = rollout.old_logp
    return _update(state, batch, jnp.float32(config.kl_coef), jnp.float32(config.entropy_coef),
                   graphdef=graphdef, optimizer=optimizer, settings=UpdateSettings.of(config))


def _ref_logprobs(graphdef, ref_params, rollout: Rollout, config: GRPOConfig) -> jax.Array:
    return _ref_logprobs_jit(graphdef, ref_params, rollout.prompt_tokens, rollout.prompt_lengths,
                             rollout.completions, temperature=config.temperature, pad_id=config.pad_id)


_ref_logprobs_jit = jax.jit(lambda g, p, t, l, c, temperature, pad_id: policy_logprobs(
    g, p, t, l, c, temperature=temperature, pad_id=pad_id), static_argnums=(0,),
    static_argnames=("temperature", "pad_id"))


def rl_step(state: TrainState, prompts: PromptBatch, key: jax.Array, *, graphdef: nnx.GraphDef,
            optimizer: optax.GradientTransformation, config: GRPOConfig, reward_fn: RewardFn,
            advantage_fn: AdvantageFn | None = None, ref_params: Any = None) -> tuple[TrainState, dict, Rollout]:
    """One RL iteration: rollout, rewards, advantages, update.

    Returns:
      (new state, metrics as floats, the rollout).
    """
    advantage_fn = advantage_fn or grpo_advantage_fn(normalize_std=config.normalize_std, eps=config.adv_eps)
    rollout = sample_rollout(graphdef, state.params, prompts, key, config=config, reward_fn=reward_fn)
    advantages = advantage_fn(rollout)
    state, metrics = update(state, rollout, advantages, graphdef=graphdef, optimizer=optimizer, config=config,
                            ref_params=ref_params)
    rewards = np.asarray(rollout.rewards)
    metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
    metrics.update(
        reward_mean=float(rewards.mean()),
        informative_groups=float((rewards.std(axis=1) > 0).mean()),
        completion_length=float(np.asarray(rollout.mask).sum(1).mean()),
        advantage_abs=float(np.abs(np.asarray(advantages)).mean()),
    )
    return state, metrics, rollout


# `train`'s output: the same record as supervised `training.fit` returns (graphdef, final TrainState,
# logged metrics, resume point); here `history` rows carry "iteration" and `resumed_from` is the RL
# iteration the run resumed from. `.model()` merges the trained policy.
RLResult = FitResult


def train(*, graphdef: nnx.GraphDef, params: Any, optimizer: optax.GradientTransformation, config: GRPOConfig,
          prompt_fn: Callable[[int], PromptBatch], reward_fn: RewardFn, num_steps: int, seed: int = 0,
          advantage_fn: AdvantageFn | None = None, ref_params: Any = None,
          workdir: str | os.PathLike | None = None, checkpoint_every: int = 50, log_every: int = 10,
          stop_after: int | None = None, progress: bool = True, desc: str = "grpo",
          fingerprint: str | None = None) -> RLResult:
    """Runs `num_steps` RL iterations, resuming from `workdir/ckpt` if a checkpoint exists.

    Iteration i uses `prompt_fn(i)` and the key `fold_in(key(seed), i)`, so an
    interrupted run resumed from its checkpoint ends where an uninterrupted one
    does.

    Args:
      graphdef, params: the initial policy (e.g. the SFT model).
      optimizer: optax transformation (reuse the same object across runs to
        share the compiled update).
      config: engine settings.
      prompt_fn: `iteration -> PromptBatch`.
      reward_fn: batched reward (see the module docstring).
      num_steps: RL iterations.
      seed: sampling seed.
      advantage_fn: `Rollout -> advantages`; default GRPO.
      ref_params: frozen reference policy for the KL term (default: the initial
        params when `config.kl_coef > 0`).
      workdir: checkpoints go to `workdir/ckpt`; None = none.
      checkpoint_every, log_every: in iterations.
      stop_after: stop (as if interrupted) after this many total iterations.
      progress: tqdm bar.
      desc: bar label.
      fingerprint: identifies the run's settings; a checkpoint with another
        fingerprint raises ValueError.

    Returns:
      RLResult.
    """
    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1; got {num_steps}")
    if config.kl_coef > 0 and ref_params is None:
        ref_params = jax.tree.map(jnp.copy, params)
    base_key = jax.random.key(seed)

    def step_fn(state, it):
        state, metrics, _ = rl_step(state, prompt_fn(it), jax.random.fold_in(base_key, it), graphdef=graphdef,
                                    optimizer=optimizer, config=config, reward_fn=reward_fn,
                                    advantage_fn=advantage_fn, ref_params=ref_params)
        return state, metrics

    out = run_loop(
        step_fn, init_state(params, optimizer), num_steps=num_steps, stop_after=stop_after,
        checkpointer=None if workdir is None else Checkpointer(epath.Path(workdir) / "ckpt"),
        checkpoint_every=checkpoint_every, checkpoint_meta=lambda done: {"iteration": done},
        fingerprint=fingerprint, log_every=log_every, row_fn=lambda done, m: dict(m, iteration=done),
        progress=progress, desc=desc,
        postfix=lambda row: {"reward": f"{row['reward_mean']:.3f}", "ent": f"{row['entropy']:.3f}"})
    return RLResult(graphdef, out.state, out.history, out.resumed_from)
