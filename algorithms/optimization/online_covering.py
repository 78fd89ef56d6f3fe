"""Learning-augmented online covering: classical online algorithms and black-box prediction wrappers.

Requests arrive one by one and must be covered irrevocably at least total cost; a prediction R_hat of
the request set is given up front. This module implements the classical online algorithms (the
"rho(k)" black boxes) and three wrappers that use R_hat around any of them. The wrappers and the error
measure are the spec's design: the paper's exact reduction and definition of eta are not public.

Public functions:
  * online algorithms (the `OnlineAlgorithm` interface: `serve`, `own`): `OnlineSetCover` (primal-dual
    with randomised rounding), `OnlineFacilityLocation` (Meyerson), `OnlineSteinerTree` (greedy),
    `OnlineParkingPermit` (primal-dual), `make_online`; LP helpers `fractional_set_cover`,
    `set_cover_lp`; problems, scenarios and exact offline optima re-exported from
    `algorithms.optimization._covering_instances`;
  * prediction error: `prediction_error` (eta = |R \\ R_hat| + |R_hat \\ R|), `matching_error`;
  * runs: `run_online`, `run_trust` (buy OFF(R_hat) up front), `run_lazy` (buy a predicted request's
    cover when it arrives), `run_robust` (follow lazy, switch when one side costs lam times the other;
    at most `robust_constant(2) = 6` times min(cost_L, cost_ON)), `diamond_adversary`.

Conventions: a solution is a bool mask over the problem's E elements and only grows; randomness comes
from an integer `seed` (ON uses child stream 0, the residual ON of trust / lazy child stream 1, so
`run_robust`'s virtual runs equal `run_online` and `run_lazy`); numpy/scipy float64, no JAX.

Dimension legend: m sets, n universe elements / points / vertices, k arrived requests, E purchasable
elements, K permit types, T parking horizon.

Spec: `../shared/papers/specs/statistics_theory.md`, section 5.

Example:
  >>> import numpy as np
  >>> from algorithms.optimization import online_covering as oc
  >>> sc = oc.set_cover_scenario(np.random.default_rng(0))
  >>> req = oc.sample_requests(np.random.default_rng(1), sc, 20)
  >>> res = oc.run_lazy(sc.problem, req, req, seed=0)        # perfect prediction
  >>> bool(np.isclose(res.cost, sc.problem.optimum(req)))
  True

References:
  Afrouz Jabal Ameli, Laura Sanita, Moritz Venzin. Learning-Augmented Online Covering Problems.
  arXiv:2507.06032. Alon, Awerbuch, Azar, Buchbinder, Naor, The online set cover problem (STOC 2003);
  Buchbinder and Naor, Online primal-dual algorithms for covering and packing (ESA 2005); Meyerson,
  Online facility location (FOCS 2001); Imase and Waxman, Dynamic Steiner tree problem (SIAM J. Discrete
  Math. 1991); Meyerson, The parking permit problem (FOCS 2005).
"""

from __future__ import annotations

import heapq
import math
from typing import NamedTuple

import numpy as np
from scipy import optimize

from algorithms.optimization._covering_instances import (CoveringProblem, FacilityLocationProblem,
                                                         OfflineSolution, ParkingPermitProblem, Scenario,
                                                         SetCoverProblem, SteinerTreeProblem, diamond_graph,
                                                         facility_location_scenario, parking_permit_scenario,
                                                         perturb_prediction, sample_requests,
                                                         set_cover_scenario, steiner_scenario)

__all__ = [
    # problems and instances (from _covering_instances)
    "CoveringProblem", "SetCoverProblem", "FacilityLocationProblem", "SteinerTreeProblem", "ParkingPermitProblem",
    "OfflineSolution", "Scenario", "set_cover_scenario", "facility_location_scenario", "steiner_scenario",
    "parking_permit_scenario", "diamond_graph", "sample_requests", "perturb_prediction",
    # classical online algorithms
    "OnlineAlgorithm", "OnlineSetCover", "OnlineFacilityLocation", "OnlineSteinerTree", "OnlineParkingPermit",
    "make_online", "fractional_set_cover", "set_cover_lp", "diamond_adversary",
    # prediction error and wrappers
    "PredictionError", "prediction_error", "matching_error", "RunResult", "run_online", "run_trust", "run_lazy",
    "run_robust", "robust_constant",
]

_EMPTY = np.zeros(0, dtype=np.int64)


# ============================================================================ classical online algorithms
class OnlineAlgorithm:
    """Interface of an online covering algorithm (the black box ON).

    `serve(r)` buys elements so that request r is covered and returns the ids it newly bought;
    `own(elements)` tells it that `elements` are available for free from now on (the residual instance of
    the wrappers); `owned` (E,) and `cost` (the total of its own purchases) describe its solution.
    """

    def __init__(self, problem: CoveringProblem, rng: np.random.Generator):
        self.problem = problem
        self.rng = rng
        self.owned = np.zeros(problem.num_elements, bool)
        self.cost = 0.0

    def _buy(self, elements) -> np.ndarray:
        elements = np.unique(np.asarray(elements, dtype=np.int64))
        new = elements[~self.owned[elements]]
        self.owned[new] = True
        self.cost += float(self.problem.element_costs[new].sum())
        return new

    def own(self, elements) -> None:
        elements = np.unique(np.asarray(elements, dtype=np.int64))
        new = elements[~self.owned[elements]]
        self.owned[new] = True
        self._on_own(new)

    def _on_own(self, new: np.ndarray) -> None:
        pass

    def serve(self, request: int) -> np.ndarray:
        raise NotImplementedError


def _fractional_step(x: np.ndarray, sets: np.ndarray, costs: np.ndarray) -> None:
    """Buchbinder-Naor update for one element contained in `sets`: while sum x < 1,
    x_S <- x_S (1 + 1/c_S) + 1/(d c_S) for S in `sets` (d = |sets|). In place."""
    d, c = sets.size, costs[sets]
    while x[sets].sum() < 1.0:
        x[sets] = x[sets] * (1.0 + 1.0 / c) + 1.0 / (d * c)


def fractional_set_cover(membership, costs, requests) -> tuple[np.ndarray, float]:
    """Online fractional set cover (Buchbinder-Naor primal-dual), O(log d)-competitive against the LP.

    Args:
      membership: (m, n) bool. costs: (m,) positive. requests: (k,) element ids in arrival order.

    Returns:
      (xs, cost): xs (k, m) the fractional solution after each arrival; cost = costs . xs[-1].

    References:
      Buchbinder and Naor, Online primal-dual algorithms for covering and packing (ESA 2005).
    """
    prob = SetCoverProblem(membership, costs)
    req = prob.check_requests(requests)
    x = np.zeros(prob.num_elements)
    xs = np.zeros((req.size, prob.num_elements))
    for t, e in enumerate(req):
        _fractional_step(x, prob.sets_of[e], prob.element_costs)
        xs[t] = x
    return xs, float(prob.element_costs @ x)


def set_cover_lp(membership, costs, requests) -> float:
    """Optimal value of the set-cover LP relaxation on `requests` (scipy linprog / HiGHS)."""
    prob = SetCoverProblem(membership, costs)
    req = prob.check_requests(requests)
    if req.size == 0:
        return 0.0
    res = optimize.linprog(prob.element_costs, A_ub=-prob.membership[:, req].T.astype(float),
                           b_ub=-np.ones(req.size), bounds=(0, None), method="highs")
    if not res.success:
        raise RuntimeError(f"LP failed: {res.message}")
    return float(res.fun)


class OnlineSetCover(OnlineAlgorithm):
    """Online set cover: fractional primal-dual plus randomised threshold rounding, O(log m log k).

    Each set S keeps theta_S = min of q uniforms, q = ceil(2 ln(2 k')) with k' the doubling guess of the
    number of elements seen (more uniforms are drawn when k' doubles); S is bought once x_S >= theta_S.
    If the arriving element is still uncovered, the cheapest set containing it is bought.

    References:
      Alon, Awerbuch, Azar, Buchbinder, Naor, The online set cover problem (STOC 2003).
    """

    def __init__(self, problem: SetCoverProblem, rng):
        super().__init__(problem, rng)
        self.x = np.zeros(problem.num_elements)
        self.theta = np.ones(problem.num_elements)
        self.draws = 0
        self.seen = 0

    def _on_own(self, new):
        self.x[new] = np.maximum(self.x[new], 1.0)

    def serve(self, request):
        prob = self.problem
        if prob.covered(self.owned, request):
            return _EMPTY.copy()
        self.seen += 1
        guess = 1 << (self.seen - 1).bit_length()
        q = max(1, math.ceil(2.0 * math.log(2.0 * guess)))
        if q > self.draws:  # min of (q - draws) extra uniforms ~ 1 - U^(1 / (q - draws))
            extra = 1.0 - self.rng.random(prob.num_elements) ** (1.0 / (q - self.draws))
            self.theta = np.minimum(self.theta, extra)
            self.draws = q
        sets = prob.sets_of[request]
        _fractional_step(self.x, sets, prob.element_costs)
        bought = self._buy(np.flatnonzero((self.x >= self.theta) & ~self.owned))
        if not prob.covered(self.owned, request):
            bought = np.concatenate([bought, self._buy([sets[np.argmin(prob.element_costs[sets])]])])
        return bought


class OnlineFacilityLocation(OnlineAlgorithm):
    """Meyerson's randomised online facility location (uniform opening cost f).

    A client at point j with distance delta to the nearest open facility opens a facility at j with
    probability min(delta / f, 1) (connecting at cost 0), else connects to the nearest open facility.
    O(log k)-competitive in expectation (O(1) for random arrival order).

    References:
      Meyerson, Online facility location (FOCS 2001).
    """

    def __init__(self, problem: FacilityLocationProblem, rng):
        super().__init__(problem, rng)
        self.open = np.zeros(problem.num_points, bool)

    def _on_own(self, new):
        fac = new[new < self.problem.num_points]
        self.open[fac] = True

    def serve(self, request):
        prob = self.problem
        if prob.covered(self.owned, request):
            return _EMPTY.copy()
        j, f = int(request), prob.opening_cost
        if self.open.any():
            d = np.where(self.open, prob.dist[:, j], np.inf)
            nearest = int(np.argmin(d))
            delta = float(d[nearest])
        else:
            nearest, delta = -1, np.inf
        if delta > 0 and (f == 0 or self.rng.random() < delta / f):
            self.open[j] = True
            return self._buy([j, int(prob.edge(j, j))])
        return self._buy([int(prob.edge(nearest, j))])


class OnlineSteinerTree(OnlineAlgorithm):
    """Imase-Waxman greedy online Steiner tree: connect each new terminal to the nearest vertex already
    joined to the root, by a shortest path in which owned edges are free. Theta(log k)-competitive.

    References:
      Imase and Waxman, Dynamic Steiner tree problem (SIAM J. Discrete Math. 1991).
    """

    def __init__(self, problem: SteinerTreeProblem, rng):
        super().__init__(problem, rng)
        self.in_tree = problem.component(self.owned)

    def _on_own(self, new):
        self.in_tree = self.problem.component(self.owned)

    def serve(self, request):
        prob = self.problem
        v0 = int(request)
        if self.in_tree[v0]:
            return _EMPTY.copy()
        w = np.where(self.owned, 0.0, prob.element_costs)
        dist = {v0: 0.0}
        back: dict[int, tuple[int, int]] = {}
        heap, done, target = [(0.0, v0)], set(), -1
        while heap:
            du, u = heapq.heappop(heap)
            if u in done:
                continue
            done.add(u)
            if self.in_tree[u]:
                target = u
                break
            for v, eid in prob.adjacency[u]:
                nd = du + w[eid]
                if nd < dist.get(v, np.inf):
                    dist[v] = nd
                    back[v] = (u, eid)
                    heapq.heappush(heap, (nd, v))
        path, v = [], target
        while v != v0:
            v, eid = back[v]
            path.append(eid)
        bought = self._buy(path)
        self.in_tree = prob.component(self.owned)
        return bought


class OnlineParkingPermit(OnlineAlgorithm):
    """Meyerson's deterministic primal-dual parking permit, O(K)-competitive.

    When an uncovered day arrives, its dual variable is raised until a permit containing it becomes tight
    (the duals of its requested days sum to its cost); every tight permit containing the day is bought.

    References:
      Meyerson, The parking permit problem (FOCS 2005).
    """

    def __init__(self, problem: ParkingPermitProblem, rng):
        super().__init__(problem, rng)
        self.slack = problem.element_costs.copy()

    def _on_own(self, new):
        self.slack[new] = 0.0

    def serve(self, request):
        prob = self.problem
        if prob.covered(self.owned, request):
            return _EMPTY.copy()
        perms = prob.permits_of(int(request))
        y = self.slack[perms].min()
        self.slack[perms] -= y
        return self._buy(perms[self.slack[perms] <= 1e-9 * np.maximum(1.0, prob.element_costs[perms])])


_ONLINE = {SetCoverProblem: OnlineSetCover, FacilityLocationProblem: OnlineFacilityLocation,
           SteinerTreeProblem: OnlineSteinerTree, ParkingPermitProblem: OnlineParkingPermit}


def make_online(problem: CoveringProblem, rng: np.random.Generator) -> OnlineAlgorithm:
    """The classical online algorithm for `problem`'s type (a fresh instance)."""
    for cls, alg in _ONLINE.items():
        if isinstance(problem, cls):
            return alg(problem, rng)
    raise ValueError(f"problem must be one of {[c.__name__ for c in _ONLINE]}, got {type(problem).__name__}")


def diamond_adversary(levels: int) -> tuple[SteinerTreeProblem, np.ndarray]:
    """Imase-Waxman's lower-bound instance: the diamond graph and the terminal sequence chosen adaptively
    against the greedy (at level i request, on each level-(i-1) edge of a fixed s-t path, the midpoint the
    greedy's tree avoids). All k = 2^levels terminals lie on one s-t path, so OPT = 1, while the greedy
    pays exactly 1 + levels / 2 (each level adds 2^(i-1) connections of length 2^-i).

    Returns:
      (problem, requests) with requests (2^levels,) in arrival order.
    """
    prob, mids = diamond_graph(levels)
    greedy = OnlineSteinerTree(prob, np.random.default_rng(0))
    requests = [1]
    greedy.serve(1)
    path = [(0, 1)]  # the s-t path (as level-i edges) all requests lie on
    for i in range(levels):
        new_path = []
        for (u, v) in path:
            a, b = mids[i][(u, v)]
            if greedy.in_tree[a] and greedy.in_tree[b]:
                raise AssertionError("both midpoints of an edge are in the greedy tree")
            m = b if greedy.in_tree[a] else a
            requests.append(m)
            greedy.serve(m)
            new_path += [(u, m), (m, v)]
        path = new_path
    return prob, np.array(requests, dtype=np.int64)


# ============================================================================ prediction error [spec design]
class PredictionError(NamedTuple):
    """Count errors between the realised request set R and the prediction R_hat.

    Attributes: eta_miss = |R \\ R_hat| (unpredicted arrivals), eta_false = |R_hat \\ R| (predictions that
    never arrive), eta = eta_miss + eta_false.
    """

    eta_miss: int
    eta_false: int
    eta: int


def prediction_error(requests, predicted) -> PredictionError:
    """The spec's count error (the paper's exact eta may weight or match requests differently).

    >>> prediction_error([1, 2, 3], [2, 3, 4, 5])
    PredictionError(eta_miss=1, eta_false=2, eta=3)
    """
    r = np.unique(np.asarray(requests, dtype=np.int64))
    p = np.unique(np.asarray(predicted, dtype=np.int64))
    miss, false = np.setdiff1d(r, p).size, np.setdiff1d(p, r).size
    return PredictionError(int(miss), int(false), int(miss + false))


def matching_error(requests, predicted, distances, *, unmatched_cost: float) -> float:
    """Metric prediction error: min-cost partial matching of R to R_hat, each pair (r, p) costing
    distances[r, p] and each unmatched request or prediction `unmatched_cost` (Azar-Panigrahi-Touitou
    style; equals unmatched_cost * eta when nothing matches and 0 when R_hat = R).

    Args:
      requests: (k,) ids; predicted: (k_hat,) ids; distances: (N, N) metric over ids.
    """
    distances = np.asarray(distances, dtype=np.float64)
    r, p = np.asarray(requests, dtype=np.int64), np.asarray(predicted, dtype=np.int64)
    if distances.ndim != 2 or distances.shape[0] != distances.shape[1]:
        raise ValueError(f"distances must be square (N, N), got shape {distances.shape}")
    if unmatched_cost < 0:
        raise ValueError(f"unmatched_cost must be >= 0, got {unmatched_cost}")
    k, kh = r.size, p.size
    if k + kh == 0:
        return 0.0
    big = np.zeros((k + kh, kh + k))
    big[:k, :kh] = np.minimum(distances[np.ix_(r, p)], 2 * unmatched_cost)
    big[:k, kh:] = unmatched_cost
    big[k:, :kh] = unmatched_cost
    rows, cols = optimize.linear_sum_assignment(big)
    return float(big[rows, cols].sum())


# ================================================================================= wrappers [spec design]
class RunResult(NamedTuple):
    """Outcome of serving a request sequence.

    Attributes:
      cost: total cost paid. owned: (E,) bool final solution. cumulative_cost: (k,) cost after each arrival.
      history: list of (E,) masks after each arrival (only with record=True, else None).
      info: dict of diagnostics (n_online: requests fed to the residual ON; switches, cost_primary,
        cost_fallback for the robust wrapper; offline_cost: cost of OFF(R_hat)).
    """

    cost: float
    owned: np.ndarray
    cumulative_cost: np.ndarray
    history: list | None
    info: dict


def _streams(seed: int) -> tuple[np.random.Generator, np.random.Generator]:
    a, b = np.random.SeedSequence(seed).spawn(2)
    return np.random.default_rng(a), np.random.default_rng(b)


class _Policy:
    """A stepping online policy with its own solution (owned mask and cost of its purchases)."""

    def __init__(self, problem):
        self.problem = problem
        self.owned = np.zeros(problem.num_elements, bool)
        self.cost = 0.0
        self.info = {}

    def _buy(self, elements) -> np.ndarray:
        elements = np.unique(np.asarray(elements, dtype=np.int64))
        new = elements[~self.owned[elements]]
        self.owned[new] = True
        self.cost += float(self.problem.element_costs[new].sum())
        return new


class _OnlinePolicy(_Policy):
    def __init__(self, problem, rng):
        super().__init__(problem)
        self.alg = make_online(problem, rng)

    def serve(self, r):
        return self._buy(self.alg.serve(r))


class _PredictionPolicy(_Policy):
    """Variants U (lazy=False) and L (lazy=True)."""

    def __init__(self, problem, predicted, rng, *, lazy: bool, share_owned: bool, offline_solution=None):
        super().__init__(problem)
        pred = problem.check_requests(predicted, name="predicted")
        if offline_solution is None:
            offline_solution = problem.offline(pred)
        elif set(offline_solution.responsible) != set(pred.tolist()):
            raise ValueError("offline_solution must be problem.offline(predicted): its responsibility map covers "
                             f"{len(offline_solution.responsible)} requests, predicted has {pred.size}")
        self.sol = offline_solution
        self.lazy, self.share = lazy, share_owned
        self.residual = make_online(problem, rng)
        self.info = {"n_online": 0, "offline_cost": self.sol.cost}
        if not lazy:
            self._buy(self.sol.elements)
            if share_owned:
                self.residual.own(self.sol.elements)

    def serve(self, r):
        r = int(r)
        if self.problem.covered(self.owned, r):
            return _EMPTY.copy()
        if self.lazy and r in self.sol.responsible:
            new = self._buy(self.sol.responsible[r])
            if self.share:
                self.residual.own(new)
            return new
        self.info["n_online"] += 1
        return self._buy(self.residual.serve(r))


class _RobustPolicy(_Policy):
    """Follow `primary` first; switch before paying when the followed virtual cost exceeds lam x other."""

    def __init__(self, problem, primary: _Policy, fallback: _Policy, lam: float):
        super().__init__(problem)
        self.algs, self.follow, self.lam = (primary, fallback), 0, lam
        self.info = {"switches": 0}

    def serve(self, r):
        news = [a.serve(r) for a in self.algs]
        f, o = self.algs[self.follow], self.algs[1 - self.follow]
        if f.cost > self.lam * o.cost:
            self.follow = 1 - self.follow
            self.info["switches"] += 1
            return self._buy(np.flatnonzero(o.owned))
        return self._buy(news[self.follow])


def _drive(policy, problem, requests, record: bool) -> RunResult:
    req = problem.check_requests(requests)
    cum = np.zeros(req.size)
    hist = [] if record else None
    for t, r in enumerate(req):
        policy.serve(int(r))
        cum[t] = policy.cost
        if record:
            hist.append(policy.owned.copy())
    return RunResult(policy.cost, policy.owned.copy(), cum, hist, dict(policy.info))


def run_online(problem: CoveringProblem, requests, *, seed: int = 0, record: bool = False) -> RunResult:
    """The plain classical online algorithm ON on `requests` (no predictions).

    Args:
      problem: a covering problem. requests: (k,) distinct ids in arrival order. seed: randomness.
      record: keep the solution mask after every arrival in `history`.
    """
    return _drive(_OnlinePolicy(problem, _streams(seed)[0]), problem, requests, record)


def run_trust(problem: CoveringProblem, requests, predicted, *, seed: int = 0, share_owned: bool = True,
              offline_solution: OfflineSolution | None = None, record: bool = False) -> RunResult:
    """Variant U (blind trust) [spec design]: buy OFF(predicted) up front, feed uncovered arrivals to a fresh
    ON on the residual instance (`share_owned`: ON sees the owned elements as free).

    Guarantee: cost <= alpha OPT(R_hat) + cost of ON on the <= eta_miss unpredicted requests.

    Args:
      problem: a covering problem. requests: (k,) distinct ids in arrival order. predicted: (k_hat,)
      distinct ids, the predicted request set. seed: randomness of the residual ON.
      share_owned: the residual ON sees owned elements as free (False: a fully independent ON).
      offline_solution: a precomputed `problem.offline(predicted)` (shared between wrappers).
      record: keep the solution mask after every arrival.
    """
    pol = _PredictionPolicy(problem, predicted, _streams(seed)[1], lazy=False, share_owned=share_owned,
                             offline_solution=offline_solution)
    return _drive(pol, problem, requests, record)


def run_lazy(problem: CoveringProblem, requests, predicted, *, seed: int = 0, share_owned: bool = True,
             offline_solution: OfflineSolution | None = None, record: bool = False) -> RunResult:
    """Variant L (lazy trust) [spec design]: compute OFF(predicted) with its responsibility map; buy the
    elements responsible for a predicted request only when it arrives (and is not covered yet);
    unpredicted uncovered requests go to a fresh ON on the residual instance, as in `run_trust`. With
    `share_owned` the residual ON is told about each lazily bought element as it is bought (the residual
    instance then changes online, so ON's classical guarantee is a heuristic there; share_owned=False runs
    a fully independent ON, for which cost <= cost(OFF(R_hat)) + rho(eta_miss) OPT(R) holds as in U)."""
    pol = _PredictionPolicy(problem, predicted, _streams(seed)[1], lazy=True, share_owned=share_owned,
                           offline_solution=offline_solution)
    return _drive(pol, problem, requests, record)


def robust_constant(lam: float) -> float:
    """Worst-case factor of `run_robust` against min(cost_L, cost_ON): lam (1 + lam / (lam - 1))."""
    return lam * (1.0 + lam / (lam - 1.0))


def run_robust(problem: CoveringProblem, requests, predicted, *, seed: int = 0, lam: float = 2.0,
               share_owned: bool = True, offline_solution: OfflineSolution | None = None,
               record: bool = False) -> RunResult:
    """Variant R (robust switching) [spec design]: run L and the plain ON virtually, follow L first.

    On each arrival both virtual algorithms respond; if the followed one's virtual cost now exceeds `lam`
    times the other's, switch before paying and buy the other's entire current solution, else buy the
    followed one's response. Bound: between switches the paid cost is at most the followed algorithm's
    cost just before the next switch, <= lam x the other's cost = lam x min at that switch; the min at
    consecutive switches grows by more than lam; summing the geometric series, cost <= lam (1 + lam /
    (lam - 1)) min(cost_L, cost_ON) = 6 min for lam = 2 (`robust_constant`), on every run.

    info["cost_primary"] / ["cost_fallback"] are the virtual costs of L and ON; they equal `run_lazy` and
    `run_online` with the same seed.
    """
    if not lam > 1:
        raise ValueError(f"lam must be > 1, got {lam}")
    on_rng, res_rng = _streams(seed)
    primary = _PredictionPolicy(problem, predicted, res_rng, lazy=True, share_owned=share_owned,
                                offline_solution=offline_solution)
    pol = _RobustPolicy(problem, primary, _OnlinePolicy(problem, on_rng), lam)
    out = _drive(pol, problem, requests, record)
    out.info.update(cost_primary=primary.cost, cost_fallback=pol.algs[1].cost, n_online=primary.info["n_online"],
                    offline_cost=primary.sol.cost)
    return out
