"""A seeded fuzz of the replay server: hundreds of malformed connections must do no harm.

No harm means: the server stays up, its memory stays bounded (RSS measured while connections
announce 2^20-record frames), every sample acknowledged before the fuzz is still in the buffer
exactly once, every fuzz connection is closed by the server, and valid writers and learners work
afterwards. The cases are built from ``random.Random(SEED)``; only thread timing varies.
"""

import json
import random
import socket
import struct
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from echo_rl.distributed import LearnerClient, ReplayClient, ReplayServer
from echo_rl.distributed import protocol as P
from echo_rl.replay import PrioritizedReplayBuffer

SEED = 20261125
N_OBS = 32  # 144-byte records: one announced 2^20-record frame would be 144 MiB if allocated up front


def example() -> dict:
    return {"obs": np.zeros(N_OBS, np.float32), "action": np.zeros(1, np.int64), "done": np.zeros(1, bool)}


def batch(writer: int, first: int, n: int) -> dict:
    seqs = np.arange(first, first + n)
    obs = np.zeros((n, N_OBS), np.float32)
    obs[:, 0] = writer
    return {"obs": obs, "action": (writer * 1_000_000 + seqs)[:, None].astype(np.int64),
            "done": np.zeros((n, 1), bool)}


def rss_bytes() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


class Gen:
    """Byte strings for the cases: valid pieces, then broken ones."""

    def __init__(self, srv: ReplayServer, rng: random.Random):
        self.srv, self.rng = srv, rng
        self.rec = P.record_dtype(srv.schema)
        self.frame = P.frame_dtype(self.rec)
        self.n = 0

    def hello_body(self, role="writer", transport="tcp") -> dict:
        self.n += 1
        body = P.hello_body(self.srv.schema, f"fuzz-{self.n}", transport, 0, role=role)
        body["stream"] = f"fuzz-stream-{self.n}"
        return body

    def hello(self, body=None) -> bytes:
        return P.HELLO_MAGIC + P.json_frame(P.HELLO, body or self.hello_body())

    def records(self, k: int) -> np.ndarray:
        recs = np.zeros(k, self.rec)
        recs["f0"][:, 0] = 5_000_000 + np.arange(k) + 1000 * self.n  # writer 5: never the protected keys
        return recs

    def data(self, first: int, k: int, multi: bool) -> bytes:
        if multi:
            return P.pack_header(P.DATA, k, first) + self.records(k).tobytes()
        fr = np.zeros(k, self.frame)
        fr["h"]["magic"], fr["h"]["type"], fr["h"]["count"] = P.MAGIC, P.DATA, 1
        fr["h"]["seq"] = first + np.arange(k)
        fr["r"] = self.records(k)
        return fr.tobytes()

    def valid_stream(self) -> bytes:
        k1, k2 = self.rng.randint(1, 20), self.rng.randint(2, 40)
        return self.data(0, k1, False) + self.data(k1, k2, True)

    def flip(self, data: bytes, lo: int = 0) -> bytes:
        b = bytearray(data)
        for _ in range(self.rng.randint(1, 8)):
            i = self.rng.randrange(lo, len(b))
            b[i] ^= 1 << self.rng.randrange(8)
        return bytes(b)

    def junk(self, lo=1, hi=200) -> bytes:
        return bytes(self.rng.getrandbits(8) for _ in range(self.rng.randint(lo, hi)))

    def bad_hello_body(self) -> dict:
        body = self.hello_body()
        r = self.rng
        schema = json.loads(json.dumps(body["schema"]))
        leaf = r.randrange(len(schema["leaves"]))
        choice = r.randrange(14)
        if choice == 0:
            schema["leaves"][leaf][1] = r.choice(["<f8", "|u1", "<i4", "float31", "O", "", "<U5"])  # dtype
        elif choice == 1:
            schema["leaves"][leaf][2] = r.choice([[7], [], [32, 1], [-1], [2 ** 40], ["x"], None])  # shape
        elif choice == 2:
            schema["leaves"].append(["extra", "<f4", [1]])
        elif choice == 3:
            schema = r.choice([None, 5, "schema", [], {"leaves": "x"}, {"treedef": []}])
        elif choice == 4:
            schema["treedef"] = r.choice([None, 1, "x", {"type": "?"}, [[[[[]]]]]])
        elif choice == 5:
            body["version"] = r.choice([0, 2, "1", None, 1.0000001, 2 ** 70])
        elif choice == 6:
            del body["version"]
        elif choice == 7:
            body["client_id"] = r.choice(["", None, 7, "x" * 257, ["a"]])
        elif choice == 8:
            body["transport"] = r.choice(["udp", "", None, 1, "TCP"])
        elif choice == 9:
            body["next_seq"] = r.choice([-1, "0", None, 1.5, True, 2 ** 64])
        elif choice == 10:
            body["role"] = r.choice(["admin", "", None, 3])
        elif choice == 11:
            body["stream"] = r.choice(["", None, "s" * 65, 42])
        elif choice == 12:
            schema["leaves"][leaf] = r.choice([[], ["obs"], ["obs", "<f4"], "obs", None])
        else:
            body["next_seq"] = 10 ** 6  # ahead of the server for a new stream
        body["schema"] = schema
        return body

    def case(self, kind: str):
        """(bytes to send, how: 'read' waits for the server to close, 'close' hangs up, 'rst' resets)."""
        r = self.rng
        if kind == "random":
            return self.junk(), "read"
        if kind == "bad-hello-header":
            body = json.dumps(self.hello_body()).encode()
            return P.HELLO_MAGIC + self.flip(P.pack_header(P.HELLO, len(body), 0)) + body, "read"
        if kind == "flipped-hello":
            return self.flip(self.hello(), lo=len(P.HELLO_MAGIC)), "read"
        if kind == "bad-hello":
            return self.hello(self.bad_hello_body()), "read"
        if kind == "flipped-data":
            h = self.hello()
            return h + self.flip(self.valid_stream()), "read"
        if kind == "truncated":
            whole = self.hello() + self.valid_stream()
            return whole[: r.randrange(1, len(whole))], r.choice(["close", "read"])
        if kind == "huge-count":
            pick = r.randrange(5)
            if pick == 0:
                return self.hello() + P.pack_header(P.DATA, r.choice([P.MAX_FRAME_SAMPLES, 2 ** 32 - 1]), 0), "read"
            if pick == 1:
                return P.HELLO_MAGIC + P.pack_header(P.HELLO, r.choice([P.MAX_JSON_BYTES, 2 ** 32 - 1]), 0), "read"
            if pick == 2:
                return (self.hello(self.hello_body(role="learner"))
                        + P.pack_header(P.PRIORITIES, P.MAX_FRAME_SAMPLES, 0) + self.junk(16, 64)), "read"
            if pick == 3:
                return self.hello(self.hello_body(role="learner")) + P.pack_header(P.SAMPLE, P.MAX_FRAME_SAMPLES, 0), \
                    "read"
            return self.hello() + self.data(0, 3, False) + P.pack_header(P.DATA, P.MAX_FRAME_SAMPLES, 3) \
                + self.records(100).tobytes(), "read"
        if kind == "wrong-magic":
            pick = r.randrange(3)
            if pick == 0:
                return self.junk(14, 14) + P.json_frame(P.HELLO, self.hello_body()), "read"
            hdr = bytearray(P.pack_header(P.DATA, 1, 0))
            hdr[0:2] = struct.pack("<H", r.choice([0, 0xEC41, 0xFFFF, 0x40EC]))
            if pick == 2:
                hdr = bytearray(P.pack_header(r.choice([0, 11, 200, P.HELLO, P.WELCOME, P.ACK, P.AUTH]), 1, 0))
            return self.hello() + bytes(hdr) + self.records(1).tobytes(), "read"
        if kind == "garbage-after-valid":
            return self.hello() + self.valid_stream() + self.junk(16, 300), "read"
        if kind == "bad-priorities":
            ids = np.array([r.randrange(-5, 10 ** 9) for _ in range(4)], np.int64)
            pr = np.array([r.choice([-1.0, float("nan"), float("inf"), 1.0]) for _ in range(4)])
            return (self.hello(self.hello_body(role="learner")) + P.pack_header(P.PRIORITIES, 4, 0) + ids.tobytes()
                    + pr.tobytes()), "read"
        if kind == "abrupt":
            whole = self.hello() + self.valid_stream()
            return whole[: r.randrange(1, len(whole))], "rst"
        raise ValueError(kind)


CASES = {"random": 40, "bad-hello-header": 25, "flipped-hello": 40, "bad-hello": 45, "flipped-data": 60,
         "truncated": 30, "huge-count": 20, "wrong-magic": 20, "garbage-after-valid": 30, "bad-priorities": 10,
         "abrupt": 30}


def run_case(address, data: bytes, how: str) -> str:
    """Send, then wait (<= 5 s) for the server to close; returns who ended it."""
    s = socket.create_connection(address, timeout=5)
    try:
        try:
            s.sendall(data)
        except OSError:
            return "server"  # already refused and reset
        if how == "close":
            return "client"
        if how == "rst":
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            return "client"
        while True:
            try:
                if not s.recv(65536):
                    return "server"
            except (TimeoutError, socket.timeout):
                return "timeout"
            except OSError:
                return "server"
    finally:
        s.close()


def slow_loris(address, data: bytes, gap: float, limit: float) -> float:
    """Trickle data one byte every ``gap`` s; seconds until the server hangs up (or ``limit``)."""
    s = socket.create_connection(address, timeout=limit)
    t0 = time.monotonic()
    try:
        for i in range(len(data)):
            s.sendall(data[i: i + 1])
            time.sleep(gap)
            if time.monotonic() - t0 > limit:
                break
        s.settimeout(max(0.1, limit - (time.monotonic() - t0)))
        while s.recv(4096):
            pass
    except OSError:
        pass
    finally:
        s.close()
    return time.monotonic() - t0


def _wait(cond, timeout=20.0) -> bool:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            return False
        time.sleep(0.02)
    return True


@pytest.mark.timeout(300)
def test_fuzzed_frames_do_no_harm():
    rng = random.Random(SEED)
    buf = PrioritizedReplayBuffer(1 << 14, example=example(), min_experiences=1, seed=0)
    with ReplayServer(buf, handshake_timeout=1.0, idle_timeout=1.0, max_reply_bytes=1 << 22) as srv:
        # samples acknowledged before the fuzz (TCP and shared memory)
        for transport, writer in (("tcp", 1), ("shm", 2)):
            with ReplayClient(srv.address, example(), transport=transport) as c:
                c.send_batch(batch(writer, 0, 1500))
                for i in range(1500, 2000):
                    c.send({k: v[0] for k, v in batch(writer, i, 1).items()})
                assert c.flush(wait=True, timeout=30) and c.acked == 2000
        gen = Gen(srv, rng)

        # 1. announced 2^20-record frames with little data: memory must follow the bytes, not the counts
        base = rss_bytes()
        hogs = []
        for i in range(4):
            s = socket.create_connection(srv.address, timeout=5)
            s.sendall(gen.hello() + P.pack_header(P.DATA, P.MAX_FRAME_SAMPLES, 0) + gen.records(1000).tobytes())
            hogs.append(s)
        time.sleep(0.5)  # idle_timeout is 1 s: the connections are still open
        grown = rss_bytes() - base
        assert grown <= 64 << 20, f"RSS grew by {grown >> 20} MiB for 4 announced 2^20-record frames"
        for s in hogs:
            s.close()

        # 2. hundreds of malformed connections (seeded), several at a time
        cases = [(kind, *gen.case(kind)) for kind, n in CASES.items() for _ in range(n)]
        rng.shuffle(cases)
        assert len(cases) >= 300
        with ThreadPoolExecutor(8) as pool:
            ends = list(pool.map(lambda c: run_case(srv.address, c[1], c[2]), cases))
        assert "timeout" not in ends, [c[0] for c, e in zip(cases, ends) if e == "timeout"]

        # 3. slow-loris: a handshake or a frame trickled byte by byte is cut at its deadline
        loris = [gen.hello()] * 3 + [gen.hello() + gen.data(0, 2, True)[:-1]] * 3
        with ThreadPoolExecutor(6) as pool:
            took = list(pool.map(lambda d: slow_loris(srv.address, d, 0.05, 6.0), loris))
        assert max(took) < 4.0, took  # 1 s deadlines (the hello alone needs > 10 s at this pace)

        # no harm: server up, every fuzz connection closed, memory bounded, nothing acknowledged lost
        assert all(t.is_alive() for t in srv._threads[:2]), "accept or ring thread died"
        assert _wait(lambda: srv.metrics()["replay/connections"] == 0), srv.metrics()["replay/connections"]
        grown = rss_bytes() - base
        assert grown <= 64 << 20, f"RSS grew by {grown >> 20} MiB over the fuzz"
        assert len(buf) < buf.capacity  # nothing overwritten: the check below sees every sample ever stored
        keys = buf._storage[srv.schema.names.index("action")][: len(buf), 0]
        for writer in (1, 2):
            mine = np.sort(keys[keys // 1_000_000 == writer])
            np.testing.assert_array_equal(mine, writer * 1_000_000 + np.arange(2000))
        assert srv.metrics()["replay/closed_connections"] >= 250  # the server named a reason for most
        assert not [r for r in srv.closed_reasons if "internal error" in r]  # every case met a named check

        # a valid writer and learner still work
        for transport, writer in (("tcp", 3), ("shm", 4)):
            with ReplayClient(srv.address, example(), transport=transport) as c:
                c.send_batch(batch(writer, 0, 300))
                assert c.flush(wait=True, timeout=30) and c.acked == 300
        with LearnerClient(srv.address, example()) as learner:
            b = learner.sample(64)
            assert b.data["obs"].shape == (64, N_OBS)
            learner.update_priorities(b.indices, np.ones(64))
        keys = buf._storage[srv.schema.names.index("action")][: len(buf), 0]
        for writer in (3, 4):
            np.testing.assert_array_equal(np.sort(keys[keys // 1_000_000 == writer]), writer * 1_000_000 + np.arange(300))
