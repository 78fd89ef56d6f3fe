"""SCM-GRPO: GRPO with a rule-based reward on explicit dependency graphs for multi-hop verification.

The policy verifies a multi-hop claim (SUPPORTS / REFUTES) by first writing a directed dependency graph
(nodes = facts or sub-claims, edges = "depends on", one sink C = the claim), then its verdict. This
module parses that output, checks the graph and scores it with a pluggable rule-based reward for
`algorithms.rl.grpo.train`.

Public functions:
  * parsing (never raises; a malformed output gives `Parsed(error=...)`): `parse_graph_text` (the
    paper-style `<graph> N1: ... E: N1 -> C </graph> <answer>SUPPORTS</answer>` format) and
    `parse_compact` (the CPU experiment's chain format `e4 e1 e6 | S`), both to `Graph(nodes, edges, sink)`;
  * structure: `check_graph` (non-empty, no dangling edge, acyclic, every node reaches the sink),
    `graph_depth` (longest path to the sink, in edges);
  * reward: `RewardConfig`, `label_only_config` (the plain-GRPO arm), `depth_score`,
    `conciseness_penalty`, `reward_terms`, `scm_reward`, and `make_reward_fn(tokenizer, config)`, the
    batched `reward_fn(problems, completions [b, N], lengths [b]) -> [b]`;
  * evaluation: `macro_f1`.

Reward (the spec's design; the paper's equations were not available), d* = the claim's hop count::

    r = -1                                                              if parsing or checking fails
    r = w_acc R_label + w_struct R_label g(d) - lambda_len max(0, |V| - (d* + 2))   otherwise
    g(d) = exp(-(d - d*)^2 / (2 s^2))

Spec: `../shared/papers/specs/rl_alignment_agents.md`, section 3.

References:
  Bu, Zhang, Zhang, ..., Luo, "Grounding Multi-Hop Reasoning in Structural Causal
    Models via Group Relative Policy Optimization", arXiv:2605.01482, 2026.
  Shao et al., "DeepSeekMath", arXiv:2402.03300, 2024 (GRPO).
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any, Callable, Iterable, NamedTuple, Sequence

import numpy as np

from algorithms.rl import grpo

__all__ = [
    "LABELS",
    "Graph",
    "Parsed",
    "RewardConfig",
    "RewardTerms",
    "parse_graph_text",
    "parse_compact",
    "check_graph",
    "graph_depth",
    "depth_score",
    "conciseness_penalty",
    "reward_terms",
    "scm_reward",
    "label_only_config",
    "make_reward_fn",
    "macro_f1",
]

LABELS = ("SUPPORTS", "REFUTES")
COMPACT_VERDICTS = {"S": "SUPPORTS", "R": "REFUTES"}
SINK = "C"


class Graph(NamedTuple):
    """A dependency graph.

    Attributes:
      nodes: node ids in declaration order (the sink excluded).
      edges: (source, destination) pairs in order, duplicates removed; a
        destination may be the sink.
      sink: the claim node's id.
    """

    nodes: tuple[str, ...]
    edges: tuple[tuple[str, str], ...]
    sink: str = SINK


class Parsed(NamedTuple):
    """The result of parsing one output: a graph and an answer, or an error message.

    Attributes:
      graph: the parsed graph (None on a parse error).
      answer: the verdict label, e.g. "SUPPORTS" (None on a parse error).
      error: None if the output parsed, else why not.
    """

    graph: Graph | None
    answer: str | None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def _fail(message: str) -> Parsed:
    return Parsed(None, None, message)


_IDENT = re.compile(r"[A-Za-z][A-Za-z0-9_]*\Z")
_NODE_LINE = re.compile(r"\s*([A-Za-z][A-Za-z0-9_]*)\s*:(.*)\Z")


def parse_graph_text(text: str, *, labels: Sequence[str] = LABELS, sink: str = SINK) -> Parsed:
    """Parses the text grammar `<graph> N1: ... E: a -> b ; ... </graph><answer>L</answer>`.

    Args:
      text: the model output.
      labels: accepted answers.
      sink: the claim node's id.

    Returns:
      `Parsed`; `error` names the first problem (missing block, bad line,
      duplicate node, bad edge, missing or unknown answer). Structural rules
      (cycles, dangling edges, reachability) are `check_graph`'s.

    Examples:
      >>> p = parse_graph_text("<graph>\\nN1: a\\nN2: b\\nE: N1 -> N2 ; N2 -> C\\n</graph><answer>REFUTES</answer>")
      >>> p.graph.nodes, p.graph.edges, p.answer
      (('N1', 'N2'), (('N1', 'N2'), ('N2', 'C')), 'REFUTES')
      >>> parse_graph_text("<graph>N1: a\\nE: N1 -> C</graph>").error
      'missing <answer>...</answer> after the graph'
    """
    if not isinstance(text, str):
        raise TypeError(f"text: expected str, got {type(text).__name__}")
    if text.count("<graph>") != 1 or text.count("</graph>") != 1:
        return _fail("expected exactly one <graph>...</graph> block")
    start, end = text.index("<graph>"), text.index("</graph>")
    if end < start:
        return _fail("</graph> before <graph>")
    body, rest = text[start + len("<graph>"):end], text[end + len("</graph>"):]
    m = re.fullmatch(r"\s*<answer>\s*([A-Za-z]+)\s*</answer>\s*", rest)
    if m is None:
        return _fail("missing <answer>...</answer> after the graph")
    if m.group(1) not in labels:
        return _fail(f"answer {m.group(1)!r} is not one of {tuple(labels)}")
    nodes: list[str] = []
    edges: list[tuple[str, str]] = []
    saw_edges = False
    for line in body.splitlines():
        if not line.strip():
            continue
        lm = _NODE_LINE.match(line)
        if lm is None:
            return _fail(f"cannot parse graph line {line.strip()!r}")
        name, content = lm.group(1), lm.group(2)
        if name == "E":
            if saw_edges:
                return _fail("more than one E: line")
            saw_edges = True
            for part in content.split(";"):
                if not part.strip():
                    continue
                ends = [s.strip() for s in part.split("->")]
                if len(ends) != 2 or not all(_IDENT.match(e) for e in ends):
                    return _fail(f"cannot parse edge {part.strip()!r}")
                if tuple(ends) not in edges:
                    edges.append((ends[0], ends[1]))
        else:
            if name == sink:
                return _fail(f"the sink {sink!r} cannot be declared as a node")
            if name in nodes:
                return _fail(f"node {name!r} declared twice")
            nodes.append(name)
    if not saw_edges:
        return _fail("missing E: line")
    return Parsed(Graph(tuple(nodes), tuple(edges), sink), m.group(1))


def parse_compact(text: str, *, verdicts: dict[str, str] | None = None, sink: str = SINK) -> Parsed:
    """Parses the compact grammar `id_1 id_2 ... id_m | V` into the chain id_1 -> ... -> id_m -> sink.

    Args:
      text: whitespace-separated tokens, e.g. "F4 F1 F6 | S".
      verdicts: verdict token -> label (default S -> SUPPORTS, R -> REFUTES).
      sink: the claim node's id.

    Returns:
      `Parsed`; an error when there is not exactly one "|", not exactly one
      verdict token after it, or a token that is not an identifier. Repeated
      ids are kept (they make a cycle that `check_graph` rejects).

    Examples:
      >>> p = parse_compact("F4 F1 F6 | S")
      >>> p.graph.edges, p.answer
      ((('F4', 'F1'), ('F1', 'F6'), ('F6', 'C')), 'SUPPORTS')
      >>> parse_compact("F4 F1").error
      "expected one '|' before the verdict, found 0"
    """
    if not isinstance(text, str):
        raise TypeError(f"text: expected str, got {type(text).__name__}")
    verdicts = COMPACT_VERDICTS if verdicts is None else verdicts
    tokens = text.split()
    if tokens.count("|") != 1:
        return _fail(f"expected one '|' before the verdict, found {tokens.count('|')}")
    bar = tokens.index("|")
    chain, tail = tokens[:bar], tokens[bar + 1:]
    if len(tail) != 1 or tail[0] not in verdicts:
        return _fail(f"expected one verdict token from {sorted(verdicts)} after '|', got {tail!r}")
    bad = [t for t in chain if not _IDENT.match(t) or t == sink]
    if bad:
        return _fail(f"chain tokens must be node ids other than {sink!r}; got {bad!r}")
    nodes = tuple(dict.fromkeys(chain))
    edges: list[tuple[str, str]] = []
    for a, b in zip(chain, chain[1:] + [sink]):
        if (a, b) not in edges:
            edges.append((a, b))
    return Parsed(Graph(nodes, tuple(edges), sink), verdicts[tail[0]])


def check_graph(graph: Graph, *, allowed_nodes: Iterable[str] | None = None) -> str | None:
    """The structural format rules; returns None if the graph passes, else why not.

    Rules: at least one node; node ids other than the sink; every edge
    endpoint a node or the sink (else a dangling edge); no edge out of the
    sink; no cycle (self-loops included); every node reaches the sink; every
    node in `allowed_nodes` when given (e.g. the evidence's fact ids).

    Examples:
      >>> check_graph(Graph(("A", "B"), (("A", "B"), ("B", "A"), ("B", "C"))))
      'the graph has a cycle'
      >>> check_graph(Graph(("A",), (("A", "Z"), ("A", "C")))) is None
      False
    """
    if not isinstance(graph, Graph):
        raise TypeError(f"graph: expected Graph, got {type(graph).__name__}")
    if not graph.nodes:
        return "the graph has no nodes"
    known = set(graph.nodes)
    if graph.sink in known:
        return f"the sink {graph.sink!r} is declared as a node"
    if len(known) != len(graph.nodes):
        return "a node is declared twice"
    if allowed_nodes is not None:
        allowed = set(allowed_nodes)
        unknown = [n for n in graph.nodes if n not in allowed]
        if unknown:
            return f"nodes {unknown!r} are not in the evidence"
    for a, b in graph.edges:
        if a == graph.sink:
            return f"edge {a} -> {b} leaves the sink"
        if a not in known or (b not in known and b != graph.sink):
            return f"dangling edge {a} -> {b}"
    if _topological_order(graph) is None:
        return "the graph has a cycle"
    reach = _reaches_sink(graph)
    stuck = [n for n in graph.nodes if not reach[n]]
    if stuck:
        return f"nodes {stuck!r} do not reach the sink {graph.sink!r}"
    return None


def _topological_order(graph: Graph) -> list[str] | None:
    """Kahn's algorithm over nodes + sink; None if there is a cycle."""
    vertices = list(graph.nodes) + [graph.sink]
    indeg = {v: 0 for v in vertices}
    out: dict[str, list[str]] = {v: [] for v in vertices}
    for a, b in graph.edges:
        out[a].append(b)
        indeg[b] += 1
    ready = [v for v in vertices if indeg[v] == 0]
    order = []
    while ready:
        v = ready.pop()
        order.append(v)
        for w in out[v]:
            indeg[w] -= 1
            if indeg[w] == 0:
                ready.append(w)
    return order if len(order) == len(vertices) else None


def _reaches_sink(graph: Graph) -> dict[str, bool]:
    back: dict[str, list[str]] = {}
    for a, b in graph.edges:
        back.setdefault(b, []).append(a)
    seen, stack = {graph.sink}, [graph.sink]
    while stack:
        for a in back.get(stack.pop(), []):
            if a not in seen:
                seen.add(a)
                stack.append(a)
    return {n: n in seen for n in graph.nodes}


def graph_depth(graph: Graph) -> int:
    """Longest path, in edges, from any node to the sink (0 if no node reaches it).

    Raises:
      ValueError: if the graph has a cycle or a dangling edge (run `check_graph` first).

    Examples:
      >>> graph_depth(parse_compact("F1 F2 F3 | S").graph)
      3
      >>> graph_depth(Graph(("A", "B", "D"), (("A", "B"), ("A", "D"), ("B", "C"), ("D", "C"))))  # diamond
      2
    """
    known = set(graph.nodes) | {graph.sink}
    if any(a not in known or b not in known for a, b in graph.edges):
        raise ValueError(f"graph: dangling edge in {graph.edges!r}")
    order = _topological_order(graph)
    if order is None:
        raise ValueError("graph: expected a DAG, got a cycle")
    out: dict[str, list[str]] = {}
    for a, b in graph.edges:
        out.setdefault(a, []).append(b)
    longest: dict[str, float] = {graph.sink: 0}
    for v in reversed(order):  # successors first
        if v != graph.sink:
            longest[v] = max((longest[w] + 1 for w in out.get(v, [])), default=-math.inf)
    return int(max([longest[n] for n in graph.nodes if longest[n] > -math.inf], default=0))


def depth_score(depth, target, *, s: float = 1.0):
    """g(d) = exp(-(d - d*)^2 / (2 s^2)): 1 at d = d*, symmetric, decreasing in |d - d*|.

    Args:
      depth: d, scalar or array.
      target: d*, scalar or array (broadcast with `depth`).
      s: width (> 0).

    Returns:
      float or float64 array in (0, 1].

    Examples:
      >>> float(depth_score(3, 3)), round(float(depth_score(2, 3)), 4)
      (1.0, 0.6065)
    """
    if not s > 0:
        raise ValueError(f"s: expected > 0, got {s!r}")
    d = np.asarray(depth, np.float64) - np.asarray(target, np.float64)
    out = np.exp(-(d ** 2) / (2.0 * s * s))
    return float(out) if out.ndim == 0 else out


def conciseness_penalty(num_nodes, target, *, lambda_len: float = 0.1, slack: int = 2):
    """lambda_len * max(0, |V| - (d* + slack)): the cost of nodes beyond the hop count plus slack."""
    if lambda_len < 0:
        raise ValueError(f"lambda_len: expected >= 0, got {lambda_len!r}")
    out = lambda_len * np.maximum(0.0, np.asarray(num_nodes, np.float64) - (np.asarray(target, np.float64) + slack))
    return float(out) if out.ndim == 0 else out


@dataclasses.dataclass(frozen=True, kw_only=True)
class RewardConfig:
    """Weights of the rule-based reward (see the module docstring).

    Attributes:
      w_acc: weight of the label term.
      w_struct: weight of the depth term g(d) (gated on a correct label).
      s: width of g.
      lambda_len: conciseness penalty per node beyond d* + slack.
      slack: nodes allowed beyond d* before the penalty.
      format_reward: the reward of an output that fails to parse or check (and the floor of all others).
    """

    w_acc: float = 1.0
    w_struct: float = 0.5
    s: float = 1.0
    lambda_len: float = 0.1
    slack: int = 2
    format_reward: float = -1.0

    def __post_init__(self):
        for name in ("w_acc", "w_struct", "lambda_len"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ValueError(f"{name}: expected a finite float >= 0, got {v!r}")
        if not (isinstance(self.s, (int, float)) and self.s > 0):
            raise ValueError(f"s: expected a float > 0, got {self.s!r}")
        if isinstance(self.slack, bool) or not isinstance(self.slack, int) or self.slack < 0:
            raise ValueError(f"slack: expected an int >= 0, got {self.slack!r}")
        if not (isinstance(self.format_reward, (int, float)) and math.isfinite(self.format_reward)
                and self.format_reward <= 0):
            raise ValueError(f"format_reward: expected a finite float <= 0, got {self.format_reward!r}")

    @property
    def max_reward(self) -> float:
        return self.w_acc + self.w_struct


def label_only_config(config: RewardConfig | None = None) -> RewardConfig:
    """The baseline arm: same format gate and label weight, no structural term, no length penalty."""
    config = RewardConfig() if config is None else config
    return dataclasses.replace(config, w_struct=0.0, lambda_len=0.0)


class RewardTerms(NamedTuple):
    """The reward and its parts for one output (for logging and tests).

    Attributes:
      reward: the total.
      format_ok: parsed and passed `check_graph`.
      correct: verdict == gold (False when the format fails).
      depth: longest path to the sink (-1 when the format fails).
      num_nodes: |V| (-1 when the format fails).
      structure: w_struct * correct * g(d).
      penalty: the conciseness penalty subtracted.
      error: the parse/check error, or None.
    """

    reward: float
    format_ok: bool
    correct: bool
    depth: int
    num_nodes: int
    structure: float
    penalty: float
    error: str | None


def reward_terms(parsed: Parsed, *, gold: str, hops: int, config: RewardConfig = RewardConfig(),
                 allowed_nodes: Iterable[str] | None = None) -> RewardTerms:
    """Scores one parsed output (the pluggable rule-based reward).

    Args:
      parsed: from `parse_graph_text` / `parse_compact`.
      gold: the gold label.
      hops: d*, the claim's hop count (>= 1).
      config: the weights.
      allowed_nodes: node ids the graph may use (None = any).

    Returns:
      `RewardTerms`; `reward` lies in [config.format_reward, config.w_acc + config.w_struct].
    """
    if not isinstance(parsed, Parsed):
        raise TypeError(f"parsed: expected Parsed, got {type(parsed).__name__}")
    if isinstance(hops, bool) or not isinstance(hops, (int, np.integer)) or hops < 1:
        raise ValueError(f"hops: expected an int >= 1, got {hops!r}")
    error = parsed.error if not parsed.ok else check_graph(parsed.graph, allowed_nodes=allowed_nodes)
    if error is not None:
        return RewardTerms(float(config.format_reward), False, False, -1, -1, 0.0, 0.0, error)
    correct = parsed.answer == gold
    depth = graph_depth(parsed.graph)
    num_nodes = len(parsed.graph.nodes)
    structure = config.w_struct * float(correct) * depth_score(depth, hops, s=config.s)
    penalty = conciseness_penalty(num_nodes, hops, lambda_len=config.lambda_len, slack=config.slack)
    total = max(config.w_acc * float(correct) + structure - penalty, config.format_reward)
    return RewardTerms(float(total), True, bool(correct), int(depth), int(num_nodes), float(structure),
                       float(penalty), None)


def scm_reward(parsed: Parsed, *, gold: str, hops: int, config: RewardConfig = RewardConfig(),
               allowed_nodes: Iterable[str] | None = None) -> float:
    """The scalar reward of `reward_terms`.

    Examples:
      >>> round(scm_reward(parse_compact("F1 F2 | S"), gold="SUPPORTS", hops=2), 3)  # correct, d = d*
      1.5
      >>> round(scm_reward(parse_compact("F1 | S"), gold="SUPPORTS", hops=2), 3)     # one hop short
      1.303
      >>> scm_reward(parse_compact("F1 F2 | R"), gold="SUPPORTS", hops=2)            # wrong: no structure
      0.0
      >>> scm_reward(parse_compact("F1 F1 | S"), gold="SUPPORTS", hops=2)            # cycle: format gate
      -1.0
    """
    return reward_terms(parsed, gold=gold, hops=hops, config=config, allowed_nodes=allowed_nodes).reward


def make_reward_fn(tokenizer, *, config: RewardConfig = RewardConfig(),
                   parse: Callable[[str], Parsed] = parse_compact) -> grpo.RewardFn:
    """The batched reward for `grpo.train`.

    Args:
      tokenizer: has `decode(ids) -> str` (stops at EOS).
      config: the reward weights (`label_only_config()` for the baseline arm).
      parse: text -> `Parsed` (`parse_compact` or `parse_graph_text`).

    Returns:
      `reward_fn(problems, completions [b, N], lengths [b]) -> [b] float32`;
      each problem exposes `label`, `hops` and optionally `node_ids` (allowed node ids).
    """
    if not isinstance(config, RewardConfig):
        raise TypeError(f"config: expected RewardConfig, got {type(config).__name__}")

    def score(problem: Any, text: str) -> float:
        return scm_reward(parse(text), gold=problem.label, hops=problem.hops, config=config,
                          allowed_nodes=getattr(problem, "node_ids", None))

    return grpo.text_reward(tokenizer, score)


def macro_f1(gold: Sequence[str], predicted: Sequence[str | None], *, labels: Sequence[str] = LABELS) -> float:
    """Macro-averaged F1 over `labels`; a prediction outside `labels` (e.g. None for a
    format failure) is wrong for every class (a false negative of its gold class).

    Examples:
      >>> macro_f1(["SUPPORTS", "REFUTES", "REFUTES"], ["SUPPORTS", "SUPPORTS", None])
      0.3333333333333333
    """
    if len(gold) != len(predicted):
        raise ValueError(f"predicted: expected {len(gold)} predictions (one per gold label), got {len(predicted)}")
    f1s = []
    for c in labels:
        tp = sum(g == c and p == c for g, p in zip(gold, predicted))
        fp = sum(g != c and p == c for g, p in zip(gold, predicted))
        fn = sum(g == c and p != c for g, p in zip(gold, predicted))
        f1s.append(2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 0.0)
    return float(np.mean(f1s))
