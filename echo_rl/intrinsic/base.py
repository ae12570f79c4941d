"""The intrinsic-reward contract and the pieces every module shares.

A module sees a rollout as tensors shaped ``(T, N, ...)`` (T steps of N
parallel envs): ``compute`` turns it into a ``(T, N)`` float32 bonus without
gradients, ``update`` trains the module's own networks on it. Modules with an
episodic memory (E3B, RIDE, NGU) and counters (pseudo-counts) carry state from
one rollout to the next, so each rollout is passed to ``compute`` once, in
order. ``dones[t]`` marks that ``next_obs[t]`` ends its env's episode: episodic
memories are emptied after it.
"""

from __future__ import annotations

import contextlib
from typing import Any, Protocol, runtime_checkable

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F


@runtime_checkable
class IntrinsicReward(Protocol):
    """What the agents call (``agent.set(reward=...)``)."""

    def compute(self, obs, actions, next_obs, dones) -> torch.Tensor: ...

    def update(self, obs, actions, next_obs, dones) -> dict[str, float]: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


def obs_kind(observation_space: gym.Space) -> str:
    """'vector' for flat Box observations, 'image' for (C, H, W) ones; anything else is refused."""
    if not isinstance(observation_space, gym.spaces.Box):
        raise ValueError(f"intrinsic rewards need a Box observation space, got {type(observation_space).__name__}")
    if len(observation_space.shape) == 1:
        return "vector"
    if len(observation_space.shape) == 3:
        return "image"
    raise ValueError(f"observation shape {observation_space.shape} is not supported; allowed: (D,) or (C, H, W)")


def action_dim(action_space: gym.Space) -> int:
    """Width of an action as the networks see it: one-hot for Discrete, the vector for a 1-D Box."""
    if isinstance(action_space, gym.spaces.Discrete):
        return int(action_space.n)
    if isinstance(action_space, gym.spaces.Box) and len(action_space.shape) == 1:
        return int(action_space.shape[0])
    raise ValueError(f"action space {action_space} is not supported; allowed: Discrete or a 1-D Box")


def as_tensor(x: Any, device: torch.device) -> torch.Tensor:
    return x.to(device) if isinstance(x, torch.Tensor) else torch.as_tensor(np.asarray(x), device=device)


class IntrinsicBase:
    """Shape checks, observation/action preprocessing and generic (de)serialisation.

    Subclasses list their networks in ``_nets``, optimisers in ``_optims`` and
    plain state (tensors, numbers, lists) in ``_state_keys``; ``state_dict``
    and ``load_state_dict`` cover all three.
    """

    _state_keys: tuple[str, ...] = ()

    def __init__(self, observation_space: gym.Space, action_space: gym.Space, device: str | torch.device = "cpu"):
        self.kind = obs_kind(observation_space)
        self.obs_shape = tuple(int(s) for s in observation_space.shape)
        self.action_space = action_space
        self.action_dim = action_dim(action_space)
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        self.device = torch.device(device)
        self._nets: dict[str, torch.nn.Module] = {}
        self._optims: dict[str, torch.optim.Optimizer] = {}

    # ---- inputs -------------------------------------------------------------------------------------------
    def _obs(self, obs: Any, name: str = "obs") -> torch.Tensor:
        """(T, N, *obs_shape) -> float (T, N, *obs_shape); images scaled to [0, 1]."""
        x = as_tensor(obs, self.device)
        if x.dim() != 2 + len(self.obs_shape) or tuple(x.shape[2:]) != self.obs_shape:
            raise ValueError(f"{name} has shape {tuple(x.shape)}; expected (T, N, *{self.obs_shape})")
        x = x.float()
        return x / 255.0 if self.kind == "image" else x

    def _actions(self, actions: Any, t: int, n: int) -> torch.Tensor:
        """(T, N) ints or (T, N, A) floats -> (T, N, A) float (one-hot for Discrete)."""
        a = as_tensor(actions, self.device)
        if self.discrete:
            if tuple(a.shape) != (t, n):
                raise ValueError(f"actions have shape {tuple(a.shape)}; expected (T, N) = {(t, n)} for Discrete")
            return F.one_hot(a.long(), self.action_dim).float()
        if tuple(a.shape) != (t, n, self.action_dim):
            raise ValueError(f"actions have shape {tuple(a.shape)}; expected (T, N, A) = {(t, n, self.action_dim)}")
        return a.float()

    def _dones(self, dones: Any, t: int, n: int) -> torch.Tensor:
        d = as_tensor(dones, self.device)
        if tuple(d.shape) != (t, n):
            raise ValueError(f"dones have shape {tuple(d.shape)}; expected (T, N) = {(t, n)}")
        return d.bool()

    def _rollout(self, obs, actions, next_obs, dones):
        """All four inputs checked and converted; returns (obs, actions, next_obs, dones)."""
        o = self._obs(obs, "obs")
        no = self._obs(next_obs, "next_obs")
        if o.shape[:2] != no.shape[:2]:
            raise ValueError(f"obs {tuple(o.shape[:2])} and next_obs {tuple(no.shape[:2])} differ in (T, N)")
        t, n = o.shape[:2]
        return o, self._actions(actions, t, n), no, self._dones(dones, t, n)

    # ---- serialisation ------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        state = {"nets": {k: m.state_dict() for k, m in self._nets.items()},
                 "optims": {k: o.state_dict() for k, o in self._optims.items()}}
        for key in self._state_keys:
            value = getattr(self, key)
            state[key] = value.state_dict() if hasattr(value, "state_dict") else _copy(value)
        if isinstance(getattr(self, "generator", None), torch.Generator):
            state["generator"] = self.generator.get_state()
        return state

    def load_state_dict(self, state: dict) -> None:
        missing = [k for k in ("nets", "optims", *self._state_keys) if k not in state]
        if missing:
            raise ValueError(f"{type(self).__name__} state lacks {missing}")
        for k, m in self._nets.items():
            m.load_state_dict(state["nets"][k])
        for k, o in self._optims.items():
            o.load_state_dict(state["optims"][k])
        for key in self._state_keys:
            current = getattr(self, key)
            if hasattr(current, "load_state_dict"):
                current.load_state_dict(state[key])
            else:
                setattr(self, key, _to_device(_copy(state[key]), self.device))
        if isinstance(getattr(self, "generator", None), torch.Generator) and "generator" in state:
            self.generator.set_state(state["generator"])


def _copy(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


def _to_device(value: Any, device: torch.device) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, dict):
        return {k: _to_device(v, device) for k, v in value.items()}
    if isinstance(value, list):
        return [_to_device(v, device) for v in value]
    return value


class RunningMeanStd:
    """Mean and variance over everything seen (parallel Welford / Chan et al.); ``shape`` is one sample's."""

    def __init__(self, shape: tuple[int, ...] = (), device: torch.device | str = "cpu", epsilon: float = 1e-4):
        self.mean = torch.zeros(shape, device=device)
        self.var = torch.ones(shape, device=device)
        self.count = float(epsilon)

    def update(self, x: torch.Tensor) -> None:
        x = x.detach().float().reshape(-1, *self.mean.shape)
        if x.shape[0] == 0:
            return
        b_mean, b_var, b_count = x.mean(0), x.var(0, unbiased=False), x.shape[0]
        delta = b_mean - self.mean
        total = self.count + b_count
        self.mean = self.mean + delta * b_count / total
        m2 = self.var * self.count + b_var * b_count + delta.pow(2) * self.count * b_count / total
        self.var = m2 / total
        self.count = total

    @property
    def std(self) -> torch.Tensor:
        return torch.sqrt(self.var + 1e-8)

    def state_dict(self) -> dict:
        return {"mean": self.mean.clone(), "var": self.var.clone(), "count": self.count}

    def load_state_dict(self, state: dict) -> None:
        self.mean = state["mean"].clone().to(self.mean.device)
        self.var = state["var"].clone().to(self.var.device)
        self.count = float(state["count"])


@contextlib.contextmanager
def seeded(seed: int):
    """Build networks from ``seed`` without touching the caller's global torch RNG."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        yield


def minibatches(size: int, batch_size: int, generator: torch.Generator | None = None):
    """Shuffled index chunks covering ``range(size)``."""
    perm = torch.randperm(size, generator=generator)
    for start in range(0, size, batch_size):
        yield perm[start:start + batch_size]
