"""Scaffolding shared by the on-policy vector agents (PPO, IMPALA).

The trainer's agent protocol (``echo_rl.training.protocol.Agent``), as every vector agent has it:

- ``Agent(config, envs, device)`` — ``envs`` is an unreset gymnasium vector env;
- ``train_iteration() -> dict`` collects ``config.steps_per_update`` env steps,
  learns, advances ``env_steps`` / ``updates`` and returns flat metrics;
- ``act(obs, generator) -> actions`` for evaluation; ``close()`` releases the envs;
- ``state_dict()`` / ``load_state_dict()`` (tensors and plain data only:
  loadable with ``weights_only=True``); ``rollout_state()`` /
  ``load_rollout_state()`` (plain data for ``state_codec``: the envs mid-episode), so a resumed run
  continues exactly where the checkpoint left it.

A subclass supplies ``learn(buf) -> metrics`` (and may override
``make_optimizer``); everything else — the network, acting, the rollout
collector, LR annealing, checkpoints — is here once, so the baselines differ
only in their learners.

Parts swap with ``agent.set(encoder=..., policy=..., storage=..., distribution=...,
augmentation=..., reward=...)`` (:mod:`echo_rl.vector.modular`; the config
names them too: ``encoder``, ``augmentation``, ``intrinsic_reward``). A swap
of the network's parts builds a fresh optimiser over the new parameters;
an injected encoder keeps its weights.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from echo_rl.config import ConfigError, TrainingConfig
from echo_rl.environments.minigrid_vector import actor_seeds
from echo_rl.models.distributions import check_fits, default_distribution, is_continuous, refuse_continuous
from echo_rl.models.policies import ActorCritic, build_actor_critic
from echo_rl.vector.modular import ModularAgent
from echo_rl.training.protocol import VectorAgentBase
from echo_rl.training.run_dir import RunDirectory
from echo_rl.vector.rollout import (RolloutBuffer, VectorRolloutCollector, flat_forward, action_layout,
                                     evaluate_policy, sample_policy, torch_generator)


def clip_grad_norm(params, max_norm: float) -> torch.Tensor:
    """``torch.nn.utils.clip_grad_norm_(params, max_norm)`` (2-norm) for gradients on the CPU, of one dtype: its
    foreach kernels in its order (so the same norm and gradients, ``tests/test_training/test_ppo_speed.py``),
    without its three no-grad wrappers and two regroupings, ~50 µs of every minibatch; else torch's own."""
    params = list(params)
    grads = [p.grad for p in params if p.grad is not None]
    if not grads or any(type(g) is not torch.Tensor or g.device.type != "cpu" or g.dtype != grads[0].dtype
                        for g in grads):
        return torch.nn.utils.clip_grad_norm_(params, max_norm)
    with torch.no_grad():
        total_norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads, 2.0)), 2.0)
        torch._foreach_mul_(grads, torch.clamp(float(max_norm) / (total_norm + 1e-6), max=1.0))
    return total_norm


class ActorCriticAgent(ModularAgent, VectorAgentBase):
    #: why the learner needs one update per ``batch_size`` env steps (for the config error)
    update_rule = "an on-policy learner updates every batch_size env steps"
    #: whether the learner handles continuous (Box) actions (PPO: yes; IMPALA's V-trace here: no)
    continuous_actions = False

    def __init__(self, config: TrainingConfig, envs, device: torch.device):
        if config.steps_per_update != config.batch_size:
            raise ValueError(f"TrainingConfig.train_frequency={config.train_frequency} is invalid for "
                             f"{type(self).__name__}: {self.update_rule} (batch_size={config.batch_size})")
        self.config, self.ppo, self.device = config, config.ppo_config, device
        self.num_envs = envs.num_envs
        self.num_steps = config.batch_size // self.num_envs
        self.num_updates_total = math.ceil(config.total_timesteps / config.batch_size)
        torch.manual_seed(config.seed)
        space, self.action_space = envs.single_observation_space, envs.single_action_space
        if not self.continuous_actions:
            refuse_continuous(envs, config.env_name, config.agent)
        try:
            distribution = default_distribution(self.action_space)  # Box -> DiagGaussian, Discrete -> None
        except ConfigError:
            envs.close()
            raise
        self.obs_shape, self.obs_dtype = tuple(space.shape), space.dtype
        # the actor head's width: one logit per action, or one mean per action dimension
        self.num_actions = int(self.action_space.n) if distribution is None else int(self.action_space.shape[0])
        # one network for every baseline (TrainingConfig.encoder / policy_network): comparisons are about the learner
        try:
            network = build_actor_critic(config.encoder, self.obs_shape, self.obs_dtype, self.num_actions,
                                         config.policy_network)
        except ValueError as exc:
            envs.close()
            raise ConfigError(f"TrainingConfig.encoder={config.encoder!r} does not fit task {config.env_name!r}: "
                              f"{exc}") from None
        network.distribution = distribution
        self.network = network.to(device)
        self.optimizer = self.make_optimizer()
        self.base_lr = self.optimizer.param_groups[0]["lr"]
        self.generator = torch_generator(config.seed + 1)
        self.np_rng = np.random.default_rng(config.seed + 2)
        self.collector = VectorRolloutCollector(envs, self.num_steps, actor_seeds(config.seed, self.num_envs))
        self.init_parts()

    def make_optimizer(self) -> torch.optim.Optimizer:
        # foreach: one call per step for all parameters, not a Python loop over them (torch picks it only on
        # GPUs); the same arithmetic on the same kernels, so the same weights (``tests/test_training/
        # test_ppo_speed.py``); ~50 us less per minibatch on the CPU
        return torch.optim.Adam(self.network.parameters(), lr=self.ppo.learning_rate, eps=1e-5, foreach=True)

    def learn(self, buf: RolloutBuffer) -> dict[str, float]:
        """One learner update on a fresh rollout (``self.collector.next_obs`` follows its last step)."""
        raise NotImplementedError

    # -- swappable parts (ModularAgent.set) -----------------------------------
    def _new_network(self, network: nn.Module) -> None:
        """Install ``network`` with a fresh optimiser at the current learning rate (parameters changed)."""
        self.network = network.to(self.device)
        lr = self.optimizer.param_groups[0]["lr"]
        self.optimizer = self.make_optimizer()
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def set_encoder(self, encoder) -> None:
        """A named encoder (``echo_rl.models.encoders``) or a module with ``out_dim``; fresh heads around it."""
        try:
            network = build_actor_critic(encoder, self.obs_shape, self.obs_dtype, self.num_actions,
                                         self.config.policy_network)
        except ValueError as exc:
            raise ConfigError(f"encoder {encoder if isinstance(encoder, str) else type(encoder).__name__} does not "
                              f"fit observations of shape {self.obs_shape}: {exc}") from None
        network.distribution = getattr(self.network, "distribution", None)
        self._new_network(network)

    def set_policy(self, policy: nn.Module) -> None:
        """The whole network: ``policy(obs) -> (logits, values)`` and ``policy.value(obs) -> values``."""
        if not isinstance(policy, nn.Module) or not callable(getattr(policy, "value", None)):
            raise ValueError(f"policy must be an nn.Module with forward(obs) -> (logits, values) and value(obs), got "
                             f"{type(policy).__name__}")
        if not hasattr(self.action_space, "n") and not is_continuous(getattr(policy, "distribution", None)):
            raise ValueError(f"policy {type(policy).__name__} acts in a Box action space: it needs a continuous "
                             f"distribution attribute (policy.distribution = DiagGaussian(dim))")
        self._new_network(policy)

    def set_storage(self, storage) -> None:
        """The rollout storage: a ``RolloutBuffer`` subclass or factory ``(num_steps, num_envs, obs_shape,
        obs_dtype) -> buffer`` with its arrays (obs, actions, logprobs, values, rewards, terminated, truncated,
        final_values); for Box actions it is also given ``action_shape=`` and ``action_dtype=``."""
        buf = storage(self.num_steps, self.num_envs, self.obs_shape, self.obs_dtype,
                      **action_layout(self.action_space))
        if getattr(buf, "actions", None) is not None and \
                buf.actions.shape[2:] != self.collector.buffer.actions.shape[2:]:
            raise ValueError(f"storage {type(buf).__name__} holds actions of shape {buf.actions.shape[2:]}; this "
                             f"task's actions have shape {self.collector.buffer.actions.shape[2:]}")
        missing = [a for a in ("obs", "actions", "logprobs", "values", "rewards", "terminated", "truncated",
                               "final_values") if getattr(buf, a, None) is None]
        if missing:
            raise ValueError(f"storage {type(buf).__name__} lacks the arrays {', '.join(missing)}")
        self.collector.buffer = buf
        if self.reward is not None:
            self._keep_next_observations()

    def set_distribution(self, distribution: nn.Module) -> None:
        """Discrete actions: ``distribution(logits) -> normalised log-probabilities`` (``echo_rl.models.policies``);
        acting and both learners read those, so it changes what is sampled and what is optimised. Box actions:
        a continuous distribution (``echo_rl.models.distributions``, e.g. ``DiagGaussian``); one with
        parameters (a learned log-std) gets a fresh optimiser that includes them."""
        if not isinstance(self.network, ActorCritic):
            raise ValueError(f"a distribution applies to ActorCritic networks; {type(self.network).__name__} "
                             f"returns its own logits")
        check_fits(distribution, self.action_space)
        self.network.distribution = distribution
        if isinstance(distribution, nn.Module) and any(True for _ in distribution.parameters()):
            self._new_network(self.network)

    # -- acting -------------------------------------------------------------
    def _obs(self, obs: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(obs, device=self.device)

    def _policy(self, obs: np.ndarray, forward=None):
        return sample_policy(self.network, self.generator, self._obs(obs), forward=forward)

    @torch.no_grad()
    def _value(self, obs: np.ndarray) -> np.ndarray:
        return self.network.value(self._obs(obs)).cpu().numpy()

    @torch.no_grad()
    def act(self, obs: np.ndarray, generator: torch.Generator, deterministic: bool = False) -> np.ndarray:
        """Sampled actions, or with ``deterministic`` the distribution's mode (argmax; a Gaussian's mean)."""
        logits, _ = self.network(self._obs(obs))
        distribution = getattr(self.network, "distribution", None)
        if is_continuous(distribution):  # the env clips to its bounds
            if deterministic:
                return _mode(distribution, logits).float().cpu().numpy()
            return distribution.sample(logits, generator).float().cpu().numpy()
        if deterministic:
            return logits.argmax(-1).cpu().numpy()
        return torch.multinomial(torch.softmax(logits, -1), 1, generator=generator).squeeze(-1).cpu().numpy()

    def evaluate(self, make_envs, episodes: int, seed: int, num_envs: int = 8) -> dict[str, float]:
        """Success and return over ``episodes`` seeded episodes (``rollout.evaluate_policy``): sampled actions, or
        the mode with ``evaluation_deterministic``."""
        generator, deterministic = torch_generator(seed), self.config.evaluation_deterministic
        return evaluate_policy(make_envs, lambda obs: self.act(obs, generator, deterministic), episodes, seed,
                               num_envs=num_envs)

    # -- learning -----------------------------------------------------------
    def start(self) -> None:
        """A fresh run with ``init_from`` starts from that run's network weights (never over a resumed one)."""
        if self.config.init_from and self.env_steps == 0 and self.updates == 0:
            self.load_weights_from(self.config.init_from)

    def load_weights_from(self, run_dir: str) -> None:
        """The network weights of ``run_dir``'s newest checkpoint (fine-tuning); optimiser and counters stay."""
        run = RunDirectory(run_dir, RunDirectory.config_of(run_dir, flag="init_from"))
        loaded = {}

        def apply(payload: dict, _rollout) -> None:
            weights = payload["state"].get("network")
            if not isinstance(weights, dict):
                raise ConfigError("its checkpoint holds no vector-policy network")
            try:
                self.network.load_state_dict(weights)
            except RuntimeError as exc:
                first = str(exc).strip().splitlines()[0]
                raise ConfigError(f"its network does not fit this agent's encoder ({first})") from None
            loaded["step"] = payload["step"]

        run.load_newest(apply, rollout=False)

    def rollout_env_steps(self, buf: RolloutBuffer) -> int:
        """Env steps one rollout adds to the run's count (every learner's, where several collect)."""
        return buf.num_steps * buf.num_envs

    def train_iteration(self) -> dict[str, float]:
        forward = flat_forward(self.network)  # built per rollout: it sees a network swapped in since the last
        buf = self.collector.collect(lambda obs: self._policy(obs, forward), self._value)
        self.env_steps += self.rollout_env_steps(buf)
        metrics = self.collector.stats.drain()
        if self.env_steps <= self.config.learning_starts:
            return metrics
        buf, part_metrics = self.learner_batch(buf)
        metrics.update(part_metrics)
        metrics.update(self.learn(buf))
        return metrics

    def anneal_lr(self) -> None:
        """Linear decay to 0 over the run (``ppo_config.anneal_lr``), from the optimiser's initial LR."""
        if self.ppo.anneal_lr:
            frac = max(1.0 - self.updates / self.num_updates_total, 0.0)
            for group in self.optimizer.param_groups:
                group["lr"] = frac * self.base_lr

    def clipped_step(self, loss: torch.Tensor, params: list | None = None) -> torch.Tensor:
        """Backward, global grad-norm clip (``ppo_config.max_grad_norm``), optimiser step; returns the norm.
        ``params``: the network's parameters, listed once by a caller that steps many minibatches."""
        self.zero_grad()
        loss.backward()
        grad_norm = clip_grad_norm(self.network.parameters() if params is None else params, self.ppo.max_grad_norm)
        self.optimizer.step()
        return grad_norm.detach()

    def zero_grad(self) -> None:
        """``optimizer.zero_grad(set_to_none=True)`` without its profiler record and grouping (~40 µs a step)."""
        for group in self.optimizer.param_groups:
            for p in group["params"]:
                p.grad = None

    # -- checkpointing ------------------------------------------------------
    def state_dict(self) -> dict:
        return {"network": self.network.state_dict(), "optimizer": self.optimizer.state_dict(),
                "generator": self.generator.get_state(), "np_rng": self.np_rng.bit_generator.state,
                "env_steps": self.env_steps, "updates": self.updates, **self.parts_state()}

    def load_state_dict(self, state: dict) -> None:
        self.load_parts_state(state)
        self.network.load_state_dict(state["network"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.generator.set_state(state["generator"])
        self.np_rng.bit_generator.state = state["np_rng"]
        self.env_steps, self.updates = int(state["env_steps"]), int(state["updates"])

    def rollout_state(self) -> VectorRolloutCollector:
        return self.collector

    def load_rollout_state(self, collector: VectorRolloutCollector) -> None:
        if not isinstance(collector, VectorRolloutCollector):
            written_by = "backend=ray" if isinstance(collector, dict) and collector.get("backend") == "ray" else \
                f"a {type(collector).__name__}"
            raise ConfigError(f"this checkpoint's rollout state was written by {written_by}; resume it with the "
                              f"backend that wrote it (weights and optimizer are compatible, envs mid-episode are not)")
        self.collector.envs.close()
        self.collector = collector
        if self.reward is not None:
            self._keep_next_observations()

    def close(self) -> None:
        self.collector.envs.close()


def _mode(distribution, params: torch.Tensor) -> torch.Tensor:
    """A continuous distribution's most likely action; one line naming the gap when it has no ``mode``."""
    if not callable(getattr(distribution, "mode", None)):
        raise ConfigError(f"evaluation_deterministic=True needs the distribution's mode(params); "
                          f"{type(distribution).__name__} has none (DiagGaussian has)")
    return distribution.mode(params)
