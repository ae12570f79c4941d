"""The trainer side of the LM path: learner updates and replay steps on the generator's trajectories.

Across the narrow boundary of :mod:`echo_rl.lm.generator`, the
trainer only consumes :class:`~echo_rl.types.TokenTrajectory` batches and
hands back one versioned :class:`~echo_rl.lm.generator.WeightUpdate`
(the engine copy's weights and the latent planner's). One :meth:`LMTrainer.step`
= the on-policy ECHO/GRPO update, then (``lm_config.replay_updates > 0``) the
fresh trajectories enter the hot/cold buffer with their group advantage and
priority |A| + λ·CE (their loss magnitude) and ``replay_updates`` more learner
steps train on ``replay_batch`` sampled trajectories, weighted by the buffer's
importance weights; samples more than ``max_staleness`` policy versions old are
dropped, never trained on. Every learner step's weighted |ℓ_PG| goes to the
run's η_bw tracker. The SFT warm start trains the same learner
(:meth:`LMLearner.sft_update`).
"""

from __future__ import annotations

import copy
from typing import Any, Sequence

import numpy as np

from echo_rl.config import ConfigError, ReplayConfig, TrainingConfig
from echo_rl.training.bandwidth import BandwidthEfficiencyTracker
from echo_rl.lm.generator import WeightUpdate
from echo_rl.lm.learner import LMLearner
from echo_rl.lm.replay import TrajectoryReplay
from echo_rl.types import TokenTrajectory


class LMTrainer:
    """Owns the learner (the trainable model, the planner, their optimiser and version) and the replay."""

    def __init__(self, config: TrainingConfig, model: Any, planner: Any | None, pad_id: int, lam: float,
                 tracker: BandwidthEfficiencyTracker) -> None:
        lm = config.lm_config
        self.config, self.planner, self.lam, self.bandwidth = config, planner, lam, tracker
        self.learner = LMLearner(model, pad_id, lm, lam=lam, planner=planner,
                                 ref_model=copy.deepcopy(model) if lm.kl_coef else None)
        use_replay = lm.replay_updates > 0 and (config.agent != "echo-rl" or config.echo_config.replay_updates > 0)
        if use_replay and self.learner.objective.advantages is not None:
            raise ConfigError(f"lm_config.objective={lm.objective!r} is invalid with replay (lm_config.replay_updates="
                              f"{lm.replay_updates}): the replay keeps one advantage per trajectory, this objective's "
                              "are per step; set lm_config.replay_updates=0")
        self.replay = self._make_replay() if use_replay else None

    def step(self, trajectories: Sequence[TokenTrajectory]) -> tuple[dict[str, float], dict[str, float]]:
        """One update on a fresh batch, then the replay steps: (learner metrics, ``replay/*`` metrics)."""
        m = self.learner.update(trajectories)
        self._record_update(m)
        replayed = self._replay_steps(list(trajectories)) if self.replay is not None else {}
        return m, replayed

    def weight_update(self) -> WeightUpdate:
        """What the generator loads next: the engine copy's weights and the planner's, under one version."""
        return WeightUpdate(self.learner.version, self.learner.state_dict_for_engine(),
                            self.planner.state_dict() if self.planner is not None else None)

    def _record_update(self, m: dict[str, float]) -> None:
        """η_bw counts every learner step's weighted |ℓ_PG|."""
        self.bandwidth.record_learner_update(
            self.config.bandwidth_config.pg_loss_weight * abs(m.get("pg_loss", m["loss"])))

    # -- replay ---------------------------------------------------------------------------
    def _make_replay(self) -> Any:
        """The LM replay's sizes are in trajectories (``lm_config``), its sampling exponents from ``replay_config``.

        Sampling is proportional to the priority (PER): a stale sample's priority set to 0 then means it
        is not drawn again, which the softmax rule over plan-surprise scores would not give.
        """
        lm, rc = self.config.lm_config, self.config.replay_config
        cfg = ReplayConfig(hot_buffer_size=lm.replay_capacity, cold_buffer_size=lm.replay_capacity,
                           age_threshold=max(1, lm.replay_capacity // 2), max_replay_age=lm.replay_capacity,
                           sampling_mode="proportional", min_experiences=lm.replay_batch,
                           priority_alpha=rc.priority_alpha, priority_epsilon=rc.priority_epsilon,
                           importance_sampling_beta=rc.importance_sampling_beta,
                           hot_sample_ratio=rc.hot_sample_ratio)
        plan_dim = self.planner.latent_dim if self.planner is not None else 0
        return TrajectoryReplay(cfg, max_len=lm.replay_max_tokens, max_turns=lm.max_turns, seed=self.config.seed,
                                plan_dim=plan_dim)

    def _priorities(self) -> np.ndarray:
        rows = self.learner.last_rows
        return rows["advantage_abs"] + self.lam * rows["env_ce"]

    def _replay_steps(self, fresh: list) -> dict[str, float]:
        """Add the batch just trained on, then ``replay_updates`` importance-weighted steps on sampled ones."""
        lm = self.config.lm_config
        adv = self.learner.last_rows["advantage"]
        keep = [i for i, t in enumerate(fresh) if self.replay.fits(t)]
        if keep:
            self.replay.add([fresh[i] for i in keep], adv[keep], self._priorities()[keep])
        out = {"replay/added": float(len(keep)), "replay/too_long": float(len(fresh) - len(keep))}
        steps, trained, dropped0, expired0 = 0, 0, self.replay.dropped_stale, self.replay.expired
        stats: dict[str, list[float]] = {}
        for _ in range(lm.replay_updates):
            if len(self.replay) < lm.replay_batch:
                break
            got, advs, weights, idx = self.replay.sample(lm.replay_batch, current_version=self.learner.version,
                                                         max_staleness=lm.max_staleness)
            if not got:
                continue
            m = self.learner.update(got, advantages=advs, weights=weights)
            self.replay.update_priorities(idx, self._priorities())
            self._record_update(m)
            steps, trained = steps + 1, trained + len(got)
            for k in ("loss", "pg_loss", "env_ce", "clip_fraction", "ratio_mean", "staleness_max"):
                if k in m:
                    stats.setdefault(k, []).append(m[k])
            stats.setdefault("importance_weight_mean", []).append(float(np.mean(weights)))
        out.update({"replay/steps": float(steps), "replay/trained": float(trained),
                    "replay/dropped_stale": float(self.replay.dropped_stale - dropped0),
                    "replay/expired": float(self.replay.expired - expired0),
                    "replay/size": float(len(self.replay))})
        out.update({f"replay/{k}": float(np.mean(v)) for k, v in stats.items()})
        return out
