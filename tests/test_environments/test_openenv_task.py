"""The `openenv` task: an environment built from the openenv package's own server code, played as a text task."""

import socket

import pytest

from tests.openenv_helpers import TwoFieldAction, serving, word_game_app

from echo_rl.config import ConfigError  # noqa: E402
from echo_rl.environments.base import ENV_OUTPUT, WARNING  # noqa: E402
from echo_rl.environments.registry import make_env, task_spec  # noqa: E402


def _word(obs):
    return obs.split()[-1].rstrip(".")


def _game(url, **kw):
    """The game's text is its prompt field (its observation also has a count, see test_observation_rendering)."""
    return make_env("openenv", url=url, observation_field="prompt", **kw)


@pytest.fixture(scope="module")
def url():
    with serving(word_game_app()) as base:
        yield base


def test_plays_an_episode_and_maps_reward_done_and_roles(url):
    env = _game(url)  # the action field ("message") comes from the server's /schema
    obs, info = env.reset(seed=5)
    word = _word(obs)
    assert obs == f"Say the word {word}." and [s.role for s in info["segments"]] == [ENV_OUTPUT]
    assert info["task_id"] == str(env._task_index) and info["admissible_actions"] is None
    obs, reward, terminated, truncated, info = env.step("pear")
    assert (obs, reward, terminated, truncated, info["won"]) == (f"No. Say {word}.", 0.0, False, False, False)
    obs, reward, terminated, truncated, info = env.step(word)
    assert (obs, reward, terminated, truncated, info["won"]) == ("Correct.", 1.0, True, False, True)
    # the session closed with the episode: this one-session server takes the next env's episode at once
    other = _game(url)
    assert other.reset(seed=5)[0] == f"Say the word {word}."
    other.close()


def test_same_seed_same_episode(url):
    a, b = _game(url), _game(url)
    first = a.reset(seed=11)[0]
    a.close()
    assert b.reset(seed=11)[0] == first
    b.close()


def test_a_refused_action_is_a_warning_and_the_episode_goes_on(url):
    env = _game(url)
    word = _word(env.reset(seed=0)[0])
    obs, reward, terminated, truncated, info = env.step("crash")  # the server's execution error
    assert [s.role for s in info["segments"]] == [WARNING] and "the game broke on purpose" in obs
    assert obs.startswith("The environment refused the action") and "\n" not in obs
    assert (reward, terminated, truncated) == (0.0, False, False)
    _, reward, terminated, _, info = env.step(word)  # the episode still runs
    assert reward == 1.0 and terminated and info["won"]


def test_max_steps_truncates_and_frees_the_session(url):
    env = _game(url, max_steps=2)
    env.reset(seed=1)
    assert env.step("x")[2:4] == (False, False)
    assert env.step("x")[2:4] == (False, True)
    again = _game(url)  # max_concurrent_envs=1: only free if the truncated episode let go
    again.reset(seed=2)
    again.close()


def test_an_env_dropped_mid_episode_frees_its_session(url):
    import gc

    env = _game(url)
    env.reset(seed=4)
    del env
    gc.collect()  # its finalizer closes the session: this one-session server takes the next episode
    again = _game(url)
    again.reset(seed=4)
    again.close()


def test_a_busy_server_is_a_one_line_error(url):
    holder = _game(url)
    holder.reset(seed=0)  # takes the server's only session
    with pytest.raises(ConfigError, match=r"reset was refused by the OpenEnv server at .*CAPACITY_REACHED") as err:
        _game(url).reset(seed=1)
    assert "\n" not in str(err.value)
    holder.close()


def test_the_server_ends_a_lost_episode_with_reward_zero(url):
    env = _game(url)
    env.reset(seed=2)
    outs = [env.step("no")[1:4] for _ in range(3)]
    assert outs == [(0.0, False, False), (0.0, False, False), (0.0, True, False)]


def test_action_json_replies_are_whole_actions(url):
    env = _game(url, action_json=True)
    word = _word(env.reset(seed=3)[0])
    obs, *_, info = env.step("say cloud")
    assert [s.role for s in info["segments"]] == [WARNING] and "JSON object" in obs
    obs, *_, info = env.step('["cloud"]')
    assert "not a JSON list" in obs
    obs, *_, info = env.step(f'{{"message": "{word}", "extra": 1}}')  # the server's model forbids extra fields
    assert [s.role for s in info["segments"]] == [WARNING] and "VALIDATION_ERROR" in obs
    _, reward, terminated, _, _ = env.step(f'{{"message": "{word}"}}')
    assert reward == 1.0 and terminated


def test_observation_rendering(url):
    env = make_env("openenv", url=url)  # two fields: key: value lines
    word = _word(env.reset(seed=0)[0].splitlines()[0])
    assert env._last_obs == f"prompt: Say the word {word}.\nmisses: 0"
    assert env.step("no")[0] == f"prompt: No. Say {word}.\nmisses: 1"
    env.close()
    env = make_env("openenv", url=url, observation_field="misses", action_field="message")
    assert env.reset(seed=0)[0] == "0"
    env.close()


def test_bad_urls_and_options_are_one_line_errors(url):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: nothing listens there
    with pytest.raises(ConfigError, match=rf"cannot read /schema from the OpenEnv server at http://127.0.0.1:{port}"):
        make_env("openenv", url=f"http://127.0.0.1:{port}")
    env = make_env("openenv", url=f"http://127.0.0.1:{port}", action_field="message")
    with pytest.raises(ConfigError, match=r"cannot open a session on the OpenEnv server at .*") as err:
        env.reset(seed=0)
    assert "\n" not in str(err.value)
    for bad, match in (({"url": "ftp://x"}, "OpenEnvConfig.url"), ({"url": ""}, "OpenEnvConfig.url"),
                       ({"url": url, "nope": 1}, "unknown field OpenEnvConfig.nope"),
                       ({"url": url, "action_json": True, "action_field": "m"}, "action_field"),
                       ({"url": url, "reset_kwargs": {"seed": 1}}, "reset_kwargs")):
        with pytest.raises(ConfigError, match=match):
            make_env("openenv", **bad)


def test_an_ambiguous_action_schema_asks_for_action_field():
    with serving(word_game_app(TwoFieldAction)) as base:
        with pytest.raises(ConfigError, match=r"2 text fields among \['verb', 'target'\].*action_field"):
            make_env("openenv", url=base)


def test_registered_with_its_description():
    spec = task_spec("openenv")
    assert "OpenEnv" in spec.description and "echo-rl[openenv]" in spec.data
