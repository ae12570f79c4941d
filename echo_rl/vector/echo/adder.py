"""Adders (Acme's word): what turns a collected rollout into replay items.

:class:`SequenceAdder` cuts the rollout into sequences of ``sequence_length`` steps, each
with the k states before it (for the plan windows), and adds them to the hot/cold prioritized
buffer scored by plan surprise ``||tau - tau_bar||^2 + alpha|r|`` of the plans the actors used
(``agent.set(storage=...)`` puts another prioritized buffer in its place, e.g. one ring without the
hot/cold split).
:class:`SelfImitationAdder` hands the steps of episodes that terminated, with their Monte
Carlo returns, to the self-imitation store at priority (R - V)+.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch

from echo_rl.config import ConfigError, TrainingConfig
from echo_rl.replay import HotColdBuffer
from echo_rl.vector.echo.actor import EchoRollout
from echo_rl.vector.echo.model import EchoModel
from echo_rl.vector.rollout import RolloutBuffer
from echo_rl.vector.self_imitation import SelfImitationReplay

REPLAY_MEMORY_LIMIT = 4 * 2**30
# checkpoints carry the replay's storage when it is at most this big (the study's settings: ~26 MiB)
REPLAY_CHECKPOINT_LIMIT = 256 * 2**20


class SequenceAdder:
    """Sequences of a rollout -> the hot/cold buffer (``self.replay``), scored by plan surprise."""

    #: what a replay storage must offer (``HotColdBuffer``'s interface; ``agent.set(storage=...)``)
    STORAGE_MEMBERS = ("add", "sample", "update_priorities", "ready", "__len__", "save", "load", "surprise")

    def __init__(self, config: TrainingConfig, model: EchoModel, num_steps: int, num_envs: int):
        self.config, self.model, self.num_steps, self.num_envs = config, model, num_steps, num_envs
        self.length = config.echo_config.sequence_length
        self.replay = self._make_replay(config)
        #: the storage's factory when one was swapped in (None: the hot/cold buffer)
        self.storage = None

    def set_storage(self, storage) -> None:
        """A fresh replay from ``storage(replay_config, example=item, seed=seed)`` (e.g.
        ``PrioritizedReplayBuffer.from_config``: one ring, no hot/cold split), in place of the hot/cold buffer."""
        if isinstance(storage, type) and issubclass(storage, RolloutBuffer):
            raise ValueError(f"echo-rl's storage is its sequence replay, a factory (replay_config, example=, "
                             f"seed=) -> prioritized buffer; {storage.__name__} is a rollout buffer, and echo-rl's "
                             f"rollout buffer carries the plan fields its actor writes, so it is not swapped")
        if not callable(storage):
            raise ValueError(f"storage must be a factory (replay_config, example=, seed=) -> prioritized buffer, got "
                             f"{type(storage).__name__}")
        replay = storage(self.config.replay_config, example=self.item_example(), seed=self.config.seed + 3)
        missing = [m for m in self.STORAGE_MEMBERS if not hasattr(replay, m)]
        if missing:
            raise ValueError(f"storage {type(replay).__name__} lacks {', '.join(missing)} (the prioritized replay "
                             f"interface of echo_rl.replay.PrioritizedReplayBuffer)")
        self.replay, self.storage = replay, storage

    def item_example(self) -> dict:
        L, k, m = self.length, self.model.k, self.model
        return {"obs": np.zeros((k + L + 1, m.obs_dim), np.uint8), "ep": np.zeros(k + L + 1, np.int64),
                "eps": np.zeros((L, m.latent), np.float16), "actions": np.zeros(L, np.int64),
                "logprobs": np.zeros(L, np.float32), "rewards": np.zeros(L, np.float32),
                "terminated": np.zeros(L, bool), "truncated": np.zeros(L, bool),
                "final_values": np.zeros(L, np.float32)}

    def _make_replay(self, config: TrainingConfig):
        rc, L = config.replay_config, self.length
        example = self.item_example()
        item_bytes = sum(v.nbytes for v in example.values())
        hot = min(rc.hot_buffer_size, rc.age_threshold, rc.max_replay_age)
        cold = max(0, min(rc.cold_buffer_size, rc.max_replay_age - hot))
        need = (hot + cold) * item_bytes
        self.replay_bytes = need
        if need > REPLAY_MEMORY_LIMIT:
            raise ConfigError(
                f"TrainingConfig.replay_config would preallocate {need / 2**30:.1f} GiB for {hot + cold} sequences "
                f"of {item_bytes} bytes (limit {REPLAY_MEMORY_LIMIT / 2**30:.0f} GiB): for echo-rl a replay item "
                f"is a sequence of {L} steps; lower replay_config.max_replay_age / cold_buffer_size")
        if need > REPLAY_CHECKPOINT_LIMIT:  # said once here, not at every checkpoint
            warnings.warn(f"echo-rl replay preallocates {need / 2**20:.0f} MiB ({hot + cold} sequences of "
                          f"{L} steps), over the {REPLAY_CHECKPOINT_LIMIT / 2**20:.0f} MiB "
                          f"checkpoints carry: a resumed run starts with an empty replay; lower "
                          f"replay_config.max_replay_age (configs/minigrid_doorkey8x8_echo_rl.yaml keeps 2048)",
                          stacklevel=3)
        return HotColdBuffer(rc, example=example, seed=config.seed + 3)

    @property
    def checkpointable(self) -> bool:
        """Whether checkpoints carry the replay's contents (``REPLAY_CHECKPOINT_LIMIT``)."""
        return self.replay_bytes <= REPLAY_CHECKPOINT_LIMIT

    def sequence_items(self, roll: EchoRollout, full_obs: np.ndarray, full_ep: np.ndarray) -> dict:
        L, k, T = self.length, self.model.k, self.num_steps
        items = {name: [] for name in self.item_example()}
        for t0 in range(0, T, L):
            items["obs"].append(full_obs[t0:t0 + k + L + 1].swapaxes(0, 1))
            items["ep"].append(full_ep[t0:t0 + k + L + 1].swapaxes(0, 1))
            sl = slice(t0, t0 + L)
            items["eps"].append(roll.eps[sl].swapaxes(0, 1).astype(np.float16))
            for name in ("actions", "logprobs", "rewards", "terminated", "truncated", "final_values"):
                items[name].append(getattr(roll, name)[sl].swapaxes(0, 1))
        return {name: np.concatenate(v) for name, v in items.items()}

    def add(self, roll: EchoRollout) -> None:
        """The rollout's sequences, scored by the plans the actors used (mean over each sequence's steps)."""
        full_obs, full_ep = roll.full()
        items = self.sequence_items(roll, full_obs, full_ep)
        L, plans = self.length, None
        if self.model.echo.latent_plan:
            T, N = self.num_steps, self.num_envs
            plans = roll.plan_mean.reshape(T // L, L, N, -1).mean(1).reshape((T // L) * N, -1)
        self.replay.add(items, self.scores(plans, items))

    def scores(self, plans, items: dict, update: bool = True) -> np.ndarray:
        """Plan-surprise score per sequence: its mean plan ``[B, latent]`` against tau_bar, plus |summed reward|."""
        B = items["actions"].shape[0]
        plans = np.zeros((B, 1)) if plans is None else np.asarray(plans.cpu() if torch.is_tensor(plans) else plans)
        return self.replay.surprise.score_batch(plans, items["rewards"].sum(1), update=update)


class SelfImitationAdder:
    """Episodes that terminated in a rollout -> the self-imitation store (``self.sil``), at priority (R - V)+.

    Fed every rollout (also before ``learning_starts``), so episodes spanning rollouts are stored whole.
    """

    def __init__(self, config: TrainingConfig, model: EchoModel, num_envs: int):
        rc, echo = config.replay_config, config.echo_config
        self.model = model
        self.sil = SelfImitationReplay(num_envs, model.obs_dim, model.k, echo.self_imitation_capacity,
                                       config.ppo_config.gamma, alpha=rc.priority_alpha,
                                       beta=rc.importance_sampling_beta, priority_epsilon=rc.priority_epsilon,
                                       seed=config.seed + 4)

    def add(self, roll: EchoRollout) -> None:
        items = self.sil.collect(roll.obs, roll.actions, roll.rewards, roll.terminated, roll.truncated)
        if items is None:
            return
        with torch.no_grad():
            _, values = self.model.window_heads(items["windows"], items["mask"])
        self.sil.buffer.add(items, np.maximum(items["return"] - values.cpu().numpy(), 0.0))
