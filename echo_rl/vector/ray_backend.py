"""Ray backend for vector training (``TrainingConfig.backend='ray'``), Acme-style.

Rollout workers are Ray actors: each owns a contiguous slice of the ``num_actors``
envs and a copy of the policy, and collects one rollout slice per update with the
weights version it was sent. The learner is the in-process agent's own learning
step: the Ray agent is the configured agent class (PPO, IMPALA, echo-rl) whose
collector is remote (:class:`RemoteCollector`), so its learning, checkpoints and
``act`` are that agent's code, unchanged; a worker acts with that agent's acting
half (``ray_acting.py``: the actor-critic sampler, or EchoRL's plan-path actor with
its extra per-step fields). Weights go out once per update (one ``ray.put``).

Seeding: worker ``j`` over envs ``[a, b)`` is that agent's acting half for that slice with seed
``seed + 10000·a``, so its envs get exactly the seeds the in-process backend gives
envs ``a..b-1``; action sampling uses one generator per worker (seed + 10000·a + 1).
With one worker the run equals the in-process run step for step.

Faults: a worker that dies (crash, OOM kill, ``ray.kill``) is restarted by Ray
(``max_restarts``). The slice it was collecting is recollected from the restarted
worker, with the same weights version, so the update still sees a full on-policy
batch. The dead worker's in-flight episodes are lost: never reported in episode
statistics, never learned from. The restarted worker's envs start new episodes
from seeds derived from (run seed, slot, restart count) — deterministic given when
the failure happened, and different from the episodes it has already played.
"""

from __future__ import annotations

import logging
import os
import pickle
import time
from dataclasses import dataclass

import numpy as np
import torch

from echo_rl.config import ConfigError, TrainingConfig
from echo_rl.vector.ray_acting import RAY_AGENT_BASES, acting_part
from echo_rl.distributed.ray_cluster import _init_ray, _ray, default_num_workers
from echo_rl.environments.minigrid_vector import make_vector_env
from echo_rl.utils import state_codec
from echo_rl.training.agents import AGENTS, agent_class
from echo_rl.vector.async_actors import Unroll
from echo_rl.vector.echo.agent import EchoAgent
from echo_rl.vector.ppo_agent import PPOAgent
from echo_rl.vector.rollout import EpisodeStats, RolloutBuffer

log = logging.getLogger("echo_rl.ray_backend")

MAX_RESTARTS = 3  # Ray restarts of one worker over a run
RESTART_TIMEOUT_S = 180.0  # how long the learner waits for a failed worker to come back
RESEED_STRIDE = 100_003  # seed offset per restart (not a multiple of the 10000 env stride)


class WorkerNotReady(RuntimeError):
    """A worker was asked to collect before it was seeded (it was restarted behind the learner's back)."""


def restart_error(j: int, part: Slice, max_restarts: int, exc: BaseException) -> RuntimeError:
    """The one-line error of worker ``j`` failing beyond its restarts: names the worker and its envs."""
    return RuntimeError(f"Ray worker {j} (envs {part.start}-{part.stop - 1}) failed and was not restarted "
                        f"(max_restarts={max_restarts}): {type(exc).__name__}")


def reseed_restarted(worker, token: int, deadline: float, *reset_args) -> None:
    """``worker.reset(token, *reset_args)`` on a restarted Ray actor, retrying while Ray brings it back (until
    ``deadline``)."""
    ray = _ray()
    delay = 0.2
    while True:
        try:
            ray.get(worker.reset.remote(token, *reset_args), timeout=max(deadline - time.monotonic(), 1.0))
            return
        except ray.exceptions.RayActorError:
            if time.monotonic() + delay > deadline:
                raise
            time.sleep(delay)  # restarting: the actor is unavailable for a moment
            delay = min(2 * delay, 2.0)


@dataclass(frozen=True)
class Slice:
    """Envs ``[start, stop)`` of the ``num_actors`` envs."""

    start: int
    stop: int

    @property
    def size(self) -> int:
        return self.stop - self.start


def worker_slices(num_actors: int, num_workers: int) -> list[Slice]:
    """Contiguous env slices whose sizes differ by at most one."""
    if not 1 <= num_workers <= num_actors:
        raise ConfigError(f"Ray workers={num_workers} is invalid: must be between 1 and num_actors={num_actors}")
    bounds = np.linspace(0, num_actors, num_workers + 1).round().astype(int)
    return [Slice(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]


def slice_config(config: TrainingConfig, part: Slice) -> TrainingConfig:
    """The in-process config of one worker's slice (same steps per env, the slice's env seeds)."""
    num_steps = config.batch_size // config.num_actors
    return config.replace(num_actors=part.size, batch_size=num_steps * part.size, train_frequency=None,
                          seed=config.seed + 10_000 * part.start, backend="local", device="cpu",
                          ray_address=None, ray_num_workers=None)


def worker_states(blobs: list) -> list:
    """The Ray workers' pickled states as this driver got them from its own workers: ``Signed`` (a checkpoint
    holding them is signed). Ray hands bytes over as plain bytes, both ways, so the driver is where the
    type is kept and checked."""
    return [state_codec.Signed(b) for b in blobs]


def check_ray_rollout_state(state, slices: list[Slice]) -> None:
    """A checkpoint's rollout state fits this Ray run: written by a Ray run with the same worker slices."""
    ours = [(s.start, s.stop) for s in slices]
    if not isinstance(state, dict) or state.get("backend") != "ray":
        raise ConfigError("this checkpoint's rollout state was written by backend=local; resume it with "
                          "backend=local (weights and optimizer are compatible, envs mid-episode are not)")
    if [tuple(s) for s in state["slices"]] != ours:
        raise ConfigError(f"this checkpoint's rollout state has Ray worker slices {state['slices']}; "
                          f"this run has {ours}: resume with the same num_actors and worker count")
    workers = state.get("workers")
    if type(workers) is not list or len(workers) != len(ours):
        raise ConfigError(f"this checkpoint's rollout state holds no state for each of the {len(ours)} Ray workers")
    for blob in workers:  # refused here, in this process, before a worker is asked to unpickle anything
        if type(blob) is not state_codec.Signed:
            state_codec.loads(blob, "a Ray worker's state in this checkpoint")


class RolloutWorker:
    """One Ray actor: the configured agent's acting half over its env slice (``ray_acting.acting_part``),
    used only to act: its network, sampler and collector are the ones the in-process agent acts with."""

    def __init__(self, config: TrainingConfig, part: Slice):
        torch.set_num_threads(max(1, config.torch_threads))
        self.config = slice_config(config, part)
        envs = make_vector_env(self.config.env_name, part.size, asynchronous=config.vector_env == "async",
                               **self.config.env_config)
        self.acting = acting_part(agent_class(config.agent), self.config, envs)
        self.version = -1
        self.token: int | None = None  # restart count the envs were seeded for; None until reset()

    def pid(self) -> int:
        return os.getpid()

    def reset(self, token: int) -> None:
        """Seed the envs and the action sampler for restart count ``token`` (0: the run's start)."""
        self.acting.reset(self.config.seed + RESEED_STRIDE * token)
        self.token = token

    def collect(self, weights: dict, version: int) -> dict:
        """One rollout slice with policy ``version``: the RolloutBuffer's arrays, next_obs, episodes."""
        if self.token is None:
            raise WorkerNotReady("rollout worker was (re)started and not seeded yet")
        if version != self.version:
            self.acting.network.load_state_dict(weights)
            self.version = version
        buf = self.acting.collect()
        collector = self.acting.collector
        stats = collector.stats
        out = {name: getattr(buf, name) for name in ROLLOUT_FIELDS}
        out.update(next_obs=collector.next_obs, version=version, returns=stats.returns, lengths=stats.lengths,
                   successes=stats.successes, extras=dict(buf.extras), context=dict(buf.context),
                   next_observations=buf.next_observations)
        collector.stats = EpisodeStats()
        return out

    def rollout_state(self) -> bytes:
        """The envs mid-episode and the sampler state (the slice's part of a checkpoint)."""
        return pickle.dumps({**self.acting.state(), "token": self.token}, protocol=pickle.HIGHEST_PROTOCOL)

    def load_rollout_state(self, blob: bytes) -> None:
        state = pickle.loads(blob)  # from the driver, which took it Signed only (check_ray_rollout_state)
        self.token = state.pop("token")
        self.acting.load_state(state)

    def close(self) -> None:
        self.acting.close()


ROLLOUT_FIELDS = ("obs", "actions", "logprobs", "values", "rewards", "terminated", "truncated", "final_values")


class RemoteCollector:
    """The vector agents' collector seam (``collect(policy, value_fn)`` / ``run(actor)``), served by Ray workers.

    The local callables or actor are ignored: the workers act with their copies of
    ``network``, refreshed to the learner's weights before each rollout. Slices —
    PPO's fields, the actor's extra per-step fields, next observations and per-rollout
    context — are joined along the env axis in env order.
    """

    def __init__(self, network: torch.nn.Module, workers: list, slices: list[Slice], buffer: RolloutBuffer,
                 max_restarts: int = MAX_RESTARTS, restart_timeout_s: float = RESTART_TIMEOUT_S):
        self.network, self.workers, self.slices, self.buffer = network, workers, slices, buffer
        self.num_envs = buffer.num_envs
        self.next_obs = np.zeros((buffer.num_envs, *buffer.obs.shape[2:]), buffer.obs.dtype)
        self.stats = EpisodeStats()
        self.max_restarts, self.restart_timeout_s = max_restarts, restart_timeout_s
        self.tokens = [0] * len(workers)  # restarts seen per worker
        self.version = 0
        self._weights_ref = None
        self._weights_version = -1
        ray = _ray()
        ray.get([w.reset.remote(0) for w in workers])

    @property
    def restarts(self) -> int:
        return sum(self.tokens)

    def set_version(self, version: int) -> None:
        self.version = version

    def _weights(self):
        if self._weights_version != self.version:  # one ray.put per update, shared by every worker
            state = {k: v.detach().cpu() for k, v in self.network.state_dict().items()}
            self._weights_ref = _ray().put(state)
            self._weights_version = self.version
        return self._weights_ref

    def collect(self, policy=None, value_fn=None) -> RolloutBuffer:
        return self.run()

    def run(self, actor=None) -> RolloutBuffer:
        """``VectorRolloutCollector.run``'s seam: the local actor is ignored, the workers act."""
        weights, version = self._weights(), self.version
        refs = [w.collect.remote(weights, version) for w in self.workers]
        b, context = self.buffer, {}
        for j, ref in enumerate(refs):
            out = self._result(j, ref, weights, version)
            if out["version"] != version:
                raise RuntimeError(f"Ray worker {j} returned a rollout of policy version {out['version']}, "
                                   f"expected {version}")
            envs = slice(self.slices[j].start, self.slices[j].stop)
            for name in ROLLOUT_FIELDS:
                getattr(b, name)[:, envs] = out[name]
            for name, array in b.extras.items():
                array[:, envs] = out["extras"][name]
            if b.next_observations is not None:
                b.next_observations[:, envs] = out["next_observations"]
            for name, array in out["context"].items():  # env axis 1, joined in env order
                context.setdefault(name, []).append(array)
            self.next_obs[envs] = out["next_obs"]
            for ret, length, success in zip(out["returns"], out["lengths"], out["successes"]):
                self.stats.add(ret, length, success)
        b.context = {name: np.concatenate(parts, axis=1) for name, parts in context.items()}
        return b

    def _result(self, j: int, ref, weights, version: int) -> dict:
        ray = _ray()
        errors = (ray.exceptions.RayActorError, WorkerNotReady)
        deadline = time.monotonic() + self.restart_timeout_s
        while True:
            try:
                return ray.get(ref, timeout=max(deadline - time.monotonic(), 1.0))
            except ray.exceptions.GetTimeoutError:
                raise RuntimeError(f"Ray worker {j} (envs {self.slices[j].start}-{self.slices[j].stop - 1}) "
                                   f"did not answer within {self.restart_timeout_s:.0f} s") from None
            except errors as exc:
                if self.tokens[j] >= self.max_restarts or time.monotonic() > deadline:
                    raise restart_error(j, self.slices[j], self.max_restarts, exc) from exc
                self.tokens[j] += 1
                log.warning("Ray worker %d failed (%s); recollecting its slice after restart %d",
                            j, type(exc).__name__, self.tokens[j])
                ref = self._recollect(j, weights, version, deadline)

    def _recollect(self, j: int, weights, version: int, deadline: float):
        """Re-seed the restarted worker and ask it again; wait while Ray brings it back."""
        reseed_restarted(self.workers[j], self.tokens[j], deadline)
        return self.workers[j].collect.remote(weights, version)

    def worker_pids(self) -> list[int]:
        ray = _ray()
        return ray.get([w.pid.remote() for w in self.workers])


class AsyncRemoteCollector(RemoteCollector):
    """Asynchronous IMPALA's unroll source on Ray (``max_policy_lag``): workers keep collecting while the learner
    trains.

    Each worker has one rollout in flight. ``take()`` returns the first one to finish, as an
    :class:`~echo_rl.vector.async_actors.Unroll` tagged with the version it was collected with, and at once
    sends that worker the newest weights for its next rollout, so it collects through the learner's update.
    A failed worker is restarted and its rollout recollected with the weights it was sent (as in the
    synchronous collector); the staleness gate then judges that rollout's version like any other.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._inflight: dict = {}  # ref -> (worker index, weights ref, version)

    def _submit(self, j: int) -> None:
        weights, version = self._weights(), self.version
        self._inflight[self.workers[j].collect.remote(weights, version)] = (j, weights, version)

    def take(self):
        ray = _ray()
        if not self._inflight:
            for j in range(len(self.workers)):
                self._submit(j)
        ready, _ = ray.wait(list(self._inflight), num_returns=1, timeout=self.restart_timeout_s)
        if not ready:
            raise RuntimeError(f"no Ray worker returned a rollout within {self.restart_timeout_s:.0f} s")
        j, weights, version = self._inflight.pop(ready[0])
        out = self._result(j, ready[0], weights, version)
        self._submit(j)
        stats = EpisodeStats()
        for ret, length, success in zip(out["returns"], out["lengths"], out["successes"]):
            stats.add(ret, length, success)
        return Unroll({name: out[name] for name in ROLLOUT_FIELDS}, out["next_obs"], int(out["version"]), stats)

    def publish(self, network: torch.nn.Module, version: int) -> None:
        """The learner's weights after ``version`` updates go to each worker with its next rollout."""
        self.set_version(version)

    def pause(self) -> None:
        """Nothing to do: a worker answers ``rollout_state`` after the rollout it has in flight."""

    def resume(self) -> None:
        pass


class _SpacesOnly:
    """What a vector agent's constructor reads from its envs; the Ray learner itself steps no env."""

    def __init__(self, observation_space, action_space, num_envs: int):
        self.single_observation_space, self.single_action_space = observation_space, action_space
        self.num_envs = num_envs

    def reset(self, seed=None):
        space = self.single_observation_space
        return np.zeros((self.num_envs, *space.shape), space.dtype), {}

    def close(self) -> None:
        pass


class RayAgentMixin:
    """Rollouts collected by Ray workers; everything else is the agent class it is mixed into.

    Checkpoints: ``state_dict`` is the agent's own (weights, optimizer, learner RNGs,
    counters), interchangeable with the in-process backend. ``rollout_state`` holds
    every worker's envs mid-episode, sampler state and restart count, so a Ray run
    resumes exactly on the same number of workers; resuming with another worker
    count or backend is refused for the rollout state.
    """

    def __init__(self, config: TrainingConfig, device: torch.device, num_workers: int | None = None,
                 max_restarts: int = MAX_RESTARTS, restart_timeout_s: float = RESTART_TIMEOUT_S):
        ray = _ray()
        num_workers = num_workers or default_num_workers(config)
        self.slices = worker_slices(config.num_actors, num_workers)
        probe = make_vector_env(config.env_name, 1, **config.env_config)  # any vector task: MiniGrid, gym:, dmc:
        spaces = _SpacesOnly(probe.single_observation_space, probe.single_action_space, config.num_actors)
        probe.close()
        super().__init__(config, spaces, device)
        self._owns_ray = _init_ray(config, num_workers)
        self._ray_workers = []
        try:
            actor = ray.remote(num_cpus=1, max_restarts=max_restarts, max_task_retries=0)(RolloutWorker)
            self._ray_workers = [actor.remote(config, part) for part in self.slices]
            collector = AsyncRemoteCollector if getattr(self, "gate", None) is not None else RemoteCollector
            self.collector = collector(self.network, self._ray_workers, self.slices, self.collector.buffer,
                                       max_restarts, restart_timeout_s)
        except BaseException:
            self.close()
            raise

    #: parts the Ray workers never see: they act in the learner's process only
    LEARNER_SIDE_PARTS = ("augmentation", "reward")

    def set(self, **parts):
        """Swap learner-side parts only. The workers build their networks (encoder, policy, distribution) and
        rollout storage from the config and receive weights alone, so a part swapped here would leave them
        acting with another network than the one learning: name such parts in the config instead."""
        if isinstance(getattr(self, "collector", None), RemoteCollector):
            acting = sorted(k for k, v in parts.items() if v is not None and k not in self.LEARNER_SIDE_PARTS)
            if acting:
                raise ConfigError(f"agent.set({acting[0]}=...) is not supported with backend=ray: the workers build "
                                  f"their networks from the config; set it there (e.g. --set encoder=NAME) or use "
                                  f"backend=local; allowed here: {', '.join(self.LEARNER_SIDE_PARTS)}")
        return super().set(**parts)

    def train_iteration(self) -> dict[str, float]:
        self.collector.set_version(self.updates)
        metrics = super().train_iteration()
        metrics["ray/worker_restarts"] = float(self.collector.restarts)
        return metrics

    def unroll_source(self) -> AsyncRemoteCollector:
        """Asynchronous IMPALA (``max_policy_lag``) takes its unrolls from the Ray workers."""
        return self.collector

    @property
    def workers(self) -> list:
        """The Ray actor handles, in env order (tests kill them)."""
        return list(self._ray_workers)

    def rollout_state(self) -> dict:
        ray = _ray()
        return {"backend": "ray", "slices": [(s.start, s.stop) for s in self.slices],
                "workers": worker_states(ray.get([w.rollout_state.remote() for w in self._ray_workers])),
                "tokens": list(self.collector.tokens)}

    def load_rollout_state(self, state) -> None:
        check_ray_rollout_state(state, self.slices)
        ray = _ray()
        ray.get([w.load_rollout_state.remote(blob) for w, blob in zip(self._ray_workers, state["workers"])])
        self.collector.tokens = list(state["tokens"])

    def close(self) -> None:
        ray = _ray()
        for w in self._ray_workers:
            try:
                ray.kill(w, no_restart=True)
            except Exception:  # already gone
                pass
        self._ray_workers = []
        if getattr(self, "_owns_ray", False) and ray.is_initialized():
            ray.shutdown()
            self._owns_ray = False


class RayPPOAgent(RayAgentMixin, PPOAgent):
    """PPO with rollouts collected by Ray workers; the learning step is PPOAgent's."""


class RayEchoAgent(RayAgentMixin, EchoAgent):
    """The EchoRL agent with rollouts collected by Ray workers; model, adders and learner are EchoAgent's.

    Its rollout state adds the replay's and the self-imitation store's contents to the workers'.
    """

    def rollout_state(self) -> dict:
        return {**super().rollout_state(), "replay": self.replay_state()}

    def load_rollout_state(self, state) -> None:
        super().load_rollout_state(state)
        self.load_replay_state(state.get("replay") or {})


_RAY_CLASSES: dict[type, type] = {PPOAgent: RayPPOAgent, EchoAgent: RayEchoAgent}


def ray_agent_class(base: type) -> type:
    """``base`` (an ActorCriticAgent subclass or the EchoRL agent) with its collector served by Ray workers."""
    if base not in _RAY_CLASSES:
        _RAY_CLASSES[base] = type(f"Ray{base.__name__}", (RayAgentMixin, base),
                                  {"__doc__": f"{base.__name__} with rollouts collected by Ray workers.",
                                   "__module__": __name__})
    return _RAY_CLASSES[base]


def build_ray_agent(config: TrainingConfig, device, num_workers: int | None = None, **kwargs):
    """The trainer's agent with its rollout workers placed as Ray actors (``EchoRLTrainer.build_agent``)."""
    base = agent_class(config.agent)
    if not (isinstance(base, type) and issubclass(base, RAY_AGENT_BASES)):
        allowed = sorted(name for name in AGENTS if issubclass(agent_class(name), RAY_AGENT_BASES))
        raise ConfigError(f"TrainingConfig.agent={config.agent!r} is not supported with backend=ray yet; "
                          f"allowed: {', '.join(allowed)}")
    return ray_agent_class(base)(config, device, num_workers=num_workers, **kwargs)
