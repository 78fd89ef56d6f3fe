"""Floorplans: closed walls except doors, every room reachable, one object per room, occluding ray casting."""

import numpy as np
import pytest

from experiments.tasks import floorplans as f


@pytest.mark.parametrize("seed", range(6))
def test_walls_closed_except_doors_and_rooms_reachable(seed):
    rng = np.random.default_rng(seed)
    fp = f.make_floorplan(rng, n=32, num_rooms=int(rng.integers(3, 7)))
    lab = fp.labels
    assert (lab[0] == f.WALL).all() and (lab[-1] == f.WALL).all() and (lab[:, 0] == f.WALL).all() and (lab[:, -1] == f.WALL).all()
    assert (lab[fp.doors] == f.FREE).all()
    passable = lab != f.WALL
    closed = passable & ~fp.doors
    for k, (r0, r1, c0, c1, rtype) in enumerate(fp.rooms):
        cells = fp.room_id == k
        assert cells.sum() == (r1 - r0 + 1) * (c1 - c0 + 1)
        # Doors closed: the flood fill from inside a room is exactly the room (walls are closed).
        reach = f.bfs_distances(closed, (r0, c0)) >= 0
        np.testing.assert_array_equal(reach, cells)
        # One object per room, of the room type's category.
        objs = set(np.unique(lab[cells]).tolist()) - {f.FREE}
        assert objs == {2 + rtype}
        assert 2 <= (lab[cells] == 2 + rtype).sum() <= 6
    # Doors open: every room reachable from the first.
    r0, _, c0, _, _ = fp.rooms[0]
    reach = f.bfs_distances(passable, (r0, c0)) >= 0
    assert reach[fp.room_id >= 0].all()


def test_ray_casting_hand_made_map():
    lab = np.zeros((9, 9), np.int64)
    lab[0] = lab[-1] = lab[:, 0] = lab[:, -1] = f.WALL
    lab[:, 4] = f.WALL                      # a full wall splits left and right
    vis = f.visibility(lab, (4, 2), radius=8)
    assert vis[1:8, 1:4].all() and vis[:, 4].any()      # own side and the wall face are seen
    assert not vis[:, 5:].any()                         # nothing behind the wall
    lab[4, 4] = f.FREE                                  # a 1-cell window: only cells behind it in line are seen
    vis = f.visibility(lab, (4, 2), radius=8)
    assert vis[4, 5:8].all() and not vis[1, 7] and not vis[7, 7]


@pytest.mark.parametrize("seed", range(4))
def test_ray_casting_never_sees_through_walls(seed):
    rng = np.random.default_rng(100 + seed)
    fp = f.make_floorplan(rng, n=32, num_rooms=5)
    shut = fp.labels.copy()
    shut[fp.doors] = f.WALL                  # close the doors: a room is then sealed
    for k, (r0, r1, c0, c1, _) in enumerate(fp.rooms):
        pos = (int(rng.integers(r0, r1 + 1)), int(rng.integers(c0, c1 + 1)))
        vis = f.visibility(shut, pos, radius=12)
        ring = np.zeros_like(vis)
        ring[r0 - 1:r1 + 2, c0 - 1:c1 + 2] = True          # the room and its enclosing walls
        assert not (vis & ~ring).any()
        assert vis[pos]


def test_dataset_and_walk():
    d = f.make_dataset(0, 5, n=24, num_rooms=(2, 4), radius=6)
    assert d["labels"].shape == d["known"].shape == (5, 24, 24)
    for lab, kn, s in zip(d["labels"], d["known"], d["start"]):
        assert kn[tuple(s)] and lab[tuple(s)] != f.WALL and 0 < kn.mean() < 1
    d2 = f.make_dataset(0, 5, n=24, num_rooms=(2, 4), radius=6)
    np.testing.assert_array_equal(d["known"], d2["known"])


def test_bad_input():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="n must"):
        f.make_floorplan(rng, n=5)
    with pytest.raises(ValueError, match="num_rooms"):
        f.make_floorplan(rng, n=32, num_rooms=0)
    lab = np.zeros((5, 5), np.int64)
    with pytest.raises(ValueError, match="pos must"):
        f.visibility(lab, (7, 0))
    with pytest.raises(ValueError, match="labels must"):
        f.visibility(lab[0], (0, 0))
    lab[1, 1] = f.WALL
    with pytest.raises(ValueError, match="start must"):
        f.random_walk(rng, lab, (1, 1), 3)
