"""Tests of algorithms.alignment.hyper_icl against float64 numpy references of spec eqs. (5)-(9), (16)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from algorithms.alignment import hyper_icl as hi
from models import Transformer, TransformerConfig
from primitives import attention as attn_lib

CFG = TransformerConfig(vocab_size=13, d_model=16, num_layers=2, num_heads=4, num_kv_heads=2, d_ff=32)


def _model():
    return Transformer(CFG, rngs=nnx.Rngs(0))


def _random_adapter(seed=0, L=2, h=4, d=4, r=3):
    ks = jax.random.split(jax.random.key(seed), 6)
    return {
        "u_q": jax.random.normal(ks[0], (L, h, d, r)),
        "u_k": jax.random.normal(ks[1], (L, h, d, r)),
        "w": jax.random.normal(ks[2], (L, h, d)),
        "b": jax.random.normal(ks[3], (L, h)),
        "ln_scale": 1.0 + 0.3 * jax.random.normal(ks[4], (L, h, d)),
        "ln_bias": 0.3 * jax.random.normal(ks[5], (L, h, d)),
    }


def _np_calibrated(q, k, v, p):
    """Float64 numpy eqs. (5)-(9), causal, GQA by repeating key heads, loops over batch and head."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    p = {n: np.asarray(x, np.float64) for n, x in p.items()}
    b, t, h, d = q.shape
    g_per = h // k.shape[2]
    r = p["u_q"].shape[-1]
    out = np.zeros((b, t, h, d))
    gates = np.zeros((b, h, t))
    for bi in range(b):
        for hi_ in range(h):
            Q, K, V = q[bi, :, hi_], k[bi, :, hi_ // g_per], v[bi, :, hi_ // g_per]
            S = Q @ K.T / math.sqrt(d)
            A, B = Q @ p["u_q"][hi_], K @ p["u_k"][hi_]
            delta = A @ B.T / math.sqrt(r)
            mu = Q.mean(-1, keepdims=True)
            ln = (Q - mu) / np.sqrt(((Q - mu) ** 2).mean(-1, keepdims=True) + 1e-5)
            ln = ln * p["ln_scale"][hi_] + p["ln_bias"][hi_]
            g = 1 / (1 + np.exp(-(ln @ p["w"][hi_] + p["b"][hi_])))
            St = S + g[:, None] * delta
            St = np.where(np.tril(np.ones((t, t), bool)), St, -np.inf)
            P = np.exp(St - St.max(-1, keepdims=True))
            P /= P.sum(-1, keepdims=True)
            out[bi, :, hi_] = P @ V
            gates[bi, hi_] = g
    return out, gates


def test_zero_uk_adapter_is_identity_bitwise():
    model = _model()
    tokens = jax.random.randint(jax.random.key(1), (3, 7), 0, CFG.vocab_size)
    base = hi.forward(model, tokens)
    params = hi.init_adapter(jax.random.key(2), num_layers=2, num_heads=4, head_dim=4, rank=4)
    assert float(jnp.abs(params["u_q"]).sum()) > 0  # U_q is random; U_k = 0 alone makes Delta vanish
    student = hi.forward(model, tokens, params)
    np.testing.assert_array_equal(np.asarray(student.logits), np.asarray(base.logits))
    np.testing.assert_array_equal(np.asarray(student.hidden), np.asarray(base.hidden))
    additive = hi.forward(model, tokens, hi.init_additive(num_layers=2, num_heads=4, head_dim=4))
    np.testing.assert_array_equal(np.asarray(additive.logits), np.asarray(base.logits))
    # A non-zero U_k changes the logits (the hook is live).
    changed = hi.forward(model, tokens, dict(params, u_k=jnp.ones_like(params["u_k"])))
    assert float(jnp.abs(changed.logits - base.logits).max()) > 1e-4


def test_calibrated_attention_matches_float64_numpy():
    ks = jax.random.split(jax.random.key(3), 3)
    q = jax.random.normal(ks[0], (2, 5, 4, 4))
    k = jax.random.normal(ks[1], (2, 5, 2, 4))
    v = jax.random.normal(ks[2], (2, 5, 2, 4))
    p = hi.layer_params(_random_adapter(), 1)
    got = hi.calibrated_attention(q, k, v, p)
    want, gates = _np_calibrated(q, k, v, p)
    np.testing.assert_allclose(np.asarray(got), want, rtol=2e-4, atol=2e-5)
    np.testing.assert_allclose(np.asarray(hi.query_gate(q, p)), gates, rtol=1e-5, atol=1e-6)
    # Low-rank identity: A B^T / sqrt(r) == Q (U_q U_k^T) K^T / sqrt(r), times g.
    bias = hi.calibration_bias(q, k, p)
    full = jnp.einsum("bthd,hde,bshe->bhts", q, jnp.einsum("hdr,her->hde", p["u_q"], p["u_k"]),
                      jnp.repeat(k, 2, axis=2)) / math.sqrt(3)
    np.testing.assert_allclose(np.asarray(bias), np.asarray(hi.query_gate(q, p)[..., None] * full),
                               rtol=1e-4, atol=1e-4)


def test_model_hook_applies_calibration_inside_attention():
    """The adapter through the model's hook == calibrated_attention on that layer's own q, k, v."""
    model = _model()
    params = _random_adapter(seed=4)
    tokens = jax.random.randint(jax.random.key(5), (2, 6), 0, CFG.vocab_size)
    out = model(tokens, attention_bias=hi.make_attention_bias(params), return_intermediates=True)
    x = out.intermediates["residuals"][0]  # the embedding: layer 0's input
    attn = model.layers[0].attn
    xn = model.layers[0].attn_norm(x)
    pos = jnp.broadcast_to(jnp.arange(6)[None], (2, 6))
    q = attn_lib.rope(jnp.einsum("btD,Dhd->bthd", xn, attn.wq[...]), pos, base=CFG.rope_base)
    k = attn_lib.rope(jnp.einsum("btD,Dkd->btkd", xn, attn.wk[...]), pos, base=CFG.rope_base)
    v = jnp.einsum("btD,Dkd->btkd", xn, attn.wv[...])
    want, _ = _np_calibrated(q, k, v, hi.layer_params(params, 0))
    np.testing.assert_allclose(np.asarray(out.intermediates["head_outputs"][0]), want, rtol=2e-4, atol=2e-5)


def test_gate_is_per_query_token_in_unit_interval():
    q = 3.0 * jax.random.normal(jax.random.key(6), (2, 7, 4, 4))
    p = hi.layer_params(_random_adapter(seed=7), 0)
    g = hi.query_gate(q, p)
    assert g.shape == (2, 4, 7)
    assert bool(jnp.all((g > 0) & (g < 1)))
    assert float(jnp.std(g, axis=-1).min()) > 1e-3  # varies over the query tokens
    p0 = dict(p, w=jnp.zeros_like(p["w"]))
    np.testing.assert_allclose(np.asarray(hi.query_gate(q, p0)),
                               np.broadcast_to(np.asarray(jax.nn.sigmoid(p["b"]))[None, :, None], (2, 4, 7)),
                               rtol=1e-6)
    # Causal masking is preserved after calibration: future keys get zero weight.
    v = jnp.eye(7)[None, :, None, :].repeat(2, 0).repeat(2, 2)[..., :4]
    kq = jax.random.normal(jax.random.key(8), (2, 7, 2, 4))
    out = hi.calibrated_attention(q, kq, jnp.broadcast_to(jnp.eye(7)[None, :, None, :4], (2, 7, 2, 4)), p)
    assert float(jnp.abs(out[:, 0, :, 1:]).max()) == 0.0  # token 0 reads only key 0 (one-hot values)
    del v


def _np_anchor(s, t, kappa):
    s, t = np.asarray(s, np.float64), np.asarray(t, np.float64)

    def ln(h):
        mu = h.mean(-1, keepdims=True)
        return (h - mu) / np.sqrt(((h - mu) ** 2).mean(-1, keepdims=True) + 1e-5)

    def expo(u):
        n = np.linalg.norm(u, axis=-1, keepdims=True)
        sk = math.sqrt(kappa)
        return np.concatenate([np.cosh(sk * n) / sk, np.sinh(sk * n) / (sk * n) * u], -1)

    P, Pp = expo(ln(s)), expo(ln(t))
    inner = -P[..., 0] * Pp[..., 0] + (P[..., 1:] * Pp[..., 1:]).sum(-1)
    d2 = np.arccosh(np.maximum(-kappa * inner, 1.0)) ** 2 / kappa
    return d2.mean(axis=(1, 2)).mean()


@pytest.mark.parametrize("kappa", [0.1, 1.0])
def test_anchor_loss_matches_float64_numpy(kappa):
    ks = jax.random.split(jax.random.key(9), 2)
    s = jax.random.normal(ks[0], (3, 2, 4, 8))
    t = s + 0.7 * jax.random.normal(ks[1], (3, 2, 4, 8))
    got = float(hi.hyperbolic_anchor_loss(s, t, curvature=kappa))
    np.testing.assert_allclose(got, _np_anchor(s, t, kappa), rtol=2e-4)
    assert float(hi.hyperbolic_anchor_loss(s, s, curvature=kappa)) == 0.0
    assert float(hi.euclidean_anchor_loss(s, s)) == 0.0
    grad = jax.grad(lambda x: hi.hyperbolic_anchor_loss(x, s, curvature=kappa))(s)
    assert bool(jnp.all(jnp.isfinite(grad)))


def test_train_step_changes_only_adapter_parameters():
    model = _model()
    base_before = jax.tree.map(np.asarray, nnx.state(model, nnx.Param))
    n, tq = 6, 5
    tokens = np.asarray(jax.random.randint(jax.random.key(10), (n, tq), 0, CFG.vocab_size))
    demo_tokens = np.asarray(jax.random.randint(jax.random.key(11), (n, 4), 0, CFG.vocab_size))
    teacher = hi.teacher_hidden_states(model, jnp.concatenate([demo_tokens, tokens], 1), tq)
    assert teacher.shape == (2, n, tq, 16)
    answers = np.arange(n) % CFG.vocab_size
    for method in ("h_anchor", "additive"):
        cfg = hi.TrainConfig(method=method, num_steps=2, batch_size=4, progress=False)
        start = hi.init_params(model, cfg)
        res = hi.train(model, tokens, np.asarray(teacher), answers, cfg)
        assert len(res.history) == 2 and all(math.isfinite(h["loss"]) for h in res.history)
        moved = [float(jnp.abs(res.params[name] - start[name]).max()) for name in start]
        assert max(moved) > 0, method
        if method != "additive":
            assert float(jnp.abs(res.params["u_k"]).max()) > 0  # U_k leaves its zero init
    base_after = jax.tree.map(np.asarray, nnx.state(model, nnx.Param))
    for a, b in zip(jax.tree.leaves(base_before), jax.tree.leaves(base_after)):
        np.testing.assert_array_equal(a, b)


def test_bad_inputs_raise_value_errors_naming_the_argument():
    with pytest.raises(ValueError, match="rank"):
        hi.init_adapter(jax.random.key(0), num_layers=1, num_heads=2, head_dim=4, rank=0)
    with pytest.raises(ValueError, match="rank"):
        hi.TrainConfig(rank=0)
    for bad in (0.0, -0.1, float("nan")):
        with pytest.raises(ValueError, match="curvature"):
            hi.hyperbolic_anchor_loss(jnp.ones((1, 1, 2, 4)), jnp.ones((1, 1, 2, 4)), curvature=bad)
        with pytest.raises(ValueError, match="curvature"):
            hi.TrainConfig(curvature=bad)
    with pytest.raises(ValueError, match="student"):
        hi.hyperbolic_anchor_loss(jnp.ones((1, 1, 2, 4)), jnp.ones((1, 1, 3, 4)))
    with pytest.raises(ValueError, match="student"):
        hi.euclidean_anchor_loss(jnp.ones((1, 2, 4)), jnp.ones((1, 2, 4)))
    p = hi.layer_params(_random_adapter(), 0)
    q = jnp.ones((1, 3, 4, 4))
    with pytest.raises(ValueError, match="k must be"):
        hi.calibration_bias(q, jnp.ones((1, 3, 3, 4)), p)
    with pytest.raises(ValueError, match=r"params\['u_q'\]"):
        hi.calibration_bias(jnp.ones((1, 3, 4, 8)), jnp.ones((1, 3, 2, 8)), p)
    with pytest.raises(ValueError, match=r"params\['u_k'\]"):
        hi.calibration_bias(q, jnp.ones((1, 3, 2, 4)), dict(p, u_k=jnp.ones((4, 4, 2))))
    with pytest.raises(ValueError, match="method"):
        hi.TrainConfig(method="lora")
    with pytest.raises(ValueError, match="teacher_hidden"):
        hi.train(_model(), np.zeros((2, 3), np.int32), np.zeros((2, 2, 3, 15)), np.zeros(2, np.int32),
                 hi.TrainConfig(num_steps=1, progress=False))


def test_forward_flops_counts_and_student_is_cheaper():
    # One layer, one token, no FFN difference: the per-token matmul count is exact.
    f1 = hi.forward_flops(CFG, 1)
    D, d, h, k = 16, 4, 4, 2
    want = CFG.num_layers * (2 * (D * d * (2 * h + 2 * k) + 3 * D * 32) + 4 * h * d) + 2 * D * 13
    assert f1 == want
    assert hi.forward_flops(CFG, 6, rank=4) < hi.forward_flops(CFG, 34)
    assert hi.forward_flops(CFG, 6, rank=4) > hi.forward_flops(CFG, 6)


def test_parameter_count_per_head_and_warmup_schedule():
    p = hi.init_adapter(jax.random.key(0), num_layers=3, num_heads=2, head_dim=8, rank=4)
    d, r = 8, 4
    assert hi.adapter_param_count(p) == 3 * 2 * (2 * d * r + d + 1 + 2 * d)  # + the gate LN's scale and bias
    np.testing.assert_allclose(float(jnp.std(p["u_q"])), 1 / math.sqrt(d), rtol=0.25)
    cfg = hi.TrainConfig(num_steps=10, learning_rate=5e-3, warmup_fraction=0.1)
    grads = {"x": jnp.ones((2, 2))}
    opt = hi.make_optimizer(cfg)
    state = opt.init(grads)
    upd, state = opt.update(grads, state, grads)  # step 0 of the warm-up: learning rate 0
    assert float(jnp.abs(upd["x"]).max()) == 0.0
    upd, state = opt.update(grads, state, grads)  # after warm-up: the peak rate
    assert float(jnp.abs(upd["x"]).max()) > 1e-3
