"""Token choice from logits, and the log-prob RL needs for the token chosen.

The log-prob returned is ``log_softmax(logits / T)`` of the chosen token under
the full vocabulary (T = 1 for greedy). It is *not* renormalised after top-k /
top-p truncation, so it equals what a learner's teacher-forced forward at the
same temperature computes (vllm#42259 is the bug this avoids).

Numerical safety: a temperature below :data:`MIN_TEMPERATURE` (vLLM's
sampling epsilon) is greedy, because ``logits / 1e-300`` overflows to inf and
the softmax to NaN; top-p always keeps the most likely token, because a top_p
such as 1e-300 rounds to 0.0 in float32 and would otherwise drop every token.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import torch

MIN_TEMPERATURE = 1e-5  # below it (and above 0) sampling is greedy: logits / T would overflow
SEED_RANGE = (-(2**63), 2**64 - 1)  # what torch.Generator.manual_seed accepts


@dataclass(frozen=True)
class SamplingParams:
    """How one request picks tokens. ``temperature < MIN_TEMPERATURE`` is greedy.

    Validated on construction, so a bad value fails the one request that
    carries it, at submission, instead of a step the whole batch shares.
    """

    max_new_tokens: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None

    def __post_init__(self) -> None:
        for name in ("temperature", "top_p"):  # numpy scalars and ints become floats; strings stay and fail below
            value = getattr(self, name)
            if _is_number(value):
                object.__setattr__(self, name, float(value))
        for name in ("max_new_tokens", "top_k", "seed"):  # numpy integers become ints; floats stay and fail below
            value = getattr(self, name)
            if isinstance(value, numbers.Integral) and not isinstance(value, bool):
                object.__setattr__(self, name, int(value))
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int) \
                or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={self.max_new_tokens!r} is invalid: must be an integer >= 1")
        if not _is_number(self.temperature) or not (0 <= self.temperature < math.inf):
            raise ValueError(f"temperature={self.temperature!r} is invalid: must be a finite number >= 0 "
                             f"(below {MIN_TEMPERATURE}: greedy)")
        if not _is_number(self.top_p) or not (0 < self.top_p <= 1):
            raise ValueError(f"top_p={self.top_p!r} is invalid: must be in (0, 1]")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k={self.top_k!r} is invalid: must be an integer >= 0 (0: off)")
        if not isinstance(self.stop_token_ids, tuple) or \
                any(isinstance(t, bool) or not isinstance(t, int) for t in self.stop_token_ids):
            raise ValueError(f"stop_token_ids={self.stop_token_ids!r} is invalid: must be a tuple of integers")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)
                                      or not SEED_RANGE[0] <= self.seed <= SEED_RANGE[1]):
            raise ValueError(f"seed={self.seed!r} is invalid: must be None or an integer in "
                             f"[-2**63, 2**64 - 1] (what torch.Generator accepts)")

    @property
    def greedy(self) -> bool:
        return self.temperature < MIN_TEMPERATURE


def _is_number(x: object) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def choose_token(logits: torch.Tensor, params: SamplingParams,
                 generator: torch.Generator | None) -> tuple[int, float]:
    """Pick one token from 1-D float32 ``logits``; returns (token, log-prob)."""
    if params.greedy:
        logp = torch.log_softmax(logits, dim=-1)
        tok = int(torch.argmax(logits))
        return tok, float(logp[tok])
    scaled = logits / params.temperature
    logp = torch.log_softmax(scaled, dim=-1)
    filt = scaled
    if params.top_k and params.top_k < filt.shape[-1]:
        kth = torch.topk(filt, params.top_k).values[-1]
        filt = filt.masked_fill(filt < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_l, idx = torch.sort(filt, descending=True)
        cum = torch.softmax(sorted_l, dim=-1).cumsum(-1)
        drop = cum - torch.softmax(sorted_l, dim=-1) >= params.top_p  # keep the token that crosses p
        drop[0] = False  # and always the most likely one (a tiny top_p is 0.0 in float32)
        filt = filt.clone()
        filt[idx[drop]] = float("-inf")
    probs = torch.softmax(filt, dim=-1)
    tok = int(torch.multinomial(probs, 1, generator=generator))
    return tok, float(logp[tok])
