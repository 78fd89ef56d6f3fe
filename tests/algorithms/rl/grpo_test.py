"""The GRPO engine: rollout log-probs, sequence assembly, updates, learning, resume."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from algorithms.rl import grpo
from models import Transformer, TransformerConfig

VOCAB, STOP, PAD, TARGET = 8, 2, 0, 5
OPT = optax.adam(3e-2)  # one object: a static argument of the compiled update
# One sampler, batch and length everywhere, so generation compiles once for the module.
CFG = grpo.GRPOConfig(group_size=4, max_new_tokens=3, temperature=0.7, stop_tokens=(STOP,), pad_id=PAD,
                      num_inner_steps=2)


@pytest.fixture(scope="module")
def policy():
    cfg = TransformerConfig(vocab_size=VOCAB, d_model=16, num_layers=1, num_heads=2, num_kv_heads=1, d_ff=32)
    graphdef, params = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)), nnx.Param)
    return graphdef, nnx.to_pure_dict(params)


def prompt_fn(position, batch=4):
    rng = np.random.default_rng(position)
    tokens = np.zeros((batch, 3), np.int32)
    lengths = rng.integers(1, 4, batch).astype(np.int32)
    for i, n in enumerate(lengths):
        tokens[i, :n] = [1] + list(rng.integers(3, VOCAB, n - 1))
    return grpo.PromptBatch(list(range(batch)), tokens, lengths)


def reward_fn(problems, completions, lengths):
    """1 if the first generated token is TARGET (a verifiable toy reward)."""
    del problems, lengths
    return (completions[:, 0] == TARGET).astype(np.float32)


def test_assemble_sequences_places_completions_after_prompts():
    prompts = jnp.array([[1, 4, 0], [1, 0, 0]])
    comps = jnp.array([[6, 7], [5, 2]])
    full, pos = grpo.assemble_sequences(prompts, jnp.array([2, 1]), comps, pad_id=PAD)
    assert full.tolist() == [[1, 4, 6, 7, 0], [1, 5, 2, 0, 0]]
    assert pos.tolist() == [[2, 3], [1, 2]]


def test_rollout_logprobs_equal_a_recomputed_forward_pass(policy):
    graphdef, params = policy
    temperature = CFG.temperature
    ro = grpo.sample_rollout(graphdef, params, prompt_fn(0), jax.random.key(1), config=CFG, reward_fn=reward_fn)
    assert ro.completions.shape == (16, 3) and ro.rewards.shape == (4, 4)
    np.testing.assert_array_equal(np.asarray(ro.prompt_tokens[:4]), np.repeat(prompt_fn(0).tokens[:1], 4, 0))
    recomputed = grpo.policy_logprobs(graphdef, params, ro.prompt_tokens, ro.prompt_lengths, ro.completions,
                                      temperature=temperature)
    mask = np.asarray(ro.mask)
    assert mask.sum() > 16  # some rows continue past the first token
    np.testing.assert_allclose(np.asarray(recomputed) * mask, np.asarray(ro.old_logp), atol=2e-5)
    # Independent check of one row: a plain forward pass on the concatenated sequence.
    model = nnx.merge(graphdef, params)
    i = int(np.argmax(mask.sum(1)))
    n_prompt = int(ro.prompt_lengths[i])
    seq = np.concatenate([np.asarray(ro.prompt_tokens[i, :n_prompt]), np.asarray(ro.completions[i])])
    logits = np.asarray(model(jnp.asarray(seq[None])).logits[0], np.float64) / temperature
    logp = logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True)
    for j in range(int(mask[i].sum())):
        assert np.asarray(ro.old_logp)[i, j] == pytest.approx(logp[n_prompt + j - 1, seq[n_prompt + j]], abs=2e-5)


def test_update_first_step_is_on_policy_and_zero_advantage_changes_nothing(policy):
    graphdef, params = policy
    state = grpo.init_state(params, OPT)
    ro = grpo.sample_rollout(graphdef, params, prompt_fn(1), jax.random.key(2), config=CFG, reward_fn=reward_fn)
    new, metrics = grpo.update(state, ro, jnp.zeros(ro.rewards.shape), graphdef=graphdef, optimizer=OPT,
                               config=CFG)
    assert float(metrics["ratio_mean"]) == pytest.approx(1.0, abs=1e-5)
    assert abs(float(metrics["approx_kl"])) < 1e-5 and float(metrics["grad_norm"]) == 0.0
    assert int(new.step) == CFG.num_inner_steps
    chex.assert_trees_all_equal(new.params, params)


def test_update_validates_advantages_and_reference(policy):
    graphdef, params = policy
    ro = grpo.sample_rollout(graphdef, params, prompt_fn(1), jax.random.key(2), config=CFG, reward_fn=reward_fn)
    with pytest.raises(ValueError, match="advantages"):
        grpo.update(grpo.init_state(params, OPT), ro, jnp.zeros((3, 3)), graphdef=graphdef, optimizer=OPT,
                    config=CFG)
    kl_cfg = grpo.GRPOConfig(**{**CFG.__dict__, "kl_coef": 0.1})
    with pytest.raises(ValueError, match="ref_params"):
        grpo.update(grpo.init_state(params, OPT), ro, jnp.zeros(ro.rewards.shape), graphdef=graphdef,
                    optimizer=OPT, config=kl_cfg)
    with pytest.raises(ValueError, match="temperature"):
        grpo.GRPOConfig(temperature=0.0)


def test_kl_to_reference_is_zero_on_policy(policy):
    graphdef, params = policy
    kl_cfg = grpo.GRPOConfig(**{**CFG.__dict__, "kl_coef": 0.1})
    state = grpo.init_state(params, OPT)
    state, metrics, _ = grpo.rl_step(state, prompt_fn(3), jax.random.key(3), graphdef=graphdef, optimizer=OPT,
                                     config=kl_cfg, reward_fn=reward_fn, ref_params=params)
    assert abs(metrics["kl_ref"]) < 1e-6


def test_training_raises_reward_and_resumes_exactly(policy, tmp_path):
    graphdef, params = policy
    kwargs = dict(graphdef=graphdef, params=params, optimizer=OPT, config=CFG, prompt_fn=prompt_fn,
                  reward_fn=reward_fn, seed=0, progress=False, log_every=1, fingerprint="toy")
    full = grpo.train(num_steps=12, **kwargs)
    rewards = [h["reward_mean"] for h in full.history]
    assert np.mean(rewards[-3:]) > np.mean(rewards[:3]) + 0.2, rewards
    first = grpo.train(num_steps=12, workdir=tmp_path, checkpoint_every=6, stop_after=6, **kwargs)
    assert first.resumed_from is None and int(first.state.step) == 6 * CFG.num_inner_steps
    resumed = grpo.train(num_steps=12, workdir=tmp_path, checkpoint_every=6, **kwargs)
    assert resumed.resumed_from == 6
    chex.assert_trees_all_close(resumed.state.params, full.state.params, rtol=1e-5, atol=1e-6)
    assert [h["iteration"] for h in resumed.history] == list(range(1, 13))
    with pytest.raises(ValueError, match="fingerprint"):
        grpo.train(num_steps=12, workdir=tmp_path, **{**kwargs, "fingerprint": "other"})
