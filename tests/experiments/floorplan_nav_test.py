"""PLMD navigation agent: A* vs brute-force BFS, never through walls, SPL range and oracle, bad input."""

import numpy as np
import pytest

from experiments.tasks import floorplan_nav as nav
from experiments.tasks import floorplans as fp


def _bfs_len(passable, start, goals):
    """Brute-force reference: BFS over the whole grid, then the minimum over the goals."""
    n0, n1 = passable.shape
    dist = {start: 0} if passable[start] else {}
    frontier = [start] if passable[start] else []
    while frontier:
        nxt = []
        for r, c in frontier:
            for a, b in ((r + 1, c), (r - 1, c), (r, c + 1), (r, c - 1)):
                if 0 <= a < n0 and 0 <= b < n1 and passable[a, b] and (a, b) not in dist:
                    dist[(a, b)] = dist[(r, c)] + 1
                    nxt.append((a, b))
        frontier = nxt
    ds = [dist[g] for g in goals if g in dist]
    return min(ds) if ds else None


@pytest.mark.parametrize("seed", range(30))
def test_astar_lengths_equal_bfs(seed):
    rng = np.random.default_rng(seed)
    n0, n1 = rng.integers(3, 10, 2)
    passable = rng.random((n0, n1)) > rng.uniform(0.1, 0.45)
    start = (int(rng.integers(n0)), int(rng.integers(n1)))
    passable[start] = True
    goals = [(int(rng.integers(n0)), int(rng.integers(n1))) for _ in range(int(rng.integers(1, 4)))]
    path = nav.astar(passable, start, goals)
    ref = _bfs_len(passable, start, [g for g in goals if passable[g]])
    if ref is None:
        assert path is None
        return
    assert len(path) - 1 == ref
    assert path[0] == start and path[-1] in goals
    for (a, b), (c, d) in zip(path[:-1], path[1:]):        # unit 4-neighbour moves over passable cells
        assert abs(a - c) + abs(b - d) == 1 and passable[c, d]
    # The same with the goals given as a mask.
    mask = np.zeros_like(passable)
    for g in goals:
        mask[g] = True
    assert len(nav.astar(passable, start, mask)) - 1 == ref


def _floorplans(seed, num=6, n=16):
    d = fp.make_dataset(seed, num, n=n, num_rooms=(2, 3), radius=4, walk_steps=(0, 4))
    goal, valid = nav.choose_goals(d["labels"], d["known"], seed)
    return d, goal, valid


def test_agents_never_walk_through_walls_and_spl_in_range():
    d, goal, _ = _floorplans(1)
    trace = []

    def noisy_complete(belief, known):
        # A deliberately wrong completion (goal class on random unknown cells, walls included) so that
        # the guided agent chases false predictions and has to replan.
        rng = np.random.default_rng(len(trace))
        out = np.where(known, belief, rng.integers(0, fp.NUM_LABELS, belief.shape))
        trace.append(out)
        return out

    for fn in (None, noisy_complete):
        out = nav.run_episodes(d["labels"], d["known"], d["start"], goal, max_steps=40, radius=4,
                               complete_fn=fn, consult_every=5)
        assert ((0 <= out["spl"]) & (out["spl"] <= 1)).all()
        assert (out["spl"][~out["success"]] == 0).all()
        assert (out["path_len"][out["success"]] >= out["shortest"][out["success"]]).all()
        assert (out["path_len"] <= 40).all()
    assert trace and out["consults"] == len(trace)


def test_run_episodes_path_is_a_wall_free_walk(monkeypatch):
    """Replay: record the agent's cells through the observation calls, check every move is one
    4-neighbour step onto a non-wall cell."""
    d, goal, _ = _floorplans(2, num=3)
    cells = {i: [tuple(int(v) for v in d["start"][i])] for i in range(3)}
    orig = fp.visibility

    def spy(labels, pos, *, radius):
        i = next(j for j in range(3) if np.shares_memory(labels, d["labels"][j]))
        if tuple(pos) != cells[i][-1]:
            cells[i].append(tuple(pos))
        return orig(labels, pos, radius=radius)

    monkeypatch.setattr(fp, "visibility", spy)
    for fn in (None, lambda belief, known: np.where(known, belief, fp.WALL)):   # a wall-everywhere completion
        for i in range(3):
            cells[i] = cells[i][:1]
        out = nav.run_episodes(d["labels"], d["known"], d["start"], goal, max_steps=30, radius=4, complete_fn=fn)
        for i in range(3):
            path = cells[i]
            assert len(path) - 1 == out["path_len"][i]
            for (a, b), (c, e) in zip(path[:-1], path[1:]):
                assert abs(a - c) + abs(b - e) == 1
                assert d["labels"][i][c, e] != fp.WALL


def test_oracle_agent_on_known_map_has_spl_one():
    d, goal, _ = _floorplans(3)
    full = np.ones_like(d["known"])
    out = nav.run_episodes(d["labels"], full, d["start"], goal, max_steps=200, radius=4)
    assert out["success"].all()
    np.testing.assert_array_equal(out["path_len"], out["shortest"])
    np.testing.assert_allclose(out["spl"], 1.0)


def test_perfect_completion_guides_to_the_goal():
    """Guided by the true map (a perfect completion), every episode succeeds, valid ones (goal unseen at
    the start) move toward the prediction, and the frontier agent is never faster on average."""
    d, goal, valid = _floorplans(4, num=8)
    truth = d["labels"]
    kw = dict(max_steps=200, radius=4)
    guided = nav.run_episodes(truth, d["known"], d["start"], goal, complete_fn=lambda belief, known: truth,
                              consult_every=1000, **kw)
    frontier = nav.run_episodes(truth, d["known"], d["start"], goal, **kw)
    assert guided["success"].all() and guided["consults"] == 1
    assert (guided["guided_steps"][valid] > 0).all()
    assert guided["spl"].mean() >= frontier["spl"].mean()


def test_spl_and_helpers():
    np.testing.assert_allclose(nav.spl([1, 1, 0, 1], [10, 5, 3, 0], [5, 5, 2, 0]), [0.5, 1.0, 0.0, 1.0])
    lab = np.zeros((6, 6), np.int64)
    lab[0] = lab[-1] = lab[:, 0] = lab[:, -1] = fp.WALL
    lab[3, 3] = 2
    reg = nav.success_region(lab, 2, 1)
    assert reg.sum() == 9 and reg[2:5, 2:5].all()
    assert nav.shortest_path_length(lab, (1, 1), 2, 1) == 2
    assert nav.shortest_path_length(lab, (1, 1), 3, 1) == -1
    comp = nav.largest_component(np.array([[1, 0, 1, 1], [0, 0, 0, 1], [1, 0, 0, 0]], bool))
    np.testing.assert_array_equal(np.argwhere(comp), [[0, 2], [0, 3], [1, 3]])
    labels = np.stack([lab, lab])
    known = np.zeros_like(labels, bool)
    known[1, 3, 3] = True
    goal, valid = nav.choose_goals(labels, known, 0)
    np.testing.assert_array_equal(goal, [2, 2])
    np.testing.assert_array_equal(valid, [True, False])


def test_bad_input():
    d, goal, _ = _floorplans(5, num=2)
    kw = dict(max_steps=5, radius=4)
    with pytest.raises(ValueError, match="goal must"):
        nav.run_episodes(d["labels"], d["known"], d["start"], np.array([1, 2]), **kw)
    with pytest.raises(ValueError, match="known must"):
        nav.run_episodes(d["labels"], d["known"][:, :4], d["start"], goal, **kw)
    with pytest.raises(ValueError, match="start must be \\[2, 2\\]"):
        nav.run_episodes(d["labels"], d["known"], d["start"][:1], goal, **kw)
    with pytest.raises(ValueError, match="consult_every"):
        nav.run_episodes(d["labels"], d["known"], d["start"], goal, consult_every=0, **kw)
    with pytest.raises(ValueError, match="max_steps"):
        nav.run_episodes(d["labels"], d["known"], d["start"], goal, max_steps=-1, radius=4)
    wall_start = np.array([[0, 0], [0, 0]])
    with pytest.raises(ValueError, match="start must be non-wall"):
        nav.run_episodes(d["labels"], d["known"], wall_start, goal, **kw)
    with pytest.raises(ValueError, match="complete_fn must return"):
        nav.run_episodes(d["labels"], d["known"], d["start"], goal, complete_fn=lambda b, k: b[:, :3], **kw)
    with pytest.raises(ValueError, match="start must lie"):
        nav.astar(np.ones((3, 3), bool), (5, 0), [(0, 0)])
    with pytest.raises(ValueError, match="passable must"):
        nav.astar(np.ones(3, bool), (0, 0), [(0, 0)])
    with pytest.raises(ValueError, match="success_dist"):
        nav.success_region(d["labels"][0], 2, -1)
    with pytest.raises(ValueError, match="path_len and shortest"):
        nav.spl([1], [-1], [2])
