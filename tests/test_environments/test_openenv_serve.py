"""`echo-rl serve-env`: EchoRL's text tasks served as OpenEnv servers, driven by the openenv package's own client."""

import json
import os

import pytest

from tests.openenv_helpers import core, serving

import httpx  # noqa: E402
from websockets.exceptions import InvalidStatus  # noqa: E402
from websockets.sync.client import connect  # noqa: E402

from echo_rl.cli import build_parser, main  # noqa: E402
from echo_rl.config import ConfigError  # noqa: E402
from echo_rl.environments.base import ENV_OUTPUT, WARNING  # noqa: E402
from echo_rl.environments.openenv_server import build_app  # noqa: E402
from echo_rl.environments.registry import make_env  # noqa: E402

MINIGRID = {"env_id": "MiniGrid-DoorKey-5x5-v0"}


@pytest.fixture(scope="module")
def minigrid_url():
    with serving(build_app("minigrid", MINIGRID, max_sessions=2, max_request_bytes=4096,
                           max_action_chars=64)) as url:
        yield url


def _client(url):
    return core.GenericEnvClient(base_url=url).sync()


def test_openenv_client_plays_minigrid_like_the_local_env(minigrid_url):
    """The expert's episode, step by step: the served observations, rewards and ends equal the local env's."""
    local = make_env("minigrid", **MINIGRID)
    obs, _ = local.reset(seed=7)
    with _client(minigrid_url) as env:
        result = env.reset(seed=7)
        assert result.observation["text"] == obs and not result.done
        assert [s["role"] for s in result.observation["segments"]] == [ENV_OUTPUT]
        assert result.observation["admissible_actions"] == local.reset(seed=7)[1]["admissible_actions"]
        for _ in range(50):
            action = local.expert_action()
            obs, reward, terminated, truncated, info = local.step(action)
            result = env.step({"text": action})
            assert (result.observation["text"], result.reward, result.done) == (obs, reward, terminated or truncated)
            if result.done:
                break
        assert result.observation["won"] and result.reward > 0
        state = env.state()
        assert state["task"] == "minigrid" and state["won"] and state["done"] and state["step_count"] > 0


def test_a_bad_action_is_a_warning_segment_and_step_before_reset_is_refused_softly(minigrid_url):
    with _client(minigrid_url) as env:
        result = env.step({"text": "move forward"})
        assert result.done and result.observation["segments"][0]["role"] == WARNING
        env.reset(seed=1)
        result = env.step({"text": "fly away"})
        assert [s["role"] for s in result.observation["segments"]] == [WARNING] and not result.done


def test_echorl_trains_on_its_own_served_task(minigrid_url):
    """Round trip: the openenv task reads the served segments (roles kept), won and admissible actions."""
    env = make_env("openenv", url=minigrid_url)  # the action field, "text", from /schema
    obs, info = env.reset(seed=3)
    assert info["admissible_actions"] == ["turn left", "turn right", "move forward", "pick up", "drop", "toggle",
                                          "done"]
    obs, *_, info = env.step("jump")
    assert [s.role for s in info["segments"]] == [WARNING] and obs.startswith("Unknown action")
    assert info["task_id"].startswith("MiniGrid-DoorKey-5x5-v0")
    env.close()
    long = make_env("openenv", url=minigrid_url, max_steps=1000)  # only the server's limit (MiniGrid's 250) ends it
    long.reset(seed=0)
    for steps in range(1, 1000):
        _, _, terminated, truncated, _ = long.step("turn left")
        if terminated or truncated:
            break
    assert (steps, truncated, terminated) == (250, True, False)  # the served task's truncation stays one here


def test_hostile_requests_are_refused(minigrid_url):
    for method, path in (("GET", "/docs"), ("GET", "/openapi.json"), ("POST", "/mcp"), ("GET", "/web"),
                         ("GET", "/list_environments"), ("POST", "/minigrid/tasks")):
        assert httpx.request(method, minigrid_url + path, json={}).status_code == 404, path
    big = httpx.post(minigrid_url + "/step", content=b"{" + b" " * 5000 + b"}",
                     headers={"content-type": "application/json"})
    assert big.status_code == 413
    ok = httpx.post(minigrid_url + "/reset", json={"seed": 1})  # OpenEnv's stateless HTTP reset still answers
    assert ok.status_code == 200 and ok.json()["observation"]["text"].startswith("Mission")
    ws_url = minigrid_url.replace("http://", "ws://")
    with connect(ws_url + "/ws") as ws:
        ws.send(json.dumps({"type": "reset", "data": {"seed": 1}}))
        assert json.loads(ws.recv())["type"] == "observation"
        for bad in ({"type": "step", "data": {"text": "x" * 65}},  # over max_action_chars
                    {"type": "step", "data": {"text": "drop", "shell": "rm -rf /"}},  # only the action's field
                    {"type": "step", "data": {"text": 7}}):
            ws.send(json.dumps(bad))
            assert json.loads(ws.recv())["type"] == "error"
        ws.send(json.dumps({"type": "mcp", "data": {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                                                    "params": {"name": "step", "arguments": {}}}}))
        assert "does not support MCP" in json.dumps(json.loads(ws.recv()))  # no tool runs behind the session
        ws.send(json.dumps({"type": "reset", "data": {"seed": 1, "task_index": 10 ** 12}}))
        assert "task_index" in json.loads(ws.recv())["data"]["message"]
        ws.send(json.dumps({"type": "step", "data": {"text": "turn left"}}))  # the session survived all of it
        assert json.loads(ws.recv())["type"] == "observation"
        ws.send("x" * 5000)  # over max_request_bytes: the guard closes the socket
        with pytest.raises(Exception):
            ws.recv(timeout=10)
        assert ws.close_code == 1009
    with pytest.raises(InvalidStatus, match="403"):  # OpenEnv's MCP socket is not served
        connect(ws_url + "/mcp")


def test_sessions_are_capped(minigrid_url):
    a, b = _client(minigrid_url), _client(minigrid_url)
    a.reset(seed=0)
    b.reset(seed=0)
    with pytest.raises(Exception, match="CAPACITY_REACHED"), _client(minigrid_url) as c:
        c.reset(seed=0)
    a.close()
    b.close()


def test_bad_settings_and_tasks_are_one_line_errors(capsys):
    with pytest.raises(ConfigError, match="unknown task 'nope'"):
        build_app("nope")
    with pytest.raises(ConfigError, match="max_sessions=0"):
        build_app("minigrid", max_sessions=0)
    assert main(["serve-env", "minigrid", "--set", "task_type=maze"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("echo-rl serve-env: error:") and "task_type" in err and "\n" not in err
    assert build_parser().parse_args(["serve-env", "minigrid"]).host == "127.0.0.1"  # loopback unless told




def test_a_served_terminal_task_runs_its_oracle_to_a_win(sandbox_ok):
    config = {"split": "test", "level": 1, "instances_per_template": 5}
    local = make_env("terminal", **config)
    with serving(build_app("terminal", config, max_sessions=1)) as url, _client(url) as env:
        result = env.reset(seed=0, task_index=0)
        local.reset(seed=0, options={"task_index": 0})
        assert result.observation["task_id"] == local._task_id()
        for _ in range(20):
            action = local.expert_action()  # the oracle's next command, from the local twin of the episode
            _, reward, terminated, truncated, _ = local.step(action)
            result = env.step({"text": action})
            assert result.done == (terminated or truncated)
            if result.done:
                break
        assert result.reward == reward
        assert result.done and result.observation["won"] and result.reward >= 1.0
        refused = env.step({"text": "<bash>cat /etc/shadow</bash>"})  # after the episode: nothing runs
        assert refused.done and refused.observation["segments"][0]["role"] == WARNING


def test_the_cli_serves_until_stopped(tmp_path):
    """`echo-rl serve-env` in its own process (lifespan on, the uvicorn WebSocket cap), stopped by its pid."""
    import socket
    import subprocess
    import sys
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen([sys.executable, "-m", "echo_rl.cli", "serve-env", "minigrid", "--port", str(port),
                             "--log-level", "warning", "--set", "max_steps=3"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, "serve-env did not come up"
            time.sleep(0.3)
        with _client(url) as client:
            client.reset(seed=0)
            outs = [client.step({"text": "turn left"}).done for _ in range(3)]
        assert outs == [False, False, True]  # --set max_steps=3 reached the served task
    finally:
        proc.terminate()
        out = proc.communicate(timeout=30)[0]
    assert f"minigrid as an OpenEnv server on {url}" in out
