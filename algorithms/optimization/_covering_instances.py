"""Covering problem instances, their exact offline optima and instance generators.

The companion of `algorithms.optimization.online_covering` (import the public names from there). It holds
the *offline* side of the four online covering problems used by the learning-augmented framework:

  * the problem classes (`SetCoverProblem`, `FacilityLocationProblem`, `SteinerTreeProblem`,
    `ParkingPermitProblem`), each a covering problem over a finite set of purchasable *elements* (sets,
    facilities and connections, edges, permits) with nonnegative costs, so a solution is a boolean mask
    over elements and solutions only grow;
  * exact offline optima for small instances (`optimum`): HiGHS MILPs through `scipy.optimize.milp`
    (set cover, uncapacitated facility location), the Dreyfus-Wagner dynamic program (Steiner tree) and
    the dynamic program over the laminar family of aligned permits (parking permit);
  * offline solutions with a responsibility map (`offline`): the solver `OFF` of the black-box
    reductions, returning which elements serve which request (exact except for Steiner trees with more than
    `exact_offline_terminals` terminals, which use the Kou-Markowsky-Berman 2-approximation);
  * the instance generators of the experiment (`Scenario`, `set_cover_scenario`,
    `facility_location_scenario`, `steiner_scenario`, `parking_permit_scenario`, `diamond_graph`) and
    the request / prediction samplers (`sample_requests`, `perturb_prediction`).

Everything is numpy/scipy float64: these are combinatorial objects, not JAX arrays.

Dimension legend: m sets, n elements of the set-cover universe / points / vertices, k arrived requests,
E purchasable elements of a problem, K permit types, T parking horizon in days.

References:
  Afrouz Jabal Ameli, Laura Sanita, Moritz Venzin. Learning-Augmented Online Covering Problems.
  arXiv:2507.06032. Dreyfus and Wagner, The Steiner problem in graphs (Networks 1971); Kou, Markowsky
  and Berman, A fast algorithm for Steiner trees (Acta Informatica 1981); Meyerson, The parking permit
  problem (FOCS 2005).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np
from scipy import optimize, sparse
from scipy.sparse import csgraph

__all__ = [
    "OfflineSolution", "CoveringProblem", "SetCoverProblem", "FacilityLocationProblem", "SteinerTreeProblem",
    "ParkingPermitProblem", "Scenario", "set_cover_scenario", "facility_location_scenario", "steiner_scenario",
    "parking_permit_scenario", "diamond_graph", "sample_requests", "perturb_prediction",
]

_EMPTY = np.zeros(0, dtype=np.int64)


class OfflineSolution(NamedTuple):
    """An offline solution for a request set.

    Attributes:
      elements: (e,) int64 ids of the bought elements.
      cost: total cost of `elements`.
      responsible: request id -> (r,) int64 element ids of `elements` that alone cover that request.
    """

    elements: np.ndarray
    cost: float
    responsible: dict


def _check_requests(requests, *, name: str, size: int) -> np.ndarray:
    """1-D int64 array of distinct request ids in [0, size); ValueError naming `name` otherwise."""
    arr = np.asarray(requests)
    if arr.size == 0:
        return _EMPTY.copy()
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array of request ids, got shape {arr.shape}")
    if not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{name} must hold integer request ids, got dtype {arr.dtype}")
    arr = arr.astype(np.int64)
    if arr.min() < 0 or arr.max() >= size:
        raise ValueError(f"{name} must lie in [0, {size}), got range [{arr.min()}, {arr.max()}]")
    if np.unique(arr).size != arr.size:
        raise ValueError(f"{name} must not repeat a request, got {arr.size} ids of which "
                         f"{np.unique(arr).size} distinct")
    return arr


def _solve_milp(c, a_ub, b_ub, a_eq=None, b_eq=None) -> np.ndarray:
    """0/1 minimisation min c.x s.t. a_ub x <= b_ub, a_eq x = b_eq with HiGHS; returns the rounded x."""
    cons = [optimize.LinearConstraint(a_ub, -np.inf, b_ub)] if a_ub is not None else []
    if a_eq is not None:
        cons.append(optimize.LinearConstraint(a_eq, b_eq, b_eq))
    res = optimize.milp(c, integrality=np.ones_like(c), bounds=optimize.Bounds(0, 1), constraints=cons)
    if not res.success:
        raise RuntimeError(f"MILP failed: {res.message}")
    return np.round(res.x).astype(bool)


class CoveringProblem:
    """Common interface: E elements with costs; request r is covered by an element mask or not.

    Subclasses define `num_elements`, `num_requests` (request ids are 0..num_requests-1),
    `element_costs` (E,), `covered`, `optimum` and `offline`. `alpha` is the approximation factor of
    `offline` (1.0 when exact).
    """

    element_costs: np.ndarray
    num_requests: int
    name: str = "covering"

    @property
    def num_elements(self) -> int:
        return int(self.element_costs.shape[0])

    def check_requests(self, requests, *, name: str = "requests") -> np.ndarray:
        return _check_requests(requests, name=name, size=self.num_requests)

    def cost(self, owned: np.ndarray) -> float:
        """Total cost of the element mask `owned` (E,)."""
        return float(self.element_costs[np.asarray(owned, bool)].sum())

    def covered(self, owned: np.ndarray, request: int) -> bool:
        raise NotImplementedError

    def feasible(self, owned: np.ndarray, requests) -> bool:
        """Whether the mask `owned` covers every request in `requests`."""
        return all(self.covered(owned, int(r)) for r in self.check_requests(requests))

    def optimum(self, requests) -> float:
        raise NotImplementedError

    def offline(self, requests) -> OfflineSolution:
        raise NotImplementedError

    def alpha(self, requests) -> float:
        """Approximation factor of `offline(requests)` (1.0: exact)."""
        return 1.0


# --------------------------------------------------------------------------------------------- set cover
class SetCoverProblem(CoveringProblem):
    """Weighted set cover: elements to buy are the m sets; requests are universe elements.

    Args:
      membership: (m, n) bool, membership[s, e] = element e lies in set s.
      costs: (m,) positive set costs.
    """

    name = "set_cover"

    def __init__(self, membership, costs):
        membership = np.asarray(membership, dtype=bool)
        costs = np.asarray(costs, dtype=np.float64)
        if membership.ndim != 2:
            raise ValueError(f"membership must be (m, n), got shape {membership.shape}")
        if costs.shape != (membership.shape[0],):
            raise ValueError(f"costs must have shape ({membership.shape[0]},), got {costs.shape}")
        if not np.all(np.isfinite(costs)) or np.any(costs <= 0):
            raise ValueError(f"costs must be finite and > 0, got min {costs.min() if costs.size else None}")
        self.membership = membership
        self.element_costs = costs
        self.num_requests = membership.shape[1]
        self.sets_of = [np.flatnonzero(membership[:, e]) for e in range(self.num_requests)]

    def check_requests(self, requests, *, name: str = "requests") -> np.ndarray:
        arr = super().check_requests(requests, name=name)
        bad = [int(e) for e in arr if self.sets_of[e].size == 0]
        if bad:
            raise ValueError(f"{name} contains elements in no set (uncoverable): {bad[:5]}")
        return arr

    def covered(self, owned, request):
        return bool(np.asarray(owned, bool)[self.sets_of[request]].any())

    def _solve(self, req):
        if req.size == 0:
            return np.zeros(self.num_elements, bool)
        a = -self.membership[:, req].T.astype(np.float64)  # -sum_{S ni e} z_S <= -1
        return _solve_milp(self.element_costs, sparse.csr_array(a), -np.ones(req.size))

    def optimum(self, requests) -> float:
        return self.cost(self._solve(self.check_requests(requests)))

    def offline(self, requests) -> OfflineSolution:
        req = self.check_requests(requests)
        z = self._solve(req)
        resp = {}
        for e in req:
            cands = self.sets_of[e][z[self.sets_of[e]]]
            resp[int(e)] = np.array([cands[np.argmin(self.element_costs[cands])]], dtype=np.int64)
        return OfflineSolution(np.flatnonzero(z), self.cost(z), resp)


# ------------------------------------------------------------------------------------ facility location
class FacilityLocationProblem(CoveringProblem):
    """Uncapacitated facility location on n points: facilities may open at any point (uniform cost f).

    Elements: ids 0..n-1 open the facility at that point (cost f); id n + i * n + j connects client j to
    facility i (cost d(i, j)). A client j (request id = point index) is covered when some open facility i
    has its connection (i, j) bought.

    Args:
      points: (n, d) coordinates.
      opening_cost: f >= 0.
    """

    name = "facility_location"

    def __init__(self, points, opening_cost: float):
        points = np.asarray(points, dtype=np.float64)
        if points.ndim != 2 or points.shape[0] < 1:
            raise ValueError(f"points must be (n, d) with n >= 1, got shape {points.shape}")
        if not np.isfinite(opening_cost) or opening_cost < 0:
            raise ValueError(f"opening_cost must be finite and >= 0, got {opening_cost}")
        self.points = points
        self.opening_cost = float(opening_cost)
        n = points.shape[0]
        self.num_points = n
        self.num_requests = n
        self.dist = np.sqrt(((points[:, None, :] - points[None, :, :]) ** 2).sum(-1))
        self.element_costs = np.concatenate([np.full(n, self.opening_cost), self.dist.reshape(-1)])

    def edge(self, facility, client):
        """Element id of the connection of `client` to `facility` (works on arrays)."""
        return self.num_points + np.asarray(facility) * self.num_points + np.asarray(client)

    def covered(self, owned, request):
        owned = np.asarray(owned, bool)
        n = self.num_points
        return bool(np.any(owned[:n] & owned[self.edge(np.arange(n), request)]))

    def _solve(self, req):
        """Exact UFL MILP. Pairs with d(i, j) > f are dropped: opening at j itself is cheaper (exact)."""
        if req.size == 0:
            return _EMPTY, _EMPTY
        f = self.opening_cost
        d = self.dist[:, req]  # (n, k)
        fi, cj = np.nonzero(d <= f + 1e-12)  # candidate (facility, client-position) pairs; includes i = j
        sites = np.unique(fi)
        site_pos = np.searchsorted(sites, fi)
        ns, npair, k = sites.size, fi.size, req.size
        c = np.concatenate([np.full(ns, f), d[fi, cj]])
        # sum_i x_ij = 1 for each client; x_ij - y_i <= 0 for each pair.
        a_eq = sparse.csr_array((np.ones(npair), (cj, ns + np.arange(npair))), shape=(k, ns + npair))
        rows = np.concatenate([np.arange(npair), np.arange(npair)])
        cols = np.concatenate([ns + np.arange(npair), site_pos])
        vals = np.concatenate([np.ones(npair), -np.ones(npair)])
        a_ub = sparse.csr_array((vals, (rows, cols)), shape=(npair, ns + npair))
        x = _solve_milp(c, a_ub, np.zeros(npair), a_eq, np.ones(k))
        chosen = x[ns:]
        facility_of = np.empty(k, dtype=np.int64)
        facility_of[cj[chosen]] = fi[chosen]
        return sites[x[:ns]], facility_of

    def optimum(self, requests) -> float:
        req = self.check_requests(requests)
        opened, fac = self._solve(req)
        if req.size == 0:
            return 0.0
        return float(self.opening_cost * opened.size + self.dist[fac, req].sum())

    def offline(self, requests) -> OfflineSolution:
        req = self.check_requests(requests)
        opened, fac = self._solve(req)
        edges = self.edge(fac, req).astype(np.int64)
        resp = {int(j): np.array([fac[t], edges[t]], dtype=np.int64) for t, j in enumerate(req)}
        elements = np.unique(np.concatenate([opened.astype(np.int64), edges]))
        return OfflineSolution(elements, float(self.element_costs[elements].sum()), resp)


# ------------------------------------------------------------------------------------------ Steiner tree
class SteinerTreeProblem(CoveringProblem):
    """Rooted Steiner tree in an undirected graph: elements are edges; requests are vertices (terminals).

    A terminal is covered when the bought edges connect it to `root`.

    Args:
      num_vertices: n.
      edges: (E, 2) int vertex pairs (no self-loops, no parallel edges).
      weights: (E,) positive edge lengths.
      root: the root vertex (always connected).
      exact_offline_terminals: `offline` is exact (Dreyfus-Wagner) up to this many terminals, else KMB.
      max_exact_terminals: `optimum` refuses larger terminal sets (3^t work).
    """

    name = "steiner_tree"

    def __init__(self, num_vertices: int, edges, weights, root: int = 0, *, exact_offline_terminals: int = 10,
                 max_exact_terminals: int = 12):
        edges = np.asarray(edges, dtype=np.int64)
        weights = np.asarray(weights, dtype=np.float64)
        if edges.ndim != 2 or edges.shape[1] != 2:
            raise ValueError(f"edges must be (E, 2), got shape {edges.shape}")
        if weights.shape != (edges.shape[0],):
            raise ValueError(f"weights must have shape ({edges.shape[0]},), got {weights.shape}")
        if edges.size and (edges.min() < 0 or edges.max() >= num_vertices):
            raise ValueError(f"edges must index vertices in [0, {num_vertices}), got [{edges.min()}, {edges.max()}]")
        if np.any(edges[:, 0] == edges[:, 1]):
            raise ValueError("edges must not contain self-loops")
        if not np.all(np.isfinite(weights)) or np.any(weights <= 0):
            raise ValueError("weights must be finite and > 0")
        key = np.sort(edges, axis=1)
        if np.unique(key, axis=0).shape[0] != key.shape[0]:
            raise ValueError("edges must not contain parallel edges")
        if not 0 <= root < num_vertices:
            raise ValueError(f"root must lie in [0, {num_vertices}), got {root}")
        self.num_vertices = int(num_vertices)
        self.edges = edges
        self.element_costs = weights
        self.root = int(root)
        self.num_requests = self.num_vertices
        self.exact_offline_terminals = exact_offline_terminals
        self.max_exact_terminals = max_exact_terminals
        self.adjacency = [[] for _ in range(num_vertices)]
        for eid, (u, v) in enumerate(edges):
            self.adjacency[u].append((int(v), eid))
            self.adjacency[v].append((int(u), eid))
        self.edge_id = {(int(min(u, v)), int(max(u, v))): eid for eid, (u, v) in enumerate(edges)}
        graph = sparse.csr_array((weights, (edges[:, 0], edges[:, 1])), shape=(num_vertices, num_vertices))
        self.dist, self._pred = csgraph.shortest_path(graph, directed=False, return_predecessors=True)
        if not np.all(np.isfinite(self.dist[self.root])):
            raise ValueError("the graph must be connected")

    def component(self, owned) -> np.ndarray:
        """(n,) bool: vertices joined to the root by edges of the mask `owned` (E,)."""
        owned = np.asarray(owned, bool)
        seen = np.zeros(self.num_vertices, bool)
        seen[self.root] = True
        stack = [self.root]
        while stack:
            u = stack.pop()
            for v, eid in self.adjacency[u]:
                if owned[eid] and not seen[v]:
                    seen[v] = True
                    stack.append(v)
        return seen

    def covered(self, owned, request):
        return bool(self.component(owned)[request])

    def feasible(self, owned, requests) -> bool:
        return bool(np.all(self.component(owned)[self.check_requests(requests)]))

    def path_edges(self, u: int, v: int) -> list[int]:
        """Edge ids of a shortest u-v path."""
        out = []
        while v != u:
            p = int(self._pred[u, v])
            out.append(self.edge_id[(min(p, v), max(p, v))])
            v = p
        return out

    def _terminals(self, requests):
        req = self.check_requests(requests)
        return np.array([t for t in req if t != self.root], dtype=np.int64), req

    def _dreyfus_wagner(self, terms, *, reconstruct: bool):
        """Dreyfus-Wagner DP: dp[mask, v] = min cost of a tree spanning terms[mask] and v."""
        t, n, dist = terms.size, self.num_vertices, self.dist
        full = 1 << t
        dp = np.full((full, n), np.inf)
        via = np.zeros((full, n), dtype=np.int64)
        split = np.zeros((full, n), dtype=np.int64)
        for i in range(t):
            dp[1 << i] = dist[terms[i]]
            via[1 << i] = terms[i]
        ar = np.arange(n)
        for mask in range(1, full):
            if mask & (mask - 1) == 0:
                continue
            low = mask & -mask
            subs, s = [], (mask - 1) & mask
            while s:
                if s & low:
                    subs.append(s)
                s = (s - 1) & mask
            subs = np.array(subs, dtype=np.int64)
            cand = dp[subs] + dp[mask ^ subs]  # (n_sub, n)
            best = np.argmin(cand, axis=0)
            g = cand[best, ar]
            tot = g[:, None] + dist  # (u, v)
            u = np.argmin(tot, axis=0)
            dp[mask] = tot[u, ar]
            via[mask] = u
            split[mask] = subs[best]
        value = float(dp[full - 1, self.root])
        if not reconstruct:
            return value, None
        edges: set[int] = set()
        stack = [(full - 1, self.root)]
        while stack:
            mask, v = stack.pop()
            u = int(via[mask, v])
            edges.update(self.path_edges(u, v))
            if mask & (mask - 1):
                a = int(split[mask, u])
                stack += [(a, u), (mask ^ a, u)]
        return value, np.array(sorted(edges), dtype=np.int64)

    def _kmb(self, terms) -> np.ndarray:
        """Kou-Markowsky-Berman 2(1 - 1/t)-approximation; returns edge ids of a tree."""
        nodes = np.concatenate([[self.root], terms])
        closure = self.dist[np.ix_(nodes, nodes)]
        mst = csgraph.minimum_spanning_tree(closure).tocoo()
        sub = set()
        for a, b in zip(mst.row, mst.col):
            sub.update(self.path_edges(int(nodes[a]), int(nodes[b])))
        sub = np.array(sorted(sub), dtype=np.int64)
        e = self.edges[sub]
        g = sparse.csr_array((self.element_costs[sub], (e[:, 0], e[:, 1])), shape=(self.num_vertices,) * 2)
        tree = csgraph.minimum_spanning_tree(g + g.T).tocoo()
        keep = {self.edge_id[(min(int(a), int(b)), max(int(a), int(b)))] for a, b in zip(tree.row, tree.col)}
        # Prune non-terminal leaves.
        required = set(nodes.tolist())
        while True:
            deg: dict[int, list[int]] = {}
            for eid in keep:
                for x in self.edges[eid]:
                    deg.setdefault(int(x), []).append(eid)
            leaves = [x for x, es in deg.items() if len(es) == 1 and x not in required]
            if not leaves:
                break
            for x in leaves:
                keep.discard(deg[x][0])
        return np.array(sorted(keep), dtype=np.int64)

    def optimum(self, requests) -> float:
        terms, _ = self._terminals(requests)
        if terms.size == 0:
            return 0.0
        if terms.size > self.max_exact_terminals:
            raise ValueError(f"requests has {terms.size} terminals; the exact Dreyfus-Wagner optimum allows at "
                             f"most max_exact_terminals={self.max_exact_terminals}")
        return self._dreyfus_wagner(terms, reconstruct=False)[0]

    def alpha(self, requests) -> float:
        t = self._terminals(requests)[0].size
        return 1.0 if t <= self.exact_offline_terminals else 2.0 * (1.0 - 1.0 / (t + 1))

    def offline(self, requests) -> OfflineSolution:
        terms, req = self._terminals(requests)
        if terms.size == 0:
            return OfflineSolution(_EMPTY.copy(), 0.0, {int(r): _EMPTY.copy() for r in req})
        if terms.size <= self.exact_offline_terminals:
            elements = self._dreyfus_wagner(terms, reconstruct=True)[1]
        else:
            elements = self._kmb(terms)
        # Responsibility: the tree path from each terminal to the root inside the solution's edges.
        parent = {self.root: (-1, -1)}
        stack, inset = [self.root], np.zeros(self.num_elements, bool)
        inset[elements] = True
        while stack:
            u = stack.pop()
            for v, eid in self.adjacency[u]:
                if inset[eid] and v not in parent:
                    parent[v] = (u, eid)
                    stack.append(v)
        resp = {}
        for r in req:
            path, v = [], int(r)
            while v != self.root:
                v, eid = parent[v]
                path.append(eid)
            resp[int(r)] = np.array(path, dtype=np.int64)
        return OfflineSolution(elements, float(self.element_costs[elements].sum()), resp)


# --------------------------------------------------------------------------------------- parking permit
class ParkingPermitProblem(CoveringProblem):
    """Parking permit in Meyerson's interval model: K permit types, type j lasts D_j days and costs C_j;
    permits of type j start at multiples of D_j, each D_j divides D_{j+1} and D_{K-1} divides the horizon
    T. Requests are days 0..T-1; a day is covered by a bought permit containing it.

    Elements: permit (j, i) has id offsets[j] + i, i < T / D_j.

    Args:
      horizon: T.
      durations: (K,) strictly increasing, nested (each divides the next).
      costs: (K,) positive.
    """

    name = "parking_permit"

    def __init__(self, horizon: int, durations, costs):
        durations = np.asarray(durations, dtype=np.int64)
        costs = np.asarray(costs, dtype=np.float64)
        if durations.ndim != 1 or durations.size < 1:
            raise ValueError(f"durations must be a non-empty 1-D array, got shape {durations.shape}")
        if costs.shape != durations.shape:
            raise ValueError(f"costs must have shape {durations.shape}, got {costs.shape}")
        if np.any(durations < 1) or np.any(np.diff(durations) <= 0) or np.any(durations[1:] % durations[:-1]):
            raise ValueError(f"durations must be increasing and each divide the next, got {durations.tolist()}")
        if horizon < 1 or horizon % durations[-1]:
            raise ValueError(f"horizon must be a positive multiple of durations[-1]={durations[-1]}, got {horizon}")
        if not np.all(np.isfinite(costs)) or np.any(costs <= 0):
            raise ValueError(f"costs must be finite and > 0, got {costs.tolist()}")
        self.horizon = int(horizon)
        self.durations = durations
        self.costs = costs
        counts = horizon // durations
        self.offsets = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
        self.element_costs = np.concatenate([np.full(c, cost) for c, cost in zip(counts, costs)])
        self.num_requests = self.horizon

    def permits_of(self, day: int) -> np.ndarray:
        """(K,) element ids of the permits that contain `day` (one per type)."""
        return self.offsets + day // self.durations

    def covered(self, owned, request):
        return bool(np.asarray(owned, bool)[self.permits_of(request)].any())

    def _dp(self, req):
        """Bottom-up DP over the laminar permit tree; returns per-type node values and buy decisions."""
        hit = np.zeros(self.horizon, bool)
        hit[req] = True
        values, buys = [], []
        prev = None
        for j, (dur, cost) in enumerate(zip(self.durations, self.costs)):
            h = hit.reshape(-1, dur).any(1)
            if j == 0:
                children = np.where(h, np.inf, 0.0)
            else:
                children = prev.reshape(h.size, -1).sum(1)
            buy = h & (cost <= children)
            val = np.where(buy, cost, np.where(h, children, 0.0))
            values.append(val)
            buys.append(buy)
            prev = val
        return values, buys

    def optimum(self, requests) -> float:
        req = self.check_requests(requests)
        return float(self._dp(req)[0][-1].sum()) if req.size else 0.0

    def offline(self, requests) -> OfflineSolution:
        req = self.check_requests(requests)
        if req.size == 0:
            return OfflineSolution(_EMPTY.copy(), 0.0, {})
        _, buys = self._dp(req)
        chosen = []
        active = np.ones(buys[-1].size, bool)  # top-level nodes still to decide
        for j in range(len(self.durations) - 1, -1, -1):
            take = active & buys[j]
            chosen.append(self.offsets[j] + np.flatnonzero(take))
            if j:
                ratio = self.durations[j] // self.durations[j - 1]
                active = np.repeat(active & ~take, ratio)
        elements = np.sort(np.concatenate(chosen)).astype(np.int64)
        inset = np.zeros(self.num_elements, bool)
        inset[elements] = True
        resp = {int(d): self.permits_of(int(d))[inset[self.permits_of(int(d))]][:1] for d in req}
        return OfflineSolution(elements, float(self.element_costs[elements].sum()), resp)


# ------------------------------------------------------------------------------------------- generators
@dataclasses.dataclass(frozen=True)
class Scenario:
    """A problem with the pools requests and predictions are drawn from.

    Attributes:
      problem: the covering problem.
      candidates: (c,) request ids that may arrive (and benign false predictions come from).
      decoys: (d,) request ids that never arrive but are expensive to cover (blind-trust failure mode).
      ordered: requests arrive in increasing id order (time-ordered problems: parking permit).
    """

    problem: CoveringProblem
    candidates: np.ndarray
    decoys: np.ndarray
    ordered: bool = False


def set_cover_scenario(rng: np.random.Generator, *, num_sets: int = 40, num_elements: int = 80,
                       density: float = 0.1, cost_range: tuple[float, float] = (1.0, 10.0), num_decoys: int = 40,
                       decoy_cost: float = 10.0) -> Scenario:
    """Random set cover: set s contains element e w.p. `density` (each element in >= 1 set), costs
    U[cost_range]; each decoy element is covered only by its own singleton set of cost `decoy_cost`."""
    if not 0 < density <= 1:
        raise ValueError(f"density must lie in (0, 1], got {density}")
    if num_sets < 1 or num_elements < 1 or num_decoys < 0:
        raise ValueError(f"need num_sets >= 1, num_elements >= 1, num_decoys >= 0; got {num_sets}, "
                         f"{num_elements}, {num_decoys}")
    mem = rng.random((num_sets, num_elements)) < density
    lonely = np.flatnonzero(~mem.any(0))
    mem[rng.integers(0, num_sets, lonely.size), lonely] = True
    full = np.zeros((num_sets + num_decoys, num_elements + num_decoys), bool)
    full[:num_sets, :num_elements] = mem
    full[num_sets + np.arange(num_decoys), num_elements + np.arange(num_decoys)] = True
    costs = np.concatenate([rng.uniform(*cost_range, num_sets), np.full(num_decoys, decoy_cost)])
    return Scenario(SetCoverProblem(full, costs), np.arange(num_elements),
                    num_elements + np.arange(num_decoys))


def facility_location_scenario(rng: np.random.Generator, *, num_points: int = 80, opening_cost: float = 2.0,
                               num_decoys: int = 60, decoy_radius: float | None = None) -> Scenario:
    """Clients uniform in the unit square; decoys evenly spaced on a far circle (each more than 2f from
    every other point, so covering a decoy costs a facility of its own)."""
    if num_points < 1 or num_decoys < 0:
        raise ValueError(f"need num_points >= 1 and num_decoys >= 0, got {num_points}, {num_decoys}")
    main = rng.random((num_points, 2))
    if decoy_radius is None:
        decoy_radius = max(3.0 + 2 * opening_cost, 2.5 * opening_cost * max(num_decoys, 1) / np.pi)
    ang = 2 * np.pi * np.arange(num_decoys) / max(num_decoys, 1)
    decoys = 0.5 + decoy_radius * np.stack([np.cos(ang), np.sin(ang)], 1)
    return Scenario(FacilityLocationProblem(np.concatenate([main, decoys]), opening_cost),
                    np.arange(num_points), num_points + np.arange(num_decoys))


def steiner_scenario(rng: np.random.Generator, *, num_vertices: int = 60, radius: float = 0.25,
                     num_decoys: int = 10, decoy_length: float = 1.0, **problem_kwargs) -> Scenario:
    """Random geometric graph in the unit square (Euclidean lengths, plus the Euclidean MST so that it is
    connected), rooted at the vertex nearest the centre; each decoy vertex hangs on its own spur edge of
    length `decoy_length` from a random vertex."""
    if num_vertices < 2 or num_decoys < 0:
        raise ValueError(f"need num_vertices >= 2 and num_decoys >= 0, got {num_vertices}, {num_decoys}")
    pts = rng.random((num_vertices, 2))
    d = np.sqrt(((pts[:, None] - pts[None]) ** 2).sum(-1))
    mst = csgraph.minimum_spanning_tree(d).tocoo()
    close = np.triu(d <= radius, 1)
    close[np.minimum(mst.row, mst.col), np.maximum(mst.row, mst.col)] = True
    u, v = np.nonzero(close)
    hang = rng.integers(0, num_vertices, num_decoys)
    edges = np.concatenate([np.stack([u, v], 1), np.stack([hang, num_vertices + np.arange(num_decoys)], 1)])
    weights = np.concatenate([d[u, v], np.full(num_decoys, decoy_length)])
    root = int(np.argmin(((pts - 0.5) ** 2).sum(1)))
    prob = SteinerTreeProblem(num_vertices + num_decoys, edges, weights, root, **problem_kwargs)
    cands = np.array([x for x in range(num_vertices) if x != root], dtype=np.int64)
    return Scenario(prob, cands, num_vertices + np.arange(num_decoys))


def parking_permit_scenario(rng: np.random.Generator, *, durations=(1, 7, 28, 336), costs=(1.0, 4.0, 10.0, 80.0),
                            horizon: int | None = None, active_fraction: float = 0.5) -> Scenario:
    """Seasonal parking: the horizon is split into blocks of durations[-2] days, a random
    `active_fraction` of them are active (candidate request days); days of quiet blocks are decoys."""
    durations = tuple(int(x) for x in durations)
    horizon = int(durations[-1] if horizon is None else horizon)
    prob = ParkingPermitProblem(horizon, durations, costs)
    block = durations[-2] if len(durations) > 1 else durations[0]
    nblocks = horizon // block
    nact = int(round(active_fraction * nblocks))
    if not 1 <= nact <= nblocks:
        raise ValueError(f"active_fraction={active_fraction} leaves {nact} of {nblocks} blocks active")
    active = np.zeros(nblocks, bool)
    active[rng.choice(nblocks, nact, replace=False)] = True
    day_active = np.repeat(active, block)
    return Scenario(prob, np.flatnonzero(day_active), np.flatnonzero(~day_active), ordered=True)


def diamond_graph(levels: int) -> tuple[SteinerTreeProblem, list[dict]]:
    """Imase-Waxman's diamond graph: an s-t edge of length 1, each edge recursively replaced `levels` times
    by two parallel 2-edge paths of half the length. Root s = 0, t = 1.

    Returns:
      (problem, midpoints) where midpoints[i] maps each level-i edge (u, v) to its two level-(i+1)
      midpoints (a, b).
    """
    if levels < 0:
        raise ValueError(f"levels must be >= 0, got {levels}")
    cur, nxt_id, mids = [(0, 1)], 2, []
    for _ in range(levels):
        level_mid, new = {}, []
        for (u, v) in cur:
            a, b = nxt_id, nxt_id + 1
            nxt_id += 2
            level_mid[(u, v)] = (a, b)
            new += [(u, a), (a, v), (u, b), (b, v)]
        mids.append(level_mid)
        cur = new
    edges = np.array(cur, dtype=np.int64)
    prob = SteinerTreeProblem(nxt_id, edges, np.full(len(cur), 0.5 ** levels), root=0)
    return prob, mids


def sample_requests(rng: np.random.Generator, scenario: Scenario, k: int) -> np.ndarray:
    """k distinct candidate requests, in random order (increasing order if `scenario.ordered`)."""
    if not 0 <= k <= scenario.candidates.size:
        raise ValueError(f"k must lie in [0, {scenario.candidates.size}] (candidates), got {k}")
    req = rng.choice(scenario.candidates, k, replace=False).astype(np.int64)
    return np.sort(req) if scenario.ordered else req


def perturb_prediction(rng: np.random.Generator, requests, *, pool, p_miss: float, num_false: int) -> np.ndarray:
    """A predicted request set: drop round(p_miss * k) of the true requests and add `num_false` ids drawn
    from `pool` minus the true requests. Returned sorted (a prediction is a set)."""
    requests = np.asarray(requests, dtype=np.int64)
    if not 0 <= p_miss <= 1:
        raise ValueError(f"p_miss must lie in [0, 1], got {p_miss}")
    pool = np.setdiff1d(np.asarray(pool, dtype=np.int64), requests)
    if not 0 <= num_false <= pool.size:
        raise ValueError(f"num_false must lie in [0, {pool.size}] (pool minus requests), got {num_false}")
    keep = rng.permutation(requests)[int(round(p_miss * requests.size)):]
    return np.sort(np.concatenate([keep, rng.choice(pool, num_false, replace=False)])).astype(np.int64)
