"""The trainer's side of a user's program: bad input is a one-line error or a counted drop, and the run goes on."""

import asyncio
import json
import sys
import threading
from pathlib import Path

import pytest

pytest.importorskip("openai")
pytest.importorskip("fastapi")

from echo_rl.cli import main  # noqa: E402
from echo_rl.external.client import report  # noqa: E402
from echo_rl.external.runner import ExternalRunner  # noqa: E402

PROGRAM = [sys.executable, str(Path(__file__).with_name("bad_program.py"))]


def test_crash_hang_silence_and_bad_rewards_are_counted(tiny, tmp_path):
    with ExternalRunner(tiny, PROGRAM, concurrency=7, episode_timeout=20, env={"OUT_DIR": str(tmp_path)}) as runner:
        batch = asyncio.run(runner.batch(7))
        notes = {int(p.stem): p.read_text().splitlines() for p in tmp_path.glob("*.txt")}
        with pytest.raises(RuntimeError, match="rollout .* is finished"):  # the episode is over
            report(1.0, url=notes[0][1], key=runner.key)
        again = asyncio.run(runner.batch(1))  # the runner keeps going
    c = batch.counts
    assert (c["crashed"], c["timed_out"], c["no_reward"], c["episodes"]) == (1, 1, 1, 4), c
    assert "exited with 3: boom: the program failed" in batch.last_error or "timeout" in batch.last_error
    assert sorted(notes) == [0, 3, 4, 5, 6]
    assert "(404)" in notes[5][2] and "is unknown" in notes[5][2]
    assert "(401)" in notes[6][2] and "API key" in notes[6][2]
    assert "(409)" in notes[4][2] and "already reported 4.0" in notes[4][2]
    assert sorted(t.total_reward for t in batch.trajectories) == [0.0, 4.0, 5.0, 6.0]
    assert {t.group_id for t in batch.trajectories} == {0}  # one task: one group
    assert again.counts["episodes"] == 1 and again.trajectories[0].episode_id == 0


def test_an_episode_older_than_the_lag_is_dropped(tiny, tmp_path):
    env = {"OUT_DIR": str(tmp_path), "MODE": "slow", "SLEEP": "3"}
    with ExternalRunner(tiny, PROGRAM, concurrency=2, episode_timeout=60, env=env) as runner:
        def bump():  # the learner moves on while the episodes run
            while not list(tmp_path.glob("*")) and not runner.recorder.counts.get("turns"):
                threading.Event().wait(0.05)
            runner.sync(None, 1)

        t = threading.Thread(target=bump)
        t.start()
        stale = asyncio.run(runner.batch(2))
        t.join()
        fresh = asyncio.run(runner.batch(1))
    assert stale.counts["stale"] == 2 and not stale.trajectories
    assert fresh.counts["episodes"] == 1 and fresh.trajectories[0].policy_version == 1


def test_cli_refuses_bad_external_flags(capsys):
    assert main(["train", "--task", "external"]) == 2
    assert "--task external needs --command" in capsys.readouterr().err
    assert main(["train", "--task", "external", "--command", "true", "--concurrency", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--concurrency=0 must be >= 1" in err[0]


def test_requests_must_name_a_live_rollout(tiny):
    import openai

    msgs = [{"role": "user", "content": "hi"}]
    with ExternalRunner(tiny, ["true"]) as runner:
        def ask(path, key=runner.key, **kw):
            client = openai.OpenAI(base_url=f"{runner.root}{path}", api_key=key, max_retries=0)
            return client.chat.completions.create(model="policy", messages=msgs, max_tokens=2, **kw)

        runner.recorder.start("live")
        assert ask("/rollout/live/v1").choices[0].message.content is not None
        with pytest.raises(openai.BadRequestError, match="n must be 1"):
            ask("/rollout/live/v1", n=2)
        with pytest.raises(openai.BadRequestError, match="must name its rollout"):
            ask("/v1")
        with pytest.raises(openai.NotFoundError, match="'nope' is unknown"):
            ask("/rollout/nope/v1")
        with pytest.raises(openai.NotFoundError, match="rollout paths are"):
            ask("/rollout/bad%20id/v1")
        with pytest.raises(openai.AuthenticationError, match="API key"):
            ask("/rollout/live/v1", key="guess")
        runner.recorder.finish("live")
        with pytest.raises(openai.ConflictError, match="'live' is finished"):
            ask("/rollout/live/v1")
        assert runner.recorder.counts["turns"] == 1


@pytest.mark.parametrize("lag", [0, 1])
def test_a_lag_of_one_generates_the_next_batch_during_the_update(tiny_path, tmp_path, monkeypatch, lag):
    """With --max-policy-lag 1 the second batch starts on version 0 and the weights change under it (its
    episodes outlast the update), so the learner trains on it one version behind; with 0 it is on-policy."""
    for k, v in {"OUT_DIR": str(tmp_path), "MODE": "slow", "SLEEP": "3"}.items():
        monkeypatch.setenv(k, v)
    run = tmp_path / "run"
    assert main(["train", "--task", "external", "--backbone", "tiny", "--command", " ".join(PROGRAM),
                 "--episodes", "2", "--concurrency", "2", "--updates", "2", "--max-policy-lag", str(lag),
                 "--run-dir", str(run), "--no-progress"]) == 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["external/episodes"] for r in rows] == [2, 2] and rows[1]["external/stale"] == 0
    assert [r["lm/staleness_max"] for r in rows] == [0, lag]
