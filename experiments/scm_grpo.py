"""SCM-GRPO (Bu et al., arXiv:2605.01482): structural vs label-only rewards for multi-hop verification.

Setting (`experiments/tasks/multihop.py`): every claim lives in its own random
knowledge base; the prompt holds 5 shuffled evidence facts (the k gold facts,
the fact one hop past the end, other facts) and a k-hop claim (k = 2, 3, 4;
SUPPORTS, or REFUTES by swapping the final entity for a near miss: one hop
short, one hop too far, a distractor's tail). The model answers in the compact
dependency-graph grammar, the entity reached after each hop then the verdict
(`e4 e1 e6 | S` is e4 -> e1 -> e6 -> C, depth 3).

1. SFT warm start of a tiny decoder LM: gold chains for the first
   `sft_clean_fraction` of the steps (a small model learns the evidence
   lookups much faster on clean targets), then *noisy* chains: the gold chain
   with probability 1 - p_truncate - p_pad, a truncated prefix (1..k-1 hops) with
   p_truncate, the gold chain with 1..max_pad distractor entities of the
   evidence inserted at random places with p_pad; the verdict is always the
   gold label. A short
   chain leaves hops to be done without the scratchpad, a padded one puts wrong
   facts in it, so accuracy can follow an inverted U in chain length.
2. Diagnostic (the paper's): on held-out claims, accuracy of sampled outputs
   as a function of the emitted depth d, relative to the hop count k.
3. GRPO from the SFT model with the same prompts, seeds and budget:
   (i) label-only reward (format gate -1, else 1[verdict correct]) and
   (ii) the SCM-GRPO reward (format gate, label, label-gated depth term
   g(d) = exp(-(d - k)^2 / 2), conciseness penalty), `algorithms.rl.scm_grpo`.
4. Held-out evaluation per hop count: macro-F1 (SUPPORTS / REFUTES; a format
   failure is wrong for both classes), accuracy, format rate, mean depth,
   exact-chain rate and depth histograms.

Verdict criterion (fixed before the first run): the direction reproduces iff
the structural arm's held-out accuracy exceeds the label-only arm's on both
3-hop and 4-hop claims AND its mean |d - k| (over valid outputs of all hops)
is smaller. The inverted-U diagnostic is reported beside it (peak at d = k
with lower accuracy at d = k - 1 and d = k + 1) but is not part of the
criterion.

Recipe:
    python -m experiments run scm_grpo --preset smoke   # seconds, used by the tests
    python -m experiments run scm_grpo --preset quick   # 2 CPU cores, about 6-8 minutes
    python -m experiments run scm_grpo --preset paper   # bigger model, longer RL, accelerator
    python -m experiments run scm_grpo --preset smoke --rl.steps 2   # one field of a config section

Config sections (`run scm_grpo --help` lists every field): task, sft, model, rl, reward (the library's
`scm_grpo.RewardConfig`), eval.

One seed, a 2-layer 64-wide model and 3 x 128 held-out claims x 4 samples per
arm: accuracy differences of about 0.03 are within sampling noise.

Expected (quick, seed 0, about 4-6 minutes on 2 shared CPU cores; bitwise reproducible):
mean |d - k| 0.48 (SFT) -> 0.27 (label-only) vs 0.08 (structural), exact chains
0.49 -> 0.73 vs 0.88; accuracy 3-hop 0.461 -> 0.555 vs 0.557, 4-hop 0.434 ->
0.541 vs 0.555. The verdict head stays near chance (~0.55) in every arm, so the
accuracy half of the claim is within noise here; with `--sft.steps 3000` the
label-only arm collapses to 1-node graphs and the structural arm is not more
accurate (see the report).
"""

from __future__ import annotations

import collections
import math
import dataclasses
import pathlib
from typing import Any, Mapping

import jax
import numpy as np
from etils import epath
import optax
from flax import nnx

from algorithms import training
from algorithms.rl import grpo
from algorithms.rl import scm_grpo as scm
from experiments import _plotting as plotting
from experiments import registry, report
from experiments._lm import LMConfig
from experiments._measure import complete_prompts
from experiments.checks import Check, verdict
from experiments.tasks import lm_batch, prompt_batch
from experiments.tasks.multihop import MultiHopTask
from models import Transformer, TransformerConfig
from primitives.sampling import Sampler

ARMS = ("sft", "label_only", "structural")


@dataclasses.dataclass(frozen=True, kw_only=True)
class TaskSection:
    """The multi-hop claim-verification world (``--task.num-entities 32``)."""

    num_entities: int = 16
    num_relations: int = 6
    num_facts: int = 5
    min_hops: int = 2
    max_hops: int = 4


@dataclasses.dataclass(frozen=True, kw_only=True)
class SFTSection:
    """The SFT warm start on noisy chains (``--sft.steps 3000``)."""

    pool: int = 8000
    clean_fraction: float = 0.5  # the first half of SFT sees gold chains only (the lookups are learned there)
    p_truncate: float = 0.2
    p_pad: float = 0.2
    max_pad: int = 2
    steps: int = 2000
    batch: int = 64
    lr: float = 3e-3


@dataclasses.dataclass(frozen=True, kw_only=True)
class RLSection:
    """GRPO, the same for both reward arms (``--rl.steps 200``); ``temperature`` also samples the evaluation."""

    steps: int = 100
    prompts: int = 16
    group_size: int = 8
    lr: float = 2e-4
    temperature: float = 1.0
    clip_eps: float = 0.2


@dataclasses.dataclass(frozen=True, kw_only=True)
class EvalSection:
    """Held-out claims (``--eval.samples 8``)."""

    claims_per_hop: int = 128
    samples: int = 4
    chunk: int = 512
    min_bin: int = 20  # the inverted-U diagnostic ignores depth bins with fewer samples


@dataclasses.dataclass(frozen=True, kw_only=True)
class Config:
    """scm_grpo settings, in sections overridden on the command line as ``--rl.steps 200``."""

    task: TaskSection = TaskSection()
    sft: SFTSection = SFTSection()
    model: LMConfig = LMConfig(d_model=64, num_layers=2, num_heads=4, num_kv_heads=2, d_ff=192)
    rl: RLSection = RLSection()
    # The SCM-GRPO reward of the structural arm (the label-only arm uses w_struct = lambda_len = 0).
    reward: scm.RewardConfig = scm.RewardConfig(w_acc=1.0, w_struct=0.5, s=1.0, lambda_len=0.1)
    eval: EvalSection = EvalSection()
    checkpoint: bool = True
    seed: int = 0
    progress: bool = True

    def __post_init__(self):
        if not 1 <= self.task.min_hops <= self.task.max_hops:
            raise registry.ConfigError("task.min_hops", f"must be in [1, task.max_hops={self.task.max_hops}]; "
                                                        f"got {self.task.min_hops}")
        if not 0.0 <= self.sft.clean_fraction <= 1.0:
            raise registry.ConfigError("sft.clean_fraction", f"must be in [0, 1]; got {self.sft.clean_fraction}")
        if self.rl.group_size < 2:
            raise registry.ConfigError("rl.group_size", f"must be >= 2 (GRPO normalises within a group); "
                                                        f"got {self.rl.group_size}")
        for name in ("claims_per_hop", "samples", "chunk"):
            if getattr(self.eval, name) < 1:
                raise registry.ConfigError(f"eval.{name}", f"must be >= 1; got {getattr(self.eval, name)}")


def _task(c: Config) -> MultiHopTask:
    t = c.task
    return MultiHopTask(num_entities=t.num_entities, num_relations=t.num_relations, num_facts=t.num_facts,
                        min_hops=t.min_hops, max_hops=t.max_hops, seed=c.seed)


def _reward_config(c: Config, arm: str) -> scm.RewardConfig:
    return c.reward if arm == "structural" else scm.label_only_config(c.reward)


def noisy_chain(problem, rng: np.random.Generator, c: Config) -> list[int]:
    """The SFT chain (entity ids): gold, truncated (1..k-1 hops) or padded with 1..max_pad distractor entities."""
    chain = list(problem.gold_chain)
    k = len(chain)
    u = rng.random()
    if u < c.sft.p_truncate and k > 1:
        return chain[: int(rng.integers(1, k))]
    if u < c.sft.p_truncate + c.sft.p_pad:
        others = sorted({e for f in problem.facts for e in (f.head, f.tail)} - set(chain))
        extra = int(rng.integers(1, c.sft.max_pad + 1))
        for j in rng.permutation(others)[:extra]:
            chain.insert(int(rng.integers(0, len(chain) + 1)), int(j))
    return chain


def _lengths(c: Config, task: MultiHopTask) -> tuple[int, int, int]:
    """(prompt_len incl. BOS, max_new_tokens incl. EOS, SFT seq_len)."""
    prompt_len = task.max_prompt_len + 1
    max_new = task.max_target_len(c.sft.max_pad) + 1
    return prompt_len, max_new, prompt_len + max_new


def _sft_batch_fn(c: Config, task: MultiHopTask, pool, seq_len: int):
    tok = task.tokenizer()

    clean_steps = int(round(c.sft.clean_fraction * c.sft.steps))

    def batch_fn(position):
        rng = np.random.default_rng([c.seed, 11, position])
        chosen = [pool[i] for i in rng.integers(0, len(pool), c.sft.batch)]
        chains = [p.gold_chain if position < clean_steps else noisy_chain(p, rng, c) for p in chosen]
        b = lm_batch(tok, [task.prompt(p) for p in chosen], [task.target(p, ch) for p, ch in zip(chosen, chains)],
                     seq_len=seq_len)
        return {k: b[k] for k in ("inputs", "targets", "loss_mask")}

    return batch_fn


def _prompt_fn(c: Config, task: MultiHopTask, prompt_len: int):
    tok = task.tokenizer()

    def prompt_fn(position):
        chosen = task.sample(c.rl.prompts, seed=100_000 + position)
        b = prompt_batch(tok, [task.prompt(p) for p in chosen], seq_len=prompt_len)
        return grpo.PromptBatch(chosen, b["tokens"], b["prompt_lengths"])

    return prompt_fn


def evaluate(graphdef, params, task: MultiHopTask, problems_by_hop: dict, *, num_samples: int, chunk: int,
             max_new_tokens: int, prompt_len: int, temperature: float, key) -> dict:
    """Samples `num_samples` outputs per held-out claim and scores them per hop count.

    Returns:
      {"per_hop": {k: metrics}, "records": [(k, depth or -1, correct, exact_chain), ...]}.
    """
    tok = task.tokenizer()
    model = nnx.merge(graphdef, params)
    items = [(k, p) for k, ps in sorted(problems_by_hop.items()) for p in ps for _ in range(num_samples)]
    toks, lens = complete_prompts(model, tok, [task.prompt(p) for _, p in items], max_new_tokens=max_new_tokens,
                                  sampler=Sampler(temperature=temperature), key=key, chunk=chunk,
                                  prompt_len=prompt_len)
    texts = [tok.decode(toks[j, :lens[j]]) for j in range(len(items))]
    records = []
    per: dict[int, dict[str, list]] = collections.defaultdict(lambda: collections.defaultdict(list))
    for (k, p), text in zip(items, texts):
        parsed = scm.parse_compact(text)
        error = parsed.error if not parsed.ok else scm.check_graph(parsed.graph, allowed_nodes=p.node_ids)
        pred = parsed.answer if error is None else None
        depth = scm.graph_depth(parsed.graph) if error is None else -1
        exact = error is None and parsed.graph.nodes == tuple(f"e{j}" for j in p.gold_chain)
        correct = pred == p.label
        records.append((k, depth, bool(correct), bool(exact)))
        d = per[k]
        d["gold"].append(p.label)
        d["pred"].append(pred)
        d["depth"].append(depth)
        d["exact"].append(exact)
    per_hop = {}
    for k, d in sorted(per.items()):
        depth = np.array(d["depth"])
        valid = depth >= 0
        per_hop[int(k)] = {
            "macro_f1": scm.macro_f1(d["gold"], d["pred"]),
            "accuracy": float(np.mean([g == q for g, q in zip(d["gold"], d["pred"])])),
            "format_rate": float(valid.mean()),
            "mean_depth": float(depth[valid].mean()) if valid.any() else float("nan"),
            "mean_abs_depth_error": float(np.abs(depth[valid] - k).mean()) if valid.any() else float("nan"),
            "exact_chain_rate": float(np.mean(d["exact"])),
            "depth_hist": {int(v): int(n) for v, n in zip(*np.unique(depth[valid], return_counts=True))},
            "num_samples": int(len(depth)),
        }
    return {"per_hop": per_hop, "records": records}


def accuracy_by_relative_depth(records, *, min_bin: int = 1) -> dict[int, tuple[float, int]]:
    """{d - k: (accuracy, count)} over valid outputs, bins with at least `min_bin` samples."""
    bins: dict[int, list[bool]] = collections.defaultdict(list)
    for k, depth, correct, _ in records:
        if depth >= 0:
            bins[depth - k].append(correct)
    return {int(r): (float(np.mean(v)), len(v)) for r, v in sorted(bins.items()) if len(v) >= min_bin}


def headline(metrics: Mapping[str, Any]) -> str:
    """Our small-scale result in one table cell (the README catalog's "ours" column), from the quick result's metrics."""
    def r(x, d=3):  # result.json stores nan as "nan"
        return f"{float(x):.{d}f}".removeprefix("0")

    ph, ov = metrics["per_hop"], metrics["overall"]
    hops = sorted(int(k) for k in ph["sft"])
    out = f"synthetic {hops[0]}-{hops[-1]}-hop verification, tiny LM: "
    if "structural" not in ph or "label_only" not in ph:
        return out + (f"SFT only (no RL arms): accuracy {r(ov['sft']['accuracy'])}, |d-k| "
                      f"{r(ov['sft']['mean_abs_depth_error'], 2)}")
    s = {int(k): v for k, v in ph["structural"].items()}
    lab = {int(k): v for k, v in ph["label_only"].items()}
    acc = ", ".join(f"{k}-hop {r(s[k]['accuracy'])} vs {r(lab[k]['accuracy'])}" for k in (3, 4) if k in s)
    return out + (f"structural vs label-only reward: |d-k| {r(ov['structural']['mean_abs_depth_error'], 2)} vs "
                  f"{r(ov['label_only']['mean_abs_depth_error'], 2)}; accuracy {acc or 'no 3/4-hop claims'}")


def run(c: Config, workdir: pathlib.Path) -> dict:
    workdir = epath.Path(workdir)
    task = _task(c)
    tok = task.tokenizer()
    prompt_len, max_new, seq_len = _lengths(c, task)
    model_cfg = c.model.transformer(tok.vocab_size)
    if c.sft.steps == 0:  # smoke only: no warm start (saves the SFT compile)
        make = lambda: Transformer(model_cfg, rngs=nnx.Rngs(c.seed))
        graphdef, _ = nnx.split(nnx.eval_shape(make), nnx.Param)
        base_params = jax.jit(lambda: nnx.to_pure_dict(nnx.split(make(), nnx.Param)[1]))()
    else:
        graphdef, base_params = _sft(c, task, model_cfg, seq_len, workdir)
    return _rl_and_eval(c, task, graphdef, base_params, workdir)


def _sft_optimizer(c: Config) -> training.OptimizerConfig:
    return training.OptimizerConfig(learning_rate=c.sft.lr, warmup_steps=min(100, c.sft.steps // 5),
                                    total_steps=c.sft.steps, weight_decay=0.01)


def train_step(c: Config):
    """The SFT warm start's step (`_sft`; the GRPO steps after it are not `fit` steps), for
    ``python -m experiments aot scm_grpo`` (`experiments.aot`).

    Raises:
      ValueError: the preset has no SFT (``sft.steps`` 0), so `run` takes no `fit` step.
    """
    from experiments import aot

    if c.sft.steps == 0:
        raise ValueError("scm_grpo takes no SFT step with sft.steps=0 (this preset starts RL from random "
                         "weights); pass a preset with SFT, e.g. --preset paper")
    task = _task(c)
    _, _, seq_len = _lengths(c, task)  # `lm_batch` pads to seq_len: inputs [b, seq_len - 1]
    return aot.TrainStep(model=c.model.transformer(task.tokenizer().vocab_size), optimizer=_sft_optimizer(c),
                         batch_size=c.sft.batch, seq_len=seq_len - 1)


def _sft(c: Config, task: MultiHopTask, model_cfg: TransformerConfig, seq_len: int, workdir: pathlib.Path):
    pool = task.sample(c.sft.pool, seed=1)
    sft = training.fit(
        model_fn=lambda rngs: Transformer(model_cfg, rngs=rngs),
        optimizer_config=_sft_optimizer(c),
        batch_fn=_sft_batch_fn(c, task, pool, seq_len), num_steps=c.sft.steps,
        workdir=(workdir / "sft") if c.checkpoint else None, seed=c.seed, checkpoint_every=max(c.sft.steps, 1),
        log_every=max(1, c.sft.steps // 10), progress=c.progress, desc="scm sft",
        fingerprint=repr(("sft", task, c.sft.pool, c.sft.clean_fraction, c.sft.p_truncate, c.sft.p_pad, c.sft.max_pad,
                          c.sft.steps, c.sft.batch, c.sft.lr, model_cfg, c.seed)))
    return sft.graphdef, sft.state.params


def _rl_and_eval(c: Config, task: MultiHopTask, graphdef, base_params, workdir: pathlib.Path) -> dict:
    tok = task.tokenizer()
    prompt_len, max_new, _ = _lengths(c, task)
    test = {k: task.sample(c.eval.claims_per_hop, seed=99, hops=k) for k in range(c.task.min_hops, c.task.max_hops + 1)}
    eval_kw = dict(num_samples=c.eval.samples, chunk=c.eval.chunk, max_new_tokens=max_new, prompt_len=prompt_len,
                   temperature=c.rl.temperature, key=jax.random.key(c.seed + 123))
    evals = {"sft": evaluate(graphdef, base_params, task, test, **eval_kw)}

    rl_cfg = grpo.GRPOConfig(group_size=c.rl.group_size, max_new_tokens=max_new, temperature=c.rl.temperature,
                             stop_tokens=(tok.eos_id,), pad_id=tok.pad_id, clip_eps=c.rl.clip_eps)
    optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(c.rl.lr))
    prompt_fn = _prompt_fn(c, task, prompt_len)
    histories = {}
    for arm in ARMS[1:] if c.rl.steps > 0 else ():
        reward_cfg = _reward_config(c, arm)
        res = grpo.train(graphdef=graphdef, params=base_params, optimizer=optimizer, config=rl_cfg,
                         prompt_fn=prompt_fn, reward_fn=scm.make_reward_fn(tok, config=reward_cfg),
                         num_steps=c.rl.steps, seed=c.seed,
                         workdir=(workdir / f"rl_{arm}") if c.checkpoint else None,
                         checkpoint_every=max(c.rl.steps // 2, 1), log_every=max(1, c.rl.steps // 20),
                         progress=c.progress, desc=f"scm {arm}",
                         fingerprint=repr((arm, reward_cfg, rl_cfg, c.rl.lr, c.rl.steps, c.rl.prompts, task)))
        histories[arm] = res.history
        evals[arm] = evaluate(graphdef, res.state.params, task, test, **eval_kw)

    diag = {arm: accuracy_by_relative_depth(ev["records"], min_bin=c.eval.min_bin) for arm, ev in evals.items()}
    metrics = {
        "per_hop": {arm: ev["per_hop"] for arm, ev in evals.items()},
        "overall": {arm: _overall(ev) for arm, ev in evals.items()},
        "accuracy_by_relative_depth": {arm: {str(r): {"accuracy": a, "count": n} for r, (a, n) in d.items()}
                                       for arm, d in diag.items()},
        "inverted_u_sft": _inverted_u(diag["sft"]),
        "rl_final_train_reward": {arm: float(np.mean([h["reward_mean"] for h in hist[-3:]]))
                                  for arm, hist in histories.items()},
        "num_test_claims_per_hop": c.eval.claims_per_hop,
        "eval_samples": c.eval.samples,
    }
    checks = _checks(metrics, diag)
    metrics["checks"] = [ch.as_dict() for ch in checks]
    text, reproduced = _verdict(metrics, diag, c, checks)
    plots = [_plot_inverted_u(evals, diag, c, workdir), _plot_per_hop(metrics, histories, c, workdir),
             _plot_depths(metrics, c, workdir)]
    return {"metrics": metrics, "verdict": text, "reproduced": reproduced, "plots": plots,
            "cause": "scale" if reproduced is False else None}


def _overall(ev) -> dict:
    recs = ev["records"]
    valid = [r for r in recs if r[1] >= 0]
    return {"accuracy": float(np.mean([r[2] for r in recs])),
            "mean_abs_depth_error": float(np.mean([abs(r[1] - r[0]) for r in valid])) if valid else float("nan"),
            "exact_chain_rate": float(np.mean([r[3] for r in recs])),
            "format_rate": float(len(valid) / len(recs))}


def _inverted_u(d: dict) -> bool | None:
    """Peak at d = k: accuracy at relative depth 0 above both neighbours (None if a bin is missing)."""
    if not all(r in d for r in (-1, 0, 1)):
        return None
    return bool(d[0][0] > d[-1][0] and d[0][0] > d[1][0])


def _checks(metrics: dict, diag: dict) -> list[Check]:
    """The criterion fixed before the first run (required): the structural arm's held-out accuracy above
    the label-only arm's on both 3-hop and 4-hop claims, and its mean |d - k| smaller. The inverted U of
    the SFT model (peak at d = k) is reported, not required. Without RL arms only the diagnostic."""
    sft_diag = diag["sft"]
    shape = metrics["inverted_u_sft"]
    checks = [Check("SFT accuracy by emitted depth: inverted U peaking at d = k",
                    sft_diag[0][0] if shape is not None else "too few samples next to d = k",
                    "inverted U in reasoning-chain length", "acc(d = k) > acc(d = k - 1) and > acc(d = k + 1)",
                    bool(shape), note="by d - k: " + ", ".join(f"{r:+d}: {a:.3f} (n={n})"
                                                               for r, (a, n) in sft_diag.items()),
                    required=False)]
    ph, ov = metrics["per_hop"], metrics["overall"]
    if "structural" not in ph or "label_only" not in ph:
        return checks
    s, l = ph["structural"], ph["label_only"]
    hard = [k for k in (3, 4) if k in s]
    for k in hard:
        checks.append(Check(f"{k}-hop held-out accuracy, structural vs label-only", s[k]["accuracy"],
                            "structural reward beats baselines (HoVer / EX-FEVER, no numbers available to us)",
                            f"> label-only {l[k]['accuracy']:.3f}", s[k]["accuracy"] > l[k]["accuracy"]))
    if not hard:
        checks.append(Check("3- and 4-hop held-out accuracy, structural vs label-only", "no 3/4-hop claims",
                            "structural reward beats baselines", "> label-only on 3 and 4 hops", False))
    checks.append(Check("mean |d - k| over valid outputs, structural vs label-only",
                        ov["structural"]["mean_abs_depth_error"], "chains closer to the hop count",
                        f"< label-only {ov['label_only']['mean_abs_depth_error']:.2f}",
                        ov["structural"]["mean_abs_depth_error"] < ov["label_only"]["mean_abs_depth_error"]))
    return checks


def _verdict(metrics: dict, diag: dict, c: Config, checks: list[Check]):
    ph, ov = metrics["per_hop"], metrics["overall"]
    rows = []
    for arm in ph:
        hops = " ".join(f"{k}-hop F1 {v['macro_f1']:.3f} acc {v['accuracy']:.3f} depth {v['mean_depth']:.2f}"
                        for k, v in ph[arm].items())
        rows.append(f"{arm}: {hops}; |d-k| {ov[arm]['mean_abs_depth_error']:.2f}, exact chains "
                    f"{ov[arm]['exact_chain_rate']:.3f}")
    context = (f"Held-out ({c.eval.claims_per_hop} claims per hop x {c.eval.samples} samples), "
               f"{c.rl.steps} GRPO iterations x {c.rl.prompts} prompts x {c.rl.group_size}: " + "; ".join(rows)
               + ". One seed; accuracy gaps of ~0.03 are within sampling noise")
    claim = ("accuracy follows an inverted U in reasoning-chain length, and GRPO with a rule-based "
             "depth-vs-conciseness reward on explicit dependency graphs beats label-only rewards")
    if "structural" not in ph or "label_only" not in ph:
        lines = "; ".join(ch.line() for ch in checks)
        return (f"Not judged (no RL arms were run, smoke preset): {claim}. {lines}. {context}.", None)
    n = c.eval.claims_per_hop * c.eval.samples  # sampled verdicts per hop and arm
    gaps = "; ".join(f"{k}-hop {ph['structural'][k]['accuracy'] - ph['label_only'][k]['accuracy']:+.3f}"
                     for k in (3, 4) if k in ph["structural"])
    cause = (f"structural minus label-only accuracy {gaps}, against a binomial SE of a difference of about "
             f"{math.sqrt(2 * 0.25 / n):.3f} ({n} sampled verdicts per hop, one seed): within noise; the verdict "
             f"head stays near chance in every arm at this scale (a 2-layer model), so the accuracy half of the "
             f"claim cannot be separated here (the quick verdict flips with the device count, 1 vs 8 simulated "
             f"devices, for this reason)")
    return verdict(checks, claim=claim, context=context, cause=cause, cause_class="scale")


# --- plots ------------------------------------------------------------------------------------------

_COLORS = {"sft": "gray", "label_only": "tab:blue", "structural": "tab:green"}


def _plot_inverted_u(evals, diag, c: Config, workdir: pathlib.Path) -> str:
    fig, axes = plotting.subplots(1, 2, figsize=(10, 3.8))
    for arm, d in diag.items():
        if d:
            axes[0].plot(list(d), [a for a, _ in d.values()], "o-", color=_COLORS[arm], label=arm)
    axes[0].axvline(0, color="k", lw=0.5, ls=":")
    axes[0].set(xlabel="emitted depth d - hop count k", ylabel="accuracy (held-out)",
                title="accuracy vs chain length")
    plotting.legend(axes[0], fontsize=8)
    bins: dict = collections.defaultdict(list)
    for k, depth, correct, _ in evals["sft"]["records"]:
        if depth >= 0:
            bins[(k, depth)].append(correct)
    for k in range(c.task.min_hops, c.task.max_hops + 1):
        ds_ = sorted(d for (kk, d), v in bins.items() if kk == k and len(v) >= max(1, c.eval.min_bin // 2))
        axes[1].plot(ds_, [np.mean(bins[(k, d)]) for d in ds_], "o-", label=f"{k}-hop")
    axes[1].set(xlabel="emitted depth d", ylabel="accuracy", title="SFT model, per hop count")
    plotting.legend(axes[1], fontsize=8)
    return report.savefig(fig, workdir / "inverted_u.png")


def _plot_per_hop(metrics, histories, c: Config, workdir: pathlib.Path) -> str:
    fig, axes = plotting.subplots(1, 3, figsize=(14, 3.8))
    ph = metrics["per_hop"]
    arms = list(ph)
    hops = sorted(next(iter(ph.values())))
    width = 0.8 / len(arms)
    for i, arm in enumerate(arms):
        x = np.arange(len(hops)) + i * width
        axes[0].bar(x, [ph[arm][k]["macro_f1"] for k in hops], width, color=_COLORS[arm], label=arm)
        axes[1].bar(x, [ph[arm][k]["accuracy"] for k in hops], width, color=_COLORS[arm], label=arm)
    for ax, name in zip(axes[:2], ("macro-F1", "accuracy")):
        ax.set_xticks(np.arange(len(hops)) + width * (len(arms) - 1) / 2, [f"{k}-hop" for k in hops])
        ax.set(ylabel=name, title=f"held-out {name} per hop count", ylim=(0, 1))
    plotting.legend(axes[0], fontsize=8)
    for arm, hist in histories.items():
        axes[2].plot([h["iteration"] for h in hist], [h["reward_mean"] for h in hist], color=_COLORS[arm], label=arm)
    axes[2].set(xlabel="RL iteration", ylabel="train reward (own reward)", title="GRPO training reward")
    plotting.legend(axes[2], fontsize=8)
    return report.savefig(fig, workdir / "per_hop_f1.png")


def _plot_depths(metrics, c: Config, workdir: pathlib.Path) -> str:
    ph = metrics["per_hop"]
    hops = sorted(next(iter(ph.values())))
    fig, axes = plotting.subplots(1, len(hops), figsize=(4.2 * len(hops), 3.5), squeeze=False)
    max_d = c.task.max_hops + c.sft.max_pad + 1
    width = 0.8 / len(ph)
    for j, k in enumerate(hops):
        ax = axes[0, j]
        for i, arm in enumerate(ph):
            hist = ph[arm][k]["depth_hist"]
            total = max(1, ph[arm][k]["num_samples"])
            xs = np.arange(1, max_d + 1)
            ax.bar(xs + (i - (len(ph) - 1) / 2) * width, [hist.get(int(d), 0) / total for d in xs], width,
                   color=_COLORS[arm], label=arm)
        ax.axvline(k, color="k", lw=0.8, ls=":")
        ax.set(xlabel="emitted depth d", ylabel="fraction of samples", title=f"{k}-hop claims (d* = {k})")
    plotting.legend(axes[0, 0], fontsize=8)
    return report.savefig(fig, workdir / "depth_hist.png")


EXPERIMENT = registry.Experiment(
    slug="scm_grpo",
    config_cls=Config,
    presets={
        "smoke": lambda: Config(sft=SFTSection(pool=64, steps=0, batch=8),
                                model=LMConfig(d_model=16, num_layers=1, num_heads=2, num_kv_heads=1, d_ff=32),
                                rl=RLSection(steps=1, prompts=2, group_size=2),
                                eval=EvalSection(claims_per_hop=2, samples=2, chunk=4, min_bin=1),
                                checkpoint=False, progress=False),
        "quick": lambda: Config(),
        "paper": lambda: Config(task=TaskSection(num_entities=32, num_relations=8, num_facts=10),
                                sft=SFTSection(pool=200_000, steps=20_000, batch=256),
                                model=LMConfig(d_model=256, num_layers=6, num_heads=8, num_kv_heads=2, d_ff=768),
                                rl=RLSection(steps=1000, prompts=64, group_size=8),
                                eval=EvalSection(claims_per_hop=1000, samples=8)),
    },
    run=run,
    train_step=train_step,
)
