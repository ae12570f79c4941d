"""A user's own task, backbone and baseline, registered from outside echo_rl (the tests' plugin module).

``custom_task``: the observation names a word; saying it wins (reward 1). ``custom_backbone``: a
scripted backbone that reads the word back. ``custom_baseline``: asks the cell's backbone for each
action through the backbone protocol. Imported by the tests directly and by the CLI through
``--plugin echo_custom_plugin`` / ``ECHO_RL_PLUGINS``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from echo_rl.config import ConfigBase, spec
from echo_rl.environments.base import StepOutcome, TextEnvironment, env_output, warning
from echo_rl.environments.registry import register_text_env
from echo_rl.evaluation.methods import CellContext, load_cell_backbone, make_text_env, register_baseline, \
    run_text_episodes
from echo_rl.evaluation.records import CellOutcome
from echo_rl.models import ScriptedBackbone, register_backbone

WORDS = ("apple", "banana", "cherry", "plum")


@dataclass
class WordConfig(ConfigBase):
    max_steps: int = spec(3, help="steps per episode", min=1)
    words: int = spec(len(WORDS), help="how many of the words are tasks", min=1, max=len(WORDS))


class WordEnvironment(TextEnvironment):
    has_expert = True

    def __init__(self, config: WordConfig):
        super().__init__(config)
        self.word = WORDS[0]

    def _num_tasks(self) -> int:
        return self.config.words

    def _reset_task(self, index: int, options: dict):
        self.word = WORDS[index]
        return env_output(f"Say the word: {self.word}")

    def _step(self, action: str) -> StepOutcome:
        if action.strip() == self.word:
            return StepOutcome(env_output("Correct."), reward=1.0, terminated=True, won=True)
        return StepOutcome(warning(f"No, say the word: {self.word}"))

    def _admissible_actions(self):
        return list(WORDS[: self.config.words])

    def expert_action(self) -> str:
        return self.word


def _read_word(messages) -> str:
    found = re.findall(r"say the word: (\w+)", " ".join(m["content"] for m in messages), flags=re.I)
    return found[-1] if found else "?"


async def _ask_backbone(ctx: CellContext) -> CellOutcome:
    env, model = make_text_env(ctx), load_cell_backbone(ctx)

    def act(obs: str, info: dict, rng) -> str:
        return model.chat([{"role": "user", "content": obs}], max_tokens=8).text.strip()

    return CellOutcome(episodes=run_text_episodes(ctx, env, act))


register_text_env("custom_task", lambda **kw: WordEnvironment(WordConfig(**kw)))
register_backbone("custom_backbone", lambda config: ScriptedBackbone(_read_word, name="custom_backbone"))
register_baseline("custom_baseline", _ask_backbone, needs_backbone=True,
                  description="asks the backbone for each action")
