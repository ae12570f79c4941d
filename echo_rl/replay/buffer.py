"""Prioritized replay over a preallocated struct-of-arrays ring, with age regions and sum trees.

Every stored sample gets an **id**: the running count of samples added before it (0, 1, 2, ...).
Ids never repeat, so they double as the ``indices`` a learner hands back to
``update_priorities``; an id whose sample has since been evicted is skipped, never mistaken for
the sample now in its slot. The **age** of a sample is the number of samples added after it
(``age = ids_issued - 1 - id``), i.e. it is counted in adds, not in wall time or learner steps.

The ring is cut by age into consecutive *regions* (youngest first), each with its own sum tree:
one region for :class:`PrioritizedReplayBuffer`, hot and cold for ``HotColdBuffer``. A region of
length L holds the L youngest samples not held by younger regions; a sample leaves the last
region (is evicted) when it is older than the sum of the lengths. Moving between regions moves
only its tree leaf — the data stay in place.

Sampling rules (``mode``):

* ``"proportional"`` — classic PER: ``P(i) ∝ (p_i + eps)^alpha``.
* ``"softmax"`` — the product's rule: ``P(i) ∝ exp(s_i / T)`` for plan-surprise scores ``s_i``.
  Leaves store ``exp((s_i - c) / T)`` with a shift ``c``. When a new or updated score would exceed
  ``c + 30 T`` the shift is raised to it and all leaves are recomputed from the raw scores
  (O(N), rare: each rebase raises c by at least 30 T); when the total falls below ``e^-30``
  (the largest live score dropped far below c) c is lowered to the live maximum the same way. So
  leaves never exceed ``e^30`` (no overflow in any sum), and the live maximum never underflows;
  only samples more than ~700 T below the maximum can round to probability 0, where float64
  could not represent their share of the total anyway. Changing T recomputes all leaves (O(N)).

Draws are stratified (one uniform per 1/n of the mass), found by a level-synchronous descent of
the sum tree — O(log N) per draw, all draws of a batch advanced together. Importance weights are
``w_i = (N · P(i))^-beta / max_j w_j`` over the batch, N = samples stored.

Which samples a draw returns is the buffer's *sampler* (``sampler="prioritized" | "uniform" |
"fifo"``, :mod:`samplers`); the sum trees are kept whichever it is, so priorities survive a
checkpoint. An optional :class:`~echo_rl.replay.rate_limiter.RateLimiter` holds the
samples-per-insert ratio (Reverb's semantics): ``add``/``add_one`` wait for permission to insert and
``sample`` for permission to draw, up to ``timeout`` (then :class:`RateLimited`); the waits happen
outside the buffer's lock, so a blocked writer never blocks the learner that would release it.

Thread-safety: one writer thread and one sampler thread may use a buffer concurrently — every
public method holds one lock. Sampled data are copies (or the caller's ``out=`` arrays), except
``sample(n, copy=False)`` of a FIFO batch that does not wrap around the ring: then ``Batch.data``
are views into the ring itself (``Batch.view`` is True), valid while :meth:`view_valid` says so —
until ``capacity - n`` further samples have been added.
"""

from __future__ import annotations

import math
import os
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from echo_rl.kernels import sumtree_ref
from echo_rl.kernels.sumtree import SumTree
from echo_rl.replay.experience import ExperienceAPI
from echo_rl.replay.persistence import load_buffer, save_buffer
from echo_rl.replay.priorities import PriorityRules, _check_float, _check_int
from echo_rl.replay.rate_limiter import DEFAULT, RateLimited, RateLimiter
from echo_rl.replay.samplers import ReplayNotReadyError, Sampler, make_sampler
from echo_rl.replay.schema import Schema, SchemaError
from echo_rl.replay.surprise import SurpriseCalculator

MODES = ("proportional", "softmax")


@dataclass
class Batch:
    """A sampled batch: ``data`` (same pytree as the stored samples, leading axis n), the sample
    ``indices`` (ids for ``update_priorities``), importance ``weights`` and the draw
    ``probabilities`` P(i). ``view``: the data are views into the buffer's ring (see
    ``PrioritizedReplayBuffer.view_valid``), not a copy."""

    data: Any
    indices: np.ndarray
    weights: np.ndarray
    probabilities: np.ndarray
    view: bool = False

    def __len__(self) -> int:
        return int(self.indices.shape[0])


class PrioritizedReplayBuffer(PriorityRules, ExperienceAPI):
    """Prioritized replay ring of ``capacity`` samples of any pytree shape (see module docstring).

    Parameters: ``mode`` ("proportional" | "softmax"), ``alpha`` (PER exponent), ``beta``
    (importance exponent), ``temperature`` (softmax T), ``priority_epsilon`` (added to
    proportional priorities), ``min_experiences`` (sampling below it raises
    :class:`ReplayNotReadyError`; check ``ready`` first), ``example`` (a sample fixing the schema;
    else the first add does), ``seed``, ``use_native`` (None auto, False numpy, True compiled),
    ``sampler`` ("prioritized" | "uniform" | "fifo", see :mod:`samplers`), ``rate_limiter`` (a
    :class:`RateLimiter`, or None for none).
    """

    def __init__(self, capacity: int | None = None, *, mode: str = "proportional", alpha: float = 0.6,
                 beta: float = 0.4, temperature: float = 1.0, priority_epsilon: float = 1e-6,
                 min_experiences: int = 1, example: Any = None, seed: int | None = None,
                 use_native: bool | None = None, surprise: SurpriseCalculator | None = None,
                 config: Any = None, sampler: str | Sampler = "prioritized", rate_limiter: RateLimiter | None = None):
        """``config=ReplayConfig(...)`` (the product's form) takes the capacity and every sampling
        parameter from the config, as :meth:`from_config`; then pass none of them here."""
        if config is not None:
            from echo_rl.config import ReplayConfig  # needed on this path only

            if not isinstance(config, ReplayConfig):
                raise TypeError(f"config must be a ReplayConfig, got {type(config).__name__}")
            given = {k: v for k, v, d in (("capacity", capacity, None), ("mode", mode, "proportional"),
                                          ("alpha", alpha, 0.6), ("beta", beta, 0.4),
                                          ("temperature", temperature, 1.0),
                                          ("priority_epsilon", priority_epsilon, 1e-6),
                                          ("min_experiences", min_experiences, 1)) if v != d}
            if given:
                raise ValueError(f"pass config or {', '.join(given)}, not both (the config sets them)")
            capacity = min(config.hot_buffer_size + config.cold_buffer_size, config.max_replay_age)
            mode, alpha, beta = config.sampling_mode, config.priority_alpha, config.importance_sampling_beta
            temperature, priority_epsilon = config.temperature, config.priority_epsilon
            min_experiences = config.min_experiences
            surprise = surprise if surprise is not None else SurpriseCalculator.from_config(config)
        elif capacity is None:
            raise ValueError("PrioritizedReplayBuffer needs capacity (an integer >= 1) or config=ReplayConfig(...)")
        self.config = config
        capacity = _check_int("capacity", capacity, 1)
        self._init(region_lengths=[capacity], region_ratios=[1.0], mode=mode, alpha=alpha, beta=beta,
                   temperature=temperature, priority_epsilon=priority_epsilon,
                   min_experiences=min_experiences, example=example, seed=seed, use_native=use_native,
                   surprise=surprise, sampler=sampler, rate_limiter=rate_limiter)

    @classmethod
    def from_config(cls, config, *, example: Any = None, seed: int | None = None,
                    use_native: bool | None = None) -> "PrioritizedReplayBuffer":
        """One ring holding every sample younger than ``max_replay_age`` (no hot/cold split)."""
        return cls(config=config, example=example, seed=seed, use_native=use_native)

    # ------------------------------------------------------------------ setup
    def _init(self, *, region_lengths, region_ratios, mode, alpha, beta, temperature, priority_epsilon,
              min_experiences, example, seed, use_native, surprise, sampler="prioritized", rate_limiter=None):
        if mode not in MODES:
            raise ValueError(f"mode={mode!r} is invalid: allowed: {', '.join(MODES)}")
        self.mode = mode
        self.alpha = _check_float("alpha", alpha, lo=0.0)
        self.beta = _check_float("beta", beta, lo=0.0, hi=1.0)
        self.temperature = _check_float("temperature", temperature, gt=0.0)
        self.priority_epsilon = _check_float("priority_epsilon", priority_epsilon, lo=0.0)
        self.min_experiences = _check_int("min_experiences", min_experiences, 1)
        self._lengths = [int(x) for x in region_lengths]
        self._ratios = [float(r) for r in region_ratios]
        self.capacity = sum(self._lengths)
        self._trees = [SumTree(L, use_native=use_native) for L in self._lengths]
        self._nat = self._trees[0]._nat
        # update_priorities goes through one compiled call (per_update) for this layout
        self._per_native = self._nat is not None and mode == "proportional" and len(self._lengths) == 1
        # Raw priorities/scores by ring slot are read only to rebuild leaves: softmax shifts and
        # temperature changes, and hot -> cold moves. A single proportional ring never needs them.
        self._needs_raw = mode == "softmax" or len(self._lengths) > 1
        self._raw = np.zeros(self.capacity, dtype=np.float64) if self._needs_raw else None
        self._next_id = 0
        self._max_priority = 1.0  # default priority of new samples (proportional mode)
        self._max_score = None  # default score of new samples (softmax mode)
        self._shift = None  # softmax shift c
        self._rng = np.random.default_rng(seed)
        self._lock = threading.RLock()
        self.surprise = surprise if surprise is not None else SurpriseCalculator()
        self.schema: Schema | None = None
        self._storage: list[np.ndarray] = []
        self._storage_t: tuple = ()
        self.stats = {"stale_updates": 0, "rebases": 0}
        self._const_cache = None
        self.sampler = make_sampler(sampler)
        if self.sampler.name != "prioritized" and len(self._lengths) > 1:
            raise ValueError(f"sampler={self.sampler.name!r} is invalid for a buffer with {len(self._lengths)} age "
                             f"regions: allowed: prioritized")
        if rate_limiter is not None and not isinstance(rate_limiter, RateLimiter):
            raise TypeError(f"rate_limiter must be a RateLimiter or None, got {type(rate_limiter).__name__}")
        self.rate_limiter = None if rate_limiter is None else rate_limiter.bind(self.capacity)
        if example is not None:
            self._set_schema(Schema.from_example(example))

    def _set_schema(self, schema: Schema) -> None:
        self.schema = schema
        self._storage = schema.allocate(self.capacity)
        self._storage_t = tuple(self._storage)

    # ------------------------------------------------------------- properties
    @property
    def native(self) -> bool:
        """Whether this buffer runs on the compiled kernels."""
        return self._nat is not None

    def __len__(self) -> int:
        return min(self._next_id, self.capacity)

    @property
    def size(self) -> int:
        return len(self)

    @property
    def ids_issued(self) -> int:
        """Samples ever added (the next sample's id)."""
        return self._next_id

    @property
    def ready(self) -> bool:
        return len(self) >= self.min_experiences

    def _windows(self, end: int) -> list[tuple[int, int]]:
        """Id range [lo, hi) of each region when ``end`` ids have been issued."""
        out = []
        for L in self._lengths:
            lo = max(0, end - L)
            out.append((lo, end))
            end = lo
        return out

    # ------------------------------------------------------------------- add
    def add_one(self, sample: Any, priority: float | None = None, *, timeout=DEFAULT) -> int:
        """Store one sample (any pytree matching the schema); return its id.

        ``priority`` defaults to the largest priority (proportional) or score (softmax) seen, so
        new samples are drawn soon. A bad sample raises naming the leaf; nothing is written.
        With a rate limiter, waits up to ``timeout`` (default: the limiter's) for permission.
        """
        lim = self.rate_limiter
        if lim is None:
            return self._add_one(sample, priority)
        lim.acquire_inserts(1, timeout)
        try:
            nid = self._add_one(sample, priority)
        except BaseException:
            lim.refund(inserts=1)
            raise
        lim.commit(1)
        return nid

    def _add_one(self, sample: Any, priority: float | None) -> int:
        with self._lock:
            if priority is None:
                p = self._default_priority()
            else:
                p = float(priority)
                if not (math.isfinite(p) and p >= 0.0):
                    raise ValueError(f"priority={priority!r} is invalid: must be finite and >= 0")
            if self.mode == "softmax":
                self._prepare_scores(p)
            if self.schema is None:
                self._set_schema(Schema.from_example(sample))
            nid = self._next_id
            slot = nid % self.capacity
            if self._nat is not None:
                # one native call checks and writes every leaf (and, with one region, the tree leaf)
                single = len(self._lengths) == 1
                tree = self._trees[0]
                done = self._nat.add_one(self._storage_t, self.schema.flat_keys, sample, slot,
                                         tree.tree if single else None, tree.offs, slot,
                                         self._transform_one(p))
                if done < 0:
                    if self._raw is not None:
                        self._raw[slot] = p
                    if single:
                        self._next_id = nid + 1
                    else:
                        self._advance(1)
                    if priority is not None:
                        self._note_priorities(p)
                    return nid
            leaves = self.schema.check_one(sample)
            for dst, x in zip(self._storage, leaves):
                dst[slot] = x
            if self._raw is not None:
                self._raw[slot] = p
            if len(self._lengths) == 1:
                self._trees[0].set_one(slot, self._transform_one(p))
                self._next_id = nid + 1
            else:
                self._advance(1)
            if priority is not None:
                self._note_priorities(p)
            return nid

    def add(self, batch: Any, priorities=None, *, timeout=DEFAULT) -> np.ndarray:
        """Store a batch (every leaf with a leading axis n); return the n ids.

        All leaves are checked before anything is written. When n exceeds the capacity only the
        last ``capacity`` samples are kept (the earlier ones would be evicted at once).
        With a rate limiter the batch is admitted in pieces as the limiter allows, each piece
        waiting up to ``timeout`` (default: the limiter's); on a refusal :class:`RateLimited`
        says in ``done`` how many leading samples were stored.
        """
        lim = self.rate_limiter
        if lim is None:
            return self.add_granted(batch, priorities)
        with self._lock:
            if self.schema is None:
                self._set_schema(Schema.from_example(batch, batched=True))
            n, leaves = self.schema.check_batch(batch)
        pr = None if priorities is None else np.ascontiguousarray(priorities, dtype=np.float64).reshape(-1)
        if pr is not None and pr.shape[0] != n:
            raise ValueError(f"priorities has {pr.shape[0]} entries for a batch of {n}")
        done, out = 0, []
        while done < n:
            try:
                k = lim.acquire_inserts(n - done, timeout)
            except RateLimited as exc:
                exc.done = done
                raise
            part = leaves if (done == 0 and k == n) else [x[done: done + k] for x in leaves]
            try:
                out.append(self.add_granted(self.schema.unflatten(part), None if pr is None else pr[done: done + k]))
            except BaseException:
                lim.refund(inserts=k)
                raise
            lim.commit(k)
            done += k
        return out[0] if len(out) == 1 else np.concatenate(out) if out else np.zeros(0, dtype=np.int64)

    def add_granted(self, batch: Any, priorities=None) -> np.ndarray:
        """:meth:`add` without asking the rate limiter: for a caller that took the limiter's
        permission itself (``rate_limiter.acquire_inserts``, then ``commit``), e.g. the ingestion server."""
        with self._lock:
            if self.schema is None:
                self._set_schema(Schema.from_example(batch, batched=True))
            n, leaves = self.schema.check_batch(batch)
            if priorities is None:
                pr = None
            else:
                pr = np.ascontiguousarray(priorities, dtype=np.float64).reshape(-1)
                if pr.shape[0] != n:
                    raise ValueError(f"priorities has {pr.shape[0]} entries for a batch of {n}")
                self._check_priorities(pr)
            if n == 0:
                return np.zeros(0, dtype=np.int64)
            top = float(pr.max()) if pr is not None else self._default_priority()
            if self.mode == "softmax":
                self._prepare_scores(top)
            start = self._next_id
            keep = min(n, self.capacity)
            skip = n - keep
            first_slot = (start + skip) % self.capacity
            head = min(keep, self.capacity - first_slot)
            if self._nat is not None and all(x.flags.c_contiguous for x in leaves):
                # compiled row copy with streaming stores: the ring rows are cold, so skip reading them
                self._nat.write_rows(self._storage_t, first_slot, tuple(x[skip: skip + head] for x in leaves))
                if keep > head:
                    self._nat.write_rows(self._storage_t, 0, tuple(x[skip + head:] for x in leaves))
            else:
                for dst, x in zip(self._storage, leaves):
                    dst[first_slot: first_slot + head] = x[skip: skip + head]
                    if keep > head:
                        dst[: keep - head] = x[skip + head:]
            raw_vals = pr[skip:] if pr is not None else top
            if self._raw is not None:
                self._raw[first_slot: first_slot + head] = raw_vals[:head] if pr is not None else top
                if keep > head:
                    self._raw[: keep - head] = raw_vals[head:] if pr is not None else top
            fresh = self._transform(raw_vals) if pr is not None else self._constant_leaves(keep, top)
            if len(self._lengths) == 1:  # one region: the new leaves are a contiguous (wrapping) range
                self._next_id = start + n
                tree = self._trees[0]
                if self._nat is not None:
                    self._nat.tree_set_range(tree.tree, tree.offs, first_slot, fresh[:head])
                    if keep > head:
                        self._nat.tree_set_range(tree.tree, tree.offs, 0, fresh[head:])
                else:
                    tree.set_range(first_slot, fresh)
            else:
                self._advance(n)
            if pr is not None:
                self._note_priorities(top)
            return np.arange(start, start + n, dtype=np.int64)

    def _constant_leaves(self, n: int, priority: float) -> np.ndarray:
        """Leaf values for n new samples at one default priority (cached: batches repeat sizes)."""
        key = (n, priority, self.mode, self.alpha, self.priority_epsilon, self.temperature, self._shift)
        if self._const_cache is None or self._const_cache[0] != key:
            self._const_cache = (key, np.full(n, self._transform_one(priority)))
        return self._const_cache[1]

    def _advance(self, n: int) -> None:
        """Issue n ids (data and raw priorities already written) and move tree leaves across regions."""
        old = self._windows(self._next_id)
        self._next_id += n
        new = self._windows(self._next_id)
        for (olo, ohi), (nlo, nhi), L, tree in zip(old, new, self._lengths, self._trees):
            lo = max(ohi, nlo)  # ids entering this region; they overwrite the leaves of those leaving
            if nhi > lo:
                ids = np.arange(lo, nhi, dtype=np.int64)
                tree.set_range(lo % L, self._transform(self._raw[ids % self.capacity]))

    # --------------------------------------------------------------- sampling
    def sample(self, n: int, beta: float | None = None, out: Any = None, *, copy: bool = True,
               timeout=DEFAULT) -> Batch:
        """Draw ``n`` samples (with replacement) by priority; see the module docstring.

        ``out``: a pytree of the stored samples' structure whose leaves are C-contiguous, writable
        numpy arrays of shape ``(n, *leaf shape)`` and the schema's dtypes (e.g. preallocated, or
        ``tensor.numpy()`` of pinned torch tensors). The rows are gathered straight into them and
        ``Batch.data`` is ``out`` itself: no allocation and no further copy on the way to the learner.
        ``copy=False``: when the sampler's batch is one unwrapped slot range (FIFO), ``Batch.data``
        are views into the ring (no copy at all; see :meth:`view_valid`); otherwise rows are gathered.
        With a rate limiter, waits up to ``timeout`` (default: the limiter's) for permission to draw.
        """
        n = _check_int("n", n, 1)
        lim = self.rate_limiter
        if lim is None:
            return self._sample(n, beta, out, copy)
        lim.acquire_samples(n, timeout)
        try:
            return self._sample(n, beta, out, copy)
        except BaseException:
            lim.refund(samples=n)
            raise

    def _sample(self, n: int, beta, out, copy: bool) -> Batch:
        with self._lock:
            out_leaves = None if out is None else self._check_out(out, n)
            if len(self) < self.min_experiences:
                raise ReplayNotReadyError(f"buffer holds {len(self)} samples; sampling needs "
                                          f"min_experiences={self.min_experiences}")
            b = self.beta if beta is None else _check_float("beta", beta, lo=0.0, hi=1.0)
            ids, slots, probs = self.sampler.draw(self, n)
            if b == 0.0 or self.sampler.name != "prioritized":
                weights = np.ones(n, dtype=np.float64)
            else:  # (N P_i)^-b / max_j (N P_j)^-b == (P_i / min_j P_j)^-b
                weights = np.power(probs * (1.0 / probs.min()), -b)
            s0 = int(slots[0])
            if not copy and out is None and self.sampler.contiguous and s0 + n <= self.capacity:
                data = self.schema.unflatten([leaf[s0: s0 + n] for leaf in self._storage])
                return Batch(data, ids, weights, probs, view=True)
            outs = out_leaves or tuple(np.empty((n, *lf.shape), dtype=lf.dtype) for lf in self.schema.leaves)
            if self._nat is not None:
                self._nat.gather(self._storage_t, slots, outs)
            else:
                sumtree_ref.gather_rows(self._storage, slots, outs)
            return Batch(self.schema.unflatten(list(outs)) if out is None else out, ids, weights, probs)

    def view_valid(self, batch: Batch) -> bool:
        """Whether a ``copy=False`` batch's views still show its samples (none overwritten since)."""
        return len(batch) == 0 or int(batch.indices[0]) >= self._next_id - self.capacity

    def _check_out(self, out: Any, n: int) -> tuple:
        """``out``'s leaves, or SchemaError naming the first leaf that cannot take n gathered rows."""
        if self.schema is None:
            raise ReplayNotReadyError("buffer holds no samples yet (its schema is unknown); nothing to sample")
        leaves = self.schema.flatten(out)
        for lf, x in zip(self.schema.leaves, leaves):
            want = (n, *lf.shape)
            if type(x) is not np.ndarray:
                raise SchemaError(f"out leaf '{lf.name}' is a {type(x).__name__}; expected a numpy array "
                                  f"{lf.dtype}{list(want)}")
            if x.dtype != lf.dtype or x.shape != want:
                raise SchemaError(f"out leaf '{lf.name}' is {x.dtype}{list(x.shape)}; expected {lf.dtype}{list(want)}")
            if not (x.flags.c_contiguous and x.flags.writeable):
                raise SchemaError(f"out leaf '{lf.name}' must be C-contiguous and writable")
        return tuple(leaves)

    # ---------------------------------------------------------- persistence
    def save(self, path: str | os.PathLike, extra: dict | None = None) -> None:
        """Write contents, priorities, trees, RNG, sampler, rate-limiter and surprise state to one
        ``.npz`` (atomically, fsynced). ``extra``: JSON-able state of the caller saved alongside."""
        save_buffer(self, path, extra)

    def load(self, path: str | os.PathLike) -> dict:
        """Restore a buffer written by :meth:`save`: identical contents and sampling state; returns
        the ``extra`` saved with it ({} if none). The file must come from a buffer with the same
        layout (capacity / region sizes)."""
        return load_buffer(self, path)


__all__ = ["Batch", "MODES", "PrioritizedReplayBuffer", "ReplayNotReadyError", "SchemaError"]
