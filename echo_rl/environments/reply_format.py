"""What a text task wants from a prompting agent's reply: :class:`TaskFormat`, one field of the task's ``TaskSpec``.

A small instruct model given only the environment's text tends to chat, or to
copy the task back (CRUXEval's function, ARC's grids), instead of answering.
A task's format therefore holds the answer format written as one instruction,
a worked one-shot example in the environment's own wording (an exchange of chat
turns, so the model sees a reply of exactly that shape; not taken from the
evaluation data), the stop strings that end a reply and a token budget. ReAct,
Act-only and ToT all read the same format (``echo_rl.prompting.prompts.task_format``).

A task registers its format with its other metadata:
``register_text_env(name, factory, reply_format=TaskFormat(...))``, or a
function ``env -> TaskFormat`` where the format depends on the env's settings
(CRUXEval's input vs output prediction; called with ``None`` before an env
exists). A task that registers none gets :data:`GENERIC`. This module imports
nothing heavy: every task module imports it while the registry loads.
"""

from __future__ import annotations

from dataclasses import dataclass

from echo_rl.config import ConfigError


@dataclass(frozen=True)
class TaskFormat:
    instruction: str  # the answer format, one plain instruction (joins the system prompt)
    example: str  # a one-shot task in the environment's wording ("" when the task has its own few-shot)
    answer: str  # the reply the example wants
    thought: str = ""  # ReAct's example thought before the answer ("" : none)
    more: tuple[tuple[str, str], ...] = ()  # multi-step tasks: the example's later (observation, action) turns
    multiline: bool = False  # replies may span lines (ARC grids)
    stop: tuple[str, ...] = ("\n",)
    max_tokens: int = 48

    def __post_init__(self) -> None:
        for name in ("instruction", "example", "answer", "thought"):
            if not isinstance(getattr(self, name), str):
                raise ConfigError(f"TaskFormat.{name} is invalid: must be a string, got "
                                  f"{type(getattr(self, name)).__name__}")
        if not self.instruction.strip():
            raise ConfigError("TaskFormat.instruction is invalid: must say how to reply (a non-empty string)")
        if self.example and not self.answer:
            raise ConfigError("TaskFormat.answer is invalid: the one-shot example needs the reply it wants")
        if isinstance(self.stop, str) or not all(isinstance(s, str) and s for s in self.stop):
            raise ConfigError(f"TaskFormat.stop={self.stop!r} is invalid: must be a sequence of non-empty strings")
        if not all(isinstance(t, (tuple, list)) and len(t) == 2 and all(isinstance(s, str) for s in t)
                   for t in self.more):
            raise ConfigError("TaskFormat.more is invalid: must be (observation, action) string pairs")
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ConfigError(f"TaskFormat.max_tokens={self.max_tokens!r} is invalid: must be an integer >= 1")
        object.__setattr__(self, "stop", tuple(self.stop))  # hashable and immutable, like the rest
        object.__setattr__(self, "more", tuple(tuple(t) for t in self.more))

    def example_turns(self, mode: str) -> list[dict[str, str]]:
        """The one-shot example as chat turns; ReAct's has its thought (answered ``OK.``) before the answer."""
        if not self.example:
            return []
        turns = [{"role": "user", "content": self.example}]
        if mode == "react" and self.thought:
            turns += [{"role": "assistant", "content": f"think: {self.thought}"}, {"role": "user", "content": "OK."}]
        turns.append({"role": "assistant", "content": self.answer})
        for obs, action in self.more:
            turns += [{"role": "user", "content": obs}, {"role": "assistant", "content": action}]
        return turns

    def example_text(self) -> str:
        """The example as plain text, for prompts that are not a chat of turns (ToT's propose/value prompts)."""
        if not self.example:
            return ""
        steps = "".join(f"\n{obs}\n> {action}" for obs, action in self.more)
        return f"Example task:\n{self.example}\nExample answer:\n{self.answer}{steps}"


#: the format of a task that registers none: no example, the env's own wording decides
GENERIC = TaskFormat(instruction="Reply with the next action only, written exactly as the environment expects it.",
                     example="", answer="", max_tokens=96)

#: :data:`GENERIC` for a task whose answers span lines (``TaskSpec.multiline``): a reply ends at an empty line
GENERIC_MULTILINE = TaskFormat(instruction=GENERIC.instruction, example="", answer="", multiline=True,
                               stop=("\n\n",), max_tokens=GENERIC.max_tokens)
