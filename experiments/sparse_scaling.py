"""Sparse data-constrained scaling: the published law's findings, and a tiny DST grid fitted by the law.

Part 1 (no training) evaluates the paper's published constants (`algorithms.scaling.sparse_law.PUBLISHED`)
and prints, beside the numbers the spec derived from the paper's notebooks: R_D*(s) and R_N*(s) (delayed
data saturation), the density factor f(s), the loss-optimal density at fixed data (U = 1.3B, 16 epochs)
for N_total in {1e8, 5e8, 2e9, 8e9}, and the compute-optimal density at C in {1e19, 1e20, 1e21} for
U in {1.3B, 13B}.

Part 2 trains tiny decoder LMs (`models.Transformer`) with SET dynamic sparse training
(`algorithms.scaling.dynamic_sparse`) on a fixed budget of U unique tokens drawn from a random
second-order Markov chain (a finite set of sequences, so repetition can overfit; the chain's entropy
rate is the exact loss floor), replayed for up to `train.max_epochs` epochs (reshuffled with seed = epoch).
Grid: model widths x densities; validation loss on fresh sequences from the same chain at fractions of
the first epoch (single-epoch points, D <= U) and at every epoch boundary (D = e U). Each (width,
density) is one run with a constant learning rate after warmup, evaluated at those boundaries (the
"epochs" axis is read off one run rather than one run per epoch count; see the verdict).

Part 3 fits the law on that grid with the paper's 4-stage Huber / L-BFGS procedure, holding out the
widest model, and reports in-sample and held-out errors, the fitted R_D*(s), and the direct
saturation measurements (best epoch, degradation after the best epoch) per density.

Recipe:
    python -m experiments run sparse_scaling --preset smoke   # seconds, used by the tests
    python -m experiments run sparse_scaling --preset quick   # 2 CPU cores, a few minutes
    python -m experiments run sparse_scaling --preset paper   # wider grid, accelerator
    python -m experiments run sparse_scaling --preset smoke --train.max-epochs 3   # one field of a config section

Config sections (`run sparse_scaling --help` lists every field): data, model, train, fit; law_analysis (part 1)
and seed are top-level.

Expected (quick): part 1 matches the spec to 2 decimals; part 2 the direction of delayed saturation
(fitted R_D* larger for sparse models, later/lower overfitting at equal total parameters).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import pathlib
import time
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from etils import epath

from algorithms import training
from algorithms.scaling import dynamic_sparse as ds
from algorithms.scaling import sparse_law as law
from experiments import _plotting as plotting
from experiments import checks as checks_lib
from experiments import registry, report
from experiments.checks import Check
from models import Transformer, TransformerConfig

# The spec's numbers derived from the paper's notebooks (section 8, "Consequences").
PAPER_R_D_STAR = {1.0: 4.40, 0.5: 6.91, 0.25: 7.04, 0.125: 6.82, 0.0625: 6.64}
PAPER_R_N_STAR = {1.0: 11.09, 0.5: 13.88, 0.25: 9.46, 0.125: 5.80, 0.0625: 3.60}
PAPER_F = {1.0: 1.0, 0.5: 0.855, 0.25: 0.800, 0.0625: 0.769}
PAPER_LOSS_OPT = {1e8: 0.79, 5e8: 0.71, 2e9: 0.63, 8e9: 0.58}
PAPER_COMPUTE_OPT = {1.3e9: {1e19: 0.23, 1e20: 0.45, 1e21: 0.55}, 1.3e10: {1e19: 0.05, 1e20: 0.07, 1e21: 0.23}}
_CACHE_VERSION = 1


@dataclasses.dataclass(frozen=True, kw_only=True)
class DataSection:
    """Part 2's data: a random order-2 Markov chain over `vocab_size` tokens (``--data.unique-sequences 2048``)."""

    vocab_size: int = 24
    markov_order: int = 2
    dirichlet_concentration: float = 0.1
    seq_len: int = 32
    unique_sequences: int = 1024  # U = unique_sequences * seq_len training targets
    val_sequences: int = 128


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelSection:
    """The grid of decoder LMs, widths x densities; embeddings and output stay dense (``--model.head-dim 4``)."""

    d_models: tuple[int, ...] = (16, 32, 64)
    num_layers: int = 2
    ffn_multiplier: int = 2
    head_dim: int = 8
    densities: tuple[float, ...] = (1.0, 0.5, 0.25)


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainSection:
    """SET dynamic sparse training, replayed for up to `max_epochs` epochs (``--train.max-epochs 8``)."""

    batch_size: int = 32
    max_epochs: int = 16
    first_epoch_fractions: tuple[float, ...] = (0.125, 0.25, 0.5)
    learning_rate: float = 1e-2
    warmup_steps: int = 20
    update_frequency: int = 25
    initial_prune_rate: float = 0.1


_FIT_GRIDS = ("paper", "coarse")


@dataclasses.dataclass(frozen=True, kw_only=True)
class FitSection:
    """Part 3, the law fitted on the grid (``--fit.grid coarse``)."""

    saturation_margin: float = 0.005  # nats: a dense run 'saturates' if it ends this far above its best
    holdout_largest: bool = True
    grid: str = "paper"  # "paper" (the notebook's grids) or "coarse"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Config:
    """sparse_scaling settings, in sections overridden on the command line as ``--train.max-epochs 8``."""

    law_analysis: bool = True  # part 1: the published law
    data: DataSection = DataSection()
    model: ModelSection = ModelSection()
    train: TrainSection = TrainSection()
    fit: FitSection = FitSection()
    seed: int = 0
    progress: bool = True

    def __post_init__(self):
        err, dens = registry.ConfigError, self.model.densities
        if any(not 0 < s <= 1 for s in dens) or 1.0 not in dens or len(dens) < 2:
            raise err("model.densities", f"must lie in (0, 1], include 1.0 (the dense baseline) and one sparse "
                                         f"value; got {dens}")
        if self.train.max_epochs < 2:
            raise err("train.max_epochs", f"must be >= 2 to measure repetition; got {self.train.max_epochs}")
        if self.fit.grid not in _FIT_GRIDS:
            raise err("fit.grid", f"must be 'paper' or 'coarse'; got {self.fit.grid!r}")


# The flat field names the config had before it was split into sections, in their old order: a grid run's
# cache key holds them, so runs cached before the split stay valid.
_FLAT_FIELDS = (
    ("law_analysis", "law_analysis"), ("vocab_size", "data.vocab_size"), ("markov_order", "data.markov_order"),
    ("dirichlet_concentration", "data.dirichlet_concentration"), ("seq_len", "data.seq_len"),
    ("unique_sequences", "data.unique_sequences"), ("val_sequences", "data.val_sequences"),
    ("d_models", "model.d_models"), ("num_layers", "model.num_layers"), ("ffn_multiplier", "model.ffn_multiplier"),
    ("head_dim", "model.head_dim"), ("densities", "model.densities"), ("batch_size", "train.batch_size"),
    ("max_epochs", "train.max_epochs"), ("first_epoch_fractions", "train.first_epoch_fractions"),
    ("learning_rate", "train.learning_rate"), ("warmup_steps", "train.warmup_steps"),
    ("update_frequency", "train.update_frequency"), ("initial_prune_rate", "train.initial_prune_rate"),
    ("saturation_margin", "fit.saturation_margin"), ("holdout_largest", "fit.holdout_largest"),
    ("fit_grid", "fit.grid"), ("seed", "seed"), ("progress", "progress"),
)


def _flat_fields(c: Config) -> dict:
    """The config as the pre-sections flat dict (``dataclasses.asdict`` of the old flat config)."""
    return registry.flat_fields(c, _FLAT_FIELDS)


# ----------------------------------------------------------------------------------------------
# Data: a finite corpus from a random higher-order Markov chain.


def markov_table(seed: int, vocab: int, order: int, concentration: float) -> np.ndarray:
    """[vocab^order, vocab] transition probabilities, rows ~ Dirichlet(concentration)."""
    rng = np.random.default_rng(seed)
    return rng.dirichlet(np.full(vocab, concentration), size=vocab ** order)


def sample_sequences(seed: int, table: np.ndarray, num: int, length: int, order: int) -> np.ndarray:
    """[num, length] int32 token sequences from the chain (the first `order` tokens uniform)."""
    vocab = table.shape[1]
    rng = np.random.default_rng(seed)
    x = np.zeros((num, length), np.int64)
    x[:, :order] = rng.integers(0, vocab, (num, order))
    cum = np.cumsum(table, axis=1)
    for t in range(order, length):
        ctx = np.zeros(num, np.int64)
        for j in range(order):
            ctx = ctx * vocab + x[:, t - order + j]
        u = rng.random(num)[:, None]
        x[:, t] = np.minimum((cum[ctx] < u).sum(axis=1), vocab - 1)
    return x.astype(np.int32)


def entropy_rate(table: np.ndarray, order: int) -> float:
    """Exact entropy rate (nats/token) of the stationary chain: the lowest achievable loss."""
    vocab = table.shape[1]
    n_ctx = table.shape[0]
    # Transition between contexts: ctx (x_{t-o}..x_{t-1}) -> (x_{t-o+1}..x_t).
    pi = np.full(n_ctx, 1.0 / n_ctx)
    nxt = (np.arange(n_ctx)[:, None] * vocab) % n_ctx + np.arange(vocab)[None, :]
    for _ in range(2000):
        new = np.zeros(n_ctx)
        np.add.at(new, nxt.ravel(), (pi[:, None] * table).ravel())
        if np.max(np.abs(new - pi)) < 1e-13:
            pi = new
            break
        pi = new
    h = -np.sum(np.where(table > 0, table * np.log(np.maximum(table, 1e-300)), 0.0), axis=1)
    return float(np.sum(pi * h))


# ----------------------------------------------------------------------------------------------
# Part 1.


def _law_part(c: Config) -> dict:
    ours = law.published_findings(loss_opt_n_totals=tuple(PAPER_LOSS_OPT),
                                  compute_unique=tuple(PAPER_COMPUTE_OPT))
    rows, max_err = [], 0.0

    def add(name, paper, mine, tol):
        nonlocal max_err
        err = abs(paper - mine)
        max_err = max(max_err, err if tol == 0.01 else 0.0)
        rows.append({"quantity": name, "paper": paper, "ours": mine, "match_2dp": bool(err <= tol)})

    for s, v in PAPER_R_D_STAR.items():
        add(f"R_D*(s={s:g})", v, ours["r_d_star"][s], 0.005)
    for s, v in PAPER_R_N_STAR.items():
        add(f"R_N*(s={s:g})", v, ours["r_n_star"][s], 0.005)
    for s, v in PAPER_F.items():
        add(f"f(s={s:g})", v, ours["f"][s], 0.0005)
    for nt, v in PAPER_LOSS_OPT.items():
        add(f"loss-opt s at N_total={nt:.0e}, U=1.3e9, 16 ep", v, ours["loss_optimal_density"][nt], 0.005)
    for u, row in PAPER_COMPUTE_OPT.items():
        for cc, v in row.items():
            # The spec truncates (0.2351 -> 0.23): half a unit of the 2nd decimal plus that.
            add(f"compute-opt s at C={cc:.0e}, U={u:.1e}", v, ours["compute_optimal_density"][u][cc], 0.006)
    sparse_rd = [ours["r_d_star"][s] for s in PAPER_R_D_STAR if s < 1]
    findings = {
        "delayed_saturation": bool(min(sparse_rd) > ours["r_d_star"][1.0]),
        "interior_loss_optimal_density": bool(all(0.3 < v < 0.95 for v in ours["loss_optimal_density"].values())),
        "loss_optimal_density_decreases_with_size": bool(np.all(np.diff(list(ours["loss_optimal_density"].values())) < 0)),
        "compute_optimal_sparser_than_loss_optimal": bool(
            max(ours["compute_optimal_density"][1.3e9].values()) < 0.79),
        "compute_optimal_sparsity_grows_with_data": bool(all(
            ours["compute_optimal_density"][1.3e10][cc] < ours["compute_optimal_density"][1.3e9][cc]
            for cc in PAPER_COMPUTE_OPT[1.3e9])),
    }
    return {"table": rows, "all_match": all(r["match_2dp"] for r in rows), "findings": findings, "raw": ours}


# ----------------------------------------------------------------------------------------------
# Part 2.


def _model_config(c: Config, d_model: int) -> TransformerConfig:
    heads = max(1, d_model // c.model.head_dim)
    return TransformerConfig(vocab_size=c.data.vocab_size, d_model=d_model, num_layers=c.model.num_layers,
                             num_heads=heads, num_kv_heads=heads, d_ff=c.model.ffn_multiplier * d_model,
                             head_dim=c.model.head_dim)


def _num_steps(c: Config) -> tuple[int, int]:
    """(steps per epoch, steps of every grid run): whole batches of the U unique sequences, `max_epochs` times."""
    steps_per_epoch = max(1, c.data.unique_sequences // c.train.batch_size)
    return steps_per_epoch, steps_per_epoch * c.train.max_epochs


def _optimizer(c: Config) -> training.OptimizerConfig:
    """Every grid run's optimizer: Adam at a constant rate after warmup, no weight decay, no clipping (the paper's)."""
    _, num_steps = _num_steps(c)
    return training.OptimizerConfig(learning_rate=c.train.learning_rate,
                                    warmup_steps=min(c.train.warmup_steps, num_steps),
                                    total_steps=num_steps, end_lr_fraction=1.0, weight_decay=0.0, clip_norm=None)


def train_step(c: Config):
    """The grid's largest run's step (the widest model; every density trains the same dense-shaped step), for
    ``python -m experiments aot sparse_scaling`` (`experiments.aot`).

    SET keeps the sparse matrices dense-shaped: the parameters hold zeros at the inactive entries, Adam's
    moments are dense too, and a boolean mask per matrix is applied to the gradients before the optimizer
    and to the parameters after it (`ds.make_dst_functions`). This step compiles the model, optimizer, loss
    and batch of that run; the masks are not an argument of `aot`'s train state, so the compiled step leaves
    out their bytes (a bool array shaped like every parameter leaf, all True for the dense ones: one byte per
    parameter) and the two elementwise selects. The prune/regrow update every ``train.update_frequency`` steps
    is a separate program.
    """
    from experiments import aot

    return aot.TrainStep(model=_model_config(c, max(c.model.d_models)), optimizer=_optimizer(c),
                         batch_size=c.train.batch_size, seq_len=c.data.seq_len)


def _eval_steps(c: Config, steps_per_epoch: int) -> dict[int, float]:
    """step -> epochs completed at that step (fractions of epoch 1, then every epoch)."""
    out = {}
    for f in c.train.first_epoch_fractions:
        st = max(1, int(round(f * steps_per_epoch)))
        out[st] = st / steps_per_epoch
    for e in range(1, c.train.max_epochs + 1):
        out[e * steps_per_epoch] = float(e)
    return out


def _run_key(c: Config, d_model: int, density: float) -> str:
    fields = {k: v for k, v in _flat_fields(c).items()
              if k not in ("progress", "holdout_largest", "fit_grid", "law_analysis", "d_models", "densities")}
    blob = json.dumps({"v": _CACHE_VERSION, "c": fields, "d": d_model, "s": density}, sort_keys=True, default=str)
    return hashlib.sha1(blob.encode()).hexdigest()[:16]


def _train_grid(c: Config, workdir: pathlib.Path) -> tuple[list[dict], dict]:
    from tqdm.auto import tqdm

    table = markov_table(c.seed, c.data.vocab_size, c.data.markov_order, c.data.dirichlet_concentration)
    train = sample_sequences(c.seed + 1, table, c.data.unique_sequences, c.data.seq_len + 1, c.data.markov_order)
    val = sample_sequences(c.seed + 2, table, c.data.val_sequences, c.data.seq_len + 1, c.data.markov_order)
    floor = entropy_rate(table, c.data.markov_order)
    steps_per_epoch, num_steps = _num_steps(c)
    unique_tokens = steps_per_epoch * c.train.batch_size * c.data.seq_len  # targets actually seen per epoch
    evals_at = _eval_steps(c, steps_per_epoch)
    val_batch = {"inputs": val[:, :-1], "targets": val[:, 1:], "loss_mask": np.ones(val[:, 1:].shape, np.float32)}

    def batch_fn(step):
        epoch, i = divmod(step, steps_per_epoch)
        perm = np.random.default_rng(1000 + epoch).permutation(c.data.unique_sequences)  # reshuffle, seed = epoch
        rows = train[perm[i * c.train.batch_size:(i + 1) * c.train.batch_size]]
        return {"inputs": rows[:, :-1], "targets": rows[:, 1:], "loss_mask": np.ones(rows[:, 1:].shape, np.float32)}

    opt_cfg = _optimizer(c)
    runs, cache_dir = [], workdir / "runs"
    cache_dir.mkdir(parents=True, exist_ok=True)
    bar = tqdm(total=len(c.model.d_models) * len(c.model.densities), desc="sparse_scaling grid", disable=not c.progress)
    for d_model in c.model.d_models:
        mcfg = _model_config(c, d_model)
        fns = None
        for density in c.model.densities:
            path = cache_dir / f"d{d_model}_s{density:g}_{_run_key(c, d_model, density)}.json"
            if path.exists():
                runs.append(json.loads(path.read_text()))
                bar.update(1)
                continue
            if fns is None:  # compiled once per width, shared by every density
                fns = ds.make_dst_functions(lambda r, m=mcfg: Transformer(m, rngs=r), training.make_optimizer(opt_cfg))
            t0 = time.perf_counter()
            res = ds.train_dst(optimizer_config=opt_cfg, batch_fn=batch_fn, num_steps=num_steps, density=density,
                               update_frequency=c.train.update_frequency, initial_prune_rate=c.train.initial_prune_rate,
                               seed=c.seed, functions=fns, eval_steps=tuple(evals_at),
                               eval_fn=lambda p: float(fns.loss(p, val_batch)["loss"]),
                               progress=False)
            flags = ds.sparse_leaves(res.state.params)
            total = sum(x.size for x in jax.tree.leaves(res.state.params))
            dense_part = total - res.num_sparse
            row = {
                "d_model": d_model, "density": density, "n_total": int(total),
                "n_active": int(dense_part + round(density * res.num_sparse)),
                "mask_density": ds.mask_density(res.masks, flags),
                "steps": num_steps, "seconds": time.perf_counter() - t0,
                "evals": [{"step": st, "epochs": evals_at[st], "val_loss": v} for st, v in sorted(res.evals.items())],
                "final_train_loss": next(h["loss"] for h in reversed(res.history) if "loss" in h),
            }
            path.write_text(json.dumps(row))
            runs.append(row)
            bar.update(1)
    bar.close()
    info = {"entropy_rate": floor, "unique_tokens": unique_tokens, "steps_per_epoch": steps_per_epoch,
            "num_steps": num_steps, "uniform_loss": math.log(c.data.vocab_size)}
    return runs, info


def _saturation(runs: list[dict]) -> dict:
    """Per run: best epoch (argmin val loss over whole epochs), loss there, degradation at the last epoch."""
    out = {}
    for r in runs:
        ep = [(e["epochs"], e["val_loss"]) for e in r["evals"] if e["epochs"] >= 1 and float(e["epochs"]).is_integer()]
        ep.sort()
        e_arr, l_arr = np.array([e for e, _ in ep]), np.array([v for _, v in ep])
        i = int(np.argmin(l_arr))
        l1 = float(l_arr[0])
        out[(r["d_model"], r["density"])] = {
            "best_epoch": float(e_arr[i]), "best_loss": float(l_arr[i]), "loss_1_epoch": l1,
            "loss_last": float(l_arr[-1]), "degradation_after_best": float(l_arr[-1] - l_arr[i]),
            "gain_from_repetition": float(l1 - l_arr[i]),
        }
    return out


def _fit_points(runs: list[dict], unique_tokens: int, tokens_per_step: int):
    pts = []
    for r in runs:
        for e in r["evals"]:
            d = e["step"] * tokens_per_step
            pts.append((r["d_model"], r["n_active"], min(unique_tokens, d), d, r["density"], e["val_loss"],
                        e["epochs"]))
    return pts


def _fit_config(c: Config) -> law.FitConfig:
    if c.fit.grid == "paper":
        return law.FitConfig()
    return law.FitConfig(grids={
        1: {"a": (0.0, 5.0), "b": (0.0, 5.0), "e": (-1.0, 0.5), "alpha": (0.2, 0.6)},
        2: {"epsilon": (-0.5, 0.5), "mu": (0.5, 1.5), "c": (-0.5, 0.5)},
        3: {"gamma1": (2.0, 10.0), "gamma2": (2.0, 10.0)},
        4: {"c11": (-1.0, 1.0), "c12": (-1.0, 1.0), "c21": (-1.0, 1.0), "c22": (-1.0, 1.0)},
    }, maxiter=150)


def _predict(q, n, u, d, s) -> np.ndarray:
    """The fitted law's prediction in the form the fit minimised (f(s) clamped at 1e-12)."""
    return np.exp(law.log_loss_full(q, n, u, d, s))


def headline(metrics: Mapping[str, Any]) -> str:
    """Our small-scale result in one table cell (the README catalog's "ours" column), from the quick result's metrics."""
    parts = []
    if "published_law" in metrics:
        table = metrics["published_law"]["table"]
        parts.append(f"published law: {sum(r['match_2dp'] for r in table)}/{len(table)} derived numbers match")
    sat, widths = metrics.get("saturation", {}), metrics.get("saturating_widths") or []
    if widths:
        w = max(widths)
        by_s = {float(k.split("_s")[1]): v["degradation_after_best"] for k, v in sat.items()
                if k.startswith(f"d{w}_s")}
        sparse = "/".join(f"{by_s[s]:.2f}" for s in sorted(by_s, reverse=True) if s < 1)
        parts.append(f"toy DST d={w}: overfit {by_s[1.0]:.2f} dense vs {sparse} sparse")
    r2 = metrics.get("fit", {}).get("r2_fit_points")
    if r2 is not None:
        parts.append(f"toy fit R^2 {r2:.2f}")
    return "; ".join(parts)


def run(c: Config, workdir: pathlib.Path) -> dict:
    workdir = epath.Path(workdir)
    t_start = time.perf_counter()
    metrics: dict = {}
    part1 = _law_part(c) if c.law_analysis else None
    if part1 is not None:
        metrics["published_law"] = {k: v for k, v in part1.items() if k != "raw"}

    runs, info = _train_grid(c, workdir)
    metrics["data"] = info
    sat = _saturation(runs)
    tokens_per_step = c.train.batch_size * c.data.seq_len
    pts = _fit_points(runs, info["unique_tokens"], tokens_per_step)
    width, n_act, u_seen, d_tok, dens, val_loss, epochs = map(np.array, zip(*pts))
    widths = c.model.d_models
    held = (width == max(widths)) if (c.fit.holdout_largest and len(widths) >= 3) else np.zeros(width.size, bool)
    fit = law.fit_law(n_act[~held], u_seen[~held], d_tok[~held], dens[~held], val_loss[~held],
                      config=_fit_config(c), progress=c.progress)
    q = fit.params
    pred = _predict(q, n_act, u_seen, d_tok, dens)
    rel = np.abs(pred / val_loss - 1.0)
    fitted_rd = {s: float(law.r_d_star(s, q)) for s in c.model.densities}
    sparse_ds = [s for s in c.model.densities if s < 1]
    rd_later = all(fitted_rd[s] > fitted_rd[1.0] for s in sparse_ds)
    # Direct measurement at equal total size, on the widths whose dense model saturates (its loss at
    # the last epoch is above its best by more than `saturation_margin`): does the sparse model
    # overfit less after its best epoch?
    saturating = [dm for dm in c.model.d_models if sat[(dm, 1.0)]["degradation_after_best"] > c.fit.saturation_margin]
    pairs = [(dm, s) for dm in saturating for s in sparse_ds]
    agree = [sat[(dm, s)]["degradation_after_best"] < sat[(dm, 1.0)]["degradation_after_best"] for dm, s in pairs]
    direct = float(np.mean(agree)) if pairs else math.nan
    judgeable = len(c.model.d_models) >= 2 and c.train.max_epochs >= 4
    # Judged on the direct measurement; the fitted R_D* (an ill-conditioned fit at toy scale) is reported.

    metrics.update({
        "runs": runs,
        "saturation": {f"d{dm}_s{s:g}": v for (dm, s), v in sat.items()},
        "fit": {
            "params": dataclasses.asdict(q), "stage_points": {str(k): v for k, v in fit.stage_points.items()},
            "stage_losses": {str(k): v for k, v in fit.stage_losses.items()}, "r2_fit_points": fit.r2,
            "fitted_r_d_star": {f"{s:g}": v for s, v in fitted_rd.items()},
            "fitted_r_n_star": {f"{s:g}": float(law.r_n_star(s, q)) for s in c.model.densities},
            "fitted_f": {f"{s:g}": float(law.density_factor(s, q)) for s in c.model.densities},
            "in_sample_mean_rel_error": float(rel[~held].mean()), "in_sample_max_rel_error": float(rel[~held].max()),
            "heldout_width": int(max(c.model.d_models)) if held.any() else None,
            "heldout_mean_rel_error": float(rel[held].mean()) if held.any() else None,
            "heldout_max_rel_error": float(rel[held].max()) if held.any() else None,
        },
        "sparse_rd_star_larger": rd_later,
        "direct_saturation_agreement": direct,
        "saturating_widths": saturating,
        "seconds": time.perf_counter() - t_start,
    })
    plots = [_plot_curves(runs, info, c, workdir), _plot_fit(n_act, u_seen, d_tok, dens, val_loss, held, width,
                                                              q, c, workdir)]
    if part1 is not None:
        plots.append(_plot_law(part1["raw"], q, c, workdir))

    # Verdict.
    if part1 is not None:
        raw = part1["raw"]
        p1 = ("(1) Published constants: R_D*(s=1,.5,.25,.125,.0625) = "
              + "/".join(f"{raw['r_d_star'][s]:.2f}" for s in PAPER_R_D_STAR)
              + " (paper " + "/".join(f"{v:.2f}" for v in PAPER_R_D_STAR.values()) + "); f(.5,.25,.0625) = "
              + "/".join(f"{raw['f'][s]:.3f}" for s in (0.5, 0.25, 0.0625))
              + "; loss-optimal density at U=1.3B x16 ep for N_total 1e8..8e9 = "
              + "/".join(f"{v:.2f}" for v in raw["loss_optimal_density"].values())
              + " (paper 0.79/0.71/0.63/0.58); compute-optimal density at C=1e19/1e20/1e21: U=1.3B "
              + "/".join(f"{v:.3f}" for v in raw["compute_optimal_density"][1.3e9].values())
              + " (paper 0.23/0.45/0.55), U=13B "
              + "/".join(f"{v:.3f}" for v in raw["compute_optimal_density"][1.3e10].values())
              + " (paper 0.05/0.07/0.23); findings: " + ", ".join(
                  f"{k.replace('_', ' ')} {'yes' if v else 'NO'}" for k, v in part1["findings"].items()) + ". ")
    else:
        p1 = ""
    sat_txt = "; ".join(
        f"d={dm}: best epoch " + "/".join(f"{sat[(dm, s)]['best_epoch']:g}" for s in c.model.densities)
        + ", overfit after best " + "/".join(f"{sat[(dm, s)]['degradation_after_best']:.3f}" for s in c.model.densities)
        for dm in c.model.d_models)
    held_txt = (f"held-out d={int(max(c.model.d_models))} mean/max rel. error "
                f"{rel[held].mean():.1%}/{rel[held].max():.1%}"
                if held.any() else "no held-out size (fewer than 3 widths)")
    checks = []
    if part1 is not None:
        checks.append(Check("published constants: numbers matching the spec to 2 decimals",
                            f"{sum(r['match_2dp'] for r in part1['table'])}/{len(part1['table'])}",
                            "the spec's numbers from the paper's notebooks", "all", part1["all_match"],
                            required=False))
    checks.append(Check("fitted R_D*(s) on the toy grid, densities " + "/".join(f"{s:g}" for s in c.model.densities),
                        "/".join(f"{fitted_rd[s]:.2f}" for s in c.model.densities), "R_D* larger for sparse models",
                        "larger for every sparse density than for dense", rd_later, required=False,
                        note="reported, not judged: the toy fit is ill-conditioned"))
    checks.append(Check("(width, density) pairs where the sparse model overfits less after its best epoch "
                        "than dense", direct, "sparse training delays data saturation",
                        "> 0.5 of the pairs at widths where dense overfits", bool(pairs and direct > 0.5),
                        note=(f"{sum(agree)}/{len(agree)} pairs at widths {saturating}" if pairs else
                              "no dense run overfits within the epoch budget, so saturation cannot be "
                              "compared directly")))
    metrics["checks"] = [ch.as_dict() for ch in checks]
    claim = ("a law in active parameters, unique tokens, repetition and density predicts loss and extrapolates; "
             "sparse training delays data saturation; loss-optimal density is moderate and compute-optimal "
             "sparsity is higher and grows with data")
    context = (
        p1 + f"(2) Tiny DST grid (widths {list(c.model.d_models)}, densities {list(c.model.densities)}, "
        f"U={info['unique_tokens']:,} unique tokens replayed up to {c.train.max_epochs} epochs; loss floor "
        f"{info['entropy_rate']:.3f} nats): per density {'/'.join(f'{s:g}' for s in c.model.densities)}: {sat_txt}. "
        f"(3) Law fit on {int((~held).sum())} points: in-sample mean rel. error {rel[~held].mean():.1%} "
        f"(R^2 {fit.r2:.2f}{'; the law does not describe this toy grid well' if fit.r2 < 0.9 else ''}), {held_txt}. "
        "Delayed saturation is judged on the direct measurement. Caveat: epoch counts are read off one constant-LR "
        "run per (width, density) at epoch boundaries, not separate cosine-schedule runs per epoch count")
    if judgeable:
        cause = (f"the saturation check rests on {len(agree)} (width, density) pairs at the widths where dense "
                 f"overfits ({saturating}), one run each, {sum(agree)} agreeing: one pair decides it at this grid "
                 f"size, with no seed repeats to separate the effect from run noise" if pairs else
                 "no dense run overfits within the epoch budget, so the saturation claim is not measured")
        verdict, reproduced = checks_lib.verdict(checks, claim=claim, context=context, cause=cause,
                                                 cause_class="scale")
    else:  # too few widths or epochs to judge (smoke): the checks are reported, nothing decides
        verdict = (f"Not judged (grid too small, smoke): {claim}. " + "; ".join(ch.line() for ch in checks)
                   + f". {context}.")
        reproduced = None
    return {"metrics": metrics, "verdict": verdict, "reproduced": reproduced, "plots": plots,
            "cause": "scale" if reproduced is False else None}


# ----------------------------------------------------------------------------------------------
# Plots.


def _plot_curves(runs, info, c: Config, workdir: pathlib.Path) -> str:
    fig, axes = plotting.subplots(1, len(c.model.d_models), figsize=(4 * len(c.model.d_models), 3.3), squeeze=False)
    for ax, dm in zip(axes[0], c.model.d_models):
        for r in runs:
            if r["d_model"] != dm:
                continue
            e = [x["epochs"] for x in r["evals"]]
            v = [x["val_loss"] for x in r["evals"]]
            ax.plot(e, v, marker=".", label=f"density {r['density']:g} (N_act {r['n_active']:,})")
        ax.axhline(info["entropy_rate"], color="k", ls=":", lw=1, label="entropy rate")
        ax.set(xscale="log", xlabel="epochs over U unique tokens", ylabel="validation loss", title=f"d_model={dm}")
        ax.legend(fontsize=7)
    return report.savefig(fig, workdir / "loss_vs_epochs.png")


def _plot_fit(n_act, u_seen, d_tok, dens, val_loss, held, width, q, c: Config, workdir: pathlib.Path) -> str:
    fig, (ax1, ax2) = plotting.subplots(1, 2, figsize=(10, 3.6))
    pred = _predict(q, n_act, u_seen, d_tok, dens)
    for s, mk in zip(c.model.densities, "osd^v"):
        m = dens == s
        ax1.scatter(val_loss[m & ~held], pred[m & ~held], marker=mk, s=14, label=f"s={s:g} fit")
        if held.any():
            ax1.scatter(val_loss[m & held], pred[m & held], marker=mk, s=30, facecolors="none", edgecolors="r",
                        label=f"s={s:g} held out")
    lo, hi = float(min(val_loss.min(), pred.min())), float(max(val_loss.max(), pred.max()))
    ax1.plot([lo, hi], [lo, hi], "k--", lw=1)
    ax1.set(xlabel="observed validation loss", ylabel="law prediction", title="law fit vs observed")
    ax1.legend(fontsize=6)
    dm = max(c.model.d_models)
    for s in c.model.densities:
        m = (width == dm) & (dens == s)
        order = np.argsort(d_tok[m])
        ax2.plot((d_tok[m] / u_seen.max())[order], val_loss[m][order], "o", ms=3, label=f"s={s:g} observed")
        ax2.plot((d_tok[m] / u_seen.max())[order], pred[m][order], "-", lw=1)
    ax2.set(xscale="log", xlabel="tokens / U", ylabel="validation loss",
            title=f"d_model={dm}{' (held out)' if held.any() else ''}: law (lines)")
    ax2.legend(fontsize=6)
    return report.savefig(fig, workdir / "law_fit.png")


def _plot_law(raw, q, c: Config, workdir: pathlib.Path) -> str:
    s = np.linspace(0.05, 1.0, 200)
    fig, (ax1, ax2) = plotting.subplots(1, 2, figsize=(10, 3.4))
    ax1.plot(1 - s, law.r_d_star(s), label="R_D*(s) published")
    ax1.plot(1 - s, law.r_n_star(s), label="R_N*(s) published")
    ax1.plot(1 - s, law.r_d_star(s, q), "--", label="R_D*(s) fitted (toy grid)")
    ax1.set(xlabel="sparsity 1 - s", ylabel="decay constant", title="repetition decay constants")
    ax1.legend(fontsize=7)
    for nt in PAPER_LOSS_OPT:
        ax2.plot(1 - s, law.loss(nt * s, 1.3e9, 16 * 1.3e9, s), label=f"N_total={nt:.0e}")
        so = raw["loss_optimal_density"][nt]
        ax2.plot(1 - so, law.loss(nt * so, 1.3e9, 16 * 1.3e9, so), "k*")
    ax2.set(xlabel="sparsity 1 - s", ylabel="predicted loss", title="fixed data (U=1.3B, 16 ep): loss-optimal *")
    ax2.legend(fontsize=7)
    return report.savefig(fig, workdir / "published_law.png")


EXPERIMENT = registry.Experiment(
    slug="sparse_scaling",
    config_cls=Config,
    presets={
        "smoke": lambda: Config(
            law_analysis=False, data=DataSection(vocab_size=8, seq_len=8, unique_sequences=32, val_sequences=16),
            model=ModelSection(d_models=(8,), num_layers=1, densities=(1.0, 0.5)),
            train=TrainSection(batch_size=16, max_epochs=2, first_epoch_fractions=(0.5,), warmup_steps=1,
                               update_frequency=10_000),
            fit=FitSection(grid="coarse"), progress=False),
        "quick": lambda: Config(),
        "paper": lambda: Config(
            model=ModelSection(d_models=(32, 64, 128, 256), densities=(1.0, 0.5, 0.25, 0.125, 0.0625)),
            data=DataSection(unique_sequences=8192, seq_len=128),
            train=TrainSection(max_epochs=16, batch_size=64, first_epoch_fractions=(0.0625, 0.125, 0.25, 0.5),
                               update_frequency=100)),
    },
    run=run,
    train_step=train_step,
)
