"""``--agent echo-rl`` for vector environments: the actor, adders and learner joined on the shared collector."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import torch

from echo_rl.config import ConfigError, TrainingConfig
from echo_rl.environments.minigrid_vector import actor_seeds
from echo_rl.training.echo.actor import EchoActor, EchoRollout, rollout_fields
from echo_rl.training.echo.adder import SelfImitationAdder, SequenceAdder
from echo_rl.training.echo.learner import EchoLearner
from echo_rl.training.echo.model import EchoModel
from echo_rl.training.protocol import VectorAgentBase
from echo_rl.training.rollout import VectorRolloutCollector, torch_generator


class EchoAgent(VectorAgentBase):
    """The trainer's agent protocol (:class:`echo_rl.training.protocol.Agent`), as PPO has it.

    One iteration: the collector steps the envs with :class:`EchoActor` (plan path), then
    :class:`EchoLearner` takes PPO's update with the plan terms, the adders write the rollout
    into the replay and the self-imitation store, and the learner takes their steps. With
    ``backend=ray`` the collector is remote (``echo_rl.distributed.ray_backend``); the rest is this.
    """

    def __init__(self, config: TrainingConfig, envs, device: torch.device):
        if config.steps_per_update != config.batch_size:
            raise ValueError(f"TrainingConfig.train_frequency={config.train_frequency} is invalid for echo-rl: "
                             f"its PPO part updates every batch_size={config.batch_size} env steps")
        self.config, self.ppo, self.echo = config, config.ppo_config, config.echo_config
        self.device = device
        self.num_envs = envs.num_envs
        self.num_steps = config.batch_size // self.num_envs
        if self.echo.replay_updates and self.num_steps % self.echo.sequence_length:
            raise ConfigError(f"EchoAgentConfig.sequence_length={self.echo.sequence_length} is invalid: must divide "
                              f"the rollout length batch_size/num_actors={self.num_steps}")
        torch.manual_seed(config.seed)
        self.obs_dim = int(envs.single_observation_space.shape[0])
        self.model = EchoModel(config, self.obs_dim, int(envs.single_action_space.n), device)
        self.generator = torch_generator(config.seed + 1)
        self.np_rng = np.random.default_rng(config.seed + 2)
        self.adder = SequenceAdder(config, self.model, self.num_steps, self.num_envs) \
            if self.echo.replay_updates else None
        self.sil_adder = SelfImitationAdder(config, self.model, self.num_envs) \
            if self.echo.self_imitation_updates else None
        self.learner = EchoLearner(config, self.model, self.num_steps, self.num_envs, self.np_rng, self.adder,
                                   self.sil_adder)
        self.actor = EchoActor(self.model, self.num_envs, self.generator)
        self.collector = VectorRolloutCollector(envs, self.num_steps, actor_seeds(config.seed, self.num_envs),
                                                extras=rollout_fields(self.model), next_observations=True)
        self.env_steps = 0
        self.updates = 0

    # -- the parts, by the names the rest of the code reads ------------------------------------
    @property
    def lpo(self):
        """Plan encoder, policy, world model and their optimiser."""
        return self.model.lpo

    @property
    def network(self) -> torch.nn.Module:
        """What the actors act with (the weights remote actors are sent)."""
        return self.model.acting

    @property
    def replay(self):
        return None if self.adder is None else self.adder.replay

    @property
    def sil(self):
        return None if self.sil_adder is None else self.sil_adder.sil

    # -- acting ---------------------------------------------------------------------------------
    def collect(self) -> EchoRollout:
        """One rollout of ``num_steps`` steps of every env."""
        buf = self.collector.run(self.actor)
        return EchoRollout.from_buffer(buf, self.collector.next_obs)

    def act(self, obs: np.ndarray, generator: torch.Generator, episode_start: np.ndarray | None = None) -> np.ndarray:
        return self.actor.act(obs, generator, episode_start)

    def evaluate(self, make_envs, episodes: int, seed: int, num_envs: int = 8) -> dict[str, float]:
        return self.actor.evaluate(make_envs, episodes, seed, num_envs)

    # -- learning -------------------------------------------------------------------------------
    def train_iteration(self) -> dict[str, float]:
        roll = self.collect()
        self.env_steps += self.num_steps * self.num_envs
        metrics = self.collector.stats.drain()
        if self.sil_adder is not None:  # every rollout, so episodes spanning rollouts are stored whole
            self.sil_adder.add(roll)
        if self.env_steps <= self.config.learning_starts:
            return metrics
        metrics.update(self.learner.update(roll, self.updates))
        self.updates += 1
        return metrics

    # -- checkpointing --------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"lpo": self.lpo.state_dict(), "generator": self.generator.get_state(),
                "np_rng": self.np_rng.bit_generator.state, "env_steps": self.env_steps, "updates": self.updates}

    def load_state_dict(self, state: dict) -> None:
        self.lpo.load_state_dict(state["lpo"])
        self.generator.set_state(state["generator"])
        self.np_rng.bit_generator.state = state["np_rng"]
        self.env_steps, self.updates = int(state["env_steps"]), int(state["updates"])

    def replay_state(self) -> dict:
        """The replay's and the self-imitation store's contents as plain data (uint8 arrays of their own exact
        ``save`` files). The replay is carried only up to ``adder.REPLAY_CHECKPOINT_LIMIT``; a bigger one is left
        out (the agent warned when it built it): a run resumed from that checkpoint starts with an empty replay."""
        replay = None
        if self.adder is not None and self.adder.checkpointable:
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / "replay.npz"
                self.replay.save(path)
                replay = _as_array(path.read_bytes())
        sil = None
        if self.sil is not None:
            sil = self.sil.state()
            sil = {**sil, "buffer_npz": _as_array(sil["buffer_npz"])}
        return {"replay_npz": replay, "sil": sil}

    def load_replay_state(self, state: dict) -> None:
        if self.replay is not None and state.get("replay_npz") is not None:
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / "replay.npz"
                path.write_bytes(_as_bytes(state["replay_npz"]))
                self.replay.load(path)
        sil = state.get("sil")
        if self.sil is not None and sil is not None:
            self.sil.load_state({**sil, "buffer_npz": _as_bytes(sil["buffer_npz"])})

    def rollout_state(self) -> "_ActorState":
        """Envs mid-episode, the actors' windows and the replays' contents (plain data), so a resumed run
        continues exactly where the checkpoint left it."""
        c, a = self.collector, self.actor
        arrays = {"next_obs": c.next_obs, "hist_obs": a.hist_obs, "hist_ep": a.hist_ep, "cur_ep": a.cur_ep,
                  "ep_return": c.ep_return, "ep_length": c.ep_length}
        return _ActorState(c.envs, arrays, self.replay_state())

    def load_rollout_state(self, state: "_ActorState") -> None:
        if not isinstance(state, _ActorState):
            written_by = "backend=ray" if isinstance(state, dict) and state.get("backend") == "ray" else \
                f"a {type(state).__name__}"
            raise ConfigError(f"this checkpoint's rollout state was written by {written_by}; resume it with the "
                              f"backend that wrote it (weights and optimizer are compatible, envs mid-episode are not)")
        c, a = self.collector, self.actor
        c.envs.close()
        c.envs = state.envs
        arr = state.arrays
        c.next_obs, c.ep_return, c.ep_length = arr["next_obs"], arr["ep_return"], arr["ep_length"]
        a.hist_obs, a.hist_ep, a.cur_ep = arr["hist_obs"], arr["hist_ep"], arr["cur_ep"]
        self.load_replay_state(state.replay)

    def close(self) -> None:
        self.collector.envs.close()


class _ActorState:
    """What the actors hold between iterations, plus the replays' contents (``EchoAgent.replay_state``).

    The envs are snapshotted the way the PPO collector does; everything is plain data
    for ``echo_rl.training.state_codec``. The pickled layout is the one checkpoints have
    always had (envs, arrays, replay_npz, sil), so older checkpoints resume.
    """

    def __init__(self, envs, arrays: dict, replay: dict):
        self.envs, self.arrays = envs, {k: np.copy(v) for k, v in arrays.items()}
        self.replay = replay

    @property
    def replay_npz(self):
        return self.replay.get("replay_npz")

    @property
    def sil(self):
        return self.replay.get("sil")

    def __getstate__(self) -> dict:
        from echo_rl.environments.minigrid_vector import snapshot_vector_env

        return {"envs": snapshot_vector_env(self.envs), "arrays": self.arrays, **self.replay}

    def __setstate__(self, state: dict) -> None:
        from echo_rl.environments.minigrid_vector import restore_vector_env

        self.envs, self.arrays = restore_vector_env(state["envs"]), state["arrays"]
        self.replay = {"replay_npz": state.get("replay_npz"), "sil": state.get("sil")}


def _as_array(blob: bytes | None) -> np.ndarray | None:
    return None if blob is None else np.frombuffer(blob, dtype=np.uint8)


def _as_bytes(blob: np.ndarray | bytes | None) -> bytes | None:
    return None if blob is None else bytes(blob) if isinstance(blob, bytes) else np.asarray(blob, np.uint8).tobytes()
