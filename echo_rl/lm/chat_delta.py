"""Chat templates rendered by deltas: the tokens a new message adds, with a role per token.

A multi-turn trajectory is one append-only token stream. Sampled action
tokens go in exactly as sampled; everything else (observations, the
template's wrappers) is the suffix that rendering the conversation *with* a
new message adds to rendering it *without*. The observation body inside that
suffix is found at the character level (render with empty content vs with the
content) and mapped onto tokens through the tokenizer's offsets, so a token
gets ``env_output`` / ``warning`` when its characters are body text of that
role, and ``template`` otherwise; a token straddling two segments
(``"Nothing happens. "`` + ``"You see"`` → ``" You"``) takes the role of its
last character, the text it completes. This is only sound when the template
keeps earlier turns as a prefix; :func:`check_prefix_preserving` checks that
before any rollout and names the first divergence.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from echo_rl.config import ConfigError
from echo_rl.models.chat_template import apply_chat_template, template_accepts_tools, template_has_tool_role
from echo_rl.types import ENV_OUTPUT, TEMPLATE, WARNING, role_code

Message = dict[str, str]



class TemplatePrefixError(ConfigError):
    """The (tokenizer, chat template) pair rewrites earlier turns, so turns cannot be appended."""


@dataclass(frozen=True)
class Delta:
    """Tokens a message adds, one role per token; ``body_count`` = its observation-body tokens."""

    token_ids: list[int]
    roles: list[int]
    body_count: int


def _segments(segments: Sequence[Any]) -> list[tuple[int, str]]:
    out = []
    for i, seg in enumerate(segments):
        role, text = (seg.role, seg.text) if hasattr(seg, "role") else (seg[0], seg[1])
        code = role_code(role)
        if code not in (ENV_OUTPUT, WARNING):
            raise ValueError(f"segments[{i}].role={role!r} is invalid: allowed: env_output, warning")
        if not isinstance(text, str):
            raise ValueError(f"segments[{i}].text must be a string")
        out.append((code, text))
    return out


def _role_at(spans: list[tuple[int, int, int]], char: int) -> int:
    for s, e, code in spans:
        if s <= char < e:
            return code
    return TEMPLATE


def _first_divergence(a: Sequence[Any], b: Sequence[Any]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class ChatRenderer:
    """A tokenizer's chat template as token deltas.

    ``tokenizer`` is a transformers fast tokenizer (it needs offset mappings);
    ``chat_template`` overrides the tokenizer's own. Encoding matches
    :class:`echo_rl.models.local.LocalBackbone`: render to text, then encode
    without added special tokens.
    """

    def __init__(self, tokenizer: Any, chat_template: str | None = None) -> None:
        if not getattr(tokenizer, "is_fast", False):
            raise ConfigError("the tokenizer must be a fast (Rust) tokenizer: role masks need its offset mappings")
        self.tokenizer = tokenizer
        self.chat_template = chat_template or getattr(tokenizer, "chat_template", None)
        if not self.chat_template:
            raise ConfigError("the tokenizer has no chat template; pass chat_template=")
        self._turn_end: dict[str, list[int]] = {}

    # -- what the template knows ------------------------------------------------
    @property
    def has_tool_role(self) -> bool:
        """The template treats a ``tool`` message as such (it names the role), rather than printing any role
        name it is given: only then do observations go out as tool results."""
        return template_has_tool_role(self.chat_template)

    @property
    def accepts_tools(self) -> bool:
        """The template renders a ``tools=[...]`` schema list (a model trained on its own tool-call format)."""
        return template_accepts_tools(self.chat_template)

    # -- primitives ------------------------------------------------------------
    def render(self, messages: Sequence[Message], add_generation_prompt: bool) -> str:
        if not messages:
            return ""
        # a model or run directory's template: rendered under time/memory/size limits
        return apply_chat_template(self.tokenizer, list(messages), chat_template=self.chat_template,
                                   add_generation_prompt=add_generation_prompt)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _encode_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        enc = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        return list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]

    def _suffix(self, before: str, after: str, what: str) -> tuple[list[int], list[tuple[int, int]], int]:
        """Token ids/offsets of ``after`` beyond ``before``, checking the prefix in text and in tokens."""
        if not after.startswith(before):
            i = _first_divergence(before, after)
            raise TemplatePrefixError(
                f"chat template does not keep earlier turns as a prefix ({what}): rendered text differs at "
                f"character {i}: before {before[max(0, i - 30):i + 30]!r}, after {after[max(0, i - 30):i + 30]!r}")
        before_ids = self.encode(before)
        ids, offsets = self._encode_offsets(after)
        if ids[: len(before_ids)] != before_ids:
            i = _first_divergence(before_ids, ids)
            tok = self.tokenizer.convert_ids_to_tokens
            raise TemplatePrefixError(
                f"tokenizer does not keep earlier turns as a token prefix ({what}): token {i} is "
                f"{tok(before_ids[i:i + 3])} before and {tok(ids[i:i + 3])} after")
        n = len(before_ids)
        return ids[n:], offsets[n:], len(before)

    # -- deltas ----------------------------------------------------------------
    def message_delta(self, history: Sequence[Message], role: str, segments: Sequence[Any], *,
                      add_generation_prompt: bool = True) -> Delta:
        """Tokens that appending a ``role`` message with ``segments`` as content adds after ``history``.

        ``history`` ends with a finished turn (rendered without a generation
        prompt). The next generation prompt is included when asked (role
        template), so the result is ready for the policy to continue.
        """
        segs = _segments(segments)
        content = "".join(t for _, t in segs)
        before = self.render(history, add_generation_prompt=False)
        full = self.render([*history, {"role": role, "content": content}], add_generation_prompt)
        empty = self.render([*history, {"role": role, "content": ""}], add_generation_prompt)
        ids, offsets, _ = self._suffix(before, full, f"adding a {role!r} message")
        start, shift = self._content_start(empty, full, content)
        # char spans of the segments in `full` coordinates (shift accounts for a template's trim)
        spans, pos = [], start - shift
        for code, text in segs:
            spans.append((max(pos, start), min(pos + len(text), len(full) - (len(empty) - start)), code))
            pos += len(text)
        roles = []
        for a, b in offsets:  # offsets index `full`, which was encoded whole
            roles.append(_role_at(spans, b - 1) if b > a else TEMPLATE)
            if roles[-1] == TEMPLATE and b > a:
                roles[-1] = _role_at(spans, a)
        body = sum(r in (ENV_OUTPUT, WARNING) for r in roles)
        return Delta(ids, roles, body)

    def _content_start(self, empty: str, full: str, content: str) -> tuple[int, int]:
        """Where the message content sits in ``full``, and how many leading chars the template trimmed."""
        m = len(full) - len(empty)
        if m == 0 and not content.strip():
            return len(empty), 0
        lcp = _first_divergence(empty, full)
        for s in range(min(lcp, len(empty)), -1, -1):
            if full[s + m:] == empty[s:] and full[:s] == empty[:s]:
                rendered = full[s:s + m]
                if rendered == content:
                    return s, 0
                if rendered == content.strip():
                    return s, len(content) - len(content.lstrip())
                break
        raise TemplatePrefixError(
            "chat template rewrites message content (not verbatim or trimmed), so observation tokens cannot be "
            f"located: content {content[:60]!r}")

    def turn_end(self, history: Sequence[Message]) -> list[int]:
        """The template's end-of-turn tokens after an assistant reply (e.g. ``<|im_end|>\\n``)."""
        gen = self.render(history, add_generation_prompt=True)
        done = self.render([*history, {"role": "assistant", "content": ""}], add_generation_prompt=False)
        ids, _, _ = self._suffix(gen, done, "closing an assistant turn")
        return ids

    def generation_prompt(self, history: Sequence[Message]) -> list[int]:
        before = self.render(history, add_generation_prompt=False)
        gen = self.render(history, add_generation_prompt=True)
        ids, _, _ = self._suffix(before, gen, "adding the generation prompt")
        return ids


PROBE = (
    {"role": "system", "content": "You are an agent in a text world."},
    {"role": "user", "content": "You are in a room. You see a key 1."},
    {"role": "assistant", "content": "take key 1"},
    {"role": "user", "content": "Nothing happens."},
    {"role": "assistant", "content": "go to door 1"},
    {"role": "user", "content": "You arrive at door 1. The door is locked."},
)


def check_prefix_preserving(renderer: ChatRenderer, conversation: Sequence[Message] = PROBE,
                            observation_role: str = "user") -> None:
    """Pre-flight: every turn's render is a prefix of the next one's, in text and in tokens.

    Raises :class:`TemplatePrefixError` naming the first divergence, e.g. for a
    template that drops earlier reasoning or re-renders the system prompt.
    """
    conv = [dict(m) for m in conversation]
    for k in range(1, len(conv)):
        prev, msg = conv[:k], conv[k]
        if msg["role"] == "assistant":
            renderer._suffix(renderer.render(prev, True), renderer.render(conv[:k + 1], False),
                             f"adding assistant message {k}")
        else:
            role = observation_role if msg["role"] == "user" else msg["role"]
            renderer.message_delta(prev, role, [("env_output", msg["content"])])
    renderer.turn_end(conv[:2])
