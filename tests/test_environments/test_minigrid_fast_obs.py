import pickle

import gymnasium as gym
import minigrid  # noqa: F401
import numpy as np
import pytest
from minigrid.minigrid_env import MiniGridEnv

from echo_rl.environments.minigrid_fast_obs import fast_gen_obs, install_fast_obs
from echo_rl.environments.minigrid_vector import make_minigrid_env

ENV_IDS = ["MiniGrid-DoorKey-8x8-v0", "MiniGrid-KeyCorridorS3R1-v0", "MiniGrid-MultiRoom-N2-S4-v0",
           "MiniGrid-LavaGapS5-v0", "MiniGrid-FourRooms-v0", "MiniGrid-Unlock-v0", "MiniGrid-RedBlueDoors-6x6-v0",
           "MiniGrid-ObstructedMaze-1Dlhb-v0", "MiniGrid-Fetch-5x5-N2-v0", "BabyAI-GoToLocal-v0"]


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_fast_observation_equals_minigrid_gen_obs(env_id):
    env = gym.make(env_id).unwrapped
    rng = np.random.default_rng(0)
    steps = 0
    for seed in range(50):
        if steps >= 300:
            break
        env.reset(seed=seed)
        for _ in range(150):
            ref, fast = MiniGridEnv.gen_obs(env), fast_gen_obs(env)
            np.testing.assert_array_equal(fast["image"], ref["image"])
            assert (fast["direction"], fast["mission"]) == (ref["direction"], ref["mission"])
            # bias towards pickup/toggle so carried objects and open doors are covered
            action = int(rng.choice(7, p=[0.2, 0.2, 0.3, 0.1, 0.05, 0.15, 0.0]))
            _, _, term, trunc, _ = env.step(action)
            steps += 1
            if term or trunc:
                break
    assert steps >= 300


def test_adapter_uses_fast_obs_and_stays_picklable():
    env = make_minigrid_env("minigrid:MiniGrid-DoorKey-5x5-v0")
    assert env.unwrapped.__dict__.get("gen_obs") is not None
    env.reset(seed=1)
    clone = pickle.loads(pickle.dumps(env))
    for a in [2, 1, 2, 3, 5, 2]:
        o1, *_ = env.step(a)
        o2, *_ = clone.step(a)
        np.testing.assert_array_equal(o1, o2)


def test_stock_observation_on_request_and_overriding_envs_are_left_alone():
    env = make_minigrid_env("minigrid:MiniGrid-DoorKey-5x5-v0", fast_obs=False)
    assert "gen_obs" not in env.unwrapped.__dict__

    class Custom(type(gym.make("MiniGrid-Empty-5x5-v0").unwrapped)):
        def gen_obs(self):
            return super().gen_obs()

    assert install_fast_obs(Custom()) is False


@pytest.mark.parametrize("size", [3, 5, 7, 9])
def test_visibility_sweep_equals_minigrid_process_vis(size):
    from minigrid.core.grid import Grid
    from minigrid.core.world_object import Ball, Door, Wall

    from echo_rl.environments.minigrid_fast_obs import _visibility

    rng = np.random.default_rng(size)
    kinds = [lambda: None, Wall, lambda: Door("red", is_open=True), lambda: Door("red"), lambda: Ball("blue")]
    for trial in range(400):
        grid = Grid(size, size)
        p_empty = rng.uniform(0.2, 0.9)  # from open rooms to walls everywhere: early and late ends of the sweep
        for i in range(size):
            for j in range(size):
                grid.set(i, j, None if rng.random() < p_empty else kinds[rng.integers(1, len(kinds))]())
        objs = [grid.get(i, j) for i in range(size) for j in range(size)]
        ours = np.array(_visibility(objs, size)).reshape(size, size)
        np.testing.assert_array_equal(ours, grid.process_vis((size // 2, size - 1)), err_msg=f"trial {trial}")
