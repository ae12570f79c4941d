"""CRUXEval (Gu et al. 2024) as a text environment: predict a function's output or input.

The 800 real samples (``cruxeval.jsonl``: code, input, output, id). Task
``output`` (CRUXEval-O): given ``f`` and an input, answer the value of
``f(input)``. Task ``input`` (CRUXEval-I): given ``f`` and an output, answer a
call ``f(...)`` (or just its arguments) with that output.

Answers are data, never code: they are parsed with ``ast.literal_eval``
(numbers, strings, bytes, booleans, None, and tuples, lists, dicts and sets of
them); anything else is a warning, not a scored try. An O-answer is compared
with the sample's output literal in this (trusted) process; nothing runs. For
an I-answer only the sample's own ``f`` runs, in the OS-level sandbox
(:mod:`echo_rl.environments.sandbox`), on the parsed literal arguments; the
``repr`` of what it returned is parsed as a literal here and compared here.
The sandbox's own "passed" is never taken as correctness, so an answer cannot
win by forging a report or by an object whose ``__eq__`` always says yes.
Upstream instead executes ``assert f(input) == answer`` with the answer as
code; with literal answers the verdicts agree on all 800 references, except
that two I-tasks (sample_344, sample_364) take a function argument, which no
literal can express: they are unsolvable here.

``attempts=1`` is the benchmark (one answer, reward 1/0). ``attempts=k > 1`` is
the multi-turn variant: a wrong answer is answered with its result (for the
I-task what ``f`` returned, or its exception) and the agent tries again, up to
k times. With ``max_steps=attempts=1`` the episode scores like upstream pass@1.
"""

from __future__ import annotations

import ast
import copy
import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

from echo_rl.config import ConfigBase, ConfigError, spec
from echo_rl.environments import registry
from echo_rl.environments.base import (Segment, StepOutcome, TextEnvironment, data_dir_spec, env_output,
                                       make_config, max_steps_spec, resolve_data_dir, warning)
from echo_rl.environments.reply_format import TaskFormat
from echo_rl.environments.sandbox import ExecResult, SandboxPool, bwrap_command, shared_pool

SPLITS = ("all", "train", "test")
TEST_PERCENT = 20  # share of samples in the test split


def in_split(sample_id: str, split: str) -> bool:
    """Membership by a hash of the sample id: fixed across machines, file orders and filters."""
    if split == "all":
        return True
    bucket = int(hashlib.sha256(sample_id.encode()).hexdigest(), 16) % 100
    return (bucket < TEST_PERCENT) == (split == "test")


HOW_TO_GET = ("get cruxeval.jsonl from https://github.com/facebookresearch/cruxeval (data/cruxeval.jsonl) "
              "into <data_dir>/cruxeval.jsonl")


@dataclass
class CRUXEvalConfig(ConfigBase):
    """CRUXEval task, sample filter and sandbox limits."""

    task: str = spec("output", help="output: predict f(input) (CRUXEval-O); input: predict an input (CRUXEval-I)",
                     choices=("output", "input"))
    language: str = spec("python", help="language of the functions (CRUXEval is Python only)", choices=("python",))
    split: str = spec("all", help="all: the 800 samples (the benchmark); train / test: a fixed 80/20 partition by "
                      "sample id, so an agent trained on CRUXEval is evaluated on functions it never saw",
                      choices=SPLITS)
    max_code_length: int | None = spec(None, help="keep samples whose code has at most this many characters "
                                       "(None: all 800)")
    attempts: int = spec(1, help="answers per episode: 1 is the benchmark; k > 1 the multi-turn variant with "
                         "execution feedback", min=1)
    timeout: float = spec(3.0, help="wall-clock seconds per check (upstream: 3)", gt=0)
    memory_mb: int = spec(512, help="address-space limit of a check, MiB", min=64)
    num_workers: int = spec(2, help="sandbox worker processes (shared by environments with the same limits)", min=1)
    max_steps: int = max_steps_spec(4)
    data_dir: str | None = data_dir_spec()

    def validate(self) -> None:
        if self.max_code_length is not None and self.max_code_length < 1:
            self._fail("max_code_length", self.max_code_length, "must be None or >= 1")


def load_samples(data_dir: str | None = None) -> list[dict]:
    root = resolve_data_dir(data_dir, "cruxeval", "ECHO_RL_CRUXEVAL_DIR", HOW_TO_GET)
    path = root / "cruxeval.jsonl" if root.is_dir() else root
    if not path.is_file():
        raise FileNotFoundError(f"CRUXEval file {path} not found; {HOW_TO_GET}")
    samples = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            s = json.loads(line)
            if not all(isinstance(s[k], str) for k in ("code", "input", "output", "id")):
                raise ValueError("code, input, output and id must be strings")
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"CRUXEval file {path} line {n} is malformed ({exc}); {HOW_TO_GET}") from None
        samples.append(s)
    if not samples:
        raise ValueError(f"CRUXEval file {path} has no samples; {HOW_TO_GET}")
    return samples


def extract_answer(text: str, task: str) -> str:
    """The answer expression: inside [ANSWER]...[/ANSWER] or a code fence if present, cut at ``==``."""
    m = re.search(r"\[ANSWER\](.*?)(?:\[/ANSWER\]|$)", text, re.S)
    if m:
        text = m.group(1)
    m = re.search(r"```(?:python)?\n?(.*?)```", text, re.S)
    if m:
        text = m.group(1)
    text = text.strip()
    if text.startswith("assert "):
        text = text[len("assert "):]
    if "==" in text:
        left, right = text.split("==", 1)
        text = right if task == "output" else left
    return text.strip()


LITERALS = "a Python literal (numbers, strings, bytes, True/False/None, and tuples, lists, dicts, sets of them)"
MAX_FEEDBACK = 300


def _parse(source: str) -> ast.expr:
    try:
        return ast.parse(source, mode="eval").body
    except SyntaxError as exc:
        raise ValueError(f"not a Python expression (SyntaxError: {exc.msg})") from None
    except (ValueError, RecursionError, MemoryError) as exc:
        raise ValueError(f"not a Python expression ({type(exc).__name__})") from None


def _literal(node: ast.AST) -> Any:
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
        raise ValueError(f"not a literal: write {LITERALS}") from None


def parse_literal(text: str) -> Any:
    """The value a literal answer denotes; ValueError saying why it is not one. Never evaluates code."""
    return _literal(_parse(text.strip()))


def parse_arguments(answer: str) -> tuple[tuple, dict]:
    """The literal arguments of an I-answer, ``f(1, 'a', k=[2])`` or ``1, 'a', k=[2]``; ValueError if not that."""
    node = _parse(answer if answer.startswith("f(") else f"f({answer})")
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "f"):
        raise ValueError(f"not a call f(...) whose arguments are each {LITERALS}")
    if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
        raise ValueError(f"*args and **kwargs are not allowed: write each argument as {LITERALS}")
    return tuple(_literal(a) for a in node.args), {k.arg: _literal(k.value) for k in node.keywords}


def call_source(args: tuple, kwargs: dict) -> str:
    """``f(<repr of each argument>)``: parsed literals written back as literal source (repr round-trips them)."""
    parts = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]
    return f"f({', '.join(parts)})"


def answer_problem(answer: str, task: str) -> str:
    """Why an answer is inadmissible (not a literal / not a call with literal arguments), or ""."""
    try:
        parse_literal(answer) if task == "output" else parse_arguments(answer)
    except ValueError as exc:
        return str(exc)
    return ""


def check_code(sample: dict, answer: str, task: str) -> str | None:
    """Upstream's check program ``assert f(x) == y`` for a literal answer (None if not literal).

    Only for timing comparisons with upstream's harness (benchmarks/env_bench.py); scoring never runs it.
    """
    try:
        if task == "output":
            return f"{sample['code']}\nassert f({sample['input']}) == {parse_literal(answer)!r}"
        return f"{sample['code']}\nassert {call_source(*parse_arguments(answer))} == {sample['output']}"
    except (ValueError, RecursionError):
        return None


def _same_as_output(sample: dict, value: Any) -> bool:
    try:
        return bool(value == parse_literal(sample["output"]))
    except (ValueError, TypeError, RecursionError, MemoryError):
        return False


def _judge_run(sample: dict, run: ExecResult) -> ExecResult:
    """Score what f returned (its repr parsed as a literal here), never the sandbox's own status."""
    if run.status != "passed" or run.value is None:
        return ExecResult("error" if run.status == "passed" else run.status, run.detail or "f returned nothing")
    shown = f"f returned {run.value[:MAX_FEEDBACK]}"
    try:
        value = parse_literal(run.value)
    except ValueError:
        return ExecResult("failed", f"{shown}, which is not a literal", run.value)
    return ExecResult("passed" if _same_as_output(sample, value) else "failed", shown, run.value)


def _input_job(sample: dict, answer: str) -> tuple[str, str] | None:
    """(code, result expression) for the sandbox, or None when the answer has no literal arguments."""
    try:
        return sample["code"], call_source(*parse_arguments(answer))
    except (ValueError, RecursionError):
        return None


def check_answer(sample: dict, answer: str, task: str, pool: SandboxPool | None) -> ExecResult:
    """Score one extracted answer: passed / failed, or error with the reason it is inadmissible."""
    return score_extracted([sample], [answer], task, pool)[0]


def score_extracted(samples: list[dict], answers: list[str], task: str,
                    pool: SandboxPool | None) -> list[ExecResult]:
    if task == "output":
        out = []
        for s, a in zip(samples, answers):
            try:
                value = parse_literal(a)
            except ValueError as exc:
                out.append(ExecResult("error", str(exc)))
                continue
            out.append(ExecResult("passed" if _same_as_output(s, value) else "failed"))
        return out
    jobs = [_input_job(s, a) for s, a in zip(samples, answers)]
    runnable = [j for j in jobs if j is not None]
    if runnable and pool is None:
        raise ValueError("the CRUXEval input task runs f in the sandbox: pass a SandboxPool")
    if len(runnable) == 1:  # one answer (an env step): skip the thread pool
        runs = iter([pool.run(runnable[0][0], result=runnable[0][1])])
    else:
        runs = iter(pool.run_many([c for c, _ in runnable], results=[e for _, e in runnable]) if runnable else [])
    return [_judge_run(s, next(runs)) if j is not None else ExecResult("error", answer_problem(a, task))
            for s, a, j in zip(samples, answers, jobs)]


def score_answers(samples: list[dict], answers: list[str], task: str,
                  pool: SandboxPool | None = None) -> list[ExecResult]:
    """Score many raw answers at once (a full pass over the 800 samples; the I-task runs on ``pool``)."""
    return score_extracted(samples, [extract_answer(a, task) for a in answers], task, pool)


def reference_answer(sample: dict, task: str, pool: SandboxPool | None = None) -> str:
    """The dataset's answer; for the I-task with literal arguments where the dataset wrote expressions.

    Ten inputs are expressions (``dict(e=1)``, ``range(100, 120)``): with a ``pool`` they are evaluated
    there (dataset code) and written back as literals (a range as a list). Two pass a lambda and stay.
    """
    if task == "output":
        return sample["output"]
    call = f"f({sample['input']})"
    if pool is None or not answer_problem(call, "input"):
        return call
    as_data = f"tuple(list(a) if isinstance(a, range) else a for a in ({sample['input']},))"
    run = pool.run(sample["code"], result=as_data)
    try:
        args = parse_literal(run.value) if run.passed and run.value else None
    except ValueError:
        args = None
    return call_source(args, {}) if isinstance(args, tuple) else call


class CRUXEvalEnvironment(TextEnvironment):
    """One CRUXEval sample per episode; reward 1.0 when the answer is right (see the module docstring)."""

    supports_snapshot = True
    has_expert = True

    def __init__(self, config: CRUXEvalConfig | None = None, render_mode: str | None = None,
                 pool: SandboxPool | None = None, **overrides: Any):
        config = make_config(CRUXEvalConfig, config, overrides)
        super().__init__(config, render_mode)
        limit = config.max_code_length
        self.samples = [s for s in load_samples(config.data_dir)
                        if (limit is None or len(s["code"]) <= limit) and in_split(s["id"], config.split)]
        if not self.samples:
            raise ConfigError(f"CRUXEval split={config.split!r} with max_code_length={limit} leaves no samples: "
                              "raise max_code_length or use split='all'")
        self._pool = pool
        self._tries = 0
        if config.task == "input" and pool is None:
            bwrap_command()  # refuse now, naming how to install it, when the sandbox cannot exist here

    @property
    def pool(self) -> SandboxPool:
        if self._pool is None:
            c = self.config
            self._pool = shared_pool(c.num_workers, c.timeout, c.memory_mb)
        return self._pool

    @property
    def sample(self) -> dict:
        return self.samples[self._task_index]

    def _num_tasks(self) -> int:
        return len(self.samples)

    def _task_id(self) -> str:
        return self.samples[self._task_index]["id"] if self.samples else ""

    def _reset_task(self, index: int, options: dict) -> list[Segment]:
        self._tries = 0
        s, k = self.sample, self.config.attempts
        tries = f" You have {k} tries; after a wrong one you see its result." if k > 1 else ""
        if self.config.task == "output":
            text = (f"Predict the output of the Python function f on the given input.{tries}\n\n```python\n"
                    f"{s['code']}\n```\n\nassert f({s['input']}) == ??\n\n"
                    f"Answer with the literal value (e.g. [ANSWER]{'[1, 2]'}[/ANSWER]).")
        else:
            text = (f"Find an input such that the Python function f returns the given output.{tries}\n\n```python\n"
                    f"{s['code']}\n```\n\nassert f(??) == {s['output']}\n\n"
                    f"Answer with the call, its arguments written as literals (e.g. [ANSWER]f([1, 2], 'a')[/ANSWER]).")
        return env_output(text)

    def _step(self, action: str) -> StepOutcome:
        task = self.config.task
        answer = extract_answer(action, task)
        if not answer:
            return StepOutcome(warning("Empty answer: write the value (or the call f(...)) to check."))
        why = answer_problem(answer, task)
        if why:
            what = "value" if task == "output" else "call f(...)"
            return StepOutcome(warning(f"Your answer is not a {what} of literals ({why}); try again."))
        result = check_answer(self.sample, answer, task, self.pool if task == "input" else None)
        self._tries += 1
        extra = {"exec_status": result.status}
        if result.passed:
            return StepOutcome(env_output("Correct."), 1.0, True, True, extra)
        left = self.config.attempts - self._tries
        msg = self._feedback(result)
        if left <= 0:
            return StepOutcome(env_output(msg), 0.0, True, False, extra)
        return StepOutcome(env_output(f"{msg} {left} {'try' if left == 1 else 'tries'} left."), 0.0, False,
                           False, extra)

    def _feedback(self, result: ExecResult) -> str:
        if self.config.task == "output":
            return "Incorrect."
        detail = result.detail[:MAX_FEEDBACK]
        if result.status == "failed":
            return f"Incorrect: {detail}, not {self.sample['output'][:MAX_FEEDBACK]}."
        return f"Incorrect: running f gave {detail or result.status}."

    def expert_action(self) -> str:
        """The reference answer (an oracle, for demonstrations and checks)."""
        pool = self.pool if self.config.task == "input" else None
        return reference_answer(self.sample, self.config.task, pool)

    def snapshot(self) -> Any:
        return self._base_state(), self._tries

    def restore(self, snap: Any) -> None:
        base, tries = snap
        self._restore_base(copy.deepcopy(base))
        self._tries = tries


_CRUX_O = TaskFormat(
    instruction=("Reply with the value that f returns, written as a Python literal between [ANSWER] and "
                 "[/ANSWER], on one line. Do not repeat the function or explain."),
    example=("Predict the output of the Python function f on the given input.\n\n```python\ndef f(nums):\n"
             "    return [n * 2 for n in nums if n > 1]\n```\n\nassert f([1, 2, 3]) == ??\n\n"
             "Answer with the literal value (e.g. [ANSWER][1, 2][/ANSWER])."),
    answer="[ANSWER][4, 6][/ANSWER]",
    thought="1 is dropped, 2 and 3 are doubled, so f returns [4, 6].",
    stop=("[/ANSWER]", "\n\n"), max_tokens=96)

_CRUX_I = TaskFormat(
    instruction=("Reply with a call of f whose arguments are Python literals, between [ANSWER] and [/ANSWER], "
                 "on one line, such that it returns the given output. Do not repeat the function or explain."),
    example=("Find an input such that the Python function f returns the given output.\n\n```python\n"
             "def f(text):\n    return text.upper() + '!'\n```\n\nassert f(??) == 'HI!'\n\n"
             "Answer with the call, its arguments written as literals (e.g. [ANSWER]f([1, 2], 'a')[/ANSWER])."),
    answer="[ANSWER]f('hi')[/ANSWER]",
    thought="f upper-cases the text and adds '!', so the text 'hi' gives 'HI!'.",
    stop=("[/ANSWER]", "\n\n"), max_tokens=96)


def _reply_format(env: Any) -> TaskFormat:
    """The reply format of an env's variant: input or output prediction (output before an env exists)."""
    variant = getattr(getattr(env, "config", None), "task", "output")
    return _CRUX_I if variant == "input" else _CRUX_O


registry.register_text_env(
    "cruxeval", lambda **kw: CRUXEvalEnvironment(CRUXEvalConfig(**kw)), train_config={"split": "train"},
    eval_config={"split": "test"}, reply_format=_reply_format,
    description="CRUXEval: predict a function's output or input",
    data="cruxeval.jsonl: echo-rl env-data --download cruxeval (or $ECHO_RL_CRUXEVAL_DIR)")

__all__ = ["CRUXEvalConfig", "CRUXEvalEnvironment", "load_samples", "extract_answer", "parse_literal",
           "parse_arguments", "answer_problem", "check_answer", "check_code", "reference_answer", "score_answers"]
