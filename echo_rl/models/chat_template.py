"""Chat templates from disk are untrusted programs: render them with a time, memory and size limit.

A model or run directory's chat template is jinja2 code. transformers renders
it in a jinja sandbox, which stops attribute tricks but not a template whose
nested loops run for hours or whose string doubles until memory runs out; in
``serve`` either would pin a worker thread or take the whole server down.
Here rendering runs in a small pool of separate processes
(``_template_worker.py``: transformers' own renderer, no torch, an
address-space limit): a render that takes longer than ``RENDER_TIMEOUT_S`` is
killed with its process, one that runs out of memory or renders more than
``MAX_RENDER_CHARS`` fails, and each is one :class:`TemplateError` for the
caller's request; the next render gets a fresh process.

The inputs are prepared exactly as ``tokenizer.apply_chat_template(...,
tokenize=False)`` prepares them (the template it would pick, messages with
None values dropped, the tokenizer's special tokens), so the text is the same.
"""

from __future__ import annotations

import atexit
import json
import os
import queue
import re
import select
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Sequence

from echo_rl.config import ConfigError

WORKER_FILE = Path(__file__).with_name("_template_worker.py")
RENDER_TIMEOUT_S = 5.0
START_TIMEOUT_S = 120.0  # importing transformers' renderer on a loaded machine
MAX_RENDER_CHARS = 4_000_000
MEMORY_BYTES = 2 << 30  # address space of a rendering process (its baseline is ~0.3 GiB)
WORKERS = 2


class TemplateError(ConfigError):
    """The chat template raised an error for these messages (the request's input, usually)."""


class TemplateLimitError(TemplateError):
    """The chat template broke a limit (time, memory, size): the template itself is at fault."""


class _Worker:
    def __init__(self) -> None:
        env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "LC_ALL", "HF_HOME")}
        env.update(TRANSFORMERS_VERBOSITY="error", TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1")
        with tempfile.TemporaryFile() as err:
            self.proc = subprocess.Popen([sys.executable, "-I", str(WORKER_FILE), "--memory-bytes",
                                          str(MEMORY_BYTES)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=err, env=env, close_fds=True, start_new_session=True)
            try:
                line = self._read(START_TIMEOUT_S)
                ready = bool(line) and json.loads(line).get("ready") is True
            except (TimeoutError, ValueError):
                ready = False
            if not ready:
                self.kill()
                err.seek(0)
                why = err.read()[-300:].decode(errors="replace").strip().splitlines()
                raise RuntimeError(f"the chat-template renderer ({sys.executable} -I {WORKER_FILE.name}) did not "
                                   f"start: {why[-1] if why else 'no output'}")

    def _read(self, timeout: float) -> bytes:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            if select.select([self.proc.stdout], [], [], left)[0]:
                return self.proc.stdout.readline()

    def render(self, request: dict, timeout: float) -> dict:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(request) + "\n").encode())
        self.proc.stdin.flush()
        line = self._read(timeout)
        if not line:
            raise EOFError
        return json.loads(line)

    def kill(self) -> None:
        try:
            self.proc.kill()
        except ProcessLookupError:
            pass
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass


class TemplatePool:
    """Up to ``workers`` rendering processes, started when first needed; a broken one is replaced lazily."""

    def __init__(self, workers: int = WORKERS) -> None:
        self.workers = workers
        self._idle: queue.Queue[_Worker] = queue.Queue()
        self._started = 0
        self._lock = threading.Lock()

    def _take(self) -> _Worker:
        """An idle process, else a new one while fewer than ``workers`` run, else wait for one (a busy one
        that breaks is not given back, so the wait re-checks whether it may start a replacement)."""
        while True:
            try:
                return self._idle.get_nowait()
            except queue.Empty:
                pass
            with self._lock:
                grow = self._started < self.workers
                if grow:
                    self._started += 1
            if grow:
                break
            try:
                return self._idle.get(timeout=0.05)
            except queue.Empty:
                continue
        try:
            return _Worker()
        except BaseException:
            with self._lock:
                self._started -= 1
            raise

    def render(self, request: dict, timeout: float) -> str:
        worker = self._take()
        broken = True
        try:
            reply = worker.render(request, timeout)
            broken = False
        except TimeoutError:
            raise TemplateLimitError(f"the chat template did not finish rendering within {timeout:g} s "
                                     "(templates from disk run under a time limit)") from None
        except (EOFError, OSError, ValueError):
            raise TemplateLimitError("the chat template's renderer died (out of memory?) while rendering") from None
        finally:
            if broken:
                worker.kill()
                with self._lock:
                    self._started -= 1
            else:
                self._idle.put(worker)
        if "text" in reply:
            return reply["text"]
        cls = TemplateError if reply.get("template_error") else TemplateLimitError
        raise cls(f"the chat template failed: {reply.get('error', 'no reason given')}")

    def close(self) -> None:
        while True:
            try:
                self._idle.get_nowait().kill()
            except queue.Empty:
                return


_POOL = TemplatePool()
atexit.register(_POOL.close)


def apply_chat_template(tokenizer: Any, messages: Sequence[dict], *, add_generation_prompt: bool,
                        chat_template: str | None = None, timeout: float | None = None,
                        tools: Sequence[dict] | None = None) -> str:
    """``tokenizer.apply_chat_template(messages, tokenize=False, ...)``, rendered under the limits above
    (``timeout`` None: ``RENDER_TIMEOUT_S``); ``tools``: OpenAI function schemas, for a template with a tool
    format."""
    from transformers.utils.chat_template_utils import _normalize_chat_messages

    template = tokenizer.get_chat_template(chat_template)
    if not messages:
        raise ConfigError("messages is empty: need at least one message to render a chat template")
    request = {"conversation": _normalize_chat_messages(list(messages)), "chat_template": template,
               "add_generation_prompt": bool(add_generation_prompt),
               "kwargs": {**tokenizer.special_tokens_map, **({"tools": list(tools)} if tools else {})},
               "max_chars": MAX_RENDER_CHARS}
    try:
        json.dumps(request)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"messages cannot be rendered: {exc}") from None
    return _POOL.render(request, RENDER_TIMEOUT_S if timeout is None else timeout)


# What a template knows, read from its source: one reading for serve, LM training and the prompting agents.
_TOOL_ROLE = re.compile(r"""role['"\]]*\s*(?:==|!=)\s*['"]tool['"]|['"]tool['"]\s*(?:==|!=)""")
_TOOLS_VAR = re.compile(r"\btools\b")


def template_has_tool_role(template: str) -> bool:
    """The template treats a ``tool`` message as such (it names the role), rather than printing any role name it
    is given: only then do observations go out as tool results."""
    return bool(_TOOL_ROLE.search(template or ""))


def template_accepts_tools(template: str) -> bool:
    """The template renders a ``tools=[...]`` schema list (a model trained on its own tool-call format)."""
    return bool(_TOOLS_VAR.search(template or ""))
