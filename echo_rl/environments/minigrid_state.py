"""A MiniGrid env mid-episode as plain JSON data, so checkpoints need no pickle.

The snapshot holds what a MiniGrid episode changes: every grid cell (object
type, colour, door open/locked, box contents, positions), the agent's position,
direction and carried object, the step count, the mission, the env's
``np_random`` bit-generator state, and the small counters of gymnasium's
wrappers. Everything else is rebuilt from the env id and constructor kwargs.
An env with state outside that (custom objects, room lists, obstacle lists:
some MiniGrid/BabyAI levels) gets ``None`` from :func:`minigrid_snapshot`; the
caller then keeps a signed pickle instead (``echo_rl.utils.state_codec``).
"""

from __future__ import annotations

import json
from typing import Any, Callable

import numpy as np

FORMAT = "minigrid-json/1"
# Attributes of MiniGridEnv that an episode changes; all others must be static (as in a fresh env) or plain values.
_DYNAMIC = {"_np_random", "_np_random_seed", "agent_dir", "agent_pos", "carrying", "grid", "mission", "step_count"}
_SKIP = {"gen_obs", "spec", "window", "clock"}  # fast-obs hook (re-installed), env spec, render handles (None)
_OBJ_ATTRS = {"type", "color", "contains", "init_pos", "cur_pos", "is_open", "is_locked"}
_BIT_GENERATORS = ("PCG64", "PCG64DXSM", "SFC64", "Philox")


class Unsupported(Exception):
    """The env holds state this format does not describe."""


def _plain(value: Any) -> bool:
    if value is None or type(value) in (bool, int, float, str):
        return True
    if type(value) is np.ndarray:
        return value.dtype.kind in "biuf" and value.ndim <= 2
    if type(value) in (list, tuple):
        return all(_plain(v) for v in value)
    return False


def _enc_plain(value: Any) -> Any:
    """Plain value -> JSON, tuples kept apart from lists."""
    if type(value) is tuple:
        return {"tuple": [_enc_plain(v) for v in value]}
    if type(value) is np.ndarray:
        return {"ndarray": value.tolist(), "dtype": value.dtype.str, "shape": list(value.shape)}
    if type(value) is list:
        return [_enc_plain(v) for v in value]
    return value


def _dec_plain(value: Any) -> Any:
    if type(value) is dict and set(value) == {"ndarray", "dtype", "shape"}:
        dtype = np.dtype(str(value["dtype"]))
        if dtype.kind not in "biuf":
            raise ValueError(f"bad array dtype {dtype}")
        return np.array(value["ndarray"], dtype=dtype).reshape([int(n) for n in value["shape"]])
    if type(value) is dict:
        if set(value) != {"tuple"} or type(value["tuple"]) is not list:
            raise ValueError(f"bad plain value {value!r}")
        return tuple(_dec_plain(v) for v in value["tuple"])
    if type(value) is list:
        return [_dec_plain(v) for v in value]
    if value is None or type(value) in (bool, int, float, str):
        return value
    raise ValueError(f"bad plain value {value!r}")


def _enc_pos(pos: Any) -> Any:
    if pos is None:
        return None
    if isinstance(pos, np.ndarray):
        if pos.shape != (2,) or pos.dtype.kind not in "iu":
            raise Unsupported(f"position {pos!r}")
        return {"nd": [int(v) for v in pos], "dtype": pos.dtype.str}
    if isinstance(pos, (tuple, list)) and len(pos) == 2 and all(isinstance(v, (int, np.integer)) for v in pos):
        return {"xy": [int(v) for v in pos], "np": [isinstance(v, np.integer) for v in pos]}
    raise Unsupported(f"position {pos!r}")


def _dec_pos(data: Any) -> Any:
    if data is None:
        return None
    if "nd" in data:
        return np.array([int(v) for v in data["nd"]], dtype=np.dtype(str(data["dtype"])))
    return tuple(np.int64(int(v)) if flag else int(v) for v, flag in zip(data["xy"], data["np"], strict=True))


def _classes() -> dict:
    from minigrid.core import world_object as wo

    return {"wall": wo.Wall, "floor": wo.Floor, "door": wo.Door, "key": wo.Key, "ball": wo.Ball, "box": wo.Box,
            "goal": wo.Goal, "lava": wo.Lava}


def _enc_obj(obj: Any, classes: dict, seen: set) -> Any:
    if obj is None:
        return None
    if classes.get(getattr(obj, "type", None)) is not type(obj) or not set(vars(obj)) <= _OBJ_ATTRS or id(obj) in seen:
        raise Unsupported(f"world object {obj!r}")
    seen.add(id(obj))
    out = {"type": obj.type, "color": obj.color, "init_pos": _enc_pos(obj.init_pos), "cur_pos": _enc_pos(obj.cur_pos),
           "contains": _enc_obj(obj.contains, classes, seen)}
    if obj.type == "door":
        out.update(is_open=bool(obj.is_open), is_locked=bool(obj.is_locked))
    return out


def _dec_obj(data: Any, classes: dict) -> Any:
    from minigrid.core.constants import COLOR_NAMES

    if data is None:
        return None
    cls, color = classes.get(data["type"]), data["color"]
    if cls is None or color not in COLOR_NAMES:
        raise ValueError(f"unknown world object {data['type']!r} / colour {color!r}")
    if data["type"] == "lava":
        obj = cls()
    elif data["type"] == "door":
        obj = cls(color, is_open=bool(data["is_open"]), is_locked=bool(data["is_locked"]))
    else:
        obj = cls(color)
    obj.color = color
    obj.init_pos, obj.cur_pos = _dec_pos(data["init_pos"]), _dec_pos(data["cur_pos"])
    obj.contains = _dec_obj(data["contains"], classes)
    return obj


def _layers(env) -> list:
    out = []
    while hasattr(env, "env"):
        out.append(env)
        env = env.env
    return out


def minigrid_snapshot(flat_env) -> dict | None:
    """``FlatMiniGridObs`` env -> JSON-able dict, or None if its state is more than this format holds."""
    import gymnasium as gym
    from minigrid.core.grid import Grid

    env = flat_env.unwrapped
    spec = env.spec
    if spec is None or not _plain(list(spec.kwargs.values())) or not all(type(k) is str for k in spec.kwargs):
        return None
    try:
        fresh = gym.make(spec.id, **spec.kwargs).unwrapped
        try:
            extras = {}
            for name, value in vars(env).items():
                if name in _DYNAMIC or name in _SKIP:
                    continue
                if _plain(value):
                    extras[name] = _enc_plain(value)
                elif not _same(value, vars(fresh).get(name, _MISSING)):
                    raise Unsupported(name)
        finally:
            fresh.close()
        classes, seen = _classes(), set()
        grid = env.grid
        if type(grid) is not Grid or set(vars(grid)) != {"width", "height", "grid"}:
            raise Unsupported("grid")
        rng = env.np_random.bit_generator
        if type(rng).__name__ not in _BIT_GENERATORS:
            raise Unsupported("bit generator")
        wrappers = [{"class": type(w).__name__, "attrs": {k: v for k, v in vars(w).items()
                                                          if type(v) in (bool, int, float, str)}}
                    for w in _layers(flat_env.env)]
        snap = {
            "format": FORMAT, "env_id": spec.id, "kwargs": {k: _enc_plain(v) for k, v in spec.kwargs.items()},
            "fast_obs": "gen_obs" in vars(env),
            "width": grid.width, "height": grid.height, "cells": [_enc_obj(o, classes, seen) for o in grid.grid],
            "agent_pos": _enc_pos(env.agent_pos), "agent_dir": int(env.agent_dir),
            "carrying": _enc_obj(env.carrying, classes, seen), "step_count": int(env.step_count),
            "mission": env.mission, "np_random": rng.state,
            "np_random_seed": _enc_plain(getattr(env, "_np_random_seed", None)),
            "extras": extras, "wrappers": wrappers,
        }
        if type(env.mission) is not str:
            raise Unsupported("mission")
        json.dumps(snap)
    except (Unsupported, TypeError, ValueError, AttributeError):
        return None
    return snap


_MISSING = object()


def _same(a: Any, b: Any) -> bool:
    if a is b:
        return True
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - arrays and odd __eq__: not provably equal
        return False


def restore_minigrid(snap: dict, make_minigrid_env: Callable[..., Any]):
    """The env a :func:`minigrid_snapshot` describes, rebuilt by ``make_minigrid_env(env_id, fast_obs=, **kwargs)``
    (``minigrid_vector``'s, which calls this module); the env id must be a registered MiniGrid/BabyAI id."""
    from minigrid.core.grid import Grid

    if snap.get("format") != FORMAT:
        raise ValueError(f"env snapshot format {snap.get('format')!r} is not {FORMAT!r}")
    env_id, kwargs = snap["env_id"], snap["kwargs"]
    if type(env_id) is not str or not env_id.startswith(("MiniGrid-", "BabyAI-")) or type(kwargs) is not dict:
        raise ValueError(f"env snapshot names env {env_id!r}; only MiniGrid-/BabyAI- ids are restored")
    kwargs = {str(k): _dec_plain(v) for k, v in kwargs.items()}
    flat = make_minigrid_env(env_id, fast_obs=bool(snap["fast_obs"]), **kwargs)
    env = flat.unwrapped
    width, height, cells = int(snap["width"]), int(snap["height"]), snap["cells"]
    if not (3 <= width <= 1024 and 3 <= height <= 1024) or len(cells) != width * height:
        raise ValueError(f"env snapshot grid {width}x{height} has {len(cells)} cells")
    classes = _classes()
    grid = Grid(width, height)
    grid.grid = [_dec_obj(c, classes) for c in cells]
    env.grid = grid
    env.agent_pos, env.agent_dir = _dec_pos(snap["agent_pos"]), int(snap["agent_dir"])
    env.carrying, env.step_count = _dec_obj(snap["carrying"], classes), int(snap["step_count"])
    env.mission = str(snap["mission"])
    state = snap["np_random"]
    name = state.get("bit_generator") if type(state) is dict else None
    if name not in _BIT_GENERATORS:
        raise ValueError(f"env snapshot bit generator {name!r} is not one of {_BIT_GENERATORS}")
    bit_gen = getattr(np.random, name)()
    bit_gen.state = state
    env._np_random = np.random.Generator(bit_gen)
    env._np_random_seed = _dec_plain(snap["np_random_seed"])
    for name, value in snap["extras"].items():
        if name.startswith("__") or name in _DYNAMIC or name in _SKIP:
            raise ValueError(f"env snapshot sets attribute {name!r}")
        setattr(env, name, _dec_plain(value))
    layers = _layers(flat.env)
    if [type(w).__name__ for w in layers] != [w["class"] for w in snap["wrappers"]]:
        raise ValueError("env snapshot's wrappers differ from the env its id builds")
    for layer, saved in zip(layers, snap["wrappers"]):
        for name, value in saved["attrs"].items():
            if name.startswith("__") or not hasattr(layer, name) or type(value) not in (bool, int, float, str):
                raise ValueError(f"env snapshot sets wrapper attribute {name!r}")
            setattr(layer, name, value)
    return flat
