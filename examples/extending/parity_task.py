"""A new text task in one file, registered from this file (docs/architecture.md, "Extending EchoRL").

``parity``: the observation names a number; answering ``even`` or ``odd`` correctly wins (reward 1).
Training episodes draw numbers below 1000 and held-out evaluation numbers from 1000 up: the task's
split, declared once in its registry entry, as is the reply format the prompting agents (ReAct, Act-only,
ToT) ask for: one instruction, a one-shot example, stop strings and a token budget.
``echo-rl --plugin parity_task eval --task parity ...`` (with this folder on ``PYTHONPATH``) imports this
module, so ``parity`` is a task everywhere.
"""

from dataclasses import dataclass

from echo_rl.config import ConfigBase, spec
from echo_rl.environments.base import StepOutcome, TextEnvironment, env_output
from echo_rl.environments.registry import register_text_env
from echo_rl.environments.reply_format import TaskFormat


@dataclass
class ParityConfig(ConfigBase):
    max_steps: int = spec(2, help="answers per episode", min=1)
    split: str = spec("train", help="train: numbers 0-999, test: 1000-1999", choices=("train", "test"))


class ParityEnvironment(TextEnvironment):
    has_expert = True

    def _num_tasks(self) -> int:
        return 1000

    def _reset_task(self, index: int, options: dict):
        self.number = index + (1000 if self.config.split == "test" else 0)
        return env_output(f"Is {self.number} even or odd?")

    def _step(self, action: str) -> StepOutcome:
        if action.strip().lower() == self.expert_action():
            return StepOutcome(env_output("Correct."), reward=1.0, terminated=True, won=True)
        return StepOutcome(env_output(f"No. Is {self.number} even or odd?"))  # the world-model target

    def _admissible_actions(self) -> list[str]:
        return ["even", "odd"]

    def expert_action(self) -> str:
        return "odd" if self.number % 2 else "even"


PARITY_REPLY = TaskFormat(instruction="Reply with one word, even or odd, and nothing else.",
                          example="Is 7 even or odd?", answer="odd", thought="7 = 2 * 3 + 1, so it is odd.",
                          stop=("\n",), max_tokens=4)

register_text_env("parity", lambda **kw: ParityEnvironment(ParityConfig(**kw)),
                  train_config={"split": "train"}, eval_config={"split": "test"}, reply_format=PARITY_REPLY,
                  description="say whether a number is even or odd", data="none: generated")
