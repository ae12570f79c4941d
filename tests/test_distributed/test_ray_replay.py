"""The replay service as a Ray actor makes its own shared secret (never an actor constructor argument, which the
GCS keeps) and passes its server limits through to the server."""

import numpy as np
import pytest
from dist_helpers import example, holds, make, spy_actor_creation

from echo_rl.distributed import LearnerClient, ReplayClient, ReplayServerBusy, ReplayServerError
from echo_rl.distributed.limits import ServerLimits

pytest.importorskip("ray", reason="the Ray replay service needs pip install 'echo-rl[distributed]'")

from echo_rl.distributed.ray_replay import ReplayService, start_replay_service  # noqa: E402

LIMITS = ServerLimits(max_connections=2, handshake_timeout=3.0, idle_timeout=5.0, max_rings=1,
                      max_rings_per_client=1, max_reply_bytes=1 << 20)


def test_the_service_body_serves_with_its_own_secret_and_limits(monkeypatch):
    monkeypatch.delenv("ECHORL_REPLAY_SECRET", raising=False)
    svc = ReplayService(example(), 1000, host="127.0.0.1", limits=LIMITS, min_experiences=1, seed=0)
    other = ReplayService(example(), 10, host="127.0.0.1")
    try:
        secret = svc.secret()
        assert isinstance(secret, bytes) and len(secret) == 32 and secret != other.secret()
        assert svc.server.limits == LIMITS
        with pytest.raises(ReplayServerError, match="requires a shared secret"):
            ReplayClient(svc.address(), example(), transport="tcp").connect()
        with pytest.raises(ReplayServerError, match="wrong shared secret"):
            ReplayClient(svc.address(), example(), transport="tcp", secret=other.secret()).connect()
        with ReplayClient(svc.address(), example(), transport="tcp", secret=secret) as c:
            for i in range(8):
                c.send(make(0, i))
            assert c.flush(wait=True, timeout=20)
        with LearnerClient(svc.address(), example(), secret=secret) as learner:
            with pytest.raises(ReplayServerError, match="max_reply_bytes=1048576"):
                learner.sample(30_000)  # 30k samples of ~100 bytes: over the 1 MiB reply limit
        assert svc.sample(4, timeout=5).data["obs"].shape == (4, 6)
    finally:
        svc.close()
        other.close()
    open_svc = ReplayService(example(), 10, host="127.0.0.1", authenticate=False)
    try:
        assert open_svc.secret() is None
        ReplayClient(open_svc.address(), example(), transport="tcp").connect().close()
    finally:
        open_svc.close()


def test_the_service_refuses_limits_that_are_not_server_limits():
    with pytest.raises(TypeError, match="limits must be a ServerLimits, got dict"):
        ReplayService(example(), 10, host="127.0.0.1", limits={"max_connections": 2})


def test_start_replay_service_keeps_the_secret_out_of_the_actor_spec(local_ray, monkeypatch):
    """The actor's creation arguments hold no secret; the driver gets it as a method's return value, and it
    (not a wrong one, not none) opens the service; limits reach the server."""
    monkeypatch.delenv("ECHORL_REPLAY_SECRET", raising=False)
    created = spy_actor_creation(monkeypatch, local_ray)
    one_conn = ServerLimits(max_connections=1)
    actor, address, secret = start_replay_service(example(), 1000, host="127.0.0.1", limits=one_conn,
                                                  min_experiences=1, seed=0)
    try:
        (name, args, kwargs), = created
        assert name == "ReplayService" and "secret" not in kwargs
        assert isinstance(secret, bytes) and len(secret) == 32 and not holds((args, kwargs), secret)
        assert local_ray.get(actor.secret.remote()) == secret
        with pytest.raises(ReplayServerError, match="requires a shared secret"):
            ReplayClient(address, example(), transport="tcp").connect()
        with pytest.raises(ReplayServerError, match="wrong shared secret"):
            ReplayClient(address, example(), transport="tcp", secret=bytes(32)).connect()
        with ReplayClient(address, example(), transport="tcp", secret=secret) as c:
            c.send(make(1, 0))
            assert c.flush(wait=True, timeout=20)
            # the writer holds the one connection max_connections allows: a second peer is refused, retryably
            second = ReplayClient(address, example(), transport="tcp", secret=secret, connect_timeout=0.5,
                                  reconnect_timeout=0.5)
            with pytest.raises(ConnectionError, match="too many connections .*max_connections=1") as err:
                second.connect()
            assert isinstance(err.value.__cause__, ReplayServerBusy)
        batch = local_ray.get(actor.sample.remote(1, timeout=10))
        assert np.array_equal(batch.data["obs"][0][:2], [1, 0])
    finally:
        local_ray.get(actor.close.remote())
        local_ray.kill(actor)
    with pytest.raises(TypeError, match="limits must be a ServerLimits"):
        start_replay_service(example(), 10, limits=(1, 2))
