"""N-MARS: stack rendering, vocabulary extension, augmentation, masked SFT, the <UNDO> reward and p(UNDO)=0 decoding."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from algorithms.decoding import generate
from algorithms.rl import grpo
from algorithms.rl import nmars
from models import Transformer, TransformerConfig
from primitives.sampling import Sampler

U = 9  # <UNDO> id in the hand-made cases


def _render_brute(z, undo_id):
    """Independent reference: rescan the stream, cancelling each UNDO with the latest uncancelled token."""
    z = list(z)
    alive = [True] * len(z)
    for i, tok in enumerate(z):
        if tok == undo_id:
            alive[i] = False
            for j in range(i - 1, -1, -1):
                if alive[j]:
                    alive[j] = False
                    break
    return [t for t, a in zip(z, alive) if a]


# --- rendering ---


def test_render_hand_cases():
    assert nmars.render([], U) == []
    assert nmars.render([U, U], U) == []  # UNDO on empty is a no-op
    assert nmars.render([U, 3, U, U, 4], U) == [4]
    assert nmars.render([1, 2, 3], U) == [1, 2, 3]  # identity without UNDO
    assert nmars.render([1, 2, 7, 8, U, U, 3], U) == [1, 2, 3]
    assert nmars.render([1, 5, 6, U, U, U, U], U, protected=2) == [1, 5]  # the prompt is never erased


def test_render_properties_random():
    rng = np.random.default_rng(0)
    for _ in range(200):
        x = rng.integers(0, 10, rng.integers(0, 12)).tolist()  # may contain UNDOs (id 9)
        a = int(rng.integers(0, 9))
        assert nmars.render(x + [a, U], U) == nmars.render(x, U)
        assert nmars.render(x, U) == _render_brute(x, U)
        clean = [t for t in x if t != U]
        assert nmars.render(clean, U) == clean
        # k deviations + k UNDOs inserted anywhere in a clean reference reproduce it
        k, t = int(rng.integers(1, 4)), int(rng.integers(0, len(clean) + 1))
        dev = rng.integers(0, 9, k).tolist()
        assert nmars.render(clean[:t] + dev + [U] * k + clean[t:], U) == clean


def test_render_numpy_and_jax_agree():
    rng = np.random.default_rng(1)
    b, n = 64, 14
    z = rng.integers(0, 10, (b, n))
    z[rng.random((b, n)) < 0.3] = U
    lengths = rng.integers(0, n + 1, b)
    out, out_len = nmars.render_batch(jnp.asarray(z), jnp.asarray(lengths), undo_id=U, pad_id=-1)
    out, out_len = np.asarray(out), np.asarray(out_len)
    for i in range(b):
        ref = nmars.render(z[i, :lengths[i]], U)
        assert out_len[i] == len(ref)
        assert out[i, :len(ref)].tolist() == ref
        assert (out[i, len(ref):] == -1).all()


def test_render_rejects_bad_arguments():
    with pytest.raises(ValueError, match="tokens"):
        nmars.render(np.zeros((2, 2), int), U)
    with pytest.raises(ValueError, match="protected"):
        nmars.render([1, 2], U, protected=3)
    with pytest.raises(ValueError, match="lengths"):
        nmars.render_batch(jnp.zeros((2, 3), jnp.int32), jnp.zeros((3,), jnp.int32), undo_id=U)


# --- vocabulary extension and p(UNDO)=0 decoding ---

CFG = TransformerConfig(vocab_size=12, d_model=16, num_layers=1, num_heads=2, num_kv_heads=1, d_ff=32)


@pytest.fixture(scope="module")
def tiny():
    graphdef, _ = nnx.split(nnx.eval_shape(lambda: Transformer(CFG, rngs=nnx.Rngs(0))), nnx.Param)
    params = jax.jit(lambda: nnx.to_pure_dict(nnx.split(Transformer(CFG, rngs=nnx.Rngs(0)), nnx.Param)[1]))()
    ext_params, undo_id = nmars.add_undo_token(params)
    ext_graphdef, _ = nnx.split(nnx.eval_shape(lambda: Transformer(nmars.extend_config(CFG), rngs=nnx.Rngs(1))),
                                nnx.Param)
    return graphdef, params, ext_graphdef, ext_params, undo_id


def test_add_undo_token_inits(tiny):
    _, params, _, ext, undo_id = tiny
    emb, unemb = np.asarray(params["embed"]), np.asarray(params["unembed"])
    assert undo_id == CFG.vocab_size and ext["embed"].shape == (13, 16) and ext["unembed"].shape == (16, 13)
    np.testing.assert_array_equal(np.asarray(ext["embed"])[:12], emb)  # old rows untouched
    np.testing.assert_array_equal(np.asarray(ext["unembed"])[:, :12], unemb)
    np.testing.assert_allclose(np.asarray(ext["embed"])[12], emb.mean(0), rtol=1e-5, atol=1e-7)  # fallback: all
    ids = [3, 5, 11]
    sem, _ = nmars.add_undo_token(params, init="semantic", semantic_ids=ids)
    np.testing.assert_allclose(np.asarray(sem["embed"])[12], (emb[3] + emb[5] + emb[11]) / 3, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(np.asarray(sem["unembed"])[:, 12], unemb[:, ids].mean(1), rtol=1e-5, atol=1e-7)
    zero, _ = nmars.add_undo_token(params, init="zero")
    assert not np.asarray(zero["embed"])[12].any() and not np.asarray(zero["unembed"])[:, 12].any()
    rnd, _ = nmars.add_undo_token(params, init="random", key=jax.random.key(0))
    assert np.asarray(rnd["embed"])[12].std() > 0
    tied = {"embed": params["embed"]}
    assert set(nmars.add_undo_token(tied)[0]) == {"embed"}
    with pytest.raises(ValueError, match="init"):
        nmars.add_undo_token(params, init="mean")
    with pytest.raises(ValueError, match="key"):
        nmars.add_undo_token(params, init="random")
    with pytest.raises(ValueError, match="semantic_ids"):
        nmars.add_undo_token(params, semantic_ids=[12])


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_forbidding_undo_gives_the_baseline_decoder(tiny, temperature):
    graphdef, params, ext_graphdef, ext_params, undo_id = tiny
    # Make <UNDO> the most likely token everywhere, so forbidding it matters.
    ext_params = dict(ext_params, unembed=ext_params["unembed"].at[:, undo_id].set(
        ext_params["unembed"][:, :undo_id].max(1) * 50.0))
    prompts = jnp.asarray(np.random.default_rng(0).integers(3, 12, (6, 4)), jnp.int32)
    key = jax.random.key(7)
    kw = dict(max_new_tokens=6, key=key, stop_tokens=(2,))
    base = generate(nnx.merge(graphdef, params), prompts, sampler=Sampler(temperature=temperature), **kw)
    free = generate(nnx.merge(ext_graphdef, ext_params), prompts, sampler=Sampler(temperature=temperature), **kw)
    banned = generate(nnx.merge(ext_graphdef, ext_params), prompts,
                      sampler=nmars.NoUndoSampler(temperature=temperature, undo_id=undo_id), **kw)
    assert (np.asarray(free.tokens) == undo_id).any()  # without the ban the boosted UNDO shows up
    np.testing.assert_array_equal(np.asarray(banned.tokens), np.asarray(base.tokens))
    np.testing.assert_array_equal(np.asarray(banned.lengths), np.asarray(base.lengths))
    np.testing.assert_allclose(np.asarray(banned.logprobs), np.asarray(base.logprobs), rtol=1e-5, atol=1e-5)


def test_no_undo_sampler_checks_the_vocabulary():
    with pytest.raises(ValueError, match="undo_id"):
        nmars.NoUndoSampler()
    with pytest.raises(ValueError, match="last"):
        nmars.NoUndoSampler(undo_id=5)(jnp.zeros((1, 9)), jax.random.key(0))


# --- augmentation and masked SFT ---

DIGITS = list(range(3, 9))


def _refs(seed=0, b=40, p=4, c=6, t=12):
    """Rows [BOS, prompt(p-1), completion(c-1 digits), EOS], right-padded to t."""
    rng = np.random.default_rng(seed)
    tokens = np.zeros((b, t), np.int64)
    pl = rng.integers(2, p + 1, b)
    cl = rng.integers(2, c + 1, b)
    for i in range(b):
        tokens[i, 0] = 1
        tokens[i, 1:pl[i]] = rng.integers(3, 9, pl[i] - 1)
        tokens[i, pl[i]:pl[i] + cl[i] - 1] = rng.integers(3, 9, cl[i] - 1)
        tokens[i, pl[i] + cl[i] - 1] = 2
    return tokens, pl, cl


def _fake_logits(tokens):
    """A 'model' whose greedy top-1 is always token 5, with random other logits."""
    rng = np.random.default_rng(int(np.asarray(tokens).sum()))
    lg = rng.normal(size=tokens.shape + (13,))
    lg[..., 5] += 20.0
    return lg


@pytest.mark.parametrize("mask_deviations", [True, False])
def test_augment_renders_to_reference_and_masks_deviations(mask_deviations):
    tokens, pl, cl = _refs()
    out = nmars.augment_batch(_fake_logits, tokens, pl, cl, undo_id=12, rng=np.random.default_rng(3),
                              allowed_ids=DIGITS, augment_fraction=0.7, mask_deviations=mask_deviations)
    z, mask, dev = out["tokens"], out["loss_mask"], out["deviation_mask"]
    assert z.shape == (40, 12 + 6)
    augmented = out["deviation_start"] >= 0
    assert 0 < augmented.sum() < 40
    for i in range(40):
        p, c, n = pl[i], cl[i], out["lengths"][i]
        assert nmars.render(z[i, p:n], 12) == tokens[i, p:p + c].tolist()
        assert (z[i, :p] == tokens[i, :p]).all()
        k, s = out["num_undo"][i], out["deviation_start"][i]
        assert (z[i] == 12).sum() == k and dev[i].sum() == k
        if augmented[i]:
            assert k in (1, 2, 3) and z[i, s] != tokens[i, s] and set(z[i, s:s + k]) <= set(DIGITS)
            assert (z[i, s + k:s + 2 * k] == 12).all()
        # The expected mask, built independently: 1 on completion targets, 0 on deviation targets if masking.
        want = np.zeros(17)
        want[p - 1:n - 1] = 1.0
        if augmented[i] and mask_deviations:
            want[s - 1:s - 1 + k] = 0.0
        np.testing.assert_array_equal(mask[i], want)
        np.testing.assert_array_equal(out["targets"][i], z[i, 1:])


def test_augment_handles_completions_that_fill_the_row():
    tokens = np.array([[1, 3, 4, 5, 2], [1, 6, 7, 8, 2]])
    for seed in range(20):
        out = nmars.augment_batch(_fake_logits, tokens, np.array([2, 3]), np.array([3, 2]), undo_id=12,
                                  rng=np.random.default_rng(seed), allowed_ids=DIGITS, augment_fraction=1.0,
                                  position_mode="random")
        assert nmars.render(out["tokens"][0, 2:out["lengths"][0]], 12) == [4, 5, 2]
        assert nmars.render(out["tokens"][1, 3:out["lengths"][1]], 12) == [8, 2]


def test_augment_prefers_hard_positions():
    tokens, pl, cl = _refs(seed=1)
    out = nmars.augment_batch(_fake_logits, tokens, pl, cl, undo_id=12, rng=np.random.default_rng(0),
                              allowed_ids=DIGITS, augment_fraction=1.0, position_mode="hard")
    for i in range(40):
        s = out["deviation_start"][i]
        comp = tokens[i, pl[i]:pl[i] + cl[i]]
        if (comp != 5).any():  # a hard position exists: the greedy top-1 (5) disagrees with y*_t
            assert tokens[i, s] != 5
    rnd = nmars.augment_batch(_fake_logits, tokens, pl, cl, undo_id=12, rng=np.random.default_rng(0),
                              allowed_ids=DIGITS, augment_fraction=1.0, position_mode="random")
    assert (tokens[np.arange(40), rnd["deviation_start"]] == 5).any()


def test_augment_rejects_bad_arguments():
    tokens, pl, cl = _refs()
    kw = dict(undo_id=12, rng=np.random.default_rng(0), allowed_ids=DIGITS)
    with pytest.raises(ValueError, match="position_mode"):
        nmars.augment_batch(_fake_logits, tokens, pl, cl, position_mode="easy", **kw)
    with pytest.raises(ValueError, match="augment_fraction"):
        nmars.augment_batch(_fake_logits, tokens, pl, cl, augment_fraction=1.5, **kw)
    with pytest.raises(ValueError, match="deviation_lengths"):
        nmars.augment_batch(_fake_logits, tokens, pl, cl, deviation_lengths=(0,), **kw)
    with pytest.raises(ValueError, match="completion_lengths"):
        nmars.augment_batch(_fake_logits, tokens, pl, cl[:3], **kw)
    with pytest.raises(ValueError, match="seq_len"):
        nmars.augment_batch(_fake_logits, tokens, pl, cl, seq_len=13, **kw)


def test_msft_gradient_is_zero_exactly_at_deviation_targets():
    tokens, pl, cl = _refs(seed=2, b=8)
    out = nmars.augment_batch(_fake_logits, tokens, pl, cl, undo_id=12, rng=np.random.default_rng(1),
                              allowed_ids=DIGITS, augment_fraction=1.0)
    logits = jnp.asarray(np.random.default_rng(0).normal(size=out["targets"].shape + (13,)), jnp.float32)
    grad = jax.jit(jax.grad(nmars.msft_loss))
    g = np.asarray(grad(logits, jnp.asarray(out["targets"]), jnp.asarray(out["loss_mask"])))
    dev = out["deviation_mask"] > 0
    assert dev.sum() > 0
    assert (g[dev] == 0).all()
    assert (np.abs(g[out["loss_mask"] > 0]).sum(-1) > 0).all()
    # Without masking the deviation targets get a gradient.
    g_b = np.asarray(grad(logits, jnp.asarray(out["targets"]),
                                                jnp.asarray(out["loss_mask"] + out["deviation_mask"])))
    assert (np.abs(g_b[dev]).sum(-1) > 0).all()


# --- reward and metrics ---

REF = [4, 5, 6]
EOS = 2


def _r(z, **kw):
    return nmars.undo_reward(nmars.undo_stats(np.asarray(z), len(z), REF, undo_id=U, eos_id=EOS), **kw)


def test_reward_hand_cases():
    kw = dict(alpha=0.1, beta=0.05, max_undos=8)
    assert _r([4, 5, 6, EOS], **kw) == 1.0
    assert _r([4, 5, U, 5, 6, EOS], **kw) < 1.0  # erased a correct token: ineffective
    assert _r([4, 5, U, 5, 6, EOS], **kw) == pytest.approx(0.95)
    assert _r([U, 4, 5, 6, EOS], **kw) == pytest.approx(0.95)  # no-op UNDO: ineffective
    assert _r([4, 7, U, 5, 6, EOS], **kw) == pytest.approx(1.1)  # effective UNDO, correct output
    assert _r([4, 7, U, 5, 7, EOS], **kw) == 0.0  # effective UNDO, failed output: no bonus, no penalty
    assert _r([4, 5, 7, EOS], **kw) == 0.0
    assert _r([4, 7, 8, U, U, 5, 6], **kw) == pytest.approx(1.2)  # no EOS (budget end): still rendered
    assert _r([4, 7, U, 5, 6, EOS], alpha=0.1, beta=0.05, max_undos=0) == pytest.approx(0.95)  # over the cap
    assert _r([4, 7, U, 5, 7, EOS], alpha=0.1, beta=0.05, mode="outcome") == pytest.approx(-0.05)
    assert _r([4, 7, U, 5, 6, EOS], alpha=0.1, beta=0.05, mode="outcome") == pytest.approx(1.1)
    assert _r([4, 5, 6, EOS, U, U], **kw) == 1.0  # nothing after EOS counts
    with pytest.raises(ValueError, match="mode"):
        _r([4], mode="x")
    with pytest.raises(ValueError, match="alpha"):
        nmars.make_reward_fn(lambda p: REF, undo_id=U, eos_id=EOS, alpha=-1.0)


def test_ineffective_undo_strictly_lowers_any_correct_rollout():
    rng = np.random.default_rng(0)
    for _ in range(50):
        ref = rng.integers(3, 9, rng.integers(1, 6)).tolist()
        j = int(rng.integers(0, len(ref)))
        z = ref + [EOS]
        z_bad = ref[:j + 1] + [U] + ref[j:] + [EOS]  # erase a correct token, rewrite it
        s, s_bad = (nmars.undo_stats(np.asarray(x), len(x), ref, undo_id=U, eos_id=EOS) for x in (z, z_bad))
        assert s_bad.correct and s_bad.erased_right == 1
        assert nmars.undo_reward(s) == 1.0 > nmars.undo_reward(s_bad)


def test_reward_fn_batches_and_plugs_into_grpo_rollout():
    fn = nmars.make_reward_fn(lambda p: p, undo_id=U, eos_id=EOS, alpha=0.1, beta=0.05)
    comps = np.array([[4, 5, 6, EOS, 0, 0], [4, 7, U, 5, 6, EOS], [4, 5, U, 5, 6, EOS]])
    r = fn([REF] * 3, comps, np.array([4, 6, 6]))
    np.testing.assert_allclose(r, [1.0, 1.1, 0.95], rtol=1e-6)
    assert r.dtype == np.float32


def test_reward_fn_in_a_grpo_step(tiny):
    _, _, ext_graphdef, ext_params, undo_id = tiny
    import optax

    prompts = grpo.PromptBatch([[4, 5]] * 2, np.array([[1, 4, 5], [1, 6, 7]], np.int32), np.array([3, 3], np.int32))
    cfg = grpo.GRPOConfig(group_size=4, max_new_tokens=5, stop_tokens=(2,))
    fn = nmars.make_reward_fn(lambda p: p, undo_id=undo_id, eos_id=2)
    opt = optax.adam(1e-3)
    state, metrics, rollout = grpo.rl_step(grpo.init_state(ext_params, opt), prompts, jax.random.key(0),
                                           graphdef=ext_graphdef, optimizer=opt, config=cfg, reward_fn=fn)
    want = fn([[4, 5]] * 8, np.asarray(rollout.completions), np.asarray(rollout.mask).sum(1).astype(int))
    np.testing.assert_allclose(np.asarray(rollout.rewards).reshape(-1), want)
    assert np.isfinite(metrics["loss"])


def test_undo_metrics_hand_case():
    comps = np.array([[4, 5, 6, EOS, 0, 0, 0],    # clean, correct
                      [4, 7, U, 5, 6, EOS, 0],    # 1 UNDO erasing a wrong token, correct
                      [4, 5, U, 5, 7, EOS, 0],    # 1 UNDO erasing a right token, wrong
                      [4, 5, 6, 0, 0, 0, 0]])     # no EOS
    m = nmars.undo_metrics(comps, np.array([4, 6, 6, 3]), [REF] * 4, undo_id=U, eos_id=EOS)
    assert m["exact_match"] == 0.75
    assert m["num_undo"] == 2 and m["precision"] == 0.5
    assert m["undo_rate"] == pytest.approx(2 / 19) and m["undo_seq_frac"] == 0.5
    assert m["overhead"] == pytest.approx(19 / 15)
    none = nmars.undo_metrics(comps[:1], np.array([4]), [REF], undo_id=None, eos_id=EOS)
    assert none["overhead"] == 1.0 and np.isnan(none["precision"])



# --- the paper's diff-alignment augmentation (Section 3.1, Eq. 3-5) ---


def _backspace(z, undo_id):
    """Independent reference: apply each UNDO as a backspace; returns (output, positions it erased)."""
    stack, erased = [], set()
    for i, tok in enumerate(z):
        if tok == undo_id:
            if stack:
                erased.add(stack.pop()[0])
        else:
            stack.append((i, tok))
    return [t for _, t in stack], erased


def _is_subsequence(small, big):
    it = iter(big)
    return all(any(x == y for y in it) for x in small)


def test_diff_augment_hand_cases():
    f = lambda s, y, **kw: nmars.diff_augment(s, y, undo_id=U, **kw)
    assert f([1, 2, 3], [1, 2, 3]).tokens == [1, 2, 3]  # a correct sample is the reference, no UNDO
    assert f([1, 2, 3], [1, 2, 3]).loss_mask == [1, 1, 1]
    t = f([1, 7, 3, 4], [1, 2, 3, 4])  # substitution: error, UNDO, correction, then the sample again
    assert (t.tokens, t.loss_mask, t.error_positions, t.undo_positions) == (
        [1, 7, U, 2, 3, 4], [1, 0, 1, 1, 1, 1], [1], [2])
    t = f([1, 7, 8, 4, 6, 0], [1, 2, 4, 5, 0])  # two regions, both repaired (Eq. 5)
    assert t.tokens == [1, 7, 8, U, U, 2, 4, 6, U, 5, 0]
    assert t.kinds == [nmars.MATCHED, nmars.ERROR, nmars.ERROR, nmars.UNDO, nmars.UNDO, nmars.CORRECTION,
                       nmars.MATCHED, nmars.ERROR, nmars.UNDO, nmars.CORRECTION, nmars.MATCHED]
    t = f([1, 7, 8, 4, 6, 0], [1, 2, 4, 5, 0], spans="first")  # one repair, then the reference
    assert t.tokens == [1, 7, 8, U, U, 2, 4, 5, 0] and t.loss_mask == [1, 0, 0, 1, 1, 1, 1, 1, 1]
    assert f([1, 3, 4], [1, 2, 3, 4]).tokens == [1, 2, 3, 4]  # a skipped token: correction, no UNDO (k = 0)
    assert f([1, 2, 3, 3, 4], [1, 2, 3, 4]).tokens == [1, 2, 3, 3, U, 4]  # an extra token: erased, no correction
    assert f([1, 2], [1, 2, 3]).tokens == [1, 2, 3]  # stopped early
    assert f([1, 2, 3, 5, 5], [1, 2, 3]).tokens == [1, 2, 3, 5, 5, U, U]  # ran on
    assert f([], [4, 5]).tokens == [4, 5] and f([4, 5], []).tokens == [4, 5, U, U]
    # "prefix" alignment: everything after the first mismatch is one error span
    t = f([1, 7, 3, 4], [1, 2, 3, 4], alignment="prefix")
    assert t.tokens == [1, 7, 3, 4, U, U, U, 2, 3, 4] and t.loss_mask == [1, 0, 0, 0, 1, 1, 1, 1, 1, 1]
    assert f([1, 3, 4], [1, 2, 3, 4], alignment="prefix").tokens == [1, 3, 4, U, U, 2, 3, 4]


def test_diff_augment_against_backspace_brute_force():
    rng = np.random.default_rng(0)
    for trial in range(400):
        y = rng.integers(0, 6, rng.integers(0, 9)).tolist()
        s = list(y)
        for _ in range(int(rng.integers(0, 4))):  # random edits: substitute, delete, insert
            op, j = int(rng.integers(3)), int(rng.integers(len(s) + 1))
            if op == 0 and j < len(s):
                s[j] = int(rng.integers(0, 6))
            elif op == 1 and j < len(s):
                del s[j]
            else:
                s.insert(j, int(rng.integers(0, 6)))
        for spans in nmars.SPANS:
            for alignment in nmars.ALIGNMENTS:
                t = nmars.diff_augment(s, y, undo_id=U, spans=spans, alignment=alignment)
                out, erased = _backspace(t.tokens, U)
                assert out == y, (s, y, spans, alignment)  # UNDOs as backspaces always give the reference
                zero = {i for i, m in enumerate(t.loss_mask) if m == 0}
                assert erased == zero == set(t.error_positions)  # the mask drops exactly the erased tokens
                assert len(t.undo_positions) == len(t.error_positions) == t.tokens.count(U)
                assert len(t.tokens) == len(t.loss_mask) == len(t.kinds)
                from_sample = [tok for tok, k in zip(t.tokens, t.kinds) if k in (nmars.MATCHED, nmars.ERROR)]
                if spans == "all":
                    assert from_sample == s  # Eq. 5 walks the whole sample
                else:
                    assert s[:len(from_sample)] == from_sample  # a prefix of the sample
                    first_undo = t.undo_positions[0] if t.undo_positions else len(t.tokens)
                    assert all(k == nmars.CORRECTION for k in t.kinds[first_undo:] if k != nmars.UNDO)
                kept = [tok for tok, k in zip(t.tokens, t.kinds) if k == nmars.MATCHED]
                assert _is_subsequence(kept, s) and _is_subsequence(kept, y)
                if alignment == "prefix":
                    lcp = next((i for i, (a, b) in enumerate(zip(s, y)) if a != b), min(len(s), len(y)))
                    assert len(t.error_positions) == len(s) - lcp
                if s == y:
                    assert t.tokens == y and not t.undo_positions


def test_diff_augment_rejects_bad_arguments():
    with pytest.raises(ValueError, match="spans"):
        nmars.diff_augment([1], [1], undo_id=U, spans="some")
    with pytest.raises(ValueError, match="alignment"):
        nmars.diff_augment([1], [1], undo_id=U, alignment="lcs")
    with pytest.raises(ValueError, match="sample"):
        nmars.diff_augment([1, U], [1], undo_id=U)
    with pytest.raises(ValueError, match="reference"):
        nmars.diff_augment([1], [U], undo_id=U)


@pytest.mark.parametrize("mask_errors", [True, False])
def test_diff_augment_batch_renders_and_masks(mask_errors):
    tokens, pl, cl = _refs(seed=4)
    b, eos = tokens.shape[0], 2
    rng = np.random.default_rng(5)
    samples = np.zeros((b, 9), np.int64)
    slen = np.zeros(b, np.int64)
    for i in range(b):
        ref = tokens[i, pl[i]:pl[i] + cl[i] - 1].tolist()
        smp = [t if rng.random() < 0.7 else int(rng.integers(3, 9)) for t in ref]
        smp = smp + rng.integers(3, 9, int(rng.integers(0, 3))).tolist()
        smp = (smp + [eos] + [7, 7])[:9] if rng.random() < 0.8 else smp[:9]  # tokens after EOS are ignored
        samples[i, :len(smp)] = smp
        slen[i] = len(smp)
    augment = rng.random(b) < 0.8
    out = nmars.diff_augment_batch(tokens, pl, cl, samples, slen, undo_id=12, eos_id=eos, augment=augment,
                                   mask_errors=mask_errors, pad_id=0)
    z = out["tokens"]
    assert (out["num_undo"][~augment] == 0).all() and (out["num_undo"] > 0).sum() > 3
    for i in range(b):
        p, n = pl[i], out["lengths"][i]
        ref = tokens[i, p:p + cl[i] - 1].tolist()
        assert (z[i, :p] == tokens[i, :p]).all() and z[i, n - 1] == eos and (z[i, n:] == 0).all()
        rendered, erased = _backspace(z[i, p:n - 1].tolist(), 12)
        assert rendered == ref
        smp = samples[i, :slen[i]].tolist()
        smp = smp[:smp.index(eos)] if eos in smp else smp
        if augment[i]:
            assert z[i, p:n - 1].tolist() == nmars.diff_augment(smp, ref, undo_id=12).tokens  # cut at EOS
        else:
            assert z[i, p:n - 1].tolist() == ref
        # independent expected mask: completion targets (EOS included) weigh 1, erased tokens 0 if masking
        want = np.zeros(z.shape[1] - 1)
        want[p - 1:n - 1] = 1.0
        dev = np.zeros_like(want)
        for j in erased:
            dev[p + j - 1] = 1.0
            if mask_errors:
                want[p + j - 1] = 0.0
        np.testing.assert_array_equal(out["loss_mask"][i], want)
        np.testing.assert_array_equal(out["deviation_mask"][i], dev)
        assert out["num_undo"][i] == len(erased)
        assert out["deviation_start"][i] == (p + min(erased) if erased else -1)
        np.testing.assert_array_equal(out["targets"][i], z[i, 1:])
    with pytest.raises(ValueError, match="seq_len"):
        nmars.diff_augment_batch(tokens, pl, cl, samples, slen, undo_id=12, eos_id=eos, seq_len=5)
    bad = samples.copy()
    bad[0, 0] = 12
    with pytest.raises(ValueError, match="sample"):
        nmars.diff_augment_batch(tokens, pl, cl, bad, np.maximum(slen, 1), undo_id=12, eos_id=eos)
    with pytest.raises(ValueError, match="sample_lengths"):
        nmars.diff_augment_batch(tokens, pl, cl, samples, slen + 20, undo_id=12, eos_id=eos)
