"""Engine metrics: what the cache saved and what the engine delivered per second.

Definitions (docs/engine.md repeats them):

- **KV reuse rate** = prompt tokens served from the radix cache / prompt tokens
  of finished requests (a soft-prefix row counts as a prompt input).
- **ETPS** (effective tokens per second) = (prompt tokens, reused ones
  included, + generated tokens) of finished requests / wall seconds of the
  window. It counts the work a request *represents*, however little of it was
  computed, so it is comparable with an engine that recomputes everything.
- **Computed tokens/s** = tokens actually run through the model / wall seconds.
- **Queue time** = admission time - arrival time, per request.
- **Shared-prefix waits**: admissions postponed by one or more steps because a
  request being prefilled was computing a long prefix of this one.
- **Memory waits**: admissions postponed because the KV budget had no room for
  the request's working KV (after the cache gave back what it could).
- **Peak KV** (``kv_peak_mb``): the most KV memory the engine held at once in
  the window (cache pool allocation + working buffers), checked after every
  admission and every step; it stays within ``kv_memory_budget_mb``.
- **Batch occupancy** = sequences in a step's forward / max_concurrent_rollouts,
  averaged over steps; **tokens per step** the packed rows per forward.
"""

from __future__ import annotations

import time

import numpy as np


class EngineMetrics:
    """Counters over a window that :meth:`reset` starts."""

    def __init__(self, max_concurrent: int):
        self.max_concurrent = max_concurrent
        self.reset()

    def reset(self) -> None:
        self.window_start = time.perf_counter()
        self.last_finish = None
        self.requests_finished = 0
        self.requests_failed = 0
        self.requests_cancelled = 0
        self.prompt_tokens = 0
        self.reused_tokens = 0
        self.generated_tokens = 0
        self.computed_tokens = 0
        self.steps = 0
        self.step_seconds = 0.0
        self.step_sequences = 0
        self.queue_times: list[float] = []
        self.b_eff_total = 0.0
        self.shared_prefix_waits = 0
        self.memory_waits = 0
        self.kv_peak_bytes = 0

    def record_step(self, sequences: int, tokens: int, seconds: float) -> None:
        self.steps += 1
        self.step_sequences += sequences
        self.computed_tokens += tokens
        self.step_seconds += seconds

    def record_kv(self, nbytes: int) -> None:
        """KV the engine holds now (cache pool allocation + working buffers); keeps the peak."""
        self.kv_peak_bytes = max(self.kv_peak_bytes, int(nbytes))

    def record_admit(self, queue_time: float) -> None:
        self.queue_times.append(queue_time)

    def record_finish(self, prompt_inputs: int, reused: int, generated: int, b_eff: float) -> None:
        self.requests_finished += 1
        self.prompt_tokens += prompt_inputs
        self.reused_tokens += reused
        self.generated_tokens += generated
        self.b_eff_total += b_eff
        self.last_finish = time.perf_counter()

    def snapshot(self) -> dict[str, float]:
        """Flat metrics (ARCHITECTURE §3); rates are over window start -> last finish."""
        end = self.last_finish if self.last_finish is not None else time.perf_counter()
        wall = max(end - self.window_start, 1e-9)
        q = np.asarray(self.queue_times) if self.queue_times else np.zeros(1)
        effective = self.prompt_tokens + self.generated_tokens
        return {
            "requests_finished": float(self.requests_finished),
            "requests_failed": float(self.requests_failed),
            "requests_cancelled": float(self.requests_cancelled),
            "prompt_tokens": float(self.prompt_tokens),
            "reused_tokens": float(self.reused_tokens),
            "generated_tokens": float(self.generated_tokens),
            "computed_tokens": float(self.computed_tokens),
            "kv_reuse_rate": self.reused_tokens / self.prompt_tokens if self.prompt_tokens else 0.0,
            "effective_tokens": float(effective),
            "etps": effective / wall,
            "computed_tokens_per_s": self.computed_tokens / wall,
            "wall_seconds": wall,
            "steps": float(self.steps),
            "step_seconds": self.step_seconds,
            "batch_occupancy": (self.step_sequences / self.steps / self.max_concurrent) if self.steps else 0.0,
            "sequences_per_step": self.step_sequences / self.steps if self.steps else 0.0,
            "tokens_per_step": self.computed_tokens / self.steps if self.steps else 0.0,
            "queue_time_mean": float(q.mean()),
            "queue_time_p95": float(np.percentile(q, 95)),
            "queue_time_max": float(q.max()),
            "b_eff_total": self.b_eff_total,
            "shared_prefix_waits": float(self.shared_prefix_waits),
            "memory_waits": float(self.memory_waits),
            "kv_peak_mb": self.kv_peak_bytes / 2**20,
        }
