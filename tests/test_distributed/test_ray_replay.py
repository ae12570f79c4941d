"""The replay service as a Ray actor passes its shared secret and server limits through to the server."""

import numpy as np
import pytest
from dist_helpers import example, make

from echo_rl.distributed import LearnerClient, ReplayClient, ReplayServerBusy, ReplayServerError
from echo_rl.distributed.limits import ServerLimits

pytest.importorskip("ray", reason="the Ray replay service needs pip install 'echo-rl[distributed]'")

from echo_rl.distributed.ray_replay import ReplayService, start_replay_service  # noqa: E402

SECRET = "ray-replay-secret-0123"
LIMITS = ServerLimits(max_connections=2, handshake_timeout=3.0, idle_timeout=5.0, max_rings=1,
                      max_rings_per_client=1, max_reply_bytes=1 << 20)


def test_the_service_body_serves_with_its_secret_and_limits(monkeypatch):
    monkeypatch.delenv("ECHORL_REPLAY_SECRET", raising=False)
    svc = ReplayService(example(), 1000, host="127.0.0.1", secret=SECRET, limits=LIMITS, min_experiences=1, seed=0)
    try:
        assert svc.server.limits == LIMITS
        with pytest.raises(ReplayServerError, match="requires a shared secret"):
            ReplayClient(svc.address(), example(), transport="tcp").connect()
        with pytest.raises(ReplayServerError, match="wrong shared secret"):
            ReplayClient(svc.address(), example(), transport="tcp", secret="not-it").connect()
        with ReplayClient(svc.address(), example(), transport="tcp", secret=SECRET) as c:
            for i in range(8):
                c.send(make(0, i))
            assert c.flush(wait=True, timeout=20)
        with LearnerClient(svc.address(), example(), secret=SECRET) as learner:
            with pytest.raises(ReplayServerError, match="max_reply_bytes=1048576"):
                learner.sample(30_000)  # 30k samples of ~100 bytes: over the 1 MiB reply limit
        assert svc.sample(4, timeout=5).data["obs"].shape == (4, 6)
    finally:
        svc.close()


def test_the_service_refuses_limits_that_are_not_server_limits():
    with pytest.raises(TypeError, match="limits must be a ServerLimits, got dict"):
        ReplayService(example(), 10, host="127.0.0.1", limits={"max_connections": 2})


def test_start_replay_service_passes_secret_and_limits_to_the_actor(local_ray, monkeypatch):
    monkeypatch.delenv("ECHORL_REPLAY_SECRET", raising=False)
    one_conn = ServerLimits(max_connections=1)
    actor, address = start_replay_service(example(), 1000, host="127.0.0.1", secret=SECRET, limits=one_conn,
                                          min_experiences=1, seed=0)
    try:
        with pytest.raises(ReplayServerError, match="requires a shared secret"):
            ReplayClient(address, example(), transport="tcp").connect()
        with ReplayClient(address, example(), transport="tcp", secret=SECRET) as c:
            c.send(make(1, 0))
            assert c.flush(wait=True, timeout=20)
            # the writer holds the one connection max_connections allows: a second peer is refused, retryably
            second = ReplayClient(address, example(), transport="tcp", secret=SECRET, connect_timeout=0.5,
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
