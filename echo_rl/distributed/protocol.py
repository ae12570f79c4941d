"""Wire protocol of the replay service: handshake, frames, sequence numbers, windowed acks.

Every frame starts with a 16-byte header ``magic u16 · type u8 · flags u8 · count u32 · seq u64``
(little endian). ``count`` is the number of samples (DATA), or the byte length of a JSON body
(HELLO, WELCOME, ERROR); ``seq`` is the sequence number of the frame's first sample (DATA), or the
next sequence number the server expects from this client (WELCOME, ACK).

A DATA payload is ``count`` packed *records*: one sample's leaves side by side (the numpy
structured dtype :func:`record_dtype`, aligned). Records make a message of one sample and a
message of 64 the same thing, and let the server read a run of one-sample frames — fixed size —
as one structured array, checking every header at once instead of parsing frame by frame.

A server started with a shared secret answers HELLO with an AUTH challenge (a random nonce); the
client proves it knows the secret with ``HMAC-SHA256(secret, AUTH_LABEL + nonce)`` in an AUTH reply
before the server looks at anything else in its HELLO (:func:`auth_mac`, :func:`check_mac`).

Sequence numbers count samples per ``client_id`` (0, 1, 2, ...). The server adds a sample to the
buffer only if its seq is the next one expected, skips seqs it already holds (a resend after a
reconnect) and closes the connection on a gap. ``ACK(seq)`` says every sample below ``seq`` is in
the buffer; the server sends one per chunk it has read, not one per message (windowed acks).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import struct

import numpy as np

from echo_rl.replay.schema import Schema

PROTOCOL_VERSION = 1
MAGIC = 0xEC40
HELLO_MAGIC = b"ECHORL-REPLAY\x00"  # first bytes a client sends: rejects stray connections early
MAX_JSON_BYTES = 1 << 20
MAX_FRAME_SAMPLES = 1 << 20
MAX_AUTH_BYTES = 1 << 10
AUTH_LABEL = b"echorl-replay-auth-v1|"
SECRET_ENV = "ECHORL_REPLAY_SECRET"  # where clients (and the CLI server) find the shared secret

# frame types
DATA, ACK, HELLO, WELCOME, ERROR, SAMPLE, BATCH, PRIORITIES, BYE, AUTH = range(1, 11)
TYPE_NAMES = {DATA: "DATA", ACK: "ACK", HELLO: "HELLO", WELCOME: "WELCOME", ERROR: "ERROR", SAMPLE: "SAMPLE",
              BATCH: "BATCH", PRIORITIES: "PRIORITIES", BYE: "BYE", AUTH: "AUTH"}

HEADER = np.dtype([("magic", "<u2"), ("type", "u1"), ("flags", "u1"), ("count", "<u4"), ("seq", "<u8")])
HEADER_SIZE = HEADER.itemsize  # 16
_HDR = struct.Struct("<HBBIQ")
assert _HDR.size == HEADER_SIZE


class ProtocolError(ValueError):
    """The peer sent bytes that break the protocol; the message says what and where."""


def pack_header(ftype: int, count: int, seq: int, flags: int = 0) -> bytes:
    return _HDR.pack(MAGIC, ftype, flags, count, seq)


def unpack_header(buf, offset: int = 0) -> tuple[int, int, int, int]:
    """(type, flags, count, seq); raises ProtocolError for a bad magic or an unknown type."""
    magic, ftype, flags, count, seq = _HDR.unpack_from(buf, offset)
    if magic != MAGIC:
        raise ProtocolError(f"bad frame magic 0x{magic:04x} (expected 0x{MAGIC:04x})")
    if ftype not in TYPE_NAMES:
        raise ProtocolError(f"unknown frame type {ftype}")
    return ftype, flags, count, seq


def json_frame(ftype: int, body: dict, seq: int = 0) -> bytes:
    data = json.dumps(body, separators=(",", ":")).encode()
    if len(data) > MAX_JSON_BYTES:
        raise ValueError(f"{TYPE_NAMES[ftype]} body is {len(data)} bytes; the limit is {MAX_JSON_BYTES}")
    return pack_header(ftype, len(data), seq) + data


def parse_json(ftype: int, data: bytes) -> dict:
    try:
        body = json.loads(data.decode())
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ProtocolError(f"{TYPE_NAMES[ftype]} body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ProtocolError(f"{TYPE_NAMES[ftype]} body must be a JSON object, got {type(body).__name__}")
    return body


def short(x, limit: int = 80) -> str:
    """repr of a peer-supplied value, cut to ``limit`` chars (a hostile peer must not flood the log)."""
    r = repr(x)
    return r if len(r) <= limit else r[:limit] + f"...({len(r)} chars)"


def as_secret(secret) -> bytes | None:
    """A shared secret as bytes (str is UTF-8 encoded); None stays None; an empty one is refused."""
    if secret is None:
        return None
    if isinstance(secret, str):
        secret = secret.encode()
    if not isinstance(secret, (bytes, bytearray)) or not secret:
        raise ValueError("secret is invalid: must be a non-empty str or bytes (or None for no authentication)")
    return bytes(secret)


def secret_from_env() -> bytes | None:
    """The shared secret in $ECHORL_REPLAY_SECRET, or None when unset or empty."""
    return os.environ.get(SECRET_ENV, "").encode() or None


def new_nonce() -> bytes:
    return os.urandom(32)


def auth_mac(secret: bytes, nonce: bytes) -> str:
    return hmac.new(secret, AUTH_LABEL + nonce, hashlib.sha256).hexdigest()


def check_mac(secret: bytes, nonce: bytes, mac) -> bool:
    """Constant-time comparison of the client's answer with the expected HMAC."""
    if not isinstance(mac, str) or len(mac) > 256:
        return False
    return hmac.compare_digest(mac.encode(), auth_mac(secret, nonce).encode())


def record_dtype(schema: Schema) -> np.dtype:
    """One sample's leaves as an aligned structured dtype (the DATA payload and shm slot layout)."""
    return np.dtype({"names": [f"f{i}" for i in range(len(schema.leaves))],
                     "formats": [(lf.dtype, lf.shape) if lf.shape else lf.dtype for lf in schema.leaves]},
                    align=True)


def frame_dtype(rec: np.dtype) -> np.dtype:
    """A one-sample DATA frame (header + record): runs of them are read as one array."""
    return np.dtype([("h", HEADER), ("r", rec)])


def hello_body(schema: Schema, client_id: str, transport: str, next_seq: int, role: str = "writer") -> dict:
    return {"version": PROTOCOL_VERSION, "schema": schema.to_json(), "client_id": client_id,
            "transport": transport, "next_seq": int(next_seq), "role": role}


def check_hello(body: dict, schema: Schema) -> tuple[str, str, int, str]:
    """Validate a HELLO body against the server's schema; returns (client_id, transport, next_seq, role)."""
    version = body.get("version")
    if version != PROTOCOL_VERSION:
        raise ProtocolError(f"protocol version {short(version)} is not supported (server speaks {PROTOCOL_VERSION})")
    try:
        theirs = Schema.from_json(body["schema"])
        same = theirs == schema
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, RecursionError, OverflowError) as exc:
        raise ProtocolError(f"HELLO schema is unreadable: {short(exc, 200)}") from None
    if not same:
        raise ProtocolError(f"schema mismatch: client sends [{theirs.describe()[:300]}], server stores "
                            f"[{schema.describe()}]")
    cid = body.get("client_id")
    if not isinstance(cid, str) or not 0 < len(cid) <= 256:
        raise ProtocolError(f"client_id={short(cid)} is invalid: must be a non-empty string of <= 256 chars")
    transport = body.get("transport")
    if transport not in ("tcp", "shm"):
        raise ProtocolError(f"transport={short(transport)} is invalid: allowed: tcp, shm")
    nxt = body.get("next_seq")
    if isinstance(nxt, bool) or not isinstance(nxt, int) or not 0 <= nxt < 1 << 63:
        raise ProtocolError(f"next_seq={short(nxt)} is invalid: must be an integer in [0, 2**63)")
    role = body.get("role", "writer")
    if role not in ("writer", "learner"):
        raise ProtocolError(f"role={short(role)} is invalid: allowed: writer, learner")
    return cid, transport, nxt, role


def records_to_tree(schema: Schema, records: np.ndarray):
    """The pytree of per-leaf views into a record array (no copy)."""
    return schema.unflatten([records[name] for name in records.dtype.names])


def tree_to_records(schema: Schema, rec: np.dtype, batch) -> np.ndarray:
    """Pack a batch pytree (leading axis n on each leaf) into n records; raises SchemaError naming the leaf."""
    n, leaves = schema.check_batch(batch)
    out = np.empty(n, dtype=rec)
    for name, x in zip(rec.names, leaves):
        out[name] = x
    return out
