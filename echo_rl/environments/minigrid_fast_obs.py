"""A faster MiniGrid observation, identical to ``MiniGridEnv.gen_obs``.

MiniGrid builds each egocentric view by slicing the grid into new ``Grid``
objects, rotating them ``agent_dir + 1`` times and encoding the result, all in
Python: about 80% of an env step. This computes the same (7, 7, 3) image by
picking the view's cells straight out of the grid's cell list (one cached
``itemgetter`` per agent position and direction), running MiniGrid's own
visibility sweep on that small window (precomputed steps, ending at the first
row with nothing visible), and writing the visible cells' encodings into one
byte buffer. Tests check it against ``gen_obs``
step by step on many env families; envs that override ``gen_obs`` or
``gen_obs_grid`` keep their own.
"""

from __future__ import annotations

import functools
import itertools
import operator

import numpy as np
from minigrid.core.constants import DIR_TO_VEC, OBJECT_TO_IDX
from minigrid.core.world_object import Wall
from minigrid.minigrid_env import MiniGridEnv

_WALL = Wall()
_EMPTY = (OBJECT_TO_IDX["empty"], 0, 0)
_PAD = [_WALL]


@functools.lru_cache(maxsize=64)
def _view_offsets(size: int, direction: int) -> tuple[tuple[int, int], ...]:
    """World offset of each view cell, flat in ``image[i, j]`` order (column i, row j; agent at (half, size-1))."""
    half = size // 2
    dx, dy = (int(v) for v in DIR_TO_VEC[direction])
    rx, ry = -dy, dx  # the agent's right
    return tuple(((size - 1 - j) * dx + (i - half) * rx, (size - 1 - j) * dy + (i - half) * ry)
                 for i in range(size) for j in range(size))


@functools.lru_cache(maxsize=16384)
def _window(size: int, direction: int, ax: int, ay: int, width: int, height: int) -> operator.itemgetter:
    """Picks the view's cells, in :func:`_view_offsets` order, out of the grid's cell list with one padding
    cell appended (index ``width * height``, a wall: what MiniGrid shows outside the grid)."""
    outside = width * height
    return operator.itemgetter(*((ay + oy) * width + ax + ox if 0 <= ax + ox < width and 0 <= ay + oy < height
                                 else outside for ox, oy in _view_offsets(size, direction)))


def fast_gen_obs(env: MiniGridEnv) -> dict:
    size = env.agent_view_size
    ax, ay = env.agent_pos
    grid = env.grid
    objs = list(_window(size, env.agent_dir, int(ax), int(ay), grid.width, grid.height)(grid.grid + _PAD))
    mask = _visibility(objs, size) if not env.see_through_walls else None
    objs[(size // 2) * size + size - 1] = env.carrying  # what the agent holds shows in its own cell
    image = bytearray(3 * size * size)  # unseen cells stay (0, 0, 0)
    for k in (range(size * size) if mask is None else itertools.compress(range(size * size), mask)):
        v = objs[k]
        image[3 * k:3 * k + 3] = _EMPTY if v is None else v.encode()
    return {"image": np.frombuffer(image, np.uint8).reshape(size, size, 3), "direction": env.agent_dir,
            "mission": env.mission}


@functools.lru_cache(maxsize=16)
def _sweep(size: int) -> tuple:
    """``Grid.process_vis``'s visits for a ``size`` view, row by row from the agent's row out: per row its first
    cell index (its cells are every ``size``-th from there) and the (cell, marked, marked, marked) steps of its
    rightward then leftward pass (a mark repeated where the row is the last and marks only one cell)."""
    rows = []
    for j in reversed(range(size)):
        steps = []
        for i in range(size - 1):
            k = i * size + j
            steps.append((k, k + size, k + size - 1 if j > 0 else k + size, k - 1 if j > 0 else k + size))
        for i in reversed(range(1, size)):
            k = i * size + j
            steps.append((k, k - size, k - size - 1 if j > 0 else k - size, k - 1 if j > 0 else k - size))
        rows.append((j, tuple(steps)))
    return tuple(rows)


def _visibility(objs: list, size: int) -> list:
    """MiniGrid's ``Grid.process_vis`` sweep, on the flat view window (cell (i, j) at ``i * size + j``).

    A row with no visible cell ends the sweep: cells are only marked from a visible cell of the row before.
    """
    mask = [False] * (size * size)
    mask[(size // 2) * size + size - 1] = True
    for j, steps in _sweep(size):
        if True not in mask[j::size]:
            break
        for k, a, b, c in steps:
            if mask[k]:
                o = objs[k]
                if o is None or o.see_behind():
                    mask[a] = mask[b] = mask[c] = True
    return mask


def install_fast_obs(env: MiniGridEnv) -> bool:
    """Use :func:`fast_gen_obs` for ``env`` unless its class renders observations its own way."""
    cls = type(env)
    if cls.gen_obs is not MiniGridEnv.gen_obs or cls.gen_obs_grid is not MiniGridEnv.gen_obs_grid:
        return False
    env.gen_obs = functools.partial(fast_gen_obs, env)  # picklable (a bound lambda would not be)
    return True
