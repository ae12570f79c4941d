"""Observations stay inside the declared observation space, however long a task's text (issue 21, item 4)."""

import json
import re
from dataclasses import dataclass

import pytest

from echo_rl.config import ConfigBase
from echo_rl.environments.base import (ENV_OUTPUT, WARNING, Segment, StepOutcome, TextEnvironment, env_output,
                                       fit_segments, max_steps_spec)
from echo_rl.environments.cruxeval import CRUXEvalConfig, CRUXEvalEnvironment


@dataclass
class _Cfg(ConfigBase):
    max_steps: int = max_steps_spec(3)


class Loud(TextEnvironment):
    """A task whose answers are huge (like an untruncated 5,000,089-character AssertionError)."""

    def _num_tasks(self):
        return 1

    def _reset_task(self, index, options):
        return env_output("start")

    def _step(self, action):
        return StepOutcome([Segment(ENV_OUTPUT, "e" * 4_000_000), Segment(WARNING, "w" * 1_000_089)])


def test_a_huge_observation_is_cut_to_the_space_with_a_marker():
    env = Loud(_Cfg())
    env.reset(seed=0)
    obs, _, _, _, info = env.step("go")
    limit = env.observation_space.max_length
    assert len(obs) == limit and env.observation_space.contains(obs)
    m = re.search(r"\n\[\.\.\. (\d+) characters cut: observations are at most (\d+) characters\]$", obs)
    assert m and int(m.group(2)) == limit
    assert m.start() + int(m.group(1)) == 5_000_089  # kept + cut = the original length
    assert "".join(s.text for s in info["segments"]) == obs
    assert [s.role for s in info["segments"]] == [ENV_OUTPUT]  # the cut fell in the first segment


@pytest.mark.parametrize("limit", [1, 10, 100, 150, 260, 1000])
def test_fit_segments_is_exact_and_keeps_short_text(limit):
    segs = [Segment(ENV_OUTPUT, "a" * 60), Segment(WARNING, "b" * 200)]
    out = fit_segments(segs, limit)
    text = "".join(s.text for s in out)
    if limit >= 260:
        assert out == segs
        return
    assert len(text) == limit
    if limit == 150:  # the cut falls in the second segment: both roles stay, the marker ends the warning
        assert [s.role for s in out] == [ENV_OUTPUT, WARNING] and text.startswith("a" * 60)
        assert text.endswith("characters cut: observations are at most 150 characters]")


def test_cruxeval_feedback_with_a_5mb_assertion_message_fits(tmp_path):
    sample = {"id": "big", "input": "1", "output": "2",
              "code": "def f(x):\n    assert False, 'x' * 5_000_000"}
    (tmp_path / "cruxeval.jsonl").write_text(json.dumps(sample) + "\n")
    env = CRUXEvalEnvironment(CRUXEvalConfig(task="input", attempts=2, data_dir=str(tmp_path)))
    env.reset(options={"task_index": 0})
    obs, reward, term, _, info = env.step("f(1)")
    assert reward == 0.0 and not term and info["exec_status"] == "failed"
    assert env.observation_space.contains(obs) and len(obs) < 1000, len(obs)
