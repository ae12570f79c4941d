"""Gymnasium tasks beyond symbolic MiniGrid for the vector agents: classic control, MiniGrid from pixels, Atari.

Task names (``TrainingConfig.env_name``, ``--task``; parsed by
:func:`echo_rl.environments.registry.gym_task`):

- ``gym:<EnvId>``: any gymnasium env with a Box observation and Discrete or
  (for PPO) 1-D Box actions; the classic-control ids (``CartPole-v1``,
  ``Acrobot-v1``, ``MountainCar-v0``, ``Pendulum-v1``,
  ``MountainCarContinuous-v0``) are accepted bare;
- ``minigrid-pixels:<EnvId>``: MiniGrid's egocentric view rendered as RGB
  (7 tiles x 8 px = 56x56x3 uint8), for the pixel encoders;
- ``atari:<Game>`` (e.g. ``atari:Pong``, or ``atari:ALE/Pong-v5``): ALE via
  ``ale-py`` (``pip install 'echo-rl[atari]'``; its ROMs ship with it), with the
  standard preprocessing of Mnih et al. 2015: 30 no-op starts, frame skip 4
  (max over the last two frames), 84x84 grayscale, 4 stacked frames, sticky
  actions off (v5's default 0.25 is kept only if ``repeat_action_probability``
  is given), episodes end at game over;
- ``dmc:<domain>-<task>`` / ``dmc-pixels:<domain>-<task>``: the DeepMind Control
  Suite from states or pixels (:mod:`echo_rl.environments.dmc`,
  ``pip install 'echo-rl[dmc]'``).

Box actions reach the env through :class:`ClipToBounds`: the agent's unbounded
Gaussian draws are clipped to the action space's bounds there and nowhere else.

Envs are vectorised like MiniGrid's (same-step autoreset, ``final_obs`` in
``info``; seeds from :func:`echo_rl.environments.minigrid_vector.actor_seeds`),
and each carries a ``snapshot()`` (pickled, signed by the checkpoint writer)
so a run on them resumes mid-episode.
"""

from __future__ import annotations

import functools

import gymnasium as gym
import numpy as np
from gymnasium.vector import VectorEnv

from echo_rl.config import ConfigError
from echo_rl.environments.registry import atari_id, gym_task, import_ale
from echo_rl.environments.sync_vector import vector_env
from echo_rl.utils.state_codec import dumps


class Snapshotting(gym.Wrapper, gym.utils.RecordConstructorArgs):
    """Adds ``snapshot()``: the whole env pickled (how checkpoints carry envs without a plain-data form)."""

    def __init__(self, env: gym.Env):
        gym.utils.RecordConstructorArgs.__init__(self)
        gym.Wrapper.__init__(self, env)

    def snapshot(self) -> dict:
        return {"format": "pickle", "blob": dumps(self)}

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        clone = getattr(self.env.unwrapped, "clone_state", None)  # ALE: its own pickle leaves out the emulator RNG
        if clone is not None:
            state["_ale_state"] = clone(include_rng=True)
        return state

    def __setstate__(self, state: dict) -> None:
        ale_state = state.pop("_ale_state", None)
        self.__dict__.update(state)
        if ale_state is not None:
            self.env.unwrapped.restore_state(ale_state)


class ClipToBounds(gym.ActionWrapper, gym.utils.RecordConstructorArgs):
    """Clips Box actions to the space's bounds; unlike gymnasium's ClipAction it keeps the bounded space, so
    the agent and the env checker still see the task's real action space."""

    def __init__(self, env: gym.Env):
        gym.utils.RecordConstructorArgs.__init__(self)
        gym.ActionWrapper.__init__(self, env)

    def action(self, action):
        space = self.action_space
        return np.clip(np.asarray(action, dtype=space.dtype), space.low, space.high)


def _make(env_id: str, **kwargs) -> gym.Env:
    try:
        return gym.make(env_id, **kwargs)
    except TypeError as exc:
        raise ConfigError(f"env_config for {env_id} is invalid: {exc}") from None


def make_minigrid_pixels(env_id: str, tile_size: int = 8, **kwargs) -> gym.Env:
    """MiniGrid's partial view as an RGB image (``tile_size`` pixels per cell)."""
    from minigrid.wrappers import ImgObsWrapper, RGBImgPartialObsWrapper

    return ImgObsWrapper(RGBImgPartialObsWrapper(_make(env_id, **kwargs), tile_size=tile_size))


def make_atari(env_id: str, frame_stack: int = 4, noop_max: int = 30, screen_size: int = 84,
               repeat_action_probability: float = 0.0, **kwargs) -> gym.Env:
    """The Mnih et al. 2015 preprocessing (the ALE env itself skips no frames; AtariPreprocessing does)."""
    import_ale()
    env = _make(env_id, frameskip=1, repeat_action_probability=repeat_action_probability, **kwargs)
    env = gym.wrappers.AtariPreprocessing(env, noop_max=noop_max, frame_skip=4, screen_size=screen_size,
                                          grayscale_obs=True, scale_obs=False, terminal_on_life_loss=False)
    return gym.wrappers.FrameStackObservation(env, frame_stack)


def make_gym_env(task: str, **env_kwargs) -> gym.Env:
    """One env of a gymnasium task (see the module docstring), with ``snapshot()``."""
    parsed = gym_task(task)
    if parsed is None:
        raise ConfigError(f"task {task!r} is not a gymnasium task (gym:<EnvId>, minigrid-pixels:<EnvId>, "
                          f"atari:<Game>, dmc:<domain>-<task>, dmc-pixels:<domain>-<task>)")
    family, env_id = parsed
    if family == "minigrid-pixels":
        env = make_minigrid_pixels(env_id, **env_kwargs)
    elif family in ("dmc", "dmc-pixels"):
        from echo_rl.environments.dmc import make_dmc_env  # needed on this path only

        env = make_dmc_env(env_id, pixels=family == "dmc-pixels", **env_kwargs)
    elif family == "atari":
        env = make_atari(atari_id(env_id), **env_kwargs)
    else:
        env = _make(env_id, **env_kwargs)
    if not isinstance(env.observation_space, gym.spaces.Box):
        name = type(env.observation_space).__name__
        env.close()
        raise ConfigError(f"task {task!r} has {name} observations; the vector agents read Box (array) observations")
    if isinstance(env.action_space, gym.spaces.Box):
        env = ClipToBounds(env)
    return Snapshotting(env)


def make_gym_vector_env(task: str, num_envs: int, asynchronous: bool = False, **env_kwargs) -> VectorEnv:
    """``num_envs`` copies of a gymnasium task, vectorised like MiniGrid's (``minigrid_vector.make_vector_env``)."""
    if asynchronous:  # a bad task or env_config fails here in one line, not in a worker process
        make_gym_env(task, **env_kwargs).close()
    factory = functools.partial(make_gym_env, task, **env_kwargs)
    return vector_env([factory] * num_envs, asynchronous)


__all__ = ["ClipToBounds", "Snapshotting", "atari_id", "make_atari", "make_gym_env", "make_gym_vector_env", "make_minigrid_pixels"]
