"""Text of a reply as its tokens arrive: released as soon as it is final, cut at the first stop string.

Decoding is incremental (a window of the last tokens is re-decoded, so a
character split across tokens waits for its last byte and a tokenizer's
context-dependent spacing is kept), and text that could be the beginning of a
stop string is held back until the next tokens show whether it is one: a stop
string split across token boundaries is never sent.
"""

from __future__ import annotations

from typing import Any, Sequence

INCOMPLETE = "\ufffd"  # what a tokenizer decodes half a UTF-8 character to


class StreamText:
    """``push(token)`` each sampled token, ``finish()`` at the end; both return the text now safe to send.

    After a stop string: ``stopped`` is True, ``used`` is the number of tokens
    sampled up to it, ``kept`` the tokens that carry the text sent.
    """

    def __init__(self, tokenizer: Any, stops: Sequence[str] = (), keep: Sequence[str] = ()) -> None:
        self.tokenizer = tokenizer
        self.keep = frozenset(s for s in keep if s)
        self.stops = list(dict.fromkeys([s for s in stops if s] + sorted(self.keep)))
        self.longest = max((len(s) for s in self.stops), default=0)
        self.ids: list[int] = []
        self.text = ""  # decoded so far (final characters only)
        self.sent = 0  # characters of ``text`` released
        self.stopped = False
        self.used: int | None = None
        self._prefix = self._read = 0  # the decode window: ids[_prefix:_read] is the context already in text

    @property
    def kept(self) -> list[int]:
        if not self.stopped:
            return list(self.ids)
        keep = next((k for k in range(len(self.ids) + 1)
                     if len(self.tokenizer.decode(self.ids[:k])) >= self.sent), len(self.ids))
        return self.ids[:keep]

    def push(self, token: int) -> str:
        if self.stopped:
            return ""
        self.ids.append(int(token))
        self._decode(final=False)
        return self._release(final=False)

    def finish(self) -> str:
        """The text still held back (no more tokens are coming)."""
        if self.stopped:
            return ""
        self._decode(final=True)
        return self._release(final=True)

    def _decode(self, final: bool) -> None:
        decode = self.tokenizer.decode
        before = decode(self.ids[self._prefix:self._read])
        after = decode(self.ids[self._prefix:])
        if len(after) > len(before) and (final or not after.endswith(INCOMPLETE)):
            self.text += after[len(before):]
            self._prefix, self._read = self._read, len(self.ids)

    def _release(self, final: bool) -> str:
        start = self.sent
        if self.stops:
            scan = max(0, start - self.longest)  # a stop string ending in new text starts no earlier
            hits = [(i, -len(s), s) for i, s in ((self.text.find(s, scan), s) for s in self.stops) if i >= 0]
            if hits:
                at, _, hit = min(hits)  # the earliest; of two starting there, the longer
                cut = max(at + len(hit) if hit in self.keep else at, start)
                self.stopped, self.used = True, len(self.ids)
                self.sent = cut
                return self.text[start:cut]
        end = len(self.text)
        if not final:
            end -= self._held(self.text[start:])
        self.sent = max(end, start)
        return self.text[start:self.sent]

    def _held(self, pending: str) -> int:
        """Length of the longest tail of ``pending`` that a stop string starts with (it may still complete)."""
        for k in range(min(self.longest - 1, len(pending)), 0, -1):
            tail = pending[-k:]
            if any(s.startswith(tail) for s in self.stops):
                return k
        return 0
