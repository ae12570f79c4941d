import numpy as np
import pytest
from dist_helpers import example

from echo_rl.distributed import protocol as P
from echo_rl.replay.schema import Schema


def test_header_round_trip_and_bad_magic():
    h = P.pack_header(P.DATA, 7, 123456789012)
    assert len(h) == P.HEADER_SIZE
    assert P.unpack_header(h) == (P.DATA, 0, 7, 123456789012)
    with pytest.raises(P.ProtocolError, match="magic"):
        P.unpack_header(b"\x00" * P.HEADER_SIZE)
    bad_type = bytearray(h)
    bad_type[2] = 200
    with pytest.raises(P.ProtocolError, match="unknown frame type 200"):
        P.unpack_header(bytes(bad_type))


def test_records_round_trip_a_batch():
    schema = Schema.from_example(example())
    rec = P.record_dtype(schema)
    batch = {"obs": np.arange(18, dtype=np.float32).reshape(3, 6), "action": np.array([[1], [2], [3]]),
             "done": np.array([[True], [False], [True]])}
    recs = P.tree_to_records(schema, rec, batch)
    back = P.records_to_tree(schema, np.frombuffer(recs.tobytes(), dtype=rec))
    for k in batch:
        np.testing.assert_array_equal(back[k], batch[k])


def test_hello_checks_version_schema_and_fields():
    schema = Schema.from_example(example())
    good = P.hello_body(schema, "w0", "tcp", 0)
    assert P.check_hello(good, schema) == ("w0", "tcp", 0, "writer")
    with pytest.raises(P.ProtocolError, match="protocol version 99"):
        P.check_hello({**good, "version": 99}, schema)
    other = Schema.from_example({**example(), "obs": np.zeros(7, np.float32)})
    with pytest.raises(P.ProtocolError, match="schema mismatch.*obs"):
        P.check_hello(P.hello_body(other, "w0", "tcp", 0), schema)
    with pytest.raises(P.ProtocolError, match="transport='udp'"):
        P.check_hello({**good, "transport": "udp"}, schema)
    with pytest.raises(P.ProtocolError, match="next_seq=-1"):
        P.check_hello({**good, "next_seq": -1}, schema)
    with pytest.raises(P.ProtocolError, match="client_id"):
        P.check_hello({**good, "client_id": ""}, schema)
    with pytest.raises(P.ProtocolError, match="not JSON"):
        P.parse_json(P.HELLO, b"\xff\xfe")
