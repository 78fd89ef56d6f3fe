"""ROSA2: the KL-regularised optimum, CG, the ROSA step (against brute-force enumeration), the feedback
normaliser, and the multi-turn driver (adapter-only updates, no update on success, checkpoint resume)."""

from __future__ import annotations

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from algorithms.alignment import rosa2
from experiments.tasks.multiturn_users import MultiTurnUsers
from models import Transformer, TransformerConfig

V = 5
CFG = TransformerConfig(vocab_size=V, d_model=8, num_layers=1, num_heads=2, num_kv_heads=1, d_ff=16)
PROMPT = np.array([1, 3], np.int32)
MASK = np.array([0, 0, 1, 1], np.float32)


def _model_params(seed=0, cfg=CFG):
    graphdef, params = nnx.split(Transformer(cfg, rngs=nnx.Rngs(seed)))
    return graphdef, params


def _tiny():
    graphdef, params = _model_params()
    adapter = 0.1 * jax.random.normal(jax.random.key(1), (CFG.num_layers, CFG.d_model))
    return rosa2.transformer_logits_fn(graphdef), {"model": params, "adapter": adapter}


def _all_answers():
    ys = np.array(list(itertools.product(range(V), repeat=2)), np.int32)
    return np.concatenate([np.broadcast_to(PROMPT, (len(ys), 2)), ys], axis=1)  # [25, 4]


def _logp_all(logits_fn, params):
    return _logp_all_jit(logits_fn, params, jnp.asarray(_all_answers()))


@functools.partial(jax.jit, static_argnums=0)
def _logp_all_jit(logits_fn, params, seqs):
    return jax.vmap(lambda s: rosa2.answer_logprob(logits_fn(params, s), s, jnp.asarray(MASK)))(seqs)


def test_kl_regularized_optimum_is_the_closed_form_and_the_maximiser():
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.ones(6))
    r = rng.normal(size=6)
    beta = 0.7
    q = np.asarray(rosa2.kl_regularized_optimum(p, r, beta))
    ref = p * np.exp(r / beta)
    np.testing.assert_allclose(q, ref / ref.sum(), rtol=1e-5)
    best = float(rosa2.kl_objective(q, p, r, beta))
    for _ in range(20):
        other = rng.dirichlet(np.ones(6))
        assert float(rosa2.kl_objective(other, p, r, beta)) <= best + 1e-6
    # Closed-form value of the maximum: beta log E_p[exp(r / beta)].
    np.testing.assert_allclose(best, beta * np.log(np.sum(p * np.exp(r / beta))), rtol=1e-5)
    with pytest.raises(ValueError, match="beta"):
        rosa2.kl_regularized_optimum(p, r, 0.0)


def test_conjugate_gradient_solves_an_spd_system():
    rng = np.random.default_rng(1)
    n = 12
    m = rng.normal(size=(n, n))
    a = m @ m.T / n + 0.5 * np.eye(n)
    b = rng.normal(size=n)
    ref = np.linalg.solve(a, b)
    aj = jnp.asarray(a, jnp.float32)
    out = rosa2.conjugate_gradient(lambda v: aj @ v, jnp.asarray(b, jnp.float32), max_iters=3 * n, tol=1e-7)
    np.testing.assert_allclose(np.asarray(out.x), ref, rtol=1e-4, atol=1e-4)
    assert int(out.iterations) <= 3 * n
    # On a pytree right-hand side (two blocks of one system), and b = 0 gives x = 0 at once.
    split = lambda v: {"u": v[:5], "w": v[5:]}  # noqa: E731
    join = lambda t: jnp.concatenate([t["u"], t["w"]])  # noqa: E731
    out2 = rosa2.conjugate_gradient(lambda t: split(aj @ join(t)), split(jnp.asarray(b, jnp.float32)),
                                    max_iters=3 * n, tol=1e-7)
    np.testing.assert_allclose(np.asarray(join(out2.x)), ref, rtol=1e-4, atol=1e-4)
    zero = rosa2.conjugate_gradient(lambda v: aj @ v, jnp.zeros(n), max_iters=5)
    assert int(zero.iterations) == 0 and not np.asarray(zero.x).any()
    with pytest.raises(ValueError, match="max_iters"):
        rosa2.conjugate_gradient(lambda v: v, jnp.ones(2), max_iters=0)


def test_sequence_probabilities_sum_to_one_over_all_answers():
    logits_fn, params = _tiny()
    np.testing.assert_allclose(float(jnp.exp(_logp_all(logits_fn, params)).sum()), 1.0, rtol=1e-5)


@pytest.mark.parametrize("reward", [-1.0, 0.7])
def test_reweighted_gradient_matches_brute_force_enumeration(reward):
    """c * grad log pi(y_k) = grad_theta sum_y pi*(y) log pi_theta(y) with pi* = pi_k e^{r 1[y = y_k] / beta} / Z."""
    logits_fn, params = _tiny()
    beta, k = 0.5, 7
    logp = _logp_all(logits_fn, params)
    target = jax.lax.stop_gradient(rosa2.kl_regularized_optimum(jnp.exp(logp), reward * (jnp.arange(V * V) == k),
                                                                beta))

    def objective(adapter):
        return jnp.sum(target * _logp_all(logits_fn, dict(params, adapter=adapter)))

    brute = jax.jit(jax.grad(objective))(params["adapter"])
    seq = jnp.asarray(_all_answers()[k])
    lp, g = jax.jit(jax.value_and_grad(lambda a: rosa2.answer_logprob(logits_fn(dict(params, adapter=a), seq), seq,
                                                                      jnp.asarray(MASK))))(params["adapter"])
    ours = rosa2.reweight_coefficient(lp, reward, beta) * g
    np.testing.assert_allclose(np.asarray(ours), np.asarray(brute), rtol=2e-3, atol=1e-6)


def test_fisher_vector_product_matches_the_explicit_matrix():
    logits_fn, params = _tiny()
    seq = jnp.asarray(_all_answers()[3])
    mask = jnp.asarray(MASK)
    logits_of = lambda a: logits_fn(dict(params, adapter=a), seq)  # noqa: E731
    a0 = params["adapter"]
    J = jax.jit(jax.jacobian(logits_of))(a0).reshape(4, V, -1)  # [t, v, P]
    p = jax.nn.softmax(logits_of(a0), -1)
    F = sum(MASK[j + 1] * J[j].T @ (jnp.diag(p[j]) - jnp.outer(p[j], p[j])) @ J[j] for j in range(3))
    v = jax.random.normal(jax.random.key(2), a0.shape)
    fv = jax.jit(lambda a, w: rosa2.fisher_vector_product(logits_of, a, mask, w))(a0, v)
    np.testing.assert_allclose(np.asarray(fv).ravel(), np.asarray(F @ v.ravel()), rtol=1e-4, atol=1e-6)


def test_rosa_step_moves_only_the_adapter_and_improves_the_reweighted_objective():
    logits_fn, params = _tiny()
    beta, k = 0.5, 11
    seq = jnp.asarray(_all_answers()[k])
    cfg = rosa2.ROSAConfig(beta=beta, step_size=0.1, cg_iters=20)
    new, info = jax.jit(lambda p: rosa2.rosa_step(logits_fn, p, seq, jnp.asarray(MASK), jnp.float32(-1.0),
                                                  is_adapter=rosa2.is_residual_adapter, config=cfg))(params)
    # Every non-adapter leaf bit-identical; the adapter moved.
    for a, b in zip(jax.tree.leaves(params["model"]), jax.tree.leaves(new["model"])):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert not np.array_equal(np.asarray(new["adapter"]), np.asarray(params["adapter"]))
    assert float(info["coef"]) < 0 and float(info["step_norm"]) > 0
    # The step increases E_{pi*}[log pi_theta] (pi* fixed at the old policy) and lowers pi(y_k) (r = -1).
    logp_old = _logp_all(logits_fn, params)
    target = rosa2.kl_regularized_optimum(jnp.exp(logp_old), -1.0 * (jnp.arange(V * V) == k), beta)
    logp_new = _logp_all(logits_fn, new)
    assert float(jnp.sum(target * logp_new)) > float(jnp.sum(target * logp_old))
    assert float(logp_new[k]) < float(logp_old[k])
    # Another adapter subset (the final norm's scale, a last-layer adapter): only that leaf moves.
    sub = "model/final_norm/scale/value"
    new2, _ = rosa2.rosa_step(logits_fn, params, seq, jnp.asarray(MASK), jnp.float32(-1.0),
                              is_adapter=lambda path: path == sub, config=cfg)
    flat_old = jax.tree_util.tree_flatten_with_path(params)[0]
    flat_new = jax.tree_util.tree_flatten_with_path(new2)[0]
    for (path, a), (_, b) in zip(flat_old, flat_new):
        same = np.array_equal(np.asarray(a), np.asarray(b))
        assert same != (rosa2._key_str(path) == sub), rosa2._key_str(path)
    with pytest.raises(ValueError, match="selects no leaf"):
        rosa2.rosa_step(logits_fn, params, seq, jnp.asarray(MASK), jnp.float32(-1.0), is_adapter=lambda p: False)


def test_zero_reward_gives_a_zero_update():
    logits_fn, params = _tiny()
    seq = jnp.asarray(_all_answers()[4])
    new, info = rosa2.rosa_step(logits_fn, params, seq, jnp.asarray(MASK), jnp.float32(0.0),
                                is_adapter=rosa2.is_residual_adapter)
    np.testing.assert_array_equal(np.asarray(new["adapter"]), np.asarray(params["adapter"]))
    assert float(info["step_norm"]) == 0.0 and float(info["coef"]) == 0.0


def test_max_kl_caps_the_quadratic_kl_of_the_step():
    logits_fn, params = _tiny()
    seq = jnp.asarray(_all_answers()[9])
    _, info = rosa2.rosa_step(logits_fn, params, seq, jnp.asarray(MASK), jnp.float32(-1.0),
                              is_adapter=rosa2.is_residual_adapter,
                              config=rosa2.ROSAConfig(step_size=100.0, max_kl=1e-3))
    assert float(info["kl_model"]) <= 1e-3 * (1 + 1e-4)


def test_normalize_feedback_is_bayes_rule():
    K = 3
    belief = jnp.array([[0.5, 0.3, 0.2]] * 4)
    cands = jnp.array([[[5, 6], [6, 5], [5, 5]]] * 4)
    answers = jnp.array([[5, 6], [6, 6], [6, 6], [7, 7]])
    prev = jnp.zeros((4, K), jnp.int32)
    kind = jnp.array([rosa2.WRONG, rosa2.CLOSER, rosa2.HINT, rosa2.CORRECT])
    hint = jnp.array([-1, -1, 2, -1])
    eps_c, eps_h = 0.1, 0.2
    post, instr, match = rosa2.normalize_feedback(belief, cands, answers, prev, kind, hint, closer_noise=eps_c,
                                                  hint_noise=eps_h)
    b = np.array([0.5, 0.3, 0.2])
    # Row 0: the answer is intent 0's output and was wrong -> intent 0 ruled out; "wrong" while the
    # answer matched intents 1, 2 at 0 / 1 positions (previous 0): 1 did not move closer, 2 did.
    r0 = b * np.array([0.0, 1 - eps_c, eps_c])
    # Row 1: answer [6, 6] matches intent 0 at 1, intent 1 at 1, intent 2 at 0; "closer".
    r1 = b * np.array([1 - eps_c, 1 - eps_c, eps_c])
    # Row 2: hint names intent 2; no candidate equals [6, 6].
    r2 = b * np.array([eps_h / 2, eps_h / 2, 1 - eps_h])
    for row, ref in enumerate((r0, r1, r2, b)):
        np.testing.assert_allclose(np.asarray(post[row]), ref / ref.sum(), rtol=1e-6)
        assert int(instr[row]) == int(np.argmax(ref))
    np.testing.assert_array_equal(np.asarray(match[1]), [1, 1, 0])
    with pytest.raises(ValueError, match="candidates"):
        rosa2.normalize_feedback(belief, cands[:, :2], answers, prev, kind, hint, closer_noise=0.1, hint_noise=0.1)


# --- the driver ---------------------------------------------------------------------------------------

USERS = MultiTurnUsers(num_symbols=4, length=3, seed=1)
DCFG = TransformerConfig(vocab_size=USERS.vocab_size, d_model=8, num_layers=2, num_heads=2, num_kv_heads=1, d_ff=16)
N = 6


def _driver_setup():
    graphdef, params = _model_params(3, DCFG)
    x, intent = USERS.sample(N, np.random.default_rng(0))
    first = USERS.first_instructions(intent, np.random.default_rng(1))
    return dict(graphdef=graphdef, model_params=params, prompt_fn=lambda i: USERS.prompts(i, x),
                user_fn=USERS.user_fn(x, intent), candidates=USERS.outputs(x),
                prior=np.full((N, USERS.num_intents), 0.25, np.float32), initial_instruction=first,
                config=rosa2.ROSAConfig(cg_iters=4), progress=False), intent


def test_resume_gives_the_same_adapters_as_an_uninterrupted_run(tmp_path):
    kw, _ = _driver_setup()
    full = rosa2.co_adapt(num_turns=2, arm="rosa2", workdir=None, **kw)
    part = rosa2.co_adapt(num_turns=2, arm="rosa2", workdir=tmp_path / "b", fingerprint="f", stop_after=1, **kw)
    assert int(part.turn) == 1
    resumed = rosa2.co_adapt(num_turns=2, arm="rosa2", workdir=tmp_path / "b", fingerprint="f", **kw)
    assert int(resumed.turn) == 2
    assert np.abs(np.asarray(full.adapter)).sum() > 0
    for a, b in zip(full, resumed):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError, match="fingerprint"):
        rosa2.co_adapt(num_turns=2, arm="rosa2", workdir=tmp_path / "b", fingerprint="other", **kw)


def test_no_weight_update_on_success_and_static_changes_nothing():
    kw, _ = _driver_setup()

    def user_fn(turn, answers, prev_match):  # rows 0-2 are told "correct" at turn 0, the rest "wrong"
        kind = np.where(np.arange(N) < 3, rosa2.CORRECT, rosa2.WRONG).astype(np.int32)
        return kind, np.full(N, -1, np.int32), np.zeros(N, np.int32)

    kw = dict(kw, user_fn=user_fn)
    st = rosa2.co_adapt(num_turns=2, arm="weights", **kw)
    ad = np.asarray(st.adapter)
    assert not ad[:3].any() and all(ad[i].any() for i in range(3, N))
    np.testing.assert_array_equal(np.asarray(st.solved_at), [1, 1, 1, 0, 0, 0])
    static = rosa2.co_adapt(num_turns=2, arm="static", **kw)
    assert not np.asarray(static.adapter).any()
    np.testing.assert_array_equal(np.asarray(static.instruction), kw["initial_instruction"])
    with pytest.raises(ValueError, match="arm"):
        rosa2.co_adapt(num_turns=2, arm="both", **kw)
    with pytest.raises(ValueError, match="prior"):
        rosa2.co_adapt(num_turns=2, arm="words", **dict(kw, prior=np.ones((N, 2))))


def test_greedy_answers_are_the_argmax_continuations():
    graphdef, params = _model_params(3, DCFG)
    x, _ = USERS.sample(3, np.random.default_rng(4))
    prompts = USERS.prompts(np.array([-1, 0, 2]), x)
    adapters = 0.3 * jax.random.normal(jax.random.key(0), (3, DCFG.num_layers, DCFG.d_model))
    out = np.asarray(rosa2.greedy_answers(graphdef, params, adapters, prompts, 3))
    logits_fn = jax.jit(rosa2.transformer_logits_fn(graphdef))
    for i in range(3):
        toks = list(prompts[i])
        for _ in range(3):
            logits = logits_fn({"model": params, "adapter": adapters[i]}, jnp.asarray(toks))[-1]
            toks.append(int(jnp.argmax(logits)))
        np.testing.assert_array_equal(out[i], toks[-3:])
