"""A tiny in-memory tool-use task for tests: the whole task is this env plus its spec (``SPEC``).

A few files hold words; one holds the secret number. The agent calls the
``bash`` tool (only ``ls`` and ``cat FILE`` are understood) and ends with the
``submit`` tool. The env's ``step`` gets the harness's action text: a canonical
``<bash>...</bash>`` call, or a reply with no valid call, which it answers with
the :class:`ToolCallError` message as a ``warning`` (the same parser the
harness used, so such a reply never runs).
"""

from dataclasses import dataclass

from echo_rl.config import ConfigBase, spec
from echo_rl.environments.base import StepOutcome, TextEnvironment, env_output, warning
from echo_rl.environments.registry import TaskSpec
from echo_rl.environments.reply_format import tool_format
from echo_rl.environments.tool_calls import TERMINAL_TOOLS, ToolCall, ToolCallError, parse_text, render_text

WORDS = ("apple", "river", "stone", "cloud", "ember", "maple")


@dataclass
class NotesConfig(ConfigBase):
    files: int = spec(3, help="files in the directory", min=2)
    max_steps: int = spec(6, help="tool calls per episode", min=1)


class NotesEnv(TextEnvironment):
    has_expert = True

    def __init__(self, config=None, **kw):
        super().__init__(config or NotesConfig(**kw))

    def _num_tasks(self):
        return 1000

    def _reset_task(self, index, options):
        n = self.config.files
        self.names = [f"{WORDS[(index + i) % len(WORDS)]}.txt" for i in range(n)]
        self.secret_file, self.secret = self.names[index % n], str(100 + index % 900)
        self.seen = set()
        return env_output("Find the secret number in one of the files of the current directory and submit it.")

    def _step(self, action):
        try:
            call = parse_text(action, TERMINAL_TOOLS)
        except ToolCallError as exc:
            return StepOutcome(warning(str(exc)))
        if call.name == "submit":
            won = call.arguments["answer"].strip() == self.secret
            return StepOutcome(env_output("Correct." if won else "Wrong answer."), float(won), True, won)
        words = call.arguments["command"].split()
        if words == ["ls"]:
            self.seen.add("ls")
            return StepOutcome(env_output("  ".join(self.names) + "\n"))
        if len(words) == 2 and words[0] == "cat":
            if words[1] not in self.names:
                return StepOutcome(env_output(f"cat: {words[1]}: No such file or directory\n"))
            self.seen.add(words[1])
            body = f"the secret is {self.secret}" if words[1] == self.secret_file else "nothing here"
            return StepOutcome(env_output(body + "\n"))
        return StepOutcome(env_output(f"bash: {words[0] if words else ''}: command not found\n"))

    def expert_action(self):
        if "ls" not in self.seen:
            call = ToolCall("bash", {"command": "ls"})
        elif self.secret_file not in self.seen:
            call = ToolCall("bash", {"command": f"cat {self.secret_file}"})
        else:
            call = ToolCall("submit", {"answer": self.secret})
        return render_text(call)


FORMAT = tool_format("Find what the task asks for with shell commands, then submit it.", TERMINAL_TOOLS,
                     example="Find the secret number in one of the files of the current directory and submit it.",
                     answer="<bash>ls</bash>", max_tokens=32)
SPEC = TaskSpec("notes", NotesEnv, reply_format=FORMAT, description="test: find a number with ls/cat, submit it")
