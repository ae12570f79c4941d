"""Distributed EchoRL: the replay ingestion service (server, clients, wire protocol, shared-memory rings).

``ReplayServer`` feeds a prioritized buffer from many writers; ``ReplayClient`` writes samples
(shared memory on the server's host, TCP elsewhere); ``LearnerClient`` samples from another
process. Ray (optional, ``pip install 'echo-rl[distributed]'``): ``ray_backend`` places rollout
workers as Ray actors for ``TrainingConfig.backend='ray'``; ``ray_replay`` runs the service as a
Ray actor. See docs/distributed.md.
"""

from echo_rl.distributed.client import LearnerClient, ReplayClient, ReplayServerBusy, ReplayServerError
from echo_rl.distributed.protocol import PROTOCOL_VERSION, ProtocolError
from echo_rl.distributed.server import ReplayServer

__all__ = ["LearnerClient", "PROTOCOL_VERSION", "ProtocolError", "ReplayClient", "ReplayServer",
           "ReplayServerBusy", "ReplayServerError"]
