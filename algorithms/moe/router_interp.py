"""RouterInterp: explaining MoE routing by unions of sparse-autoencoder features (SSH).

The Superposed Specialisation Hypothesis (SSH) says an expert's routing region is a disjoint union of
many fine-grained features. This module explains each expert of a router by the SAE features most
predictive of routing to it, and scores an explanation by how well a simulator that reads it detects
routing on held-out tokens. All functions are pure; arrays are numpy.

Public functions:
  * routing labels: `router_logits`, `topk_routing`, `route`;
  * feature-expert scores: `alignment_scores` (router row . decoder direction, centred across experts;
    `center_rows`, `mean_active_value`, `feature_logit_contributions`), `precision_coverage`,
    `probe_scores` (L1 logistic probe);
  * feature sets: `greedy_feature_set`, `select_feature_sets` (grow the union while its precision stays
    >= `min_precision`, until its recall reaches `target_recall`);
  * explanation and detection: `describe_features`, `explain_experts`, the `Explainer` / `Simulator`
    protocols with `RuleBasedExplainer` / `RuleBasedSimulator` (deviation: the paper's LLM explainer
    and simulator cannot run offline), `evaluate_explanations`, `detection_metrics`, `macro_detection`;
  * baselines: `token_statistics_explanations`, `single_feature_explanations`,
    `single_domain_explanations`, `BigramPredictor`, `raw_probe_predictions`;
  * ground truth: `planted_world` (an SSH world and a single-domain control), `match_features`,
    `set_recovery`.

Dimension legend: ``n`` tokens, ``d`` router-input width, ``E`` experts, ``F`` SAE features,
``V`` vocabulary, ``D`` domains, ``G`` token groups.

Spec: `../shared/papers/specs/inference_moe.md`, section 7.

References:
  "RouterInterp and the Superposed Specialisation Hypothesis" (ICML 2026; no arXiv id; earlier
  version: Lasy & Cai, SPAR report "Interpreting Mixture of Experts Routing through Sparse
  Autoencoders").
  Gao et al., "Scaling and evaluating sparse autoencoders", arXiv:2406.04093, 2024.
  Bills et al., "Language models can explain neurons in language models", OpenAI, 2023 (simulation
  scoring).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple, Protocol, Sequence

import jax
import numpy as np

__all__ = [
    "router_logits",
    "topk_routing",
    "route",
    "center_rows",
    "mean_active_value",
    "feature_logit_contributions",
    "alignment_scores",
    "precision_coverage",
    "probe_scores",
    "FeatureSet",
    "greedy_feature_set",
    "select_feature_sets",
    "TokenContext",
    "Explanation",
    "Explainer",
    "Simulator",
    "RuleBasedExplainer",
    "RuleBasedSimulator",
    "describe_features",
    "explain_experts",
    "detection_metrics",
    "macro_detection",
    "evaluate_explanations",
    "token_statistics_explanations",
    "single_feature_explanations",
    "single_domain_explanations",
    "BigramPredictor",
    "raw_probe_predictions",
    "match_features",
    "set_recovery",
    "PlantedWorld",
    "planted_world",
    "WORLD_KINDS",
    "FEATURE_FAMILIES",
]

WORLD_KINDS = ("ssh", "single_domain")
FEATURE_FAMILIES = ("domain", "token", "group", "prev_group", "noise")  # `planted_world` feature families


def _as2d(name: str, a, ncols: int | None = None) -> np.ndarray:
    a = np.asarray(a)
    if a.ndim != 2 or (ncols is not None and a.shape[1] != ncols):
        want = f"[*, {ncols}]" if ncols is not None else "2-D"
        raise ValueError(f"{name} must be {want}, got shape {a.shape}")
    return a


# ------------------------------------------------------------------------------------------------
# Routing.
# ------------------------------------------------------------------------------------------------

def router_logits(router_w, x, bias=None) -> np.ndarray:
    """Router logits ``x W_r^T (+ bias)`` [n, E] in float64 from rows `router_w` [E, d], `x` [n, d]."""
    w = _as2d("router_w", router_w).astype(np.float64)
    x = _as2d("x", x, w.shape[1]).astype(np.float64)
    out = x @ w.T
    if bias is not None:
        b = np.asarray(bias, np.float64)
        if b.shape != (w.shape[0],):
            raise ValueError(f"bias must have shape ({w.shape[0]},), got {b.shape}")
        out = out + b
    return out


def topk_routing(logits, k: int) -> np.ndarray:
    """``y[t, e] = 1[e in top_k(logits[t])]`` [n, E] bool; ties go to the lower expert index."""
    logits = _as2d("logits", logits)
    e = logits.shape[1]
    if not 1 <= k <= e:
        raise ValueError(f"k must be in [1, {e}] (the number of experts), got {k}")
    order = np.argsort(-logits, axis=1, kind="stable")[:, :k]
    y = np.zeros(logits.shape, bool)
    np.put_along_axis(y, order, True, axis=1)
    return y


def route(router_w, x, k: int, bias=None) -> np.ndarray:
    """Top-k routing labels [n, E] of a linear router (see `router_logits`, `topk_routing`)."""
    return topk_routing(router_logits(router_w, x, bias), k)


# ------------------------------------------------------------------------------------------------
# Feature-expert association.
# ------------------------------------------------------------------------------------------------

def center_rows(router_w) -> np.ndarray:
    """Router rows minus their mean over experts (top-k / softmax see only relative logits)."""
    w = _as2d("router_w", router_w).astype(np.float64)
    return w - w.mean(axis=0, keepdims=True)


def mean_active_value(codes, *, threshold: float = 0.0) -> np.ndarray:
    """``E[f_i | f_i > threshold]`` [F] (0 for features that never fire)."""
    codes = _as2d("codes", codes).astype(np.float64)
    act = codes > threshold
    cnt = act.sum(0)
    tot = np.where(act, codes, 0.0).sum(0)
    return np.where(cnt > 0, tot / np.maximum(cnt, 1), 0.0)


def feature_logit_contributions(router_w, decoder, codes) -> np.ndarray:
    """Per-token, per-feature logit contributions ``f[t, i] (r_e . d_i)`` [n, F, E] (small inputs only)."""
    w = _as2d("router_w", router_w).astype(np.float64)
    dec = _as2d("decoder", decoder, w.shape[1]).astype(np.float64)
    codes = _as2d("codes", codes, dec.shape[0]).astype(np.float64)
    return codes[:, :, None] * (dec @ w.T)[None]


def alignment_scores(router_w, decoder, codes=None, *, mean_activation=None, center: bool = True,
                     threshold: float = 0.0) -> np.ndarray:
    """Alignment ``a~[i, e] = (r_e . d_i) E[f_i | f_i > 0]`` [F, E], rows centred across experts.

    Args:
      router_w: [E, d] router rows r_e.
      decoder: [F, d] SAE decoder directions d_i (rows).
      codes: [n, F] SAE codes used for ``E[f_i | f_i > threshold]``; or pass `mean_activation`.
      mean_activation: [F] precomputed ``E[f_i | f_i > 0]`` (defaults to ones if `codes` is None).
      center: subtract the mean over experts (adding a vector to every row then changes nothing).
      threshold: activity threshold for the conditional mean.
    """
    w = center_rows(router_w) if center else _as2d("router_w", router_w).astype(np.float64)
    dec = _as2d("decoder", decoder, w.shape[1]).astype(np.float64)
    if mean_activation is None:
        mean_activation = (mean_active_value(codes, threshold=threshold) if codes is not None
                           else np.ones(dec.shape[0]))
    m = np.asarray(mean_activation, np.float64)
    if m.shape != (dec.shape[0],):
        raise ValueError(f"mean_activation must have shape ({dec.shape[0]},), got {m.shape}")
    return (dec @ w.T) * m[:, None]


def precision_coverage(active, labels) -> tuple[np.ndarray, np.ndarray]:
    """Precision ``P(y_e | f_i active)`` and coverage ``P(f_i active | y_e)``, each [F, E].

    Features that never fire get precision 0; experts never routed get coverage 0.
    """
    a = _as2d("active", active).astype(np.float64)
    y = _as2d("labels", labels).astype(np.float64)
    if a.shape[0] != y.shape[0]:
        raise ValueError(f"active and labels need the same number of rows, got {a.shape[0]} and {y.shape[0]}")
    both = a.T @ y  # [F, E]
    n_feat = a.sum(0)[:, None]
    n_exp = y.sum(0)[None, :]
    prec = np.where(n_feat > 0, both / np.maximum(n_feat, 1), 0.0)
    cov = np.where(n_exp > 0, both / np.maximum(n_exp, 1), 0.0)
    return prec, cov


def _l1_kwargs() -> dict:
    """The L1-penalty keyword of LogisticRegression (`penalty` is deprecated from scikit-learn 1.8)."""
    import sklearn

    major, minor = (int(p) for p in sklearn.__version__.split(".")[:2])
    return {"l1_ratio": 1.0} if (major, minor) >= (1, 8) else {"penalty": "l1"}


def probe_scores(codes, labels, *, c: float = 0.1, max_rows: int | None = 20000, seed: int = 0,
                 max_iter: int = 200) -> np.ndarray:
    """L1-regularised logistic probe ``y_e ~ sigma(w_e . f + b)`` per expert; returns w [F, E].

    Uses scikit-learn's liblinear solver on standardised codes (scale only; zeros stay zeros); the
    non-zero positive weights select features. Experts whose labels are constant get zero weights.
    """
    from sklearn.linear_model import LogisticRegression

    codes = _as2d("codes", codes).astype(np.float64)
    y = _as2d("labels", labels).astype(bool)
    if codes.shape[0] != y.shape[0]:
        raise ValueError(f"codes and labels need the same number of rows, got {codes.shape[0]} and {y.shape[0]}")
    if c <= 0:
        raise ValueError(f"c must be > 0, got {c}")
    idx = np.arange(codes.shape[0])
    if max_rows is not None and codes.shape[0] > max_rows:
        idx = np.random.default_rng(seed).choice(codes.shape[0], max_rows, replace=False)
    xs, ys = codes[idx], y[idx]
    scale = np.sqrt(np.mean(xs * xs, axis=0))
    scale = np.where(scale > 0, scale, 1.0)
    xs = xs / scale
    out = np.zeros((codes.shape[1], y.shape[1]))
    for e in range(y.shape[1]):
        if ys[:, e].all() or not ys[:, e].any():
            continue
        clf = LogisticRegression(C=c, solver="liblinear", max_iter=max_iter, random_state=seed, **_l1_kwargs())
        clf.fit(xs, ys[:, e])
        out[:, e] = clf.coef_[0]
    return out


# ------------------------------------------------------------------------------------------------
# Greedy per-expert feature sets (the union view of SSH).
# ------------------------------------------------------------------------------------------------

class FeatureSet(NamedTuple):
    """A greedy per-expert set.

    Attributes:
      features: the selected indices, in order of addition.
      precision: union precision after each addition [|S|].
      recall: union recall after each addition [|S|] (non-decreasing).
    """

    features: tuple[int, ...]
    precision: np.ndarray
    recall: np.ndarray


def greedy_feature_set(active, label, scores, *, min_precision: float = 0.6, target_recall: float = 0.95,
                       max_features: int = 20, min_score: float = 0.0, max_candidates: int | None = None,
                       floor: str = "marginal") -> FeatureSet:
    """Greedy union of features in decreasing `scores` order under a precision floor.

    Candidates are the features with ``score > min_score`` sorted by (-score, index) (deterministic
    tie-breaking). A candidate is added iff it covers at least one new positive and the precision
    floor holds; otherwise it is skipped. Stops when the union's recall reaches `target_recall` or
    |S| = `max_features`. With ``floor="marginal"`` (default) the precision on the tokens the
    candidate newly covers must be >= `min_precision` (each member is predictive where it adds
    coverage; the union's precision is then >= `min_precision` as well); with ``floor="union"`` only
    the union's precision after adding it must be.

    Args:
      active: [n, F] bool, feature i fires on token t.
      label: [n] bool, y_e.
      scores: [F] ranking scores (alignment, probe weight, precision, ...).
      min_precision: the precision floor p_min.
      target_recall: stop once the union covers this fraction of the positives.
      max_features: K_max.
      min_score: only features scoring above this are candidates.
      max_candidates: consider only the top this many candidates (None: all).
      floor: "marginal" or "union" (see above).
    """
    if floor not in ("marginal", "union"):
        raise ValueError(f"floor must be 'marginal' or 'union', got {floor!r}")
    a = _as2d("active", active).astype(bool)
    y = np.asarray(label).astype(bool)
    s = np.asarray(scores, np.float64)
    if y.shape != (a.shape[0],):
        raise ValueError(f"label must have shape ({a.shape[0]},), got {y.shape}")
    if s.shape != (a.shape[1],):
        raise ValueError(f"scores must have shape ({a.shape[1]},), got {s.shape}")
    if not 0.0 <= min_precision <= 1.0 or not 0.0 < target_recall <= 1.0:
        raise ValueError(f"need 0 <= min_precision <= 1 and 0 < target_recall <= 1, got {min_precision}, "
                         f"{target_recall}")
    if max_features < 1:
        raise ValueError(f"max_features must be >= 1, got {max_features}")
    npos = int(y.sum())
    cand = np.nonzero(s > min_score)[0]
    cand = cand[np.lexsort((cand, -s[cand]))]
    if max_candidates is not None:
        cand = cand[:max_candidates]
    covered = np.zeros(a.shape[0], bool)
    tp = fp = 0
    feats, precs, recs = [], [], []
    if npos == 0:
        return FeatureSet((), np.zeros(0), np.zeros(0))
    for i in cand:
        new = a[:, i] & ~covered
        dtp = int(np.count_nonzero(new & y))
        if dtp == 0:
            continue
        dfp = int(np.count_nonzero(new)) - dtp
        prec = dtp / (dtp + dfp) if floor == "marginal" else (tp + dtp) / (tp + dtp + fp + dfp)
        if prec < min_precision:
            continue
        covered |= new
        tp, fp = tp + dtp, fp + dfp
        feats.append(int(i))
        precs.append(tp / (tp + fp))
        recs.append(tp / npos)
        if recs[-1] >= target_recall or len(feats) >= max_features:
            break
    return FeatureSet(tuple(feats), np.asarray(precs), np.asarray(recs))


def select_feature_sets(active, labels, scores, **kwargs) -> list[FeatureSet]:
    """`greedy_feature_set` for every expert: `scores` [F, E], `labels` [n, E]."""
    labels = _as2d("labels", labels)
    scores = _as2d("scores", scores, labels.shape[1])
    return [greedy_feature_set(active, labels[:, e], scores[:, e], **kwargs) for e in range(labels.shape[1])]


# ------------------------------------------------------------------------------------------------
# Explanations, explainers and simulators.
# ------------------------------------------------------------------------------------------------

class TokenContext(NamedTuple):
    """What a simulator may read about each token.

    Attributes:
      active: [n, F] bool SAE feature activity (None if unavailable).
      token_ids: [n] int token identities (None if unavailable).
      domain_ids: [n] int domain labels (None if unavailable).
      prev_token_ids: [n] int previous tokens (None if unavailable).
    """

    active: np.ndarray | None = None
    token_ids: np.ndarray | None = None
    domain_ids: np.ndarray | None = None
    prev_token_ids: np.ndarray | None = None


class Explanation(NamedTuple):
    """An explanation of one expert.

    Attributes:
      expert: the expert index.
      kind: "features", "tokens" or "domains" (what `items` index).
      items: the feature / token / domain indices of the explanation.
      text: the merged natural-language explanation.
    """

    expert: int
    kind: str
    items: tuple[int, ...]
    text: str


EXPLANATION_KINDS = ("features", "tokens", "domains")


class Explainer(Protocol):
    """Turns a selected item set and per-item descriptions into an `Explanation` (e.g. an LLM merge)."""

    def explain(self, expert: int, kind: str, items: Sequence[int], descriptions: Sequence[str]) -> Explanation:
        ...


class Simulator(Protocol):
    """Reads an explanation and predicts, per token, whether it is routed to the expert ([n] bool)."""

    def simulate(self, explanation: Explanation, context: TokenContext) -> np.ndarray:
        ...


@dataclasses.dataclass(frozen=True)
class RuleBasedExplainer:
    """Merges item descriptions into "routes tokens that are A; or B; ..." (the rule-based default)."""

    max_items_in_text: int = 20

    def explain(self, expert: int, kind: str, items: Sequence[int], descriptions: Sequence[str]) -> Explanation:
        if kind not in EXPLANATION_KINDS:
            raise ValueError(f"kind must be one of {EXPLANATION_KINDS}, got {kind!r}")
        items = tuple(int(i) for i in items)
        if len(descriptions) != len(items):
            raise ValueError(f"need one description per item, got {len(descriptions)} for {len(items)} items")
        if not items:
            return Explanation(expert, kind, items, f"expert {expert}: no explanation (routes nothing predictable)")
        shown = list(descriptions[: self.max_items_in_text])
        more = len(items) - len(shown)
        text = f"expert {expert} routes tokens that are " + "; or ".join(shown) + (f"; or {more} more" if more else "")
        return Explanation(expert, kind, items, text)


@dataclasses.dataclass(frozen=True)
class RuleBasedSimulator:
    """Predicts "routed" iff any item of the explanation matches the token (the rule-based default).

    features: any listed SAE feature fires; tokens: the token is listed; domains: its domain is listed.
    """

    def simulate(self, explanation: Explanation, context: TokenContext) -> np.ndarray:
        items = np.asarray(explanation.items, np.int64)
        if explanation.kind == "features":
            if context.active is None:
                raise ValueError("context.active is needed to simulate a feature explanation")
            a = np.asarray(context.active, bool)
            return a[:, items].any(axis=1) if items.size else np.zeros(a.shape[0], bool)
        if explanation.kind == "tokens":
            if context.token_ids is None:
                raise ValueError("context.token_ids is needed to simulate a token explanation")
            return np.isin(np.asarray(context.token_ids), items)
        if explanation.kind == "domains":
            if context.domain_ids is None:
                raise ValueError("context.domain_ids is needed to simulate a domain explanation")
            return np.isin(np.asarray(context.domain_ids), items)
        raise ValueError(f"explanation.kind must be one of {EXPLANATION_KINDS}, got {explanation.kind!r}")


def describe_features(active, token_ids=None, domain_ids=None, *, features: Sequence[int] | None = None,
                      top_tokens: int = 3, token_names: Sequence[str] | None = None,
                      domain_names: Sequence[str] | None = None) -> list[str]:
    """Rule-based auto-interp from activating examples: top tokens and the dominant domain per feature.

    Returns one description per feature in `features` (default: all), e.g.
    ``"f17: tokens {')', ']'} in domain code (93%)"``.
    """
    a = _as2d("active", active).astype(bool)
    feats = range(a.shape[1]) if features is None else features
    tok = None if token_ids is None else np.asarray(token_ids)
    dom = None if domain_ids is None else np.asarray(domain_ids)
    out = []
    for i in feats:
        rows = np.nonzero(a[:, int(i)])[0]
        parts = [f"f{int(i)}"]
        if rows.size == 0:
            out.append(f"f{int(i)}: never active")
            continue
        if tok is not None:
            vals, cnt = np.unique(tok[rows], return_counts=True)
            top = vals[np.lexsort((vals, -cnt))][:top_tokens]
            names = [repr(token_names[v]) if token_names is not None else str(int(v)) for v in top]
            parts.append("tokens {" + ", ".join(names) + ("" if len(vals) <= top_tokens else ", ...") + "}")
        if dom is not None:
            vals, cnt = np.unique(dom[rows], return_counts=True)
            j = int(np.argmax(cnt))
            name = domain_names[vals[j]] if domain_names is not None else str(int(vals[j]))
            parts.append(f"in domain {name} ({cnt[j] / rows.size:.0%})")
        out.append(parts[0] + ": " + " ".join(parts[1:]) if len(parts) > 1 else parts[0])
    return out


def explain_experts(feature_sets: Sequence[FeatureSet], *, kind: str = "features", descriptions=None,
                    explainer: Explainer | None = None) -> list[Explanation]:
    """Explanations of every expert from its selected set (descriptions indexed by item id, or None)."""
    explainer = explainer or RuleBasedExplainer()
    out = []
    for e, fs in enumerate(feature_sets):
        items = fs.features if isinstance(fs, FeatureSet) else tuple(fs)
        desc = [descriptions[i] if descriptions is not None else f"{kind[:-1]} {i}" for i in items]
        out.append(explainer.explain(e, kind, items, desc))
    return out


# ------------------------------------------------------------------------------------------------
# Detection metrics.
# ------------------------------------------------------------------------------------------------

def detection_metrics(pred, truth) -> dict[str, float]:
    """Balanced accuracy, precision, recall and F1 of binary predictions (sklearn's conventions).

    Balanced accuracy is the mean recall over the classes present in `truth` (so 0.5 for any constant
    predictor when both classes occur); precision (F1) is 0 when nothing is predicted positive.
    """
    p = np.asarray(pred).astype(bool).ravel()
    t = np.asarray(truth).astype(bool).ravel()
    if p.shape != t.shape:
        raise ValueError(f"pred and truth must have the same size, got {p.shape} and {t.shape}")
    if t.size == 0:
        raise ValueError("need at least one token")
    tp = int(np.count_nonzero(p & t))
    fp = int(np.count_nonzero(p & ~t))
    fn = int(np.count_nonzero(~p & t))
    tn = int(np.count_nonzero(~p & ~t))
    rec = tp / (tp + fn) if tp + fn else 0.0
    tnr = tn / (tn + fp) if tn + fp else 0.0
    present = [r for r, n in ((rec, tp + fn), (tnr, tn + fp)) if n > 0]
    bacc = float(np.mean(present))
    prec = tp / (tp + fp) if tp + fp else 0.0
    f1 = 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 0.0
    return {"balanced_accuracy": bacc, "precision": prec, "recall": rec, "f1": f1}


def macro_detection(preds, truth) -> dict:
    """`detection_metrics` per expert column of `preds`, `truth` [n, E], and their macro average."""
    preds = _as2d("preds", preds)
    truth = _as2d("truth", truth, preds.shape[1])
    per = [detection_metrics(preds[:, e], truth[:, e]) for e in range(truth.shape[1])]
    mean = {k: float(np.mean([m[k] for m in per])) for k in per[0]}
    return {"mean": mean, "per_expert": per}


def evaluate_explanations(explanations: Sequence[Explanation], context: TokenContext, labels,
                          simulator: Simulator | None = None) -> dict:
    """Simulates every explanation on `context` and scores it against `labels` [n, E]."""
    simulator = simulator or RuleBasedSimulator()
    labels = _as2d("labels", labels)
    if len(explanations) != labels.shape[1]:
        raise ValueError(f"need one explanation per expert ({labels.shape[1]}), got {len(explanations)}")
    preds = np.stack([simulator.simulate(ex, context) for ex in explanations], axis=1)
    return macro_detection(preds, labels)


# ------------------------------------------------------------------------------------------------
# Baselines.
# ------------------------------------------------------------------------------------------------

def _one_hot_bool(ids: np.ndarray, size: int) -> np.ndarray:
    out = np.zeros((ids.shape[0], size), bool)
    out[np.arange(ids.shape[0]), ids] = True
    return out


def token_statistics_explanations(token_ids, labels, vocab_size: int, *, min_precision: float = 0.6,
                                  target_recall: float = 0.95, max_features: int = 20,
                                  explainer: Explainer | None = None, token_names=None) -> list[Explanation]:
    """Token-statistics explanations: the top routed tokens of each expert.

    Tokens are ranked by how often they are routed to the expert and kept by the same greedy union
    rule as the feature sets (same precision floor and size cap), so the comparison isolates what the
    explanation is made of.
    """
    tok = np.asarray(token_ids).astype(np.int64)
    y = _as2d("labels", labels).astype(bool)
    if tok.shape != (y.shape[0],):
        raise ValueError(f"token_ids must have shape ({y.shape[0]},), got {tok.shape}")
    if tok.size and (tok.min() < 0 or tok.max() >= vocab_size):
        raise ValueError(f"token_ids must be in [0, {vocab_size}), got range [{tok.min()}, {tok.max()}]")
    onehot = _one_hot_bool(tok, vocab_size)
    counts = onehot.T.astype(np.float64) @ y.astype(np.float64)  # [V, E] routed counts
    sets = [greedy_feature_set(onehot, y[:, e], counts[:, e], min_precision=min_precision,
                               target_recall=target_recall, max_features=max_features) for e in range(y.shape[1])]
    desc = [repr(token_names[v]) if token_names is not None else f"token {v}" for v in range(vocab_size)]
    return explain_experts(sets, kind="tokens", descriptions=desc, explainer=explainer)


def single_feature_explanations(active, labels, *, metric: str = "f1", descriptions=None,
                                explainer: Explainer | None = None) -> list[Explanation]:
    """The single SAE feature that best detects each expert on the given (training) tokens."""
    a = _as2d("active", active).astype(np.float64)
    y = _as2d("labels", labels).astype(np.float64)
    tp = a.T @ y
    npred = a.sum(0)[:, None]
    npos = y.sum(0)[None, :]
    n = a.shape[0]
    if metric == "f1":
        score = 2 * tp / np.maximum(npred + npos, 1)
    elif metric == "balanced_accuracy":
        rec = tp / np.maximum(npos, 1)
        tnr = (n - npos - (npred - tp)) / np.maximum(n - npos, 1)
        score = 0.5 * (rec + tnr)
    else:
        raise ValueError(f"metric must be 'f1' or 'balanced_accuracy', got {metric!r}")
    best = np.argmax(score, axis=0)
    return explain_experts([(int(b),) for b in best], kind="features", descriptions=descriptions,
                           explainer=explainer)


def single_domain_explanations(domain_ids, labels, num_domains: int, *, domain_names=None,
                               explainer: Explainer | None = None) -> list[Explanation]:
    """The single domain that best detects each expert (by F1): the "one expert, one domain" reading."""
    dom = np.asarray(domain_ids).astype(np.int64)
    y = _as2d("labels", labels)
    if dom.shape != (y.shape[0],):
        raise ValueError(f"domain_ids must have shape ({y.shape[0]},), got {dom.shape}")
    onehot = _one_hot_bool(dom, num_domains).astype(np.float64)
    tp = onehot.T @ y.astype(np.float64)
    f1 = 2 * tp / np.maximum(onehot.sum(0)[:, None] + y.sum(0)[None, :], 1)
    best = np.argmax(f1, axis=0)
    desc = [f"in domain {domain_names[c] if domain_names is not None else c}" for c in range(num_domains)]
    return explain_experts([(int(b),) for b in best], kind="domains", descriptions=desc, explainer=explainer)


class BigramPredictor:
    """Predicts routing from (previous token, token) co-occurrence statistics (the SPAR baseline).

    ``P(y_e | prev, tok) = (n_e(prev, tok) + beta P(y_e | tok)) / (n(prev, tok) + beta)``, with
    ``P(y_e | tok)`` backed off the same way to the expert's base rate; "routed" iff >= `threshold`.
    """

    def __init__(self, vocab_size: int, *, beta: float = 1.0, threshold: float = 0.5):
        if vocab_size < 1 or beta < 0:
            raise ValueError(f"need vocab_size >= 1 and beta >= 0, got {vocab_size}, {beta}")
        self.vocab_size, self.beta, self.threshold = vocab_size, beta, threshold
        self.uni = self.pair = None

    def _check(self, prev, tok):
        prev, tok = np.asarray(prev, np.int64), np.asarray(tok, np.int64)
        if prev.shape != tok.shape or prev.ndim != 1:
            raise ValueError(f"prev_token_ids and token_ids must be equal-length 1-D arrays, got {prev.shape}, "
                             f"{tok.shape}")
        for name, a in (("prev_token_ids", prev), ("token_ids", tok)):
            if a.size and (a.min() < 0 or a.max() >= self.vocab_size):
                raise ValueError(f"{name} must be in [0, {self.vocab_size}), got [{a.min()}, {a.max()}]")
        return prev, tok

    def fit(self, prev_token_ids, token_ids, labels) -> "BigramPredictor":
        prev, tok = self._check(prev_token_ids, token_ids)
        y = _as2d("labels", labels).astype(np.float64)
        v, e = self.vocab_size, y.shape[1]
        base = y.mean(0)
        n_uni = np.bincount(tok, minlength=v).astype(np.float64)
        c_uni = np.zeros((v, e))
        np.add.at(c_uni, tok, y)
        self.uni = (c_uni + self.beta * base) / (n_uni[:, None] + self.beta)
        pair = prev * v + tok
        n_pair = np.bincount(pair, minlength=v * v).astype(np.float64)
        c_pair = np.zeros((v * v, e))
        np.add.at(c_pair, pair, y)
        uni_of_pair = self.uni[np.arange(v * v) % v]
        self.pair = (c_pair + self.beta * uni_of_pair) / (n_pair[:, None] + self.beta)
        return self

    def probabilities(self, prev_token_ids, token_ids) -> np.ndarray:
        if self.pair is None:
            raise ValueError("call fit() first")
        prev, tok = self._check(prev_token_ids, token_ids)
        return self.pair[prev * self.vocab_size + tok]

    def predict(self, prev_token_ids, token_ids) -> np.ndarray:
        return self.probabilities(prev_token_ids, token_ids) >= self.threshold


def raw_probe_predictions(x_train, y_train, x_test, *, c: float = 1.0, max_rows: int = 20000, seed: int = 0
                          ) -> np.ndarray:
    """Logistic probe on the raw router inputs (an upper bound that is not an explanation) [n_test, E]."""
    from sklearn.linear_model import LogisticRegression

    xtr = _as2d("x_train", x_train).astype(np.float64)
    xte = _as2d("x_test", x_test, xtr.shape[1]).astype(np.float64)
    y = _as2d("y_train", y_train).astype(bool)
    idx = np.arange(xtr.shape[0])
    if xtr.shape[0] > max_rows:
        idx = np.random.default_rng(seed).choice(xtr.shape[0], max_rows, replace=False)
    out = np.zeros((xte.shape[0], y.shape[1]), bool)
    for e in range(y.shape[1]):
        ye = y[idx, e]
        if ye.all() or not ye.any():
            out[:, e] = bool(ye.all())
            continue
        clf = LogisticRegression(C=c, max_iter=500)
        clf.fit(xtr[idx], ye)
        out[:, e] = clf.predict(xte).astype(bool)
    return out


# ------------------------------------------------------------------------------------------------
# Ground-truth matching.
# ------------------------------------------------------------------------------------------------

def match_features(learned, true, *, min_cosine: float = 0.9) -> np.ndarray:
    """For each learned direction [F_l, d], the true direction [F_t, d] of highest cosine, or -1 if < min_cosine."""
    l = _as2d("learned", learned).astype(np.float64)
    t = _as2d("true", true, l.shape[1]).astype(np.float64)
    l = l / np.maximum(np.linalg.norm(l, axis=1, keepdims=True), 1e-12)
    t = t / np.maximum(np.linalg.norm(t, axis=1, keepdims=True), 1e-12)
    cos = l @ t.T
    best = np.argmax(cos, axis=1)
    return np.where(cos[np.arange(l.shape[0]), best] >= min_cosine, best, -1)


def set_recovery(selected: Sequence[Sequence[int]], planted: Sequence[Sequence[int]], matching=None) -> dict:
    """Precision / recall of selected sets against planted sets (after mapping learned -> true ids).

    `matching` [F_l] maps learned feature ids to true ids (-1: unmatched); None means identity.
    Returns macro means and per-expert values, plus the number of experts recovered exactly.
    """
    if len(selected) != len(planted):
        raise ValueError(f"need as many selected as planted sets, got {len(selected)} and {len(planted)}")
    precs, recs, exact = [], [], 0
    for sel, pl in zip(selected, planted):
        mapped = [int(matching[i]) if matching is not None else int(i) for i in sel]
        sset, pset = set(m for m in mapped if m >= 0), set(int(p) for p in pl)
        hit = len(sset & pset)
        precs.append(hit / len(mapped) if mapped else 0.0)
        recs.append(hit / len(pset) if pset else 0.0)
        exact += int(sset == pset and len(mapped) == len(sset))
    return {"precision": float(np.mean(precs)), "recall": float(np.mean(recs)), "exact": exact,
            "per_expert_precision": precs, "per_expert_recall": recs}


# ------------------------------------------------------------------------------------------------
# Planted-feature worlds.
# ------------------------------------------------------------------------------------------------

class PlantedWorld(NamedTuple):
    """A planted-feature world with exact ground truth.

    Attributes:
      x: router inputs [n, d] (float32).
      codes: true feature values [n, F] (>= 0; > 0 iff active).
      directions: true unit feature directions [F, d].
      router_w: router rows [E, d].
      labels: top-k routing [n, E] bool.
      token_ids, prev_token_ids, domain_ids, position: [n] int each.
      planted_sets: per expert, the true feature indices whose union selects it.
      feature_names: [F] strings ("domain 3", "tok 17", "grp 2 @ dom 5", "prev grp 1 @ dom 0", "noise 9").
      top_k: routing k.
      num_domains, vocab_size: sizes.
    """

    x: np.ndarray
    codes: np.ndarray
    directions: np.ndarray
    router_w: np.ndarray
    labels: np.ndarray
    token_ids: np.ndarray
    prev_token_ids: np.ndarray
    domain_ids: np.ndarray
    position: np.ndarray
    planted_sets: tuple[tuple[int, ...], ...]
    feature_names: tuple[str, ...]
    top_k: int
    num_domains: int
    vocab_size: int


def _zipf(n: int, s: float) -> np.ndarray:
    p = 1.0 / np.arange(1, n + 1) ** s
    return p / p.sum()


def _check_world_sizes(kind, families, *, num_sequences, seq_len, num_domains, vocab_size, shared_vocab_fraction,
                       shared_token_prob, num_groups, num_experts, top_k, router_fit) -> None:
    """Raises ValueError on a `planted_world` argument that names no world or no valid size."""
    if kind not in WORLD_KINDS:
        raise ValueError(f"kind must be one of {WORLD_KINDS}, got {kind!r}")
    bad = [f for f in families if f not in FEATURE_FAMILIES]
    if bad:
        raise ValueError(f"unknown feature families {bad}")
    if num_domains < 1 or vocab_size < num_domains + 1 or num_groups < 1 or seq_len < 1 or num_sequences < 1:
        raise ValueError(f"invalid sizes: num_domains={num_domains}, vocab_size={vocab_size}, "
                         f"num_groups={num_groups}, seq_len={seq_len}, num_sequences={num_sequences}")
    if not 0.0 <= shared_vocab_fraction < 1.0 or not 0.0 <= shared_token_prob <= 1.0:
        raise ValueError(f"need 0 <= shared_vocab_fraction < 1 and 0 <= shared_token_prob <= 1, got "
                         f"{shared_vocab_fraction}, {shared_token_prob}")
    if not 1 <= top_k <= num_experts:
        raise ValueError(f"top_k must be in [1, num_experts={num_experts}], got {top_k}")
    if router_fit not in ("lstsq", "direct"):
        raise ValueError(f"router_fit must be 'lstsq' or 'direct', got {router_fit!r}")


def _split_vocab(D: int, V: int, shared_vocab_fraction: float, shared_token_prob: float
                 ) -> tuple[int, list[np.ndarray]]:
    """The number of shared tokens (ids 0..n_shared-1) and each domain's own token ids (the rest, split in D)."""
    n_shared = int(round(shared_vocab_fraction * V))
    if shared_token_prob > 0 and n_shared == 0:
        raise ValueError("shared_token_prob > 0 needs shared_vocab_fraction * vocab_size >= 1")
    spec = np.array_split(np.arange(n_shared, V), D)
    if any(len(s) == 0 for s in spec):
        raise ValueError(f"vocab_size={V} leaves a domain without its own tokens")
    return n_shared, spec


def _feature_layout(families, D: int, V: int, G: int, num_noise_features: int
                    ) -> tuple[dict[str, int], list[str], int]:
    """Column offset of each present family (in FEATURE_FAMILIES order), feature names and the count F."""
    sizes = {"domain": D, "token": V, "group": G * D, "prev_group": G * D, "noise": num_noise_features}
    offsets, names, off = {}, [], 0
    for fam in FEATURE_FAMILIES:
        if fam not in families:
            continue
        offsets[fam] = off
        off += sizes[fam]
        if fam == "domain":
            names += [f"domain {c}" for c in range(D)]
        elif fam == "token":
            names += [f"tok {v}" for v in range(V)]
        elif fam == "group":
            names += [f"grp {g} @ dom {c}" for c in range(D) for g in range(G)]
        elif fam == "prev_group":
            names += [f"prev grp {g} @ dom {c}" for c in range(D) for g in range(G)]
        else:
            names += [f"noise {j}" for j in range(num_noise_features)]
    return offsets, names, off


def _sample_text(rng: np.random.Generator, *, num_sequences: int, seq_len: int, n_shared: int, spec,
                 shared_token_prob: float, zipf_exponent: float) -> tuple[np.ndarray, np.ndarray]:
    """Sequence domains [num_sequences] and tokens [num_sequences, seq_len + 1] (the first is context only)."""
    D = len(spec)
    shared_order = [rng.permutation(n_shared) for _ in range(D)]
    p_shared = _zipf(max(n_shared, 1), zipf_exponent)
    dom = rng.integers(0, D, num_sequences)
    toks = np.zeros((num_sequences, seq_len + 1), np.int64)
    for s in range(num_sequences):
        c = dom[s]
        own = spec[c]
        is_sh = rng.random(seq_len + 1) < shared_token_prob
        sh = shared_order[c][rng.choice(max(n_shared, 1), seq_len + 1, p=p_shared)] if n_shared else 0
        ow = own[rng.choice(len(own), seq_len + 1, p=_zipf(len(own), zipf_exponent))]
        toks[s] = np.where(is_sh, sh, ow)
    return dom, toks


def _sample_codes(rng: np.random.Generator, offsets: dict[str, int], F: int, tok, prev, domain_ids, *, G: int,
                  num_noise_features: int, max_noise_active: int, zipf_exponent: float) -> np.ndarray:
    """Feature values [n, F]: each token's family features ~ U(0.5, 1.5), plus Zipfian noise features."""
    n = tok.size
    codes = np.zeros((n, F))
    rows = np.arange(n)

    def put(col):
        codes[rows, col] = rng.uniform(0.5, 1.5, n)

    if "domain" in offsets:
        put(offsets["domain"] + domain_ids)
    if "token" in offsets:
        put(offsets["token"] + tok)
    if "group" in offsets:
        put(offsets["group"] + domain_ids * G + tok % G)
    if "prev_group" in offsets:
        put(offsets["prev_group"] + domain_ids * G + prev % G)
    if "noise" in offsets and num_noise_features > 0 and max_noise_active > 0:
        pz = _zipf(num_noise_features, zipf_exponent)
        m = rng.integers(0, max_noise_active + 1, n)
        for j in range(max_noise_active):
            sel = m > j
            col = offsets["noise"] + rng.choice(num_noise_features, n, p=pz)
            codes[rows[sel], col[sel]] = rng.uniform(0.5, 1.5, int(sel.sum()))
    return codes


def _plant_router(rng: np.random.Generator, kind: str, offsets: dict[str, int], F: int, *, d_model: int,
                  num_domains: int, num_groups: int, num_experts: int, router_scale: float, orthogonal: bool
                  ) -> tuple[np.ndarray, tuple[tuple[int, ...], ...], np.ndarray]:
    """Feature directions [F, d], the planted feature set of each expert and the intended router
    weights alpha [E, F] (logits z = codes alpha^T)."""
    D, G = num_domains, num_groups
    if orthogonal:
        if F > d_model:
            raise ValueError(f"orthogonal directions need F <= d_model, got F={F}, d_model={d_model}")
        q, _ = np.linalg.qr(rng.normal(size=(d_model, d_model)))
        dirs = q[:, :F].T.copy()
    else:
        dirs = rng.normal(size=(F, d_model))
        dirs /= np.linalg.norm(dirs, axis=1, keepdims=True)
    if kind == "ssh":
        combo = [offsets[f] + j for f in ("group", "prev_group") if f in offsets for j in range(G * D)]
        if not combo:
            raise ValueError("the ssh world needs the 'group' or 'prev_group' feature family")
        perm = rng.permutation(np.asarray(combo))
        planted = tuple(tuple(sorted(int(i) for i in part)) for part in np.array_split(perm, num_experts))
    else:
        if "domain" not in offsets:
            raise ValueError("the single_domain world needs the 'domain' feature family")
        planted = tuple((offsets["domain"] + e % D,) for e in range(num_experts))
    alpha = np.zeros((num_experts, F))
    for e, s in enumerate(planted):
        if s:
            alpha[e, list(s)] = router_scale * rng.uniform(0.8, 1.2, len(s))
    return dirs, planted, alpha


def _fit_router(rng: np.random.Generator, codes, x, dirs, alpha, *, router_fit: str, router_ridge: float,
                router_noise: float) -> np.ndarray:
    """Router rows [E, d] producing the intended logits codes alpha^T, plus relative noise."""
    n, d_model = x.shape
    if router_fit == "direct":
        router_w = alpha @ dirs
    else:
        # The router a linear layer trained to produce the intended logits z = codes alpha^T would
        # learn: ridge least squares on this world's tokens (it suppresses the interference of
        # the other features along the planted directions).
        z = codes @ alpha.T
        xc = x - x.mean(0)
        router_w = np.linalg.solve(xc.T @ xc + router_ridge * n * np.eye(d_model), xc.T @ (z - z.mean(0))).T
    return router_w + router_noise * np.linalg.norm(router_w, axis=1, keepdims=True) * rng.normal(
        size=router_w.shape) / np.sqrt(d_model)


def planted_world(key: jax.Array, *, kind: str = "ssh", num_sequences: int = 400, seq_len: int = 32,
                  d_model: int = 64, num_domains: int = 8, vocab_size: int = 128,
                  shared_vocab_fraction: float = 0.25, shared_token_prob: float = 0.4, num_groups: int = 16,
                  num_experts: int = 16, top_k: int = 2, num_noise_features: int = 128,
                  max_noise_active: int = 2, zipf_exponent: float = 1.1, router_scale: float = 4.0,
                  router_noise: float = 0.05, activation_noise: float = 0.0, orthogonal: bool = False,
                  families: tuple[str, ...] = FEATURE_FAMILIES,
                  router_fit: str = "lstsq", router_ridge: float = 1e-3, router_world=None) -> PlantedWorld:
    """Generates token sequences from a mixture of domains, planted features, router inputs and routing.

    Text: each sequence is one domain; each token is, with probability `shared_token_prob`, a shared
    token (vocabulary shared by every domain, Zipf-distributed in a domain-specific order) and
    otherwise one of the domain's own tokens (Zipf). Token v belongs to group ``v mod G``.

    Features of a token (families; values ~ U(0.5, 1.5)): its domain; its identity; the combination
    "group of this token x domain" and "group of the previous token x domain" (the fine-grained,
    context-dependent features, e.g. "closing brackets in code"); and 0..`max_noise_active` Zipfian
    noise features. ``x = sum_i f_i d_i + activation_noise * N(0, I)`` with random unit d_i (or
    orthonormal ones if `orthogonal` and F <= d).

    Routers (rows r_e = sum_{i in S*_e} alpha_i d_i + router_noise * N(0, I / d), alpha_i ~
    router_scale * U(0.8, 1.2)):

    * ``kind="ssh"``: the 2 G D combination features are split at random into E disjoint sets
      S*_e (each expert is selected by a disjoint union of fine-grained features across domains);
    * ``kind="single_domain"``: expert e is one domain, S*_e = {domain feature of e mod D} (with E = 2D
      and top_k = 2 both experts of a token's domain are selected).

    `router_world`: optionally a previous `PlantedWorld` whose directions and router are reused (a
    held-out sample of the same world: pass a different key).

    Returns:
      A `PlantedWorld` with n = num_sequences * seq_len tokens.
    """
    _check_world_sizes(kind, families, num_sequences=num_sequences, seq_len=seq_len, num_domains=num_domains,
                       vocab_size=vocab_size, shared_vocab_fraction=shared_vocab_fraction,
                       shared_token_prob=shared_token_prob, num_groups=num_groups, num_experts=num_experts,
                       top_k=top_k, router_fit=router_fit)
    rng = np.random.default_rng(np.asarray(jax.random.key_data(key)).ravel().tolist())
    D, V, G = num_domains, vocab_size, num_groups
    n_shared, spec = _split_vocab(D, V, shared_vocab_fraction, shared_token_prob)
    offsets, names, F = _feature_layout(families, D, V, G, num_noise_features)

    # Text, then the true features of every token.
    dom, toks = _sample_text(rng, num_sequences=num_sequences, seq_len=seq_len, n_shared=n_shared, spec=spec,
                             shared_token_prob=shared_token_prob, zipf_exponent=zipf_exponent)
    tok = toks[:, 1:].ravel()
    prev = toks[:, :-1].ravel()
    domain_ids = np.repeat(dom, seq_len)
    position = np.tile(np.arange(seq_len), num_sequences)
    codes = _sample_codes(rng, offsets, F, tok, prev, domain_ids, G=G, num_noise_features=num_noise_features,
                          max_noise_active=max_noise_active, zipf_exponent=zipf_exponent)

    # Directions and router: planted here, or reused from `router_world`.
    if router_world is not None:
        dirs, router_w = router_world.directions, router_world.router_w
        planted = router_world.planted_sets
        if dirs.shape != (F, d_model):
            raise ValueError(f"router_world has directions {dirs.shape}, this world needs {(F, d_model)}")
    else:
        dirs, planted, alpha = _plant_router(rng, kind, offsets, F, d_model=d_model, num_domains=D, num_groups=G,
                                             num_experts=num_experts, router_scale=router_scale,
                                             orthogonal=orthogonal)

    x = codes @ dirs
    if activation_noise > 0:
        x = x + activation_noise * rng.normal(size=x.shape)
    if router_world is None:
        router_w = _fit_router(rng, codes, x, dirs, alpha, router_fit=router_fit, router_ridge=router_ridge,
                               router_noise=router_noise)
    labels = route(router_w, x, top_k)
    return PlantedWorld(x.astype(np.float32), codes.astype(np.float32), dirs, router_w, labels, tok, prev,
                        domain_ids, position, planted, tuple(names), top_k, D, V)
