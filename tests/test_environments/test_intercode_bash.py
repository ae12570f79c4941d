"""InterCode-Bash as terminal tasks: upstream's reward parts, and real episodes over file systems 1, 2 and 4."""

import json

import pytest

from echo_rl.config import ConfigError
from echo_rl.environments.sandbox import SandboxUnavailable
from echo_rl.environments.terminal.intercode import (InterCodeBashEnvironment, changes, intercode_reward,
                                                     tfidf_similarity)


def test_tfidf_matches_scikit_learns_defaults():
    # TfidfVectorizer().fit_transform(["hello world", "hello there"]): cosine 1 / (1 + (ln 1.5 + 1)^2)
    assert tfidf_similarity("hello world", "hello there") == pytest.approx(0.336097, abs=1e-6)
    assert tfidf_similarity("Hello World", "hello world") == pytest.approx(1.0)
    assert tfidf_similarity("", "") == 1.0 and tfidf_similarity("a", "b") == 0.0  # no tokens: equality
    assert tfidf_similarity("", "some output") == 0.0


def test_changes_are_listed_like_git_status():
    before = {"testbed": ("d", ""), "testbed/a.txt": ("f", "1"), "testbed/b.txt": ("f", "2")}
    after = {"testbed": ("d", ""), "testbed/a.txt": ("f", "9"), "testbed/new": ("d", ""),
             "testbed/new/x": ("f", "3"), "testbed/new/y": ("f", "4"), "testbed/c.txt": ("f", "5"),
             "empty": ("d", "")}
    assert changes(before, after) == {("testbed/a.txt", "M"), ("testbed/b.txt", "D"), ("testbed/new/", "??"),
                                      ("testbed/c.txt", "??")}  # untracked folder once; empty folders unseen


def test_reward_parts_follow_upstream():
    before = {"t": ("d", ""), "t/a": ("f", "1")}
    gold = {**before, "t/out": ("f", "ok")}
    assert intercode_reward(before, gold, gold, "x 1", "x 1")[0] == 1.0
    reward, parts = intercode_reward(before, {**before, "t/out": ("f", "bad")}, gold, "x 1", "x 1")
    assert (parts["file_diff"], parts["file_changes"], reward) == (0.33, 0.0, 0.67)
    reward, parts = intercode_reward(before, before, gold, "", "x 1")  # nothing done: one change missing
    assert parts["diff_missing"] == [("t/out", "??")] and parts["file_diff"] == 0.05 and reward == 0.39


def test_episodes_score_upstreams_reward(shared_data):
    try:
        env = InterCodeBashEnvironment(file_systems="1,2,4")
        env.reset(options={"task_index": 0})
    except (FileNotFoundError, ConfigError) as exc:
        pytest.skip(str(exc))
    except SandboxUnavailable as exc:
        pytest.skip(str(exc))
    assert env.num_tasks == 140 and not any(t.name.startswith("fs3") for t in env.tasks)
    try:
        # the gold command itself scores 1; a wrong answer does not; the agent starts in / as upstream's does
        assert env.step("<bash>pwd; ls -d /testbed/dir1</bash>")[0] == "/\n/testbed/dir1\n"
        env.reset(options={"task_index": 0})
        assert env.expert_action() == f"<bash>{env.tasks[0].metadata['gold']}</bash>"
        env.step(env.expert_action())
        obs, reward, term, _, info = env.step("<submit></submit>")
        assert term and reward == 1.0 and info["won"]
        env.reset(options={"task_index": 0})
        env.step("<bash>echo wrong</bash>")
        reward, info = env.step("<submit></submit>")[1::3]
        assert reward < 1.0 and json.loads(info["verifier"]["detail"])["answer_similarity"] == 0.0
        # a file-system query of fs_2: deleting the .txt files of /system; the diff is checked
        index = next(i for i, t in enumerate(env.tasks) if t.metadata["gold"] == "yes y | rm -r /system/*.txt")
        env.reset(options={"task_index": index})
        env.step("<bash>rm /system/text1.txt</bash>")  # only one of them
        reward, info = env.step("<submit></submit>")[1::3]
        assert reward < 1.0 and json.loads(info["verifier"]["detail"])["diff_missing"]
        env.reset(options={"task_index": index})
        env.step("<bash>rm /system/*.txt</bash>")
        assert env.step("<submit></submit>")[1] == 1.0
    finally:
        env.close()


def test_file_system_3_is_refused(shared_data):
    with pytest.raises(ConfigError, match="3 is upstream's held-out set"):
        InterCodeBashEnvironment(file_systems="3")
