"""Swappable parts of a vector agent: ``agent.set(encoder=..., policy=..., storage=..., distribution=...,
augmentation=..., reward=...)``.

:class:`ModularAgent` is a mixin for any agent on the shared rollout
collector. ``set`` dispatches each part to ``set_<part>``; the agent supplies
those that touch its network (encoder, policy, storage, distribution), while
the learner-side parts are here once:

- ``augmentation``: ``aug(obs, generator) -> obs`` (``echo_rl.models.augmentation``)
  on the rollout the learner sees; the actors act on clean observations;
- ``reward``: an intrinsic reward module (``echo_rl.intrinsic``: ``compute`` /
  ``update`` / ``state_dict``; images reach it channels-first), mixed into the learner's rewards after
  collection by ``echo_rl.intrinsic.mixing.IntrinsicMixer``. The collector keeps
  the extrinsic returns, so episode statistics stay the task's. With
  ``TrainingConfig.pretraining`` the task reward is dropped (intrinsic only).

Swapped parts are saved in ``state_dict`` beside the network. A resumed
agent must be given the same parts (by config name, or ``set`` before
``load_state_dict``); a mismatch is refused in one line.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch

from echo_rl.config import ConfigError
from echo_rl.vector.rollout import RolloutBuffer, torch_generator

PARTS = ("encoder", "policy", "storage", "distribution", "augmentation", "reward")
AUGMENTATION_SEED_OFFSET = 3  # the augmentation generator: seed + 3 (seed + 1, + 2 are the actors' and the learner's)


def channels_first_space(space):
    """Reward modules read images (C, H, W): an HWC image space becomes its CHW twin, any other space is kept."""
    import gymnasium as gym

    from echo_rl.models.encoders import image_layout  # gymnasium, minigrid: loaded on first use

    if len(space.shape) != 3 or not image_layout(tuple(space.shape))[3]:
        return space
    order = (2, 0, 1)
    return gym.spaces.Box(np.transpose(space.low, order), np.transpose(space.high, order), dtype=space.dtype)


def make_reward(name: str, config, observation_space, action_space, device) -> Any:
    """The intrinsic reward module ``name`` from ``echo_rl.intrinsic`` (one line when it is not installed);
    image observations reach it channels-first."""
    observation_space = channels_first_space(observation_space)
    try:
        from echo_rl.intrinsic import make_intrinsic_reward  # gymnasium: loaded on first use
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.startswith("echo_rl.intrinsic"):
            raise ConfigError(f"intrinsic_reward={name!r} needs the echo_rl.intrinsic package, which this install "
                              f"lacks") from None
        raise
    try:
        return make_intrinsic_reward(name, observation_space, action_space, device, **config.intrinsic_config)
    except ValueError as exc:  # an unknown name or hyperparameter: the module registry's one line
        raise ConfigError(f"TrainingConfig.intrinsic_reward={name!r} is invalid: {exc}") from None


def make_mixer(module, config) -> Any:
    from echo_rl.intrinsic.mixing import IntrinsicMixer  # gymnasium: loaded on first use

    return IntrinsicMixer(module, config.intrinsic_beta, config.intrinsic_kappa, config.intrinsic_normalize)


_NDARRAY = "$ndarray"


def to_checkpoint(x: Any) -> Any:
    """numpy arrays (a module's running statistics) as tensors, so ``torch.load(weights_only=True)`` reads them."""
    if isinstance(x, np.ndarray):
        return {_NDARRAY: torch.from_numpy(np.ascontiguousarray(x))}
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, dict):
        return {k: to_checkpoint(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(to_checkpoint(v) for v in x)
    return x


def from_checkpoint(x: Any) -> Any:
    """The inverse of :func:`to_checkpoint`."""
    if isinstance(x, dict):
        if set(x) == {_NDARRAY}:
            return x[_NDARRAY].numpy()
        return {k: from_checkpoint(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(from_checkpoint(v) for v in x)
    return x


class ModularAgent:
    """``set()`` and the learner-side parts (augmentation, intrinsic reward) of a vector agent.

    The agent sets ``config``, ``device``, ``collector`` and calls :meth:`init_parts` (which zeroes
    ``env_steps`` and ``updates``) once its own network exists.
    """

    augmentation = None
    reward = None
    mixer = None

    def init_parts(self) -> None:
        """The last step of an agent's construction: zeroed counters and the parts a config names
        (``augmentation``, ``intrinsic_reward``). A failure closes the envs, which the agent owns by now."""
        cfg, envs = self.config, self.collector.envs
        self.env_steps = 0
        self.updates = 0
        try:
            self.aug_generator = torch_generator(cfg.seed + AUGMENTATION_SEED_OFFSET)
            if cfg.augmentation:
                self.set(augmentation=cfg.augmentation)
            if cfg.intrinsic_reward:
                self.set(reward=make_reward(cfg.intrinsic_reward, cfg, envs.single_observation_space,
                                            envs.single_action_space, self.device))
        except BaseException:
            envs.close()
            raise

    def set(self, **parts: Any) -> "ModularAgent":
        """Swap parts (:data:`PARTS`); returns the agent. A part given as None is left as it is."""
        unknown = sorted(set(parts) - set(PARTS))
        if unknown:
            raise ValueError(f"unknown agent part {unknown[0]!r}; allowed: {', '.join(PARTS)}")
        for name in PARTS:  # a fixed order: the encoder before the distribution that wraps its heads
            if parts.get(name) is not None:
                getattr(self, f"set_{name}")(parts[name])
        return self

    def set_encoder(self, encoder) -> None:
        raise NotImplementedError(f"{type(self).__name__} does not swap its encoder")

    def set_policy(self, policy) -> None:
        raise NotImplementedError(f"{type(self).__name__} does not swap its policy")

    def set_storage(self, storage) -> None:
        raise NotImplementedError(f"{type(self).__name__} does not swap its storage")

    def set_distribution(self, distribution) -> None:
        raise NotImplementedError(f"{type(self).__name__} does not swap its distribution")

    def set_augmentation(self, augmentation) -> None:
        if isinstance(augmentation, str):
            from echo_rl.models.augmentation import make_augmentation  # gymnasium, minigrid: loaded on first use

            augmentation = make_augmentation(augmentation)
        if not callable(augmentation):
            raise ValueError(f"augmentation must be a name or a callable aug(obs, generator), got "
                             f"{type(augmentation).__name__}")
        if len(self.collector.buffer.obs.shape) != 5:
            raise ConfigError(f"augmentation acts on pixel observations (H, W, C); this task's observations have "
                              f"shape {self.collector.buffer.obs.shape[2:]}")
        self.augmentation = augmentation

    def set_reward(self, reward) -> None:
        missing = [m for m in ("compute", "update", "state_dict", "load_state_dict") if not hasattr(reward, m)]
        if missing:
            raise ValueError(f"reward module {type(reward).__name__} lacks {', '.join(missing)} (the "
                             f"echo_rl.intrinsic interface)")
        self.reward = reward
        self.mixer = make_mixer(reward, self.config)
        self._keep_next_observations()

    def _keep_next_observations(self) -> None:
        """A reward module judges each transition by the state it reached: at an episode's end that is the
        terminal observation (``final_obs``), not the next episode's first, so the collector keeps both."""
        buf = self.collector.buffer
        if buf.next_observations is None:
            buf.next_observations = np.zeros_like(buf.obs)

    # -- the learner's view of a rollout --------------------------------------
    def learner_batch(self, buf: RolloutBuffer) -> tuple[RolloutBuffer, dict[str, float]]:
        """The rollout as the learner sees it: intrinsic reward mixed in, observations augmented. The
        collector's own buffer is left untouched (a shallow copy carries the changed arrays)."""
        metrics: dict[str, float] = {}
        if self.reward is None and self.augmentation is None:
            return buf, metrics
        out = copy.copy(buf)
        if self.reward is not None:
            out.rewards, metrics = self._mixed_rewards(buf)
        if self.augmentation is not None:
            obs = torch.as_tensor(buf.obs).reshape(-1, *buf.obs.shape[2:])
            out.obs = self.augmentation(obs, self.aug_generator).reshape(buf.obs.shape).numpy()
        return out, metrics

    def _mixed_rewards(self, buf: RolloutBuffer) -> tuple[np.ndarray, dict[str, float]]:
        t = lambda a: torch.as_tensor(a, device=self.device)  # noqa: E731
        # the observation each step reached: the terminal one (final_obs) where an episode ended
        obs, actions, next_obs = t(buf.obs), t(buf.actions), t(buf.next_observations)
        space = self.collector.envs.single_observation_space
        if channels_first_space(space) is not space:  # (T, N, H, W, C) -> (T, N, C, H, W)
            obs, next_obs = obs.permute(0, 1, 4, 2, 3), next_obs.permute(0, 1, 4, 2, 3)
        dones = t(buf.terminated | buf.truncated)
        intrinsic = self.reward.compute(obs, actions, next_obs, dones)
        extrinsic = np.zeros_like(buf.rewards) if self.config.pretraining else buf.rewards
        mixed = np.asarray(self.mixer.mix(extrinsic, intrinsic, self.env_steps), dtype=np.float32)
        if mixed.shape != buf.rewards.shape:
            raise ValueError(f"the intrinsic mixer returned shape {mixed.shape}, expected {buf.rewards.shape}")
        metrics = {"intrinsic/reward_mean": float(intrinsic.float().mean()), "intrinsic/mixed_reward_mean":
                   float(mixed.mean())}
        update = self.reward.update(obs, actions, next_obs, dones) or {}
        metrics.update({f"intrinsic/{k}": float(v) for k, v in update.items()})
        return mixed, metrics

    # -- checkpoints ------------------------------------------------------------
    def parts_state(self) -> dict:
        """The swapped learner-side parts' state (empty for an agent with none: its checkpoint is today's)."""
        state: dict = {}
        if self.augmentation is not None:
            state["aug_generator"] = self.aug_generator.get_state()
        if self.reward is not None:  # the mixer's running statistics hold the module's state under 'module'
            state["reward"] = to_checkpoint(self.mixer.state_dict() if hasattr(self.mixer, "state_dict")
                                            else {"module": self.reward.state_dict()})
        return state

    def load_parts_state(self, state: dict) -> None:
        for key, part, what in (("reward", self.reward, "an intrinsic reward module"),
                                ("aug_generator", self.augmentation, "an augmentation")):
            if (key in state) != (part is not None):
                has = "has" if key in state else "has no"
                raise ConfigError(f"this checkpoint {has} {what} and this agent {'has none' if part is None else 'has one'}"
                                  f"; give the resumed agent the parts the run was trained with")
        if "aug_generator" in state:
            self.aug_generator.set_state(state["aug_generator"])
        if "reward" in state:
            reward = from_checkpoint(state["reward"])
            if hasattr(self.mixer, "load_state_dict"):
                self.mixer.load_state_dict(reward)
            else:
                self.reward.load_state_dict(reward["module"])


__all__ = ["ModularAgent", "PARTS", "make_mixer", "make_reward"]
