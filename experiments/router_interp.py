"""RouterInterp and the Superposed Specialisation Hypothesis (SSH): planted worlds and a tiny MoE LM.

The claim (ICML 2026 abstract): experts specialise in a disjoint union of fine-grained features, so
explaining routing by the SAE features most predictive of it gives 57% higher detection accuracy
than token-statistics explanations (gpt-oss-20b).

Stage 1, planted-feature worlds with exact ground truth (`algorithms.moe.router_interp.planted_world`):
token sequences from a mixture of domains; each token carries planted features (its domain, its
identity, "token group x domain" and "previous-token group x domain" combinations, Zipfian noise
features) superposed in d dimensions; a linear top-2 router over E = 16 experts is trained (ridge
least squares) to read

* `ssh`: a disjoint union of 8 combination features per expert (spread over domains), or
* `single_domain` (control): one domain per expert (two experts per domain), and
* `single_domain_exclusive` (control): the same, on text whose domains share no tokens.

A TopK SAE is trained on the router inputs; RouterInterp builds per-expert feature sets (greedy
under a precision floor, ranked by centred alignment with the router rows, or by an L1 probe); the
rule-based simulator labels held-out tokens from each explanation, scored by balanced accuracy
(detection accuracy), precision, recall and F1 against the true routing. Baselines: token statistics
(top routed tokens), a bigram routing predictor, the single best SAE feature, the single best
domain; references: the same pipeline on the *true* features (oracle SAE) and a logistic probe on
the raw router input (an upper bound that is not an explanation).

Stage 2 (`lm=True`): a tiny MoE LM (`models.moe`, ffn_type "moe") trained for a few hundred steps on
a mixture of synthetic Markov "domains" that share part of their vocabulary; router inputs and
top-k choices of one layer are collected and the same pipeline is run (no planted ground truth).

Deviations from the paper: no LLM explainer / simulator (rule-based: an explanation is a feature,
token or domain set); d = 128 router inputs (the spec suggests 64: with 16 experts reading 8 features
each, 64 dimensions leave the planted routing rule below 0.8 balanced accuracy); the planted router
is fitted by least squares to the intended logits rather than built from the raw directions.

Recipe:
    python -m experiments run router_interp --preset smoke   # seconds, used by the tests
    python -m experiments run router_interp --preset quick   # 2 CPU cores, a few minutes
    python -m experiments run router_interp --preset paper   # larger worlds and SAE, longer LM
    python -m experiments run router_interp --preset smoke --sae.steps 120   # one field of a config section

Config sections (`run router_interp --help` lists every field): planted, sae, interp, lm (with the LM's own
`lm.model`, e.g. `--lm.model.moe.num-experts 4`); worlds, seed and progress stay top-level.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import pathlib
import time
from typing import Any, Mapping

import jax
import numpy as np
from etils import epath
import tqdm

from algorithms.moe import router_interp as ri
from experiments import _plotting as plotting
from experiments import checks as checks_lib
from experiments import registry, report
from experiments._lm import MoELMConfig
from experiments.checks import Check
from models import sae as sae_lib
from models.transformer import MoEConfig

WORLDS = ("ssh", "single_domain", "single_domain_exclusive")
METHODS = ("RouterInterp (alignment)", "RouterInterp (L1 probe)", "token statistics", "bigram predictor",
           "single best feature", "single domain", "oracle features (alignment)", "raw-input probe")
_CACHE_VERSION = 1


@dataclasses.dataclass(frozen=True, kw_only=True)
class PlantedSection:
    """Stage 1: the planted-feature worlds and their router (``--planted.d-model 64``)."""

    train_sequences: int = 1000
    test_sequences: int = 300
    seq_len: int = 32
    d_model: int = 128
    num_domains: int = 8
    vocab_size: int = 128
    num_groups: int = 8
    num_experts: int = 16
    top_k: int = 2
    num_noise_features: int = 128
    shared_token_prob: float = 0.4


@dataclasses.dataclass(frozen=True, kw_only=True)
class SAESection:
    """The TopK SAE on the planted worlds' router inputs; batch size and learning rate also train the LM
    stage's SAE (``--sae.steps 4000``)."""

    latents: int = 512
    k: int = 8
    steps: int = 2000
    batch_size: int = 1024
    learning_rate: float = 1e-3


@dataclasses.dataclass(frozen=True, kw_only=True)
class InterpSection:
    """RouterInterp's explanations, the probes and the checks' tie margin (``--interp.min-precision 0.7``)."""

    min_precision: float = 0.6
    target_recall: float = 0.95
    max_features: int = 20
    probe_c: float = 0.05
    probe_rows: int = 8000
    match_cosine: float = 0.9
    tie_margin: float = 0.02  # |difference in balanced accuracy| below which two methods tie


@dataclasses.dataclass(frozen=True, kw_only=True)
class LMSection:
    """Stage 2: the tiny MoE LM on Markov domains and the SAE on one layer's router inputs (``--lm.steps 600``,
    ``--lm.model.moe.num-experts 4``; ``--lm.no-enabled`` skips the stage)."""

    enabled: bool = True
    domains: int = 6
    vocab: int = 48
    seq_len: int = 48
    model: MoELMConfig = MoELMConfig(d_model=64, num_layers=2, num_heads=4, num_kv_heads=2, d_ff=128,
                                     moe=MoEConfig(num_experts=8, experts_per_token=2))
    steps: int = 300
    batch_size: int = 32
    learning_rate: float = 3e-3
    layer: int = -1  # which MoE layer to explain (-1: the last)
    eval_sequences: int = 400
    sae_latents: int = 256
    sae_k: int = 8
    sae_steps: int = 1500


@dataclasses.dataclass(frozen=True, kw_only=True)
class Config:
    """router_interp settings, in sections overridden on the command line as ``--sae.latents 256``."""

    worlds: tuple[str, ...] = WORLDS
    planted: PlantedSection = PlantedSection()
    sae: SAESection = SAESection()
    interp: InterpSection = InterpSection()
    lm: LMSection = LMSection()
    seed: int = 0
    progress: bool = True

    def __post_init__(self):
        err = registry.ConfigError
        bad = [w for w in self.worlds if w not in WORLDS]
        if bad:
            raise err("worlds", f"must be a subset of {WORLDS}, got extra {bad}")
        if "ssh" not in self.worlds or not ({"single_domain", "single_domain_exclusive"} & set(self.worlds)):
            raise err("worlds", f"must include 'ssh' and a single-domain control, got {self.worlds}")
        if not 0.0 < self.interp.min_precision <= 1.0:
            raise err("interp.min_precision", f"must be in (0, 1], got {self.interp.min_precision}")


# The flat field names the config had before it was split into sections, in their old order: the LM's
# training fingerprint is the old flat repr, so checkpoints written before the split stay valid.
_FLAT_FIELDS = (
    ("worlds", "worlds"),
    *((f, f"planted.{f}") for f in ("train_sequences", "test_sequences", "seq_len", "d_model", "num_domains",
                                     "vocab_size", "num_groups", "num_experts", "top_k", "num_noise_features",
                                     "shared_token_prob")),
    *((f"sae_{f}", f"sae.{f}") for f in ("latents", "k", "steps", "batch_size", "learning_rate")),
    *((f, f"interp.{f}") for f in ("min_precision", "target_recall", "max_features", "probe_c", "probe_rows",
                                    "match_cosine", "tie_margin")),
    ("lm", "lm.enabled"),
    *((f"lm_{f}", f"lm.{f}") for f in ("domains", "vocab", "seq_len", "model", "steps", "batch_size",
                                        "learning_rate", "layer", "eval_sequences", "sae_latents", "sae_k",
                                        "sae_steps")),
    ("seed", "seed"), ("progress", "progress"),
)


def _lm_fingerprint(c: Config) -> str:
    """The LM run's fingerprint: the repr of the pre-sections flat config with ``worlds=()`` and
    ``progress=True`` (``Config(worlds=(), train_sequences=1000, ...)``)."""
    return registry.flat_repr(c, _FLAT_FIELDS, replace={"progress": True, "worlds": ()})


# ------------------------------------------------------------------------------------------------
# The pipeline on one dataset (planted world or LM layer).
# ------------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Data:
    """Router inputs and routing of one split. `codes`/`directions` only for planted worlds."""

    x: np.ndarray
    labels: np.ndarray
    token_ids: np.ndarray
    prev_token_ids: np.ndarray
    domain_ids: np.ndarray
    codes: np.ndarray | None = None


def _sae(c: Config, key, x: np.ndarray, latents: int, k: int, steps: int, workdir: pathlib.Path, tag: str):
    """Trains (or loads from the workdir cache) a TopK SAE on x; returns (model, history dict)."""
    blob = json.dumps({"v": _CACHE_VERSION, "tag": tag, "latents": latents, "k": k, "steps": steps,
                       "bs": c.sae.batch_size, "lr": c.sae.learning_rate,
                       "x": hashlib.sha1(np.ascontiguousarray(x).tobytes()).hexdigest()}, sort_keys=True)
    path = workdir / "cache" / f"sae_{tag}_{hashlib.sha1(blob.encode()).hexdigest()[:12]}.npz"
    cfg = sae_lib.SAETrainConfig(num_latents=latents, k=k, steps=steps, batch_size=c.sae.batch_size,
                                 learning_rate=c.sae.learning_rate, warmup_steps=min(100, steps),
                                 progress=c.progress)
    from flax import nnx

    if path.exists():
        z = np.load(path)
        model = sae_lib.TopKSAE(x.shape[1], latents, k=k, rngs=nnx.Rngs(0))
        for name in ("w_enc", "b_enc", "w_dec", "b_dec"):
            getattr(model, name)[...] = z[name]
        return model, {"final_nmse": float(z["nmse"][-1]), "final_dead_fraction": float(z["dead"][-1]),
                       "cached": True, "nmse": z["nmse"]}
    model, hist = sae_lib.train_sae(key, x, cfg)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, **{name: np.asarray(getattr(model, name)[...]) for name in ("w_enc", "b_enc", "w_dec", "b_dec")},
             nmse=hist.nmse, dead=hist.dead_fraction)
    return model, {"final_nmse": float(hist.nmse[-1]), "final_dead_fraction": float(hist.dead_fraction[-1]),
                   "cached": False, "nmse": hist.nmse}


def _encode(model, x: np.ndarray, chunk: int) -> np.ndarray:
    return sae_lib.encode_numpy(model, x, chunk=chunk)


def _domains_per_expert(sets, active, domain_ids, num_domains) -> float:
    """Mean number of distinct dominant domains among each expert's selected features."""
    out = []
    for fs in sets:
        doms = set()
        for i in fs.features:
            rows = active[:, i]
            if rows.any():
                doms.add(int(np.bincount(domain_ids[rows], minlength=num_domains).argmax()))
        out.append(len(doms))
    return float(np.mean(out)) if out else 0.0


def _pipeline(c: Config, train: Data, test: Data, router_w: np.ndarray, sae_model, vocab: int, num_domains: int,
              *, true_directions=None, planted_sets=None) -> dict:
    dec = np.asarray(sae_model.decoder_directions(), np.float64)
    chunk = min(8192, train.x.shape[0])  # one compiled shape for both splits
    codes_tr, codes_te = _encode(sae_model, train.x, chunk), _encode(sae_model, test.x, chunk)
    act_tr, act_te = codes_tr > 0, codes_te > 0
    ctx = ri.TokenContext(active=act_te, token_ids=test.token_ids, domain_ids=test.domain_ids,
                          prev_token_ids=test.prev_token_ids)
    greedy = dict(min_precision=c.interp.min_precision, target_recall=c.interp.target_recall,
                  max_features=c.interp.max_features)
    y_tr, y_te = train.labels, test.labels
    desc = ri.describe_features(act_tr, train.token_ids, train.domain_ids)

    res, sets_by = {}, {}
    align = ri.alignment_scores(router_w, dec, codes_tr)
    sets_by["alignment"] = ri.select_feature_sets(act_tr, y_tr, align, **greedy)
    ex_align = ri.explain_experts(sets_by["alignment"], descriptions=desc)
    res["RouterInterp (alignment)"] = ri.evaluate_explanations(ex_align, ctx, y_te)
    probe = ri.probe_scores(codes_tr, y_tr, c=c.interp.probe_c, max_rows=c.interp.probe_rows, seed=c.seed)
    sets_by["probe"] = ri.select_feature_sets(act_tr, y_tr, probe, **greedy)
    res["RouterInterp (L1 probe)"] = ri.evaluate_explanations(
        ri.explain_experts(sets_by["probe"], descriptions=desc), ctx, y_te)
    res["token statistics"] = ri.evaluate_explanations(
        ri.token_statistics_explanations(train.token_ids, y_tr, vocab, **greedy), ctx, y_te)
    bigram = ri.BigramPredictor(vocab).fit(train.prev_token_ids, train.token_ids, y_tr)
    res["bigram predictor"] = ri.macro_detection(bigram.predict(test.prev_token_ids, test.token_ids), y_te)
    res["single best feature"] = ri.evaluate_explanations(
        ri.single_feature_explanations(act_tr, y_tr, descriptions=desc), ctx, y_te)
    res["single domain"] = ri.evaluate_explanations(
        ri.single_domain_explanations(train.domain_ids, y_tr, num_domains), ctx, y_te)
    if train.codes is not None and true_directions is not None:
        ta_tr, ta_te = train.codes > 0, test.codes > 0
        tal = ri.alignment_scores(router_w, true_directions, train.codes)
        tsets = ri.select_feature_sets(ta_tr, y_tr, tal, **greedy)
        res["oracle features (alignment)"] = ri.evaluate_explanations(
            ri.explain_experts(tsets), ctx._replace(active=ta_te), y_te)
    res["raw-input probe"] = ri.macro_detection(
        ri.raw_probe_predictions(train.x, y_tr, test.x, max_rows=c.interp.probe_rows, seed=c.seed), y_te)

    out = {"detection": {m: r["mean"] for m, r in res.items()},
           "per_expert_balanced_accuracy": {m: [p["balanced_accuracy"] for p in r["per_expert"]] for m, r in res.items()},
           "features_per_expert": float(np.mean([len(s.features) for s in sets_by["alignment"]])),
           "domains_per_expert": _domains_per_expert(sets_by["alignment"], act_tr, train.domain_ids, num_domains),
           "example_explanations": [ex.text for ex in ex_align[:3]],
           "sae_mean_l0": float(np.mean(np.count_nonzero(codes_te, axis=1)))}
    if true_directions is not None and planted_sets is not None:
        match = ri.match_features(dec, true_directions, min_cosine=c.interp.match_cosine)
        out["sae_true_features_matched"] = int(len(set(match[match >= 0].tolist())))
        out["num_true_features"] = int(true_directions.shape[0])
        for name, sets in sets_by.items():
            rec = ri.set_recovery([s.features for s in sets], planted_sets, matching=match)
            out[f"planted_set_recovery_{name}"] = {k: v for k, v in rec.items() if not k.startswith("per_")}
    return out


# ------------------------------------------------------------------------------------------------
# Stage 1: planted worlds.
# ------------------------------------------------------------------------------------------------

def _world_kwargs(c: Config, world: str) -> dict:
    pc = c.planted
    return dict(kind="ssh" if world == "ssh" else "single_domain", seq_len=pc.seq_len, d_model=pc.d_model,
                num_domains=pc.num_domains, vocab_size=pc.vocab_size, num_groups=pc.num_groups,
                num_experts=pc.num_experts, top_k=pc.top_k, num_noise_features=pc.num_noise_features,
                shared_token_prob=0.0 if world == "single_domain_exclusive" else pc.shared_token_prob)


def _data(w: ri.PlantedWorld) -> Data:
    return Data(w.x, w.labels, w.token_ids, w.prev_token_ids, w.domain_ids, w.codes)


def _run_world(c: Config, world: str, workdir: pathlib.Path) -> dict:
    key = jax.random.fold_in(jax.random.key(c.seed), WORLDS.index(world))
    k_tr, k_te, k_sae = jax.random.split(key, 3)
    kw = _world_kwargs(c, world)
    tr = ri.planted_world(k_tr, num_sequences=c.planted.train_sequences, **kw)
    te = ri.planted_world(k_te, num_sequences=c.planted.test_sequences, router_world=tr, **kw)
    planted = tr.codes > 0
    rule = np.stack([planted[:, list(s)].any(1) for s in tr.planted_sets], 1)
    t0 = time.time()
    model, hist = _sae(c, k_sae, tr.x, c.sae.latents, c.sae.k, c.sae.steps, workdir, world)
    sae_s = time.time() - t0
    out = _pipeline(c, _data(tr), _data(te), tr.router_w, model, tr.vocab_size, tr.num_domains,
                    true_directions=tr.directions, planted_sets=tr.planted_sets)
    out.update(planted_rule_balanced_accuracy=ri.macro_detection(rule, tr.labels)["mean"]["balanced_accuracy"],
               num_features=int(tr.codes.shape[1]), train_tokens=int(tr.x.shape[0]), test_tokens=int(te.x.shape[0]),
               planted_set_size=float(np.mean([len(s) for s in tr.planted_sets])),
               sae_final_nmse=hist["final_nmse"], sae_dead_fraction=hist["final_dead_fraction"], sae_seconds=sae_s,
               sae_nmse_curve=np.asarray(hist["nmse"])[:: max(1, len(hist["nmse"]) // 100)].tolist())
    return out


# ------------------------------------------------------------------------------------------------
# Stage 2: a tiny MoE LM on a mixture of synthetic Markov domains.
# ------------------------------------------------------------------------------------------------

def markov_domains(key: jax.Array, *, num_domains: int, vocab_size: int, tokens_per_domain: int | None = None,
                   shared_fraction: float = 0.5, successors: int = 3):
    """Random sparse Markov chains, one per domain, over overlapping vocabularies.

    Each domain uses `tokens_per_domain` tokens: half drawn from a pool shared by all domains, half its
    own; each token has `successors` random next tokens inside its domain with Dirichlet(1) weights.
    Returns (transition [D, V, V] float64, start [D, V], token sets [D] lists).
    """
    rng = np.random.default_rng(np.asarray(jax.random.key_data(key)).ravel().tolist())
    n_shared = int(round(shared_fraction * vocab_size))
    own = np.array_split(np.arange(n_shared, vocab_size), num_domains)
    tpd = tokens_per_domain or (len(own[0]) + max(1, n_shared // 2))
    trans = np.zeros((num_domains, vocab_size, vocab_size))
    start = np.zeros((num_domains, vocab_size))
    sets = []
    for d in range(num_domains):
        toks = np.concatenate([rng.choice(n_shared, max(1, tpd - len(own[d])), replace=False), own[d]])
        sets.append(sorted(toks.tolist()))
        for v in toks:
            nxt = rng.choice(toks, min(successors, len(toks)), replace=False)
            trans[d, v, nxt] = rng.dirichlet(np.ones(len(nxt)))
        start[d, toks] = 1.0 / len(toks)
    return trans, start, sets


def sample_markov(rng: np.random.Generator, trans, start, num_sequences: int, seq_len: int):
    """Samples sequences [n, seq_len] and their domains [n] from `markov_domains` chains."""
    D, V, _ = trans.shape
    dom = rng.integers(0, D, num_sequences)
    seqs = np.zeros((num_sequences, seq_len), np.int64)
    cdf = np.cumsum(trans, axis=2)
    seqs[:, 0] = [rng.choice(V, p=start[d]) for d in dom]
    for t in range(1, seq_len):
        u = rng.random(num_sequences)[:, None]
        seqs[:, t] = np.minimum((u > cdf[dom, seqs[:, t - 1]]).sum(1), V - 1)
    return seqs, dom


def _lm_optimizer(c: Config):
    from algorithms import training

    return training.OptimizerConfig(learning_rate=c.lm.learning_rate, warmup_steps=min(50, c.lm.steps),
                                    total_steps=c.lm.steps)


def train_step(c: Config):
    """The MoE LM's training step (`_run_lm`, batches of ``lm.batch_size`` x ``lm.seq_len`` tokens), for
    ``python -m experiments aot router_interp`` (`experiments.aot`).

    Raises:
      ValueError: the preset skips the LM stage (``lm.enabled`` False), so `run` trains no LM.
    """
    from experiments import aot

    if not c.lm.enabled:
        raise ValueError("router_interp trains no LM with lm.enabled=False (this preset skips the LM stage); "
                         "pass a preset with the LM stage, e.g. --preset paper")
    return aot.TrainStep(model=c.lm.model.transformer(c.lm.vocab), optimizer=_lm_optimizer(c),
                         batch_size=c.lm.batch_size, seq_len=c.lm.seq_len)


def _run_lm(c: Config, workdir: pathlib.Path) -> dict:
    from algorithms import training
    from models.transformer import Transformer

    key = jax.random.fold_in(jax.random.key(c.seed), 100)
    k_dom, k_sae = jax.random.split(key)
    trans, start, _ = markov_domains(k_dom, num_domains=c.lm.domains, vocab_size=c.lm.vocab)
    lm, top_k = c.lm.model, c.lm.model.moe.experts_per_token
    cfg = lm.transformer(c.lm.vocab)

    def batch_fn(position):
        rng = np.random.default_rng([c.seed, position])
        seqs, _ = sample_markov(rng, trans, start, c.lm.batch_size, c.lm.seq_len + 1)
        return {"inputs": seqs[:, :-1], "targets": seqs[:, 1:],
                "loss_mask": np.ones((c.lm.batch_size, c.lm.seq_len), np.float32)}

    opt = _lm_optimizer(c)
    t0 = time.time()
    result = training.fit(model_fn=lambda rngs: Transformer(cfg, rngs=rngs), optimizer_config=opt, batch_fn=batch_fn,
                          num_steps=c.lm.steps, workdir=workdir / "lm", seed=c.seed,
                          checkpoint_every=max(1, c.lm.steps), log_every=max(1, c.lm.steps // 10),
                          progress=c.progress, desc="router_interp lm",
                          fingerprint=_lm_fingerprint(c))
    lm_s = time.time() - t0
    model = result.model()
    layer = c.lm.layer % lm.num_layers

    def collect(seed, n):
        rng = np.random.default_rng([c.seed, seed])
        seqs, dom = sample_markov(rng, trans, start, n, c.lm.seq_len + 1)
        xs, ys = [], []
        for i in range(0, n, 64):
            out = model(seqs[i:i + 64, :-1], return_intermediates=True)
            aux = out.intermediates["ffn_aux"][layer]
            xs.append(np.asarray(aux["router_inputs"], np.float32).reshape(-1, lm.d_model))
            idx = np.asarray(aux["expert_indices"]).reshape(-1, top_k)
            y = np.zeros((idx.shape[0], lm.moe.num_experts), bool)
            np.put_along_axis(y, idx, True, axis=1)
            ys.append(y)
        tok = seqs[:, :-1]
        prev = np.concatenate([np.zeros((n, 1), np.int64), seqs[:, :-2]], axis=1)  # position 0: token 0 as "BOS"
        return Data(np.concatenate(xs), np.concatenate(ys), tok.ravel(), prev.ravel(),
                    np.repeat(dom, c.lm.seq_len))

    train, test = collect(1, c.lm.eval_sequences), collect(2, max(1, c.lm.eval_sequences // 2))
    rows = np.asarray(model.layers[layer].ffn.router_rows(), np.float64)
    # Check that the recorded top-k is what the recorded logits and rows give (linear router).
    consistent = float(np.mean(ri.route(rows, train.x[:2000], top_k) == train.labels[:2000]))
    t1 = time.time()
    sae_model, hist = _sae(c, k_sae, train.x, c.lm.sae_latents, c.lm.sae_k, c.lm.sae_steps, workdir, "lm")
    out = _pipeline(c, train, test, rows, sae_model, c.lm.vocab, c.lm.domains)
    out.update(lm_final_loss=float(result.history[-1]["loss"]) if result.history else float("nan"),
               lm_seconds=lm_s, sae_seconds=time.time() - t1, sae_final_nmse=hist["final_nmse"],
               routing_recomputed_agreement=consistent, layer=layer,
               expert_load=train.labels.mean(0).tolist(), train_tokens=int(train.x.shape[0]))
    return out


# ------------------------------------------------------------------------------------------------
# Run, verdict, plots.
# ------------------------------------------------------------------------------------------------

def _bacc(res: dict, method: str) -> float:
    return res["detection"][method]["balanced_accuracy"]


def _checks(c: Config, worlds: dict, gain: dict) -> tuple[list[Check], tuple[bool, ...]]:
    """The claim checks, fixed before the run (`tie_margin` in balanced accuracy): in the SSH world
    RouterInterp beats token statistics and the single best feature / single domain by more than the
    margin; in the single-domain controls it ties (within the margin) with the single-domain explanation;
    its relative gain over token statistics is larger in SSH than in every control. That the exclusive
    control also ties with token statistics is reported, not required."""
    ri_m, tok_m = "RouterInterp (alignment)", "token statistics"
    ssh = worlds["ssh"]
    margin = f"{c.interp.tie_margin:g}"
    d_tok = _bacc(ssh, ri_m) - _bacc(ssh, tok_m)
    d_single = {m: _bacc(ssh, ri_m) - _bacc(ssh, m) for m in ("single best feature", "single domain")}
    ssh_beats_tokens = d_tok > c.interp.tie_margin
    ssh_beats_single = all(v > c.interp.tie_margin for v in d_single.values())
    controls = [w for w in ("single_domain", "single_domain_exclusive") if w in worlds]
    d_dom = {w: abs(_bacc(worlds[w], ri_m) - _bacc(worlds[w], "single domain")) for w in controls}
    control_ties_domain = all(v <= c.interp.tie_margin for v in d_dom.values())
    excl = worlds.get("single_domain_exclusive")
    control_ties_tokens = excl is not None and abs(_bacc(excl, ri_m) - _bacc(excl, tok_m)) <= c.interp.tie_margin
    gap_larger_in_ssh = all(gain["ssh"] > gain[w] for w in controls)
    checks = [
        Check("SSH: RouterInterp - token statistics, balanced accuracy", d_tok,
              "+57% detection accuracy (gpt-oss-20b)", f"> {margin}", ssh_beats_tokens,
              note=f"relative gain {gain['ssh']:+.0%}"),
        Check("SSH: RouterInterp - best of single feature / single domain, balanced accuracy",
              min(d_single.values()), "feature sets beat single features and domains (SSH)", f"> {margin}",
              ssh_beats_single),
        Check("controls: |RouterInterp - single domain|, balanced accuracy",
              max(d_dom.values()) if d_dom else "no control world", "ties when experts are single-domain",
              f"<= {margin} in every control", control_ties_domain, note=", ".join(controls)),
        Check("relative gain over token statistics, SSH - largest control",
              gain["ssh"] - max(gain[w] for w in controls) if controls else "no control world",
              "larger gain when experts specialise in feature unions", "> 0", gap_larger_in_ssh),
    ]
    if excl is not None:
        checks.append(Check("exclusive control: |RouterInterp - token statistics|, balanced accuracy",
                            abs(_bacc(excl, ri_m) - _bacc(excl, tok_m)), "ties when domains share no tokens",
                            f"<= {margin}", control_ties_tokens, required=False))
    return checks, (ssh_beats_tokens, ssh_beats_single, control_ties_domain, control_ties_tokens, gap_larger_in_ssh)


def headline(metrics: Mapping[str, Any]) -> str:
    """Our small-scale result in one table cell (the README catalog's "ours" column), from the quick result's metrics."""
    ri_m, tok_m = "RouterInterp (alignment)", "token statistics"
    f3 = lambda x: f"{x:.3f}".removeprefix("0")  # 0.876 -> ".876"  # noqa: E731
    ssh = metrics["worlds"]["ssh"]
    text = (f"planted SSH world: {metrics['relative_gain_over_token_statistics']['ssh']:+.0%} balanced acc. over token "
            f"statistics ({f3(_bacc(ssh, ri_m))} vs {f3(_bacc(ssh, tok_m))})")
    if any(w in metrics["worlds"] for w in ("single_domain", "single_domain_exclusive")):
        text += (", ties single domain in control" if metrics["control_ties_single_domain"]
                 else ", does not tie single domain in control")
    lm = metrics.get("lm")
    if lm:
        text += (f"; tiny MoE LM {_bacc(lm, ri_m) / _bacc(lm, tok_m) - 1:+.0%} ({f3(_bacc(lm, ri_m))} vs "
                 f"{f3(_bacc(lm, tok_m))})")
    return text


def run(c: Config, workdir: pathlib.Path) -> dict:
    workdir = epath.Path(workdir)
    worlds = {}
    for w in tqdm.tqdm(c.worlds, desc="router_interp worlds", disable=not c.progress):
        worlds[w] = _run_world(c, w, workdir)
    lm = None
    if c.lm.enabled:
        lm = _run_lm(c, workdir)

    ri_m, tok_m = "RouterInterp (alignment)", "token statistics"
    gain = {w: _bacc(r, ri_m) / _bacc(r, tok_m) - 1.0 for w, r in worlds.items()}
    checks, flags = _checks(c, worlds, gain)
    ssh_beats_tokens, ssh_beats_single, control_ties_domain, control_ties_tokens, gap_larger_in_ssh = flags
    excl = worlds.get("single_domain_exclusive")

    def row(r, m):
        d = r["detection"][m]
        return f"{d['balanced_accuracy']:.3f}"

    parts = []
    for w, r in worlds.items():
        parts.append(
            f"{w}: RouterInterp {row(r, ri_m)} (L1-probe ranking {row(r, 'RouterInterp (L1 probe)')}, "
            f"{r['features_per_expert']:.1f} features and {r['domains_per_expert']:.1f} domains per expert) vs "
            f"token statistics {row(r, tok_m)} ({gain[w]:+.0%}), bigram {row(r, 'bigram predictor')}, "
            f"single feature {row(r, 'single best feature')}, single domain {row(r, 'single domain')}; "
            f"oracle features {row(r, 'oracle features (alignment)')}, raw probe {row(r, 'raw-input probe')}, "
            f"SAE matched {r['sae_true_features_matched']}/{r['num_true_features']} true features, planted sets "
            f"recovered P={r['planted_set_recovery_alignment']['precision']:.2f} "
            f"R={r['planted_set_recovery_alignment']['recall']:.2f}")
    lm_txt = ""
    if lm is not None:
        moe = c.lm.model.moe
        lm_txt = (f" Tiny MoE LM (layer {lm['layer']}, {moe.num_experts} experts top-{moe.experts_per_token}, "
                  f"{c.lm.steps} steps, loss {lm['lm_final_loss']:.2f}): RouterInterp {row(lm, ri_m)} vs token "
                  f"statistics {row(lm, tok_m)} ({_bacc(lm, ri_m) / _bacc(lm, tok_m) - 1:+.0%}), bigram "
                  f"{row(lm, 'bigram predictor')}, single feature {row(lm, 'single best feature')}, single domain "
                  f"{row(lm, 'single domain')}, raw probe {row(lm, 'raw-input probe')}; "
                  f"{lm['features_per_expert']:.1f} features / {lm['domains_per_expert']:.1f} domains per expert.")
    else:
        lm_txt = " Tiny MoE LM stage not run (lm.enabled=False)."
    context = (f"Held-out detection balanced accuracy (rule-based simulator, {c.planted.num_experts} experts "
               f"top-{c.planted.top_k}, macro over experts): " + "; ".join(parts) + "." + lm_txt
               + (f" Exclusive-vocabulary control: RouterInterp and token statistics "
                  f"{'tie' if control_ties_tokens else 'do not tie'} ({row(excl, ri_m)} vs {row(excl, tok_m)})."
                  if excl is not None else ""))
    verdict, reproduced = checks_lib.verdict(
        checks, claim="SAE-feature-set explanations of expert routing detect routing 57% better than "
        "token-statistics explanations (gpt-oss-20b), because experts specialise in unions of fine-grained "
        "features (SSH); here: in the SSH world feature sets beat token statistics, the single best feature and "
        "the single domain, while in the single-domain controls they tie with the single-domain explanation and "
        "the gain over token statistics is smaller", context=context, **_cause(c, worlds, flags))
    metrics = {
        "worlds": worlds,
        "relative_gain_over_token_statistics": gain,
        "ssh_beats_token_statistics": ssh_beats_tokens,
        "ssh_beats_single_feature_and_domain": ssh_beats_single,
        "control_ties_single_domain": control_ties_domain,
        "exclusive_control_ties_token_statistics": control_ties_tokens,
        "gain_larger_in_ssh": gap_larger_in_ssh,
        "lm": lm,
        "checks": [ch.as_dict() for ch in checks],
    }
    plots = [_plot(worlds, lm, workdir)]
    return {"metrics": metrics, "verdict": verdict, "reproduced": reproduced, "plots": plots,
            "cause": None if reproduced else _cause(c, worlds, flags)["cause_class"]}


def _cause(c: Config, worlds: dict, flags: tuple[bool, ...]) -> dict:
    """Why a run did not reproduce, as `checks.verdict`'s ``cause``/``cause_class`` (issue 33).

    The single-domain controls are our own construction, not the paper's: the paper states no tie. When
    every SSH check passes and the controls fail only because RouterInterp falls *below* the single-domain
    explanation by more than ``tie_margin`` (it never beats it), the result does not contradict the claim
    (the gain still comes from the SSH world), so the cause is "check": the fixed margin is stricter than
    anything the paper says. Any other failure is classed "scale"."""
    ssh_beats_tokens, ssh_beats_single, control_ties_domain, _, gap_larger_in_ssh = flags
    ri_m = "RouterInterp (alignment)"
    controls = [w for w in ("single_domain", "single_domain_exclusive") if w in worlds]
    below = all(_bacc(worlds[w], ri_m) - _bacc(worlds[w], "single domain") <= c.interp.tie_margin for w in controls)
    if ssh_beats_tokens and ssh_beats_single and gap_larger_in_ssh and not control_ties_domain and below:
        gaps = ", ".join(f"{w} {_bacc(worlds[w], 'single domain') - _bacc(worlds[w], ri_m):.3f}" for w in controls)
        return {"cause_class": "check",
                "cause": (f"the control tie margin ({c.interp.tie_margin:g}, ours; the paper states no control) is "
                          f"stricter than the claim: in the controls RouterInterp falls below the single-domain "
                          f"explanation (by {gaps}), it never beats it, so the gain is still specific to the SSH "
                          f"world")}
    return {"cause_class": "scale",
            "cause": "the SSH-world advantage or its specificity did not show at this scale"}


def _plot(worlds: dict, lm: dict | None, workdir: pathlib.Path) -> str:
    panels = dict(worlds)
    if lm is not None:
        panels["tiny MoE LM"] = lm
    fig, axes = plotting.subplots(1, len(panels), figsize=(4.2 * len(panels), 4.0), sharey=True)
    axes = np.atleast_1d(axes)
    for ax, (name, r) in zip(axes, panels.items()):
        ms = [m for m in METHODS if m in r["detection"]]
        vals = [r["detection"][m]["balanced_accuracy"] for m in ms]
        colors = ["k" if m.startswith("RouterInterp") else ("tab:gray" if m in ("oracle features (alignment)",
                                                                                 "raw-input probe") else "tab:blue")
                  for m in ms]
        ax.barh(np.arange(len(ms)), vals, color=colors)
        ax.set_yticks(np.arange(len(ms)), ms, fontsize=7)
        ax.axvline(0.5, color="r", lw=0.8, ls=":")
        ax.set(xlim=(0.4, 1.0), xlabel="held-out balanced accuracy", title=name)
        ax.invert_yaxis()
    return report.savefig(fig, workdir / "detection.png")


EXPERIMENT = registry.Experiment(
    slug="router_interp",
    config_cls=Config,
    presets={
        "smoke": lambda: Config(
            worlds=("ssh", "single_domain"),
            planted=PlantedSection(train_sequences=60, test_sequences=30, seq_len=16, d_model=32, num_domains=4,
                                   vocab_size=32, num_groups=4, num_experts=8, num_noise_features=16),
            sae=SAESection(latents=96, k=6, steps=60, batch_size=256), interp=InterpSection(probe_rows=500),
            lm=LMSection(enabled=False), progress=False),
        "quick": lambda: Config(),
        "paper": lambda: Config(
            planted=PlantedSection(train_sequences=4000, test_sequences=1000),
            sae=SAESection(latents=1024, steps=8000),
            lm=LMSection(steps=3000, model=MoELMConfig(d_model=64, num_layers=4, num_heads=4, num_kv_heads=2, d_ff=128,
                                                       moe=MoEConfig(num_experts=8, experts_per_token=2)),
                         eval_sequences=2000, sae_steps=6000)),
    },
    run=run,
    train_step=train_step,
)
