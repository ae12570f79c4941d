"""MiniGrid for small vector policies: flat uint8 observations, seeded vector envs.

Observation layout (``MiniGridObsEncoding``): the 7x7x3 egocentric image
(object, colour, state indices), the agent's direction, and a bag of mission
words (constant where the mission never changes, so harmless there). Keeping
it as small integers lets the policy embed each index instead of one-hot
expanding ~1k floats per step.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
from gymnasium.vector import AsyncVectorEnv, VectorEnv

from echo_rl.config import ConfigError
from echo_rl.environments.minigrid_fast_obs import install_fast_obs
from echo_rl.environments.minigrid_state import minigrid_snapshot, restore_minigrid
from echo_rl.environments.registry import check_task_name, gym_task, minigrid_id
from echo_rl.environments.sync_vector import vector_env
from echo_rl.utils.state_codec import dumps, loads

# Words that occur in MiniGrid / BabyAI missions; anything else maps to the last slot.
MISSION_VOCAB = (
    "red green blue purple yellow grey key ball box door goal wall lava square object "
    "go to the a pick up open put next use and then get avoid reach get unlock toggle "
    "you your behind in front of left right on after match fetch"
).split()
_WORD_INDEX = {w: i for i, w in enumerate(MISSION_VOCAB)}


@dataclass(frozen=True)
class MiniGridObsEncoding:
    """Sizes of the flat observation and the value range of each part."""

    view: int = 7
    image_channels: int = 3
    num_objects: int = 11  # minigrid.core.constants.OBJECT_TO_IDX
    num_colors: int = 6
    num_states: int = 3
    num_directions: int = 4
    mission_words: int = len(MISSION_VOCAB) + 1

    @property
    def image_size(self) -> int:
        return self.view * self.view * self.image_channels

    @property
    def size(self) -> int:
        return self.image_size + 1 + self.mission_words


def _mission_bag(mission: str, size: int) -> np.ndarray:
    bag = np.zeros(size, dtype=np.uint8)
    for word in re.findall(r"[a-z]+", mission.lower()):
        bag[_WORD_INDEX.get(word, size - 1)] = 1
    return bag


class FlatMiniGridObs(gym.ObservationWrapper):
    """Dict MiniGrid observation -> flat uint8 vector (image, direction, mission words)."""

    def __init__(self, env: gym.Env, encoding: MiniGridObsEncoding = MiniGridObsEncoding()):
        super().__init__(env)
        self.encoding = encoding
        image_space = env.observation_space["image"]
        if image_space.shape != (encoding.view, encoding.view, encoding.image_channels):
            raise ConfigError(f"MiniGrid view {image_space.shape} is not supported; use the default agent_view_size=7")
        self.observation_space = gym.spaces.Box(0, 255, (encoding.size,), np.uint8)
        self._mission = None
        self._bag = None

    def snapshot(self) -> dict:
        """The env mid-episode (grid, agent, RNG) as plain JSON data (``minigrid_state``): how checkpoints carry
        envs. Levels with state that format does not hold are pickled; the checkpoint writer then signs them."""
        snap = minigrid_snapshot(self)
        if snap is not None:
            return snap
        return {"format": "pickle", "blob": dumps(self)}

    def step(self, action):
        # A Python int: MiniGrid compares the action with ``Actions`` members six times a step, and a
        # numpy integer against an IntEnum member costs ~1 µs of numpy's protocol probing each time.
        return super().step(int(action))

    def observation(self, obs: dict) -> np.ndarray:
        if obs["mission"] != self._mission:  # missions rarely change: cache the bag
            self._mission = obs["mission"]
            self._bag = _mission_bag(self._mission, self.encoding.mission_words)
        out = np.empty(self.encoding.size, dtype=np.uint8)
        out[: self.encoding.image_size] = obs["image"].reshape(-1)
        out[self.encoding.image_size] = obs["direction"]
        out[self.encoding.image_size + 1:] = self._bag
        return out


def make_minigrid_env(task: str = "minigrid", fast_obs: bool = True, **env_kwargs) -> gym.Env:
    """One MiniGrid env with flat observations; ``task`` as in ``TrainingConfig.env_name``.

    ``fast_obs`` renders the egocentric view with :mod:`minigrid_fast_obs`
    (identical observations, ~4x cheaper env steps); False keeps MiniGrid's own.
    """
    check_task_name(task)
    env_id = minigrid_id(task)
    if env_id is None:
        raise ConfigError(f"task {task!r} is not a MiniGrid task")
    try:
        env = gym.make(env_id, **env_kwargs)
    except TypeError as exc:
        raise ConfigError(f"env_config for {env_id} is invalid: {exc}") from None
    if fast_obs:
        install_fast_obs(env.unwrapped)
    return FlatMiniGridObs(env)


def actor_seeds(seed: int, num_envs: int) -> list[int]:
    """Per-env seeds derived from the run seed (never from os.urandom)."""
    return [seed + 10_000 * i for i in range(num_envs)]


def make_vector_env(task: str, num_envs: int, asynchronous: bool = False, **env_kwargs) -> VectorEnv:
    """``num_envs`` copies; reset them with ``seed=actor_seeds(seed, num_envs)``.

    Same-step autoreset: a finished episode's last observation arrives in
    ``info["final_obs"]`` (so truncation can bootstrap from V(final_obs)) and
    the returned observation already belongs to the next episode.
    ``asynchronous`` steps the envs in worker processes (shared memory).
    Gymnasium tasks (``gym:``, ``minigrid-pixels:``, ``atari:``) are built by
    :mod:`echo_rl.environments.gym_vector` the same way.
    """
    if gym_task(task) is not None:
        from echo_rl.environments.gym_vector import make_gym_vector_env  # needed on this path only

        return make_gym_vector_env(task, num_envs, asynchronous, **env_kwargs)
    factory = functools.partial(make_minigrid_env, task, **env_kwargs)  # picklable, unlike a lambda
    return vector_env([factory] * num_envs, asynchronous)


def snapshot_vector_env(envs: VectorEnv) -> dict:
    """State of every env (works for in-process and worker-process envs); see ``FlatMiniGridObs.snapshot``."""
    return {"asynchronous": isinstance(envs, AsyncVectorEnv), "envs": list(envs.call("snapshot"))}


def restore_env(snapshot: dict) -> gym.Env:
    """One env from its snapshot. A ``pickle`` snapshot's blob is unpickled only when it is ``Signed``: made by
    this process or read from a checkpoint whose signature matched (``state_codec.loads``)."""
    if snapshot.get("format") == "pickle":
        return loads(snapshot.get("blob"), "an env snapshot's blob")
    return restore_minigrid(snapshot, make_minigrid_env)


def restore_vector_env(snapshot: dict) -> VectorEnv:
    if type(snapshot) is not dict or type(snapshot.get("envs")) is not list or not snapshot["envs"]:
        raise ValueError("vector env snapshot holds no envs")
    if any(type(s) is not dict for s in snapshot["envs"]):
        raise ValueError("vector env snapshot entries must be env snapshots")
    restore_env(snapshot["envs"][0]).close()  # a bad snapshot fails here, not in a worker process
    fns = [functools.partial(restore_env, s) for s in snapshot["envs"]]
    return vector_env(fns, bool(snapshot["asynchronous"]))
