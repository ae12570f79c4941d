"""DeepMind Control tasks (dmc:<domain>-<task>): names, gymnasium's env checker, seeded vector envs that
resume mid-episode, pixels, PPO training and resuming on them, and the one-line errors."""

import sys
import warnings

import numpy as np
import pytest
import torch
from gymnasium.utils.env_checker import check_env

from echo_rl import TrainingConfig
from echo_rl.config import ConfigError
from echo_rl.environments.minigrid_vector import actor_seeds, make_vector_env, restore_vector_env, snapshot_vector_env
from echo_rl.environments.registry import gym_task, is_vector_task
from echo_rl.training.agents import build_agent
from tests.resume_helpers import cut_and_resume

CPU = torch.device("cpu")
STATES = {"dmc:cartpole-swingup": (5,), "dmc:walker-walk": (24,), "dmc:reacher-easy": (6,)}


pytestmark = pytest.mark.usefixtures("one_thread")


def needs_dm_control():
    pytest.importorskip("dm_control", reason="the dmc extra: pip install 'echo-rl[dmc]'")


def test_task_names():
    assert gym_task("dmc:cartpole-swingup") == ("dmc", "cartpole-swingup")
    assert gym_task("dmc-pixels:walker-walk") == ("dmc-pixels", "walker-walk")
    assert is_vector_task("dmc:ball_in_cup-catch")


def test_without_dm_control_the_error_is_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "dm_control", None)
    with pytest.raises(ConfigError, match=r"^DeepMind Control tasks need dm_control: pip install 'echo-rl\[dmc\]'$"):
        TrainingConfig(env_name="dmc:cartpole-swingup")


def test_unknown_or_malformed_names_are_one_line():
    needs_dm_control()
    with pytest.raises(ConfigError, match=r"unknown DeepMind Control task 'cartpole-fly' in task 'dmc:cartpole-fly'; "
                                          r"e\.g\. cartpole-swingup"):
        TrainingConfig(env_name="dmc:cartpole-fly")
    with pytest.raises(ConfigError, match="expected <domain>-<task>, e.g. cartpole-swingup"):
        TrainingConfig(env_name="dmc:cartpole")
    with pytest.raises(ConfigError, match="env_config for dmc task 'cartpole-swingup' is invalid"):
        make_vector_env("dmc:cartpole-swingup", 1, frame_skip=2)
    with pytest.raises(ConfigError, match="action_repeat=0 is invalid: must be an int >= 1"):
        make_vector_env("dmc:cartpole-swingup", 1, action_repeat=0)


@pytest.mark.parametrize("task", sorted(STATES))
def test_gymnasiums_env_checker_passes(task):
    needs_dm_control()
    from echo_rl.environments.gym_vector import make_gym_env

    env = make_gym_env(task)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any checker warning fails the test, except:
        warnings.filterwarnings("ignore", message=".*infinity")  # state vectors are unbounded, as the suite's are
        warnings.filterwarnings("ignore", message=".*different from the unwrapped version")  # the wrapped check
        check_env(env.unwrapped, skip_render_check=True, skip_close_check=True)  # the task itself ...
        check_env(env, skip_render_check=True, skip_close_check=True)  # ... and as the agents get it
    assert env.observation_space.shape == STATES[task] and env.observation_space.dtype == np.float32
    assert env.action_space.dtype == np.float32 and env.action_space.shape[0] >= 1
    env.close()
    env.close()


@pytest.mark.parametrize("task", ["dmc:cartpole-swingup", "dmc:reacher-easy"])  # reacher: a per-episode target
def test_vector_envs_are_seeded_and_resume_mid_episode_and_across_episodes(task):
    needs_dm_control()

    def run(envs, steps, rng):
        out = []
        for _ in range(steps):
            obs, rew, term, trunc, _ = envs.step(rng.uniform(-1.5, 1.5, (envs.num_envs, *envs.single_action_space.shape)))
            out.append((obs.copy(), rew.copy(), term.copy(), trunc.copy()))
        return out

    n, options = 2, {"action_repeat": 8}  # 125 env steps an episode
    a, b, c = (make_vector_env(task, n, **options) for _ in range(3))
    try:
        obs_a, _ = a.reset(seed=actor_seeds(3, n))
        obs_b, _ = b.reset(seed=actor_seeds(3, n))
        assert np.array_equal(obs_a, obs_b) and not np.array_equal(obs_a[0], obs_a[1])
        assert np.array_equal(run(a, 5, np.random.default_rng(0))[-1][0], run(b, 5, np.random.default_rng(0))[-1][0])
        restored = restore_vector_env(snapshot_vector_env(a))
        try:
            ref, again = run(a, 160, np.random.default_rng(1)), run(restored, 160, np.random.default_rng(1))
            assert any(step[3].any() for step in ref)  # an episode ended (time limit: truncation) and a new began
            assert all(np.array_equal(x, y) for r, g in zip(ref, again) for x, y in zip(r, g))
        finally:
            restored.close()
        c.reset(seed=actor_seeds(4, n))
        assert not np.array_equal(run(c, 8, np.random.default_rng(1))[-1][0], ref[7][0])
    finally:
        for envs in (a, b, c):
            envs.close()


def test_pixels_render_or_fail_in_one_line():
    needs_dm_control()
    from echo_rl.environments.dmc import DMCEnv, GL_HINT

    try:
        envs = make_vector_env("dmc-pixels:cartpole-swingup", 1, height=64, width=48)
    except ConfigError as exc:  # no headless OpenGL on this machine: the documented one line
        assert str(exc).startswith(GL_HINT)
    else:
        obs, _ = envs.reset(seed=[0])
        assert obs.shape == (1, 64, 48, 3) and obs.dtype == np.uint8 and obs.std() > 0
        envs.close()
    env = DMCEnv("cartpole-swingup", pixels=True)

    def broken(*args, **kwargs):
        raise RuntimeError("no OpenGL context")

    env._env.physics.render = broken
    with pytest.raises(ConfigError, match=r"^dmc-pixels needs headless OpenGL: MUJOCO_GL=egl with libEGL"):
        env.reset(seed=0)
    env.close()


def test_ppo_trains_on_a_dmc_task_and_resumes_bit_exactly(tmp_path):
    needs_dm_control()
    config = TrainingConfig(env_name="dmc:cartpole-swingup", agent="ppo", num_actors=2, batch_size=64,
                            total_timesteps=512, seed=1, env_config={"action_repeat": 8}, loggers=[])
    whole = build_agent(config, CPU)
    try:
        rows_whole = [whole.train_iteration() for _ in range(3)]
        weights = {k: v.clone() for k, v in whole.network.state_dict().items()}
    finally:
        whole.close()
    assert "distribution.log_std" in weights and all(np.isfinite(r["loss/value"]) for r in rows_whole)

    def check(resumed, rows):
        assert rows == rows_whole
        assert all(torch.equal(v, weights[k]) for k, v in resumed.network.state_dict().items())

    cut_and_resume(config, tmp_path / "run", 1, 2, check)


def pixels_or_skip(task: str, n: int = 1, **options):
    try:
        return make_vector_env(task, n, **options)
    except ConfigError as exc:
        from echo_rl.environments.dmc import GL_HINT

        assert str(exc).startswith(GL_HINT)
        pytest.skip("no headless OpenGL here")


def test_stacked_frames_slide_and_resume_mid_episode():
    needs_dm_control()
    envs = pixels_or_skip("dmc-pixels:cartpole-swingup", 1, height=32, width=32, frame_stack=3, action_repeat=8)
    try:
        assert envs.single_observation_space.shape == (32, 32, 9)
        obs, _ = envs.reset(seed=[0])
        first = obs[0, :, :, :3]
        assert all(np.array_equal(obs[0, :, :, 3 * i:3 * i + 3], first) for i in range(3))  # a reset repeats frame 1
        rng = np.random.default_rng(0)
        frames = [obs]
        for _ in range(3):
            frames.append(envs.step(rng.uniform(-1, 1, (1, 1)))[0])
        newest, previous = frames[-1][0], frames[-2][0]
        assert np.array_equal(newest[:, :, :6], previous[:, :, 3:])  # oldest first: the window slides by one frame
        assert not np.array_equal(newest[:, :, 6:], previous[:, :, 6:])
        restored = restore_vector_env(snapshot_vector_env(envs))
        try:
            action = rng.uniform(-1, 1, (1, 1))
            assert np.array_equal(envs.step(action)[0], restored.step(action)[0])  # the stack travels in snapshots
        finally:
            restored.close()
    finally:
        envs.close()


def test_stacked_fast_pixels_pass_gymnasiums_checker():
    needs_dm_control()
    pixels_or_skip("dmc-pixels:cartpole-swingup", 1, height=48, width=48).close()
    from echo_rl.environments.gym_vector import make_gym_env

    env = make_gym_env("dmc-pixels:cartpole-swingup", height=48, width=48, frame_stack=3, render_quality="fast")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", message=".*different from the unwrapped version")
        check_env(env.unwrapped, skip_render_check=True, skip_close_check=True)
        check_env(env, skip_render_check=True, skip_close_check=True)
    assert env.observation_space.shape == (48, 48, 9) and env.observation_space.dtype == np.uint8
    env.close()


def test_fast_render_quality_is_close_to_the_suites_frames():
    needs_dm_control()
    suite_envs = pixels_or_skip("dmc-pixels:cartpole-swingup", 1, height=48, width=48)
    fast_envs = pixels_or_skip("dmc-pixels:cartpole-swingup", 1, height=48, width=48, render_quality="fast")
    try:
        a, b = suite_envs.reset(seed=[0])[0].astype(int), fast_envs.reset(seed=[0])[0].astype(int)
        assert 0 < np.abs(a - b).mean() < 8  # no shadows or reflections: different frames, the same scene
    finally:
        suite_envs.close()
        fast_envs.close()


def test_bad_pixel_options_are_one_line():
    needs_dm_control()
    with pytest.raises(ConfigError, match=r"^env_config render_quality='best' is invalid: allowed: suite, fast$"):
        make_vector_env("dmc-pixels:cartpole-swingup", 1, render_quality="best")
    with pytest.raises(ConfigError, match=r"^env_config frame_stack=0 is invalid: must be an int >= 1$"):
        make_vector_env("dmc-pixels:cartpole-swingup", 1, frame_stack=0)
    with pytest.raises(ConfigError, match=r"frame_stack=3 is invalid for dmc:cartpole-swingup: only dmc-pixels"):
        make_vector_env("dmc:cartpole-swingup", 1, frame_stack=3)


@pytest.mark.parametrize("shape, layout", [((84, 84, 9), (9, 84, 84, True)), ((56, 56, 3), (3, 56, 56, True)),
                                           ((4, 84, 84), (4, 84, 84, False)), ((3, 64, 48), (3, 64, 48, False))])
def test_image_layout_takes_the_short_axis_as_channels(shape, layout):
    from echo_rl.models.encoders import image_layout

    assert image_layout(shape) == layout
