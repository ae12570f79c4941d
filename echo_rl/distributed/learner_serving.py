"""The learner role of the replay server: SAMPLE requests answered with BATCH frames, PRIORITIES applied.

A learner in another process (:class:`~echo_rl.distributed.learner_client.LearnerClient`) sends one
request at a time; each must arrive whole within ``idle_timeout`` and a SAMPLE may ask for at most
``max_reply_bytes`` of reply, so a learner can neither hold a thread forever nor make the server
build an unbounded BATCH. The batch comes from :meth:`ReplayServer.sample` (it waits until the buffer
is ready) and goes out as ids, importance weights, probabilities and records in one send.
"""

from __future__ import annotations

import socket
import time

import numpy as np

from echo_rl.distributed import protocol as P
from echo_rl.distributed.limits import Closed as _Closed
from echo_rl.distributed.limits import Timeout, recv_exact


def serve_learner(server, conn: socket.socket) -> None:
    """WELCOME the learner, then answer its requests until BYE (raised as ``Closed``) or an error."""
    conn.sendall(P.json_frame(P.WELCOME, {"version": P.PROTOCOL_VERSION, "record_size": server.rec.itemsize}))
    idle = server.limits.idle_timeout
    per_sample = 24 + server.rec.itemsize  # id, weight, probability, record
    while True:
        deadline = None if idle is None else time.monotonic() + idle  # a whole request within idle_timeout
        try:
            ftype, _, count, seq = P.unpack_header(recv_exact(conn, P.HEADER_SIZE, deadline, "a learner request"))
        except Timeout:
            raise Timeout(f"no learner request in {idle:g}s (idle_timeout)") from None
        if ftype == P.BYE:
            raise _Closed()
        if ftype == P.SAMPLE:
            if not 0 < count <= P.MAX_FRAME_SAMPLES:
                raise P.ProtocolError(f"SAMPLE count={count} is invalid: must be in [1, {P.MAX_FRAME_SAMPLES}]")
            if count * per_sample > server.limits.max_reply_bytes:
                raise P.ProtocolError(f"SAMPLE count={count} asks for {count * per_sample} bytes; the limit is "
                                      f"max_reply_bytes={server.limits.max_reply_bytes}")
            batch = server.sample(count)
            recs = P.tree_to_records(server.schema, server.rec, batch.data)
            conn.settimeout(idle)  # a learner that stops reading is dropped like an idle one
            conn.sendall(P.pack_header(P.BATCH, count, 0) + np.ascontiguousarray(batch.indices, np.int64).tobytes()
                         + np.ascontiguousarray(batch.weights, np.float64).tobytes()
                         + np.ascontiguousarray(batch.probabilities, np.float64).tobytes() + recs.tobytes())
        elif ftype == P.PRIORITIES:
            if not 0 < count <= P.MAX_FRAME_SAMPLES:
                raise P.ProtocolError(f"PRIORITIES count={count} is invalid")
            body = recv_exact(conn, 16 * count, deadline, "a PRIORITIES frame")
            ids = np.frombuffer(body, np.int64, count=count)
            pr = np.frombuffer(body, np.float64, count=count, offset=8 * count)
            try:
                server.buffer.update_priorities(ids, pr)
            except ValueError as exc:
                raise P.ProtocolError(f"bad PRIORITIES frame: {exc}") from None
        else:
            raise P.ProtocolError(f"unexpected {P.TYPE_NAMES[ftype]} frame from a learner")
