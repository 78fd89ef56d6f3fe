"""SCM-GRPO: parsers, graph checks, depth, the rule-based reward and its GRPO advantages.

References are hand-made graphs and a brute-force longest path (enumerating
every simple path), not the module's own dynamic program."""

from __future__ import annotations

import itertools

import jax.numpy as jnp
import numpy as np
import pytest

from algorithms.rl import scm_grpo as scm
from experiments.tasks.multihop import MultiHopTask
from primitives import policy_losses

TEXT_OK = """<graph>
N1: e3 born_in e7
N2: e7 capital_of e2
N3: e3's birthplace is the capital of e2
E: N1 -> N3 ; N2 -> N3 ; N3 -> C
</graph>
<answer>SUPPORTS</answer>"""


def _text(edges: str, answer: str = "<answer>REFUTES</answer>", nodes=("N1", "N2", "N3")) -> str:
    body = "\n".join(f"{n}: fact {n}" for n in nodes)
    return f"<graph>\n{body}\nE: {edges}\n</graph>{answer}"


# --- parsing ------------------------------------------------------------------------------


def test_parse_text_well_formed():
    p = scm.parse_graph_text(TEXT_OK)
    assert p.ok and p.answer == "SUPPORTS"
    assert p.graph == scm.Graph(("N1", "N2", "N3"), (("N1", "N3"), ("N2", "N3"), ("N3", "C")), "C")
    assert scm.check_graph(p.graph) is None
    assert scm.graph_depth(p.graph) == 2


def test_parse_compact_well_formed():
    p = scm.parse_compact("e4 e1 e6 | R")
    assert p.ok and p.answer == "REFUTES"
    assert p.graph.nodes == ("e4", "e1", "e6")
    assert p.graph.edges == (("e4", "e1"), ("e1", "e6"), ("e6", "C"))
    assert scm.check_graph(p.graph, allowed_nodes=["e1", "e4", "e6", "e9"]) is None


@pytest.mark.parametrize("text, fragment", [
    (TEXT_OK.replace("<answer>SUPPORTS</answer>", ""), "answer"),                # missing answer
    (TEXT_OK.replace("SUPPORTS", "NOT_ENOUGH_INFO"), "answer"),                   # unknown label
    (TEXT_OK.replace("</graph>", ""), "graph"),                                   # unclosed block
    (TEXT_OK.replace("E: ", "X "), "line"),                                      # garbage line
    (TEXT_OK.replace("E: N1 -> N3 ; N2 -> N3 ; N3 -> C\n", ""), "E:"),           # no edges line
    (TEXT_OK.replace("N2: e7", "N1: e7"), "twice"),                              # duplicate node
    (TEXT_OK.replace("N1 -> N3", "N1 => N3"), "edge"),                          # bad arrow
])
def test_parse_text_failures_are_reported_not_raised(text, fragment):
    p = scm.parse_graph_text(text)
    assert not p.ok and p.graph is None and p.answer is None
    assert fragment in p.error
    assert scm.scm_reward(p, gold="SUPPORTS", hops=2) == -1.0


@pytest.mark.parametrize("text", ["e1 e2", "e1 e2 | ", "e1 | S | R", "e1 e2 | X", "e1 C | S", "e1 | S R", ""])
def test_parse_compact_failures(text):
    p = scm.parse_compact(text)
    assert not p.ok
    assert scm.scm_reward(p, gold="SUPPORTS", hops=2) == -1.0


@pytest.mark.parametrize("text, allowed, fragment", [
    (_text("N1 -> N2 ; N2 -> N1 ; N2 -> C ; N3 -> C"), None, "cycle"),
    (_text("N1 -> N1 ; N1 -> C ; N2 -> C ; N3 -> C"), None, "cycle"),        # self loop
    (_text("N1 -> N9 ; N1 -> C ; N2 -> C ; N3 -> C"), None, "dangling"),     # undeclared node
    (_text("N1 -> N2 ; N2 -> C"), None, "reach"),                              # N3 isolated
    (_text("N1 -> C ; C -> N2 ; N2 -> C ; N3 -> C"), None, "sink"),           # edge out of the sink
    (_text(""), None, "reach"),                                                # no edges at all
])
def test_structural_failures_gate_the_reward(text, allowed, fragment):
    p = scm.parse_graph_text(text)
    assert p.ok  # syntactically fine
    error = scm.check_graph(p.graph, allowed_nodes=allowed)
    assert error is not None and fragment in error
    terms = scm.reward_terms(p, gold="REFUTES", hops=2)  # the verdict is right, the graph is not
    assert terms.reward == -1.0 and not terms.format_ok and not terms.correct


def test_compact_cycles_and_unknown_nodes_fail_the_format():
    assert "cycle" in scm.check_graph(scm.parse_compact("e1 e2 e1 | S").graph)
    assert "cycle" in scm.check_graph(scm.parse_compact("e1 e1 | S").graph)
    assert "evidence" in scm.check_graph(scm.parse_compact("e1 e7 | S").graph, allowed_nodes=["e1", "e2"])
    p = scm.parse_compact("e1 e7 | S")
    assert scm.scm_reward(p, gold="SUPPORTS", hops=2, allowed_nodes=["e1", "e2"]) == -1.0
    assert scm.scm_reward(p, gold="SUPPORTS", hops=2) == 1.5  # no restriction: a valid 2-chain
    assert "no nodes" in scm.check_graph(scm.Graph((), (), "C"))


# --- depth -------------------------------------------------------------------------------------


def _brute_longest(graph: scm.Graph) -> int:
    """Longest simple path (edges) from any node to the sink, by enumerating every node sequence."""
    edges = set(graph.edges)
    best = 0
    for r in range(1, len(graph.nodes) + 1):
        for seq in itertools.permutations(graph.nodes, r):
            path = list(seq) + [graph.sink]
            if all((a, b) in edges for a, b in zip(path, path[1:])):
                best = max(best, len(path) - 1)
    return best


@pytest.mark.parametrize("k", [1, 2, 3, 4, 6])
def test_chain_of_k_has_depth_k(k):
    g = scm.parse_compact(" ".join(f"n{i}" for i in range(k)) + " | S").graph
    assert scm.graph_depth(g) == k == _brute_longest(g)


def test_diamond_has_depth_two():
    g = scm.Graph(("A", "B", "D"), (("A", "B"), ("A", "D"), ("B", "C"), ("D", "C")))
    assert scm.check_graph(g) is None
    assert scm.graph_depth(g) == 2


def test_depth_matches_brute_force_on_random_dags():
    rng = np.random.default_rng(0)
    for _ in range(40):
        n = int(rng.integers(1, 6))
        nodes = tuple(f"v{i}" for i in range(n))
        # Random DAG on a random topological order; the last node always points to the sink.
        order = rng.permutation(n)
        edges = [(nodes[order[i]], nodes[order[j]]) for i in range(n) for j in range(i + 1, n) if rng.random() < 0.4]
        edges += [(nodes[order[i]], "C") for i in range(n) if i == n - 1 or rng.random() < 0.3]
        g = scm.Graph(nodes, tuple(edges))
        if scm.check_graph(g) is None:
            assert scm.graph_depth(g) == _brute_longest(g)


def test_depth_rejects_cycles():
    with pytest.raises(ValueError, match="cycle"):
        scm.graph_depth(scm.parse_compact("a b a | S").graph)


# --- g(d), penalty, reward ---------------------------------------------------------------------


@pytest.mark.parametrize("target", [2, 3, 4])
@pytest.mark.parametrize("s", [0.5, 1.0, 2.0])
def test_depth_score_inverted_u(target, s):
    ds = np.arange(0, 10)
    g = scm.depth_score(ds, target, s=s)
    assert g[target] == 1.0 and g.argmax() == target
    for off in range(1, 4):
        assert scm.depth_score(target + off, target, s=s) == pytest.approx(scm.depth_score(target - off, target, s=s))
        assert scm.depth_score(target + off, target, s=s) < scm.depth_score(target + off - 1, target, s=s)
    assert np.allclose(g, np.exp(-((ds - target) ** 2) / (2 * s * s)))


def test_conciseness_penalty():
    assert scm.conciseness_penalty(4, 2, lambda_len=0.1) == 0.0
    assert scm.conciseness_penalty(7, 2, lambda_len=0.1) == pytest.approx(0.3)
    with pytest.raises(ValueError, match="lambda_len"):
        scm.conciseness_penalty(3, 2, lambda_len=-1.0)


def test_reward_values_by_hand():
    cfg = scm.RewardConfig()
    assert scm.scm_reward(scm.parse_compact("a b c | S"), gold="SUPPORTS", hops=3, config=cfg) == pytest.approx(1.5)
    assert scm.scm_reward(scm.parse_compact("a b | S"), gold="SUPPORTS", hops=3, config=cfg) == pytest.approx(
        1.0 + 0.5 * np.exp(-0.5))
    # 8 nodes for d* = 2: depth 8, penalty 0.1 * (8 - 4).
    assert scm.scm_reward(scm.parse_compact(" ".join("abcdefgh") + " | S"), gold="SUPPORTS", hops=2,
                          config=cfg) == pytest.approx(1.0 + 0.5 * np.exp(-18) - 0.4)
    label_only = scm.label_only_config(cfg)
    for text in ("a | S", "a b c d e f g | S", "a b | S"):
        assert scm.scm_reward(scm.parse_compact(text), gold="SUPPORTS", hops=2, config=label_only) == 1.0
        assert scm.scm_reward(scm.parse_compact(text.replace("S", "R")), gold="SUPPORTS", hops=2,
                              config=label_only) == 0.0


def _random_outputs(rng, n):
    out = []
    for _ in range(n):
        m = int(rng.integers(0, 12))
        nodes = [f"e{int(v)}" for v in rng.integers(0, 8, m)]
        tail = rng.choice(["| S", "| R", "", "| X", "| S R"], p=[0.4, 0.4, 0.08, 0.06, 0.06])
        out.append(" ".join(nodes + [str(tail)]))
    return out


@pytest.mark.parametrize("cfg", [scm.RewardConfig(), scm.RewardConfig(w_acc=2.0, w_struct=1.0, lambda_len=0.5),
                                 scm.label_only_config()])
def test_structure_gated_on_label_and_reward_bounded(cfg):
    rng = np.random.default_rng(1)
    for text in _random_outputs(rng, 400):
        gold = str(rng.choice(scm.LABELS))
        hops = int(rng.integers(2, 5))
        t = scm.reward_terms(scm.parse_compact(text), gold=gold, hops=hops, config=cfg)
        assert cfg.format_reward <= t.reward <= cfg.w_acc + cfg.w_struct + 1e-12
        if not t.correct:
            assert t.structure == 0.0  # the gating invariant
            assert t.reward <= 0.0
        if not t.format_ok:
            assert t.reward == cfg.format_reward
        else:  # the reward is exactly the formula, floored at the format value
            g = np.exp(-((t.depth - hops) ** 2) / (2 * cfg.s ** 2))
            expect = cfg.w_acc * t.correct + cfg.w_struct * t.correct * g - cfg.lambda_len * max(
                0, t.num_nodes - (hops + 2))
            assert t.reward == pytest.approx(max(expect, cfg.format_reward))


def test_grpo_advantages_of_the_rewards_sum_to_zero_and_ignore_shifts():
    rng = np.random.default_rng(2)
    texts = _random_outputs(rng, 6 * 8)
    rewards = np.array([scm.scm_reward(scm.parse_compact(t), gold="SUPPORTS", hops=3) for t in texts],
                       np.float32).reshape(6, 8)
    adv = np.asarray(policy_losses.group_advantages(jnp.asarray(rewards)))
    np.testing.assert_allclose(adv.sum(axis=1), 0.0, atol=1e-4)
    shifted = np.asarray(policy_losses.group_advantages(jnp.asarray(rewards + 3.7)))
    np.testing.assert_allclose(shifted, adv, atol=1e-4)


def test_reward_fn_plugs_into_grpo_shapes():
    task = MultiHopTask(num_entities=10, num_relations=4, num_facts=5, min_hops=2, max_hops=3)
    tok = task.tokenizer()
    problems = task.sample(3, seed=0)
    outs = [task.target(problems[0]), task.target(problems[1]) + "", "e0 e0 | S"]
    width = 8
    comps = np.zeros((3, width), np.int32)
    lengths = np.zeros(3, np.int32)
    for i, text in enumerate(outs):
        ids = tok.encode(text) + [tok.eos_id]
        comps[i, :len(ids)] = ids
        lengths[i] = len(ids)
    r = scm.make_reward_fn(tok)(problems, comps, lengths)
    assert r.shape == (3,) and r.dtype == np.float32
    assert r[0] == pytest.approx(1.5) and r[1] == pytest.approx(1.5) and r[2] == -1.0
    r0 = scm.make_reward_fn(tok, config=scm.label_only_config())(problems, comps, lengths)
    np.testing.assert_allclose(r0, [1.0, 1.0, -1.0])


def test_macro_f1_matches_sklearn():
    sklearn_metrics = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(3)
    gold = list(rng.choice(scm.LABELS, 60))
    pred = [str(x) if x != "none" else None for x in rng.choice(list(scm.LABELS) + ["none"], 60)]
    ours = scm.macro_f1(gold, pred)
    theirs = sklearn_metrics.f1_score(gold, ["INVALID" if p is None else p for p in pred], labels=list(scm.LABELS),
                                      average="macro")
    assert ours == pytest.approx(theirs)


@pytest.mark.parametrize("kwargs, name", [({"w_acc": -1.0}, "w_acc"), ({"s": 0.0}, "s"),
                                          ({"lambda_len": -0.1}, "lambda_len"), ({"format_reward": 0.5}, "format_reward"),
                                          ({"slack": -1}, "slack")])
def test_config_validation_names_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=name):
        scm.RewardConfig(**kwargs)


def test_argument_errors():
    with pytest.raises(ValueError, match="hops"):
        scm.reward_terms(scm.parse_compact("a | S"), gold="SUPPORTS", hops=0)
    with pytest.raises(ValueError, match="s"):
        scm.depth_score(2, 2, s=0.0)
    with pytest.raises(TypeError, match="text"):
        scm.parse_compact(None)
    with pytest.raises(ValueError, match="predicted"):
        scm.macro_f1(["SUPPORTS"], [])
