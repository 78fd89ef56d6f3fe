"""ToaSt: pruned == masked-dense, coupled masks, score properties, exact MACs (hand count, jaxpr count,
DeiT numbers), TCS against a numpy reference and the identity, baselines at equal MACs, fine-tuning, bad input."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from algorithms.compression import toast as T
from algorithms.training import OptimizerConfig
from models.vit import ViT, ViTConfig

CFG = ViTConfig(image_size=8, patch_size=2, channels=1, num_classes=3, d_model=16, num_heads=2, d_ff=32,
                num_layers=3)
MODEL = ViT(CFG, rngs=nnx.Rngs(0))
X = jax.random.normal(jax.random.key(1), (4, 8, 8, 1))


def _fwd(model, x, **kwargs):
    """One jitted forward (compiled once, so the persistent compilation cache serves reruns)."""
    graphdef, state = nnx.split(model)
    return jax.jit(lambda state, x: nnx.merge(graphdef, state)(x, **kwargs))(state, x)


def _logits(model, x, **kwargs):
    return _fwd(model, x, **kwargs).logits


def _params(model):
    return jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(model, nnx.Param)))


# ---------------------------------------------------------------------------------------------- SCWP


@pytest.mark.parametrize("score,coupling", [("gm", "coupled"), ("l1", "coupled"), ("l2", "average"),
                                            ("gm", "q_only"), ("gm", "k_only"), ("gm", "proj_only")])
def test_pruned_model_equals_dense_model_with_dropped_weights_zeroed(score, coupling):
    masks = T.scwp_masks(MODEL, 75, score=score, coupling=coupling)
    pruned, masked = T.prune_attention(MODEL, masks), T.mask_attention(MODEL, masks)
    assert pruned.config.qk_dims == ((8, 8), (2, 2), (2, 2)) == pruned.config.v_dims
    assert pruned.layers[1].attn.wq.shape == (16, 2, 2) and pruned.layers[1].attn.wo.shape == (2, 2, 16)
    np.testing.assert_allclose(_logits(pruned, X), _logits(masked, X), rtol=1e-5, atol=1e-5)
    # The masked model holds exactly the kept weights: same multiset of nonzeros per head.
    pm, pp = _params(masked)["layers"][1]["attn"], _params(pruned)["layers"][1]["attn"]
    for h in range(2):
        kept = np.flatnonzero(masks.qk[1][h])
        np.testing.assert_array_equal(pm["wq"][:, h, kept], pp["wq"][:, h])
        np.testing.assert_array_equal(pm["wo"][h, np.flatnonzero(masks.vo[1][h])], pp["wo"][h])


def test_ragged_and_random_masks_fold_exactly():
    for masks in (T.magnitude_masks(MODEL, 75, per_head=False), T.random_masks(CFG, jax.random.key(3), 50)):
        pruned, masked = T.prune_attention(MODEL, masks), T.mask_attention(MODEL, masks)
        np.testing.assert_allclose(_logits(pruned, X), _logits(masked, X), rtol=1e-5, atol=1e-5)
    ragged = T.magnitude_masks(MODEL, 75, per_head=False)
    assert [int(m.sum()) for m in ragged.qk] == [16, 4, 4]  # the layer's budget h * keep, any split


def test_couplings_are_kept_and_each_head_keeps_exactly_keep_dims():
    masks = T.scwp_masks(MODEL, 75)
    masked = _params(T.mask_attention(MODEL, masks))
    for l in range(3):
        a = masked["layers"][l]["attn"]
        q_zero = np.all(a["wq"] == 0, axis=0)  # [h, d]: Q rows that are gone
        np.testing.assert_array_equal(q_zero, np.all(a["wk"] == 0, axis=0))  # ... are the K rows that are gone
        np.testing.assert_array_equal(np.all(a["wv"] == 0, axis=0), np.all(a["wo"] == 0, axis=2))  # V rows == O cols
        expected = 8 if l == 0 else T.keep_count(8, 75)  # block 0 untouched by default
        assert (~q_zero).sum(1).tolist() == [expected] * 2
        assert masks.qk[l].sum(1).tolist() == masks.vo[l].sum(1).tolist() == [expected] * 2
    np.testing.assert_array_equal(masked["layers"][0]["attn"]["wq"], _params(MODEL)["layers"][0]["attn"]["wq"])
    # Re-applying masks to a masked model changes nothing (official reapply_masks).
    again = _params(T.mask_attention(T.mask_attention(MODEL, masks), masks))
    np.testing.assert_array_equal(again["layers"][2]["attn"]["wv"], masked["layers"][2]["attn"]["wv"])
    # Realised sparsity equals the request.
    assert T.keep_count(64, 90) == 6 and T.keep_count(16, 87.5) == 2
    masks = T.scwp_masks(MODEL, 87.5, skip_first_block=False)
    assert all(m.sum() == 2 * 1 for m in masks.qk)


def test_each_block_is_scored_from_its_own_weights():
    # Swapping layers 1 and 2's attention weights swaps their masks.
    p = _params(MODEL)
    p["layers"][1]["attn"], p["layers"][2]["attn"] = p["layers"][2]["attn"], p["layers"][1]["attn"]
    swapped = T._build(CFG, p)
    a, b = T.scwp_masks(MODEL, 50), T.scwp_masks(swapped, 50)
    np.testing.assert_array_equal(a.qk[1], b.qk[2])
    np.testing.assert_array_equal(a.vo[2], b.vo[1])


def test_keep_ratio_one_leaves_the_model_unchanged():
    pruned, masks = T.scwp(MODEL, 0.0, skip_first_block=False)
    assert all(m.all() for m in masks.qk + masks.vo)
    assert pruned.config.qk_dims == ((8, 8),) * 3
    for a, b in zip(jax.tree.leaves(_params(pruned)), jax.tree.leaves(_params(MODEL))):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(_logits(pruned, X), _logits(MODEL, X))
    assert T.count_macs(pruned.config).total == T.count_macs(CFG).total


def test_gm_score_properties():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((7, 5))
    s = T.gm_score(w)
    perm = rng.permutation(7)
    np.testing.assert_allclose(T.gm_score(w[perm]), s[perm])  # permuting rows permutes the scores
    np.testing.assert_allclose(T.gm_score(w + rng.standard_normal(5)), s, atol=1e-12)  # shift-invariant
    # Brute force: distance to the lower median, per column.
    med = np.array([sorted(w[:, j])[3] for j in range(5)])
    np.testing.assert_allclose(s, [math.dist(row, med) for row in w])
    w4 = rng.standard_normal((4, 3))  # even count: lower median, as torch.median
    med4 = np.sort(w4, 0)[1]
    np.testing.assert_allclose(T.gm_score(w4), np.linalg.norm(w4 - med4, axis=1))
    np.testing.assert_allclose(T.l1_score(w), np.abs(w).sum(1))
    np.testing.assert_allclose(T.l2_score(w), (w ** 2).sum(1))
    q, k, v, o = (rng.standard_normal((4, 6)) for _ in range(4))
    qk, vo = T.head_importance(q, k, v, o)
    np.testing.assert_allclose(qk, T.gm_score(np.concatenate([q, k], 1)))
    np.testing.assert_allclose(vo, T.gm_score(np.concatenate([v, o], 1)))
    qk, vo = T.head_importance(q, k, v, o, score="l1", coupling="average")
    np.testing.assert_allclose(qk, (T.l1_score(q) + T.l1_score(k)) / 2)


# ---------------------------------------------------------------------------------------------- MACs


def test_macs_match_a_hand_count_on_a_one_layer_model():
    cfg = ViTConfig(image_size=8, patch_size=4, channels=1, num_classes=3, d_model=8, num_heads=2, d_ff=16,
                    num_layers=1)
    # P = 4 patches, n = 5 tokens, D = 8, h = 2, d = 4, f = 16, K = 3.
    patch = 4 * 16 * 8                      # 4 patches x (4*4*1) pixels x D
    proj = 4 * 5 * 8 * 8                    # q, k, v, o: 4 x n x D x (h d)
    attn = 2 * 5 * 5 * 8                    # scores and weighted sum: 2 x n^2 x (h d)
    ffn = 2 * 5 * 8 * 16                    # fc1, fc2
    head = 8 * 3
    m = T.count_macs(cfg)
    assert (m.patch_embed, m.attention, m.ffn, m.head) == (patch, (proj + attn,), (ffn,), head)
    assert m.total == 3496
    # Pruned to 2 q/k and 3 v/o dims per head: q,k 2*5*8*4, v,o 2*5*8*6, scores 25*4, weighted sum 25*6.
    pruned = ViTConfig(**{**cfg.__dict__, "qk_dims": ((2, 2),), "v_dims": ((3, 3),)})
    assert T.count_macs(pruned).attention == (2 * 5 * 8 * 4 + 2 * 5 * 8 * 6 + 25 * 4 + 25 * 6,)
    # TCS on a 2-layer model (block 0 never): r1 = 0.5 keeps 4 of 8 channels, r2 = 0.3 keeps 11 of 16 units.
    two = ViTConfig(**{**cfg.__dict__, "num_layers": 2})
    tcs = T.TCSConfig(fc1_ratios=(0.0, 0.5), fc2_ratios=(0.0, 0.3))
    assert T.count_macs(two, tcs=tcs).ffn == (ffn, 5 * 4 * 16 + 5 * 11 * 8)
    # Token pruning after layer 0's attention to 3 tokens: layer 0's FFN and layer 1 run on 3 tokens.
    m = T.count_macs(two, tokens_after=(3, None))
    assert m.ffn == (2 * 3 * 8 * 16,) * 2
    assert m.attention == (proj + attn, 4 * 3 * 64 + 2 * 9 * 8)


@pytest.mark.parametrize("d,heads,gmacs", [(192, 3, 1.3), (384, 6, 4.6), (768, 12, 17.6)])
def test_deit_baselines_match_the_published_gmacs(d, heads, gmacs):
    cfg = ViTConfig(image_size=224, patch_size=16, channels=3, num_classes=1000, d_model=d, num_heads=heads,
                    d_ff=4 * d, num_layers=12)
    base = T.count_macs(cfg)
    assert abs(base.total / 1e9 - gmacs) < 0.05
    # SCWP scales only the attention term by keep / d; TCS scales only the FFN term.
    pruned = ViTConfig(**{**cfg.__dict__, "qk_dims": ((64,) * heads,) + ((6,) * heads,) * 11,
                          "v_dims": ((64,) * heads,) + ((6,) * heads,) * 11})
    m = T.count_macs(pruned)
    assert m.attention[1] * 64 == base.attention[1] * 6 and m.ffn == base.ffn
    tcs = T.TCSConfig.uniform(12, fc2=0.5, layers=[11])
    m = T.count_macs(cfg, tcs=tcs)
    assert m.attention == base.attention and m.ffn[11] * 4 == base.ffn[11] * 3


def _jaxpr_macs(fn, *args):
    """Sum of multiply-accumulates of every dot_general in the jaxpr (nested jaxprs included)."""
    def walk(jaxpr):
        total = 0
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "dot_general":
                (lc, _), _ = eqn.params["dimension_numbers"]
                lhs = eqn.invars[0].aval.shape
                out = eqn.outvars[0].aval.shape
                total += math.prod(out) * math.prod(lhs[i] for i in lc)
            for v in eqn.params.values():  # nested jaxprs (pjit, custom_jvp, cond branches), each once
                for sub in (v if isinstance(v, (tuple, list)) else (v,)):
                    if hasattr(sub, "jaxpr") and hasattr(sub.jaxpr, "eqns"):
                        total += walk(sub.jaxpr)
                    elif hasattr(sub, "eqns"):
                        total += walk(sub)
        return total
    return walk(jax.make_jaxpr(fn)(*args).jaxpr)


def test_macs_equal_the_dot_generals_of_the_traced_model():
    pruned, _ = T.scwp(MODEL, 50)
    pruned = T.prune_ffn(pruned, [None, np.arange(32) < 20, np.arange(32) % 2 == 0])
    x = X[:1]
    for model in (MODEL, pruned):
        graphdef, state = nnx.split(model)
        counted = _jaxpr_macs(lambda s, x: nnx.merge(graphdef, s)(x).logits, state, x)
        assert counted == T.count_macs(model.config).total, model.config


# ---------------------------------------------------------------------------------------------- TCS


def _importance_ref(x, a, idx, lam):
    """numpy float64 TCS importance with the given patch indices."""
    x, a = np.abs(np.asarray(x, np.float64)), np.asarray(a, np.float64)
    P = x.shape[1] - 1
    cls = lam * x[:, 0].mean(0)
    patch = (x[:, idx] * a[:, idx].mean(0)[None, :, None]).mean((0, 1))
    return cls / (1 + P) + patch * P / (1 + P)


def test_channel_importance_matches_a_numpy_reference():
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((3, 9, 6)), jnp.float32)
    a = jax.nn.softmax(jnp.asarray(rng.standard_normal((3, 9)), jnp.float32))
    key = jax.random.key(5)
    full = T.channel_importance(x, a, key, sample_ratio=1.0)  # every patch: deterministic
    np.testing.assert_allclose(full, _importance_ref(x, a, np.arange(1, 9), 2.0), rtol=1e-5)
    # rho = 0.3 -> floor(8 * 0.3) = 2 patches drawn with replacement from [1, 9) by this key.
    idx = np.asarray(jax.random.randint(key, (2,), 1, 9))
    np.testing.assert_allclose(T.channel_importance(x, a, key, sample_ratio=0.3), _importance_ref(x, a, idx, 2.0),
                               rtol=1e-5)
    # Fixed key: reproducible; other keys: other subsets (so other scores for some key).
    again = T.channel_importance(x, a, key, sample_ratio=0.3)
    np.testing.assert_array_equal(again, T.channel_importance(x, a, key, sample_ratio=0.3))
    others = [T.channel_importance(x, a, jax.random.key(s), sample_ratio=0.3) for s in range(6)]
    assert any(not np.allclose(o, again) for o in others)
    # A lone class token: importance = lambda * mean_b |x_cls|.
    np.testing.assert_allclose(T.channel_importance(x[:, :1], None, key, cls_weight=3.0),
                               3.0 * np.abs(np.asarray(x[:, 0])).mean(0), rtol=1e-6)
    # Per example: each image scored from its own tokens and attention.
    per = T.channel_importance(x, a, key, sample_ratio=1.0, per_example=True)
    np.testing.assert_allclose(per[1], _importance_ref(x[1:2], a[1:2], np.arange(1, 9), 2.0), rtol=1e-5)
    # Without a class token: magnitude over the tokens.
    np.testing.assert_allclose(T.channel_importance(x, None, key, sample_ratio=1.0, has_cls=False),
                               np.abs(np.asarray(x)).mean((0, 1)), rtol=1e-6)


def test_select_channels_keeps_the_top_channels():
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.standard_normal((2, 5, 10)), jnp.float32)
    key = jax.random.key(0)
    imp = np.asarray(T.channel_importance(x, None, key, sample_ratio=1.0))
    m = np.asarray(T.select_channels(x, None, key, ratio=0.3, sample_ratio=1.0))
    assert m.sum() == T.kept_channels(10, 0.3) == 7
    assert set(np.flatnonzero(m)) == set(np.argsort(-imp)[:7])
    np.testing.assert_array_equal(T.select_channels(x, None, key, ratio=0.0), np.ones(10))
    assert T.kept_channels(10, 0.99) == 1


def _tcs_reference(model, x, tcs, key):
    """The block equations of ToaSt's masked TCS, from the model's parts, with masks from channel_importance."""
    h = model.embed(x)
    for l, blk in enumerate(model.layers):
        a, _, row = blk.attn(blk.norm1(h), attn_row="cls")
        h = h + a
        if l > 0:
            k1 = jax.random.fold_in(key, 2 * l)
            m1 = T.select_channels(h, row, k1, ratio=tcs.fc1_ratios[l], sample_ratio=tcs.sample_ratio)
            h = h * m1  # the residual is replaced by the selected channels
        z = jax.nn.gelu(blk.norm2(h) @ blk.w1[...] + blk.b1[...], approximate=False)
        if l > 0:
            m2 = T.select_channels(z, row, jax.random.fold_in(key, 2 * l + 1), ratio=tcs.fc2_ratios[l],
                                   sample_ratio=tcs.sample_ratio)
            z = z * m2
        h = h + z @ blk.w2[...] + blk.b2[...]
    h = model.final_norm(h)
    return h[:, 0] @ model.head_w[...] + model.head_b[...]


def test_tcs_model_matches_the_block_equations_and_keeping_every_channel_is_the_identity():
    key = jax.random.key(7)
    tcs = T.TCSConfig.uniform(3, fc1=0.5, fc2=0.75, sample_ratio=0.3)
    got = _logits(MODEL, X, ffn_hook=T.tcs_hook(tcs, key))
    graphdef, state = nnx.split(MODEL)
    ref = jax.jit(lambda s, x: _tcs_reference(nnx.merge(graphdef, s), x, tcs, key))(state, X)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
    assert not np.allclose(got, _logits(MODEL, X), atol=1e-3)
    keep_all = T.TCSConfig.uniform(3, sample_ratio=0.3)
    np.testing.assert_array_equal(_logits(MODEL, X, ffn_hook=T.tcs_hook(keep_all, key)), _logits(MODEL, X))


# ---------------------------------------------------------------------------------------------- baselines


def test_baselines_at_the_same_macs():
    # ToaSt: SCWP at 50% + TCS r1 = r2 = 0.5 on blocks 1-2. FFN MACs per block n*(8*32 + 16*16) = 2*n*16*16,
    # so static FFN width 16 matches exactly.
    tcs = T.TCSConfig.uniform(3, fc1=0.5, fc2=0.5)
    toast, _ = T.scwp(MODEL, 50)
    target = T.count_macs(toast.config, tcs=tcs).total
    widths = T.ffn_widths_matching(CFG, tcs)
    assert widths == (32, 16, 16)
    mag = T.magnitude_prune(MODEL, 50, ffn_widths=widths)
    ragged = T.magnitude_prune(MODEL, 50, ffn_widths=widths, per_head=False)
    rnd = T.random_prune(MODEL, jax.random.key(0), 50, ffn_widths=widths)
    for m in (mag, ragged, rnd):
        assert T.count_macs(m.config).total == target
    assert mag.config.d_ffs == (32, 16, 16)
    # Magnitude keeps the largest-L1 hidden units; random differs from it.
    p = _params(MODEL)["layers"][1]
    s = np.abs(p["w1"]).sum(0) + np.abs(p["w2"]).sum(1)
    np.testing.assert_array_equal(_params(mag)["layers"][1]["w1"], p["w1"][:, np.sort(np.argsort(-s)[:16])])
    assert not np.array_equal(_params(rnd)["layers"][1]["w1"], _params(mag)["layers"][1]["w1"])
    # Token pruning: the k whose MACs are nearest the target; one more or one fewer token is farther.
    plan = T.match_token_keep(CFG, target, layer=0)
    k = plan[0]
    err = abs(T.count_macs(CFG, tokens_after=plan).total - target)
    for other in (k - 1, k + 1):
        assert abs(T.count_macs(CFG, tokens_after=(other, None, None)).total - target) >= err
    assert err < T.count_macs(CFG, tokens_after=(k, None, None)).total / CFG.num_tokens


def test_token_pruning_keeps_the_class_token_and_the_most_attended_patches():
    hook = T.token_pruning_hook((None, 5, None))
    x = jnp.zeros((2, 9, 4))
    row = jnp.asarray([[0.9, 0.0, 0.3, 0.1, 0.0, 0.2, 0.5, 0.0, 0.4],
                       [0.1, 0.6, 0.0, 0.0, 0.7, 0.0, 0.0, 0.8, 0.9]])
    np.testing.assert_array_equal(hook(1, x, row), [[0, 2, 5, 6, 8], [0, 1, 4, 7, 8]])
    np.testing.assert_array_equal(hook(0, x, row), np.broadcast_to(np.arange(9), (2, 9)))
    # In the model: equals the dense model when every token is kept; runs with fewer tokens otherwise.
    np.testing.assert_allclose(_logits(MODEL, X, token_hook=T.token_pruning_hook((None,) * 3)),
                               _logits(MODEL, X), rtol=1e-6, atol=1e-6)
    out = _fwd(MODEL, X, token_hook=T.token_pruning_hook((6, None, 3)), return_intermediates=True)
    assert [r.shape[1] for r in out.intermediates["residuals"]] == [17, 6, 6, 3]


# ---------------------------------------------------------------------------------------------- fine-tuning


def test_finetune_keeps_the_pruned_structure_and_lowers_the_loss():
    rng = np.random.default_rng(0)
    batch = {"image": rng.standard_normal((8, 8, 8, 1)).astype(np.float32), "label": np.arange(8, dtype=np.int32) % 3}
    pruned, _ = T.scwp(MODEL, 75)
    tcs = T.TCSConfig.uniform(3, fc2=0.5, layers=[2])
    tuned, res = T.finetune(pruned, batch_fn=lambda pos: batch, num_steps=15, log_every=1, tcs=tcs,
                            optimizer_config=OptimizerConfig(learning_rate=1e-2, warmup_steps=0, total_steps=15))
    assert tuned.config == pruned.config and tuned.layers[1].attn.wq.shape == (16, 2, 2)
    losses = [r["loss"] for r in res.history]
    assert losses[-1] < losses[0]
    acc = T.evaluate(tuned, batch["image"], batch["label"], batch_size=3, tcs=tcs)
    assert 0.0 <= acc <= 1.0
    assert T.evaluate(MODEL, batch["image"], batch["label"]) == float(
        np.mean(np.argmax(_logits(MODEL, jnp.asarray(batch["image"])), -1) == batch["label"]))


# ---------------------------------------------------------------------------------------------- bad input


def test_bad_inputs_raise_clear_errors():
    with pytest.raises(ValueError, match=r"sparsity must be a percentage in \[0, 100\); got 100"):
        T.keep_count(8, 100)
    with pytest.raises(ValueError, match="leaves 0 of head_dim=8"):
        T.scwp_masks(MODEL, 95)
    with pytest.raises(ValueError, match="sparsity must be a number or 3 per-layer values"):
        T.scwp_masks(MODEL, [50, 50])
    with pytest.raises(ValueError, match="score must be one of"):
        T.scwp_masks(MODEL, 50, score="l3")
    with pytest.raises(ValueError, match="coupling must be one of"):
        T.scwp_masks(MODEL, 50, coupling="both")
    with pytest.raises(TypeError, match="model must be a models.vit.ViT"):
        T.scwp_masks(object(), 50)
    masks = T.scwp_masks(MODEL, 50)
    with pytest.raises(ValueError, match=r"masks.qk\[1\] must have shape \(2, 8\)"):
        T.prune_attention(MODEL, T.HeadMasks(masks.qk[:1] + (masks.qk[1][:, :4],) + masks.qk[2:], masks.vo))
    pruned = T.prune_attention(MODEL, masks)
    with pytest.raises(ValueError, match="below keep=6"):
        T.scwp_masks(pruned, 25)
    with pytest.raises(ValueError, match=r"TCSConfig.fc2_ratios entries must lie in \[0, 1\)"):
        T.TCSConfig(fc1_ratios=(0.0, 0.1), fc2_ratios=(0.0, 1.0))
    with pytest.raises(ValueError, match=r"TCSConfig.fc1_ratios\[0\] must be 0"):
        T.TCSConfig(fc1_ratios=(0.5, 0.1), fc2_ratios=(0.0, 0.0))
    with pytest.raises(ValueError, match="sample_ratio must be > 0"):
        T.TCSConfig.uniform(3, sample_ratio=0.0)
    with pytest.raises(ValueError, match="num_layers=3"):
        T.count_macs(CFG, tcs=T.TCSConfig.uniform(2))
    with pytest.raises(ValueError, match=r"tokens_after\[0\] must lie in \[1, 17\]"):
        T.count_macs(CFG, tokens_after=(40, None, None))
    with pytest.raises(ValueError, match="attn_row must have shape"):
        T.channel_importance(jnp.ones((2, 3, 4)), jnp.ones((2, 4)), jax.random.key(0))
    with pytest.raises(ValueError, match="keep\\[1\\] must be a bool \\[32\\] mask"):
        T.prune_ffn(MODEL, [None, np.zeros(32, bool), None])
    with pytest.raises(ValueError, match="images and labels must have the same length"):
        T.evaluate(MODEL, np.zeros((2, 8, 8, 1)), np.zeros(3))
    with pytest.raises(ValueError, match="widths must have num_layers=3 entries"):
        T.magnitude_ffn_keep(MODEL, (16, 16))
    with pytest.raises(ValueError, match="layer must lie in"):
        T.match_token_keep(CFG, 1000, layer=3)
