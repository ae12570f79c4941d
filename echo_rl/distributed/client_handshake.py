"""What both replay clients need to reach the server: the address, the HELLO/AUTH handshake, its errors.

:func:`handshake` sends the magic bytes and HELLO, answers the server's HMAC challenge when it
asks for one (the shared secret never travels) and returns the WELCOME. A refusal is
:class:`ReplayServerError` (not retried: wrong schema, version, secret) or :class:`ReplayServerBusy`
(retried: the connection cap, an idle or handshake timeout), by the ``retry`` flag of the server's ERROR.
"""

from __future__ import annotations

import socket
import uuid

from echo_rl.distributed import protocol as P


class ReplayServerError(ConnectionError):
    """The server refused this client (schema or version mismatch, protocol error, authentication); not retried."""


class ReplayServerBusy(ConnectionError):
    """The server closed the connection for a passing reason (connection cap, idle or handshake timeout):
    an ordinary connection error, so the client reconnects (and resends) until its deadline."""


def refusal(body: dict, prefix: str) -> ConnectionError:
    """The exception an ERROR body stands for: retryable (``retry: true``) or final."""
    reason = body.get("reason")
    return (ReplayServerBusy if body.get("retry") is True else ReplayServerError)(f"{prefix}: {reason}")


def parse_address(address) -> tuple[str, int]:
    """``"host:port"`` or ``(host, port)`` -> ``(host, port)``; an empty host is loopback."""
    if isinstance(address, str):
        host, sep, port = address.rpartition(":")
        if not sep or not port.isdigit():
            raise ValueError(f"address={address!r} is invalid: expected 'host:port'")
        return host or "127.0.0.1", int(port)
    host, port = address
    return str(host), int(port)


def handshake(sock: socket.socket, body: dict, secret: bytes | None = None) -> tuple[dict, int]:
    """HELLO, then (if the server asks) the AUTH challenge; returns the WELCOME body and seq."""
    sock.sendall(P.HELLO_MAGIC + P.json_frame(P.HELLO, body))
    challenged = False
    while True:
        ftype, _, count, seq = P.unpack_header(recv_exact(sock, P.HEADER_SIZE))
        data = P.parse_json(ftype, recv_exact(sock, count)) if count <= P.MAX_JSON_BYTES else {}
        if ftype != P.AUTH:
            break
        if challenged:
            raise ReplayServerError("replay server sent a second AUTH challenge")
        challenged = True
        if secret is None:
            raise ReplayServerError(f"replay server requires a shared secret: pass secret= or set ${P.SECRET_ENV}")
        nonce = data.get("nonce")
        try:
            nonce = bytes.fromhex(nonce)
        except (TypeError, ValueError):
            raise ReplayServerError("replay server sent a malformed AUTH challenge") from None
        sock.sendall(P.json_frame(P.AUTH, {"mac": P.auth_mac(secret, nonce)}))
    if ftype == P.ERROR:
        raise refusal(data, "replay server refused the connection")
    if ftype != P.WELCOME:
        raise ReplayServerError(f"replay server answered {P.TYPE_NAMES[ftype]} to HELLO")
    return data, seq


def recv_exact(sock: socket.socket, n: int) -> bytes:
    """Exactly n bytes (the server is trusted to send what it announced); EOF is a ConnectionError."""
    out = bytearray(n)
    view = memoryview(out)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            raise ConnectionError("replay server closed the connection")
        got += k
    return bytes(out)


def new_stream_id() -> str:
    """A writer stream's id: random, so a restarted writer never resumes another's sequence numbers."""
    return uuid.uuid4().hex
