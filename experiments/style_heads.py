"""Style Modulation Heads: steer a few localized attention heads instead of the residual stream.

The claim (Izawa et al., ICML 2026, arXiv:2603.13249): persona / style is carried by a sparse set of
attention heads (three, in one layer of Qwen2.5-7B-Instruct), found by layer-wise cosine similarity of
mean-difference vectors and head-wise contribution scores; steering only those heads controls the trait
with much less coherence loss than residual-stream steering (a better trait-vs-coherence Pareto front).

Reproduction at toy scale (spec ``rl_alignment_agents.md`` section 8 (d)):

  1. Train a tiny decoder LM (`models.Transformer`, `algorithms.training.fit`) on
     `experiments.tasks.style_corpus`: one-digit additions answered in a "formal" or a "casual" style
     (style words in four slots), chosen by a style marker token in the prompt; unmarked prompts are
     answered formally (the default "assistant" style).
  2. Extraction (as Persona Vectors / the official code): generate answers to the same questions under
     the ``<casual>`` (pos) and ``<formal>`` (neg) markers, keep pairs that pass the official filter
     (trait score of pos >= 50, of neg < 50, coherence >= 50 for both; scored 0/100 by the exact
     classifier), and take mean differences over the response tokens at every layer and hook point.
  3. Localization (`algorithms.alignment.style_heads`): the layer where the residual direction forms
     (`localize_layer`, inferred rule), then head-wise contribution z-scores at that layer.
  4. Steering on unmarked test prompts (the marker withheld), over a coefficient sweep: the top-k heads
     of the layer (k = 1, 2, 3, ...), random 3-head sets of the same layer (control), and the
     residual stream after the same block (baseline). Trait-control rate: share of sampled generations
     classified as the target style by the exact style classifier. Coherence: perplexity of the
     generation under the unsteered model (conditioned on the question with the style marker that
     explains the generation best, i.e. min over markers; inferred, so that a well-formed answer in the
     target style is not penalized for its style) and task accuracy (the sum is the first number).
  5. Ablation: masking the top-3 heads under the ``<casual>`` marker vs masking random 3-head sets.

Checks (thresholds fixed before any run):
  * "3 heads suffice": steering the top-3 heads reaches a trait rate >= ``trait_threshold`` (0.9) at some
    coefficient while task accuracy stays >= ``accuracy_retention`` (0.9) x the unsteered accuracy.
  * "better Pareto front": the area dominated by the (trait rate, 1 / perplexity) points of top-3-head
    steering exceeds that of residual steering over the same coefficient grid (both with the unsteered
    point at c = 0).
  Reported, not required: the same area on (trait rate, task accuracy); top-3 heads vs random 3-head
  sets; ablation of the top-3 heads vs random sets.

Inferred / deviations: the style classifier and perplexity replace the LLM judge's trait and coherency
scores; the coherence reference conditions on the best-fitting style marker; the layer rule of
`localize_layer`; steering touches every position (prompt and response), for heads and residual alike;
coefficient grids are the same for both methods (the paper tunes each: c = 7 heads, c = 2 residual).

Recipe:
    python -m experiments run style_heads --preset smoke   # seconds, used by the tests
    python -m experiments run style_heads --preset quick   # 2 CPU cores, about 1 minute
    python -m experiments run style_heads --preset paper   # longer training, more prompts
"""

from __future__ import annotations

import dataclasses
import pathlib
import time
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
import tqdm
from etils import epath
from flax import nnx

from algorithms import training
from algorithms.alignment import style_heads as sh
from algorithms.decoding import generate
from experiments import _plotting as plotting
from experiments import checks as checks_lib
from experiments import registry, report
from experiments._lm import LMConfig
from experiments.checks import Check
from experiments.tasks import style_corpus as sc
from experiments.tasks.tokenizer import prompt_batch
from models import Transformer
from primitives.sampling import Sampler


@dataclasses.dataclass(frozen=True, kw_only=True)
class CorpusSection:
    """The styled arithmetic corpus (``--corpus.max-operand 12``)."""

    max_operand: int = 9
    marker_prob: float = 0.5


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainSection:
    """LM training (``--train.num-steps 1600``)."""

    batch_size: int = 64
    num_steps: int = 800
    learning_rate: float = 3e-3
    warmup_steps: int = 50


@dataclasses.dataclass(frozen=True, kw_only=True)
class ExtractSection:
    """Extraction of the style vectors and localization (``--extract.samples 512``)."""

    samples: int = 256
    filter_threshold: float = 50.0
    vector_positions: str = "response"  # "response" (official response_avg) or "prompt_last" (prompt_last)
    layer: int = -1  # -1: the layer `localize_layer` picks
    localize_rule: str = "formation"


@dataclasses.dataclass(frozen=True, kw_only=True)
class SteerSection:
    """The steering sweep; c = 0, the unsteered model, is always added (``--steer.head-counts 1 2 4``)."""

    target_style: str = "casual"
    coefficients: tuple[float, ...] = (0.25, 0.35, 0.5, 0.71, 1.0, 1.41, 2.0, 2.83, 4.0, 5.66, 8.0, 11.3, 16.0)
    head_counts: tuple[int, ...] = (1, 2, 3, 4, 8)
    random_head_sets: int = 3
    eval_prompts: int = 256
    temperature: float = 1.0
    max_new_tokens: int = 9


@dataclasses.dataclass(frozen=True, kw_only=True)
class ChecksSection:
    """The checks' thresholds, fixed in advance (``--checks.claimed-heads 2``)."""

    claimed_heads: int = 3
    trait_threshold: float = 0.9
    accuracy_retention: float = 0.9


@dataclasses.dataclass(frozen=True, kw_only=True)
class Config:
    """style_heads settings, in sections overridden on the command line as ``--train.num-steps 400``."""

    corpus: CorpusSection = CorpusSection()
    model: LMConfig = LMConfig(d_model=64, num_layers=4, num_heads=8, num_kv_heads=4, d_ff=128)
    train: TrainSection = TrainSection()
    extract: ExtractSection = ExtractSection()
    steer: SteerSection = SteerSection()
    checks: ChecksSection = ChecksSection()
    seed: int = 0
    progress: bool = True

    def __post_init__(self):
        _validate(self)


def _validate(c: Config) -> None:
    err, st = registry.ConfigError, c.steer
    if st.target_style not in sc.STYLES:
        raise err("steer.target_style", f"must be one of {sc.STYLES}; got {st.target_style!r}")
    if c.extract.vector_positions not in ("response", "prompt_last"):
        raise err("extract.vector_positions", f"must be 'response' or 'prompt_last'; got "
                                              f"{c.extract.vector_positions!r}")
    if c.model.num_layers < 3:
        raise err("model.num_layers", f"must be >= 3 (layer localization needs L - 2 >= 1); got {c.model.num_layers}")
    h = c.model.num_heads
    if not st.head_counts or any(not 1 <= k <= h for k in st.head_counts):
        raise err("steer.head_counts", f"must hold values in [1, model.num_heads={h}]; got {st.head_counts}")
    if c.checks.claimed_heads not in st.head_counts:
        raise err("checks.claimed_heads", f"must be one of steer.head_counts={st.head_counts}; got "
                                          f"{c.checks.claimed_heads}")
    if c.checks.claimed_heads >= h:
        raise err("checks.claimed_heads", f"must be < model.num_heads={h} (random sets need other heads); got "
                                          f"{c.checks.claimed_heads}")
    if not st.coefficients or any(not np.isfinite(x) or x <= 0 for x in st.coefficients):
        raise err("steer.coefficients", f"must be finite positive values; got {st.coefficients}")
    if not -1 <= c.extract.layer < c.model.num_layers:
        raise err("extract.layer", f"must be -1 (localize) or an int in [0, {c.model.num_layers}); got "
                                   f"{c.extract.layer}")
    for path, value in (("steer.eval_prompts", st.eval_prompts), ("extract.samples", c.extract.samples),
                        ("steer.max_new_tokens", st.max_new_tokens)):
        if value < 1:
            raise err(path, f"must be >= 1; got {value}")


# ------------------------------------------------------------------------------------------------
# Generation and scoring.
# ------------------------------------------------------------------------------------------------

class _Evaluator:
    """Samples from the (steered) model and scores generations under the unsteered one."""

    def __init__(self, c: Config, model, corpus: sc.StyleCorpus):
        self.c, self.model, self.corpus = c, model, corpus
        self.tok = corpus.tokenizer()
        self.sampler = Sampler(temperature=c.steer.temperature)
        graphdef, state = nnx.split(model)
        self._state = state
        self._logits = jax.jit(lambda st, t: nnx.merge(graphdef, st)(t).logits)
        self.prompt_len = corpus.max_seq_len - 7 - 1  # BOS + marker + 6 question words

    def generate(self, prompts: list[str], key, model_kwargs=None) -> tuple[np.ndarray, list[list[str]]]:
        b = prompt_batch(self.tok, prompts, seq_len=self.prompt_len)
        out = generate(self.model, jnp.asarray(b["tokens"]), prompt_lengths=jnp.asarray(b["prompt_lengths"]),
                       max_new_tokens=self.c.steer.max_new_tokens, sampler=self.sampler, key=key,
                       stop_tokens=(self.tok.eos_id,), pad_id=self.tok.pad_id, model_kwargs=model_kwargs)
        toks = np.asarray(out.tokens)
        return toks, [self.tok.decode(row).split() for row in toks]

    def nll(self, questions: list[str], gen_tokens: np.ndarray) -> np.ndarray:
        """[n, styles] total NLL of each generation (through its EOS, if any) under the unsteered model,
        given the question with each style's marker; and the token counts [n]."""
        n, N = gen_tokens.shape
        eos, pad = self.tok.eos_id, self.tok.pad_id
        lengths = np.array([(np.argmax(r == eos) + 1) if (r == eos).any() else int((r != pad).sum()) for r in gen_tokens])
        out = []
        for s in sc.STYLES:
            qs = [self.tok.encode(self.corpus.prompt(*_operands(q), s)) for q in questions]
            P = 1 + max(len(q) for q in qs)
            seq = np.full((n, P + N), pad, np.int32)
            mask = np.zeros((n, P + N - 1), np.float32)
            for i, q in enumerate(qs):
                row = [self.tok.bos_id] + q
                seq[i, :len(row)] = row
                seq[i, len(row):len(row) + lengths[i]] = gen_tokens[i, :lengths[i]]
                mask[i, len(row) - 1:len(row) - 1 + lengths[i]] = 1.0
            logits = np.asarray(self._logits(self._state, jnp.asarray(seq)), np.float64)[:, :-1]
            logp = logits - _logsumexp(logits)
            tgt = np.take_along_axis(logp, seq[:, 1:, None].astype(np.int64), axis=-1)[..., 0]
            out.append(-(tgt * mask).sum(1))
        return np.stack(out, 1), lengths

    def score(self, questions: list[str], answers: np.ndarray, gen_tokens: np.ndarray,
              words: list[list[str]]) -> dict[str, float]:
        """Trait rate, style shares, well-formedness, task accuracy and perplexity of one sweep point."""
        target = self.c.steer.target_style
        labels = [sc.classify_style(w) for w in words]
        nll, lengths = self.nll(questions, gen_tokens)
        best = nll.min(axis=1)
        ppl = float(np.exp(best.sum() / max(lengths.sum(), 1)))
        return {
            "trait_rate": float(np.mean([lab == target for lab in labels])),
            "none_rate": float(np.mean([lab == "none" for lab in labels])),
            "well_formed": float(np.mean([sc.well_formed(w) for w in words])),
            "target_well_formed": float(np.mean([sc.well_formed(w, target) for w in words])),
            "accuracy": float(np.mean([sc.answer_correct(w, int(a)) for w, a in zip(words, answers)])),
            "perplexity": ppl,
            "coherence": 1.0 / ppl,
        }


def _operands(question: str) -> tuple[int, int]:
    words = question.split()
    i = words.index("plus")
    return int(words[i - 1]), int(words[i + 1])


def _logsumexp(x: np.ndarray) -> np.ndarray:
    m = x.max(-1, keepdims=True)
    return m + np.log(np.exp(x - m).sum(-1, keepdims=True))


# ------------------------------------------------------------------------------------------------
# Extraction of the style vectors.
# ------------------------------------------------------------------------------------------------

def _extract(c: Config, ev: _Evaluator, key) -> dict:
    """Generates under both markers, filters pairs, and returns the mean-difference vectors."""
    corpus, tok = ev.corpus, ev.tok
    pos_style, neg_style = c.steer.target_style, [s for s in sc.STYLES if s != c.steer.target_style][0]
    rng_prompts, answers = corpus.test_prompts(c.extract.samples, seed=7)
    k_pos, k_neg = jax.random.split(key)
    gens, words = {}, {}
    for s, k in ((pos_style, k_pos), (neg_style, k_neg)):
        qs = [corpus.prompt(*_operands(q), s) for q in rng_prompts]
        gens[s], words[s] = ev.generate(qs, k)
    trait = {s: np.array([100.0 * (sc.classify_style(w) == pos_style) for w in words[s]]) for s in words}
    coh = {s: np.array([100.0 * (sc.well_formed(w) and sc.answer_correct(w, int(a)))
                        for w, a in zip(words[s], answers)]) for s in words}
    keep = sh.filter_pairs(trait[pos_style], trait[neg_style], coh[pos_style], coh[neg_style],
                           threshold=c.extract.filter_threshold)
    nonempty = np.ones_like(keep)
    for s in gens:  # a response needs at least one token to average over
        nonempty &= np.array([any(t not in (tok.eos_id, tok.pad_id) for t in row) for row in gens[s]])
    filtered = bool((keep & nonempty).sum() >= 2)
    # An undertrained LM (smoke scale) passes no pair: keep every non-empty one, and say so in the metrics.
    keep = (keep if filtered else np.ones_like(keep)) & nonempty
    if not keep.any():
        raise RuntimeError("every extraction response was empty: the LM emits EOS at once (train longer)")
    acts, masks = {}, {}
    for s in (pos_style, neg_style):
        qs = [corpus.prompt(*_operands(q), s) for i, q in enumerate(rng_prompts) if keep[i]]
        g = gens[s][keep]
        P = ev.prompt_len
        seq = np.full((len(qs), P + g.shape[1]), tok.pad_id, np.int32)
        mask = np.zeros(seq.shape, np.float32)
        for i, q in enumerate(qs):
            row = [tok.bos_id] + tok.encode(q)
            resp = [t for t in g[i] if t not in (tok.eos_id, tok.pad_id)]
            seq[i, :len(row)] = row
            seq[i, len(row):len(row) + len(resp)] = resp
            if c.extract.vector_positions == "response":
                mask[i, len(row):len(row) + len(resp)] = 1.0
            else:  # "prompt_last": the position that predicts the first response token
                mask[i, len(row) - 1] = 1.0
        acts[s] = {k: v for k, v in sh.hook_activations(ev.model, seq).items() if k in sh.HOOKS}
        masks[s] = mask
    vectors = sh.style_vectors(acts[pos_style], acts[neg_style], pos_mask=masks[pos_style],
                               neg_mask=masks[neg_style])
    return {"vectors": vectors, "kept_pairs": int(keep.sum()) if filtered else 0, "filter_applied": filtered,
            "prompted_trait_rate": {s: float(np.mean([sc.classify_style(w) == pos_style for w in words[s]]))
                                    for s in words}}


# ------------------------------------------------------------------------------------------------
# Run.
# ------------------------------------------------------------------------------------------------

def _method_name(kind: str, k: int | None = None, j: int | None = None) -> str:
    if kind == "heads":
        return f"top-{k} heads"
    if kind == "random":
        return f"random {k} heads #{j}"
    return "residual"


def _corpus(c: Config) -> sc.StyleCorpus:
    return sc.StyleCorpus(max_operand=c.corpus.max_operand, marker_prob=c.corpus.marker_prob, seed=c.seed)


def _optimizer(c: Config) -> training.OptimizerConfig:
    t = c.train
    return training.OptimizerConfig(learning_rate=t.learning_rate, warmup_steps=min(t.warmup_steps, t.num_steps),
                                    total_steps=t.num_steps)


def train_step(c: Config):
    """The LM training step `run` takes, for ``python -m experiments aot style_heads`` (`experiments.aot`)."""
    from experiments import aot

    corpus = _corpus(c)
    inputs = corpus.train_batch(0, batch_size=1)["inputs"]  # every batch is padded to the corpus' max_seq_len
    return aot.TrainStep(model=c.model.transformer(corpus.tokenizer().vocab_size), optimizer=_optimizer(c),
                         batch_size=c.train.batch_size, seq_len=inputs.shape[1])


def _train(c: Config, corpus: sc.StyleCorpus, workdir: epath.Path):
    tok = corpus.tokenizer()
    cfg = c.model.transformer(tok.vocab_size)
    opt = _optimizer(c)
    return training.fit(model_fn=lambda rngs: Transformer(cfg, rngs=rngs), optimizer_config=opt,
                        batch_fn=lambda pos: corpus.train_batch(pos, batch_size=c.train.batch_size),
                        num_steps=c.train.num_steps, workdir=workdir / "lm", seed=c.seed,
                        checkpoint_every=max(1, c.train.num_steps), log_every=max(1, c.train.num_steps // 10),
                        progress=c.progress, desc="style_heads lm",
                        fingerprint=repr(_train_fields(c)))


def _train_fields(c: Config) -> tuple:
    t = c.train
    return (c.corpus.max_operand, c.corpus.marker_prob, c.model, t.batch_size, t.num_steps, t.learning_rate,
            t.warmup_steps, c.seed)


def _best_trait(points: list[dict], min_accuracy: float) -> float:
    ok = [p["trait_rate"] for p in points if p["accuracy"] >= min_accuracy]
    return float(max(ok)) if ok else 0.0


def _hv(points: list[dict], ykey: str) -> float:
    return sh.hypervolume_2d([[p["trait_rate"], p[ykey]] for p in points])


def run(c: Config, workdir: pathlib.Path) -> dict:
    workdir = epath.Path(workdir)
    t0 = time.time()
    corpus = _corpus(c)
    result = _train(c, corpus, workdir)
    model = result.model()
    train_s = time.time() - t0
    L, h = c.model.num_layers, c.model.num_heads
    ev = _Evaluator(c, model, corpus)
    key = jax.random.key(c.seed + 1)
    k_extract, k_eval, k_abl = jax.random.split(key, 3)

    ext = _extract(c, ev, k_extract)
    vec = ext["vectors"]
    residual_vectors = np.asarray(vec["residual"])
    localized = sh.localize_layer(residual_vectors, rule=c.extract.localize_rule)
    layer = localized if c.extract.layer < 0 else c.extract.layer
    wo = sh.output_projections(model)
    z, s = sh.layer_head_contributions(vec["attn_pre_o"], vec["attn_out"], wo)
    z, s = np.asarray(z), np.asarray(s)
    order = sh.top_heads(z[layer], h)

    prompts, answers = corpus.test_prompts(c.steer.eval_prompts, seed=11)
    base_toks, base_words = ev.generate(prompts, k_eval)
    base = ev.score(prompts, answers, base_toks, base_words)
    marked_prompts = [corpus.prompt(*_operands(q), c.steer.target_style) for q in prompts]
    mt, mw = ev.generate(marked_prompts, k_eval)
    marked = ev.score(prompts, answers, mt, mw)

    rng = np.random.default_rng([c.seed, 99])
    top3 = set(order[:c.checks.claimed_heads])
    random_sets = []
    while len(random_sets) < c.steer.random_head_sets:
        cand = tuple(sorted(int(x) for x in rng.choice(h, size=c.checks.claimed_heads, replace=False)))
        if set(cand) != top3 and cand not in random_sets:
            random_sets.append(cand)
        if len(random_sets) >= _n_choose_k(h, c.checks.claimed_heads) - 1:
            break
    methods = [("heads", k, None, order[:k]) for k in c.steer.head_counts]
    methods += [("random", c.checks.claimed_heads, j, hs) for j, hs in enumerate(random_sets)]
    methods.append(("residual", None, None, ()))
    u = jnp.asarray(vec["attn_pre_o"][layer])
    v = jnp.asarray(vec["residual"][layer])
    sweeps: dict[str, list[dict]] = {}
    bar = tqdm.tqdm(total=len(methods) * len(c.steer.coefficients), desc="style_heads sweep", disable=not c.progress)
    for kind, k, j, heads in methods:
        name = _method_name(kind, k, j)
        pts = [dict(base, coef=0.0)]
        for coef in c.steer.coefficients:
            if kind == "residual":
                kw = {"residual_deltas": sh.residual_steering_deltas(v, layer=layer, coef=coef, num_layers=L)}
            else:
                kw = {"head_deltas": sh.head_steering_deltas(u, layer=layer, heads=heads, coef=coef, num_layers=L)}
            toks, words = ev.generate(prompts, k_eval, kw)
            pts.append(dict(ev.score(prompts, answers, toks, words), coef=float(coef)))
            bar.update(1)
        sweeps[name] = pts
    bar.close()

    # Ablation under the target marker: top-3 heads vs random 3-head sets.
    def ablate(heads):
        m = sh.ablation_mask(num_layers=L, num_heads=h, layer=layer, heads=heads)
        t_, w_ = ev.generate(marked_prompts, k_abl, {"head_mask": m})
        return ev.score(prompts, answers, t_, w_)

    abl_top = ablate(order[:c.checks.claimed_heads])
    abl_rand = [ablate(hs) for hs in random_sets]

    # Checks.
    min_acc = c.checks.accuracy_retention * base["accuracy"]
    best_by_k = {k: _best_trait(sweeps[_method_name("heads", k)], min_acc) for k in c.steer.head_counts}
    best_random = [_best_trait(sweeps[_method_name("random", c.checks.claimed_heads, j)], min_acc)
                   for j in range(len(random_sets))]
    best_residual = _best_trait(sweeps["residual"], min_acc)
    k_min = next((k for k in sorted(c.steer.head_counts) if best_by_k[k] >= c.checks.trait_threshold), None)
    top_name = _method_name("heads", c.checks.claimed_heads)
    hv = {name: {"perplexity": _hv(pts, "coherence"), "accuracy": _hv(pts, "accuracy")}
          for name, pts in sweeps.items()}
    three_suffice = best_by_k[c.checks.claimed_heads] >= c.checks.trait_threshold
    better_front = hv[top_name]["perplexity"] > hv["residual"]["perplexity"]
    better_front_acc = hv[top_name]["accuracy"] > hv["residual"]["accuracy"]
    beats_random = bool(best_random) and best_by_k[c.checks.claimed_heads] > float(np.mean(best_random))
    abl_drop_top = marked["trait_rate"] - abl_top["trait_rate"]
    abl_drop_rand = float(np.mean([marked["trait_rate"] - a["trait_rate"] for a in abl_rand])) if abl_rand else 0.0
    checks = [
        Check(f"top-{c.checks.claimed_heads} head steering: best trait rate with accuracy >= "
              f"{c.checks.accuracy_retention:g} x unsteered", best_by_k[c.checks.claimed_heads],
              "3 heads suffice to control persona",
              f">= {c.checks.trait_threshold:g}", three_suffice,
              note=f"smallest k reaching it: {k_min}; unsteered trait rate {base['trait_rate']:.2f}"),
        Check(f"Pareto area (trait rate x 1/perplexity), top-{c.checks.claimed_heads} heads - residual",
              hv[top_name]["perplexity"] - hv["residual"]["perplexity"],
              "better trait-coherency Pareto front than residual steering", "> 0", better_front,
              note=f"heads {hv[top_name]['perplexity']:.3f} vs residual {hv['residual']['perplexity']:.3f}"),
        Check(f"Pareto area (trait rate x task accuracy), top-{c.checks.claimed_heads} heads - residual",
              hv[top_name]["accuracy"] - hv["residual"]["accuracy"], "less coherency degradation", "> 0",
              better_front_acc, required=False),
        Check(f"best trait rate, top-{c.checks.claimed_heads} heads - mean of random "
              f"{c.checks.claimed_heads}-head sets",
              best_by_k[c.checks.claimed_heads] - (float(np.mean(best_random)) if best_random else 0.0),
              "the localized heads matter", "> 0", beats_random, required=False),
        Check(f"ablation under the {c.steer.target_style} marker: trait-rate drop, top-{c.checks.claimed_heads} - "
              "random sets",
              abl_drop_top - abl_drop_rand, "the heads are necessary (ablation)", "> 0",
              abl_drop_top > abl_drop_rand, required=False),
    ]
    context = (f"Tiny LM ({L} layers x {h} heads, d_model {c.model.d_model}, {c.train.num_steps} steps, final loss "
               f"{result.history[-1]['loss'] if result.history else float('nan'):.3f}); {ext['kept_pairs']}/"
               f"{c.extract.samples} extraction pairs kept; localized layer {localized} (used {layer}), top heads "
               f"{list(order[:c.checks.claimed_heads])} "
               f"(z {', '.join(f'{z[layer, i]:.2f}' for i in order[:c.checks.claimed_heads])}). "
               f"Unsteered (marker withheld): trait {base['trait_rate']:.2f}, accuracy {base['accuracy']:.2f}, "
               f"perplexity {base['perplexity']:.2f}; with the {c.steer.target_style} marker: trait "
               f"{marked['trait_rate']:.2f}. "
               f"Best trait rate at accuracy >= {min_acc:.2f}: "
               + ", ".join(f"top-{k} {best_by_k[k]:.2f}" for k in c.steer.head_counts)
               + f", residual {best_residual:.2f}, random {c.checks.claimed_heads}-sets "
               + ", ".join(f"{b:.2f}" for b in best_random)
               + f". {_matched(sweeps, top_name, c.checks.trait_threshold)}")
    cause = ({} if all(ch.passed for ch in checks if ch.required)
             else _cause(c, sweeps, three_suffice, better_front, min_acc))
    verdict, reproduced = checks_lib.verdict(
        checks, claim=f"steering {c.checks.claimed_heads} localized style heads controls the style with less coherence "
        "loss than residual-stream steering (better trait-coherence Pareto front)", context=context, **cause)
    metrics = {
        "train_seconds": train_s,
        "final_loss": float(result.history[-1]["loss"]) if result.history else float("nan"),
        "kept_pairs": ext["kept_pairs"],
        "filter_applied": ext["filter_applied"],
        "prompted_trait_rate": ext["prompted_trait_rate"],
        "claimed_heads": c.checks.claimed_heads,
        "localized_layer": localized,
        "layer": layer,
        "cosine_matrix": np.asarray(sh.cosine_matrix(residual_vectors)).tolist(),
        "adjacent_differences": np.asarray(sh.adjacent_differences(residual_vectors)).tolist(),
        "head_z": z.tolist(),
        "head_scores": s.tolist(),
        "head_order": list(order),
        "random_head_sets": [list(x) for x in random_sets],
        "unsteered": base,
        "marked": marked,
        "sweeps": sweeps,
        "hypervolume": hv,
        "best_trait_by_k": {str(k): v_ for k, v_ in best_by_k.items()},
        "best_trait_residual": best_residual,
        "best_trait_random": best_random,
        "k_min": k_min,
        "ablation": {"top": abl_top, "random": abl_rand, "drop_top": abl_drop_top, "drop_random": abl_drop_rand},
        "checks": [ch.as_dict() for ch in checks],
        "wall_seconds": time.time() - t0,
    }
    plots = _plots(c, metrics, workdir)
    return {"metrics": metrics, "verdict": verdict, "reproduced": reproduced, "plots": plots,
            "cause": None if reproduced else cause.get("cause_class")}


def _n_choose_k(n: int, k: int) -> int:
    from math import comb

    return comb(n, k)


def _matched(sweeps: dict, top_name: str, thr: float) -> str:
    """Coherence of each method at the smallest coefficient reaching the trait threshold."""
    parts = []
    for name in (top_name, "residual"):
        hit = [p for p in sweeps[name] if p["trait_rate"] >= thr]
        if hit:
            p = hit[0]
            parts.append(f"{name} first reaches trait >= {thr:g} at c = {p['coef']:g} (trait {p['trait_rate']:.2f}, "
                         f"perplexity {p['perplexity']:.2f}, accuracy {p['accuracy']:.2f})")
        else:
            parts.append(f"{name} never reaches trait >= {thr:g}")
    return "; ".join(parts) + "."


def _cause(c: Config, sweeps: dict, three_suffice: bool, better_front: bool, min_acc: float) -> dict:
    """Why a run did not reproduce, with the numbers (`checks.verdict`'s ``cause``/``cause_class``)."""
    parts = []
    top = sweeps[_method_name("heads", c.checks.claimed_heads)]
    if not three_suffice:
        hit = [p for p in top if p["trait_rate"] >= c.checks.trait_threshold]
        if hit:
            p = hit[0]
            parts.append(f"top-{c.checks.claimed_heads} head steering does reach trait {p['trait_rate']:.2f} (c = {p['coef']:g}) "
                         f"but with accuracy {p['accuracy']:.2f} < {min_acc:.2f}: on a {c.model.num_layers}-layer toy LM "
                         "the style is spread over more heads than the paper's 7B models concentrate it in")
        else:
            parts.append(f"top-{c.checks.claimed_heads} head steering never reaches trait {c.checks.trait_threshold:g} on the "
                         "coefficient grid")
    if not better_front:
        parts.append("residual steering's front is at least as good on this toy LM")
    return {"cause_class": "scale", "cause": "; ".join(parts)}


def headline(metrics: Mapping[str, Any]) -> str:
    """Our small-scale result in one table cell (the README catalog's "ours" column)."""
    hv = metrics["hypervolume"]
    k = str(metrics["claimed_heads"])
    top = f"top-{k} heads"
    return (f"top-{k} heads: trait {metrics['best_trait_by_k'][k]:.0%} (residual {metrics['best_trait_residual']:.0%}); "
            f"Pareto area heads {hv[top]['perplexity']:.3f} vs residual {hv['residual']['perplexity']:.3f}; "
            f"k_min={metrics['k_min']}")


def _plots(c: Config, m: dict, workdir: epath.Path) -> list[str]:
    cmap = plotting.colormap("viridis")
    fig, axes = plotting.subplots(1, 2, figsize=(11, 4.2))
    names = list(m["sweeps"])
    heads_names = [n for n in names if n.startswith("top-")]
    for name in names:
        pts = m["sweeps"][name]
        x = [p["trait_rate"] for p in pts]
        if name == "residual":
            style = dict(color="tab:red", marker="s", lw=2)
        elif name.startswith("random"):
            style = dict(color="tab:gray", marker=".", lw=0.8, alpha=0.7)
        else:
            i = heads_names.index(name)
            style = dict(color=cmap(i / max(1, len(heads_names) - 1)), marker="o",
                         lw=2.5 if name == f"top-{c.checks.claimed_heads} heads" else 1.0)
        axes[0].plot(x, [p["coherence"] for p in pts], label=name, **style)
        axes[1].plot(x, [p["accuracy"] for p in pts], label=name, **style)
    axes[0].set(xlabel=f"trait-control rate ({c.steer.target_style})", ylabel="coherence = 1 / perplexity (unsteered LM)",
                title=f"trait vs coherence, layer {m['layer']}")
    axes[1].set(xlabel=f"trait-control rate ({c.steer.target_style})", ylabel="task accuracy",
                title="trait vs task accuracy")
    plotting.legend(axes[0], fontsize=7)
    out = [report.savefig(fig, workdir / "trait_vs_coherence.png")]

    fig, axes = plotting.subplots(1, 2, figsize=(11, 4.0))
    ks = [int(k) for k in m["best_trait_by_k"]]
    axes[0].plot(ks, [m["best_trait_by_k"][str(k)] for k in ks], "o-", label="top-k heads")
    if m["best_trait_random"]:
        axes[0].scatter([c.checks.claimed_heads] * len(m["best_trait_random"]), m["best_trait_random"], color="tab:gray",
                        label=f"random {c.checks.claimed_heads}-head sets", zorder=3)
    axes[0].axhline(m["best_trait_residual"], color="tab:red", ls="--", label="residual")
    axes[0].axhline(c.checks.trait_threshold, color="k", ls=":", lw=0.8)
    axes[0].set(xlabel="k (heads steered)", ylabel="best trait rate (accuracy kept)", ylim=(-0.02, 1.02),
                title="how many heads suffice")
    plotting.legend(axes[0], fontsize=8)
    zz = np.asarray(m["head_z"])
    im = axes[1].imshow(zz, aspect="auto", cmap="coolwarm")
    axes[1].set(xlabel="head", ylabel="layer", title="head contribution z-scores")
    fig.colorbar(im, ax=axes[1])
    out.append(report.savefig(fig, workdir / "trait_vs_k.png"))
    return out


EXPERIMENT = registry.Experiment(
    slug="style_heads",
    config_cls=Config,
    presets={
        "smoke": lambda: Config(model=LMConfig(d_model=32, num_layers=3, num_heads=4, num_kv_heads=2, d_ff=64),
                                train=TrainSection(batch_size=32, num_steps=40), extract=ExtractSection(samples=16),
                                steer=SteerSection(coefficients=(1.0, 4.0), head_counts=(1, 2), random_head_sets=1,
                                                   eval_prompts=16, max_new_tokens=8),
                                checks=ChecksSection(claimed_heads=2), progress=False),
        "quick": lambda: Config(),
        "paper": lambda: Config(model=LMConfig(d_model=128, num_layers=6, num_heads=8, num_kv_heads=4, d_ff=384),
                                train=TrainSection(num_steps=3000), extract=ExtractSection(samples=1024),
                                steer=SteerSection(eval_prompts=1024, coefficients=(0.25, 0.5, 1.0, 2.0, 3.0, 4.0, 6.0,
                                                                                    8.0, 12.0, 16.0, 32.0))),
    },
    run=run,
    train_step=train_step,
)
