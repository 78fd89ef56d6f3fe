"""PRIM (reconstructed): accuracy against audio-visual token budget and FLOPs, PRIM vs uniform vs FastV.

Claim checked (PRIM, ICML 2026; spec papers/specs/inference_moe.md section 4; abstract only):
cooperative compression across the encoders and the LM (text-conditioned early audio-visual fusion,
attention-guided and frequency-aware removal of audio and video tokens, task-adaptive retention inside
the LM) gives a better efficiency-accuracy trade-off than single-stage pruning. The paper gives no
numbers; EVERY operator of the method is the spec's [INFERRED] instantiation
(`algorithms.compression.prim`, whose docstring lists what is reconstructed), so a pass or a fail here
speaks about that design, not about the paper's exact algorithm.

Setup (CPU scale, nothing downloaded):

  1. Data: `experiments.tasks.scenes` (3 x 3 boards of coloured shapes, 24 x 24 images; one audio
     frame per cell, whose tone names the colour of a sounding object). Questions of the kinds in
     `kinds`: "count <colour> <shape> ?" (visual) and "count sounding <colour> ?" (audio-visual; the
     tones alone suffice, so the relevant modality depends on the question). Prompt =
     BOS, 36 image patch tokens (patch 4), 9 audio frame tokens, question; the answer is one token.
  2. A small VLM (`models.vlm`: 1-block ViT + audio MLP -> 3-layer LM) trained with full tokens
     (`algorithms.training.fit`, checkpoint in `<workdir>/train`); pruning is training-free.
  3. At each kept fraction r of the 45 AV tokens (budget B = round(r * 45) AV tokens entering the LM):
       * uniform: strided per modality (share proportional to size);
       * FastV: every AV token enters, after layer K the B most attended by the last prompt token stay;
       * PRIM-pre: PRIM's pre-LM stage only (relevance from the LM's layer-0 q/k, modality budgets,
         frequency-aware top-k);
       * PRIM: PRIM-pre + adaptive retention after layer K (cumulative attention mass >= p, bounded by
         [r_min, r_max] of the B tokens);
       * PRIM+fusion: PRIM with the aligned-window fusion (gamma = `fusion_gamma`; the model was not
         trained with it, so this is a zero-shot ablation);
       * PRIM-nofreq: PRIM-pre with the frequency weight 0 (ablation);
       * PRIM-merge: PRIM whose pruned tokens are merged into their most similar kept token (cosine-
         weighted average, `merge`) instead of dropped (same budget B; zero-shot like fusion);
       * PRIM-pyramid: PRIM-pre, then the adaptive retention at layer `pyramid_layer` AND again at
         layer K on what the first stage kept (two-stage schedule, same p and bounds);
       * PRIM-eps: as PRIM-pyramid with the second stage replaced by the spec's epsilon rule (drop the
         least-attended AV tokens whose total raw attention mass is < `eps`, task-adaptive, may be all).
       The three new arms run at `ablation_fractions` only (they are compared at the check fraction).
     Accuracy on `n_test` held-out questions (argmax of the answer token), modeled FLOPs per question
     (`prim.modeled_flops` on each row's own token counts, scoring included) and measured wall time
     of the jitted pipeline on the whole test set (best of `timing_repeats`; adaptive rows run padded
     to the cap, so the measured time is an upper bound for PRIM). Both exclude the encoders, which
     run in full for every method: the input embeddings are computed once (`embed_test_set`).

Checks (fixed before the run, at the kept fraction `check_fraction` = 0.25; SE of a paired difference
= std(a_i - b_i) / sqrt(n) over the test questions):
  * PRIM keeps accuracy within `max_drop` = 2 points of full tokens (required; the brief's reading of
    "stable" trade-offs: "within ~1-2 points");
  * PRIM beats uniform pruning at that budget by more than 2 SE (required);
  * PRIM >= FastV - 2 SE at that budget, and PRIM's modeled FLOPs < FastV's (not required: FastV
    spends the full sequence on the first K+1 layers, so it is a more expensive point);
  * PRIM-pre >= PRIM-nofreq - 2 SE (frequency term not harmful; not required);
  * PRIM-merge >= PRIM - 2 SE (merging keeps the pruned tokens' evidence; not required);
  * PRIM-pyramid >= PRIM - 2 SE with fewer modeled FLOPs (PyramidDrop's claim; not required);
  * PRIM-eps >= PRIM - 2 SE with fewer modeled FLOPs (tokens under eps mass are dispensable; not required).

Recipe:
    python -m experiments run prim --preset smoke   # seconds, used by the tests
    python -m experiments run prim --preset quick   # 2 CPU cores, about 3 minutes
    python -m experiments run prim --preset paper   # larger model and test set, more budgets
    python -m experiments run prim --preset smoke --pruning.prune-layer 0   # one field of a config section

Config sections (`run prim --help` lists every field): data, model, train, pruning, eval.
"""

from __future__ import annotations

import dataclasses
import pathlib
import time
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
import optax
from etils import epath
from flax import nnx

from algorithms.compression import prim
from algorithms.training import OptimizerConfig, fit
from experiments import _cache
from experiments import _plotting as plotting
from experiments import registry, report
from experiments.checks import Check, verdict
from experiments.tasks import scenes as sc
from models.transformer import TransformerConfig
from models.vit import ViTConfig
from models.vlm import VLM, VLMConfig

_CACHE_VERSION = 2
METHODS = ("uniform", "fastv", "prim_pre", "prim", "prim_fusion", "prim_nofreq", "prim_merge", "prim_pyramid",
           "prim_eps")
ABLATIONS = ("prim_merge", "prim_pyramid", "prim_eps")  # evaluated at `ablation_fractions` only
LABELS = {"full": "full tokens", "uniform": "uniform (strided)", "fastv": "FastV-style (in-LM)",
          "prim_pre": "PRIM pre-LM only", "prim": "PRIM (pre-LM + adaptive in-LM)",
          "prim_fusion": "PRIM + fusion", "prim_nofreq": "PRIM pre-LM, no frequency term",
          "prim_merge": "PRIM, pruned tokens merged", "prim_pyramid": "PRIM, pyramid (2 in-LM stages)",
          "prim_eps": "PRIM, pyramid with eps rule"}


@dataclasses.dataclass(frozen=True, kw_only=True)
class DataSection:
    """The audio-visual scenes (``--data.kinds count``)."""

    kinds: tuple[str, ...] = ("count", "audio_visual")
    grid: int = 3
    image_size: int = 24
    patch_size: int = 4
    slot_len: int = 16
    max_objects: int = 5
    train_pool: int = 8192
    n_test: int = 1024


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelSection:
    """The VLM: LM and ViT sizes (``--model.d-model 128``)."""

    d_model: int = 64
    num_layers: int = 3
    num_heads: int = 4
    num_kv_heads: int = 2
    d_ff: int = 128
    vit_d_model: int = 32
    vit_layers: int = 1


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainSection:
    """Full-token training (``--train.steps 2000``)."""

    batch_size: int = 64
    steps: int = 700
    learning_rate: float = 2e-3


@dataclasses.dataclass(frozen=True, kw_only=True)
class PruningSection:
    """The pruning arms and PRIM's settings (``--pruning.fractions 1 0.25``)."""

    fractions: tuple[float, ...] = (1.0, 0.5, 0.25, 0.125)
    methods: tuple[str, ...] = METHODS
    prune_layer: int = 1  # K: layers 0..K run every kept token, later layers the in-LM selection
    retention_mass: float = 0.9
    retention_min: float = 0.5
    retention_max: float = 1.0
    relevance: str = "layer0"
    freq_weight: float = 0.3
    fusion_gamma: float = 0.3
    merge: str = "similarity"  # prim_merge: pruned tokens merged into their most similar kept token
    pyramid_layer: int = 0  # prim_pyramid / prim_eps: first in-LM stage; the second one is at prune_layer
    eps: float = 0.1  # prim_eps: epsilon of the second stage (= 1 - retention_mass)
    ablation_fractions: tuple[float, ...] = (0.5, 0.25)


@dataclasses.dataclass(frozen=True, kw_only=True)
class EvalSection:
    """The checks and timing (``--eval.max-drop 0.05``)."""

    check_fraction: float = 0.25
    max_drop: float = 0.02
    se_multiple: float = 2.0
    batch: int = 256
    timing_repeats: int = 3


@dataclasses.dataclass(frozen=True, kw_only=True)
class Config:
    """prim settings, in sections overridden on the command line as ``--pruning.prune-layer 2``."""

    data: DataSection = DataSection()
    model: ModelSection = ModelSection()
    train: TrainSection = TrainSection()
    pruning: PruningSection = PruningSection()
    eval: EvalSection = EvalSection()
    seed: int = 0
    progress: bool = True

    def __post_init__(self):
        err, pr, ev = registry.ConfigError, self.pruning, self.eval
        bad = [m for m in pr.methods if m not in METHODS]
        if bad:
            raise err("pruning.methods", f"must be a subset of {METHODS}; got unknown {bad}")
        for f in pr.fractions:
            prim.budget_count(f, 1)  # ValueError naming "fraction" outside (0, 1]
        if ev.check_fraction not in pr.fractions:
            raise err("eval.check_fraction", f"must be one of pruning.fractions={pr.fractions}; "
                                             f"got {ev.check_fraction}")
        if self.data.n_test % ev.batch:
            raise err("data.n_test", f"must be a multiple of eval.batch={ev.batch}; got {self.data.n_test}")
        if not 0 <= pr.prune_layer < self.model.num_layers - 1:
            raise err("pruning.prune_layer", f"must be in [0, model.num_layers - 1 = {self.model.num_layers - 1}); "
                                             f"got {pr.prune_layer}")
        two_stage = any(m in pr.methods for m in ("prim_pyramid", "prim_eps"))
        if two_stage and not 0 <= pr.pyramid_layer < pr.prune_layer:
            raise err("pruning.pyramid_layer", f"must be in [0, pruning.prune_layer = {pr.prune_layer}); "
                                               f"got {pr.pyramid_layer}")
        if any(m in pr.methods for m in ABLATIONS) and ev.check_fraction not in pr.ablation_fractions:
            raise err("pruning.ablation_fractions", f"must hold eval.check_fraction={ev.check_fraction}; "
                                                    f"got {pr.ablation_fractions}")
        for f in pr.ablation_fractions:
            prim.budget_count(f, 1)


# ------------------------------------------------------------------ model and data


def _tokenizer(c: Config):
    return sc.make_tokenizer(c.data.grid)


def vlm_config(c: Config) -> VLMConfig:
    tok = _tokenizer(c)
    lm = TransformerConfig(vocab_size=tok.vocab_size, d_model=c.model.d_model, num_layers=c.model.num_layers,
                           num_heads=c.model.num_heads, num_kv_heads=c.model.num_kv_heads, d_ff=c.model.d_ff)
    vit = ViTConfig(image_size=c.data.image_size, patch_size=c.data.patch_size, channels=3, num_classes=1,
                    d_model=c.model.vit_d_model, num_heads=2, d_ff=2 * c.model.vit_d_model,
                    num_layers=c.model.vit_layers,
                    pooling="mean")
    return VLMConfig(lm=lm, vit=vit, image_token_id=tok.encode(sc.IMAGE_TOKEN)[0],
                     audio_token_id=tok.encode(sc.AUDIO_TOKEN)[0], audio_frames=c.data.grid * c.data.grid,
                     audio_frame_len=c.data.slot_len)


def _data(c: Config, n: int, seed: int) -> dict:
    d = c.data
    return sc.make_batch(n, seed=seed, image_tokens=(d.image_size // d.patch_size) ** 2, audio_tokens=d.grid * d.grid,
                         kinds=d.kinds, grid=d.grid, image_size=d.image_size, slot_len=d.slot_len,
                         max_objects=d.max_objects)


def _loss(model, batch):
    out = model(batch["inputs"], images=batch["images"], audio=batch["audio"])
    ce = optax.softmax_cross_entropy_with_integer_labels(out.logits, batch["targets"])
    mask = batch["loss_mask"]
    loss = (ce * mask).sum() / jnp.maximum(mask.sum(), 1.0)
    return loss, {"loss": loss}


def _train_pool(c: Config) -> dict:
    """The `train_pool` training scenes the batches are drawn from (their longest example sets the length)."""
    return _data(c, c.data.train_pool, seed=1000 + c.seed)


def _batch_fn(c: Config, pool: dict):
    """Step i -> `train.batch_size` scenes of `pool`: tokens and one image and one audio clip per example."""

    def batch_fn(i: int) -> dict:
        idx = np.random.default_rng([c.seed, i]).integers(0, c.data.train_pool, c.train.batch_size)
        return {"inputs": pool["inputs"][idx], "targets": pool["targets"][idx], "loss_mask": pool["loss_mask"][idx],
                "images": pool["images"][idx][:, None], "audio": pool["audio"][idx][:, None]}

    return batch_fn


def _optimizer(c: Config) -> OptimizerConfig:
    """The full-token training's AdamW schedule (`train` and `train_step`)."""
    return OptimizerConfig(learning_rate=c.train.learning_rate, warmup_steps=min(50, c.train.steps // 5),
                           total_steps=c.train.steps, weight_decay=0.01)


def _model_fn(cfg: VLMConfig):
    """Builds the VLM of `cfg` from `nnx.Rngs` (`train` and `train_step`)."""
    return lambda rngs: VLM(cfg, rngs=rngs)


def train_step(c: Config):
    """The full-token VLM step `train` takes, for ``python -m experiments aot prim`` (`experiments.aot`).

    Its batch is the run's first batch, so the training pool is generated (seconds at the paper preset): the
    token length is the pool's longest example.
    """
    from experiments import aot

    cfg = vlm_config(c)
    return aot.TrainStep.from_batch(_batch_fn(c, _train_pool(c))(0), model=cfg, model_fn=_model_fn(cfg),
                                    loss_fn=_loss, optimizer=_optimizer(c))


def train(c: Config, workdir: pathlib.Path) -> VLM:
    """The VLM trained with full tokens (resumes from `workdir/train`)."""
    batch_fn = _batch_fn(c, _train_pool(c))
    cfg = vlm_config(c)
    fp = repr((cfg, c.data.train_pool, c.train.batch_size, c.train.steps, c.train.learning_rate, c.data.kinds,
               c.data.max_objects, c.seed))
    res = fit(model_fn=_model_fn(cfg), optimizer_config=_optimizer(c), batch_fn=batch_fn,
              num_steps=c.train.steps, workdir=epath.Path(workdir) / "train", loss_fn=_loss, seed=c.seed,
              checkpoint_every=max(c.train.steps, 1), log_every=max(1, c.train.steps // 5), progress=c.progress,
              desc="prim: train VLM", fingerprint=fp)
    return res.model()


def test_set(c: Config) -> dict:
    """Prompt-only arrays of the held-out questions: tokens [n, T] (padded with PAD after the prompt),
    images [n, 1, H, W, 3], audio [n, 1, S, F], query_pos [n], query_mask [n, T], answer ids [n], kinds."""
    te = _data(c, c.data.n_test, seed=2000 + c.seed)
    pl = te["prompt_lengths"]
    T = int(pl.max())
    pos = np.arange(T)[None]
    tok = _tokenizer(c)
    tokens = np.where(pos < pl[:, None], te["tokens"][:, :T], tok.pad_id).astype(np.int32)
    cfg = vlm_config(c)
    layout = prim.layout_from_tokens(tokens, image_token_id=cfg.image_token_id, audio_token_id=cfg.audio_token_id)
    qmask = (layout.modality[None] == prim.TEXT) & (pos >= 1) & (pos < pl[:, None])
    return {"tokens": tokens, "images": te["images"][:, None], "audio": te["audio"][:, None],
            "query_pos": (pl - 1).astype(np.int32), "query_mask": qmask,
            "answers": te["tokens"][np.arange(len(pl)), pl], "kinds": np.array([q.kind for q in te["questions"]]),
            "layout": layout}


def alignment(c: Config) -> np.ndarray:
    """[P, grid^2] bool: image patch i lies in cell j (audio frame j is cell j's time slot)."""
    g = c.data.image_size // c.data.patch_size
    r, col = np.divmod(np.arange(g * g), g)
    cell = (r * c.data.grid // g) * c.data.grid + col * c.data.grid // g
    return cell[:, None] == np.arange(c.data.grid * c.data.grid)[None]


# ------------------------------------------------------------------ one method at one budget


def _pipeline(c: Config, method: str, fraction: float, layout: prim.Layout, align: np.ndarray):
    """(vlm, x, query_pos, query_mask) -> PrunedOutput, for `method` at `fraction` (x: the input
    embeddings `vlm.embed(tokens, images, audio)`, computed once for every method by `embed_test_set`)."""
    n_av = layout.num_av
    budget = prim.budget_count(fraction, n_av)
    pcfg = prim.PRIMConfig(relevance=c.pruning.relevance,
                           freq_weight=0.0 if method == "prim_nofreq" else c.pruning.freq_weight,
                           fusion_gamma=c.pruning.fusion_gamma if method == "prim_fusion" else 0.0,
                           video_window=c.data.image_size // c.data.patch_size, audio_window=c.data.grid,
                           merge=c.pruning.merge if method == "prim_merge" else "none")
    in_lm = _in_lm_stages(c, method)

    def fn(vlm, x, qpos, qmask):
        if method == "full":
            return prim.pruned_forward(vlm, prim.full_plan(x, layout), layout, qpos)
        if method == "uniform":
            return prim.pruned_forward(vlm, prim.uniform_plan(x, layout, fraction), layout, qpos)
        if method == "fastv":
            return prim.pruned_forward(vlm, prim.full_plan(x, layout), layout, qpos,
                                       in_lm=prim.InLMPrune(kind="fastv", layer=c.pruning.prune_layer, keep=budget))
        plan = prim.prim_plan(vlm, x, layout, fraction, qmask, config=pcfg, align=align)
        return prim.pruned_forward(vlm, plan, layout, qpos, in_lm=in_lm)

    return fn


def _in_lm_stages(c: Config, method: str) -> tuple[prim.InLMPrune, ...]:
    """The in-LM stages of a PRIM variant: one adaptive stage at K = prune_layer (prim, prim_fusion,
    prim_merge); the pyramid repeats the same mass rule at pyramid_layer then K; prim_eps replaces the
    second (deeper) stage by the epsilon rule; none for the pre-LM-only variants."""
    def adaptive(layer):
        pr = c.pruning
        return prim.InLMPrune(kind="adaptive", layer=layer, mass=pr.retention_mass, r_min=pr.retention_min,
                              r_max=pr.retention_max)
    if method in ("prim", "prim_fusion", "prim_merge"):
        return (adaptive(c.pruning.prune_layer),)
    if method == "prim_pyramid":
        return (adaptive(c.pruning.pyramid_layer), adaptive(c.pruning.prune_layer))
    if method == "prim_eps":
        return (adaptive(c.pruning.pyramid_layer),
                prim.InLMPrune(kind="epsilon", layer=c.pruning.prune_layer, eps=c.pruning.eps))
    return ()


def _overhead(c: Config, method: str, cfg: TransformerConfig, n_q: np.ndarray, n_av: int, text: np.ndarray,
              av_layers: np.ndarray, budget: int) -> np.ndarray:
    """Scoring FLOPs per row of `method` (see `prim.scoring_flops`): the pre-LM relevance, one query row
    per in-LM stage (over the tokens present at that stage's layer) and, for merging, the cosine
    similarities of the pruned to the kept tokens (2 D per pair, within each modality; counted as
    (n - B) B pairs, an upper bound of the per-modality sum)."""
    layers = [st.layer for st in _in_lm_stages(c, method)]
    if method == "fastv":
        layers = [c.pruning.prune_layer]
    out = np.zeros(len(n_q))
    for i in range(len(n_q)):
        if method.startswith("prim"):
            out[i] += prim.scoring_flops(cfg, relevance_queries=int(n_q[i]), relevance_keys=n_av,
                                         relevance=c.pruning.relevance)
        for K in layers:
            out[i] += prim.scoring_flops(cfg, in_lm_keys=int(text[i] + av_layers[i, K]))
        if method == "prim_merge":
            out[i] += 2.0 * cfg.d_model * (n_av - budget) * budget
    return out


def embed_test_set(c: Config, vlm: VLM, data: dict) -> np.ndarray:
    """[n, T, D] input embeddings of the test prompts (encoders + token embeddings), shared by every method:
    the encoders run in full whatever the pruning, so neither the modeled FLOPs nor the measured wall
    time count them."""
    graphdef, state = nnx.split(vlm)
    emb = jax.jit(lambda st, t, i, a: nnx.merge(graphdef, st).embed(t, i, a))
    return np.concatenate([np.asarray(emb(state, *(jnp.asarray(data[k][s:s + c.eval.batch])
                                                   for k in ("tokens", "images", "audio"))))
                           for s in range(0, c.data.n_test, c.eval.batch)])


def evaluate(c: Config, vlm: VLM, data: dict, method: str, fraction: float) -> dict:
    """Accuracy, per-question correctness, modeled FLOPs and measured wall time of one method/budget."""
    layout = data["layout"]
    fn = _pipeline(c, method, fraction, layout, alignment(c))
    graphdef, state = nnx.split(vlm)
    run = jax.jit(lambda st, *a: fn(nnx.merge(graphdef, st), *a))
    keys = ("x", "query_pos", "query_mask")
    chunks = [tuple(jnp.asarray(data[k][s:s + c.eval.batch]) for k in keys)
              for s in range(0, c.data.n_test, c.eval.batch)]
    outs = [run(state, *ch) for ch in chunks]
    jax.block_until_ready(outs)
    best = np.inf
    for _ in range(c.eval.timing_repeats):
        t0 = time.perf_counter()
        jax.block_until_ready([run(state, *ch) for ch in chunks])
        best = min(best, time.perf_counter() - t0)
    logits = np.concatenate([np.asarray(o.logits) for o in outs])
    av_layers = np.concatenate([np.asarray(o.av_per_layer) for o in outs])
    text = np.concatenate([np.asarray(o.text_tokens) for o in outs])
    fk = np.concatenate([np.asarray(o.final_keep) for o in outs])
    n_audio = (fk & (layout.modality == prim.AUDIO)[None]).sum(1)
    n_av = (fk & (layout.modality != prim.TEXT)[None]).sum(1)
    correct = np.argmax(logits, -1) == data["answers"]
    cfg = vlm.config.lm
    n_q = data["query_mask"].sum(-1)
    over = _overhead(c, method, cfg, n_q, layout.num_av, text, av_layers, prim.budget_count(fraction, layout.num_av))
    flops = np.array([prim.modeled_flops(cfg, text[i] + av_layers[i], overhead=float(over[i]))
                      for i in range(len(text))])
    kinds = data["kinds"]
    return {"method": method, "fraction": fraction, "accuracy": float(correct.mean()),
            "correct": correct.astype(int).tolist(), "flops": float(flops.mean()), "wall_s": float(best),
            "av_tokens_per_layer": av_layers.mean(0).tolist(),
            "per_kind_accuracy": {k: float(correct[kinds == k].mean()) for k in sorted(set(kinds))},
            "per_kind_last_layer_av": {k: float(av_layers[kinds == k, -1].mean()) for k in sorted(set(kinds))},
            "per_kind_audio_share": {k: float((n_audio / np.maximum(n_av, 1))[kinds == k].mean())
                                     for k in sorted(set(kinds))}}


# ------------------------------------------------------------------ analysis


def _paired(a, b) -> tuple[float, float]:
    d = np.asarray(a, float) - np.asarray(b, float)
    return float(d.mean()), float(d.std(ddof=1) / np.sqrt(len(d))) if len(d) > 1 else float("nan")


def analyse(c: Config, res: dict) -> tuple[list[Check], dict, str]:
    r = c.eval.check_fraction
    k = c.eval.se_multiple
    full = res["full"][1.0]
    at = {m: res[m][r] for m in c.pruning.methods}
    checks, stats = [], {}
    if "prim" in at:
        drop = full["accuracy"] - at["prim"]["accuracy"]
        checks.append(Check(f"PRIM accuracy drop vs full tokens at {r:.0%} of the AV tokens", round(100 * drop, 2),
                            "stable accuracy at high compression (no numbers)", f"<= {100 * c.eval.max_drop:g} points",
                            drop <= c.eval.max_drop,
                            note=f"full {full['accuracy']:.3f}, PRIM {at['prim']['accuracy']:.3f}; points"))
    if "prim" in at and "uniform" in at:
        d, se = _paired(at["prim"]["correct"], at["uniform"]["correct"])
        stats["prim_minus_uniform"] = {"diff": d, "se": se}
        checks.append(Check(f"PRIM minus uniform pruning at {r:.0%} (equal AV tokens into the LM)", round(100 * d, 2),
                            "superior efficiency-accuracy trade-off", f"> {k:g} paired SE = {100 * k * se:.2f} points",
                            d > k * se, note=f"uniform {at['uniform']['accuracy']:.3f}; points"))
    if "prim" in at and "fastv" in at:
        d, se = _paired(at["prim"]["correct"], at["fastv"]["correct"])
        stats["prim_minus_fastv"] = {"diff": d, "se": se}
        fr = at["prim"]["flops"] / at["fastv"]["flops"]
        checks.append(Check(f"PRIM minus FastV at {r:.0%} (same budget after layer K)", round(100 * d, 2),
                            "better than single-stage pruning", f">= -{k:g} paired SE = {-100 * k * se:.2f} points, "
                            "and PRIM modeled FLOPs < FastV's", d >= -k * se and fr < 1, required=False,
                            note=f"FastV {at['fastv']['accuracy']:.3f}; PRIM/FastV modeled FLOPs {fr:.2f}"))
    if "prim_pre" in at and "prim_nofreq" in at:
        d, se = _paired(at["prim_pre"]["correct"], at["prim_nofreq"]["correct"])
        stats["freq_minus_nofreq"] = {"diff": d, "se": se}
        checks.append(Check(f"frequency term: PRIM-pre minus PRIM-pre without it at {r:.0%}", round(100 * d, 2),
                            "frequency-aware removal helps", f">= -{k:g} paired SE = {-100 * k * se:.2f} points",
                            d >= -k * se, required=False, note="points"))
    def versus(m, base, name, claim, flops_lower):
        """A not-required check: `m` >= `base` - k SE at the check fraction (and fewer modeled FLOPs)."""
        d, se = _paired(at[m]["correct"], at[base]["correct"])
        stats[f"{m}_minus_{base}"] = {"diff": d, "se": se}
        fr = at[m]["flops"] / at[base]["flops"]
        ok = d >= -k * se and (fr < 1 if flops_lower else True)
        thr = f">= -{k:g} paired SE = {-100 * k * se:.2f} points"
        thr += f", and modeled FLOPs < {base}'s" if flops_lower else ""
        kinds = at[m]["per_kind_last_layer_av"]
        checks.append(Check(name, round(100 * d, 2), claim, thr, ok, required=False,
                            note=f"{base} {at[base]['accuracy']:.3f}, {m} {at[m]['accuracy']:.3f}; FLOPs ratio "
                                 f"{fr:.2f}; last-layer AV tokens by kind "
                                 + ", ".join(f"{q} {v:.1f}" for q, v in kinds.items()) + "; points"))

    if "prim_merge" in at and "prim" in at:
        versus("prim_merge", "prim", f"merging: PRIM with pruned tokens merged minus PRIM dropping them at {r:.0%}",
               "merged tokens keep the evidence of the pruned ones", flops_lower=False)
    if "prim_pyramid" in at and "prim" in at:
        versus("prim_pyramid", "prim", f"pyramid: PRIM with a second in-LM stage minus single-stage PRIM at {r:.0%}",
               "a deeper second stage saves FLOPs at no accuracy cost (PyramidDrop)", flops_lower=True)
    if "prim_eps" in at and "prim" in at:
        versus("prim_eps", "prim", f"epsilon rule: PRIM (stage 1 + eps stage) minus single-stage PRIM at {r:.0%}",
               "tokens below eps attention mass are dispensable", flops_lower=True)
    fl = {m: at[m]["flops"] / full["flops"] for m in at}
    context = (f"{c.data.n_test} held-out questions ({', '.join(c.data.kinds)}), 45 AV tokens (36 patches + 9 audio "
               f"frames), {c.model.num_layers}-layer LM d={c.model.d_model} trained {c.train.steps} steps with full "
               f"tokens; at {r:.0%}: "
               + ", ".join(f"{m} {at[m]['accuracy']:.3f} ({fl[m]:.2f}x FLOPs)" for m in at)
               + f"; full {full['accuracy']:.3f}; measured CPU wall time / full at {r:.0%}: "
               + ", ".join(f"{m} {at[m]['wall_s'] / full['wall_s']:.2f}" for m in at)
               + " (PRIM's scoring ops dominate a model this small)")
    return checks, stats, context


def headline(metrics: Mapping[str, Any]) -> str:
    """Our small-scale result in one table cell (the README catalog's "ours" column)."""
    r = metrics["check_fraction"]
    t = metrics["table"]
    key = f"{r:g}"
    a = lambda m: f"{100 * t[m][key]['accuracy']:.1f}"  # noqa: E731
    f = lambda m: f"{t[m][key]['flops'] / t['full']['1']['flops']:.2f}x"  # noqa: E731
    parts = [f"AV scenes @{r:.0%} tokens: PRIM {a('prim')}% ({f('prim')} FLOPs)" if "prim" in t else ""]
    parts += [f"uniform {a('uniform')}%" if "uniform" in t else "", f"FastV {a('fastv')}% ({f('fastv')})" if "fastv" in t else ""]
    return ", ".join(p for p in parts if p) + f"; full {100 * t['full']['1']['accuracy']:.1f}%"


def run(c: Config, workdir) -> dict:
    workdir = pathlib.Path(workdir)
    vlm = train(c, workdir)
    data = test_set(c)
    data["x"] = embed_test_set(c, vlm, data)
    base = dataclasses.asdict(c)  # the cache key: what a unit's outcome depends on (each unit adds its own)
    del base["progress"], base["eval"]
    for name in ("methods", "fractions", "ablation_fractions"):
        del base["pruning"][name]
    base["eval_batch"] = c.eval.batch
    units = [("full", 1.0)] + [(m, f) for m in c.pruning.methods
                               for f in (c.pruning.ablation_fractions if m in ABLATIONS else c.pruning.fractions)]
    res: dict = {}
    it = units
    if c.progress:
        import tqdm
        it = tqdm.tqdm(units, desc="prim: methods x budgets")
    for m, f in it:
        key = dict(base, method=m, fraction=f, version=_CACHE_VERSION)
        res.setdefault(m, {})[f] = _cache.cached(workdir, key, lambda m=m, f=f: evaluate(c, vlm, data, m, f))
    checks, stats, context = analyse(c, res)
    claim = "PRIM keeps accuracy near full tokens at a budget where uniform pruning loses more"
    cause = ""
    r = c.eval.check_fraction
    src = "prim_pre" if "prim_pre" in res else "prim" if "prim" in res else None
    if src is not None:
        share = res[src][r]["per_kind_audio_share"]
        full_k, prim_k = res["full"][1.0]["per_kind_accuracy"], res[src][r]["per_kind_accuracy"]
        cause = ("the reconstructed pre-LM stage (the spec's inferred operators) drops tokens the answer needs; "
                 "its text-conditioned modality split (from the LM's layer-0 attention) depends little on the "
                 "question: audio share of the AV tokens it keeps " + ", ".join(f"{k} {v:.2f}" for k, v in share.items())
                 + "; accuracy by kind, pre-LM stage vs full tokens: "
                 + ", ".join(f"{k} {prim_k[k]:.3f} vs {full_k[k]:.3f}" for k in prim_k))
        if "fastv" in res:
            cause += (f"; in-LM pruning alone (FastV) keeps {res['fastv'][r]['accuracy']:.3f} at the same budget, "
                      f"at {res['fastv'][r]['flops'] / res['full'][1.0]['flops']:.2f}x the full FLOPs")
    text, ok = verdict(checks, claim=claim, context=context, cause=cause, cause_class="spec")
    table = {m: {f"{f:g}": {k: v for k, v in u.items() if k != "correct"} for f, u in d.items()}
             for m, d in res.items()}
    metrics = {"check_fraction": c.eval.check_fraction, "table": table, "stats": stats,
               "checks": [ch.as_dict() for ch in checks], "n_test": c.data.n_test}
    plots = [_plot(c, res, workdir)]
    return {"metrics": metrics, "verdict": text, "reproduced": ok, "plots": plots,
            "cause": None if ok else "spec"}


def _plot(c: Config, res: dict, workdir: pathlib.Path) -> str:
    fig, (ax1, ax2, ax3) = plotting.subplots(1, 3, figsize=(15, 4.5))
    full = res["full"][1.0]
    for i, m in enumerate(c.pruning.methods):
        fs = sorted(res[m])
        acc = [res[m][f]["accuracy"] for f in fs]
        style = dict(marker="o", lw=2.2 if m == "prim" else 1.2, label=LABELS[m], color=f"C{i}")
        ax1.plot(fs, acc, **style)
        ax2.plot([res[m][f]["flops"] / full["flops"] for f in fs], acc, **style)
        ax3.plot([res[m][f]["wall_s"] / full["wall_s"] for f in fs], acc, **style)
    for ax, xl in ((ax1, "kept fraction of the AV tokens (budget into the LM)"),
                   (ax2, "modeled prefill FLOPs / full tokens"),
                   (ax3, "measured wall time / full tokens (CPU, padded batches)")):
        ax.axhline(full["accuracy"], color="k", ls=":", label="full tokens")
        ax.set(xlabel=xl, ylabel="accuracy")
        ax.grid(alpha=0.3)
    ax1.set_xscale("log", base=2)
    ax1.set_title(f"PRIM (reconstructed) vs baselines, n={c.data.n_test}")
    plotting.legend(ax1, fontsize=7, loc="lower right")
    return report.savefig(fig, workdir / "accuracy_vs_budget.png")


EXPERIMENT = registry.Experiment(
    slug="prim",
    config_cls=Config,
    presets={
        # the smoke run costs what it did before the new arms (3 units, 2 layers); the two-stage arms need
        # 3 layers and run in the quick preset (their logic is tested in tests/experiments/prim_test.py)
        "smoke": lambda: Config(data=DataSection(train_pool=32, n_test=16),
                                model=ModelSection(d_model=16, num_layers=2, num_heads=2, num_kv_heads=1, d_ff=32,
                                                   vit_d_model=8),
                                train=TrainSection(batch_size=8, steps=1),
                                pruning=PruningSection(fractions=(0.25,), ablation_fractions=(0.25,),
                                                       methods=("prim", "prim_merge"), prune_layer=0),
                                eval=EvalSection(batch=16, timing_repeats=1), progress=False),
        "quick": lambda: Config(eval=EvalSection(timing_repeats=2)),
        "paper": lambda: Config(data=DataSection(train_pool=32768, n_test=4096),
                                model=ModelSection(d_model=128, num_layers=4, num_heads=4, d_ff=512, vit_layers=2),
                                train=TrainSection(steps=4000),
                                pruning=PruningSection(fractions=(1.0, 0.75, 0.5, 0.25, 0.125, 0.0625))),
    },
    run=run,
    train_step=train_step,
)
