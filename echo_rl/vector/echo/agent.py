"""``--agent echo-rl`` for vector environments: the actor, adders and learner joined on the shared collector.

Parts swap with ``agent.set(encoder=..., policy=..., storage=..., distribution=..., reward=...)``
(:mod:`echo_rl.vector.modular`, as on PPO and IMPALA; the config names them too: ``encoder``,
``intrinsic_reward``, ``init_from``). What each means here:

- ``encoder`` / ``policy``: the trunk (and heads) under the FiLM plan layer; the plan encoder and
  world model keep what they learned, the optimiser is fresh, an injected encoder keeps its weights;
- ``storage``: the sequence replay (a prioritized buffer factory in place of the hot/cold buffer);
- ``distribution``: logits -> log-probabilities for acting, PPO, V-trace and self-imitation alike;
- ``reward``: an intrinsic reward mixed into the rewards of the PPO pass and the replay (one critic,
  one return); self-imitation keeps the task's rewards: it imitates episodes by their task return;
- ``augmentation`` is refused: the agent reads MiniGrid's symbolic observation, not pixels.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import torch

from echo_rl.config import ConfigError, TrainingConfig
from echo_rl.environments.minigrid_vector import (MiniGridObsEncoding, actor_seeds, restore_vector_env,
                                                  snapshot_vector_env)
from echo_rl.models.distributions import refuse_continuous
from echo_rl.vector.echo.actor import EchoActor, EchoRollout, rollout_fields
from echo_rl.vector.echo.adder import SelfImitationAdder, SequenceAdder
from echo_rl.vector.echo.learner import EchoLearner
from echo_rl.vector.echo.model import EchoModel
from echo_rl.vector.modular import ModularAgent
from echo_rl.training.protocol import VectorAgentBase
from echo_rl.training.run_dir import RunDirectory
from echo_rl.utils.jail import check_npz
from echo_rl.vector.rollout import VectorRolloutCollector, torch_generator


class EchoAgent(ModularAgent, VectorAgentBase):
    """The trainer's agent protocol (:class:`echo_rl.training.protocol.Agent`), as PPO has it.

    One iteration: the collector steps the envs with :class:`EchoActor` (plan path), then
    :class:`EchoLearner` takes PPO's update with the plan terms, the adders write the rollout
    into the replay and the self-imitation store, and the learner takes their steps. With
    ``backend=ray`` the collector is remote (``echo_rl.vector.ray_backend``); the rest is this.
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
        try:
            refuse_continuous(envs, config.env_name, config.agent)
            self._check_task(config, envs.single_observation_space)
            torch.manual_seed(config.seed)
            self.obs_dim = int(envs.single_observation_space.shape[0])
            self.model = EchoModel(config, self.obs_dim, int(envs.single_action_space.n), device)
        except ConfigError:
            envs.close()
            raise
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
        self.init_parts()

    @staticmethod
    def _check_task(config: TrainingConfig, space) -> None:
        """One line for what the agent cannot read, and for pre-training with self-imitation on."""
        symbolic = (MiniGridObsEncoding().size,)
        if tuple(space.shape) != symbolic or np.dtype(space.dtype) != np.uint8:
            raise ConfigError(f"task {config.env_name!r} has {np.dtype(space.dtype).name} observations of shape "
                              f"{tuple(space.shape)}; the echo-rl agent reads MiniGrid's symbolic observation "
                              f"{symbolic} (uint8): its plan windows and world model are built on its grid tokens")
        if config.pretraining and config.echo_config.self_imitation_updates:
            raise ConfigError(f"TrainingConfig.pretraining=True is invalid for echo-rl with echo_config."
                              f"self_imitation_updates={config.echo_config.self_imitation_updates}: self-imitation "
                              f"learns from episodes' task returns, which pre-training must not see; set it to 0")

    # -- swappable parts (ModularAgent.set) -----------------------------------------------------
    def set_encoder(self, encoder) -> None:
        """A named encoder (mlp, minigrid, minigrid_cnn) or a module with ``out_dim``: the trunk under the plan
        layer, with fresh heads; used as it is (an injected, pretrained encoder keeps its weights)."""
        try:
            base = self.model.base_network(encoder)
            self._check_network(base)
        except ValueError as exc:
            raise ConfigError(f"encoder {encoder if isinstance(encoder, str) else type(encoder).__name__} does not "
                              f"fit the echo-rl agent's observations of shape ({self.obs_dim},): {exc}") from None
        self.model.replace_network(base)

    def set_policy(self, policy: torch.nn.Module) -> None:
        """An actor-critic (``encoder`` with ``out_dim``, ``actor`` and ``critic`` heads, as
        ``echo_rl.models.policies.ActorCritic``): the plan layer conditions its encoder's features before its
        heads, so a network that hides them cannot be the echo-rl policy."""
        parts = [getattr(policy, name, None) for name in ("encoder", "actor", "critic")]
        if not isinstance(policy, torch.nn.Module) or not all(isinstance(p, torch.nn.Module) for p in parts) \
                or not isinstance(getattr(parts[0], "out_dim", None), int):
            raise ValueError(f"policy must be an actor-critic nn.Module with encoder (int out_dim), actor and critic, "
                             f"got {type(policy).__name__}: echo-rl's plan layer sits between encoder and heads")
        self._check_network(policy)
        self.model.replace_network(policy)

    def _check_network(self, base) -> None:
        """One zero observation through encoder and heads: a misfit is a one-line ValueError, not a crash mid-run."""
        def fits(what: str, out: torch.Tensor, width: int) -> torch.Tensor:
            if tuple(out.shape) != (1, width):
                raise ValueError(f"its {what} have shape {tuple(out.shape)}, expected {(1, width)}")
            return out

        modules = (base.encoder, base.actor, base.critic)
        modes = [m.training for m in modules]
        try:
            for m in modules:
                m.eval()  # no batch statistics from the probe
            with torch.no_grad():
                h = fits("encoder features", base.encoder(torch.zeros(1, self.obs_dim, dtype=torch.uint8,
                                                                       device=self.device)), base.encoder.out_dim)
                fits("actor logits", base.actor(h), self.model.num_actions)
                fits("critic values", base.critic(h), 1)
        except RuntimeError as exc:
            raise ValueError(str(exc).strip().splitlines()[0]) from None
        finally:
            for m, mode in zip(modules, modes):
                m.train(mode)

    def set_storage(self, storage) -> None:
        """The sequence replay's storage (``SequenceAdder.set_storage``); the rollout buffer stays."""
        if self.adder is None:
            raise ConfigError("echo-rl's storage is its sequence replay, which echo_config.replay_updates=0 "
                              "switches off")
        self.adder.set_storage(storage)

    def set_distribution(self, distribution: torch.nn.Module) -> None:
        """``distribution(logits) -> normalised log-probabilities`` (``echo_rl.models.policies``), read by acting,
        PPO, V-trace and self-imitation; it stays through a later encoder or policy swap."""
        if not isinstance(distribution, torch.nn.Module):
            raise ValueError(f"distribution must be an nn.Module logits -> log-probabilities, got "
                             f"{type(distribution).__name__}")
        self.lpo.policy.distribution = distribution
        self.model.refresh_heads()

    def set_augmentation(self, augmentation) -> None:
        raise ConfigError("augmentation acts on pixel observations; the echo-rl agent reads MiniGrid's symbolic "
                          "observation (its plan windows and world model are built on its grid tokens)")

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
        self.model.refresh_heads()
        return self.actor.evaluate(make_envs, episodes, seed, num_envs, self.config.evaluation_deterministic)

    # -- learning -------------------------------------------------------------------------------
    def start(self) -> None:
        """A fresh run with ``init_from`` starts from that run's model weights (never over a resumed one)."""
        if self.config.init_from and self.env_steps == 0 and self.updates == 0:
            self.load_weights_from(self.config.init_from)

    def load_weights_from(self, run_dir: str) -> None:
        """The model weights (plan encoder, policy, world model) of ``run_dir``'s newest checkpoint, for
        fine-tuning; the optimiser, the EMA plan and the counters start fresh."""
        run = RunDirectory(run_dir, RunDirectory.config_of(run_dir, flag="init_from"))

        def apply(payload: dict, _rollout) -> None:
            lpo = payload["state"].get("lpo")
            if not isinstance(lpo, dict) or not isinstance(lpo.get("modules"), dict):
                raise ConfigError("its checkpoint holds no echo-rl model (init_from takes an --agent echo-rl run)")
            self._load_modules(lpo["modules"], "its model")

        run.load_newest(apply, rollout=False)

    def _load_modules(self, weights: dict, what: str) -> None:
        try:
            self.lpo.modules().load_state_dict(weights)
        except RuntimeError as exc:
            first = str(exc).strip().splitlines()[0]
            raise ConfigError(f"{what} does not fit this agent's parts ({first}); give the agent the encoder, "
                              f"policy and distribution the run was trained with") from None

    def train_iteration(self) -> dict[str, float]:
        self.model.refresh_heads()  # sees heads, a distribution or hooks changed since the last iteration
        roll = self.collect()
        self.env_steps += self.num_steps * self.num_envs
        metrics = self.collector.stats.drain()
        if self.sil_adder is not None:  # every rollout, so episodes spanning rollouts are stored whole
            self.sil_adder.add(roll)  # the task's rewards: self-imitation imitates by task return
        if self.env_steps <= self.config.learning_starts:
            return metrics
        roll, part_metrics = self.learner_batch(roll)  # the intrinsic reward mixed in (PPO pass and replay)
        metrics.update(part_metrics)
        metrics.update(self.learner.update(roll, self.updates))
        self.updates += 1
        return metrics

    # -- checkpointing --------------------------------------------------------------------------
    def state_dict(self) -> dict:
        state = {"lpo": self.lpo.state_dict(), "generator": self.generator.get_state(),
                 "np_rng": self.np_rng.bit_generator.state, "env_steps": self.env_steps, "updates": self.updates,
                 **self.parts_state()}
        if self.adder is not None and self.adder.storage is not None:  # its contents travel in rollout_state
            state["replay_storage"] = type(self.replay).__name__
        return state

    def load_state_dict(self, state: dict) -> None:
        self.load_parts_state(state)
        ours = None if self.adder is None or self.adder.storage is None else type(self.replay).__name__
        if state.get("replay_storage") != ours:
            theirs, default = state.get("replay_storage"), "the hot/cold buffer"
            raise ConfigError(f"this checkpoint's replay storage is {theirs or default} and this agent's is "
                              f"{ours or default}; give the resumed agent the parts the run was trained with")
        self._load_modules(state["lpo"]["modules"], "this checkpoint's model")
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
                data = _as_bytes(state["replay_npz"])
                check_npz(data, where="the checkpoint's replay")  # from a run directory: checked before it inflates
                path.write_bytes(data)
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
    for ``echo_rl.utils.state_codec``. The pickled layout is the one checkpoints have
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
        return {"envs": snapshot_vector_env(self.envs), "arrays": self.arrays, **self.replay}

    def __setstate__(self, state: dict) -> None:
        self.envs, self.arrays = restore_vector_env(state["envs"]), state["arrays"]
        self.replay = {"replay_npz": state.get("replay_npz"), "sil": state.get("sil")}


def _as_array(blob: bytes | None) -> np.ndarray | None:
    return None if blob is None else np.frombuffer(blob, dtype=np.uint8)


def _as_bytes(blob: np.ndarray | bytes | None) -> bytes | None:
    return None if blob is None else bytes(blob) if isinstance(blob, bytes) else np.asarray(blob, np.uint8).tobytes()
