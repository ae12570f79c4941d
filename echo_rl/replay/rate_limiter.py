"""A samples-per-insert rate limiter for replay, with Reverb's semantics.

Why: with many actors and one learner, nothing otherwise ties how often each sample is replayed to
how fast samples arrive — a fast actor fleet makes every sample seen ~never, a slow one makes the
learner overfit a few. Reverb (``reverb.rate_limiters``) fixes the ratio; this module does the
same for EchoRL's buffers and the ingestion server.

State: ``inserts`` (samples ever admitted) and ``samples`` (samples ever drawn, a batch of n counts
n), plus the ring ``capacity`` so the current size is ``min(inserts, capacity)``. The *cursor*
is ``inserts * samples_per_insert - samples``. With ``k`` more items:

* an insert of item k (k = 1, 2, ...) is allowed when ``size + k <= min_size_to_sample`` (below the
  minimum size inserts are free) or ``(inserts + k) * samples_per_insert - samples <= max_diff``;
* a draw of n samples is allowed when ``size >= min_size_to_sample`` and
  ``inserts * samples_per_insert - samples - n >= min_diff``.

Both conditions are monotone in k, so the inserts allowed now are a prefix of a batch: a batch
insert is admitted in pieces (the writer waits for the rest), while a draw of n is all or nothing.
An insert is two-phase, as in Reverb (await, then insert under the table's lock): admitted items
are *pending* — they count against later inserts at once — and become ``inserts``, which draws may
use, only when the caller :meth:`~RateLimiter.commit` them after storing (or :meth:`~RateLimiter.refund`
them on failure). So a draw is never allowed on samples a writer has not stored yet.
:meth:`RateLimiter.sample_to_insert_ratio` maps ``error_buffer`` e to ``[min_diff, max_diff] =
samples_per_insert * min_size_to_sample ± e`` as Reverb does (so only operations after the
minimum size count), and refuses ranges that could block forever (narrower than
``2 * max(1, samples_per_insert)``, or entirely above the offset). A draw of more than
``max_diff - min_diff`` samples could never be granted and is refused at once.

Waiting: ``timeout=None`` blocks until allowed, ``0`` refuses at once, ``t > 0`` waits up to t
seconds; a refusal raises :class:`RateLimited` naming the counts and what would unblock it.
Waits use one condition variable and never hold a buffer's lock, so a writer waiting for
inserts never blocks the learner whose draws would release it.
"""

from __future__ import annotations

import math
import threading
import time

_INF = float("inf")


class _Default:
    def __repr__(self) -> str:
        return "DEFAULT"


DEFAULT = _Default()  # "use the limiter's own timeout"


class RateLimited(TimeoutError):
    """An insert or draw was not allowed within its timeout. ``done``: items admitted before it."""

    def __init__(self, message: str, done: int = 0):
        super().__init__(message)
        self.done = done


class RateLimiterCancelled(RuntimeError):
    """The limiter was cancelled (its server is closing) while a call waited."""


def _num(name: str, value, lo: float | None = None) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name}={value!r} is invalid: must be a number") from None
    if math.isnan(v) or (lo is not None and v < lo):
        raise ValueError(f"{name}={value!r} is invalid: must be a number >= {lo}")
    return v


class RateLimiter:
    """Blocks or refuses inserts and draws so the samples-per-insert ratio stays in a band.

    Build with :meth:`min_size` or :meth:`sample_to_insert_ratio` (or the raw Reverb parameters
    here). ``timeout``: the default wait of :meth:`acquire_inserts` / :meth:`acquire_samples`
    (None: block until allowed; 0: refuse at once). A buffer :meth:`bind` binds it to its capacity.
    """

    def __init__(self, samples_per_insert: float = 1.0, min_size_to_sample: int = 1, min_diff: float = -_INF,
                 max_diff: float = _INF, *, timeout: float | None = None):
        self.samples_per_insert = _num("samples_per_insert", samples_per_insert, lo=0.0)
        if isinstance(min_size_to_sample, bool) or not isinstance(min_size_to_sample, int) or min_size_to_sample < 1:
            raise ValueError(f"min_size_to_sample={min_size_to_sample!r} is invalid: must be an integer >= 1")
        self.min_size_to_sample = int(min_size_to_sample)
        self.min_diff = _num("min_diff", min_diff)
        self.max_diff = _num("max_diff", max_diff)
        if self.min_diff > self.max_diff:
            raise ValueError(f"min_diff={min_diff!r} > max_diff={max_diff!r}: the allowed band is empty")
        self.timeout = None if timeout is None else _num("timeout", timeout, lo=0.0)
        self.capacity: int | None = None
        self.inserts = 0
        self.pending = 0  # admitted, not yet stored (see commit)
        self.samples = 0
        self.blocked_inserts = 0  # calls that had to wait (or were refused)
        self.blocked_samples = 0
        self._cancelled = False
        self._cond = threading.Condition()

    # ------------------------------------------------------------ builders
    @classmethod
    def min_size(cls, min_size_to_sample: int, *, timeout: float | None = None) -> "RateLimiter":
        """Draws wait until ``min_size_to_sample`` items are stored; otherwise no limit (Reverb's MinSize)."""
        return cls(1.0, min_size_to_sample, -_INF, _INF, timeout=timeout)

    @classmethod
    def sample_to_insert_ratio(cls, samples_per_insert: float, min_size_to_sample: int, error_buffer,
                               *, timeout: float | None = None) -> "RateLimiter":
        """Keep ``samples / inserts`` near ``samples_per_insert`` after ``min_size_to_sample`` items.

        ``error_buffer``: a number e (band ``spi * min_size ± e``) or a ``(min_diff, max_diff)`` pair."""
        spi = _num("samples_per_insert", samples_per_insert, lo=0.0)
        if isinstance(error_buffer, (tuple, list)):
            if len(error_buffer) != 2:
                raise ValueError(f"error_buffer={error_buffer!r} is invalid: a number or a (min_diff, max_diff) pair")
            lo, hi = (_num("error_buffer", x) for x in error_buffer)
        else:
            e = _num("error_buffer", error_buffer, lo=0.0)
            offset = spi * min_size_to_sample
            lo, hi = offset - e, offset + e
        need = 2 * max(1.0, spi)
        if hi - lo < need:
            raise ValueError(f"error_buffer={error_buffer!r} is too small: the band max_diff - min_diff = {hi - lo:g} "
                             f"must be >= 2 * max(1, samples_per_insert) = {need:g}, or calls could block forever")
        if lo > spi * min_size_to_sample:
            raise ValueError(f"error_buffer={error_buffer!r} is invalid: min_diff={lo:g} is above samples_per_insert * "
                             f"min_size_to_sample = {spi * min_size_to_sample:g}; draws would never be allowed")
        return cls(spi, min_size_to_sample, lo, hi, timeout=timeout)

    @classmethod
    def queue(cls, size: int, *, timeout: float | None = None) -> "RateLimiter":
        """Each item drawn once, at most ``size`` undrawn (with a FIFO sampler: a bounded queue)."""
        return cls(1.0, 1, 0.0, float(size), timeout=timeout)

    def bind(self, capacity: int, inserts: int = 0, samples: int = 0) -> "RateLimiter":
        """Attach to a ring of ``capacity`` that already holds ``inserts`` ids (a buffer calls this)."""
        with self._cond:
            self.capacity = int(capacity)
            self.inserts, self.samples = int(inserts), int(samples)
        return self

    # ------------------------------------------------------------ queries
    @property
    def size(self) -> int:
        return self.inserts if self.capacity is None else min(self.inserts, self.capacity)

    @property
    def cursor(self) -> float:
        """``inserts * samples_per_insert - samples``: above the band inserts wait, below it draws wait."""
        return self.inserts * self.samples_per_insert - self.samples

    def insertable(self, n: int) -> int:
        """How many of n further inserts are allowed now (a prefix; pending inserts count)."""
        ins = self.inserts + self.pending
        size = ins if self.capacity is None else min(ins, self.capacity)
        free = max(0, self.min_size_to_sample - size)
        if self.max_diff == _INF:
            return n
        if self.samples_per_insert == 0:
            return n if -self.samples <= self.max_diff else min(n, free)
        k = math.floor((self.max_diff + self.samples) / self.samples_per_insert) - ins
        while k > 0 and (ins + k) * self.samples_per_insert - self.samples > self.max_diff:
            k -= 1  # float rounding: the per-item rule is the reference
        return max(0, min(n, max(free, k)))

    def can_sample(self, n: int) -> bool:
        return self.size >= self.min_size_to_sample and self.cursor - n >= self.min_diff

    def state(self) -> dict:
        return {"inserts": self.inserts, "samples": self.samples}

    def load_state(self, state: dict) -> None:
        with self._cond:
            self.inserts, self.samples = int(state["inserts"]), int(state["samples"])
            self._cond.notify_all()

    def __repr__(self) -> str:
        return (f"RateLimiter(samples_per_insert={self.samples_per_insert:g}, min_size_to_sample="
                f"{self.min_size_to_sample}, min_diff={self.min_diff:g}, max_diff={self.max_diff:g})")

    # ------------------------------------------------------------ acquire
    def _resolve(self, timeout) -> float | None:
        t = self.timeout if timeout is DEFAULT else timeout
        return None if t is None else _num("timeout", t, lo=0.0)

    def _wait(self, deadline) -> bool:
        """Wait for a state change; False once the deadline passed."""
        if self._cancelled:
            raise RateLimiterCancelled("replay rate limiter was cancelled (the server is closing)")
        if deadline is None:
            self._cond.wait(0.5)
        else:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self._cond.wait(left)
        if self._cancelled:
            raise RateLimiterCancelled("replay rate limiter was cancelled (the server is closing)")
        return True

    def acquire_inserts(self, n: int, timeout=DEFAULT) -> int:
        """Admit between 1 and n inserts (pending until :meth:`commit`), waiting up to ``timeout`` for
        the first one (None: until allowed; 0: refuse at once; ``DEFAULT``: the limiter's ``timeout``)."""
        timeout = self._resolve(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            k = self.insertable(n)
            if k == 0:
                self.blocked_inserts += 1
            while k == 0:
                if not self._wait(deadline):
                    raise RateLimited(
                        f"replay rate limiter refused an insert after {_secs(timeout)}: cursor "
                        f"{self.cursor + self.pending * self.samples_per_insert:g} (= {self.inserts + self.pending} inserts x samples_per_insert {self.samples_per_insert:g} - "
                        f"{self.samples} samples) would exceed max_diff={self.max_diff:g}; the learner must draw "
                        f"more samples first (or widen error_buffer)")
                k = self.insertable(n)
            self.pending += k
            return k

    def commit(self, inserts: int) -> None:
        """Admitted inserts are stored: draws may now count them."""
        with self._cond:
            self.pending -= inserts
            self.inserts += inserts
            self._cond.notify_all()

    def acquire_samples(self, n: int, timeout=DEFAULT) -> None:
        """Admit a draw of n samples (counted now), waiting up to ``timeout``."""
        if n > self.max_diff - self.min_diff:
            raise ValueError(f"a draw of {n} samples can never be allowed by {self!r}: the band max_diff - min_diff "
                             f"is {self.max_diff - self.min_diff:g}; use error_buffer >= {math.ceil(n / 2)}")
        timeout = self._resolve(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            if not self.can_sample(n):
                self.blocked_samples += 1
            while not self.can_sample(n):
                if not self._wait(deadline):
                    if self.size < self.min_size_to_sample:
                        why = (f"{self.size} items stored, min_size_to_sample={self.min_size_to_sample}; "
                               f"writers must insert more")
                    else:
                        why = (f"cursor {self.cursor:g} (= {self.inserts} inserts x samples_per_insert "
                               f"{self.samples_per_insert:g} - {self.samples} samples) minus {n} would fall below "
                               f"min_diff={self.min_diff:g}; writers must insert more first (or widen error_buffer)")
                    raise RateLimited(f"replay rate limiter refused sample({n}) after "
                                      f"{_secs(timeout)}: {why}")
            self.samples += n
            self._cond.notify_all()

    def refund(self, inserts: int = 0, samples: int = 0) -> None:
        """Undo calls that failed after they were admitted (bad input, not enough FIFO items)."""
        with self._cond:
            self.pending -= inserts
            self.samples -= samples
            self._cond.notify_all()

    def cancel(self) -> None:
        """Wake every waiting call with :class:`RateLimiterCancelled` (and refuse later waits) until :meth:`resume`."""
        with self._cond:
            self._cancelled = True
            self._cond.notify_all()

    def resume(self) -> None:
        with self._cond:
            self._cancelled = False


def _secs(timeout) -> str:
    return "no wait (timeout=0)" if not timeout else f"{timeout:g}s"


__all__ = ["DEFAULT", "RateLimited", "RateLimiter", "RateLimiterCancelled"]
