"""ToaSt: coupled head-wise structured pruning (SCWP) of attention + Token Channel Selection (TCS) of the FFN.

SCWP scores each head dimension by the geometric-median distance of its coupled rows (`[Q_h | K_h]`,
`[V_h | O_h^T]`) and keeps the top `floor(d (100 - s) / 100)` dims of each pair in every head (block 0
dense by default; the softmax scale stays `d^{-1/2}`). TCS, per forward pass and training-free, keeps
the FFN input and hidden channels with the largest class-token plus attention-weighted patch magnitude.

  Scores:    `gm_score`, `l1_score`, `l2_score`, `head_importance` (`SCORES` x `COUPLINGS` ablations).
  SCWP:      `keep_count`, `HeadMasks`, `scwp_masks`, `mask_attention` (dense shapes, dropped rows zeroed),
             `prune_attention` (folded to smaller per-head widths, `models.vit`), `scwp` (masks then fold).
  TCS:       `TCSConfig`, `kept_channels`, `channel_importance`, `select_channels`, `tcs_hook`, `tcs_loss`.
  FLOPs:     `MACs`, `count_macs` (every matmul, exact for any per-head / FFN widths, TCS ratios, tokens).
  Baselines: `magnitude_masks` / `magnitude_prune` (L1 of coupled rows, optionally ragged), `random_masks` /
             `random_prune`, `prune_ffn` (static), `ffn_widths_matching` (FFN width at TCS's MACs),
             `magnitude_ffn_keep`, `random_ffn_keep`, `token_pruning_hook` / `match_token_keep` (EViT, MAC budget).
  Training:  `finetune` (through `algorithms.training.fit`), `evaluate`.

Dimension legend: `b` batch, `n` tokens (class token at index 0 when the ViT has one), `P` patch tokens,
`D` model width (C in the paper), `h` heads, `d` head dim, `f` FFN hidden width, `L` layers.

Spec: papers/specs/inference_moe.md section 5 (SCWP, TCS and FLOPs in 5(b), ambiguities in 5(g)).
As in the official code, TCS's masked stream replaces the residual; only the masked form is here (a dense gather
differs through LayerNorm). `count_macs` charges the embedding for `P` patches (official counter: `n` tokens).

INFERRED (not in the official code or the spec's sources):
  * TCS without a class token (mean pooling) scores by magnitude over the sampled tokens (spec's Swin default);
  * `per_example=True` (a selection per image) is the spec's [infer] option;
  * the masked form zeroes the biases of dropped rows too, so masked and folded forms agree for every coupling;
  * the static-FFN part of the magnitude / random baselines and the EViT rule are our equal-FLOPs baselines.

References:
  ToaSt (ICML 2026), official code SHANNonLab-HUFS/ToaSt (toast/importance.py, weight_pruning.py,
  token_channel.py, patch.py, flops.py).
  He et al., "Filter Pruning via Geometric Median for Deep CNN Acceleration", arXiv:1811.00250, 2019.
  Liang et al., "Not All Patches are What You Need: Expediting Vision Transformers via Token
  Reorganizations" (EViT), arXiv:2202.07800, 2022.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from typing import Callable, Mapping, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from algorithms._loop import run_loop
from algorithms.training import FitResult, OptimizerConfig, TrainState, fit, make_optimizer, make_train_step
from models.vit import FFNHook, TokenHook, ViT, ViTConfig, classification_loss
from primitives.validation import check_finite, check_int

__all__ = [
    "SCORES", "COUPLINGS", "gm_score", "l1_score", "l2_score", "head_importance",
    "HeadMasks", "keep_count", "scwp_masks", "magnitude_masks", "random_masks",
    "mask_attention", "prune_attention", "scwp",
    "TCSConfig", "kept_channels", "channel_importance", "select_channels", "tcs_hook", "tcs_loss",
    "MACs", "count_macs",
    "prune_ffn", "ffn_widths_matching", "magnitude_ffn_keep", "random_ffn_keep",
    "magnitude_prune", "random_prune", "token_pruning_hook", "match_token_keep",
    "finetune", "evaluate",
]

DEFAULT_SPARSITY = 90.0
DEFAULT_CLS_WEIGHT = 2.0
DEFAULT_SAMPLE_RATIO = 0.02


# ------------------------------------------------------------------------------------------------
# Importance scores (rows of a [d, D'] matrix; larger = more important)
# ------------------------------------------------------------------------------------------------


def gm_score(w: np.ndarray) -> np.ndarray:
    """Distance of each row of `w` [d, D'] from the per-column (lower) median row: [d].

    The lower median (element `(d - 1) // 2` of each sorted column) is what `torch.median` returns.

    Examples:
      >>> gm_score(np.array([[0.0, 0.0], [1.0, 0.0], [4.0, 4.0]]))
      array([1., 0., 5.])
    """
    w = np.asarray(w, np.float64)
    median = np.sort(w, axis=0)[(w.shape[0] - 1) // 2]
    return np.sqrt(np.sum((w - median) ** 2, axis=1))


def l1_score(w: np.ndarray) -> np.ndarray:
    """Row-wise L1 norm of `w` [d, D']: [d]."""
    return np.abs(np.asarray(w, np.float64)).sum(axis=1)


def l2_score(w: np.ndarray) -> np.ndarray:
    """Row-wise squared L2 norm of `w` [d, D']: [d] (as the official code)."""
    return np.square(np.asarray(w, np.float64)).sum(axis=1)


SCORES: dict[str, Callable[[np.ndarray], np.ndarray]] = {"gm": gm_score, "l1": l1_score, "l2": l2_score}

COUPLINGS: dict[str, Callable] = {
    "coupled": lambda s, q, k, v, o: (s(np.concatenate([q, k], 1)), s(np.concatenate([v, o], 1))),
    "q_only": lambda s, q, k, v, o: (s(q), s(v)),
    "k_only": lambda s, q, k, v, o: (s(k), s(o)),
    "proj_only": lambda s, q, k, v, o: (s(q), s(o)),
    "average": lambda s, q, k, v, o: ((s(q) + s(k)) / 2, (s(v) + s(o)) / 2),
}


def head_importance(q: np.ndarray, k: np.ndarray, v: np.ndarray, o_t: np.ndarray, *, score: str = "gm",
                    coupling: str = "coupled") -> tuple[np.ndarray, np.ndarray]:
    """Importance of each dimension of one head: `(qk [d], vo [d])`.

    Args:
      q, k, v: the head's rows of the Q, K, V projections, each [d, D] (one row per head dim).
      o_t: the head's rows of the output projection [d, D] (= its columns, transposed).
      score: "gm" (default), "l1" or "l2".
      coupling: "coupled" (default: score [Q|K] and [V|O^T]) or an ablation ("q_only", "k_only",
        "proj_only", "average").
    """
    if score not in SCORES:
        raise ValueError(f"score must be one of {sorted(SCORES)}; got {score!r}")
    if coupling not in COUPLINGS:
        raise ValueError(f"coupling must be one of {sorted(COUPLINGS)}; got {coupling!r}")
    if q.shape != k.shape or v.shape != o_t.shape:
        raise ValueError(f"q and k, and v and o_t must have equal shapes; got {q.shape}, {k.shape}, {v.shape}, "
                         f"{o_t.shape}")
    return COUPLINGS[coupling](SCORES[score], q, k, v, o_t)


# ------------------------------------------------------------------------------------------------
# Masks, masked form and folded (pruned) form
# ------------------------------------------------------------------------------------------------


class HeadMasks(NamedTuple):
    """Which head dimensions survive, per layer (True = keep; the official code's True means pruned).

    Attributes:
      qk: L bool arrays [h, q_l]: shared by the Q and K rows of each head (q_l = the layer's stored
        q/k width).
      vo: L bool arrays [h, v_l]: shared by the V rows and the O columns of each head.
    """

    qk: tuple[np.ndarray, ...]
    vo: tuple[np.ndarray, ...]


def keep_count(head_dim: int, sparsity: float) -> int:
    """Dims each head keeps at `sparsity` percent: floor(head_dim * (100 - sparsity) / 100), >= 1.

    Raises:
      ValueError: sparsity outside [0, 100) or leaving no dimension.

    Examples:
      >>> keep_count(64, 90), keep_count(16, 75), keep_count(16, 0)
      (6, 4, 16)
    """
    check_finite("sparsity", sparsity)
    if not 0 <= sparsity < 100:
        raise ValueError(f"sparsity must be a percentage in [0, 100); got {sparsity}")
    keep = int(head_dim * (100.0 - sparsity) / 100.0)
    if keep < 1:
        raise ValueError(f"sparsity {sparsity}% leaves {keep} of head_dim={head_dim} dimensions per head; "
                         "at least one must survive")
    return keep


def _per_layer(name: str, value, num_layers: int) -> list[float]:
    if isinstance(value, (int, float, np.floating, np.integer)):
        return [float(value)] * num_layers
    values = [float(v) for v in value]
    if len(values) != num_layers:
        raise ValueError(f"{name} must be a number or {num_layers} per-layer values; got {len(values)} values")
    return values


def _params(model: ViT) -> dict:
    if not isinstance(model, ViT):
        raise TypeError(f"model must be a models.vit.ViT; got {type(model).__name__}")
    return jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(model, nnx.Param)))


def _build(config: ViTConfig, params: dict) -> ViT:
    """A ViT of `config` holding `params` (a pure dict of arrays)."""
    abstract = nnx.eval_shape(lambda: ViT(config, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(abstract)
    nnx.replace_by_pure_dict(state, jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), params))
    return nnx.merge(graphdef, state)


def _head_rows(attn: dict, h: int) -> tuple[np.ndarray, ...]:
    """Head h's rows of Q, K, V [q|v, D] and of O^T [v, D]."""
    return (attn["wq"][:, h, :].T, attn["wk"][:, h, :].T, attn["wv"][:, h, :].T, attn["wo"][h])


def _prunable_layers(config: ViTConfig, skip_first_block: bool) -> list[int]:
    return [l for l in range(config.num_layers) if not (skip_first_block and l == 0)]


def _top_mask(scores: np.ndarray, keep: int, valid: int) -> np.ndarray:
    """Bool [len(scores)] keeping the `keep` best of the first `valid` entries (ties: lower index)."""
    order = np.argsort(-scores[:valid], kind="stable")[:keep]
    m = np.zeros(scores.shape[0], bool)
    m[order] = True
    return m


def _full_masks(config: ViTConfig) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Masks keeping every used slot of every head."""
    qk, vo = [], []
    for l in range(config.num_layers):
        for widths, out in ((config.layer_qk_dims(l), qk), (config.layer_v_dims(l), vo)):
            out.append(np.arange(max(widths))[None, :] < np.asarray(widths)[:, None])
    return qk, vo


def _uniform_keep(config: ViTConfig, l: int, sparsity: float) -> int:
    keep = keep_count(config.resolved_head_dim, sparsity)
    widths = set(config.layer_qk_dims(l)) | set(config.layer_v_dims(l))
    if max(widths) < keep or min(widths) < keep:
        raise ValueError(f"layer {l} has per-head widths {sorted(widths)} below keep={keep} at sparsity {sparsity}%")
    return keep


def scwp_masks(model: ViT, sparsity: float | Sequence[float] = DEFAULT_SPARSITY, *, score: str = "gm",
               coupling: str = "coupled", skip_first_block: bool = True) -> HeadMasks:
    """ToaSt's SCWP masks: every head keeps its top-`keep` q/k dims and top-`keep` v/o dims.

    Args:
      model: a `models.vit.ViT` (each pruned layer's heads must still have >= keep dims).
      sparsity: percent of each head's dims dropped, one number or one per layer.
      score: "gm" (paper), "l1", "l2".
      coupling: "coupled" (paper), "q_only", "k_only", "proj_only", "average".
      skip_first_block: leave block 0 dense (paper default).

    Returns:
      HeadMasks (Q/K share one mask, V/O another).
    """
    p, cfg = _params(model), model.config
    sp = _per_layer("sparsity", sparsity, cfg.num_layers)
    qk, vo = _full_masks(cfg)
    for l in _prunable_layers(cfg, skip_first_block):
        keep = _uniform_keep(cfg, l, sp[l])
        attn = p["layers"][l]["attn"]
        for h in range(cfg.num_heads):
            q, k, v, o_t = _head_rows(attn, h)
            nq, nv = cfg.layer_qk_dims(l)[h], cfg.layer_v_dims(l)[h]
            qk_imp, vo_imp = head_importance(q[:nq], k[:nq], v[:nv], o_t[:nv], score=score, coupling=coupling)
            qk[l][h] = _top_mask(np.pad(qk_imp, (0, q.shape[0] - nq)), keep, nq)
            vo[l][h] = _top_mask(np.pad(vo_imp, (0, v.shape[0] - nv)), keep, nv)
    return HeadMasks(tuple(qk), tuple(vo))


def magnitude_masks(model: ViT, sparsity: float | Sequence[float] = DEFAULT_SPARSITY, *, per_head: bool = True,
                    skip_first_block: bool = True) -> HeadMasks:
    """Magnitude baseline: L1 norm of the coupled rows ([Q|K], [V|O^T]).

    `per_head=True` keeps `keep` dims in every head (same structure as SCWP); `per_head=False`
    keeps the layer's `h * keep` best dims by one ranking across its heads (ragged widths, same
    MACs). Arguments as in `scwp_masks`.
    """
    if per_head:
        return scwp_masks(model, sparsity, score="l1", coupling="coupled", skip_first_block=skip_first_block)
    p, cfg = _params(model), model.config
    sp = _per_layer("sparsity", sparsity, cfg.num_layers)
    qk, vo = _full_masks(cfg)
    for l in _prunable_layers(cfg, skip_first_block):
        keep = _uniform_keep(cfg, l, sp[l])
        attn = p["layers"][l]["attn"]
        for masks, widths, pair in ((qk, cfg.layer_qk_dims(l), ("wq", "wk")), (vo, cfg.layer_v_dims(l), None)):
            if pair is not None:
                s = np.abs(attn["wq"]).sum(0) + np.abs(attn["wk"]).sum(0)  # [h, q]
            else:
                s = np.abs(attn["wv"]).sum(0) + np.abs(attn["wo"]).sum(2)  # [h, v]
            s = np.where(masks[l], s, -np.inf)
            flat = _top_mask(s.reshape(-1), keep * cfg.num_heads, s.size)
            masks[l] = flat.reshape(s.shape) & masks[l]
    return HeadMasks(tuple(qk), tuple(vo))


def random_masks(config: ViTConfig, key: jax.Array, sparsity: float | Sequence[float] = DEFAULT_SPARSITY, *,
                 skip_first_block: bool = True) -> HeadMasks:
    """Random baseline: `keep` uniformly random coupled q/k dims and v/o dims per head."""
    sp = _per_layer("sparsity", sparsity, config.num_layers)
    qk, vo = _full_masks(config)
    for l in _prunable_layers(config, skip_first_block):
        keep = _uniform_keep(config, l, sp[l])
        for i, (masks, widths) in enumerate(((qk, config.layer_qk_dims(l)), (vo, config.layer_v_dims(l)))):
            for h, w in enumerate(widths):
                u = np.asarray(jax.random.uniform(jax.random.fold_in(key, (l * 2 + i) * 4096 + h), (w,)))
                masks[l][h] = _top_mask(np.pad(u, (0, masks[l].shape[1] - w)), keep, w)
    return HeadMasks(tuple(qk), tuple(vo))


def _check_masks(config: ViTConfig, masks: HeadMasks) -> None:
    if not isinstance(masks, HeadMasks):
        raise TypeError(f"masks must be HeadMasks; got {type(masks).__name__}")
    full_qk, full_vo = _full_masks(config)
    for name, ms, full in (("masks.qk", masks.qk, full_qk), ("masks.vo", masks.vo, full_vo)):
        if len(ms) != config.num_layers:
            raise ValueError(f"{name} must have num_layers={config.num_layers} entries; got {len(ms)}")
        for l, (m, f) in enumerate(zip(ms, full)):
            if np.shape(m) != f.shape:
                raise ValueError(f"{name}[{l}] must have shape {f.shape} (heads, stored width); got {np.shape(m)}")
            if np.any(np.asarray(m, bool) & ~f):
                raise ValueError(f"{name}[{l}] keeps slots beyond a head's width {f.sum(1).tolist()}")


def mask_attention(model: ViT, masks: HeadMasks) -> ViT:
    """The masked form: same shapes, dropped Q/K rows, V rows and O columns (and their biases) zeroed.

    Re-applying the masks to a masked model changes nothing (the official `reapply_masks`).
    """
    cfg = model.config
    _check_masks(cfg, masks)
    p = _params(model)
    for l in range(cfg.num_layers):
        a = p["layers"][l]["attn"]
        mq, mv = np.asarray(masks.qk[l], np.float32), np.asarray(masks.vo[l], np.float32)
        a["wq"], a["wk"] = a["wq"] * mq, a["wk"] * mq
        a["bq"], a["bk"] = a["bq"] * mq, a["bk"] * mq
        a["wv"], a["bv"] = a["wv"] * mv, a["bv"] * mv
        a["wo"] = a["wo"] * mv[:, :, None]
    return _build(cfg, p)


def prune_attention(model: ViT, masks: HeadMasks) -> ViT:
    """The folded form: a ViT whose heads store only their kept dims (`ViTConfig.qk_dims` / `v_dims`).

    Head h of layer l keeps `masks.qk[l][h].sum()` q/k dims and `masks.vo[l][h].sum()` v/o dims, in
    their original order. It computes exactly what `mask_attention(model, masks)` computes.
    """
    cfg = model.config
    _check_masks(cfg, masks)
    p = _params(model)
    qk_dims, v_dims = [], []
    for l in range(cfg.num_layers):
        a = p["layers"][l]["attn"]
        mq, mv = np.asarray(masks.qk[l], bool), np.asarray(masks.vo[l], bool)
        wq_, wv_ = mq.sum(1), mv.sum(1)
        q_w, v_w = int(wq_.max()), int(wv_.max())
        new = {"wq": np.zeros(a["wq"].shape[:2] + (q_w,), np.float32), "wk": None, "bq": None, "bk": None,
               "wv": np.zeros(a["wv"].shape[:2] + (v_w,), np.float32), "bv": None, "wo": None}
        new["wk"] = np.zeros_like(new["wq"])
        new["bq"], new["bk"] = np.zeros((cfg.num_heads, q_w), np.float32), np.zeros((cfg.num_heads, q_w), np.float32)
        new["bv"] = np.zeros((cfg.num_heads, v_w), np.float32)
        new["wo"] = np.zeros((cfg.num_heads, v_w, cfg.d_model), np.float32)
        for h in range(cfg.num_heads):
            iq, iv = np.flatnonzero(mq[h]), np.flatnonzero(mv[h])
            new["wq"][:, h, :iq.size], new["wk"][:, h, :iq.size] = a["wq"][:, h, iq], a["wk"][:, h, iq]
            new["bq"][h, :iq.size], new["bk"][h, :iq.size] = a["bq"][h, iq], a["bk"][h, iq]
            new["wv"][:, h, :iv.size], new["bv"][h, :iv.size] = a["wv"][:, h, iv], a["bv"][h, iv]
            new["wo"][h, :iv.size] = a["wo"][h, iv]
        a.update(new)
        qk_dims.append(tuple(int(w) for w in wq_))
        v_dims.append(tuple(int(w) for w in wv_))
    return _build(dataclasses.replace(cfg, qk_dims=tuple(qk_dims), v_dims=tuple(v_dims)), p)


def scwp(model: ViT, sparsity: float | Sequence[float] = DEFAULT_SPARSITY, *, score: str = "gm",
         coupling: str = "coupled", skip_first_block: bool = True) -> tuple[ViT, HeadMasks]:
    """SCWP in one call: `(prune_attention(model, masks), masks)` with `masks = scwp_masks(...)`."""
    masks = scwp_masks(model, sparsity, score=score, coupling=coupling, skip_first_block=skip_first_block)
    return prune_attention(model, masks), masks


# ------------------------------------------------------------------------------------------------
# Token Channel Selection
# ------------------------------------------------------------------------------------------------


def _check_ratios(name: str, ratios) -> tuple[float, ...]:
    if not isinstance(ratios, (tuple, list)):
        raise TypeError(f"TCSConfig.{name} must be a tuple of per-layer ratios; got {type(ratios).__name__}")
    for r in ratios:
        check_finite(f"TCSConfig.{name}", r)
        if not 0.0 <= r < 1.0:
            raise ValueError(f"TCSConfig.{name} entries must lie in [0, 1); got {tuple(ratios)}")
    if ratios and ratios[0] != 0.0:
        raise ValueError(f"TCSConfig.{name}[0] must be 0: block 0 is never selected (as in ToaSt); got {ratios[0]}")
    return tuple(float(r) for r in ratios)


@dataclasses.dataclass(frozen=True, kw_only=True)
class TCSConfig:
    """Token Channel Selection settings.

    Attributes:
      fc1_ratios: per layer, the fraction r1 of residual channels dropped before fc1 (and from the
        residual stream), in [0, 1); entry 0 must be 0.
      fc2_ratios: per layer, the fraction r2 of hidden units dropped before fc2.
      cls_weight: lambda, the class token's weight (2.0).
      sample_ratio: rho, the fraction of patch tokens sampled with replacement (0.02 for ViT); a
        sample of >= P tokens uses every patch (deterministic).
      per_example: one selection per image instead of one per batch [inferred option].
    """

    fc1_ratios: tuple[float, ...]
    fc2_ratios: tuple[float, ...]
    cls_weight: float = DEFAULT_CLS_WEIGHT
    sample_ratio: float = DEFAULT_SAMPLE_RATIO
    per_example: bool = False

    def __post_init__(self):
        object.__setattr__(self, "fc1_ratios", _check_ratios("fc1_ratios", self.fc1_ratios))
        object.__setattr__(self, "fc2_ratios", _check_ratios("fc2_ratios", self.fc2_ratios))
        if len(self.fc1_ratios) != len(self.fc2_ratios):
            raise ValueError(f"TCSConfig.fc1_ratios and fc2_ratios must have one entry per layer; got "
                             f"{len(self.fc1_ratios)} and {len(self.fc2_ratios)}")
        check_finite("TCSConfig.cls_weight", self.cls_weight)
        check_finite("TCSConfig.sample_ratio", self.sample_ratio)
        if self.cls_weight < 0:
            raise ValueError(f"TCSConfig.cls_weight must be >= 0; got {self.cls_weight}")
        if self.sample_ratio <= 0:
            raise ValueError(f"TCSConfig.sample_ratio must be > 0; got {self.sample_ratio}")

    @classmethod
    def uniform(cls, num_layers: int, *, fc1: float = 0.0, fc2: float = 0.0, layers: Sequence[int] | None = None,
                **kwargs) -> "TCSConfig":
        """The same (fc1, fc2) ratios on `layers` (default: every block but block 0), 0 elsewhere."""
        layers = range(1, num_layers) if layers is None else layers
        r1 = tuple(fc1 if l in layers else 0.0 for l in range(num_layers))
        r2 = tuple(fc2 if l in layers else 0.0 for l in range(num_layers))
        return cls(fc1_ratios=r1, fc2_ratios=r2, **kwargs)

    def check(self, config: ViTConfig) -> None:
        if len(self.fc1_ratios) != config.num_layers:
            raise ValueError(f"TCSConfig has {len(self.fc1_ratios)} per-layer ratios; the model has "
                             f"num_layers={config.num_layers}")


def kept_channels(num_channels: int, ratio: float) -> int:
    """Channels TCS keeps: min(max(1, floor(C (1 - ratio))), C).

    Examples:
      >>> kept_channels(64, 0.3), kept_channels(64, 0.0), kept_channels(4, 0.99)
      (44, 64, 1)
    """
    return min(max(1, int(num_channels * (1.0 - ratio))), num_channels)


def channel_importance(tokens: jax.Array, attn_row: jax.Array | None, key: jax.Array, *,
                       cls_weight: float = DEFAULT_CLS_WEIGHT, sample_ratio: float = DEFAULT_SAMPLE_RATIO,
                       has_cls: bool = True, per_example: bool = False) -> jax.Array:
    """TCS channel importance of `tokens` [b, n, C]: [C] (or [b, C] with `per_example`).

    Args:
      tokens: activations, class token at index 0 when `has_cls`.
      attn_row: [b, n] head-averaged class-token attention (None: patches weighted uniformly).
      key: PRNG key of the patch sample.
      cls_weight, sample_ratio: lambda and rho (see the module docstring).
      has_cls: False for a ViT without class token: magnitude over the sampled tokens [inferred].
      per_example: score each image separately [inferred].
    """
    if tokens.ndim != 3:
        raise ValueError(f"tokens must be [b, n, C]; got shape {tokens.shape}")
    b, n, C = tokens.shape
    if attn_row is not None and attn_row.shape != (b, n):
        raise ValueError(f"attn_row must have shape [b={b}, n={n}]; got {attn_row.shape}")
    x = jnp.abs(tokens.astype(jnp.float32))
    first = 1 if has_cls else 0
    num_patches = n - first
    if num_patches == 0:
        return cls_weight * (x[:, 0] if per_example else x[:, 0].mean(0))
    num_samples = max(1, int(num_patches * sample_ratio))
    if num_samples < num_patches:
        idx = jax.random.randint(key, (num_samples,), first, n)  # with replacement, as torch.randint
    else:
        idx = jnp.arange(first, n)
    patches = x[:, idx]  # [b, s, C]
    if attn_row is not None and has_cls:
        a = attn_row[:, idx].astype(jnp.float32)  # [b, s]
        if not per_example:
            a = jnp.broadcast_to(a.mean(0, keepdims=True), a.shape)
        patches = patches * a[:, :, None]
    patch_imp = patches.mean(axis=1) if per_example else patches.mean(axis=(0, 1))
    if not has_cls:
        return patch_imp
    cls_imp = cls_weight * (x[:, 0] if per_example else x[:, 0].mean(0))
    total = 1.0 + num_patches
    return cls_imp / total + patch_imp * (num_patches / total)


def select_channels(tokens: jax.Array, attn_row: jax.Array | None, key: jax.Array, *, ratio: float,
                    cls_weight: float = DEFAULT_CLS_WEIGHT, sample_ratio: float = DEFAULT_SAMPLE_RATIO,
                    has_cls: bool = True, per_example: bool = False) -> jax.Array:
    """The TCS keep-mask of `tokens` [b, n, C]: float [C] (or [b, C]) with `kept_channels(C, ratio)` ones."""
    imp = channel_importance(tokens, attn_row, key, cls_weight=cls_weight, sample_ratio=sample_ratio,
                             has_cls=has_cls, per_example=per_example)
    C = tokens.shape[-1]
    keep = kept_channels(C, ratio)
    _, idx = jax.lax.top_k(imp, keep)
    onehot = jax.nn.one_hot(idx, C, dtype=jnp.float32)  # [.., keep, C]
    return onehot.sum(axis=-2)


def tcs_hook(config: TCSConfig, key: jax.Array, *, has_cls: bool = True) -> FFNHook:
    """The `ffn_hook` of `models.vit.ViT` that runs TCS with `config`.

    Layer l's selection at site "fc1" / "fc2" draws its patch sample from `fold_in(key, 2 l + site)`.
    Ratio 0 still computes the (all-ones) mask, so keeping every channel is exactly the identity.
    """

    def hook(layer: int, site: str, x: jax.Array, attn_row: jax.Array | None):
        if layer >= len(config.fc1_ratios):
            raise ValueError(f"TCSConfig has {len(config.fc1_ratios)} per-layer ratios; the model has more layers")
        if layer == 0:
            return None
        ratio = config.fc1_ratios[layer] if site == "fc1" else config.fc2_ratios[layer]
        k = jax.random.fold_in(key, 2 * layer + (site == "fc2"))
        return select_channels(x, attn_row, k, ratio=ratio, cls_weight=config.cls_weight,
                               sample_ratio=config.sample_ratio, has_cls=has_cls, per_example=config.per_example)

    return hook


def tcs_loss(config: TCSConfig, *, has_cls: bool = True) -> Callable:
    """`classification_loss` with TCS active; the patch sample key is `key(batch["tcs_seed"])` (default 0)."""

    def loss_fn(model: ViT, batch: Mapping[str, jax.Array]):
        seed = batch.get("tcs_seed", 0)
        key = jax.random.key(jnp.asarray(seed, jnp.uint32))
        return classification_loss(model, batch, ffn_hook=tcs_hook(config, key, has_cls=has_cls))

    return loss_fn


# ------------------------------------------------------------------------------------------------
# FLOPs
# ------------------------------------------------------------------------------------------------


class MACs(NamedTuple):
    """Multiply-accumulates of one forward pass of one image (FLOPs ~= 2 x MACs).

    Attributes:
      patch_embed: the patch projection.
      attention: per layer: q/k/v/o projections and the two attention matmuls.
      ffn: per layer: fc1 and fc2.
      head: the classifier.
    """

    patch_embed: int
    attention: tuple[int, ...]
    ffn: tuple[int, ...]
    head: int

    @property
    def total(self) -> int:
        return self.patch_embed + sum(self.attention) + sum(self.ffn) + self.head


def count_macs(config: ViTConfig, *, tcs: TCSConfig | None = None,
               tokens_after: Sequence[int | None] | None = None) -> MACs:
    """Exact matmul MACs per image of a (pruned) ViT, with TCS ratios and token pruning.

    Args:
      config: the model's config (its per-head widths and FFN widths are counted as stored
        *used* widths, i.e. the folded model's true sizes).
      tcs: TCS ratios: the FFN of layer l costs `n kept(D, r1) f + n kept(f, r2) D`.
      tokens_after: per layer, the number of tokens kept after that layer's attention (token
        pruning; class token included), or None for no pruning there.

    Returns:
      MACs.
    """
    c = config
    D, L = c.d_model, c.num_layers
    if tcs is not None:
        tcs.check(c)
    if tokens_after is not None and len(tokens_after) != L:
        raise ValueError(f"tokens_after must have num_layers={L} entries; got {len(tokens_after)}")
    n = c.num_tokens
    attention, ffn = [], []
    for l in range(L):
        sq, sv = sum(c.layer_qk_dims(l)), sum(c.layer_v_dims(l))
        attention.append(2 * n * D * sq + 2 * n * D * sv + n * n * (sq + sv))
        if tokens_after is not None and tokens_after[l] is not None:
            check_int(f"tokens_after[{l}]", tokens_after[l])
            if not 1 <= tokens_after[l] <= n:
                raise ValueError(f"tokens_after[{l}] must lie in [1, {n}] tokens; got {tokens_after[l]}")
            n = tokens_after[l]
        f = c.layer_d_ff(l)
        k1 = D if tcs is None or l == 0 else kept_channels(D, tcs.fc1_ratios[l])
        k2 = f if tcs is None or l == 0 else kept_channels(f, tcs.fc2_ratios[l])
        ffn.append(n * k1 * f + n * k2 * D)
    return MACs(patch_embed=c.num_patches * c.patch_size ** 2 * c.channels * D, attention=tuple(attention),
                ffn=tuple(ffn), head=D * c.num_classes)


# ------------------------------------------------------------------------------------------------
# Baselines
# ------------------------------------------------------------------------------------------------


def prune_ffn(model: ViT, keep: Sequence[np.ndarray | None]) -> ViT:
    """Static FFN pruning: layer l keeps the hidden units `keep[l]` (bool [f_l]; None = all)."""
    cfg = model.config
    if len(keep) != cfg.num_layers:
        raise ValueError(f"keep must have num_layers={cfg.num_layers} entries; got {len(keep)}")
    p = _params(model)
    widths = []
    for l, m in enumerate(keep):
        f = cfg.layer_d_ff(l)
        if m is None:
            widths.append(f)
            continue
        m = np.asarray(m, bool)
        if m.shape != (f,) or not m.any():
            raise ValueError(f"keep[{l}] must be a bool [{f}] mask keeping at least one unit; got shape {m.shape}, "
                             f"{int(m.sum())} kept")
        blk = p["layers"][l]
        blk["w1"], blk["b1"], blk["w2"] = blk["w1"][:, m], blk["b1"][m], blk["w2"][m]
        widths.append(int(m.sum()))
    return _build(dataclasses.replace(cfg, d_ffs=tuple(widths)), p)


def ffn_widths_matching(config: ViTConfig, tcs: TCSConfig) -> tuple[int, ...]:
    """Per-layer static FFN widths f' whose MACs (2 n D f') are nearest to TCS's (n kept1 f + n kept2 D)."""
    tcs.check(config)
    D, out = config.d_model, []
    for l in range(config.num_layers):
        f = config.layer_d_ff(l)
        if l == 0:
            out.append(f)
            continue
        target = kept_channels(D, tcs.fc1_ratios[l]) * f + kept_channels(f, tcs.fc2_ratios[l]) * D
        out.append(int(min(max(1, round(target / (2 * D))), f)))
    return tuple(out)


def magnitude_ffn_keep(model: ViT, widths: Sequence[int]) -> list[np.ndarray | None]:
    """Keep the `widths[l]` hidden units with the largest `|fc1[:, j]|_1 + |fc2[j, :]|_1`."""
    p, cfg = _params(model), model.config
    if len(widths) != cfg.num_layers:
        raise ValueError(f"widths must have num_layers={cfg.num_layers} entries; got {len(widths)}")
    out = []
    for l, w in enumerate(widths):
        blk = p["layers"][l]
        s = np.abs(blk["w1"]).sum(0) + np.abs(blk["w2"]).sum(1)
        out.append(None if w >= s.size else _top_mask(s, w, s.size))
    return out


def random_ffn_keep(config: ViTConfig, widths: Sequence[int], key: jax.Array) -> list[np.ndarray | None]:
    """Keep `widths[l]` uniformly random hidden units per layer."""
    if len(widths) != config.num_layers:
        raise ValueError(f"widths must have num_layers={config.num_layers} entries; got {len(widths)}")
    out = []
    for l, w in enumerate(widths):
        f = config.layer_d_ff(l)
        u = np.asarray(jax.random.uniform(jax.random.fold_in(key, l), (f,)))
        out.append(None if w >= f else _top_mask(u, w, f))
    return out


def magnitude_prune(model: ViT, sparsity: float | Sequence[float] = DEFAULT_SPARSITY, *,
                    ffn_widths: Sequence[int] | None = None, per_head: bool = True,
                    skip_first_block: bool = True) -> ViT:
    """Magnitude baseline: L1 head-dim pruning (`magnitude_masks`) + static L1 FFN pruning to `ffn_widths`."""
    model = prune_attention(model, magnitude_masks(model, sparsity, per_head=per_head,
                                                   skip_first_block=skip_first_block))
    if ffn_widths is not None:
        model = prune_ffn(model, magnitude_ffn_keep(model, ffn_widths))
    return model


def random_prune(model: ViT, key: jax.Array, sparsity: float | Sequence[float] = DEFAULT_SPARSITY, *,
                 ffn_widths: Sequence[int] | None = None, skip_first_block: bool = True) -> ViT:
    """Random baseline: random coupled head dims + random FFN hidden units at `ffn_widths`."""
    k1, k2 = jax.random.split(key)
    model = prune_attention(model, random_masks(model.config, k1, sparsity, skip_first_block=skip_first_block))
    if ffn_widths is not None:
        model = prune_ffn(model, random_ffn_keep(model.config, ffn_widths, k2))
    return model


def token_pruning_hook(tokens_after: Sequence[int | None], *, has_cls: bool = True) -> TokenHook:
    """EViT-style token pruning: after layer l's attention keep `tokens_after[l]` tokens (None = all).

    The class token is always kept (first); the other tokens are the top ones by the layer's
    attention row (class-token attention, or attention received without a class token), in their
    original order.
    """

    def hook(layer: int, x: jax.Array, attn_row: jax.Array) -> jax.Array:
        b, n, _ = x.shape
        k = tokens_after[layer] if layer < len(tokens_after) else None
        if k is None or k >= n:
            return jnp.broadcast_to(jnp.arange(n), (b, n))
        if k < 1 + has_cls:
            raise ValueError(f"tokens_after[{layer}] must keep at least {1 + has_cls} tokens; got {k}")
        first = 1 if has_cls else 0
        _, idx = jax.lax.top_k(attn_row[:, first:], k - first)
        idx = jnp.sort(idx, axis=-1) + first
        if has_cls:
            idx = jnp.concatenate([jnp.zeros((b, 1), idx.dtype), idx], axis=1)
        return idx

    return hook


def match_token_keep(config: ViTConfig, target_macs: int, *, layer: int) -> tuple[int | None, ...]:
    """`tokens_after` pruning once after `layer` to the k tokens whose total MACs are nearest `target_macs`."""
    check_int("layer", layer)
    if not 0 <= layer < config.num_layers:
        raise ValueError(f"layer must lie in [0, num_layers={config.num_layers}); got {layer}")
    lo = 2 if config.pooling == "cls" else 1
    best = None
    for k in range(lo, config.num_tokens + 1):
        plan = tuple(k if l == layer else None for l in range(config.num_layers))
        err = abs(count_macs(config, tokens_after=plan).total - target_macs)
        if best is None or err < best[0]:
            best = (err, plan)
    return best[1]


# ------------------------------------------------------------------------------------------------
# Fine-tuning and evaluation
# ------------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=32)
def _cached_train_step(graphdef, optimizer_config: OptimizerConfig, tcs: TCSConfig | None,
                       tokens_after: tuple | None, has_cls: bool):
    """(optimizer, jitted train step) of `fit` for one (structure, optimizer, loss): compiled once per process
    and reused by every fine-tuning of a model with that structure (a new `fit` call builds a new step)."""
    optimizer = make_optimizer(optimizer_config)
    return optimizer, make_train_step(graphdef, optimizer, loss_fn=_finetune_loss(tcs, tokens_after, has_cls),
                                      schedule=optimizer_config.schedule())


def _finetune_loss(tcs: TCSConfig | None, tokens_after: tuple | None, has_cls: bool):
    """The fine-tuning loss: TCS-pruned FFNs, token pruning after the given blocks, or the plain loss."""
    if tcs is not None:
        return tcs_loss(tcs, has_cls=has_cls)
    if tokens_after is not None:
        return functools.partial(classification_loss, token_hook=token_pruning_hook(tokens_after, has_cls=has_cls))
    return classification_loss


def _finetune_no_checkpoint(model: ViT, batch_fn, num_steps: int, optimizer_config: OptimizerConfig,
                            tcs: TCSConfig | None, tokens_after: tuple | None, log_every: int,
                            progress: bool) -> FitResult:
    """`fit` without a workdir, with the train step cached by structure: the same initial state (the model's
    parameters, `optimizer.init`, step 0), the same jitted step and data stream, the same history rows."""
    graphdef, params, *rest = nnx.split(model, nnx.Param, ...)
    if rest and jax.tree.leaves(rest):
        raise ValueError("finetune supports models whose state is only nnx.Param")
    optimizer, train_step = _cached_train_step(graphdef, optimizer_config, tcs, tokens_after,
                                               model.config.pooling == "cls")
    params = jax.tree.map(lambda a: jnp.array(a, copy=True), nnx.to_pure_dict(params))  # the step donates its state
    state = TrainState(jnp.zeros((), jnp.int32), params, optimizer.init(params))
    clock = {"t": None, "examples": 0}

    def step_fn(state, position):
        if clock["t"] is None:
            clock["t"] = time.perf_counter()
        batch = {k: np.asarray(v) for k, v in batch_fn(position).items()}
        clock["examples"] += len(next(iter(batch.values())))
        return train_step(state, batch)

    def row_fn(done, metrics):
        now = time.perf_counter()
        row = dict(metrics, step=done, examples_per_s=clock["examples"] / max(now - clock["t"], 1e-9))
        clock["t"], clock["examples"] = now, 0
        return row

    out = run_loop(step_fn, state, num_steps=num_steps, log_every=log_every, row_fn=row_fn, progress=progress,
                   desc="finetune", postfix=lambda row: {"loss": f"{row['loss']:.4f}"})
    return FitResult(graphdef, out.state, out.history, out.resumed_from)


def finetune(model: ViT, *, batch_fn: Callable[[int], Mapping[str, np.ndarray]], num_steps: int,
             optimizer_config: OptimizerConfig, tcs: TCSConfig | None = None,
             tokens_after: Sequence[int | None] | None = None,
             workdir: str | os.PathLike | None = None, log_every: int = 50, progress: bool = False,
             fingerprint: str | None = None) -> tuple[ViT, FitResult]:
    """Fine-tunes a (pruned) ViT from its current weights through `algorithms.training.fit`.

    The pruned structure is the model's shape, so it is kept without re-applying masks. With `tcs`,
    the loss runs TCS with a fresh patch sample per step (`tcs_seed` = the data position). Without a
    `workdir` the run is `fit`'s without checkpoints, its jitted train step cached per (structure,
    optimizer config, loss): fine-tuning several models of one structure compiles once.

    Args:
      model: the model to start from.
      batch_fn: `position -> {"image": [b, H, W, c], "label": [b]}` numpy batches.
      num_steps, optimizer_config, workdir, log_every, progress, fingerprint: as in `fit`.
      tcs: run TCS inside the training forward passes.
      tokens_after: run EViT-style token pruning (`token_pruning_hook`) inside the training forward
        passes (not with `tcs`).

    Returns:
      (fine-tuned ViT, FitResult).
    """
    if tcs is not None and tokens_after is not None:
        raise ValueError(f"finetune takes tcs or tokens_after, not both; got tcs={tcs}, tokens_after={tokens_after}")
    graphdef, state = nnx.split(model)
    has_cls = model.config.pooling == "cls"
    if tcs is not None:
        tcs.check(model.config)
        inner = batch_fn

        def batch_fn(position):  # noqa: F811  (wraps the caller's stream with the TCS seed)
            return dict(inner(position), tcs_seed=np.uint32(position))

    tokens_after = None if tokens_after is None else tuple(tokens_after)
    if workdir is None:
        if num_steps < 1:
            raise ValueError(f"num_steps must be >= 1; got {num_steps}")
        result = _finetune_no_checkpoint(model, batch_fn, num_steps, optimizer_config, tcs, tokens_after,
                                         log_every, progress)
        return result.model(), result
    loss_fn = _finetune_loss(tcs, tokens_after, has_cls)
    result = fit(model_fn=lambda rngs: nnx.merge(graphdef, state), optimizer_config=optimizer_config,
                 batch_fn=batch_fn, num_steps=num_steps, workdir=workdir, loss_fn=loss_fn, log_every=log_every,
                 progress=progress, desc="finetune", fingerprint=fingerprint)
    return result.model(), result


@functools.lru_cache(maxsize=32)
def _eval_fn(graphdef, tcs: TCSConfig | None, tokens_after: tuple | None, has_cls: bool):
    def logits(state, images, key):
        model = nnx.merge(graphdef, state)
        hook = None if tcs is None else tcs_hook(tcs, key, has_cls=has_cls)
        thook = None if tokens_after is None else token_pruning_hook(tokens_after, has_cls=has_cls)
        return model(images, ffn_hook=hook, token_hook=thook).logits

    return jax.jit(logits)


def evaluate(model: ViT, images: np.ndarray, labels: np.ndarray, *, batch_size: int = 256,
             tcs: TCSConfig | None = None, tokens_after: Sequence[int | None] | None = None,
             key: jax.Array | None = None) -> float:
    """Top-1 accuracy of `model` on `images` [N, H, W, c] / `labels` [N], optionally with TCS or token pruning.

    TCS batches draw their patch samples from `fold_in(key, batch index)` (key default `key(0)`).
    """
    images, labels = np.asarray(images), np.asarray(labels)
    if images.shape[0] != labels.shape[0]:
        raise ValueError(f"images and labels must have the same length; got {images.shape[0]} and {labels.shape[0]}")
    check_int("batch_size", batch_size)
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1; got {batch_size}")
    if tcs is not None:
        tcs.check(model.config)
    key = jax.random.key(0) if key is None else key
    graphdef, state = nnx.split(model)
    fn = _eval_fn(graphdef, tcs, None if tokens_after is None else tuple(tokens_after),
                  model.config.pooling == "cls")
    correct = 0
    for i, start in enumerate(range(0, images.shape[0], batch_size)):
        x = jnp.asarray(images[start:start + batch_size], jnp.float32)
        pred = np.asarray(jnp.argmax(fn(state, x, jax.random.fold_in(key, i)), -1))
        correct += int((pred == labels[start:start + batch_size]).sum())
    return correct / max(images.shape[0], 1)
