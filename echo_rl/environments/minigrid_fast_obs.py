"""A faster MiniGrid observation, identical to ``MiniGridEnv.gen_obs``.

MiniGrid builds each egocentric view by slicing the grid into new ``Grid``
objects, rotating them ``agent_dir + 1`` times and encoding the result, all in
Python: about 80% of an env step. This computes the same (7, 7, 3) image by
mapping each view cell straight to its world cell (one cached offset table per
direction), running MiniGrid's own visibility sweep on that small window, and
writing the encodings into one byte buffer. Tests check it against ``gen_obs``
step by step on many env families; envs that override ``gen_obs`` or
``gen_obs_grid`` keep their own.
"""

from __future__ import annotations

import functools

import numpy as np
from minigrid.core.constants import DIR_TO_VEC, OBJECT_TO_IDX
from minigrid.core.world_object import Wall
from minigrid.minigrid_env import MiniGridEnv

_WALL = Wall()
_EMPTY = (OBJECT_TO_IDX["empty"], 0, 0)


@functools.lru_cache(maxsize=64)
def _view_offsets(size: int, direction: int) -> tuple[tuple[int, int], ...]:
    """World offset of each view cell, flat in ``image[i, j]`` order (column i, row j; agent at (half, size-1))."""
    half = size // 2
    dx, dy = (int(v) for v in DIR_TO_VEC[direction])
    rx, ry = -dy, dx  # the agent's right
    return tuple(((size - 1 - j) * dx + (i - half) * rx, (size - 1 - j) * dy + (i - half) * ry)
                 for i in range(size) for j in range(size))


def fast_gen_obs(env: MiniGridEnv) -> dict:
    size = env.agent_view_size
    ax, ay = (int(v) for v in env.agent_pos)
    width, height, cells = env.grid.width, env.grid.height, env.grid.grid
    objs = [cells[(ay + oy) * width + ax + ox] if 0 <= ax + ox < width and 0 <= ay + oy < height else _WALL
            for ox, oy in _view_offsets(size, env.agent_dir)]
    mask = _visibility(objs, size) if not env.see_through_walls else None
    objs[(size // 2) * size + size - 1] = env.carrying  # what the agent holds shows in its own cell
    image = bytearray(3 * size * size)  # unseen cells stay (0, 0, 0)
    for k, v in enumerate(objs):
        if mask is None or mask[k]:
            image[3 * k:3 * k + 3] = _EMPTY if v is None else v.encode()
    return {"image": np.frombuffer(image, np.uint8).reshape(size, size, 3), "direction": env.agent_dir,
            "mission": env.mission}


def _visibility(objs: list, size: int) -> list:
    """MiniGrid's ``Grid.process_vis`` sweep, on the flat view window (cell (i, j) at ``i * size + j``)."""
    mask = [False] * (size * size)
    mask[(size // 2) * size + size - 1] = True
    for j in reversed(range(size)):
        for i in range(size - 1):
            k = i * size + j
            if not mask[k]:
                continue
            c = objs[k]
            if c is not None and not c.see_behind():
                continue
            mask[k + size] = True
            if j > 0:
                mask[k + size - 1] = True
                mask[k - 1] = True
        for i in reversed(range(1, size)):
            k = i * size + j
            if not mask[k]:
                continue
            c = objs[k]
            if c is not None and not c.see_behind():
                continue
            mask[k - size] = True
            if j > 0:
                mask[k - size - 1] = True
                mask[k - 1] = True
    return mask


def install_fast_obs(env: MiniGridEnv) -> bool:
    """Use :func:`fast_gen_obs` for ``env`` unless its class renders observations its own way."""
    cls = type(env)
    if cls.gen_obs is not MiniGridEnv.gen_obs or cls.gen_obs_grid is not MiniGridEnv.gen_obs_grid:
        return False
    env.gen_obs = functools.partial(fast_gen_obs, env)  # picklable (a bound lambda would not be)
    return True
