"""What each task wants from an agent's reply, said plainly, with a one-shot example — the same for every method.

A small instruct model given only the environment's text tends to chat, or to
copy the task back (CRUXEval's function, ARC's grids), instead of answering.
Each :class:`TaskFormat` therefore holds the answer format written as one
instruction, a worked one-shot example in the environment's own wording (an
exchange of chat turns, so the model sees a reply of exactly that shape; not
taken from the evaluation data), the stop strings that end a reply and a
token budget. ReAct, Act-only and ToT all read the same :class:`TaskFormat`.

:func:`extract_reply` is lenient about *wrapping* — ``[ANSWER]...[/ANSWER]``,
a fenced code block, ``Answer:`` / ``Action:`` / ``>`` prefixes, backticks
around a one-line answer — and never about content: what remains is passed to
the environment verbatim (CRUXEval still parses it with ``ast.literal_eval``
and never runs it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any


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

_ARC = TaskFormat(
    instruction=("Reply with the test output grid only: one row per line, the digits separated by spaces, "
                 "then an empty line. No words."),
    example=("ARC task example. Find the rule that maps each input grid to its output grid, then write the "
             "output grid for the test input (one row per line, digits 0-9; 2 tries per test input).\n\n"
             "Example 1 input:\n1 0\n0 0\nExample 1 output:\n1 1\n1 1\n\nExample 2 input:\n0 0\n0 3\n"
             "Example 2 output:\n3 3\n3 3\n\nTest input:\n0 5\n0 0\nTest output:\n"),
    answer="5 5\n5 5",
    thought="the output fills the whole grid with the one non-zero colour of the input.",
    multiline=True, stop=("\n\n",), max_tokens=640)

_MINIGRID = TaskFormat(
    instruction="Reply with exactly one action from the list after 'Actions:', written as listed, and nothing else.",
    example=("Mission: get to the green goal square\nYou face east. You see a green goal 1 step forward.\n"
             "In front of you: goal. You carry nothing.\n"
             "Actions: turn left, turn right, move forward, pick up, drop, toggle, done."),
    answer="move forward",
    thought="the goal is right in front of me, so I move forward onto it.",
    max_tokens=16)

_WEBSHOP = TaskFormat(
    instruction=("Reply with exactly one action and nothing else: search[your query] on a search page, or "
                 "click[a button or option exactly as shown between [SEP] marks]."),
    example=("WebShop [SEP] Instruction: [SEP] Find me a blue cotton t-shirt in size large, and price lower "
             "than 30.00 dollars [SEP] Search"),
    answer="search[blue cotton t-shirt large]",
    thought="I should search for the product with its main attributes.",
    more=(("Instruction: [SEP] Find me a blue cotton t-shirt in size large, and price lower than 30.00 dollars "
           "[SEP] Back to Search [SEP] Page 1 (Total results: 2) [SEP] Next > [SEP] B0EXAMPLE1 [SEP] Cotton "
           "Crew T-Shirt Blue [SEP] $18.50 [SEP] B0EXAMPLE2 [SEP] Wool Sweater Grey [SEP] $45.00",
           "click[B0EXAMPLE1]"),
          ("Instruction: [SEP] Find me a blue cotton t-shirt in size large, and price lower than 30.00 dollars "
           "[SEP] Back to Search [SEP] < Prev [SEP] size [SEP] medium [SEP] large [SEP] Cotton Crew T-Shirt Blue "
           "[SEP] Price: $18.50 [SEP] Rating: N.A. [SEP] Description [SEP] Features [SEP] Reviews [SEP] Buy Now",
           "click[large]"),
          ("Instruction: [SEP] Find me a blue cotton t-shirt in size large, and price lower than 30.00 dollars "
           "[SEP] Back to Search [SEP] < Prev [SEP] size [SEP] medium [SEP] large [SEP] Cotton Crew T-Shirt Blue "
           "[SEP] Price: $18.50 [SEP] Rating: N.A. [SEP] Description [SEP] Features [SEP] Reviews [SEP] Buy Now",
           "click[Buy Now]")),
    max_tokens=48)

_ALFWORLD = TaskFormat(  # the ReAct paper's two few-shot games stand in for the one-shot example
    instruction="Reply with one action written as in the examples (e.g. 'go to cabinet 1'), and nothing else.",
    example="", answer="", max_tokens=48)

_GENERIC = TaskFormat(instruction="Reply with the next action only, written exactly as the environment expects it.",
                      example="", answer="", max_tokens=96)


def task_format(task: str | None, env: Any = None) -> TaskFormat:
    """The reply format of ``task`` (CRUXEval's depends on the env's ``task``: input or output prediction)."""
    if task == "cruxeval":
        variant = getattr(getattr(env, "config", None), "task", "output")
        return _CRUX_I if variant == "input" else _CRUX_O
    if task is not None and task.startswith("minigrid"):
        return _MINIGRID
    return {"arc": _ARC, "webshop": _WEBSHOP, "alfworld": _ALFWORLD}.get(task or "", _GENERIC)


_TAGGED = re.compile(r"\[ANSWER\](.*?)(?:\[/ANSWER\]|$)", re.S)
_FENCE = re.compile(r"```[a-zA-Z]*[ \t]*\n?(.*?)(?:```|$)", re.S)
_PREFIX = re.compile(r"^\s*(?:>\s*|\d+[.)]\s+|[-*]\s+|(?:final\s+)?answer\s*:\s*|action\s*:\s*|output\s*:\s*)", re.I)
_THINK = re.compile(r"^\s*(?:think|thought)\s*:", re.I)


def is_thought(text: str) -> bool:
    """A ReAct thought: starts ``think:`` and carries no tagged answer."""
    return bool(_THINK.match(text)) and "[ANSWER]" not in text


def extract_reply(text: str, multiline: bool) -> str:
    """The answer (or action) a reply holds, its wrapping removed; the content itself is untouched."""
    text = text.strip()
    if is_thought(text):
        return text.splitlines()[0].strip() if not multiline else text
    tagged = _TAGGED.search(text)
    if tagged:
        text = tagged.group(1).strip()
    elif "```" in text:
        fence = _FENCE.search(text)
        if fence:
            text = fence.group(1).strip()
    if not multiline:
        text = next((ln for ln in (_PREFIX.sub("", ln).strip() for ln in text.splitlines()) if ln), "")
    else:
        text = _PREFIX.sub("", text, count=1).strip()
    if len(text) >= 2 and text[0] == text[-1] == "`" and "\n" not in text:
        text = text.strip("`").strip()
    return text
