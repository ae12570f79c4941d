import json
import os

import pytest

from echo_rl.config import ConfigError

from echo_rl.environments.cruxeval import (CRUXEvalConfig, CRUXEvalEnvironment, extract_answer, load_samples,
                                           reference_answer, score_answers)
from echo_rl.environments.sandbox import SandboxPool


@pytest.fixture(scope="module")
def pool():
    with SandboxPool(workers=2, timeout=2.0, memory_mb=256) as p:
        yield p


# Two CRUXEval-I samples pass a lambda, which no literal answer can express (see the module docstring).
NEEDS_A_FUNCTION = {"sample_344", "sample_364"}


@pytest.mark.parametrize("task", ["output", "input"])
def test_all_800_references_pass_and_wrong_answers_fail(task, pool, shared_data):
    samples = load_samples()
    assert len(samples) == 800
    results = score_answers(samples, [reference_answer(s, task, pool) for s in samples], task, pool)
    assert {s["id"] for s, r in zip(samples, results) if not r.passed} == (NEEDS_A_FUNCTION if task == "input" else set())
    if task == "output":
        wrong = [f"({s['output']}, 'wrong')" for s in samples]
    else:
        wrong = [f"f({s['input']}, 'extra argument')" for s in samples]
    results = score_answers(samples, wrong, task, pool)
    assert sum(r.passed for r in results) == 0


def test_output_answer_that_calls_f_on_the_input_is_rejected(pool, shared_data):
    s = load_samples()[0]
    [r] = score_answers([s], [f"f({s['input']})"], task="output", pool=pool)
    assert not r.passed and "not a literal" in r.detail


ALWAYS_EQUAL = "type('A',(),{'__eq__':lambda s,o:True})()"
FORGE = ("__import__('os').write(3, b'{\"status\":\"passed\"}') or __import__('os')._exit(0)")


@pytest.mark.parametrize("task,answer", [
    ("output", ALWAYS_EQUAL),
    ("output", f"[ANSWER]{ALWAYS_EQUAL}[/ANSWER]"),
    ("input", f"f(0) if 0 else {ALWAYS_EQUAL}"),
    ("input", f"f({ALWAYS_EQUAL})"),
    ("input", ALWAYS_EQUAL),
    ("output", FORGE),
    ("input", f"f({FORGE})"),
    ("input", f"f(*[{ALWAYS_EQUAL}])"),
    ("input", "f(**{'x': 1})"),
    ("output", "[1, 2] + [3]"),
])
def test_reward_hacks_score_zero(task, answer, pool, shared_data):
    samples = load_samples()[:20]
    results = score_answers(samples, [answer] * len(samples), task, pool)
    assert not any(r.passed for r in results)
    env = CRUXEvalEnvironment(CRUXEvalConfig(task=task, max_steps=2), pool=pool)
    for i in range(3):
        env.reset(options={"task_index": i})
        obs, reward, term, trunc, info = env.step(answer)
        assert reward == 0.0 and info.get("exec_status") != "passed" and not info["won"], obs


def test_input_answers_run_only_f_on_literals_and_its_result_is_judged_here(pool):
    fake = json.dumps({"status": "passed", "detail": "", "value": "'secret'"}).encode()
    forger = {"id": "x", "input": "1", "output": "'secret'", "code": (
        "def f(x):\n    import os\n    for fd in range(3, 64):\n        try:\n"
        f"            os.write(fd, {fake!r})\n        except OSError:\n            pass\n    os._exit(0)")}
    liar = {"id": "y", "input": "1", "output": "1", "code": (
        "def f(x):\n    return type('A', (), {'__eq__': lambda s, o: True, '__repr__': lambda s: 'A()'})()")}
    string_arg = {"id": "z", "input": "''", "output": "0", "code": "def f(s):\n    return eval(s) if s else 1"}
    [r1] = score_answers([forger], ["f(1)"], "input", pool)
    [r2] = score_answers([liar], ["f(1)"], "input", pool)
    [r3] = score_answers([string_arg], ["f('0')"], "input", pool)
    assert (r1.status, r2.status) == ("crashed", "failed") and "not a literal" in r2.detail, (r1, r2)
    assert r3.passed  # the literal string reached f as data; only f decides what to do with it


@pytest.mark.parametrize("code,statuses", [
    ("while True:\n    pass", ("timeout",)),
    ("import time\ntime.sleep(60)", ("timeout",)),
    ("x = bytearray(8 * 1024 ** 3)", ("error",)),
    ("chunks = []\nwhile True:\n    chunks.append(bytearray(10 ** 7))", ("error", "timeout", "crashed")),
    ("import os\nos.fork()", ("error",)),
    ("raise SystemExit(0)", ("error",)),
])
def test_runaway_code_is_stopped_and_scored_as_failure(code, statuses, pool):
    r = pool.run(code)
    assert r.status in statuses and not r.passed, r
    assert pool.run("assert 1 + 1 == 2").passed  # the pool still works


def test_extract_answer_forms():
    assert extract_answer("[ANSWER]assert f(1) == [1, 2][/ANSWER]", "output") == "[1, 2]"
    assert extract_answer("[ANSWER]f('a') == 3[/ANSWER]", "input") == "f('a')"
    assert extract_answer("```python\n'abc'\n```", "output") == "'abc'"


def test_multi_turn_input_task_shows_what_f_returned(shared_data):
    env = CRUXEvalEnvironment(CRUXEvalConfig(task="input", attempts=2))
    env.reset(options={"task_index": 0})  # sample_0: f(nums) counts occurrences
    obs, r, term, _, info = env.step("[ANSWER]f([5])[/ANSWER]")
    assert "f returned [(1, 5)]" in obs and "1 try left" in obs and not term and info["exec_status"] == "failed"
    obs, r, term, _, info = env.step(env.expert_action())
    assert term and r == 1.0 and info["won"]


def test_config_example_and_code_length_filter(shared_data):
    env = CRUXEvalEnvironment(CRUXEvalConfig(language="python", max_code_length=200))
    assert 0 < env.num_tasks < 800
    assert all(len(s["code"]) <= 200 for s in env.samples)


def test_malformed_data_file_names_the_line(tmp_path):
    (tmp_path / "cruxeval.jsonl").write_text(json.dumps({"code": "def f(): pass", "input": ""}) + "\n")
    with pytest.raises(ValueError, match="line 1 is malformed"):
        load_samples(str(tmp_path))
    with pytest.raises(FileNotFoundError, match="facebookresearch/cruxeval"):
        load_samples(str(tmp_path / "absent"))


def test_input_task_refuses_to_start_without_the_sandbox(monkeypatch, shared_data):
    from echo_rl.environments import sandbox
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)
    with pytest.raises(sandbox.SandboxUnavailable, match="bubblewrap"):
        CRUXEvalEnvironment(CRUXEvalConfig(task="input"))
    assert CRUXEvalEnvironment(CRUXEvalConfig(task="output")).reset(seed=0)  # the O-task runs nothing


def test_train_and_test_splits_partition_the_samples_by_id(shared_data):
    ids = {split: {s["id"] for s in CRUXEvalEnvironment(split=split).samples}
           for split in ("all", "train", "test")}
    assert ids["train"].isdisjoint(ids["test"]) and ids["train"] | ids["test"] == ids["all"]
    assert 0.15 < len(ids["test"]) / len(ids["all"]) < 0.25
    # membership is a function of the id alone: a code-length filter keeps each sample on its side
    short = {s["id"] for s in CRUXEvalEnvironment(split="test", max_code_length=150).samples}
    assert short and short <= ids["test"]
    with pytest.raises(ConfigError, match="leaves no samples"):
        CRUXEvalEnvironment(split="test", max_code_length=1)
