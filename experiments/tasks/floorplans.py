"""Procedural floorplans as label maps, with ray-cast partial observations (PLMD's CPU-scale data).

Spec: papers/specs/vision_weights_envs.md section 3 (d) [INFER, the spec's design]: an ``n x n`` grid
(32 x 32 by default) with a closed outer wall, split by recursive binary space partition into
``num_rooms`` rooms with 1-cell walls; every split wall gets one door (a 2-cell gap), so every room is
reachable; a room type in {bedroom, bathroom, living room, kitchen} decides the one object placed in it
against a wall (``K = 4`` categories: bed, toilet, sofa, stove; 2-6 cells, never in front of a door).

Label map: 0 = free floor, 1 = wall, 2 + k = object category k. Objects are walkable and do not
occlude (only walls do). Partial observation: an agent takes a random walk; at each visited cell the
visibility polygon of radius ``radius`` is added to the known mask. A cell is visible iff the segment
between the two cell centres, sampled every 0.2 cells, meets no wall cell strictly before the target
(wall cells themselves can be seen), i.e. the same occlusion as BEV mapping from depth.

Dimension legend: ``n`` grid side, ``N`` maps.

Example:
    >>> rng = np.random.default_rng(0)
    >>> fp = make_floorplan(rng, n=24, num_rooms=4)
    >>> fp.labels.shape, int(fp.labels[0, 0]) == WALL, len(fp.rooms)
    ((24, 24), True, 4)
"""

from __future__ import annotations

import functools
from collections import deque
from typing import NamedTuple

import numpy as np

__all__ = ["FREE", "WALL", "CATEGORIES", "ROOM_TYPES", "NUM_LABELS", "Floorplan", "make_floorplan", "visibility",
           "random_walk", "observe", "make_dataset", "bfs_distances"]

FREE, WALL = 0, 1
ROOM_TYPES = ("bedroom", "bathroom", "living", "kitchen")
CATEGORIES = ("bed", "toilet", "sofa", "stove")
NUM_LABELS = 2 + len(CATEGORIES)
_MOVES = ((1, 0), (-1, 0), (0, 1), (0, -1))


class Floorplan(NamedTuple):
    """One floorplan.

    Attributes:
      labels: ``[n, n]`` int label map (FREE, WALL, 2 + category).
      doors: ``[n, n]`` bool, the door cells (gaps in split walls; labelled FREE).
      room_id: ``[n, n]`` int, the room index of each interior cell, -1 on walls and doors.
      rooms: tuple of ``(r0, r1, c0, c1, type)`` per room (inclusive interior bounds).
    """

    labels: np.ndarray
    doors: np.ndarray
    room_id: np.ndarray
    rooms: tuple


def _check_positive_int(name, v, lo=1):
    if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < lo:
        raise ValueError(f"{name} must be an int >= {lo}, got {v!r}")


def make_floorplan(rng: np.random.Generator, *, n: int = 32, num_rooms: int = 4, min_room: int = 4) -> Floorplan:
    """Draws one floorplan by recursive binary space partition (see the module docstring).

    Args:
      rng: numpy generator.
      n: grid side (>= 2 min_room + 3).
      num_rooms: rooms to make (>= 1); fewer if no room can be split any more.
      min_room: minimum interior side of a room.

    Returns:
      The `Floorplan`.
    """
    _check_positive_int("min_room", min_room, 2)
    _check_positive_int("n", n, 2 * min_room + 3)
    _check_positive_int("num_rooms", num_rooms)
    grid = np.zeros((n, n), np.int64)
    grid[0, :] = grid[-1, :] = grid[:, 0] = grid[:, -1] = WALL
    doors = np.zeros((n, n), bool)
    leaves = [(1, n - 2, 1, n - 2)]
    while len(leaves) < num_rooms:
        order = sorted(range(len(leaves)), key=lambda i: -((leaves[i][1] - leaves[i][0] + 1) * (leaves[i][3] - leaves[i][2] + 1)))
        done = False
        for i in order:
            r0, r1, c0, c1 = leaves[i]
            h, w = r1 - r0 + 1, c1 - c0 + 1
            options = []
            if h >= 2 * min_room + 1:      # horizontal wall at row r; its ends must not cut a door
                options += [("h", r) for r in range(r0 + min_room, r1 - min_room + 1)
                            if not doors[r, c0 - 1] and not doors[r, c1 + 1]]
            if w >= 2 * min_room + 1:
                options += [("v", c) for c in range(c0 + min_room, c1 - min_room + 1)
                            if not doors[r0 - 1, c] and not doors[r1 + 1, c]]
            if not options:
                continue
            axis, pos = options[rng.integers(len(options))]
            if axis == "h":
                grid[pos, c0:c1 + 1] = WALL
                d = int(rng.integers(c0, c1))          # door cells (pos, d), (pos, d + 1)
                grid[pos, d:d + 2] = FREE
                doors[pos, d:d + 2] = True
                new = [(r0, pos - 1, c0, c1), (pos + 1, r1, c0, c1)]
            else:
                grid[r0:r1 + 1, pos] = WALL
                d = int(rng.integers(r0, r1))
                grid[d:d + 2, pos] = FREE
                doors[d:d + 2, pos] = True
                new = [(r0, r1, c0, pos - 1), (r0, r1, pos + 1, c1)]
            leaves = leaves[:i] + new + leaves[i + 1:]
            done = True
            break
        if not done:
            break
    room_id = -np.ones((n, n), np.int64)
    rooms = []
    for k, (r0, r1, c0, c1) in enumerate(leaves):
        room_id[r0:r1 + 1, c0:c1 + 1] = k
        rtype = int(rng.integers(len(ROOM_TYPES)))
        rooms.append((r0, r1, c0, c1, rtype))
        _place_object(rng, grid, doors, (r0, r1, c0, c1), 2 + rtype)
    return Floorplan(grid, doors, room_id, tuple(rooms))


def _place_object(rng, grid, doors, rect, label):
    """One object (1 x L or 2 x L, 2-6 cells) against a random wall of the room, away from doors."""
    r0, r1, c0, c1 = rect
    near_door = np.zeros_like(doors)
    dr, dc = np.nonzero(doors)
    for a, b in zip(dr, dc):
        near_door[max(a - 1, 0):a + 2, max(b - 1, 0):b + 2] = True
    for _ in range(100):
        depth = int(rng.integers(1, 3))
        length = int(rng.integers(2 if depth == 1 else 1, 6 // depth + 1))   # depth x length in [2, 6]
        side = int(rng.integers(4))
        if side in (0, 1):   # along the top / bottom wall
            if length > c1 - c0 + 1:
                continue
            c = int(rng.integers(c0, c1 - length + 2))
            r = r0 if side == 0 else r1 - depth + 1
            box = (slice(r, r + depth), slice(c, c + length))
        else:
            if length > r1 - r0 + 1:
                continue
            r = int(rng.integers(r0, r1 - length + 2))
            c = c0 if side == 2 else c1 - depth + 1
            box = (slice(r, r + length), slice(c, c + depth))
        if near_door[box].any():
            continue
        grid[box] = label
        return
    raise RuntimeError(f"could not place an object in room {rect}")


@functools.lru_cache(maxsize=16)
def _ray_table(radius: int, step: float = 0.2):
    """Per target offset within ``radius``: the cell offsets its ray passes strictly before it."""
    targets, inter = [], []
    for dy in range(-radius, radius + 1):
        for dx in range(-radius, radius + 1):
            if dy * dy + dx * dx > radius * radius:
                continue
            length = np.hypot(dy, dx)
            ts = np.linspace(0, 1, max(int(np.ceil(length / step)), 1) + 1)
            cells = {(int(np.floor(dy * t + 0.5)), int(np.floor(dx * t + 0.5))) for t in ts}
            cells.discard((dy, dx))
            targets.append((dy, dx))
            inter.append(sorted(cells))
    width = max(len(c) for c in inter)
    idx = np.zeros((len(targets), width, 2), np.int64)
    valid = np.zeros((len(targets), width), bool)
    for i, cs in enumerate(inter):
        if cs:
            idx[i, :len(cs)] = cs
        valid[i, :len(cs)] = True
    return np.asarray(targets, np.int64), idx, valid


def visibility(labels: np.ndarray, pos: tuple[int, int], *, radius: int = 8) -> np.ndarray:
    """Bool ``[n, n]`` mask of the cells visible from cell ``pos`` (walls occlude; see module docstring)."""
    labels = np.asarray(labels)
    if labels.ndim != 2:
        raise ValueError(f"labels must be a 2-D label map, got shape {labels.shape}")
    n0, n1 = labels.shape
    r, c = int(pos[0]), int(pos[1])
    if not (0 <= r < n0 and 0 <= c < n1):
        raise ValueError(f"pos must lie inside the {labels.shape} grid, got {pos}")
    _check_positive_int("radius", radius)
    targets, idx, valid = _ray_table(int(radius))
    wall = np.pad(labels == WALL, 1, constant_values=True)   # outside the grid counts as wall
    ty, tx = targets[:, 0] + r, targets[:, 1] + c
    inside = (ty >= 0) & (ty < n0) & (tx >= 0) & (tx < n1)
    iy = np.clip(idx[..., 0] + r, -1, n0) + 1
    ix = np.clip(idx[..., 1] + c, -1, n1) + 1
    blocked = (wall[iy, ix] & valid).any(1)
    vis = np.zeros(labels.shape, bool)
    ok = inside & ~blocked
    vis[ty[ok], tx[ok]] = True
    return vis


def random_walk(rng: np.random.Generator, labels: np.ndarray, start: tuple[int, int], steps: int,
                *, persistence: float = 0.8) -> list[tuple[int, int]]:
    """A random walk over non-wall cells that keeps its direction with probability ``persistence``."""
    path = [tuple(int(v) for v in start)]
    if labels[path[0]] == WALL:
        raise ValueError(f"start must be a non-wall cell, got {start} (a wall)")
    d = int(rng.integers(4))
    for _ in range(steps):
        r, c = path[-1]
        if rng.random() > persistence:
            d = int(rng.integers(4))
        for attempt in range(8):
            dr, dc = _MOVES[d]
            if labels[r + dr, c + dc] != WALL:
                break
            d = int(rng.integers(4))
        else:
            continue
        path.append((r + dr, c + dc))
    return path


def observe(labels: np.ndarray, path, *, radius: int = 8) -> np.ndarray:
    """Known mask: the union of the visibility masks of the cells of ``path``."""
    known = np.zeros(np.asarray(labels).shape, bool)
    for p in path:
        known |= visibility(labels, p, radius=radius)
    return known


def bfs_distances(passable: np.ndarray, start: tuple[int, int]) -> np.ndarray:
    """4-neighbour BFS distances from ``start`` over ``passable`` cells (-1 where unreachable)."""
    n0, n1 = passable.shape
    dist = -np.ones(passable.shape, np.int64)
    if not passable[start]:
        return dist
    dist[start] = 0
    q = deque([start])
    while q:
        r, c = q.popleft()
        for dr, dc in _MOVES:
            a, b = r + dr, c + dc
            if 0 <= a < n0 and 0 <= b < n1 and passable[a, b] and dist[a, b] < 0:
                dist[a, b] = dist[r, c] + 1
                q.append((a, b))
    return dist


def make_dataset(seed: int, num: int, *, n: int = 32, num_rooms: tuple[int, int] = (3, 6), radius: int = 8,
                 walk_steps: tuple[int, int] = (2, 30)) -> dict:
    """``num`` floorplans with a partial observation each.

    The walk length is uniform in ``walk_steps`` (the spec's "mask of the same episode at a random
    earlier step": the known area follows exploration progress).

    Returns:
      ``{"labels": [N, n, n] int, "known": [N, n, n] bool, "start": [N, 2] int}`` (start = the walk's end,
      where a navigating agent would continue from).
    """
    _check_positive_int("num", num)
    if not (1 <= num_rooms[0] <= num_rooms[1]):
        raise ValueError(f"num_rooms must be (lo, hi) with 1 <= lo <= hi, got {num_rooms}")
    if not (0 <= walk_steps[0] <= walk_steps[1]):
        raise ValueError(f"walk_steps must be (lo, hi) with 0 <= lo <= hi, got {walk_steps}")
    rng = np.random.default_rng(seed)
    labels = np.zeros((num, n, n), np.int64)
    known = np.zeros((num, n, n), bool)
    start = np.zeros((num, 2), np.int64)
    for i in range(num):
        fp = make_floorplan(rng, n=n, num_rooms=int(rng.integers(num_rooms[0], num_rooms[1] + 1)))
        free = np.argwhere(fp.room_id >= 0)
        s = free[rng.integers(len(free))]
        path = random_walk(rng, fp.labels, (int(s[0]), int(s[1])), int(rng.integers(walk_steps[0], walk_steps[1] + 1)))
        labels[i], known[i], start[i] = fp.labels, observe(fp.labels, path, radius=radius), path[-1]
    return {"labels": labels, "known": known, "start": start}
