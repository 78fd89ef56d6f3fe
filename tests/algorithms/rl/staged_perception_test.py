"""Tests of algorithms.rl.staged_perception: rewards, schedule, merged pooling, VLM GRPO step, resume."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from algorithms.rl import grpo
from algorithms.rl import staged_perception as sp
from algorithms.training import Checkpointer
from experiments import staged_vlm as task

TOK = task.make_tokenizer()
C = task.Config(model=task.ModelSection(d_model=16, num_layers=1, num_heads=2, d_ff=32, vit_d_model=8),
                rl=task.RLSection(prompts=2, group_size=2, orders=(sp.PAPER_ORDER,)), progress=False)
RL = grpo.GRPOConfig(group_size=2, max_new_tokens=4, stop_tokens=(TOK.eos_id,), pad_id=TOK.pad_id, kl_coef=0.01)
B = "\\boxed"
SGD = optax.sgd(1e-1)  # one optimizer object for the update tests: one compilation
ADAMW = optax.adamw(3e-3, weight_decay=1e-2)  # one object for the two resume tests: they share the compiled update


# --- rewards ------------------------------------------------------------------------------------------

REWARD_CASES = [  # completion, answer, accuracy, format
    (f"<think> r0 c1 </think> {B} 1", "1", 1, 1),
    (f"<think> r0 c1 </think> {B} 2", "1", 0, 1),
    (f"r0 c1 {B} 1", "1", 1, 0),                        # no <think>
    (f"<think> r0 c1 {B} 1", "1", 1, 0),                # no </think>
    (f"<think> r0 </think> 1", "1", 0, 0),              # no \boxed: accuracy 0 even with the right word
    (f"<think> </think> {B}", "1", 0, 0),               # \boxed without content
    (f"<think> </think> {B} 2 {B} 1", "1", 1, 1),       # the last \boxed counts
    (f"<think> </think> {B} 1 {B} 2", "1", 0, 1),
    (f"{B} 1 <think> </think>", "1", 1, 0),             # must start with <think>
    (f"<think> {B} 1 </think>", "1", 1, 0),             # \boxed must come after </think>
    (f"<think> </think> same {B} same ;", "same", 1, 1),  # text after the box is allowed
    ("", "1", 0, 0),
]


@pytest.mark.parametrize("text,answer,acc,fmt", REWARD_CASES)
def test_reward_exact_on_hand_made_completions(text, answer, acc, fmt):
    assert sp.accuracy_reward(text, answer) == acc
    assert sp.format_reward(text) == fmt
    assert sp.staged_reward(text, answer) == pytest.approx(0.9 * acc + 0.1 * fmt, abs=0)
    assert sp.staged_reward(text.split(), answer) == sp.staged_reward(text, answer)


def test_batched_reward_decodes_until_eos():
    rows, answers, expected = [], [], []
    for text, answer, acc, fmt in REWARD_CASES:
        ids = TOK.encode(text) + [TOK.eos_id] + TOK.encode(f"{B} 9")  # junk after EOS is ignored
        rows.append(ids)
        answers.append(answer)
        expected.append(0.9 * acc + 0.1 * fmt)
    n = max(map(len, rows))
    comps = np.array([r + [TOK.pad_id] * (n - len(r)) for r in rows], np.int32)
    lengths = np.array([len(r) for r in rows], np.int32)
    got = sp.make_reward_fn(TOK)(answers, comps, lengths)
    np.testing.assert_allclose(got, np.array(expected, np.float32), rtol=0, atol=1e-7)


# --- schedule and prompt pooling ----------------------------------------------------------------------

ITERS = {"perception": 2, "text_reasoning": 3, "visual_reasoning": 1}


@pytest.mark.parametrize("order", [sp.PAPER_ORDER, sp.ABSTRACT_ORDER, ("visual_reasoning", "text_reasoning", "perception")])
def test_schedule_visits_stages_in_order_with_their_counts(order):
    sch = sp.staged_schedule(order, ITERS)
    expected = [(name, k) for name in order for k in range(ITERS[name])]
    assert sch.visits() == expected
    assert sch.total_iterations == 6
    assert [s.train_vision for s in sch.stages] == [n != "text_reasoning" for n in order]
    sources = {n: (lambda k, n=n: _fake_batch(n, k, 3)) for n in sp.STAGES}
    fn = sp.make_prompt_fn(sch, sources)
    got = [tuple(fn(i).problems[0].split("-")[:2]) for i in range(sch.total_iterations)]
    assert got == [(n, str(k)) for n, k in expected]


def _fake_batch(name, k, b):
    return sp.VLMPromptBatch([f"{name}-{k}-{r}" for r in range(b)], np.full((b, 5), 4, np.int32),
                             np.full((b,), 3, np.int32), np.zeros((b, 1, 2, 2, 1), np.float32))


def test_merged_sees_exactly_the_staged_prompts_and_rollouts():
    staged = sp.staged_schedule(sp.PAPER_ORDER, ITERS)
    merged = sp.merged_schedule(staged)
    assert merged.total_iterations == staged.total_iterations and merged.merged and not staged.merged
    sources = {n: (lambda k, n=n: _fake_batch(n, k, 3)) for n in sp.STAGES}
    s_fn, m_fn = sp.make_prompt_fn(staged, sources), sp.make_prompt_fn(merged, sources, seed=1)
    s_rows = [p for i in range(staged.total_iterations) for p in s_fn(i).problems]
    m_batches = [m_fn(i) for i in range(merged.total_iterations)]
    m_rows = [p for b in m_batches for p in b.problems]
    assert all(len(b.problems) == 3 and b.tokens.shape == (3, 5) and b.images.shape[0] == 3 for b in m_batches)
    assert sorted(m_rows) == sorted(s_rows) and len(set(m_rows)) == len(m_rows) == 18
    assert m_rows != s_rows  # shuffled
    # merged batches mix stages, and the shuffle is a pure function of the seed
    assert any(len({p.split("-")[0] for p in b.problems}) > 1 for b in m_batches)
    assert [p for i in range(6) for p in sp.make_prompt_fn(merged, sources, seed=1)(i).problems] == m_rows


# --- the VLM GRPO step --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def vlm():
    graphdef, params = nnx.split(task.make_model(C, TOK, 0), nnx.Param)
    return graphdef, nnx.to_pure_dict(params)


def _prompts(kind, k=0):
    return task.prompt_batch(task.examples(C, kind, 2, seed=100 + k, tok=TOK))


def _leaves_equal(a, b):
    return all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def test_zero_advantage_step_leaves_parameters_unchanged(vlm):
    graphdef, params = vlm
    rollout = sp.sample_vlm_rollout(graphdef, params, _prompts("visual_reasoning"), jax.random.key(0), config=RL,
                                    reward_fn=sp.make_reward_fn(TOK))
    r = rollout.rollout
    assert r.completions.shape == (4, 4) and r.rewards.shape == (2, 2) and rollout.images.shape[0] == 4
    # the sampling log-probs are the teacher-forced log-probs of the same policy (with the images;
    # `_ref_logprobs` is the jitted `vlm_logprobs`)
    lp = sp._ref_logprobs(graphdef, params, r.prompt_tokens, r.prompt_lengths, rollout.images, r.completions,
                         temperature=RL.temperature, pad_id=RL.pad_id)
    np.testing.assert_allclose(np.asarray(lp * r.mask), np.asarray(r.old_logp * r.mask), atol=2e-5)
    zeros = jnp.zeros((2, 2))
    # no KL term: the gradient is exactly 0, so the step leaves every parameter bit-identical
    no_kl = dataclasses.replace(RL, kl_coef=0.0)
    opt = SGD
    state, m = sp.vlm_update(grpo.init_state(params, opt), rollout, zeros, graphdef=graphdef, optimizer=opt,
                             config=no_kl)
    assert _leaves_equal(state.params, params) and float(m["grad_norm"]) == 0.0
    # KL to the reference = the initial policy: KL 0 and a vanishing gradient (no visible change)
    state, m = sp.vlm_update(grpo.init_state(params, opt), rollout, zeros, graphdef=graphdef, optimizer=opt,
                             config=RL, ref_params=params)
    assert abs(float(m["kl_ref"])) < 1e-6 and float(m["grad_norm"]) < 1e-5
    assert max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(jax.tree.leaves(state.params),
                                                              jax.tree.leaves(params))) < 1e-7
    # a nonzero advantage does move the policy (the test above can fail)
    state, _ = sp.vlm_update(grpo.init_state(params, opt), rollout, jnp.array([[1.0, -1.0], [-1.0, 1.0]]),
                             graphdef=graphdef, optimizer=opt, config=no_kl)
    assert not _leaves_equal(state.params["lm"], params["lm"])


def test_resume_mid_stage_is_bit_identical_and_text_stage_freezes_vision(vlm, tmp_path):
    graphdef, params = vlm
    sch = sp.staged_schedule(("perception", "text_reasoning"), {"perception": 1, "text_reasoning": 2})
    sources = {n: (lambda k, n=n: _prompts(n, k)) for n in ("perception", "text_reasoning")}
    opt = ADAMW
    kw = dict(graphdef=graphdef, params=params, optimizer=opt, config=RL, schedule=sch,
              prompt_fn=sp.make_prompt_fn(sch, sources), reward_fn=sp.make_reward_fn(TOK), seed=3, progress=False)
    full = sp.train_staged(workdir=None, **kw)  # the uninterrupted reference: no checkpoints to write
    assert [h["stage"] for h in full.history] == ["perception", "text_reasoning", "text_reasoning"]
    after_p = sp.train_staged(workdir=tmp_path / "b", stop_after=1, **kw)
    mid = sp.train_staged(workdir=tmp_path / "b", stop_after=2, **kw)
    assert mid.resumed_from == 1
    with Checkpointer(tmp_path / "b" / "ckpt") as ck:
        meta = ck.metadata()
    assert (meta["iteration"], meta["stage"], meta["stage_iterations_done"]) == (2, "text_reasoning", 1)
    resumed = sp.train_staged(workdir=tmp_path / "b", **kw)
    assert resumed.resumed_from == 2
    assert _leaves_equal(resumed.state.train.params, full.state.train.params)
    assert _leaves_equal(resumed.state.ref_params, full.state.ref_params)
    assert int(resumed.state.train.step) == int(full.state.train.step) == 3
    assert [h["reward_mean"] for h in resumed.history] == [h["reward_mean"] for h in full.history]
    # the text stage trains the LM but leaves the vision tower bit-identical (weight decay included);
    # its KL reference is the policy at the stage's start
    for key in sp.VISION_KEYS:
        assert _leaves_equal(full.state.train.params[key], after_p.state.train.params[key])
    assert not _leaves_equal(full.state.train.params["lm"], after_p.state.train.params["lm"])
    assert not _leaves_equal(after_p.state.train.params["vit"], params["vit"])
    assert _leaves_equal(full.state.ref_params, after_p.state.train.params)
    # another schedule cannot resume this run's checkpoint
    other = sp.staged_schedule(("perception", "text_reasoning"), {"perception": 2, "text_reasoning": 1})
    with pytest.raises(ValueError, match="different settings"):
        sp.train_staged(workdir=tmp_path / "b", **dict(kw, schedule=other, prompt_fn=sp.make_prompt_fn(other, sources)))


# --- bad input -----------------------------------------------------------------------------------------


def test_bad_input_errors(vlm):
    graphdef, params = vlm
    with pytest.raises(ValueError, match="Stage.name"):
        sp.Stage("", 1)
    with pytest.raises(ValueError, match="Stage.iterations"):
        sp.Stage("perception", 0)
    with pytest.raises(ValueError, match="Schedule.stages"):
        sp.Schedule(())
    with pytest.raises(ValueError, match="unique"):
        sp.Schedule((sp.Stage("a", 1), sp.Stage("a", 2)))
    with pytest.raises(ValueError, match="iterations: expected a count"):
        sp.staged_schedule(sp.PAPER_ORDER, {"perception": 1})
    with pytest.raises(ValueError, match="order"):
        sp.staged_schedule(("perception", "perception"), ITERS)
    sch = sp.staged_schedule(sp.PAPER_ORDER, ITERS)
    for bad in (-1, 6, 1.0):
        with pytest.raises(ValueError, match="iteration"):
            sch.locate(bad)
    with pytest.raises(ValueError, match="staged schedule"):
        sp.merged_schedule(sp.merged_schedule(sch))
    with pytest.raises(ValueError, match="missing"):
        sp.make_prompt_fn(sch, {"perception": lambda k: _fake_batch("perception", k, 3)})
    with pytest.raises(ValueError, match="batch size"):
        sp.make_prompt_fn(sch, {n: (lambda k, n=n, b=b: _fake_batch(n, k, b)) for n, b in zip(sp.STAGES, (2, 3, 3))})
    with pytest.raises(ValueError, match="answer"):
        sp.accuracy_reward("x", "two words")
    with pytest.raises(TypeError, match="pure dict"):
        sp.vision_mask([1.0], train_vision=False)
    good = _prompts("perception")
    for bad in (good._replace(lengths=np.array([1, 5])), good._replace(images=good.images[:, 0]),
                good._replace(problems=good.problems[:1])):
        with pytest.raises(ValueError, match="prompts"):
            sp.sample_vlm_rollout(graphdef, params, bad, jax.random.key(0), config=RL, reward_fn=sp.make_reward_fn(TOK))
    with pytest.raises(ValueError, match="placeholder"):
        sp.sample_vlm_rollout(graphdef, params, good._replace(lengths=np.array([5, 5])), jax.random.key(0),
                              config=RL, reward_fn=sp.make_reward_fn(TOK))
    with pytest.raises(ValueError, match="reward_fn"):
        sp.sample_vlm_rollout(graphdef, params, good, jax.random.key(0), config=RL,
                              reward_fn=lambda p, c, l: np.zeros(3))
    rollout = sp.sample_vlm_rollout(graphdef, params, good, jax.random.key(0), config=RL,
                                    reward_fn=sp.make_reward_fn(TOK))
    opt = SGD
    with pytest.raises(ValueError, match="advantages"):
        sp.vlm_update(grpo.init_state(params, opt), rollout, jnp.zeros((4,)), graphdef=graphdef, optimizer=opt,
                      config=RL, ref_params=params)
    with pytest.raises(ValueError, match="ref_params"):
        sp.vlm_update(grpo.init_state(params, opt), rollout, jnp.zeros((2, 2)), graphdef=graphdef, optimizer=opt,
                      config=RL)
    with pytest.raises(ValueError, match="group_size"):
        sp.train_staged(graphdef=graphdef, params=params, optimizer=opt, config=dataclasses.replace(RL, group_size=1),
                        schedule=sch, prompt_fn=lambda i: good, reward_fn=sp.make_reward_fn(TOK), progress=False)


# --- perception filter, difficulty curriculum, SFT stage ------------------------------------------------


def test_perception_filter_matches_hand_computed_case():
    # two filter models x 6 samples; keep iff BOTH fail from the image AND BOTH solve from the caption
    img = [[0, 0, 1, 0, 0, 0],
           [0, 1, 0, 0, 0, 0]]
    cap = [[1, 1, 1, 1, 0, 1],
           [1, 1, 1, 0, 1, 1]]
    # sample 0: both wrong/img, both right/cap -> keep; 1: model 2 right from image; 2: model 1 right from
    # image; 3: model 2 wrong from caption; 4: model 1 wrong from caption; 5: keep
    np.testing.assert_array_equal(sp.perception_filter(img, cap), [True, False, False, False, False, True])
    # one model ([n] input) and k-sample pass rates with the thresholds
    np.testing.assert_array_equal(sp.perception_filter([0, 0.25, 0.5, 0], [1, 1, 1, 0.75]), [True, False, False, False])
    np.testing.assert_array_equal(sp.perception_filter([0, 0.25, 0.5, 0], [1, 1, 1, 0.75], img_max=0.25,
                                                       caption_min=0.75), [True, True, False, True])
    with pytest.raises(ValueError, match="caption_pass"):
        sp.perception_filter([[0, 1]], [[0, 1, 1]])
    with pytest.raises(ValueError, match="img_pass"):
        sp.perception_filter([0, 2], [1, 1])
    with pytest.raises(ValueError, match="img_max"):
        sp.perception_filter([0], [1], img_max=1.5)


def test_difficulty_order_sorts_easy_to_hard_drops_solved_and_shuffles_ties_by_seed():
    rates = np.array([0.5, 1.0, 0.25, 0.5, 0.0, 0.75, 0.5])
    seen = set()
    for seed in range(40):
        order = sp.difficulty_order(rates, seed=seed)
        # hand-computed: 0.75 (5), the 0.5 tie {0, 3, 6} in some order, 0.25 (2), 0 (4); 1.0 (1) dropped
        assert order[0] == 5 and sorted(order[1:4]) == [0, 3, 6] and order[4:].tolist() == [2, 4]
        assert np.all(np.diff(rates[order]) <= 0)
        np.testing.assert_array_equal(order, sp.difficulty_order(rates, seed=seed))  # deterministic in the seed
        seen.add(tuple(order[1:4]))
    assert len(seen) == 6  # every order of the 3-way tie occurs: ties are shuffled, not kept in index order
    full = sp.difficulty_order(rates, seed=42, drop_solved=False)
    assert full[0] == 1 and sorted(full.tolist()) == list(range(7))
    with pytest.raises(ValueError, match="pass_rates"):
        sp.difficulty_order([0.5, 1.5])


def _pool(name, n):
    return sp.VLMPromptBatch([f"{name}-{r}" for r in range(n)], np.full((n, 5), 4, np.int32),
                             np.full((n,), 3, np.int32), np.arange(n, dtype=np.float32).reshape(n, 1, 1, 1, 1))


def test_curriculum_sources_visit_stages_in_order_easy_to_hard():
    iters = {"perception": 2, "text_reasoning": 1, "visual_reasoning": 2}
    rates = {"perception": [0.0, 1.0, 0.5, 0.25, 0.75, 0.5], "text_reasoning": [0.2, 0.9, 1.0],
             "visual_reasoning": [0.1, 0.6, 0.3, 0.8, 1.0, 0.0]}
    sources = {n: sp.pool_source(_pool(n, len(r)), sp.difficulty_order(r), 2) for n, r in rates.items()}
    sch = sp.staged_schedule(sp.PAPER_ORDER, iters)
    fn = sp.make_prompt_fn(sch, sources)
    got = [p for i in range(sch.total_iterations) for p in fn(i).problems]
    # hand-computed: perception 4 (0.75) then the 0.5 tie {2, 5}, then 3 (0.25); text 1, 0; visual 3, 1, 2, 0
    assert got[0] == "perception-4" and sorted(got[1:3]) == ["perception-2", "perception-5"]
    assert got[3:] == ["perception-3", "text_reasoning-1", "text_reasoning-0", "visual_reasoning-3",
                       "visual_reasoning-1", "visual_reasoning-2", "visual_reasoning-0"]
    # images travel with their rows
    b = fn(0)
    np.testing.assert_array_equal(b.images[:, 0, 0, 0, 0], [int(p.split("-")[1]) for p in b.problems])
    with pytest.raises(ValueError, match="k: expected"):
        sources["text_reasoning"](1)
    with pytest.raises(ValueError, match="rows"):
        sp.pool_source(_pool("x", 3), [0, 3], 1)


def test_sft_stage_equals_vlm_sft_and_curriculum_run_resumes_mid_stage_bit_identically(vlm, tmp_path):
    graphdef, params = vlm
    c2 = dataclasses.replace(C, rl=dataclasses.replace(C.rl, prompts=2))
    pools = {n: task.examples(c2, n, 6, seed=300 + i, tok=TOK) for i, n in enumerate(("perception", "visual_reasoning"))}
    rates = {"perception": [0.5, 0.0, 0.25, 1.0, 0.75, 0.5], "visual_reasoning": [0.1, 0.6, 1.0, 0.8, 0.3, 0.0]}
    rows = {n: sp.difficulty_order(r)[:4] for n, r in rates.items()}
    sources = {n: sp.pool_source(task.prompt_batch(pools[n]), rows[n], 2) for n in pools}
    sch = sp.staged_schedule(("perception", "visual_reasoning"), {"perception": 2, "visual_reasoning": 2},
                             sft_stages=("perception",))
    assert [s.trainer for s in sch.stages] == ["sft", "grpo"]

    def sft_fn(i):
        s, k = sch.locate(i)
        name = sch.stages[s].name
        r = rows[name][2 * k:2 * k + 2]
        return {f: pools[name]["sft"][f][r] for f in ("inputs", "targets", "loss_mask")} | {
            "images": pools[name]["images"][r]}

    opt = ADAMW
    kw = dict(graphdef=graphdef, params=params, optimizer=opt, config=RL, schedule=sch,
              prompt_fn=sp.make_prompt_fn(sch, sources), reward_fn=sp.make_reward_fn(TOK), seed=5, progress=False,
              sft_fn=sft_fn)
    # one SFT-stage iteration = `vlm_sft` on the same batch with the same optimizer (an independent loop)
    one = sp.train_staged(workdir=None, stop_after=1, **kw)
    ref, _ = sp.vlm_sft(graphdef, params, lambda i: sft_fn(0), steps=1, optimizer=opt, progress=False)
    for a, b in zip(jax.tree.leaves(one.state.train.params), jax.tree.leaves(ref)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-6)
    assert not _leaves_equal(one.state.train.params["vit"], params["vit"])
    assert np.isfinite(one.history[0]["sft_loss"]) and np.isnan(one.history[0]["reward_mean"])
    # the full run vs interrupted mid-SFT-stage and mid-GRPO-stage, then resumed
    full = sp.train_staged(workdir=None, **kw)  # the uninterrupted reference: no checkpoints to write
    assert [h["stage"] for h in full.history] == ["perception"] * 2 + ["visual_reasoning"] * 2
    sp.train_staged(workdir=tmp_path / "b", stop_after=1, **kw)
    mid = sp.train_staged(workdir=tmp_path / "b", stop_after=3, **kw)
    assert mid.resumed_from == 1
    resumed = sp.train_staged(workdir=tmp_path / "b", **kw)
    assert resumed.resumed_from == 3
    assert _leaves_equal(resumed.state.train.params, full.state.train.params)
    assert _leaves_equal(resumed.state.ref_params, full.state.ref_params)
    with pytest.raises(ValueError, match="sft_fn"):
        sp.train_staged(**dict(kw, sft_fn=None))
    with pytest.raises(ValueError, match="SFT stage"):
        sp.merged_schedule(sch)
    with pytest.raises(ValueError, match="Stage.trainer"):
        sp.Stage("perception", 1, trainer="dpo")
    with pytest.raises(ValueError, match="sft_stages"):
        sp.staged_schedule(sp.PAPER_ORDER, ITERS, sft_stages=("audio",))


def test_estimate_pass_rates_are_fractions_of_k(vlm):
    graphdef, params = vlm
    prompts = _prompts("perception")
    # k = group_size and RL's sampling settings: the 2 x k rows reuse the rollout tests' compiled sampler
    kw = dict(k=2, tokenizer=TOK, max_new_tokens=RL.max_new_tokens, stop_tokens=(TOK.eos_id,), pad_id=TOK.pad_id)
    r = sp.estimate_pass_rates(graphdef, params, prompts, jax.random.key(0), **kw)
    assert r.shape == (2,) and np.all((r >= 0) & (r <= 1)) and np.allclose(r * 2, np.round(r * 2))
    np.testing.assert_array_equal(r, sp.estimate_pass_rates(graphdef, params, prompts, jax.random.key(0), **kw))
    with pytest.raises(ValueError, match="k: expected"):
        sp.estimate_pass_rates(graphdef, params, prompts, jax.random.key(0), **dict(kw, k=0))
