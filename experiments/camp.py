"""CAMP (Zong, Zhang, Wang, ICML 2026): conflict-aware adaptive margins for truthfulness vs helpfulness.

Setting (`experiments/tasks/question_world.py`, spec section 6(d)): (entity, relation) questions with
exact answers; 60% of the facts are *known* (in the SFT data), the others are withheld, so the tiny
LM can only guess them. A response is a confident answer, a hedged answer ("maybe a7") or "IDK",
rated by rule on truthfulness T and helpfulness H; abstaining is truthful but unhelpful, a confident
guess looks helpful but is false, so the two objectives conflict on a known subset of pairs.

1. SFT a tiny decoder LM on the known facts (confident answers only).
2. Preference data on half the questions (the "preference questions"; both kinds, stratified):
   per question K samples of the SFT model itself (temperature 1), the true answer when the fact is
   known, a hedged version of every answer, and IDK; every pair of distinct candidates is rated on
   both objectives (pairs tied on both are dropped). The fraction of conflicting pairs is measured.
3. From the same SFT model, the same pairs, seed and number of steps, one run per method of
   `algorithms.alignment.camp.METHODS`: DPO on truthfulness, DPO on helpfulness, the fixed 50/50
   mixture of the two DPO losses, MODPO (truthfulness preference, helpfulness margin), CAMP without its
   margin (ablation) and CAMP.
4. Greedy answers scored exactly: truthfulness (mean T rating: 1 - hallucination, hedged wrong
   answers count half) over all preference questions, helpfulness (known preference questions
   answered correctly). The held-out half (facts known or withheld the same way, never in a
   preference pair) is judged too: a 2-layer model may have no way to tell an unseen withheld fact
   from an unseen known one except its memory of the SFT facts, and then the claim does not show.

Checks (fixed before the first run; the spec gives no numbers, the claim gives directions):
  * CAMP's truthfulness > helpfulness-DPO's and > the mixture's;
  * CAMP's helpfulness >= the best method's helpfulness - HELP_MARGIN (0.05);
  * conflicting pairs are a minority (< 50% of the rated pairs);
  * on the held-out questions, CAMP's truthfulness exceeds helpfulness-DPO's by more than 2 standard
    errors of the difference (made required in review, after the first quick run: the paper's claim is
    about hallucination benchmarks, i.e. unseen questions);
  not required: CAMP >= its no-margin ablation in truthfulness.

Recipe:
    python -m experiments run camp --preset smoke   # seconds, used by the tests
    python -m experiments run camp --preset quick   # 2 CPU cores, about 35 seconds
    python -m experiments run camp --preset paper   # bigger world and model, accelerator

Expected (quick, seed 0; truthfulness / helpfulness on the preference questions): SFT 0.625 / 1.000,
dpo_help 0.635 / 1.000, mixture 0.646 / 1.000, CAMP 0.990 / 0.983, its no-margin ablation 1.000 / 1.000;
dpo_truth 0.083 / 0.000 and MODPO 0.010 / 0.000 collapse to malformed outputs (all their pairs lie on
the unknown questions, and pushing every wrong answer down drives the model off the answer tokens).
Conflicts: 153 of 340 pairs (0.45): none on known questions (the SFT model never samples a wrong
known answer), 0.92 on unknown ones. Held-out questions: every method falls below SFT (0.615 / 1.000).

INFERRED: CAMP's loss (see `algorithms/alignment/camp.py`), the world, its rating table and the
candidate mix are the spec's design or ours; the paper trains on UltraFeedback and evaluates on
hallucination benchmarks (no numbers available to the spec).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import pathlib
from typing import Any, Mapping

import jax
import numpy as np
import optax
from etils import epath
from flax import nnx

from algorithms import training
from algorithms.alignment import camp as camp_lib
from experiments import _plotting as plotting
from experiments import registry, report
from experiments._lm import LMConfig
from experiments._measure import complete_prompts
from experiments.checks import Check, binomial_se, verdict
from experiments.tasks import lm_batch
from experiments.tasks.question_world import QuestionWorld, Response
from models import Transformer
from primitives.sampling import Sampler

METHODS = camp_lib.METHODS
HELP_MARGIN = 0.05  # CAMP's helpfulness may trail the best method's by at most this (fixed in advance)
MAX_NEW = 3  # "maybe aJ" + EOS
SEQ_LEN = 6  # BOS e r [maybe] a EOS


@dataclasses.dataclass(frozen=True, kw_only=True)
class WorldSection:
    """The question world and its preference / held-out split (``--world.num-entities 96``)."""

    num_entities: int = 48
    num_relations: int = 4
    num_answers: int = 16
    known_fraction: float = 0.6
    pref_fraction: float = 0.5


@dataclasses.dataclass(frozen=True, kw_only=True)
class SFTSection:
    """SFT on the known facts (``--sft.steps 800``)."""

    steps: int = 400
    batch: int = 64
    lr: float = 3e-3


@dataclasses.dataclass(frozen=True, kw_only=True)
class PrefSection:
    """Preference data (own samples) and optimization, the same for every method (``--pref.steps 400``)."""

    num_samples: int = 4
    sample_temperature: float = 1.0
    steps: int = 200
    batch: int = 64
    lr: float = 1e-3


@dataclasses.dataclass(frozen=True, kw_only=True)
class CAMPSection:
    """The DPO temperature, CAMP's adaptive margin and the mixture weight (``--camp.tau 0.2``)."""

    beta: float = 0.1
    gamma_consistent: float = 1.0
    gamma_conflict: float = 0.5
    tau: float = 0.1
    lam: float = 0.5
    rho: float = 0.5
    truth_weight: float = 0.5


@dataclasses.dataclass(frozen=True, kw_only=True)
class EvalSection:
    """Greedy answering (``--eval.chunk 128``)."""

    chunk: int = 256


@dataclasses.dataclass(frozen=True, kw_only=True)
class Config:
    """camp settings, in sections overridden on the command line as ``--pref.steps 100``."""

    world: WorldSection = WorldSection()
    model: LMConfig = LMConfig(d_model=64, num_layers=2, num_heads=4, num_kv_heads=2, d_ff=192)
    sft: SFTSection = SFTSection()
    pref: PrefSection = PrefSection()
    camp: CAMPSection = CAMPSection()
    eval: EvalSection = EvalSection()
    checkpoint: bool = True
    seed: int = 0
    progress: bool = True

    def __post_init__(self):
        err = registry.ConfigError
        if not 0 < self.world.pref_fraction < 1:
            raise err("world.pref_fraction", f"must lie in (0, 1); got {self.world.pref_fraction}")
        if self.pref.num_samples < 1:
            raise err("pref.num_samples", f"must be >= 1; got {self.pref.num_samples}")
        if not self.pref.sample_temperature > 0:
            raise err("pref.sample_temperature", f"must be > 0; got {self.pref.sample_temperature}")
        self.preference_config()  # CAMPConfig / PreferenceConfig validate the rest
        self.question_world()

    def question_world(self) -> QuestionWorld:
        w = self.world
        return QuestionWorld(num_entities=w.num_entities, num_relations=w.num_relations,
                             num_answers=w.num_answers, known_fraction=w.known_fraction, seed=self.seed)

    def preference_config(self) -> camp_lib.PreferenceConfig:
        k = self.camp
        return camp_lib.PreferenceConfig(
            camp=camp_lib.CAMPConfig(beta=k.beta, gamma_consistent=k.gamma_consistent,
                                     gamma_conflict=k.gamma_conflict, tau=k.tau, lam=k.lam, rho=k.rho),
            truth_weight=k.truth_weight)


# --- pipeline -----------------------------------------------------------------------------------


def _sft_batch_fn(c: Config, world: QuestionWorld):
    """position -> the SFT batch at that position (answers to known facts)."""
    tok = world.tokenizer()
    known = [q for q in world.questions if q.known]
    if not known:
        raise registry.ConfigError("world.known_fraction", "leaves no known fact to train on")

    def batch_fn(position):
        rng = np.random.default_rng([c.seed, 5, position])
        chosen = [known[i] for i in rng.integers(0, len(known), c.sft.batch)]
        b = lm_batch(tok, [world.prompt(q) for q in chosen], [world.render(Response("answer", q.answer))
                                                              for q in chosen], seq_len=SEQ_LEN)
        return {k: b[k] for k in ("inputs", "targets", "loss_mask")}

    return batch_fn


def _sft_optimizer(c: Config) -> training.OptimizerConfig:
    return training.OptimizerConfig(learning_rate=c.sft.lr, warmup_steps=min(50, c.sft.steps // 5),
                                    total_steps=c.sft.steps, weight_decay=0.01)


def train_step(c: Config):
    """The SFT step `run` takes (`_sft`), for ``python -m experiments aot camp`` (`experiments.aot`)."""
    from experiments import aot

    world = c.question_world()
    return aot.TrainStep(model=c.model.transformer(world.tokenizer().vocab_size), optimizer=_sft_optimizer(c),
                         batch_size=c.sft.batch, seq_len=_sft_batch_fn(c, world)(0)["inputs"].shape[1])


def _sft(c: Config, world: QuestionWorld, workdir: epath.Path):
    tok = world.tokenizer()
    batch_fn = _sft_batch_fn(c, world)
    model_cfg = c.model.transformer(tok.vocab_size)
    out = training.fit(
        model_fn=lambda rngs: Transformer(model_cfg, rngs=rngs),
        optimizer_config=_sft_optimizer(c),
        batch_fn=batch_fn, num_steps=c.sft.steps, workdir=(workdir / "sft") if c.checkpoint else None, seed=c.seed,
        checkpoint_every=max(c.sft.steps, 1), log_every=max(1, c.sft.steps // 10), progress=c.progress,
        desc="camp sft", fingerprint=repr(("sft", world, model_cfg, c.sft.steps, c.sft.batch, c.sft.lr, c.seed)))
    return out.graphdef, out.state.params, out.history


def answer(graphdef, params, world: QuestionWorld, questions, *, chunk: int, sampler: Sampler = Sampler(),
           key=None) -> list[Response]:
    """One completion per question (greedy by default), parsed."""
    tok = world.tokenizer()
    toks, lens = complete_prompts(nnx.merge(graphdef, params), tok, [world.prompt(q) for q in questions],
                                  max_new_tokens=MAX_NEW, sampler=sampler, key=key, chunk=chunk, prompt_len=3)
    return [world.parse(tok.decode(toks[i, :lens[i]])) for i in range(len(questions))]


def build_pairs(world: QuestionWorld, questions, sampled: Mapping[int, list[int]]) -> tuple[dict, dict]:
    """All rated pairs of distinct candidates per question (pairs tied on both objectives dropped).

    Returns:
      (pairs in the `camp.PAIR_KEYS` layout, statistics: counts, conflict fractions by question kind).
    """
    tok = world.tokenizer()
    prompts, a_text, b_text, dts, dhs, kinds = [], [], [], [], [], []
    for i, q in enumerate(questions):
        cands = world.candidates(q, sampled.get(i, []))
        rated = [(r, world.ratings(q, r)) for r in cands]
        for (ra, (ta, ha)), (rb, (tb, hb)) in itertools.combinations(rated, 2):
            if ta == tb and ha == hb:
                continue
            prompts.append(world.prompt(q))
            a_text.append(world.render(ra))
            b_text.append(world.render(rb))
            dts.append(ta - tb)
            dhs.append(ha - hb)
            kinds.append(q.known)
    a = lm_batch(tok, prompts, a_text, seq_len=SEQ_LEN)
    b = lm_batch(tok, prompts, b_text, seq_len=SEQ_LEN)
    dt, dh, known = np.array(dts, np.float32), np.array(dhs, np.float32), np.array(kinds, bool)
    pairs = {"a_inputs": a["inputs"], "a_targets": a["targets"], "a_mask": a["loss_mask"],
             "b_inputs": b["inputs"], "b_targets": b["targets"], "b_mask": b["loss_mask"],
             "delta_t": dt, "delta_h": dh}
    conflict = dt * dh < 0
    stats = {"num_pairs": int(len(dt)), "num_conflicts": int(conflict.sum()),
             "conflict_fraction": float(conflict.mean()) if len(dt) else float("nan"),
             "conflict_fraction_known": float(conflict[known].mean()) if known.any() else float("nan"),
             "conflict_fraction_unknown": float(conflict[~known].mean()) if (~known).any() else float("nan"),
             "pairs_known_questions": int(known.sum()), "pairs_unknown_questions": int((~known).sum()),
             "truth_ties": int((dt == 0).sum()), "help_ties": int((dh == 0).sum())}
    return pairs, stats


def run(c: Config, workdir: pathlib.Path) -> dict:
    workdir = epath.Path(workdir)
    world = c.question_world()
    graphdef, sft_params, sft_hist = _sft(c, world, workdir)
    pref_qs, held_qs = world.split(c.world.pref_fraction, seed=c.seed)
    eval_sets = {"pref": pref_qs, "heldout": held_qs}

    # Own samples of the SFT model (answers only; anything else it writes is not a candidate).
    reps = [q for q in pref_qs for _ in range(c.pref.num_samples)]
    samples = answer(graphdef, sft_params, world, reps, chunk=c.eval.chunk,
                     sampler=Sampler(temperature=c.pref.sample_temperature), key=jax.random.key(c.seed + 17))
    sampled: dict[int, list[int]] = {}
    for j, r in enumerate(samples):
        if r.kind in ("answer", "hedged"):
            sampled.setdefault(j // c.pref.num_samples, []).append(r.value)
    pairs, pair_stats = build_pairs(world, pref_qs, sampled)
    pair_stats["sample_wrong_on_known"] = float(np.mean([r.kind in ("answer", "hedged") and r.value != q.answer
                                                         for q, r in zip(reps, samples) if q.known]))

    def evaluate(params):
        return {name: world.score(qs, answer(graphdef, params, world, qs, chunk=c.eval.chunk))
                for name, qs in eval_sets.items()}

    evals = {"sft": evaluate(sft_params)}
    pcfg = c.preference_config()
    optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(c.pref.lr))
    histories = {}
    batch = min(c.pref.batch, pair_stats["num_pairs"])
    for method in METHODS:
        res = camp_lib.train(graphdef=graphdef, params=sft_params, pairs=pairs, method=method, optimizer=optimizer,
                             num_steps=c.pref.steps, batch_size=batch, config=pcfg, seed=c.seed,
                             workdir=(workdir / f"pref_{method}") if c.checkpoint else None,
                             checkpoint_every=c.pref.steps, log_every=max(1, c.pref.steps // 20),
                             progress=c.progress, desc=f"camp {method}",
                             fingerprint=repr((method, pcfg, c.pref.steps, batch, c.pref.lr, c.seed, pair_stats)))
        histories[method] = res.history
        evals[method] = evaluate(res.state.params)

    metrics = {
        "eval": evals,
        "pairs": pair_stats,
        "sft_final_loss": float(sft_hist[-1]["loss"]),
        "sft_known_accuracy": float(evals["sft"]["pref"]["helpfulness"]),
        "final_train_loss": {m: float(h[-1]["loss"]) for m, h in histories.items()},
        "final_reward_accuracy": {m: float(h[-1]["reward_accuracy"]) for m, h in histories.items()},
        "num_pref_questions": len(pref_qs), "num_heldout_questions": len(held_qs),
    }
    checks = _checks(metrics)
    metrics["checks"] = [ch.as_dict() for ch in checks]
    text, reproduced, cause_class = _verdict(metrics, checks, c)
    plots = [_plot_tradeoff(metrics, workdir), _plot_training(histories, workdir)]
    return {"metrics": metrics, "verdict": text, "reproduced": reproduced, "plots": plots,
            "cause": None if reproduced else cause_class}


# --- checks, verdict, headline -----------------------------------------------------------------------


def _checks(m: dict) -> list[Check]:
    ev = {k: v["pref"] for k, v in m["eval"].items()}
    ours = ev["camp"]
    best_help = max(ev[k]["helpfulness"] for k in METHODS)
    best_name = max(METHODS, key=lambda k: ev[k]["helpfulness"])
    paper = "truthfulness up, helpfulness kept (no numbers)"
    held = {k: v["heldout"] for k, v in m["eval"].items()}
    n_held = m["num_heldout_questions"]
    gain = held["camp"]["truthfulness"] - held["dpo_help"]["truthfulness"]
    se = math.hypot(binomial_se(held["camp"]["truthfulness"], n_held),
                    binomial_se(held["dpo_help"]["truthfulness"], n_held))
    return [
        Check("truthfulness, CAMP vs helpfulness-DPO", ours["truthfulness"], paper,
              f"> dpo_help {ev['dpo_help']['truthfulness']:.3f}",
              ours["truthfulness"] > ev["dpo_help"]["truthfulness"]),
        Check("truthfulness, CAMP vs fixed 50/50 mixture", ours["truthfulness"], paper,
              f"> mixture {ev['mixture']['truthfulness']:.3f}", ours["truthfulness"] > ev["mixture"]["truthfulness"]),
        Check("helpfulness (known questions answered correctly), CAMP vs best method", ours["helpfulness"],
              "favourable helpfulness trade-off", f">= best ({best_name}) {best_help:.3f} - {HELP_MARGIN}",
              ours["helpfulness"] >= best_help - HELP_MARGIN),
        Check("conflicting pairs / all rated pairs", m["pairs"]["conflict_fraction"],
              "conflicts on a small subset of samples", "< 0.5", m["pairs"]["conflict_fraction"] < 0.5,
              note=f"{m['pairs']['num_conflicts']} of {m['pairs']['num_pairs']}; known questions "
                   f"{m['pairs']['conflict_fraction_known']:.3f}, unknown {m['pairs']['conflict_fraction_unknown']:.3f}"),
        Check("truthfulness, CAMP vs its no-margin ablation", ours["truthfulness"], "the adaptive margin helps",
              f">= camp_no_margin {ev['camp_no_margin']['truthfulness']:.3f}",
              ours["truthfulness"] >= ev["camp_no_margin"]["truthfulness"], required=False),
        Check("held-out questions: truthfulness, CAMP - helpfulness-DPO", gain, paper,
              f"> 2 SE of the difference ({2 * se:.3f})", gain > 2 * se,
              note=f"CAMP {held['camp']['truthfulness']:.3f} vs dpo_help {held['dpo_help']['truthfulness']:.3f} "
                   f"(SFT {held['sft']['truthfulness']:.3f}) on {n_held} questions outside the preference data, as the "
                   "paper's benchmarks are; required with an SE margin since the lead's review (the first quick "
                   "run judged the preference questions only)"),
    ]


def _row(name: str, e: dict) -> str:
    return (f"{name} T {e['truthfulness']:.3f} H {e['helpfulness']:.3f} (halluc {e['hallucination_rate']:.3f}, "
            f"IDK unknown {e['abstain_rate_unknown']:.3f} / known {e['abstain_rate_known']:.3f})")


def _verdict(m: dict, checks: list[Check], c: Config):
    rows = "; ".join(_row(k, v["pref"]) for k, v in m["eval"].items())
    context = (f"Preference questions ({m['num_pref_questions']}, greedy answers, exact ratings), "
               f"{c.pref.steps} steps x {min(c.pref.batch, m['pairs']['num_pairs'])} pairs per method from the same "
               f"SFT model (known-fact accuracy {m['sft_known_accuracy']:.3f}): {rows}. One seed, tiny LM "
               f"(d_model {c.model.d_model}, {c.model.num_layers} layers)")
    claim = ("conflicts between truthfulness and helpfulness preferences are a minority, and adapting the margin "
             "only on them raises truthfulness while keeping helpfulness")
    # Cause, decided by a rule fixed before the first run: when the no-margin ablation (the same
    # truthfulness-first pairs, plain DPO) meets the required method checks that CAMP misses, the
    # inferred margin / weight design is what fails ("spec"); otherwise the setting ("scale").
    ev = {k: v["pref"] for k, v in m["eval"].items()}
    best_help = max(ev[k]["helpfulness"] for k in METHODS)
    ablation_ok = (ev["camp_no_margin"]["truthfulness"] > max(ev["dpo_help"]["truthfulness"],
                                                              ev["mixture"]["truthfulness"])
                   and ev["camp_no_margin"]["helpfulness"] >= best_help - HELP_MARGIN)
    in_sample_ok = all(ch.passed for ch in checks if ch.required and not ch.name.startswith("held-out"))
    if in_sample_ok:
        cause, cls = ("on the preference questions CAMP meets every check, but it does not carry over to held-out "
                      "questions: a 2-layer LM tuned on ~100 questions cannot tell an unseen withheld fact from an "
                      "unseen known one (every method falls below SFT there)"), "scale"
    elif ablation_ok:
        cause, cls = ("the no-margin ablation (truthfulness-first pairs, plain DPO) meets the checks CAMP misses, so "
                      "the inferred adaptive margin / weight is what costs here"), "spec"
    else:
        cause, cls = "one seed, a tiny LM and a synthetic world; see the per-method numbers", "scale"
    text, ok = verdict(checks, claim=claim, context=context, cause=cause, cause_class=cls)
    return text, ok, cls


def headline(metrics: Mapping[str, Any]) -> str:
    """Our small-scale result in one table cell (the README catalog's "ours" column)."""
    ev = {k: v["pref"] for k, v in metrics["eval"].items()}

    def th(k):
        return f"{float(ev[k]['truthfulness']):.2f}/{float(ev[k]['helpfulness']):.2f}"

    held = {k: float(v["heldout"]["truthfulness"]) for k, v in metrics["eval"].items()}
    return (f"question world, tiny LM, truth/help on preference questions: CAMP {th('camp')} vs help-DPO "
            f"{th('dpo_help')}, mixture {th('mixture')}, truth-DPO {th('dpo_truth')}; held-out truthfulness CAMP "
            f"{held['camp']:.2f} vs help-DPO {held['dpo_help']:.2f} (SFT {held['sft']:.2f}); conflicts "
            f"{float(metrics['pairs']['conflict_fraction']):.0%} of pairs")


# --- plots ---------------------------------------------------------------------------------------

_COLORS = {"sft": "gray", "dpo_truth": "tab:blue", "dpo_help": "tab:orange", "mixture": "tab:purple",
           "modpo": "tab:brown", "camp_no_margin": "tab:olive", "camp": "tab:green"}


def _plot_tradeoff(m: dict, workdir: epath.Path) -> str:
    fig, axes = plotting.subplots(1, 2, figsize=(11, 4))
    for ax, split in zip(axes, ("pref", "heldout")):
        for k, v in m["eval"].items():
            e = v[split]
            ax.scatter(e["helpfulness"], e["truthfulness"], color=_COLORS.get(k, "k"), s=60, label=k)
            ax.annotate(k, (e["helpfulness"], e["truthfulness"]), fontsize=7, xytext=(3, 3),
                        textcoords="offset points")
        ax.set(xlabel="helpfulness (known questions answered correctly)", ylabel="truthfulness (mean T rating)",
               title=f"{'preference' if split == 'pref' else 'held-out'} questions", xlim=(-0.05, 1.05),
               ylim=(-0.05, 1.05))
    plotting.legend(axes[0], fontsize=7)
    return report.savefig(fig, workdir / "tradeoff.png")


def _plot_training(histories: dict, workdir: epath.Path) -> str:
    fig, axes = plotting.subplots(1, 2, figsize=(11, 3.8))
    for k, hist in histories.items():
        steps = [h["step"] for h in hist]
        axes[0].plot(steps, [h["loss"] for h in hist], color=_COLORS.get(k, "k"), label=k)
        axes[1].plot(steps, [h["reward_accuracy"] for h in hist], color=_COLORS.get(k, "k"), label=k)
    axes[0].set(xlabel="step", ylabel="training loss (own objective)", title="preference optimization")
    axes[1].set(xlabel="step", ylabel="implicit-reward accuracy (own orientation)", title="pairs ranked right")
    plotting.legend(axes[0], fontsize=7)
    return report.savefig(fig, workdir / "training.png")


EXPERIMENT = registry.Experiment(
    slug="camp",
    config_cls=Config,
    presets={
        "smoke": lambda: Config(world=WorldSection(num_entities=6, num_relations=2, num_answers=4),
                                model=LMConfig(d_model=16, num_layers=1, num_heads=2, num_kv_heads=1, d_ff=32),
                                sft=SFTSection(steps=10, batch=8), pref=PrefSection(num_samples=2, steps=2, batch=8),
                                eval=EvalSection(chunk=16), checkpoint=False, progress=False),
        "quick": lambda: Config(),
        "paper": lambda: Config(world=WorldSection(num_entities=400, num_relations=8, num_answers=64),
                                model=LMConfig(d_model=256, num_layers=6, num_heads=8, num_kv_heads=2, d_ff=768),
                                sft=SFTSection(steps=5000, batch=256), pref=PrefSection(num_samples=8, steps=2000,
                                                                                        batch=256),
                                eval=EvalSection(chunk=1024)),
    },
    run=run,
    train_step=train_step,
)
