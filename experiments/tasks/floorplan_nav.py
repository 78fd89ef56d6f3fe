"""Goal-object navigation on floorplans with a partial label map, optionally guided by map completion.

Spec: papers/specs/vision_weights_envs.md section 3 (b) "Use in navigation" (the official ``PLMD-ON``
agent: the completed semantic labels fill the unexplored cells; if the target category is present, its
largest connected component becomes the goal and the planner drives to it; otherwise the base policy
explores) and (d) "toy navigation: grid agent, frontier exploration + A*; with completion, go to the
predicted target if present; SR and SPL under a step budget". Everything below is a grid version of
that design ([INFER] the details):

  * World: a `experiments.tasks.floorplans` label map (FREE, WALL, 2 + category). Walls block; objects
    are walkable. The agent moves one 4-neighbour cell per step.
  * Observation: after every move the ray-cast visibility polygon (`floorplans.visibility`, radius
    ``radius``) of the agent's cell is added to its known mask; its belief map holds the true labels on
    known cells. The 4 neighbours are always visible, so the agent never steps into a wall; `run_episodes`
    checks this and raises if it ever happens.
  * Policy, every step (one of these targets, then one step along an A* path to it):
      1. a goal-class cell is known: go to the cells within ``success_dist`` (Chebyshev) of them;
      2. else, when guided, cells of the current prediction still unknown remain: go to the cells
         within ``success_dist`` of them. Predicted cells that become known are dropped (a
         contradiction when they are not goal-class; "replan on contradiction"); an unreachable
         prediction is dropped entirely.
      For 1 and 2 the plan avoids known walls and, for a guided agent, the walls of its last completion
      on still-unknown cells (the code plans on the completed obstacle map); when that leaves no path
      it plans on the optimistic map (unknown cells passable). The plan is redone every step.
      3. else frontier exploration: the nearest (A*) known non-wall cell with an unknown 4-neighbour,
         planning on known non-wall cells only.
  * Consultation: every ``consult_every`` steps (steps 0, K, 2K, ...) a guided agent completes its belief
    map (``complete_fn``, batched over all episodes) and takes as prediction the largest 4-connected
    component of predicted goal-class cells among its unknown cells (the code's ``find_big_connect``).
  * Episode: success when the agent is within ``success_dist`` (Chebyshev) of a true goal-class cell
    within ``max_steps`` moves ([INFER]: success is detected automatically, no STOP action). SPL
    (Anderson et al. 2018) = success * l / max(p, l) with p the agent's path length (moves) and l the
    shortest path length from the start to a success cell, by BFS on the true map.

Dimension legend: ``N`` episodes, ``n`` grid side.

References:
  Anderson et al., "On Evaluation of Embodied Navigation Agents", arXiv:1807.06757, 2018 (SPL).
  Hart, Nilsson, Raphael, "A Formal Basis for the Heuristic Determination of Minimum Cost Paths", 1968 (A*).
  Yamauchi, "A frontier-based approach for autonomous exploration", CIRA 1997.

Example:
    >>> lab = np.zeros((5, 5), np.int64); lab[2, 1:4] = 1
    >>> len(astar(lab != 1, (1, 2), [(3, 2)])) - 1      # around the wall
    6
"""

from __future__ import annotations

import heapq
from typing import Callable

import numpy as np
import tqdm

from experiments.tasks import floorplans as fp

__all__ = ["astar", "success_region", "shortest_path_length", "spl", "largest_component", "choose_goals",
           "run_episodes", "AGENTS"]

AGENTS = ("frontier", "guided")
_MOVES = ((1, 0), (-1, 0), (0, 1), (0, -1))


def astar(passable: np.ndarray, start: tuple[int, int], goals) -> list[tuple[int, int]] | None:
    """A shortest 4-neighbour path (unit costs) from ``start`` to the nearest of ``goals``.

    Args:
      passable: ``[n0, n1]`` bool, the cells the path may use (``start`` may be impassable: it is left).
      start: ``(row, col)``.
      goals: iterable of ``(row, col)`` or a ``[n0, n1]`` bool mask; impassable goals are unreachable.

    Returns:
      The path ``[start, ..., goal]`` (length - 1 moves), or None when no goal is reachable. The
      heuristic is the Manhattan distance to the nearest goal (admissible and consistent), so the
      path is a shortest one.
    """
    passable = np.asarray(passable, bool)
    if passable.ndim != 2:
        raise ValueError(f"passable must be a 2-D bool grid, got shape {passable.shape}")
    n0, n1 = passable.shape
    start = (int(start[0]), int(start[1]))
    if not (0 <= start[0] < n0 and 0 <= start[1] < n1):
        raise ValueError(f"start must lie inside the {passable.shape} grid, got {start}")
    gmask = np.asarray(goals, bool) if isinstance(goals, np.ndarray) and goals.dtype == bool else None
    if gmask is None:
        gmask = np.zeros_like(passable)
        for g in goals:
            r, c = int(g[0]), int(g[1])
            if not (0 <= r < n0 and 0 <= c < n1):
                raise ValueError(f"goals must lie inside the {passable.shape} grid, got {(r, c)}")
            gmask[r, c] = True
    elif gmask.shape != passable.shape:
        raise ValueError(f"a goal mask must have passable's shape {passable.shape}, got {gmask.shape}")
    gmask = gmask & passable
    if gmask[start]:
        return [start]
    gr, gc = np.nonzero(gmask)
    if len(gr) == 0:
        return None
    rr, cc = np.mgrid[:n0, :n1]
    h = np.full((n0, n1), np.inf)
    for i in range(0, len(gr), 256):          # Manhattan distance to the nearest goal, in chunks
        h = np.minimum(h, (np.abs(rr[..., None] - gr[i:i + 256]) + np.abs(cc[..., None] - gc[i:i + 256])).min(-1))
    h = h.astype(np.int64)
    g = np.full((n0, n1), -1, np.int64)
    parent = {}
    g[start] = 0
    heap = [(int(h[start]), 0, start)]
    closed = np.zeros((n0, n1), bool)
    while heap:
        _, gs, cur = heapq.heappop(heap)
        if closed[cur]:
            continue
        closed[cur] = True
        if gmask[cur]:
            path = [cur]
            while path[-1] != start:
                path.append(parent[path[-1]])
            return path[::-1]
        r, c = cur
        for dr, dc in _MOVES:
            a, b = r + dr, c + dc
            if 0 <= a < n0 and 0 <= b < n1 and passable[a, b] and not closed[a, b]:
                ng = gs + 1
                if g[a, b] < 0 or ng < g[a, b]:
                    g[a, b] = ng
                    parent[(a, b)] = cur
                    heapq.heappush(heap, (ng + int(h[a, b]), ng, (a, b)))
    return None


def _dilate_chebyshev(mask: np.ndarray, d: int) -> np.ndarray:
    out = mask.copy()
    n0, n1 = mask.shape
    for dr in range(-d, d + 1):
        for dc in range(-d, d + 1):
            src = mask[max(-dr, 0):n0 - max(dr, 0), max(-dc, 0):n1 - max(dc, 0)]
            out[max(dr, 0):n0 - max(-dr, 0), max(dc, 0):n1 - max(-dc, 0)] |= src
    return out


def success_region(labels: np.ndarray, goal_label: int, success_dist: int) -> np.ndarray:
    """Bool ``[n, n]``: the non-wall cells within Chebyshev distance ``success_dist`` of a ``goal_label`` cell."""
    labels = np.asarray(labels)
    if labels.ndim != 2:
        raise ValueError(f"labels must be a 2-D label map, got shape {labels.shape}")
    if not isinstance(success_dist, (int, np.integer)) or success_dist < 0:
        raise ValueError(f"success_dist must be an int >= 0, got {success_dist!r}")
    return _dilate_chebyshev(labels == goal_label, int(success_dist)) & (labels != fp.WALL)


def shortest_path_length(labels: np.ndarray, start: tuple[int, int], goal_label: int, success_dist: int) -> int:
    """BFS length (moves) on the true map from ``start`` to the success region; -1 if unreachable."""
    region = success_region(labels, goal_label, success_dist)
    dist = fp.bfs_distances(np.asarray(labels) != fp.WALL, (int(start[0]), int(start[1])))
    ok = region & (dist >= 0)
    return int(dist[ok].min()) if ok.any() else -1


def spl(success, path_len, shortest) -> np.ndarray:
    """Per-episode SPL ``S * l / max(p, l)`` (1 for a success with ``l = p = 0``)."""
    s, p, l = (np.asarray(v, np.float64) for v in (success, path_len, shortest))
    if not (s.shape == p.shape == l.shape):
        raise ValueError(f"success, path_len, shortest must share one shape, got {s.shape}, {p.shape}, {l.shape}")
    if (p < 0).any() or (l < 0).any():
        raise ValueError("path_len and shortest must be >= 0 (drop episodes with an unreachable goal)")
    denom = np.maximum(p, l)
    return np.where(denom > 0, s * l / np.where(denom > 0, denom, 1.0), s)


def largest_component(mask: np.ndarray) -> np.ndarray:
    """The largest 4-connected component of a bool mask (ties: the first in row-major order)."""
    mask = np.asarray(mask, bool)
    best = np.zeros_like(mask)
    seen = np.zeros_like(mask)
    for r, c in zip(*np.nonzero(mask)):
        if seen[r, c]:
            continue
        comp = fp.bfs_distances(mask, (int(r), int(c))) >= 0
        seen |= comp
        if comp.sum() > best.sum():
            best = comp
    return best


def choose_goals(labels: np.ndarray, known: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Per map, a goal category present in the map but on no known cell (``valid``); when every present
    category is already known, a present one (``valid`` False: such episodes are trivial).

    Returns:
      ``(goal_label [N], valid [N] bool)``.
    """
    labels, known = np.asarray(labels), np.asarray(known, bool)
    if labels.ndim != 3 or known.shape != labels.shape:
        raise ValueError(f"labels and known must both be [N, n, n], got {labels.shape}, {known.shape}")
    rng = np.random.default_rng(seed)
    goal = np.zeros(len(labels), np.int64)
    valid = np.zeros(len(labels), bool)
    for i in range(len(labels)):
        present = sorted(set(np.unique(labels[i]).tolist()) - {fp.FREE, fp.WALL})
        if not present:
            raise ValueError(f"map {i} holds no object")
        unseen = [g for g in present if not (known[i] & (labels[i] == g)).any()]
        pool = unseen or present
        goal[i] = pool[rng.integers(len(pool))]
        valid[i] = bool(unseen)
    return goal, valid


def run_episodes(labels: np.ndarray, known: np.ndarray, start: np.ndarray, goal: np.ndarray, *, max_steps: int,
                 radius: int, success_dist: int = 1, complete_fn: Callable | None = None, consult_every: int = 10,
                 progress: bool = False, desc: str = "navigate") -> dict[str, np.ndarray]:
    """Runs ``N`` navigation episodes in lockstep (see the module docstring).

    Args:
      labels: ``[N, n, n]`` true label maps.
      known: ``[N, n, n]`` bool, the initially known cells (must include each start's visibility).
      start: ``[N, 2]`` start cells (non-wall).
      goal: ``[N]`` goal labels (2 + category).
      max_steps: move budget.
      radius: ray-casting radius of the observations.
      success_dist: Chebyshev distance to a goal cell that counts as reached.
      complete_fn: ``complete_fn(belief [N, n, n] int, known [N, n, n] bool) -> [N, n, n]`` completed labels
        (equal to ``belief`` on known cells); None = the unguided frontier agent.
      consult_every: K, steps between consultations of ``complete_fn``.
      progress: tqdm bar over the steps.

    Returns:
      ``{"success": [N] bool, "path_len": [N] moves, "shortest": [N] BFS length (-1 unreachable),
      "spl": [N], "consults": number of ``complete_fn`` calls, "guided_steps": [N] moves made toward a
      prediction, "final_known": [N, n, n]}``.
    """
    labels = np.asarray(labels)
    known = np.array(known, bool)
    start = np.asarray(start, np.int64)
    goal = np.asarray(goal, np.int64)
    if labels.ndim != 3 or labels.shape[1] != labels.shape[2]:
        raise ValueError(f"labels must be [N, n, n], got shape {labels.shape}")
    N = len(labels)
    if known.shape != labels.shape:
        raise ValueError(f"known must have labels' shape {labels.shape}, got {known.shape}")
    if start.shape != (N, 2):
        raise ValueError(f"start must be [{N}, 2], got shape {start.shape}")
    if goal.shape != (N,) or (goal < 2).any() or (goal >= fp.NUM_LABELS).any():
        raise ValueError(f"goal must be [{N}] object labels in [2, {fp.NUM_LABELS}), got {goal}")
    for name, v, lo in (("max_steps", max_steps, 0), ("radius", radius, 1), ("consult_every", consult_every, 1),
                        ("success_dist", success_dist, 0)):
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < lo:
            raise ValueError(f"{name} must be an int >= {lo}, got {v!r}")
    if (labels[np.arange(N), start[:, 0], start[:, 1]] == fp.WALL).any():
        raise ValueError("start must be non-wall cells")
    region = np.stack([success_region(labels[i], goal[i], success_dist) for i in range(N)])
    shortest = np.array([shortest_path_length(labels[i], start[i], goal[i], success_dist) for i in range(N)])
    pos = [tuple(int(v) for v in s) for s in start]
    for i in range(N):
        known[i] |= fp.visibility(labels[i], pos[i], radius=radius)
    success = np.array([bool(region[i][pos[i]]) for i in range(N)])
    path_len = np.zeros(N, np.int64)
    guided_steps = np.zeros(N, np.int64)
    pred = np.zeros(labels.shape, bool)
    pred_wall = np.zeros(labels.shape, bool)
    consults = 0
    for step in tqdm.trange(max_steps, desc=desc, disable=not progress):
        active = ~success
        if not active.any():
            break
        goal_known = np.array([(known[i] & (labels[i] == goal[i])).any() for i in range(N)])
        if complete_fn is not None and step % consult_every == 0 and (active & ~goal_known).any():
            belief = np.where(known, labels, fp.FREE)
            completed = np.asarray(complete_fn(belief, known))
            if completed.shape != labels.shape:
                raise ValueError(f"complete_fn must return {labels.shape}, got {completed.shape}")
            consults += 1
            for i in range(N):
                pred[i] = largest_component((completed[i] == goal[i]) & ~known[i])
            pred_wall = (completed == fp.WALL) & ~known
        for i in np.nonzero(active)[0]:
            lab_i, kn_i = labels[i], known[i]
            pred[i] &= ~kn_i                                 # predictions that became known are dropped
            wall_known = kn_i & (lab_i == fp.WALL)
            blocked = wall_known | (pred_wall[i] & ~kn_i)
            path, guided = None, False
            if goal_known[i]:
                target = _dilate_chebyshev(kn_i & (lab_i == goal[i]), success_dist)
                path = astar(~blocked, pos[i], target) or astar(~wall_known, pos[i], target)
            if path is None and pred[i].any():
                target = _dilate_chebyshev(pred[i], success_dist)
                path = astar(~blocked, pos[i], target) or astar(~wall_known, pos[i], target)
                if path is None:
                    pred[i][:] = False                       # unreachable prediction: drop it
                else:
                    guided = True
            if path is None:
                frontier = _frontier(kn_i, wall_known)
                path = astar(kn_i & ~wall_known, pos[i], frontier) if frontier.any() else None
            if path is None or len(path) < 2:
                continue                                     # nothing left to explore: wait
            nxt = path[1]
            if lab_i[nxt] == fp.WALL:
                raise AssertionError(f"episode {i}: the agent tried to walk into the wall at {nxt}")
            pos[i] = nxt
            path_len[i] += 1
            guided_steps[i] += guided
            known[i] |= fp.visibility(lab_i, nxt, radius=radius)
            success[i] = bool(region[i][nxt])
    ok = shortest >= 0
    spl_v = np.zeros(N)
    spl_v[ok] = spl(success[ok], path_len[ok], shortest[ok])
    return {"success": success, "path_len": path_len, "shortest": shortest, "spl": spl_v, "consults": consults,
            "guided_steps": guided_steps, "final_known": known}


def _frontier(known: np.ndarray, wall_known: np.ndarray) -> np.ndarray:
    """Known non-wall cells with an unknown 4-neighbour."""
    unk = np.pad(~known, 1, constant_values=False)
    nb = unk[:-2, 1:-1] | unk[2:, 1:-1] | unk[1:-1, :-2] | unk[1:-1, 2:]
    return known & ~wall_known & nb
