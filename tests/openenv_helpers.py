"""A small environment written against the openenv package's own base classes, served by its own server code.

The word game: reset(seed) names a word; saying it wins (reward 1, done), anything else gets a hint (reward 0),
"crash" makes the environment raise (an execution error the server reports), and the third miss ends the
episode with reward 0. ``SUPPORTS_CONCURRENT_SESSIONS`` stays False: one session at a time, as many servers run.
"""

from __future__ import annotations

import contextlib

import pytest

core = pytest.importorskip("openenv.core", reason="needs the openenv package: pip install 'echo-rl[openenv]'")

from pydantic import Field  # noqa: E402

WORDS = ("apple", "river", "stone", "cloud")
COUNTS = {"reset": 0, "step": 0}


class SayAction(core.Action):
    message: str = Field(..., description="what the agent says")


class SayObservation(core.Observation):
    prompt: str = Field("", description="what the game says")
    misses: int = Field(0, description="wrong words so far")


class WordGame(core.Environment):
    def __init__(self) -> None:
        super().__init__()
        self.word, self.misses, self.steps, self.episode = "", 0, 0, None

    def reset(self, seed=None, episode_id=None, **kwargs):
        COUNTS["reset"] += 1
        self.word, self.misses, self.steps, self.episode = WORDS[(seed or 0) % len(WORDS)], 0, 0, episode_id
        return SayObservation(prompt=f"Say the word {self.word}.", reward=0.0, done=False)

    def step(self, action, timeout_s=None, **kwargs):
        COUNTS["step"] += 1
        if action.message == "crash":
            raise ValueError("the game broke on purpose")
        self.steps += 1
        if action.message.strip() == self.word:
            return SayObservation(prompt="Correct.", reward=1.0, done=True)
        self.misses += 1
        return SayObservation(prompt=f"No. Say {self.word}.", misses=self.misses, reward=0.0, done=self.misses >= 3)

    @property
    def state(self):
        return core.State(episode_id=self.episode, step_count=self.steps)


class TwoFieldAction(core.Action):
    verb: str
    target: str


class ConcurrentWordGame(WordGame):
    SUPPORTS_CONCURRENT_SESSIONS = True  # each session its own game: several episodes at once


def word_game_app(action_cls=SayAction, sessions=1):
    game = WordGame if sessions == 1 else ConcurrentWordGame
    return core.create_fastapi_app(game, action_cls, SayObservation, max_concurrent_envs=sessions)


@contextlib.contextmanager
def serving(app):
    """``app`` on a free loopback port, lifespan on (OpenEnv's session reaper); yields its base URL."""
    from echo_rl.serve.server import ModelServer

    server = ModelServer(app, uvicorn_options={"lifespan": "on"}).start()
    try:
        yield f"http://127.0.0.1:{server.port}"
    finally:
        server.stop()
