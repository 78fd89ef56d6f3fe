"""Tests of test-time rerouting (algorithms.moe.rerouting) against independent recomputations."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from algorithms.moe import rerouting as rr
from models.transformer import MoEConfig, Transformer, TransformerConfig

L, E, V = 3, 4, 16


def _model(k=2, **moe):
    moe = MoEConfig(num_experts=E, experts_per_token=k, implementation="xla_tiled", **moe)
    cfg = TransformerConfig(vocab_size=V, d_model=16, num_layers=L, num_heads=2, num_kv_heads=1, d_ff=16,
                            ffn_type="moe", moe=moe)
    return Transformer(cfg, rngs=nnx.Rngs(0))


@pytest.fixture(scope="module")
def model():
    return _model()


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    toks = rng.integers(3, V, (3, 12)).astype(np.int32)
    lens = np.array([12, 8, 5], np.int32)
    return toks, lens


CFG = rr.RerouteConfig(steps=5, learning_rate=0.1, interval=3, rho=0.5)


@pytest.fixture(scope="module")
def generation(model, data):
    toks, lens = data
    before = jax.tree.map(np.array, nnx.state(model))
    res = rr.rerouted_generate(model, toks, lens, max_new_tokens=7, config=CFG)
    return res, before


@pytest.fixture(scope="module")
def forward(model):
    """A jitted `(tokens, delta) -> logits` of the frozen model, shared by the tests (eager MoE calls are slow)."""
    graphdef, state = nnx.split(model)
    f = jax.jit(lambda st, t, d: nnx.merge(graphdef, st)(t, router_biases=d).logits)
    return lambda t, d=None: f(state, jnp.asarray(t, jnp.int32),
                               jnp.zeros((L, np.shape(t)[0], E)) if d is None else jnp.asarray(d))


@pytest.fixture(scope="module")
def loss_grad(model, data):
    """One jitted gradient of the shared model's summed context loss, used by several tests (one compilation)."""
    toks, lens = data
    return jax.jit(jax.grad(_jit_loss(model, toks, lens)))


def _jit_loss(model, toks, lens):
    w = rr._normalize(rr._context_weights(toks.shape, lens), np.arange(3), 3)
    graphdef, state = nnx.split(model)
    return jax.jit(lambda d: jnp.sum(rr._group_loss(nnx.merge(graphdef, state), jnp.asarray(toks), w,
                                                    jnp.arange(3), d)))


def _ce_numpy(logits, tokens):
    """[b, T-1] next-token NLL from logits [b, T-1, v] in float64."""
    lg = np.asarray(logits, np.float64)
    lse = np.log(np.exp(lg - lg.max(-1, keepdims=True)).sum(-1)) + lg.max(-1)
    return lse - np.take_along_axis(lg, np.asarray(tokens)[:, 1:, None], -1)[..., 0]


def test_zero_bias_is_bitwise_identity(model, data, forward):
    toks, lens = data
    graphdef, state = nnx.split(model)
    ctx = toks[:, :-1]  # the shape the loss tests run `forward` at: that compiled program is reused
    base = jax.jit(lambda st, t: nnx.merge(graphdef, st)(t).logits)(state, jnp.asarray(ctx))
    zero = forward(ctx, jnp.zeros((L, 3, E)))
    assert np.array_equal(np.asarray(base), np.asarray(zero))
    d, info = rr.fit_router_bias(model, toks, rr._context_weights(toks.shape, lens),
                                 config=rr.RerouteConfig(steps=0))
    assert np.array_equal(np.asarray(d), np.zeros((L, 3, E)))
    np.testing.assert_array_equal(info.loss_before, info.loss_after)


def test_context_loss_matches_numpy(model, data, forward):
    toks, lens = data
    lg = forward(toks[:, :-1])
    ce = _ce_numpy(lg, toks)
    want = [ce[i, :lens[i] - 1].mean() for i in range(3)]
    np.testing.assert_allclose(rr.context_loss(model, toks, lens), want, rtol=1e-5)


def test_base_parameters_unchanged_and_only_selected_layers_move(model, generation):
    res, before = generation
    after = jax.tree.map(np.array, nnx.state(model))
    assert rr._tree_equal(before, after)
    n = rr.num_selected_layers(L, CFG.rho)
    first = res.rounds[0]
    assert (first.info.layer_mask.sum(0) == n).all()
    moved = np.abs(first.delta).sum(-1) > 0  # [L, b]
    np.testing.assert_array_equal(moved, first.info.layer_mask)  # unselected rows stay exactly zero


@pytest.mark.parametrize("renormalize", [True, False])
def test_bias_gradient_sums_to_zero_over_experts(model, data, loss_grad, renormalize):
    assert model.config.moe.router_renormalize  # the shared model is the renormalized case
    toks, lens = data
    delta = 0.3 * jax.random.normal(jax.random.key(1), (L, 3, E))
    grad = loss_grad if renormalize else jax.jit(jax.grad(_jit_loss(_model(router_renormalize=False), toks, lens)))
    g = np.asarray(grad(delta))
    assert np.abs(g).max() > 1e-4  # not vacuous
    np.testing.assert_allclose(g.sum(-1), 0.0, atol=1e-6)


def test_dense_gating_gradient_matches_finite_differences(data):
    model = _model(k=E)  # top-k = E: the bias is a smooth per-layer expert prior
    toks, lens = data
    loss = _jit_loss(model, toks, lens)
    d0 = 0.5 * jax.random.normal(jax.random.key(2), (L, 3, E))
    g = jax.jit(jax.grad(loss))(d0)
    for i in range(3):
        u = jax.random.normal(jax.random.key(10 + i), d0.shape)
        eps = 1e-2
        fd = (float(loss(d0 + eps * u)) - float(loss(d0 - eps * u))) / (2 * eps)
        np.testing.assert_allclose(fd, float(jnp.sum(g * u)), rtol=2e-2, atol=1e-4)


@pytest.mark.parametrize("num_layers,rho", [(4, 0.5), (4, 0.25), (10, 0.3), (7, 0.5), (5, 1.0), (3, 0.01)])
def test_select_layers_exact_count_and_top_scores(num_layers, rho):
    rng = np.random.default_rng(num_layers)
    scores = rng.random((6, num_layers)).round(1)  # rounding creates ties
    idx, mask = rr.select_layers(jnp.asarray(scores), rho)
    n = max(1, math.ceil(round(rho * num_layers, 9)))
    assert idx.shape == (6, n) and (np.asarray(mask).sum(-1) == n).all()
    for row, sel in zip(scores, np.asarray(idx)):
        brute = sorted(range(num_layers), key=lambda l: (-row[l], l))[:n]  # ties: lower index first
        assert sel.tolist() == brute


def test_random_layers_count_and_spread():
    m = np.asarray(rr.random_layers(jax.random.key(0), 200, 8, 0.25))
    assert m.shape == (8, 200) and (m.sum(0) == 2).all()
    freq = m.mean(1)  # each layer picked w.p. 1/4; 200 draws -> std 0.031
    assert np.abs(freq - 0.25).max() < 0.15


def test_layer_confidence_matches_intermediates(model, data):
    toks, lens = data
    conf = np.asarray(rr.layer_confidence(model, toks, lens))
    graphdef, state = nnx.split(model)
    out = jax.jit(lambda st, t: nnx.merge(graphdef, st)(t, return_intermediates=True))(state, jnp.asarray(toks))
    for l, aux in enumerate(out.intermediates["ffn_aux"]):
        p = np.sort(np.asarray(aux["router_probs"], np.float64), -1)[..., -2:].sum(-1)
        want = [p[i, :lens[i]].mean() for i in range(3)]
        np.testing.assert_allclose(conf[:, l], want, rtol=1e-5)


def test_generation_after_adaptation_equals_full_recompute(model, data, generation, forward):
    toks, lens = data
    res, _ = generation
    m = CFG.interval
    assert len(res.rounds) == math.ceil(7 / m)
    seqs = np.zeros((3, 12 + 7), np.int32)  # the whole sequence, right-padded (causal: padding is never read)
    for i in range(3):
        seqs[i, :lens[i] + 7] = list(toks[i, :lens[i]]) + list(res.tokens[i])
    fwd = forward
    zero = np.asarray(fwd(seqs))
    diff_from_zero = 0.0
    for r, rd in enumerate(res.rounds):
        full = np.asarray(fwd(seqs, rd.delta))  # full recompute with this round's bias, no cache
        for j in range(r * m, min(7, (r + 1) * m)):
            pos = lens + j - 1  # logits at pos predict generated token j
            want = full[np.arange(3), pos]
            np.testing.assert_allclose(res.logits[:, j], want, atol=2e-5, rtol=1e-5)
            np.testing.assert_array_equal(res.tokens[:, j], want.argmax(-1))
            diff_from_zero = max(diff_from_zero, float(np.abs(want - zero[np.arange(3), pos]).max()))
    assert diff_from_zero > 1e-3  # the bias really changes the logits, so the check is not vacuous


def test_stale_cache_differs_from_recompute(model, data):
    """A cache prefilled without the bias is not what re-prefill gives (why the cache is recomputed)."""
    toks, lens = data
    toks = np.pad(toks, ((0, 0), (0, 7)))  # the generation's buffer width: its compiled programs are reused
    delta, _ = rr.adapt_on_context(model, toks, lens, config=rr.RerouteConfig(steps=10, learning_rate=0.5))
    fresh = rr.decode(model, toks, lens, num_tokens=1, delta=delta)[1]
    stale = rr.decode(model, toks, lens, num_tokens=1)[1]  # a cache filled without the bias
    stale = stale[:, 0]
    assert float(jnp.abs(fresh[:, 0] - stale).max()) > 1e-4


def test_adaptation_lowers_context_loss(model, data):
    toks, lens = data
    d, info = rr.adapt_on_context(model, toks, lens, config=rr.RerouteConfig(steps=10, learning_rate=0.1))
    assert (info.loss_after < info.loss_before).all()
    np.testing.assert_allclose(info.loss_after, rr.context_loss(model, toks, lens, d), rtol=1e-5)
    np.testing.assert_allclose(info.loss_before, rr.context_loss(model, toks, lens), rtol=1e-5)


def test_one_small_sgd_step_decreases_loss(model, data):
    toks, lens = data
    cfg = rr.RerouteConfig(steps=1, learning_rate=1e-2, optimizer="sgd", layers="all")
    _, info = rr.adapt_on_context(model, toks, lens, config=cfg)
    assert (info.loss_after < info.loss_before).all()


def test_sgd_step_is_plain_gradient_step(model, data, loss_grad):
    toks, lens = data
    cfg = rr.RerouteConfig(steps=1, learning_rate=0.05, optimizer="sgd", l2=0.1)
    d0 = 0.1 * jax.random.normal(jax.random.key(3), (L, 3, E))
    want = d0 - 0.05 * (loss_grad(d0) + 2 * 0.1 * d0)  # d/dd of 0.1 * sum(d * d) is 0.2 * d
    got, _ = rr.fit_router_bias(model, toks, rr._context_weights(toks.shape, lens), config=cfg, delta=d0)
    np.testing.assert_allclose(got, want, atol=1e-6)


def test_adam_matches_optax_adam(model, data, loss_grad):
    toks, lens = data
    cfg = rr.RerouteConfig(steps=3, learning_rate=0.05)
    grad = loss_grad
    d = jnp.zeros((L, 3, E))
    opt = optax.adam(0.05)
    st = opt.init(d)
    for _ in range(3):
        u, st = opt.update(grad(d), st, d)
        d = optax.apply_updates(d, u)
    got, _ = rr.fit_router_bias(model, toks, rr._context_weights(toks.shape, lens), config=cfg)
    _adam_agree(got, d)


def _adam_agree(got, want, *, tight=1e-5, most=0.9):
    """Adam divides by sqrt(v): entries whose gradient is ~1e-8 (experts the softmax barely reaches)
    amplify summation-order differences (which move with the CPU's vector width and with what else
    is in the batch), so most entries must agree tightly and all loosely."""
    close = np.isclose(np.asarray(got), np.asarray(want), atol=tight)
    assert close.mean() > most, f"{close.mean():.2f} of the entries within {tight}"
    np.testing.assert_allclose(got, want, atol=2e-2)


def test_biases_of_different_sequences_are_independent(model, data):
    toks, lens = data
    cfg = rr.RerouteConfig(steps=4, learning_rate=0.1, layers="all")
    d_all, _ = rr.adapt_on_context(model, toks, lens, config=cfg)
    other = np.random.default_rng(9).integers(3, V, toks.shape).astype(np.int32)
    other[1] = toks[1]  # rows 0 and 2 change; row 1's bias must not
    d_other, _ = rr.adapt_on_context(model, other, lens, config=cfg)
    _adam_agree(d_all[:, 1], d_other[:, 1], tight=1e-6, most=0.75)
    assert float(jnp.abs(d_all[:, 0] - d_other[:, 0]).max()) > 0.1


def test_warm_start_carries_bias_across_rounds(model, data, generation):
    toks, lens = data
    res, _ = generation
    r0, r1 = res.rounds[0], res.rounds[1]
    np.testing.assert_array_equal(r1.delta_init, r0.delta)
    ctx = np.zeros((3, 12 + 7), np.int32)
    for i in range(3):
        ctx[i, :lens[i] + 3] = list(toks[i, :lens[i]]) + list(res.tokens[i, :3])
    again, _ = rr.adapt_on_context(model, ctx, lens + 3, config=CFG, delta=r0.delta,
                                   layer_mask=r1.info.layer_mask)
    _adam_agree(r1.delta, again, tight=1e-6, most=0.75)
    cold = rr.rerouted_generate(model, toks, lens, max_new_tokens=7, config=rr.RerouteConfig(
        steps=5, learning_rate=0.1, interval=3, warm_start=False))
    np.testing.assert_array_equal(cold.rounds[1].delta_init, 0.0)


def test_schedule_prefill_and_every_m_tokens(model, data):
    toks, lens = data
    calls = []
    orig = rr.adapt_on_context

    def counting(model, tokens, lengths, **kw):
        calls.append(np.asarray(lengths).copy())
        return orig(model, tokens, lengths, **kw)

    rr.adapt_on_context = counting  # count adaptation calls (a mock around the real function)
    try:
        for interval, n_rounds in ((3, 3), (None, 1)):
            calls.clear()
            res = rr.rerouted_generate(model, toks, lens, max_new_tokens=7,
                                       config=rr.RerouteConfig(steps=1, interval=interval))
            assert len(calls) == len(res.rounds) == n_rounds
            for r, (rd, c) in enumerate(zip(res.rounds, calls)):
                np.testing.assert_array_equal(rd.context_lengths, lens + r * (interval or 7))
                np.testing.assert_array_equal(c, rd.context_lengths)
    finally:
        rr.adapt_on_context = orig
    res = rr.rerouted_generate(model, toks, lens, max_new_tokens=7, config=rr.RerouteConfig(layers="none"))
    assert res.rounds == [] and not np.abs(res.delta).any()


def test_oracle_lowers_continuation_nll_and_nll_matches_numpy(model, data, forward):
    toks, _ = data
    p, c = np.array([6, 4, 8]), np.array([5, 6, 3])
    lg = forward(toks[:, :-1])
    ce = _ce_numpy(lg, toks)
    want = [ce[i, p[i] - 1:p[i] - 1 + c[i]].mean() for i in range(3)]
    np.testing.assert_allclose(rr.continuation_nll(model, toks, p, c), want, rtol=1e-5)
    d, info = rr.oracle_bias(model, toks, p, c, config=rr.RerouteConfig(steps=10, learning_rate=0.2))
    assert (rr.continuation_nll(model, toks, p, c, d) < np.asarray(want)).all()


def test_retrieval_finds_itself_and_fits_on_neighbours(model, data):
    toks, lens = data
    rng = np.random.default_rng(5)
    bank = rng.integers(3, V, (3, 12)).astype(np.int32)  # as many rows as the queries: one compiled shape
    bank_len = np.full(3, 12, np.int32)
    bank[2], bank_len[2] = toks[1], lens[1]
    d, info, nbr = rr.retrieval_bias(model, toks, lens, bank, bank_len, num_neighbors=2,
                                     config=rr.RerouteConfig(steps=5, learning_rate=0.1))
    assert nbr[1, 0] == 2  # the query itself is in the bank
    emb, q = rr.sequence_embedding(model, bank, bank_len), rr.sequence_embedding(model, toks, lens)
    sims = (q / np.linalg.norm(q, axis=1, keepdims=True)) @ (emb / np.linalg.norm(emb, axis=1, keepdims=True)).T
    np.testing.assert_array_equal(nbr, np.argsort(-sims, axis=1, kind="stable")[:, :2])
    assert (info.loss_after < info.loss_before).all()
    # loss_before pools the neighbours' next-token losses: their own context losses weighted by
    # their number of predicted tokens (length - 1)
    own = np.asarray(rr.context_loss(model, bank, bank_len))
    n_pred = (bank_len - 1).astype(np.float64)[nbr]
    np.testing.assert_allclose(info.loss_before, (own[nbr] * n_pred).sum(1) / n_pred.sum(1), rtol=1e-5)
    assert d.shape == (L, 3, E)


def test_bad_inputs_raise(model, data):
    toks, lens = data
    with pytest.raises(ValueError, match="rho"):
        rr.RerouteConfig(rho=0.0)
    with pytest.raises(ValueError, match="layers"):
        rr.RerouteConfig(layers="some")
    with pytest.raises(ValueError, match="lengths"):
        rr.context_loss(model, toks, np.array([13, 1, 1]))
    with pytest.raises(ValueError, match="delta"):
        rr.context_loss(model, toks, lens, jnp.zeros((L, 2, E)))
    with pytest.raises(ValueError, match="PRNG key"):
        rr.adapt_on_context(model, toks, lens, config=rr.RerouteConfig(layers="random"))
    with pytest.raises(ValueError, match="ffn_type"):
        dense = Transformer(TransformerConfig(vocab_size=V, d_model=8, num_layers=1, num_heads=2, num_kv_heads=1,
                                              d_ff=8), rngs=nnx.Rngs(0))
        rr.context_loss(dense, toks, lens)
