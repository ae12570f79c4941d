"""Asynchronous IMPALA's in-process actor: a spawned worker process that owns the envs while the learner trains.

A thread cannot do this job in CPython: env stepping and small torch ops hold the
GIL, so an actor thread and the learner ran one after the other (measured: CPU time
equal to wall time). A process gets its own core.

Protocol (one pipe): the learner keeps exactly one rollout request in flight. When
it takes an unroll it sends the next request at once, with its newest weights, so
the actor collects through the learner's update: unroll ``k`` acts with version
``k - 1`` (the schedule ``LockstepSource(lags=min(k, 1))`` reproduces, and a
one-worker Ray run has). The request carries weights only when their version
changed. ``state`` hands the envs mid-episode and the sampler back for a checkpoint.
"""

from __future__ import annotations

import multiprocessing as mp
import pickle
import signal
import traceback

import torch

from echo_rl.vector.async_actors import Unroll
from echo_rl.vector.rollout import EpisodeStats, VectorRolloutCollector, sample_policy

START_TIMEOUT_S = 600.0  # how long the learner waits for one rollout (includes the worker's start)


def _collector(recipe: dict) -> VectorRolloutCollector:
    from echo_rl.environments.minigrid_vector import make_vector_env  # gymnasium, minigrid: loaded on first use

    envs = make_vector_env(recipe["task"], recipe["num_envs"], asynchronous=recipe["asynchronous"],
                           **recipe["env_config"])
    return VectorRolloutCollector(envs, recipe["num_steps"], recipe["seeds"])


def _serve(conn, payload: bytes) -> None:
    """The worker process: collect on request with the weights sent; answer state requests; stop on close.

    Ctrl-C reaches the whole process group; the learner decides when to stop (it still needs the envs for its
    final checkpoint), so the worker ignores SIGINT and ends on ``close`` or when the learner's pipe closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(1)
    collector, network, generator_state = pickle.loads(payload)
    if isinstance(collector, dict):  # a fresh run: the envs are built and reset here, as the learner's were
        collector = _collector(collector)
    generator = torch.Generator()
    generator.set_state(generator_state)
    try:
        while True:
            msg = conn.recv()
            try:
                if msg[0] == "collect":
                    _, weights, version = msg
                    if weights is not None:
                        network.load_state_dict(weights)
                    buf = collector.collect(lambda obs: sample_policy(network, generator, torch.as_tensor(obs)),
                                            lambda obs: network.value(torch.as_tensor(obs)).detach().numpy())
                    stats, collector.stats = collector.stats, EpisodeStats()
                    conn.send(("unroll", Unroll.from_buffer(buf, collector.next_obs, version, stats)))
                elif msg[0] == "state":
                    conn.send(("state", pickle.dumps(collector, protocol=pickle.HIGHEST_PROTOCOL),
                               generator.get_state()))
                else:
                    return
            except Exception as exc:  # noqa: BLE001 - reported to the learner in one line, with the trace logged
                traceback.print_exc()
                conn.send(("error", f"{type(exc).__name__}: {exc}"))
    except EOFError:  # the learner went away
        pass
    finally:
        collector.envs.close()


class ProcessActor:
    """An unroll source (``take`` / ``publish`` / ``pause`` / ``resume`` / ``close``) served by one worker process.

    The worker starts with a copy of ``collector`` (envs mid-episode, as a resumed run
    has them) or, for a fresh run, builds its own from ``collector`` as a recipe (task,
    num_envs, asynchronous, env_config, num_steps, seeds: an env snapshot taken before
    the first step does not restore gymnasium's env checker); with copies of ``network``
    and ``generator``'s state. :meth:`sync_state` brings the envs and sampler back for a
    checkpoint.
    """

    def __init__(self, collector: VectorRolloutCollector | dict, network: torch.nn.Module,
                 generator: torch.Generator, version: int):
        acting = pickle.loads(pickle.dumps(network)).cpu().requires_grad_(False)
        payload = pickle.dumps((collector, acting, generator.get_state()), protocol=pickle.HIGHEST_PROTOCOL)
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve, args=(child, payload), name="echo-rl-actor", daemon=True)
        self._proc.start()
        child.close()
        self._version, self._sent = version, version  # newest published, last sent to the worker
        self._weights: dict | None = None
        self._inflight = False
        self._pending: Unroll | None = None  # taken back from the worker by pause(), not yet learned from

    def publish(self, network: torch.nn.Module, version: int) -> None:
        self._weights = {k: v.detach().to("cpu", copy=True) for k, v in network.state_dict().items()}
        self._version = version

    def _request(self) -> None:
        weights = self._weights if self._sent != self._version else None
        try:
            self._conn.send(("collect", weights, self._version))
        except OSError:  # BrokenPipeError: the worker is gone
            self._proc.join(timeout=5)
            raise RuntimeError(f"the actor process died (exit code {self._proc.exitcode})") from None
        self._sent, self._inflight = self._version, True

    def _receive(self, kind: str):
        if not self._conn.poll(START_TIMEOUT_S):
            raise RuntimeError(f"the actor process sent nothing within {START_TIMEOUT_S:.0f} s")
        try:
            msg = self._conn.recv()
        except (EOFError, ConnectionResetError):  # reset: it died with our request unread in its socket
            self._proc.join(timeout=5)
            raise RuntimeError(f"the actor process died (exit code {self._proc.exitcode})") from None
        if msg[0] == "error":
            raise RuntimeError(f"the actor process failed: {msg[1]}")
        assert msg[0] == kind, msg[0]
        return msg[1:]

    def take(self) -> Unroll:
        """The next unroll; the worker starts the one after it with the newest weights before this returns."""
        if self._pending is not None:
            unroll, self._pending = self._pending, None
        else:
            if not self._inflight:
                self._request()
            try:
                (unroll,) = self._receive("unroll")
            finally:  # answered, or failed: either way nothing is in flight any more
                self._inflight = False
        self._request()
        return unroll

    def pause(self) -> None:
        """Wait for the rollout in flight (kept for the next ``take``): the worker is then idle."""
        if self._inflight:
            try:
                (self._pending,) = self._receive("unroll")
            finally:
                self._inflight = False

    def resume(self) -> None:
        """Nothing to do: the next ``take`` sends the next request."""

    def sync_state(self) -> tuple[VectorRolloutCollector, object]:
        """(collector, generator state) as the worker holds them now, between rollouts."""
        self.pause()
        self._conn.send(("state",))
        blob, generator_state = self._receive("state")
        return pickle.loads(blob), generator_state

    def close(self) -> None:
        if self._proc.is_alive():
            try:
                self.pause()
                self._conn.send(("close",))
            except (OSError, RuntimeError):
                pass
            self._proc.join(timeout=30)
        if self._proc.is_alive():
            self._proc.terminate()
            self._proc.join()
        self._conn.close()
