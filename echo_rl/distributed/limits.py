"""Resource limits of the replay server: what one peer — buggy or hostile — may cost it.

Every limit is checked per connection or per frame, never per sample, so the ingestion hot path
pays nothing for them. :class:`ServerLimits` holds and validates the numbers; :class:`Refuser`
turns away connections over the cap without a thread each; :func:`recv_exact` reads a
length-prefixed body under a deadline, allocating only as bytes arrive.
"""

from __future__ import annotations

import collections
import ipaddress
import socket
import time
from dataclasses import dataclass


class Closed(Exception):
    """The peer closed the connection (normally or not)."""


class Timeout(Exception):
    """A deadline passed; the message says which (the handshake, an idle connection, a partial frame)."""


@dataclass(frozen=True)
class ServerLimits:
    """``max_connections``: open peer connections (writers, shm control sockets, learners); more are
    refused with a retryable ERROR. ``handshake_timeout``: seconds from accept to a complete HELLO (and
    AUTH) — a whole-handshake deadline, so trickling bytes does not extend it. ``idle_timeout``:
    seconds a TCP writer or learner may go without completing a frame (idle, or a partial frame
    trickled in: slow-loris); None disables it. Shared-memory control sockets are idle by design and
    exempt. ``max_rings``: shared-memory rings in all; ``max_rings_per_client``: rings one ``client_id``
    may hold at once. ``max_reply_bytes``: largest BATCH a learner may ask for in one SAMPLE."""

    max_connections: int = 256
    handshake_timeout: float = 10.0
    idle_timeout: float | None = 600.0
    max_rings: int = 64
    max_rings_per_client: int = 4
    max_reply_bytes: int = 1 << 30

    def __post_init__(self):
        for name, lo in (("max_connections", 1), ("max_rings", 0), ("max_rings_per_client", 0),
                         ("max_reply_bytes", 1)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ValueError(f"{name}={v!r} is invalid: must be an integer >= {lo}")
        for name in ("handshake_timeout", "idle_timeout"):
            v = getattr(self, name)
            if v is None and name == "idle_timeout":
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                allowed = "a number > 0 or None" if name == "idle_timeout" else "a number > 0"
                raise ValueError(f"{name}={v!r} is invalid: must be {allowed}")


def is_loopback(addr: str) -> bool:
    """True for an address only this host can reach (127.0.0.0/8, ::1)."""
    try:
        return ipaddress.ip_address(addr.split("%")[0]).is_loopback
    except ValueError:
        return False


def bind_warning(bound: str, port: int, has_secret: bool) -> str | None:
    """The warning to log for a server bound to ``bound`` (the socket's own address), or None on loopback."""
    if is_loopback(bound):
        return None
    who = ("clients must prove they know the shared secret" if has_secret else
           "NO shared secret is set, so anyone who can reach it can write samples and read batches "
           "(pass secret=, --secret-file or $ECHORL_REPLAY_SECRET)")
    return (f"replay server listens on {bound}:{port}, reachable from other hosts: {who}; traffic is not "
            f"encrypted (use a trusted network or a tunnel)")


class Refuser:
    """Connections over the cap: answered with ``reply`` and closed ~1 s later by the accept thread.

    Closing at once, with the client's HELLO still unread, would make the kernel send a reset that
    can overtake the ERROR frame; the unread bytes are discarded (non-blocking) until the close.
    At most ``keep`` are held; beyond that the oldest is closed right away."""

    def __init__(self, keep: int = 64, linger: float = 1.0):
        self._q: collections.deque = collections.deque()
        self.keep, self.linger = keep, linger
        self.refused = 0

    def refuse(self, conn: socket.socket, reply: bytes) -> None:
        self.refused += 1
        try:
            conn.setblocking(False)
            conn.send(reply)
            conn.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        self._q.append((time.monotonic() + self.linger, conn))
        if len(self._q) > self.keep:
            self._q.popleft()[1].close()
        self.tick()

    def tick(self) -> None:
        now = time.monotonic()
        for _, conn in self._q:
            try:
                while conn.recv(65536):
                    pass
            except OSError:
                pass
        while self._q and self._q[0][0] <= now:
            self._q.popleft()[1].close()

    def close(self) -> None:
        while self._q:
            self._q.popleft()[1].close()


def recv_exact(conn: socket.socket, n: int, deadline: float | None = None, what: str = "frame") -> bytes:
    """n bytes, read in chunks of at most 64 KiB (memory grows with the bytes received, not with n).

    ``deadline`` (time.monotonic()): raise :class:`Timeout` naming ``what`` when it passes first."""
    out = bytearray()
    while len(out) < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise Timeout(f"{what} not complete in time ({len(out)} of {n} bytes received)")
            conn.settimeout(left)
        try:
            chunk = conn.recv(min(n - len(out), 1 << 16))
        except (TimeoutError, socket.timeout):
            raise Timeout(f"{what} not complete in time ({len(out)} of {n} bytes received)") from None
        if not chunk:
            raise Closed()
        out += chunk
    return bytes(out)
