"""SameStepSyncVectorEnv's lean step returns exactly what gymnasium's SyncVectorEnv returns."""

import functools

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from echo_rl.environments.gym_vector import make_gym_env
from echo_rl.environments.minigrid_vector import make_minigrid_env, make_vector_env
from echo_rl.environments.sync_vector import SameStepSyncVectorEnv


class InfoEnv(gym.Env):
    """Ends episodes at random and reports infos (numbers, arrays, nested dicts) on some steps only."""

    observation_space = gym.spaces.Box(-10, 10, (3,), np.float32)
    action_space = gym.spaces.Discrete(3)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self.np_random.standard_normal(3).astype(np.float32), {"start": 1}

    def step(self, action):
        r = self.np_random.random()
        info = {} if r < 0.5 else {"score": float(r), "vec": np.full(2, r), "nested": {"k": int(action)}}
        obs = self.np_random.standard_normal(3).astype(np.float32) + action
        return obs, float(r), r > 0.9, 0.8 < r <= 0.9, info


def _assert_same(a, b):
    if isinstance(a, tuple):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _assert_same(x, y)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _assert_same(a[k], b[k])
    elif isinstance(a, np.ndarray) and a.dtype == object:
        assert a.shape == b.shape
        for x, y in zip(a, b):
            _assert_same(x, y)
    else:
        np.testing.assert_array_equal(a, b)
        assert getattr(a, "dtype", None) == getattr(b, "dtype", None)


@pytest.mark.parametrize("make, actions", [
    (functools.partial(make_minigrid_env, "minigrid:MiniGrid-DoorKey-5x5-v0", max_steps=15), lambda g: g.integers(0, 7, 4)),
    (functools.partial(make_gym_env, "gym:Pendulum-v1"), lambda g: g.uniform(-2, 2, (4, 1)).astype(np.float32)),
    (InfoEnv, lambda g: g.integers(0, 3, 4)),
])
def test_lean_step_matches_gymnasiums(make, actions):
    ours = SameStepSyncVectorEnv([make] * 4)
    stock = SyncVectorEnv([make] * 4, autoreset_mode=AutoresetMode.SAME_STEP)
    assert ours._lean  # the lean path is the one under test
    _assert_same(ours.reset(seed=[1, 2, 3, 4]), stock.reset(seed=[1, 2, 3, 4]))
    g = np.random.default_rng(0)
    finished, kept = 0, []
    for _ in range(300):
        a = actions(g)
        out, ref = ours.step(a), stock.step(a)
        _assert_same(out, ref)
        finished += int((ref[2] | ref[3]).sum())
        kept.append((out[0], ref[0]))
    assert finished > 0  # the autoreset path ran
    for mine, theirs in kept:  # returned batches are copies: later steps did not overwrite them
        np.testing.assert_array_equal(mine, theirs)
    ours.close(), stock.close()


def test_make_vector_env_steps_in_process_with_it():
    envs = make_vector_env("minigrid:MiniGrid-Empty-5x5-v0", 2)
    assert isinstance(envs, SameStepSyncVectorEnv) and envs.autoreset_mode == AutoresetMode.SAME_STEP
    envs.close()
