"""On-policy rollouts from a vector env into preallocated (T, N) arrays."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Callable, Protocol

import numpy as np
import torch

from echo_rl.models.distributions import sample_categorical


@dataclass
class EpisodeStats:
    """Returns, lengths and successes of episodes that finished since the last drain."""

    returns: list = field(default_factory=list)
    lengths: list = field(default_factory=list)
    successes: list = field(default_factory=list)

    def add(self, ret: float, length: int, success: bool) -> None:
        self.returns.append(float(ret))
        self.lengths.append(int(length))
        self.successes.append(bool(success))

    def drain(self) -> dict[str, float]:
        if not self.returns:
            return {}
        out = {"episode/return": float(np.mean(self.returns)), "episode/length": float(np.mean(self.lengths)),
               "episode/success_rate": float(np.mean(self.successes)), "episode/count": float(len(self.returns))}
        self.returns, self.lengths, self.successes = [], [], []
        return out


class RolloutBuffer:
    """Step-major storage of one rollout; ``final_values`` holds V(final_obs) at truncations.

    Agents that carry more than PPO's fields ask the collector for them:
    ``extras`` — per-step arrays ``[T, N, *shape]`` their actor returns with each
    action (EchoRL: plan noise, plan means, episode ids); ``next_observations`` — the
    observation that followed each step (``final_obs`` where an episode ended, what a
    world model predicts); ``context`` — per-rollout arrays with the env on axis 1
    that the actor hands over at the rollout's start and end (EchoRL: the k states
    before step 0, for the plan windows).
    """

    # class-level defaults: buffers pickled before these fields existed load unchanged
    extras: dict = MappingProxyType({})
    next_observations: np.ndarray | None = None
    context: dict = MappingProxyType({})

    def __init__(self, num_steps: int, num_envs: int, obs_shape: tuple, obs_dtype=np.uint8,
                 extras: dict[str, tuple[tuple, type]] | None = None, next_observations: bool = False,
                 action_shape: tuple = (), action_dtype=np.int64):
        t, n = num_steps, num_envs
        self.obs = np.zeros((t, n, *obs_shape), dtype=obs_dtype)
        self.actions = np.zeros((t, n, *action_shape), dtype=action_dtype)  # Box actions: (t, n, dim) floats
        self.logprobs = np.zeros((t, n), dtype=np.float32)
        self.values = np.zeros((t, n), dtype=np.float32)
        self.rewards = np.zeros((t, n), dtype=np.float32)
        self.terminated = np.zeros((t, n), dtype=bool)
        self.truncated = np.zeros((t, n), dtype=bool)
        self.final_values = np.zeros((t, n), dtype=np.float32)
        self.num_steps, self.num_envs = t, n
        if extras:
            self.extras = {name: np.zeros((t, n, *shape), dtype) for name, (shape, dtype) in extras.items()}
        if next_observations:
            self.next_observations = np.zeros_like(self.obs)
        self.context = {}


class StepActor(Protocol):
    """What :meth:`VectorRolloutCollector.run` drives (Acme's actor: select an action, observe the step).

    ``select`` runs under no-grad and returns ``(actions, logprobs, values, extras)``, extras
    holding every field the buffer was built with; ``final_values(final_obs, env_ids)`` is
    V(final_obs) of the envs truncated this step; ``observe(done)`` is called once the step's
    values are in, so a stateful actor can start new episodes; ``begin`` / ``end`` return the
    rollout's ``context`` arrays (env on axis 1).
    """

    def begin(self) -> dict[str, np.ndarray]: ...

    def select(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, np.ndarray]]: ...

    def final_values(self, final_obs: np.ndarray, env_ids: np.ndarray) -> np.ndarray: ...

    def observe(self, done: np.ndarray) -> None: ...

    def end(self) -> dict[str, np.ndarray]: ...


class FunctionActor:
    """A stateless policy as a :class:`StepActor`: ``policy(obs) -> (actions, logprobs, values)``, ``value_fn(obs)``."""

    def __init__(self, policy: Callable, value_fn: Callable):
        self.policy, self.value_fn = policy, value_fn

    def begin(self) -> dict:
        return {}

    def select(self, obs):
        return (*self.policy(obs), {})

    def final_values(self, final_obs, env_ids):
        return self.value_fn(final_obs)

    def observe(self, done) -> None:
        pass

    def end(self) -> dict:
        return {}


class VectorRolloutCollector:
    """Steps a vector env with a policy and tracks per-env episode returns.

    ``collect(policy, value_fn)``: ``policy(obs) -> (actions, logprobs, values)`` runs
    under no-grad; ``value_fn`` evaluates V(final_obs) for truncated episodes.
    ``run(actor)`` is the same loop driving a :class:`StepActor` (stateful acting,
    extra per-step fields).
    """

    def __init__(self, envs, num_steps: int, seeds: list[int], extras: dict[str, tuple[tuple, type]] | None = None,
                 next_observations: bool = False):
        self.envs = envs
        self.num_envs = envs.num_envs
        self.buffer = RolloutBuffer(num_steps, self.num_envs, envs.single_observation_space.shape,
                                    envs.single_observation_space.dtype, extras, next_observations,
                                    **action_layout(envs.single_action_space))
        self.next_obs, _ = envs.reset(seed=seeds)
        self.ep_return = np.zeros(self.num_envs, dtype=np.float64)
        self.ep_length = np.zeros(self.num_envs, dtype=np.int64)
        self.stats = EpisodeStats()

    def __getstate__(self) -> dict:
        from echo_rl.environments.minigrid_vector import snapshot_vector_env  # gymnasium, minigrid: loaded on first use

        return {**self.__dict__, "envs": snapshot_vector_env(self.envs)}

    def __setstate__(self, state: dict) -> None:
        from echo_rl.environments.minigrid_vector import restore_vector_env  # gymnasium, minigrid: loaded on first use

        self.__dict__.update(state)
        self.envs = restore_vector_env(state["envs"])

    def collect(self, policy: Callable, value_fn: Callable) -> RolloutBuffer:
        return self.run(FunctionActor(policy, value_fn))

    def run(self, actor: StepActor) -> RolloutBuffer:
        b = self.buffer
        context = dict(actor.begin())
        # this loop runs once per env step: its look-ups are hoisted into locals
        step, select, observe = self.envs.step, actor.select, actor.observe
        obs_buf, action_buf, logprob_buf, value_buf = b.obs, b.actions, b.logprobs, b.values
        reward_buf, terminated_buf, truncated_buf, final_values = b.rewards, b.terminated, b.truncated, b.final_values
        extras, next_observations = tuple(b.extras.items()), b.next_observations
        ep_return, ep_length = self.ep_return, self.ep_length
        final_values[:b.num_steps] = 0.0  # V(final_obs) is written below only where an episode was truncated
        for t in range(b.num_steps):
            obs = self.next_obs
            obs_buf[t] = obs
            actions, logprobs, values, step_extras = select(obs)
            next_obs, rewards, terminated, truncated, info = step(actions)
            action_buf[t], logprob_buf[t], value_buf[t] = actions, logprobs, values
            reward_buf[t], terminated_buf[t], truncated_buf[t] = rewards, terminated, truncated
            for name, array in extras:
                array[t] = step_extras[name]
            if next_observations is not None:
                next_observations[t] = next_obs
            ep_return += rewards
            ep_length += 1
            done = terminated | truncated
            if done.any():
                if next_observations is not None:
                    idx = np.nonzero(done)[0]
                    next_observations[t, idx] = np.stack([info["final_obs"][i] for i in idx])
                if truncated.any():
                    idx = np.nonzero(truncated)[0]
                    final_values[t, idx] = actor.final_values(np.stack([info["final_obs"][i] for i in idx]), idx)
                for i in np.nonzero(done)[0]:
                    self.stats.add(ep_return[i], ep_length[i], bool(terminated[i] and rewards[i] > 0))
                ep_return[done] = 0.0
                ep_length[done] = 0
            observe(done)
            self.next_obs = next_obs
        context.update(actor.end())
        b.context = context
        return b


def evaluate_policy(make_envs: Callable, act: Callable, episodes: int, seed: int, num_envs: int = 8, *,
                    episode_starts: bool = False) -> dict:
    """Run exactly ``episodes`` episodes, ``ceil(episodes / num_envs)`` per env.

    A fixed quota per env (rather than the first N episodes to finish) avoids
    over-counting short episodes, and makes the result a function of the seed.
    ``act(obs)`` returns actions; with ``episode_starts=True`` it is called as
    ``act(obs, starts)``, ``starts[i]`` True where ``obs[i]`` begins an episode
    (for agents that keep per-episode state, like EchoRL's plan windows).
    """
    num_envs = min(num_envs, episodes)
    envs = make_envs(num_envs)
    quota = np.full(num_envs, episodes // num_envs)
    quota[: episodes % num_envs] += 1
    obs, _ = envs.reset(seed=[seed + 10_000 * i for i in range(num_envs)])
    starts = np.ones(num_envs, dtype=bool)
    ep_ret = np.zeros(num_envs)
    ep_len = np.zeros(num_envs, dtype=np.int64)
    stats = EpisodeStats()
    try:
        while quota.any():
            actions = act(obs, starts) if episode_starts else act(obs)
            obs, rewards, terminated, truncated, _ = envs.step(actions)
            ep_ret += rewards
            ep_len += 1
            starts = terminated | truncated
            for i in np.nonzero(starts)[0]:
                if quota[i] > 0:
                    stats.add(ep_ret[i], ep_len[i], bool(terminated[i] and rewards[i] > 0))
                    quota[i] -= 1
                ep_ret[i], ep_len[i] = 0.0, 0
    finally:
        envs.close()
    return {"success_rate": float(np.mean(stats.successes)), "avg_reward": float(np.mean(stats.returns)),
            "avg_length": float(np.mean(stats.lengths)), "episodes": len(stats.returns)}


def action_layout(action_space) -> dict:
    """How a buffer stores an action space's actions: Discrete as int64 scalars, a Box as float32 vectors."""
    if hasattr(action_space, "n"):
        return {}
    return {"action_shape": tuple(action_space.shape), "action_dtype": np.float32}


def torch_generator(seed: int) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(seed)
    return g


@torch.no_grad()
def sample_policy(network: torch.nn.Module, generator: torch.Generator, obs: torch.Tensor,
                  forward: Callable | None = None):
    """Actions, their log-probabilities and values under an actor-critic ``network``: the one way the
    actor-critic agents act, in process, in an actor process and on Ray workers alike. A continuous
    distribution (``echo_rl.models.distributions``) draws unbounded actions; the env clips them.
    ``forward``: ``network``'s forward pass as :func:`flat_forward` built it (default: ``network`` itself)."""
    logits, values = (forward or network)(obs)
    distribution = getattr(network, "distribution", None)
    if getattr(distribution, "continuous", False):
        actions = distribution.sample(logits, generator)
        logprobs = distribution.log_prob(logits, actions)
        return actions.float().cpu().numpy(), logprobs.cpu().numpy(), values.cpu().numpy()
    logp = torch.log_softmax(logits, -1)
    actions = sample_categorical(logp.exp(), generator)  # [B, 1]: torch.multinomial's draw, minus its checks
    logprobs = logp.gather(-1, actions).cpu().numpy().reshape(-1)
    if not np.isfinite(logprobs).all():  # a NaN or inf logit is picked by argmax: refuse as multinomial would
        raise ValueError("the policy's action probabilities contain NaN or inf (the network diverged)")
    return actions.cpu().numpy().reshape(-1), logprobs, values.cpu().numpy()


def flat_forward(network: torch.nn.Module) -> Callable:
    """``network``'s forward pass with its heads' module calls flattened (acting, learning); else ``network``.

    Why: acting runs the network once per env step on a handful of observations, where each module call
    (hook checks, parameter look-ups: ~1.5 µs) costs about what the layer's arithmetic does; an
    :class:`~echo_rl.models.policies.ActorCritic` makes eleven, on every minibatch of the update too. For
    one whose heads are ``nn.Sequential`` of plain ``nn.Linear`` / ``nn.Tanh`` (every named network's) and
    with no forward hooks, this makes the same ``F.linear`` / ``torch.tanh`` calls on the same parameter
    tensors in ActorCritic's order, so the same floats and gradients (``tests/test_training/
    test_ppo_speed.py`` compares them); the encoder and the distribution are called as modules. It reads
    the network's structure once: build it again after modules are replaced (the agents build one per
    rollout and per update). Parameters updated in place are seen.
    """
    from echo_rl.models.policies import ActorCritic  # gymnasium, minigrid: loaded on first use

    if type(network) is not ActorCritic or _has_forward_hooks(network):
        return network
    heads = flat_heads(network.actor, network.critic, network.distribution)
    if heads is None:
        return network
    encoder = network.encoder

    def forward(obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return heads(encoder(obs))

    return forward


def flat_heads(actor: torch.nn.Module, critic: torch.nn.Module,
               distribution: torch.nn.Module | None) -> Callable | None:
    """``features -> (logits, values)`` through an actor-critic's two heads with their module calls flattened,
    or None when a head is not an ``nn.Sequential`` of plain ``nn.Linear`` / ``nn.Tanh`` or has forward hooks.

    :func:`flat_forward` and the EchoRL agent's heads (under its plan layer) share it, so both learners run
    their heads through the same calls: ``actor``'s layers, then ``distribution`` (a module, or None: raw
    logits), then ``critic``'s, each ``F.linear`` / ``torch.tanh`` on the layers' own parameter tensors, in
    ActorCritic's order — the floats and gradients of the module calls. Built once per structure: build
    it again after a head or the distribution is replaced; parameters updated in place are seen.
    """
    layers_of = []
    for head in (actor, critic):
        if type(head) is not torch.nn.Sequential or _has_forward_hooks(head):
            return None
        layers = []
        for layer in head:
            if type(layer) is torch.nn.Linear:
                layers.append((layer.weight, layer.bias))
            elif type(layer) is torch.nn.Tanh:
                layers.append(None)
            else:
                return None
        layers_of.append(tuple(layers))
    (actor_layers, critic_layers), linear, tanh = layers_of, torch.nn.functional.linear, torch.tanh

    def heads(features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = features
        for layer in actor_layers:
            logits = tanh(logits) if layer is None else linear(logits, *layer)
        if distribution is not None:
            logits = distribution(logits)
        values = features
        for layer in critic_layers:
            values = tanh(values) if layer is None else linear(values, *layer)
        return logits, values.squeeze(-1)

    return heads


def _has_forward_hooks(network: torch.nn.Module) -> bool:
    """Module or global forward hooks: flattened calls would skip them."""
    from torch.nn.modules import module as torch_module

    if any(getattr(torch_module, name, None) for name in ("_global_forward_hooks", "_global_forward_pre_hooks")):
        return True
    return any(m._forward_hooks or m._forward_pre_hooks for m in network.modules())
