"""DQN for vector environments (``--agent dqn``), in CleanRL's dqn.py shape, learning through the replay service.

Acting: ``num_actors`` envs step with an epsilon-greedy policy over the online Q network; epsilon falls
linearly from ``start_e`` to ``end_e`` over ``exploration_fraction`` of the schedule horizon (the first
run's ``total_timesteps``, kept in the checkpoint: a resume with another budget neither re-stretches nor
squeezes exploration; past the horizon epsilon stays ``end_e`` and beta 1). Every env
step's transitions go to the learner's :class:`~echo_rl.distributed.server.ReplayServer` through a
shared-memory :class:`~echo_rl.distributed.client.ReplayClient` (acknowledged before the learner draws,
so a run is a function of its seed); nothing reaches the learner any other way.

Learning: once ``learning_starts`` env steps have passed and the replay holds ``min_experiences``, one
gradient step per ``train_frequency`` env steps (or, with ``replay_config.samples_per_insert``, as many
as the rate limiter allows) on ``minibatch_size`` transitions drawn by priority; the loss is
:func:`echo_rl.algorithms.dqn.dqn_loss` against (Double) DQN targets of a target network updated every
``target_network_frequency`` gradient steps (``tau``: copy or Polyak), weighted by PER's importance
weights with beta annealed from ``importance_sampling_beta`` to 1 over the horizon, and each drawn
transition's priority becomes its ``|TD error|``.

One trainer iteration spans ``steps_per_update`` env steps (``train_frequency`` or ``batch_size`` of
the TrainingConfig: the metrics row's granularity); ``updates`` counts gradient steps. With
``backend=ray`` the actors are Ray workers (:mod:`echo_rl.vector.ray_offpolicy`).
"""

from __future__ import annotations

import copy

import numpy as np
import torch
from torch import nn

from echo_rl.algorithms.dqn import annealed_beta, dqn_loss, linear_epsilon, td_targets
from echo_rl.config import ConfigError, TrainingConfig
from echo_rl.environments.minigrid_vector import actor_seeds
from echo_rl.models.distributions import refuse_continuous
from echo_rl.models.encoders import default_encoder, layer_init, make_encoder
from echo_rl.replay.rate_limiter import RateLimited
from echo_rl.vector.offpolicy_replay import ReplayFeed, rollout_transitions, transition_example
from echo_rl.training.protocol import VectorAgentBase
from echo_rl.vector.rollout import VectorRolloutCollector, evaluate_policy

SAMPLE_TIMEOUT_S = 30.0  # longest a learner waits for a batch the actors owe it


class QNetwork(nn.Module):
    """An observation encoder (``echo_rl.models.encoders``) and a two-layer ReLU head, one Q value per action."""

    def __init__(self, encoder: nn.Module, num_actions: int, hidden: int):
        super().__init__()
        self.encoder = encoder
        self.head = nn.Sequential(layer_init(nn.Linear(encoder.out_dim, hidden)), nn.ReLU(),
                                  layer_init(nn.Linear(hidden, hidden)), nn.ReLU(),
                                  layer_init(nn.Linear(hidden, num_actions), std=1.0))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(obs))


def build_q_network(config: TrainingConfig, obs_shape: tuple, obs_dtype, num_actions: int) -> QNetwork:
    name = config.encoder or default_encoder(obs_shape, obs_dtype, config.policy_network)
    return QNetwork(make_encoder(name, obs_shape), num_actions, config.dqn_config.hidden_dim)


class EpsilonGreedy:
    """The collector's actor: argmax Q, or with probability ``epsilon`` a uniform action (own seeded RNG)."""

    def __init__(self, network: nn.Module, num_actions: int, seed: int):
        self.network, self.num_actions = network, num_actions
        self.rng = np.random.default_rng(seed)
        self.epsilon = 1.0

    def begin(self) -> dict:
        return {}

    @torch.no_grad()
    def select(self, obs: np.ndarray):
        n = obs.shape[0]
        device = next(self.network.parameters()).device
        greedy = self.network(torch.as_tensor(obs, device=device)).argmax(-1).cpu().numpy()
        explore = self.rng.random(n) < self.epsilon
        actions = np.where(explore, self.rng.integers(self.num_actions, size=n), greedy)
        zeros = np.zeros(n, dtype=np.float32)
        return actions, zeros, zeros, {}

    def final_values(self, final_obs, env_ids):
        return np.zeros(len(env_ids), dtype=np.float32)

    def observe(self, done) -> None:
        pass

    def end(self) -> dict:
        return {}


def check_config(config: TrainingConfig) -> None:
    """What the dqn agent does not take, refused in one line before anything is built."""
    for name in ("intrinsic_reward", "augmentation", "init_from"):
        if getattr(config, name) is not None:
            raise ConfigError(f"TrainingConfig.{name}={getattr(config, name)!r} is invalid with agent='dqn': it is a "
                              f"part of the actor-critic agents (ppo, impala, echo-rl)")
    d = config.dqn_config
    if d.end_e > d.start_e:
        raise ConfigError(f"DQNConfig.end_e={d.end_e} is invalid: must be <= start_e={d.start_e} (epsilon decays)")


class DQNAgent(VectorAgentBase):
    """``--agent dqn``: the :class:`~echo_rl.training.protocol.Agent` the trainer drives (module docstring)."""

    #: backend=ray builds the Ray form (actors as Ray workers pushing to this learner's replay server)
    ray_builder = "echo_rl.vector.ray_offpolicy:build_ray_dqn"

    def __init__(self, config: TrainingConfig, envs, device: torch.device):
        try:
            check_config(config)
            refuse_continuous(envs, config.env_name, config.agent)
            self.config, self.dqn, self.device = config, config.dqn_config, device
            torch.manual_seed(config.seed)
            space = envs.single_observation_space
            self.obs_shape, self.obs_dtype = tuple(space.shape), space.dtype
            self.num_actions = int(envs.single_action_space.n)
            self.num_envs = envs.num_envs
            try:
                self.q = build_q_network(config, self.obs_shape, self.obs_dtype, self.num_actions).to(device)
            except ValueError as exc:
                raise ConfigError(f"TrainingConfig.encoder={config.encoder!r} does not fit task "
                                  f"{config.env_name!r}: {exc}") from None
            self.target = copy.deepcopy(self.q)
            self.optimizer = torch.optim.Adam(self.q.parameters(), lr=self.dqn.learning_rate)
            self.actor = EpsilonGreedy(self.q, self.num_actions, config.seed + 1)
            self.env_steps = 0
            self.updates = 0
            self.grad_credit = 0.0  # gradient steps owed by the env steps so far (train_frequency schedule)
            # the env steps the epsilon and beta schedules span: this run's budget, or a resumed run's first
            self.schedule_timesteps = int(config.total_timesteps)
            self.feed = self.make_feed()
            self.start_acting(envs)
        except BaseException:
            envs.close()
            if getattr(self, "feed", None) is not None:
                self.feed.close()
            raise

    # -- the replay service and the actors (Ray overrides these) --------------------
    def make_feed(self) -> ReplayFeed:
        return ReplayFeed(self.config, transition_example(self.obs_shape, self.obs_dtype))

    def start_acting(self, envs) -> None:
        self.collector = VectorRolloutCollector(envs, 1, actor_seeds(self.config.seed, self.num_envs),
                                                next_observations=True)
        self.writer = self.feed.writer("actors")

    @property
    def epsilon(self) -> float:
        d = self.dqn
        return linear_epsilon(d.start_e, d.end_e, d.exploration_fraction * self.schedule_timesteps, self.env_steps)

    @property
    def beta(self) -> float:
        """PER's importance exponent, annealed linearly to 1 over the schedule horizon (Schaul et al. 2016)."""
        return annealed_beta(self.config.replay_config.importance_sampling_beta, self.schedule_timesteps,
                             self.env_steps)

    def train_iteration(self) -> dict[str, float]:
        end = self.env_steps + self.config.steps_per_update
        rows: list[dict[str, float]] = []
        while self.env_steps < end:
            self.actor.epsilon = self.epsilon
            buf = self.collector.run(self.actor)
            self.writer.send_batch(rollout_transitions(buf))
            if not self.writer.flush(wait=True, timeout=SAMPLE_TIMEOUT_S):
                raise RuntimeError(f"the replay server did not acknowledge the actors' transitions within "
                                   f"{SAMPLE_TIMEOUT_S:g}s")
            self.env_steps += buf.num_steps * buf.num_envs
            rows += self.learn_owed(buf.num_steps * buf.num_envs, timeout=0.0)
        return {**self.collector.stats.drain(), **self.iteration_metrics(rows)}

    # -- learning --------------------------------------------------------------------
    def learn_owed(self, new_steps: int, timeout: float) -> list[dict[str, float]]:
        """The gradient steps ``new_steps`` more env steps earn: one per ``train_frequency`` (carried over
        between calls), or every draw the rate limiter admits; none before ``learning_starts`` and a ready
        replay. A draw the replay cannot serve within ``timeout`` is owed to the next call."""
        buffer = self.feed.buffer
        if self.env_steps <= self.config.learning_starts or not buffer.ready:
            return []
        rows = []
        limiter = buffer.rate_limiter
        if limiter is None:
            self.grad_credit += new_steps / self.dqn.train_frequency
        while (limiter.can_sample(self.dqn.minibatch_size) if limiter is not None else self.grad_credit >= 1.0):
            try:
                rows.append(self.learn_step(timeout))
            except (TimeoutError, RateLimited):  # RateLimited is a TimeoutError too; named for the reader
                break
            if limiter is None:
                self.grad_credit -= 1.0
        return rows

    def learn_step(self, timeout: float | None = SAMPLE_TIMEOUT_S) -> dict[str, float]:
        """One gradient step on a prioritized batch from the server; its priorities become |TD error|."""
        d = self.dqn
        batch = self.feed.server.sample(d.minibatch_size, timeout=timeout, beta=self.beta)
        t = lambda a: torch.as_tensor(a, device=self.device)  # noqa: E731
        data = batch.data
        obs, next_obs = t(data["obs"]), t(data["next_obs"])
        rewards, terminated = t(data["reward"]), t(data["terminated"])
        with torch.no_grad():
            next_online = self.q(next_obs) if d.double_q else None
            targets = td_targets(rewards, terminated, self.target(next_obs), d.gamma, next_online)
        q_values = self.q(obs)
        out = dqn_loss(q_values, t(data["action"]), targets, t(batch.weights.astype(np.float32)), d.loss)
        self.optimizer.zero_grad(set_to_none=True)
        out.loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.q.parameters(), d.max_grad_norm)
        self.optimizer.step()
        td = out.td_errors.abs().cpu().numpy().astype(np.float64)
        self.feed.server.update_priorities(batch.indices, td)
        self.updates += 1
        if self.updates % d.target_network_frequency == 0:
            self.update_target()
        return {"loss/td": float(out.loss.detach()), "loss/abs_td_error": float(td.mean()),
                "loss/q_mean": float(q_values.detach().mean()), "loss/grad_norm": float(grad_norm),
                "loss/is_weight_mean": float(batch.weights.mean())}

    @torch.no_grad()
    def update_target(self) -> None:
        tau = self.dqn.tau
        for target, online in zip(self.target.parameters(), self.q.parameters()):
            target.copy_(online if tau == 1.0 else tau * online + (1.0 - tau) * target)

    def iteration_metrics(self, rows: list[dict[str, float]]) -> dict[str, float]:
        out = {k: float(np.mean([r[k] for r in rows])) for k in rows[0]} if rows else {}
        server = self.feed.server
        out.update({"dqn/epsilon": self.epsilon, "dqn/beta": self.beta, "loss/minibatches": float(len(rows)),
                    "replay/size": float(len(self.feed.buffer)), "replay/samples_added": float(server.samples_added)})
        return out

    # -- evaluation --------------------------------------------------------------------
    def evaluate(self, make_envs, episodes: int, seed: int, num_envs: int = 8) -> dict[str, float]:
        """Epsilon-greedy at ``eval_epsilon`` (greedy with ``evaluation_deterministic``), seeded from ``seed``, over
        ``episodes`` seeded episodes."""
        actor = EpsilonGreedy(self.q, self.num_actions, seed)
        actor.epsilon = 0.0 if self.config.evaluation_deterministic else self.dqn.eval_epsilon
        return evaluate_policy(make_envs, lambda obs: actor.select(obs)[0], episodes, seed, num_envs=num_envs)

    def summary_fields(self) -> dict:
        return {"replay_samples_added": self.feed.server.samples_added}

    # -- checkpoints ---------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"network": self.q.state_dict(), "target_network": self.target.state_dict(),
                "optimizer": self.optimizer.state_dict(), "actor_rng": self.actor.rng.bit_generator.state,
                "env_steps": self.env_steps, "updates": self.updates, "grad_credit": self.grad_credit,
                "schedule_timesteps": self.schedule_timesteps}

    def load_state_dict(self, state: dict) -> None:
        self.q.load_state_dict(state["network"])
        self.target.load_state_dict(state["target_network"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.actor.rng.bit_generator.state = state["actor_rng"]
        self.env_steps, self.updates = int(state["env_steps"]), int(state["updates"])
        self.grad_credit = float(state["grad_credit"])
        # the schedules keep the horizon the run started with, whatever budget the resume was given
        # (a checkpoint from before the horizon was saved: this run's budget)
        self.schedule_timesteps = int(state.get("schedule_timesteps", self.config.total_timesteps))

    def rollout_state(self) -> dict:
        """The envs mid-episode and the replay's contents (None when too large: the resumed replay starts empty)."""
        return {"backend": "local", "collector": self.collector, "replay_npz": self.feed.state()}

    def load_rollout_state(self, state) -> None:
        if not isinstance(state, dict) or state.get("backend") != "local" or "replay_npz" not in state:
            raise ConfigError("this checkpoint's rollout state was not written by the local dqn agent; resume it "
                              "with the backend and agent that wrote it")
        self.collector.envs.close()
        self.collector = state["collector"]
        self.feed.load_state(state["replay_npz"])

    def close(self) -> None:
        writer, self.writer = getattr(self, "writer", None), None
        if writer is not None:
            writer.close()
        if getattr(self, "collector", None) is not None:
            self.collector.envs.close()
        self.feed.close()


__all__ = ["DQNAgent", "EpsilonGreedy", "QNetwork", "build_q_network", "check_config"]
