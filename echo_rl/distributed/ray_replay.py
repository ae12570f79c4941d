"""The replay service as a Ray actor: one prioritized buffer that writers anywhere in a Ray cluster feed.

Rollout workers (Ray actors or plain processes) connect a :class:`ReplayClient` to the actor's
``address()`` — shared memory when they share its host, TCP otherwise — so samples travel on the
service's own acknowledged path, not through Ray's object store. A learner samples either
through the actor (``sample`` / ``update_priorities``, a Ray call per batch) or, for zero-copy
batches, with a :class:`LearnerClient` on the same address.

No vector agent uses it yet (the Ray backend trains on-policy PPO); it is the placement piece
for off-policy learners.
"""

from __future__ import annotations

import dataclasses
import secrets
from typing import Any

from echo_rl.distributed.limits import ServerLimits
from echo_rl.distributed.server import ReplayServer
from echo_rl.replay import PrioritizedReplayBuffer
from echo_rl.utils.optional import require


def _check_limits(limits) -> None:
    if limits is not None and not isinstance(limits, ServerLimits):
        raise TypeError(f"limits must be a ServerLimits, got {type(limits).__name__}")


class ReplayService:
    """Body of the Ray actor: a :class:`PrioritizedReplayBuffer` behind a :class:`ReplayServer`.

    ``host=None`` listens on the Ray node's IP (127.0.0.1 on a local, loopback-only Ray).
    ``authenticate`` (default on): the service makes its own shared secret (``secrets.token_bytes``)
    and every writer and learner must prove it knows it; :meth:`secret` hands it to whoever holds the
    actor handle. Made here, not passed in, because an actor's constructor arguments are part of its
    creation spec, which Ray's control store (GCS) keeps for the actor's lifetime, while a small method
    return value goes straight back to the caller. ``limits``: the server's
    :class:`~echo_rl.distributed.limits.ServerLimits` (None: the defaults).
    ``buffer_kwargs`` go to the buffer (``alpha``, ``beta``, ``min_experiences``, ``seed``, ...).
    """

    def __init__(self, example: Any, capacity: int, host: str | None = None, port: int = 0, *,
                 authenticate: bool = True, limits: ServerLimits | None = None, **buffer_kwargs):
        ray = require("ray", "distributed")
        host = host or ray.util.get_node_ip_address()
        _check_limits(limits)
        self.buffer = PrioritizedReplayBuffer(capacity, example=example, **buffer_kwargs)
        limit_kwargs = dataclasses.asdict(limits) if limits is not None else {}
        self._secret = secrets.token_bytes(32) if authenticate else None
        self.server = ReplayServer(self.buffer, host, port, secret=self._secret, **limit_kwargs).start()

    def secret(self) -> bytes | None:
        """The shared secret clients pass as ``secret=`` (None: the service was started without one)."""
        return self._secret

    def address(self) -> tuple[str, int]:
        return self.server.address

    def sample(self, n: int, timeout: float | None = None, beta: float | None = None):
        """A prioritized batch (``Batch``: data, indices, importance weights, probabilities)."""
        return self.server.sample(n, timeout=timeout, beta=beta)

    def update_priorities(self, indices, priorities) -> int:
        return self.server.update_priorities(indices, priorities)

    def metrics(self) -> dict[str, float]:
        return self.server.metrics()

    def close(self) -> None:
        self.server.close()


def start_replay_service(example: Any, capacity: int, *, host: str | None = None, port: int = 0,
                         num_cpus: float = 1, max_restarts: int = 0, authenticate: bool = True,
                         limits: ServerLimits | None = None, **buffer_kwargs):
    """Start the service as a Ray actor on a running Ray; returns ``(actor, (host, port), secret)``.

    ``secret`` is the one the actor made (None with ``authenticate=False``), fetched as the return value
    of ``actor.secret``: give it to writers as a method or task argument (``ReplayClient(..., secret=)``),
    never as an actor constructor argument or a ``runtime_env`` variable, which the GCS keeps.
    ``limits`` goes to the server (see :class:`ReplayService`).

    A restarted service (``max_restarts`` > 0) starts with an empty buffer on a new port and with a new
    secret: writers must be given both again, which is why restarts are off by default.
    """
    ray = require("ray", "distributed")
    _check_limits(limits)  # here, not as the actor's construction error
    actor_cls = ray.remote(num_cpus=num_cpus, max_restarts=max_restarts)(ReplayService)
    actor = actor_cls.remote(example, capacity, host, port, authenticate=authenticate, limits=limits, **buffer_kwargs)
    address, secret = ray.get([actor.address.remote(), actor.secret.remote()])
    return actor, tuple(address), secret
