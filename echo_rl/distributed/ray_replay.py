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

from typing import Any

from echo_rl.core.replay import PrioritizedReplayBuffer
from echo_rl.distributed.server import ReplayServer
from echo_rl.utils.optional import require


class ReplayService:
    """Body of the Ray actor: a :class:`PrioritizedReplayBuffer` behind a :class:`ReplayServer`.

    ``host=None`` listens on the Ray node's IP (127.0.0.1 on a local, loopback-only Ray).
    ``buffer_kwargs`` go to the buffer (``alpha``, ``beta``, ``min_experiences``, ``seed``, ...).
    """

    def __init__(self, example: Any, capacity: int, host: str | None = None, port: int = 0,
                 **buffer_kwargs):
        ray = require("ray", "distributed")
        host = host or ray.util.get_node_ip_address()
        self.buffer = PrioritizedReplayBuffer(capacity, example=example, **buffer_kwargs)
        self.server = ReplayServer(self.buffer, host, port).start()

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
                         num_cpus: float = 1, max_restarts: int = 0, **buffer_kwargs):
    """Start the service as a Ray actor on a running Ray; returns ``(actor, (host, port))``.

    A restarted service (``max_restarts`` > 0) starts with an empty buffer on a new port: writers
    must be given the new address, which is why restarts are off by default.
    """
    ray = require("ray", "distributed")
    actor_cls = ray.remote(num_cpus=num_cpus, max_restarts=max_restarts)(ReplayService)
    actor = actor_cls.remote(example, capacity, host, port, **buffer_kwargs)
    return actor, tuple(ray.get(actor.address.remote()))
