"""E2I-VRWKV on procedural light fields: does EPI geometry injected into a linear Vision-RWKV help
segmentation, does each block contribute, and does the cost stay linear in the image size?

Claim checked (E2I-VRWKV, ICML 2026; spec papers/specs/vision_weights_envs.md section 2; the paper's text
and code were not available, so the light-field blocks are the spec's [INFER] reconstruction, see
`algorithms.vision.e2i_vrwkv`): an EPI geometric prior generator, epipolar-aware cross-modal attention
(LF-ECMA) and a geometric-context gate on a Vision-RWKV backbone improve light-field semantic
segmentation (86.55 % mIoU on UrbanLF-Real) while keeping linear complexity.

Dimension legend: ``S`` seeds, ``T`` tokens (patches of the centre view).

Setup (CPU scale, nothing downloaded; spec (d)):

  1. Data: `experiments.tasks.light_fields`: layered Lambertian scenes rendered to views x views
     sub-aperture images (3 x 3 of 32 x 32 in the quick preset), 4 classes, two of which ("near object",
     "far object") share shape and texture distributions and differ only in disparity (+1/+2 vs -1 px
     per view): appearance alone cannot separate them, parallax can. Train and test scenes come from
     disjoint seeds; the same data for every model and seed.
  2. Models (all with the same patch size, light per-token linear head and training budget):
     ``full`` = E2I-VRWKV (all blocks on); ``no_prior``, ``no_ecma`` (naive fusion instead of LF-ECMA),
     ``no_gate`` = one block off each; ``plain`` = `models.vrwkv.VRWKVSegmenter` on the centre view
     (the model with every light-field block off); ``vit`` = the attention baseline,
     `algorithms.vision.e2i_vrwkv.AttentionSegmenter` (a `models.vit.ViT` as the token mixer) on the
     centre view, at a parameter count between the plain and the full model.
  3. Training: AdamW, warmup + cosine, per-pixel cross-entropy, ``train.steps`` steps of ``train.batch_size``
     scenes; seeds vary the initialisation and batch order. Metric: mIoU over the 4 classes on the
     centre view of the test scenes (and per-class IoU).
  4. Cost: modeled forward FLOPs (`pallas_kernels.wkv.cost.bi_wkv_cost` for every Bi-WKV,
     `pallas_kernels.flash_attention.cost.flash_cost` for attention, 2 x fan_in x fan_out per token for
     every linear map) and the measured wall time of one jitted forward pass (batch ``cost.timing_batch``,
     best of ``cost.timing_repeats``) at image sides ``cost.sizes`` (T = 64, 256, 1024 patches).

Checks (thresholds fixed before the run). For variants A, B with per-seed mIoU differences d_s
(paired by seed), d = mean_s d_s, SE = std(d_s, ddof=1) / sqrt(S); "A above B by more than seed noise"
passes when d > max(2 SE, ``checks.min_gain``):

  * required: full above plain VRWKV (the abstract's headline: the LF additions help);
  * required: full above each single-block ablation (no_prior, no_ecma, no_gate): "each block
    contributes" (the abstract lists the three blocks as the contributions);
  * required: linear cost: the log-log slope of the full model's modeled FLOPs vs T over ``cost.sizes``
    is <= 1.1, while the attention baseline's token mixer (attention alone) has slope >= 1.9 (a
    consistency check of the cost models: linear vs quadratic, as the claim states);
  * not required: the measured forward-time slope of the full model below the ViT's (wall time on a
    shared 2-core CPU is noisy and includes per-op overheads; ratios from one run); full above the ViT
    segmenter (same rule; the paper compares against other LF models, not this baseline).

Cause classes when not reproduced (decided before the run): "scale" when the full model is above the
plain one but some difference stays within noise (few seeds, ~10^4-parameter models, a few hundred
steps), "spec" when an ablation is significantly above the full model (the reconstruction of the
block hurts), "bug" for a failed cost check.

    python -m experiments run e2i_vrwkv --preset smoke   # seconds, used by the tests
    python -m experiments run e2i_vrwkv --preset quick   # 2 CPU cores, a few minutes
    python -m experiments run e2i_vrwkv --preset smoke --train.steps 5   # one field of a config section

Config sections (`run e2i_vrwkv --help` lists every field): data, model, vit, train, checks, cost; seeds and
variants are top-level.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from etils import epath
from flax import nnx

from algorithms.vision import e2i_vrwkv as e2i
from experiments import _plotting as plotting
from experiments import registry, report
from experiments._cache import cached
from experiments.checks import Check, verdict
from experiments.tasks import light_fields as lf
from models import vit as vit_lib
from models import vrwkv as vr
from pallas_kernels.flash_attention.cost import flash_cost
from pallas_kernels.wkv.cost import bi_wkv_cost

VARIANTS = ("full", "no_prior", "no_ecma", "no_gate", "plain", "vit")
ABLATIONS = ("no_prior", "no_ecma", "no_gate")
LABELS = {"full": "E2I-VRWKV (full)", "no_prior": "w/o EPI prior", "no_ecma": "w/o LF-ECMA (naive fusion)",
          "no_gate": "w/o GC-Gate", "plain": "plain VRWKV (centre view)", "vit": "ViT segmenter (centre view)"}
SWITCHES = {"full": {}, "no_prior": {"epi_prior": False}, "no_ecma": {"ecma": False}, "no_gate": {"gate": False}}


@dataclasses.dataclass(frozen=True, kw_only=True)
class DataSection:
    """The procedural light fields: views x views sub-aperture images per scene (``--data.num-train 512``)."""

    image_size: int = 32
    views: int = 3
    num_train: int = 1024
    num_test: int = 256
    seed: int = 0


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelSection:
    """The VRWKV backbone and the light-field blocks (``--model.d-model 64``); `patch_size` is shared with the ViT."""

    patch_size: int = 4
    d_model: int = 32
    num_layers: int = 2
    prior_dim: int = 8


@dataclasses.dataclass(frozen=True, kw_only=True)
class VitSection:
    """The attention baseline's ViT token mixer (``--vit.num-heads 2``)."""

    d_model: int = 40
    num_heads: int = 4
    num_layers: int = 2


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainSection:
    """AdamW with warmup + cosine, the same budget for every variant and seed (``--train.steps 100``)."""

    steps: int = 300
    batch_size: int = 16
    learning_rate: float = 3e-3
    weight_decay: float = 1e-4


@dataclasses.dataclass(frozen=True, kw_only=True)
class ChecksSection:
    """The paired-seed comparisons (``--checks.min-gain 0.02``)."""

    min_gain: float = 0.01  # mIoU a "more than seed noise" gain must also exceed


@dataclasses.dataclass(frozen=True, kw_only=True)
class CostSection:
    """Modeled FLOPs and measured forward time at several image sides (``--cost.sizes 32 64``)."""

    sizes: tuple[int, ...] = (32, 64, 128)
    timing_batch: int = 4
    timing_repeats: int = 3
    measure_time: bool = True  # measured forward wall time (off in the smoke preset: compile time)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Config:
    """e2i_vrwkv settings, in sections overridden on the command line as ``--train.steps 100``."""

    data: DataSection = DataSection()
    model: ModelSection = ModelSection()
    vit: VitSection = VitSection()
    train: TrainSection = TrainSection()
    seeds: tuple[int, ...] = (0, 1)
    variants: tuple[str, ...] = VARIANTS
    checks: ChecksSection = ChecksSection()
    cost: CostSection = CostSection()
    progress: bool = True

    def __post_init__(self):
        err, patch = registry.ConfigError, self.model.patch_size
        bad = [v for v in self.variants if v not in VARIANTS]
        if bad or not {"full", "plain"} <= set(self.variants):
            raise err("variants", f"must be a subset of {VARIANTS} holding 'full' and 'plain'; got {self.variants}")
        if len(self.seeds) < 2 or len(set(self.seeds)) != len(self.seeds):
            raise err("seeds", f"must hold >= 2 distinct seeds (a seed-noise estimate); got {self.seeds}")
        if len(self.cost.sizes) < 2 or any(s % patch for s in self.cost.sizes):
            raise err("cost.sizes", f"must hold >= 2 multiples of model.patch_size={patch}; got {self.cost.sizes}")
        if self.data.image_size % patch:
            raise err("model.patch_size", f"must divide data.image_size ({self.data.image_size}); got {patch}")
        if self.checks.min_gain < 0:
            raise err("checks.min_gain", f"must be >= 0; got {self.checks.min_gain}")
        if self.train.steps < 1:
            raise err("train.steps", f"must be >= 1; got {self.train.steps}")


# The flat field names the config had before it was split into sections, in their old order: the per-run
# cache key holds them, so runs cached before the split stay valid.
_FLAT_FIELDS = (
    ("image_size", "data.image_size"), ("views", "data.views"), ("num_train", "data.num_train"),
    ("num_test", "data.num_test"), ("data_seed", "data.seed"), ("patch_size", "model.patch_size"),
    ("d_model", "model.d_model"), ("num_layers", "model.num_layers"), ("prior_dim", "model.prior_dim"),
    ("vit_d_model", "vit.d_model"), ("vit_num_heads", "vit.num_heads"), ("vit_num_layers", "vit.num_layers"),
    ("train_steps", "train.steps"), ("batch_size", "train.batch_size"), ("learning_rate", "train.learning_rate"),
    ("weight_decay", "train.weight_decay"), ("seeds", "seeds"), ("variants", "variants"),
    ("min_gain", "checks.min_gain"), ("cost_sizes", "cost.sizes"), ("timing_batch", "cost.timing_batch"),
    ("timing_repeats", "cost.timing_repeats"), ("measure_time", "cost.measure_time"), ("progress", "progress"),
)


def _cache_fields(c: Config) -> dict:
    """The config part of a run's cache key: the pre-sections flat fields by their old names, all but the
    ones a run's result does not depend on (progress and the cost settings)."""
    skip = ("progress", "cost_sizes", "timing_batch", "timing_repeats")
    return registry.flat_fields(c, _FLAT_FIELDS, skip=skip)


# ------------------------------------------------------------------ models


def backbone_config(c: Config, image_size: int | None = None) -> vr.VRWKVConfig:
    return vr.VRWKVConfig(image_size=image_size or c.data.image_size, patch_size=c.model.patch_size,
                          num_classes=lf.NUM_CLASSES, d_model=c.model.d_model, num_layers=c.model.num_layers)


def vit_config(c: Config, image_size: int | None = None) -> vit_lib.ViTConfig:
    return vit_lib.ViTConfig(image_size=image_size or c.data.image_size, patch_size=c.model.patch_size, num_classes=1,
                             d_model=c.vit.d_model, num_heads=c.vit.num_heads, d_ff=4 * c.vit.d_model,
                             num_layers=c.vit.num_layers, pooling="mean")


def model_config(c: Config, variant: str, image_size: int | None = None):
    """The config of `variant`'s model: a `VRWKVConfig` (plain), a `ViTConfig` (vit) or an `E2IConfig`."""
    if variant == "plain":
        return backbone_config(c, image_size)
    if variant == "vit":
        return vit_config(c, image_size)
    return e2i.E2IConfig(backbone=backbone_config(c, image_size), views=c.data.views, prior_dim=c.model.prior_dim,
                         **SWITCHES[variant])


def _model_fn(c: Config, variant: str, image_size: int | None = None):
    """``rngs -> the model of `variant``` (shared by `make_model` and `train_step`)."""
    cfg = model_config(c, variant, image_size)
    if variant == "plain":
        return lambda rngs: vr.VRWKVSegmenter(cfg, rngs=rngs)
    if variant == "vit":
        return lambda rngs: e2i.AttentionSegmenter(cfg, lf.NUM_CLASSES, rngs=rngs)
    return lambda rngs: e2i.E2IVRWKV(cfg, rngs=rngs)


def make_model(c: Config, variant: str, seed: int, image_size: int | None = None) -> nnx.Module:
    """The model of `variant` (input: views [b, U, V, H, W] for the E2I variants, the centre image
    [b, H, W, 1] for plain and vit)."""
    return _model_fn(c, variant, image_size)(nnx.Rngs(seed))


def model_input(variant: str, views: np.ndarray) -> np.ndarray:
    if variant in ("plain", "vit"):
        return views[:, views.shape[1] // 2, views.shape[2] // 2, :, :, None]
    return views


def active_params(model: nnx.Module, variant: str) -> int:
    """Parameters the variant uses (the E2I variants carry every block's weights, the ViT an unused classifier
    head; those are not counted)."""
    size = lambda p: int(np.size(p[...]))
    if variant == "plain":
        return e2i.num_params(model)
    if variant == "vit":
        return e2i.num_params(model) - size(model.vit.head_w) - size(model.vit.head_b)
    sw = SWITCHES[variant]
    prior, ecma, gate = sw.get("epi_prior", True), sw.get("ecma", True), sw.get("gate", True)
    n = e2i.num_params(model.backbone) + e2i.num_params(model.angular_stream)
    n += e2i.num_params(model.prior) if prior else 0
    fusion = model.ecma if ecma else model.naive
    n += e2i.num_params(fusion) - (0 if prior else size(fusion.w_g))
    n += (e2i.num_params(model.gate) - (0 if prior else size(model.gate.w_g))) if gate else 0
    return int(n)


# ------------------------------------------------------------------ training and evaluation


def _data(c: Config):
    train = lf.make_light_fields(c.data.num_train, seed=c.data.seed, size=c.data.image_size, views=c.data.views)
    test = lf.make_light_fields(c.data.num_test, seed=c.data.seed + 10_000, size=c.data.image_size, views=c.data.views)
    return train, test




def _batch_fn(c: Config, variant: str, seed: int, views: np.ndarray, labels: np.ndarray):
    """Step index -> the training batch of (`variant`, `seed`): `train.batch_size` scenes drawn with replacement
    from `views` [n, U, V, H, W] (as the variant's input) and their centre `labels` [n, H, W]."""
    x_train = model_input(variant, views)

    def batch_fn(i: int) -> dict:
        idx = np.random.default_rng([seed, 11, int(i)]).integers(0, len(x_train), c.train.batch_size)
        return {"input": x_train[idx], "labels": labels[idx]}

    return batch_fn


def train_eval(c: Config, variant: str, seed: int, train, test) -> dict:
    """Trains one (variant, seed) and returns its test mIoU, per-class IoU, parameters and time."""
    start = time.perf_counter()
    model = make_model(c, variant, seed)
    x_test = model_input(variant, test.views)
    model, hist = e2i.train_segmenter(model, _batch_fn(c, variant, seed, train.views, train.labels),
                                      num_steps=c.train.steps, learning_rate=c.train.learning_rate,
                                      weight_decay=c.train.weight_decay, progress=c.progress,
                                      desc=f"e2i_vrwkv {variant} s{seed}")
    pred = e2i.predict(model, x_test)
    miou, iou = e2i.mean_iou(e2i.confusion_matrix(pred, test.labels, lf.NUM_CLASSES))
    return {"miou": miou, "iou": [None if np.isnan(v) else float(v) for v in iou],
            "final_loss": float(hist[-1]["loss"]), "params": active_params(model, variant),
            "seconds": round(time.perf_counter() - start, 2)}


def train_step(c: Config):
    """The training step ``python -m experiments aot e2i_vrwkv`` compiles: the first one `run` trains, variant
    ``c.variants[0]`` (``full``, E2I-VRWKV with every block on, at every preset) of seed ``c.seeds[0]``: its
    model, `e2i.segmenter_loss`, the AdamW of `e2i.optimizer_config` (what `e2i.train_segmenter` steps with)
    and a global batch of `train.batch_size` scenes (the shapes `_batch_fn` draws, from a zero stand-in scene
    instead of the rendered data)."""
    from experiments import aot

    variant, d = c.variants[0], c.data
    stand_in = (np.zeros((1, d.views, d.views, d.image_size, d.image_size), np.float32),
                np.zeros((1, d.image_size, d.image_size), np.int32))
    return aot.TrainStep.from_batch(_batch_fn(c, variant, c.seeds[0], *stand_in)(0),
                                    model=model_config(c, variant), model_fn=_model_fn(c, variant),
                                    loss_fn=e2i.segmenter_loss,
                                    optimizer=e2i.optimizer_config(c.train.learning_rate, c.train.weight_decay,
                                                                   c.train.steps))


# ------------------------------------------------------------------ cost


def modeled_flops(c: Config, variant: str, image_size: int) -> dict[str, float]:
    """Forward FLOPs of one image: {"total", "mixer"} (mixer = Bi-WKV or attention; linear maps 2 fan_in fan_out
    per token; the E2I extras include the angular stem per cross view, the EGPG's per-pixel MLP, LF-ECMA's two
    scans and the gate)."""
    p, D, L = c.model.patch_size, c.model.d_model, c.model.num_layers
    T = (image_size // p) ** 2
    pix = image_size ** 2
    if variant == "vit":
        Dv = c.vit.d_model
        lin = L * T * 2 * (4 * Dv * Dv + 2 * Dv * 4 * Dv) + T * 2 * (p * p * Dv + Dv * p * p * lf.NUM_CLASSES)
        mixer = L * flash_cost(batch=1, q_len=T, kv_len=T, num_heads=c.vit.num_heads, num_kv_heads=c.vit.num_heads,
                               head_dim=Dv // c.vit.num_heads, itemsize=4, causal=False).flops
        return {"total": float(lin + mixer), "mixer": float(mixer)}
    wkv = bi_wkv_cost(batch=1, seq_len=T, channels=D).flops
    block_lin = T * 2 * (4 * D * D + 2 * D * 4 * D + D * D)  # spatial k, v, r, o; channel k, v, r
    lin = L * block_lin + T * 2 * (p * p * D + D * p * p * lf.NUM_CLASSES)
    mixer = L * wkv
    if variant != "plain":
        n_cross = 2 * c.data.views - 1
        lin += n_cross * T * 2 * (2 * p * p * D + D * D) + block_lin  # angular stem + its VRWKV block
        mixer += wkv
        sw = SWITCHES[variant]
        if sw.get("epi_prior", True):
            fan_in = 2 * c.data.views * 3 + 4
            lin += pix * 2 * (fan_in * 2 * c.model.prior_dim + 2 * c.model.prior_dim * c.model.prior_dim)
        if sw.get("ecma", True):
            lin += T * 2 * (4 * D * D + c.model.prior_dim * D)
            mixer += 2 * wkv  # row and column order
        else:
            lin += T * 2 * (D * D + c.model.prior_dim * D)
        if sw.get("gate", True):
            lin += T * 2 * (2 * D * D + c.model.prior_dim * D)
    return {"total": float(lin + mixer), "mixer": float(mixer)}


def measure_forward(c: Config, variant: str, image_size: int) -> float:
    """Best-of-`cost.timing_repeats` wall seconds of one jitted forward pass of batch `cost.timing_batch`
    (compile excluded)."""
    model = make_model(c, variant, 0, image_size)
    views = jax.random.uniform(jax.random.key(0),
                               (c.cost.timing_batch, c.data.views, c.data.views, image_size, image_size))
    x = jnp.asarray(model_input(variant, np.asarray(views)))
    graphdef, state = nnx.split(model)
    fwd = jax.jit(lambda s, x: nnx.merge(graphdef, s)(x))
    jax.block_until_ready(fwd(state, x))
    best = math.inf
    for _ in range(c.cost.timing_repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fwd(state, x))
        best = min(best, time.perf_counter() - t0)
    return best


def loglog_slope(xs, ys) -> float:
    """Least-squares slope of log y on log x."""
    return float(np.polyfit(np.log(np.asarray(xs, float)), np.log(np.asarray(ys, float)), 1)[0])


# ------------------------------------------------------------------ analysis


def paired(c: Config, res: dict, a: str, b: str) -> dict:
    """Paired-by-seed mIoU difference a - b: mean, SE, threshold and whether a is above b beyond noise."""
    d = np.array([ra["miou"] - rb["miou"] for ra, rb in zip(res[a], res[b])])
    se = float(d.std(ddof=1) / math.sqrt(d.size))
    thr = max(2 * se, c.checks.min_gain)
    return {"diff": float(d.mean()), "se": se, "threshold": thr, "above": bool(d.mean() > thr),
            "below": bool(d.mean() < -thr), "per_seed": d.tolist()}


def analyse(c: Config, res: dict, cost: dict) -> tuple[list[Check], dict, str | None, str]:
    comps = {}
    checks = []
    rule = f"d > max(2 SE_seed, {c.checks.min_gain})"
    comps["full_vs_plain"] = cp = paired(c, res, "full", "plain")
    checks.append(Check("mIoU gain of E2I-VRWKV over plain VRWKV", measured=round(cp["diff"], 4),
                        paper="LF blocks improve mIoU (86.55% UrbanLF-Real, SOTA)", threshold=rule,
                        passed=cp["above"], note=f"SE {cp['se']:.4f}, {len(c.seeds)} seeds"))
    for ab in ABLATIONS:
        if ab not in res:
            continue
        comps[f"full_vs_{ab}"] = cp = paired(c, res, "full", ab)
        checks.append(Check(f"mIoU drop when removing {LABELS[ab].removeprefix('w/o ')}", measured=round(cp["diff"], 4),
                            paper="each block contributes", threshold=rule, passed=cp["above"],
                            note=f"SE {cp['se']:.4f}"))
    sizes = list(c.cost.sizes)
    tokens = [(s // c.model.patch_size) ** 2 for s in sizes]
    slope_full = loglog_slope(tokens, [cost["flops"]["full"][i]["total"] for i in range(len(sizes))])
    slope_attn = loglog_slope(tokens, [cost["flops"]["vit"][i]["mixer"] for i in range(len(sizes))])
    cost_ok = slope_full <= 1.1 and slope_attn >= 1.9
    checks.append(Check("modeled FLOPs slope vs tokens: E2I-VRWKV / attention mixer",
                        measured=f"{slope_full:.3f} / {slope_attn:.3f}", paper="linear complexity retained",
                        threshold="<= 1.1 / >= 1.9", passed=cost_ok,
                        note=f"T = {tokens}; cost models of pallas_kernels (wkv, flash_attention)"))
    if "vit" in cost["seconds"]:
        t_full = loglog_slope(tokens, cost["seconds"]["full"])
        t_vit = loglog_slope(tokens, cost["seconds"]["vit"])
        checks.append(Check("measured forward-time slope vs tokens: E2I-VRWKV below ViT",
                            measured=f"{t_full:.2f} / {t_vit:.2f}", paper="linear vs quadratic", threshold="full < vit",
                            passed=t_full < t_vit, note="one run on a shared 2-core CPU, XLA scan path",
                            required=False))
    if "vit" in res:
        comps["full_vs_vit"] = cp = paired(c, res, "full", "vit")
        checks.append(Check("mIoU gain of E2I-VRWKV over a ViT segmenter (centre view)", measured=round(cp["diff"], 4),
                            paper="beats prior SOTA", threshold=rule, passed=cp["above"], required=False,
                            note=f"SE {cp['se']:.4f}"))
    reproduced = all(ch.passed for ch in checks if ch.required)
    cause_class, cause = None, ""
    if not reproduced:
        if not cost_ok:
            cause_class, cause = "bug", "the cost model of the full model is not linear in the tokens"
        elif any(comps[f"full_vs_{ab}"]["below"] for ab in ABLATIONS if f"full_vs_{ab}" in comps):
            worse = [ab for ab in ABLATIONS if f"full_vs_{ab}" in comps and comps[f"full_vs_{ab}"]["below"]]
            cause_class = "spec"
            cause = (f"removing {', '.join(LABELS[w].removeprefix('w/o ') for w in worse)} significantly RAISES "
                     f"mIoU: the reconstructed block (the spec's [INFER] design) hurts at this scale")
        else:
            cause_class = "scale"
            cause = ("differences within seed noise or below the minimum gain at 2 seeds, ~5x10^4-parameter models, "
                     f"{c.train.steps} steps of {c.train.batch_size} scenes")
    return checks, comps, cause_class, cause


def headline(metrics: Mapping[str, Any]) -> str:
    """Our result in one table cell (the README's "ours" column)."""
    s = metrics["summary"]
    order = [v for v in ("full", "plain", "vit") if v in s]
    nums = "/".join(f"{100 * s[v]['miou']:.1f}" for v in order)
    names = {"full": "E2I", "plain": "VRWKV", "vit": "ViT"}
    return f"mIoU {nums}% ({'/'.join(names[v] for v in order)}, synthetic 3x3 LF)"


def run(c: Config, workdir) -> dict:
    workdir = epath.Path(workdir)
    start = time.perf_counter()
    train, test = _data(c)
    base = _cache_fields(c)
    res = {v: [] for v in c.variants}
    for v in c.variants:
        for s in c.seeds:
            res[v].append(cached(workdir, {"cfg": base, "variant": v, "seed": s},
                                  lambda: train_eval(c, v, s, train, test)))
    cost = {"flops": {v: [modeled_flops(c, v, size) for size in c.cost.sizes] for v in set(c.variants) | {"vit"}},
            "seconds": {v: [measure_forward(c, v, size) for size in c.cost.sizes] for v in ("full", "plain", "vit")
                        if v in c.variants and c.cost.measure_time}}
    checks, comps, cause_class, cause = analyse(c, res, cost)
    summary = {v: {"miou": float(np.mean([r["miou"] for r in rows])),
                   "miou_sd": float(np.std([r["miou"] for r in rows], ddof=1)),
                   "iou": [float(np.mean([r["iou"][k] for r in rows if r["iou"][k] is not None] or [np.nan]))
                           for k in range(lf.NUM_CLASSES)],
                   "params": rows[0]["params"], "train_seconds": float(np.mean([r["seconds"] for r in rows]))}
               for v, rows in res.items()}
    plots = [_plot_bars(c, summary, res, workdir), _plot_cost(c, cost, workdir)]
    d = c.data
    context = (f"{d.num_train}/{d.num_test} procedural {d.views}x{d.views}-view light fields of {d.image_size}x"
               f"{d.image_size}, 4 classes (near/far objects separable by disparity only), {c.train.steps} steps x "
               f"{c.train.batch_size}, {len(c.seeds)} seeds; mIoU " + ", ".join(
                   f"{v} {summary[v]['miou']:.3f}" for v in c.variants)
               + "; near/far-object IoU full " + "/".join(f"{x:.2f}" for x in summary["full"]["iou"][1:3])
               + ", plain " + "/".join(f"{x:.2f}" for x in summary["plain"]["iou"][1:3])
               + "; params " + ", ".join(f"{v} {summary[v]['params']}" for v in c.variants))
    text, reproduced = verdict(
        checks, claim="EPI prior, LF-ECMA and GC-Gate on a linear Vision-RWKV raise light-field segmentation mIoU, "
        "each block contributing, at linear cost", context=context, cause=cause, cause_class=cause_class)
    metrics = {"summary": summary, "per_seed": res, "comparisons": comps,
               "cost": {"image_sizes": list(c.cost.sizes),
                        "tokens": [(s // c.model.patch_size) ** 2 for s in c.cost.sizes], **cost},
               "classes": list(lf.CLASSES), "seconds": round(time.perf_counter() - start, 1),
               "checks": [ch.as_dict() for ch in checks]}
    return {"metrics": metrics, "verdict": text, "reproduced": reproduced,
            "cause": None if reproduced else cause_class, "plots": plots}


# ------------------------------------------------------------------ plots


def _plot_bars(c: Config, summary: dict, res: dict, workdir) -> str:
    fig, axes = plotting.subplots(1, 2, figsize=(12, 3.8))
    names = list(c.variants)
    xs = np.arange(len(names))
    colors = ["k" if v == "full" else ("tab:gray" if v in ABLATIONS else "tab:blue") for v in names]
    ax = axes[0]
    ax.bar(xs, [summary[v]["miou"] for v in names], color=colors)
    for i, v in enumerate(names):
        ax.scatter([i] * len(res[v]), [r["miou"] for r in res[v]], color="tab:red", s=10, zorder=3)
    ax.set_xticks(xs, [LABELS[v] for v in names], rotation=30, ha="right", fontsize=7)
    ax.set(ylabel="test mIoU (centre view)", title=f"mIoU per variant (bars: mean, dots: {len(c.seeds)} seeds)")
    lo = min(r["miou"] for rows in res.values() for r in rows)
    ax.set_ylim(max(0.0, lo - 0.1), min(1.0, max(r["miou"] for rows in res.values() for r in rows) + 0.05))
    ax = axes[1]
    width = 0.8 / len(names)
    for i, v in enumerate(names):
        ax.bar(np.arange(lf.NUM_CLASSES) + i * width, summary[v]["iou"], width, label=LABELS[v], color=colors[i]
               if v != "vit" else "tab:cyan", alpha=0.4 + 0.6 * (v == "full"))
    ax.set_xticks(np.arange(lf.NUM_CLASSES) + 0.4 - width / 2, list(lf.CLASSES), fontsize=8)
    ax.set(ylabel="IoU", title="per-class IoU (near/far differ only in disparity)")
    plotting.legend(ax, fontsize=6)
    return report.savefig(fig, workdir / "miou_variants.png")


def _plot_cost(c: Config, cost: dict, workdir) -> str:
    tokens = [(s // c.model.patch_size) ** 2 for s in c.cost.sizes]
    fig, axes = plotting.subplots(1, 2, figsize=(11, 3.8))
    for v in ("full", "plain", "vit"):
        if v in cost["flops"]:
            axes[0].loglog(tokens, [f["total"] for f in cost["flops"][v]], marker="o", label=LABELS[v])
        if cost["seconds"].get(v):
            axes[1].loglog(tokens, cost["seconds"][v], marker="o", label=LABELS[v])
    ref = np.asarray(tokens, float)
    axes[0].loglog(tokens, cost["flops"]["full"][0]["total"] * ref / ref[0], "k:", lw=1, label="slope 1")
    axes[0].loglog(tokens, cost["flops"]["full"][0]["total"] * (ref / ref[0]) ** 2, "k--", lw=1, label="slope 2")
    axes[0].set(xlabel="tokens T (patches)", ylabel="modeled forward FLOPs / image", title="modeled cost vs size")
    axes[1].set(xlabel="tokens T (patches)", ylabel="seconds (best of repeats)",
                title=f"measured forward, batch {c.cost.timing_batch} (CPU, one run)")
    for ax in axes:
        plotting.legend(ax, fontsize=7)
    return report.savefig(fig, workdir / "cost_vs_size.png")


EXPERIMENT = registry.Experiment(
    slug="e2i_vrwkv",
    config_cls=Config,
    presets={
        "smoke": lambda: Config(
            data=DataSection(image_size=16, num_train=32, num_test=8),
            model=ModelSection(d_model=8, num_layers=1, prior_dim=4),
            vit=VitSection(d_model=8, num_heads=2, num_layers=1),
            train=TrainSection(steps=3, batch_size=4), variants=("full", "plain"),
            cost=CostSection(sizes=(16, 32), timing_batch=1, timing_repeats=1, measure_time=False), progress=False),
        "quick": lambda: Config(),
        "paper": lambda: Config(
            data=DataSection(image_size=64, views=5, num_train=4096, num_test=512),
            model=ModelSection(d_model=64, num_layers=4, prior_dim=8), vit=VitSection(d_model=72, num_layers=4),
            train=TrainSection(steps=3000, batch_size=32), seeds=(0, 1, 2, 3, 4),
            cost=CostSection(sizes=(64, 128, 256))),
    },
    run=run,
    train_step=train_step,
)
