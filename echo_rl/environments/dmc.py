"""DeepMind Control Suite tasks as gymnasium envs: ``dmc:<domain>-<task>`` (states), ``dmc-pixels:<domain>-<task>``.

Why a gymnasium adapter: the vector agents, the vector env, seeding and checkpoints all
speak gymnasium; ``dm_control`` speaks ``dm_env``. This module turns one into the other:

- observations: states are the suite's observation dict flattened to one float32 vector
  (in the suite's key order); pixels are ``physics.render`` RGB frames (``height`` x ``width``
  x 3 uint8, default 84x84, ``camera_id`` 0);
  ``frame_stack`` (default 1) stacks the last k frames on the channel axis (H x W x 3k, oldest
  first; a reset repeats its first frame), because one frame shows no velocity (DrQ stacks 3);
  ``render_quality="fast"`` turns off MSAA, shadows and reflections, which makes software
  OpenGL (Mesa's llvmpipe) render ~4x faster; frames then differ from the suite's by about
  1.5/255 per pixel on average, so the default stays ``"suite"``;
- actions: a float32 Box with the suite's bounds (the agent's draws are clipped by
  ``gym_vector.ClipToBounds``); ``action_repeat`` (default 1) repeats each action and sums
  the rewards, as DMC benchmarks do (DrQ: 8 on cartpole, 2 on walker);
- episodes: the suite's time limit (1000 control steps, i.e. ``1000 / action_repeat`` env
  steps) is a truncation; a step with discount 0 (no suite task has one) a termination;
- seeding: ``reset(seed=s)`` reseeds the task's own ``RandomState`` (initial poses, noise);
- snapshots: ``__getstate__`` holds the task name, options, MuJoCo's full integration state
  (``mj_getState``, warm start included, so a resumed run steps bit-identically), the model
  arrays tasks randomise (:data:`MODEL_FIELDS`: reacher's and fish's targets, quadruped's
  terrain), the task's RandomState and the episode's step count, not the 12 MB the pickled
  physics would take.

Needs ``pip install 'echo-rl[dmc]'``. Pixels need headless OpenGL: ``MUJOCO_GL=egl`` (the
default here when unset; libEGL, e.g. Debian's ``libegl1``) or ``MUJOCO_GL=osmesa``
(``libosmesa6``); a missing library fails in one line.
"""

from __future__ import annotations

import os

import gymnasium as gym
import numpy as np

from echo_rl.config import ConfigError

DMC_EXTRA = "pip install 'echo-rl[dmc]'"
#: the model arrays the suite's tasks rewrite per episode (targets, terrain): snapshots carry them too
MODEL_FIELDS = ("body_pos", "geom_pos", "geom_size", "geom_rgba", "site_pos", "site_size", "site_rgba", "light_pos",
                "dof_damping", "hfield_data")
RENDER_QUALITIES = ("suite", "fast")
GL_HINT = ("dmc-pixels needs headless OpenGL: MUJOCO_GL=egl with libEGL (apt-get install libegl1) or "
           "MUJOCO_GL=osmesa with OSMesa (apt-get install libosmesa6)")


def import_suite():
    """dm_control's suite (one line naming the extra when it is not installed)."""
    os.environ.setdefault("MUJOCO_GL", "egl")  # headless: must be set before dm_control first imports
    try:
        from dm_control import suite
    except ImportError:
        raise ConfigError(f"DeepMind Control tasks need dm_control: {DMC_EXTRA}") from None
    return suite


def split_name(name: str) -> tuple[str, str]:
    """``cartpole-swingup`` -> ("cartpole", "swingup"): domains and tasks use underscores, never hyphens."""
    domain, sep, task = name.partition("-")
    if not (domain and sep and task):
        raise ConfigError(f"DeepMind Control task {name!r} is invalid: expected <domain>-<task>, e.g. cartpole-swingup")
    return domain, task


def check_name(name: str, family: str = "dmc") -> None:
    """ConfigError (one line) unless ``name`` is a suite task."""
    suite = import_suite()
    if split_name(name) not in suite.ALL_TASKS:
        raise ConfigError(f"unknown DeepMind Control task {name!r} in task '{family}:{name}'; e.g. cartpole-swingup, "
                          f"walker-walk, cheetah-run "
                          f"(all: python -c 'from dm_control import suite; print(suite.ALL_TASKS)')")


def _flat_dim(spec) -> int:
    return int(np.prod(spec.shape, dtype=np.int64)) if spec.shape else 1


class DMCEnv(gym.Env):
    """One suite task as a gymnasium env (module docstring)."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 50}

    def __init__(self, name: str, pixels: bool = False, action_repeat: int = 1, height: int = 84, width: int = 84,
                 camera_id: int = 0, render_mode: str | None = None, frame_stack: int = 1,
                 render_quality: str = "suite"):
        for key, value in (("action_repeat", action_repeat), ("frame_stack", frame_stack)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"env_config {key}={value!r} is invalid: must be an int >= 1")
        if frame_stack > 1 and not pixels:
            raise ConfigError(f"env_config frame_stack={frame_stack} is invalid for dmc:{name}: only dmc-pixels "
                              f"tasks stack frames (states carry velocities)")
        if render_quality not in RENDER_QUALITIES:
            raise ConfigError(f"env_config render_quality={render_quality!r} is invalid: allowed: "
                              f"{', '.join(RENDER_QUALITIES)}")
        if render_mode not in (None, "rgb_array"):
            raise ConfigError(f"render_mode={render_mode!r} is invalid: allowed: rgb_array")
        self.options = {"name": name, "pixels": bool(pixels), "action_repeat": action_repeat, "height": int(height),
                        "width": int(width), "camera_id": int(camera_id), "render_mode": render_mode,
                        "frame_stack": frame_stack, "render_quality": render_quality}
        self.render_mode = render_mode
        self._frames: list[np.ndarray] = []
        self._build()

    def _build(self) -> None:
        suite = import_suite()
        o = self.options
        domain, task = split_name(o["name"])
        self._env = suite.load(domain, task)
        if o["render_quality"] == "fast":
            model = self._env.physics.model
            model.vis.quality.offsamples = 0
            model.light_castshadow[:] = 0
            model.mat_reflectance[:] = 0
        spec = self._env.action_spec()
        self.action_space = gym.spaces.Box(spec.minimum.astype(np.float32), spec.maximum.astype(np.float32),
                                           dtype=np.float32)
        if o["pixels"]:
            shape = (o["height"], o["width"], 3 * o["frame_stack"])
            self.observation_space = gym.spaces.Box(0, 255, shape, dtype=np.uint8)
        else:
            dim = sum(_flat_dim(s) for s in self._env.observation_spec().values())
            self.observation_space = gym.spaces.Box(-np.inf, np.inf, (dim,), dtype=np.float32)

    # -- gymnasium ----------------------------------------------------------------
    def _obs(self, timestep, first: bool = False) -> np.ndarray:
        if self.options["pixels"]:
            frame, k = self._frame(), self.options["frame_stack"]
            if k == 1:
                return frame
            self._frames = [frame] * k if first else [*self._frames[1:], frame]
            return np.concatenate(self._frames, axis=2)
        return np.concatenate([np.asarray(v, dtype=np.float32).ravel() for v in timestep.observation.values()])

    def _frame(self) -> np.ndarray:
        o = self.options
        try:
            return self._env.physics.render(o["height"], o["width"], camera_id=o["camera_id"])
        except Exception as exc:  # noqa: BLE001  (OpenGL failures surface as several unrelated types)
            raise ConfigError(f"{GL_HINT} (MUJOCO_GL={os.environ.get('MUJOCO_GL')!r}: {type(exc).__name__})") \
                from None

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if seed is not None:
            self._env.task.random.seed(seed)
        return self._obs(self._env.reset(), first=True), {}

    def step(self, action):
        reward, timestep = 0.0, None
        action = np.asarray(action, dtype=np.float64)
        for _ in range(self.options["action_repeat"]):
            timestep = self._env.step(action)
            reward += timestep.reward or 0.0
            if timestep.last():
                break
        terminated = bool(timestep.last() and timestep.discount == 0)
        truncated = bool(timestep.last() and not terminated)
        return self._obs(timestep), float(reward), terminated, truncated, {}

    def render(self):
        return self._frame() if self.render_mode == "rgb_array" else None

    def close(self) -> None:
        env = self.__dict__.pop("_env", None)
        if env is not None:
            env.close()

    # -- snapshots -----------------------------------------------------------------
    def __getstate__(self) -> dict:
        import mujoco

        physics = self._env.physics
        what = mujoco.mjtState.mjSTATE_INTEGRATION
        sim = np.empty(mujoco.mj_stateSize(physics.model.ptr, what))
        mujoco.mj_getState(physics.model.ptr, physics.data.ptr, sim, what)
        state = {k: v for k, v in self.__dict__.items() if k not in ("_env", "action_space", "observation_space")}
        model = {f: getattr(physics.model, f).copy() for f in MODEL_FIELDS}
        state["_dmc"] = {"physics": sim, "model": model, "random": self._env.task.random.get_state(),
                         "step_count": self._env._step_count, "reset_next_step": self._env._reset_next_step}
        return state

    def __setstate__(self, state: dict) -> None:
        import mujoco

        dmc = state.pop("_dmc")
        state["options"] = {"frame_stack": 1, "render_quality": "suite", **state["options"]}  # older snapshots
        state.setdefault("_frames", [])
        self.__dict__.update(state)
        self._build()
        self._env.reset()  # builds the episode's task state; then the saved physics replaces its draws
        physics = self._env.physics
        for field, value in dmc["model"].items():
            getattr(physics.model, field)[...] = value
        mujoco.mj_setState(physics.model.ptr, physics.data.ptr, dmc["physics"], mujoco.mjtState.mjSTATE_INTEGRATION)
        physics.forward()
        self._env.task.random.set_state(dmc["random"])
        self._env._step_count, self._env._reset_next_step = dmc["step_count"], dmc["reset_next_step"]


def make_dmc_env(name: str, pixels: bool = False, **kwargs) -> gym.Env:
    """One ``dmc:``/``dmc-pixels:`` env; a bad ``env_config`` key is one line."""
    check_name(name, "dmc-pixels" if pixels else "dmc")
    try:
        env = DMCEnv(name, pixels=pixels, **kwargs)
    except TypeError as exc:
        raise ConfigError(f"env_config for dmc task {name!r} is invalid: {exc}") from None
    if pixels:
        try:
            env._frame()  # fail here, in one line, when there is no OpenGL
        except ConfigError:
            env.close()
            raise
    return env


__all__ = ["DMCEnv", "DMC_EXTRA", "check_name", "import_suite", "make_dmc_env", "split_name"]
