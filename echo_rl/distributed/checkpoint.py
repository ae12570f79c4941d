"""Replay server checkpoints: the buffer and every writer stream's position, in one atomic file.

Why: a replay server killed with SIGKILL (an OOM kill, a lost node) must come back with every
sample it had acknowledged, and its writers must resume exactly-once. A checkpoint is the
buffer's own ``.npz`` (contents, trees, sampler and rate-limiter state; written beside the
target, fsynced, renamed) with the stream table in its ``extra``: for each TCP writer stream,
the sequence number after the last sample *stored* — taken under the same lock as the stores,
so the file never claims a sample it does not hold.

After a restart from it, a reconnecting TCP writer learns that position and resends what it
still holds. Samples acknowledged *after* the checkpoint are gone from the server; a writer that
had such acknowledgements is refused with an error naming the lost range (it no longer holds
them to resend). Shared-memory writers carry no sequence numbers: what they published after the
checkpoint and the server consumed is lost silently — checkpoint often, or use TCP, where loss
is detected.
"""

from __future__ import annotations

import logging
import os
import threading
import time

from echo_rl.distributed.tcp_ingest import Stream

log = logging.getLogger("echo_rl.replay_server")


def save(server, path) -> dict:
    """Write the checkpoint; returns what it holds (``samples``, ``streams``)."""
    with server._ckpt_lock:
        streams = {sid: [st.client_id, int(st.stored_seq)] for sid, st in list(server._streams.items())}
        extra = {"replay_server": {"version": 1, "streams": streams, "ids_issued": int(server.buffer.ids_issued)}}
        server.buffer.save(path, extra=extra)
    return {"samples": int(server.buffer.ids_issued), "streams": len(streams)}


def restore(server, path) -> int:
    """Load a checkpoint into ``server`` (before it starts); returns the number of streams restored."""
    extra = server.buffer.load(path)
    state = extra.get("replay_server")
    if not isinstance(state, dict) or not isinstance(state.get("streams"), dict):
        raise ValueError(f"{path} is a replay buffer file but not a replay server checkpoint (no stream table)")
    server._streams = {sid: Stream(cid, int(seq)) for sid, (cid, seq) in state["streams"].items()}
    server._restored = True
    log.info("replay server restored %d samples and %d writer streams from %s", server.buffer.ids_issued,
             len(server._streams), path)
    return len(server._streams)


class Checkpointer(threading.Thread):
    """Checkpoints ``server`` to ``path`` every ``every`` seconds while new samples arrive, and once at stop."""

    def __init__(self, server, path, every: float):
        super().__init__(name="replay-checkpoint", daemon=True)
        self.server, self.path, self.every = server, os.fspath(path), float(every)
        self.last_ids = int(server.buffer.ids_issued)
        self.count = 0
        self.error: Exception | None = None

    def run(self) -> None:
        stop = self.server._stop
        while not stop.wait(self.every):
            self.tick()

    def tick(self) -> None:
        if self.server.buffer.ids_issued == self.last_ids:
            return
        t0 = time.monotonic()
        try:
            info = save(self.server, self.path)
        except Exception as exc:  # a full disk must not take the server down; it is logged and kept
            self.error = exc
            log.exception("replay server checkpoint to %s failed", self.path)
            return
        self.last_ids = info["samples"]
        self.count += 1
        log.info("replay server checkpoint %d: %d samples, %d streams in %.2fs", self.count, info["samples"],
                 info["streams"], time.monotonic() - t0)
