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

Thread-safety: one writer thread and one sampler thread may use a buffer concurrently — every
public method holds one lock, and sampled data are copies, never views into the ring.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from echo_rl.core.replay.schema import Schema, SchemaError
from echo_rl.core.replay.surprise import SurpriseCalculator
from echo_rl.kernels import sumtree_ref
from echo_rl.kernels.sumtree import SumTree

MODES = ("proportional", "softmax")
_REBASE = 30.0  # softmax leaves stay within exp(±30) of the shift (see module docstring)
_FORMAT = 1


class ReplayNotReadyError(RuntimeError):
    """Sampling was asked for before ``min_experiences`` samples were stored."""


@dataclass
class Batch:
    """A sampled batch: ``data`` (same pytree as the stored samples, leading axis n), the sample
    ``indices`` (ids for ``update_priorities``), importance ``weights`` and the draw
    ``probabilities`` P(i)."""

    data: Any
    indices: np.ndarray
    weights: np.ndarray
    probabilities: np.ndarray

    def __len__(self) -> int:
        return int(self.indices.shape[0])


def _check_int(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name}={value!r} is invalid: must be an integer >= {minimum}")
    return int(value)


def _check_float(name: str, value, lo: float | None = None, gt: float | None = None,
                 hi: float | None = None) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name}={value!r} is invalid: must be a number") from None
    if not math.isfinite(v) or (lo is not None and v < lo) or (gt is not None and v <= gt) or \
            (hi is not None and v > hi):
        rule = " and ".join(r for r in (f">= {lo}" if lo is not None else "", f"> {gt}" if gt is not None else "",
                                        f"<= {hi}" if hi is not None else "") if r) or "finite"
        raise ValueError(f"{name}={value!r} is invalid: must be {rule}")
    return v


class PrioritizedReplayBuffer:
    """Prioritized replay ring of ``capacity`` samples of any pytree shape (see module docstring).

    Parameters: ``mode`` ("proportional" | "softmax"), ``alpha`` (PER exponent), ``beta``
    (importance exponent), ``temperature`` (softmax T), ``priority_epsilon`` (added to
    proportional priorities), ``min_experiences`` (sampling below it raises
    :class:`ReplayNotReadyError`; check ``ready`` first), ``example`` (a sample fixing the schema;
    else the first add does), ``seed``, ``use_native`` (None auto, False numpy, True compiled).
    """

    def __init__(self, capacity: int | None = None, *, mode: str = "proportional", alpha: float = 0.6,
                 beta: float = 0.4, temperature: float = 1.0, priority_epsilon: float = 1e-6,
                 min_experiences: int = 1, example: Any = None, seed: int | None = None,
                 use_native: bool | None = None, surprise: SurpriseCalculator | None = None,
                 config: Any = None):
        """``config=ReplayConfig(...)`` (the product's form) takes the capacity and every sampling
        parameter from the config, as :meth:`from_config`; then pass none of them here."""
        if config is not None:
            from echo_rl.config import ReplayConfig

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
                   surprise=surprise)

    @classmethod
    def from_config(cls, config, *, example: Any = None, seed: int | None = None,
                    use_native: bool | None = None) -> "PrioritizedReplayBuffer":
        """One ring holding every sample younger than ``max_replay_age`` (no hot/cold split)."""
        return cls(config=config, example=example, seed=seed, use_native=use_native)

    # ------------------------------------------------------------------ setup
    def _init(self, *, region_lengths, region_ratios, mode, alpha, beta, temperature, priority_epsilon,
              min_experiences, example, seed, use_native, surprise):
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

    # ------------------------------------------------------- priority transform
    def _transform(self, raw: np.ndarray) -> np.ndarray:
        if self.mode == "proportional":
            base = raw + self.priority_epsilon
            return base if self.alpha == 1.0 else np.power(base, self.alpha, out=base)
        return np.exp((raw - self._shift) / self.temperature)

    def _transform_one(self, p: float) -> float:
        if self.mode == "proportional":
            return (p + self.priority_epsilon) ** self.alpha
        return math.exp((p - self._shift) / self.temperature)

    def _rebuild_trees(self) -> None:
        """Recompute every leaf from the raw priorities (after a shift or temperature change)."""
        for (lo, hi), L, tree in zip(self._windows(self._next_id), self._lengths, self._trees):
            values = np.zeros(L, dtype=np.float64)
            if hi > lo:
                ids = np.arange(lo, hi, dtype=np.int64)
                values[ids % L] = self._transform(self._raw[ids % self.capacity])
            tree.rebuild(values)
        self.stats["rebases"] += 1

    def _prepare_scores(self, top: float) -> None:
        """Softmax: make sure a score ``top`` fits under the shift before it is written."""
        if self._shift is None:
            self._shift = top
        elif (top - self._shift) / self.temperature > _REBASE:
            self._shift = top
            self._rebuild_trees()

    def _after_decrease(self) -> None:
        """Softmax: lower the shift when every live leaf has become tiny."""
        if self.mode != "softmax" or self._next_id == 0:
            return
        total = sum(t.total for t in self._trees)
        if total < math.exp(-_REBASE):
            live = np.concatenate([np.arange(lo, hi) for lo, hi in self._windows(self._next_id)])
            self._shift = float(self._raw[live % self.capacity].max())
            self._rebuild_trees()

    def _default_priority(self) -> float:
        if self.mode == "proportional":
            return self._max_priority
        return self._max_score if self._max_score is not None else 0.0

    def _note_priorities(self, top: float) -> None:
        if self.mode == "proportional":
            self._max_priority = max(self._max_priority, top)
        else:
            self._max_score = top if self._max_score is None else max(self._max_score, top)

    def _check_priorities(self, p: np.ndarray, name: str = "priorities") -> None:
        bad = self._nat.first_invalid(p) if self._nat is not None else sumtree_ref.first_invalid(p)
        if bad >= 0:
            raise ValueError(f"{name}[{bad}]={float(p[bad])!r} is invalid: must be finite and >= 0")

    # ------------------------------------------------------------------- add
    def add_one(self, sample: Any, priority: float | None = None) -> int:
        """Store one sample (any pytree matching the schema); return its id.

        ``priority`` defaults to the largest priority (proportional) or score (softmax) seen, so
        new samples are drawn soon. A bad sample raises naming the leaf; nothing is written.
        """
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

    def add(self, batch: Any, priorities=None) -> np.ndarray:
        """Store a batch (every leaf with a leading axis n); return the n ids.

        All leaves are checked before anything is written. When n exceeds the capacity only the
        last ``capacity`` samples are kept (the earlier ones would be evicted at once).
        """
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
    def _region_counts(self, n: int, totals: list[float]) -> list[int]:
        ratios = [r if t > 0 else 0.0 for r, t in zip(self._ratios, totals)]
        s = sum(ratios)
        if s <= 0:  # the configured split puts all mass on empty regions: use what is there
            ratios = [1.0 if t > 0 else 0.0 for t in totals]
            s = sum(ratios)
        if s <= 0:
            raise ValueError("cannot sample: all priorities are zero")
        ratios = [r / s for r in ratios]
        if len(ratios) == 1:
            return [n], ratios
        # randomized rounding keeps E[n_r] = n * ratio_r exactly
        counts = [int(math.floor(n * r)) for r in ratios]
        rest = n - sum(counts)
        if rest:
            frac = np.array([n * r - c for r, c in zip(ratios, counts)])
            frac = frac / frac.sum()
            extra = self._rng.choice(len(ratios), size=rest, replace=False, p=frac)
            for j in extra:
                counts[j] += 1
        return counts, ratios

    def sample(self, n: int, beta: float | None = None, out: Any = None) -> Batch:
        """Draw ``n`` samples (with replacement) by priority; see the module docstring.

        ``out``: a pytree of the stored samples' structure whose leaves are C-contiguous, writable
        numpy arrays of shape ``(n, *leaf shape)`` and the schema's dtypes (e.g. preallocated, or
        ``tensor.numpy()`` of pinned torch tensors). The rows are gathered straight into them and
        ``Batch.data`` is ``out`` itself: no allocation and no further copy on the way to the learner.
        """
        with self._lock:
            n = _check_int("n", n, 1)
            out_leaves = None if out is None else self._check_out(out, n)
            if len(self) < self.min_experiences:
                raise ReplayNotReadyError(f"buffer holds {len(self)} samples; sampling needs "
                                          f"min_experiences={self.min_experiences}")
            b = self.beta if beta is None else _check_float("beta", beta, lo=0.0, hi=1.0)
            totals = [t.total for t in self._trees]
            counts, ratios = self._region_counts(n, totals)
            windows = self._windows(self._next_id)
            ids_parts, slot_parts, prob_parts = [], [], []
            for k, ratio, total, tree, L, (lo, hi) in zip(counts, ratios, totals, self._trees, self._lengths,
                                                        windows):
                if k == 0:
                    continue
                u = self._rng.random(k)
                if self._nat is not None:
                    ids = np.empty(k, dtype=np.int64)
                    slots = np.empty(k, dtype=np.int64)
                    probs = np.empty(k, dtype=np.float64)
                    self._nat.sample_region(tree.tree, tree.offs, u, lo, L, self.capacity, ratio / total, ids,
                                            slots, probs)
                else:
                    leaves, vals = sumtree_ref.tree_sample(tree.tree, tree.offs, u)
                    ids = lo + (leaves - lo) % L
                    slots = ids % self.capacity
                    probs = vals * (ratio / total)
                ids_parts.append(ids)
                slot_parts.append(slots)
                prob_parts.append(probs)
            if len(ids_parts) == 1:
                ids, slots, probs = ids_parts[0], slot_parts[0], prob_parts[0]
            else:
                ids, slots, probs = (np.concatenate(x) for x in (ids_parts, slot_parts, prob_parts))
            outs = out_leaves or tuple(np.empty((n, *lf.shape), dtype=lf.dtype) for lf in self.schema.leaves)
            if self._nat is not None:
                self._nat.gather(self._storage_t, slots, outs)
            else:
                sumtree_ref.gather_rows(self._storage, slots, outs)
            if b == 0.0:
                weights = np.ones(n, dtype=np.float64)
            else:  # (N P_i)^-b / max_j (N P_j)^-b == (P_i / min_j P_j)^-b
                weights = np.power(probs * (1.0 / probs.min()), -b)
            return Batch(self.schema.unflatten(list(outs)) if out is None else out, ids, weights, probs)

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

    def update_priorities(self, indices, priorities) -> int:
        """Set new priorities (proportional) or scores (softmax) for sampled ids: O(k log N).

        Raises ValueError naming the offending position for NaN/inf/negative priorities or ids
        never issued; nothing is changed then. Ids already evicted are skipped. Returns how many
        priorities were applied.
        """
        with self._lock:
            if self._nat is not None and self.mode == "proportional" and len(self._lengths) == 1:
                # the whole update in one compiled call (checks first, writes nothing on bad input)
                nid = self._next_id
                tree = self._trees[0]
                res = self._nat.per_update(tree.tree, tree.offs, self._raw, indices, priorities,
                                           max(0, nid - self.capacity), nid, nid, self.capacity, self.capacity,
                                           self.alpha, self.priority_epsilon)
                if res is not None:
                    bad_p, bad_i, applied, top = res
                    if bad_p >= 0:
                        raise ValueError(f"priorities[{bad_p}]={float(priorities[bad_p])!r} is invalid: must be "
                                         f"finite and >= 0")
                    if bad_i >= 0:
                        raise ValueError(f"indices[{bad_i}]={int(indices[bad_i])} is invalid: must be an id this "
                                         f"buffer issued, in [0, {nid})")
                    self.stats["stale_updates"] += len(indices) - applied
                    if top > self._max_priority:
                        self._max_priority = top
                    return applied
            ids = np.ascontiguousarray(indices, dtype=np.int64)
            p = np.ascontiguousarray(priorities, dtype=np.float64)
            if ids.ndim != 1:
                ids = ids.reshape(-1)
            if p.ndim != 1:
                p = p.reshape(-1)
            if ids.shape[0] != p.shape[0]:
                raise ValueError(f"indices has {ids.shape[0]} entries but priorities has {p.shape[0]}")
            if ids.shape[0] == 0:
                return 0
            if self._nat is not None:
                bad, top = self._nat.scan(p)
            else:
                bad = sumtree_ref.first_invalid(p)
                top = float(p.max()) if bad < 0 else 0.0
            if bad >= 0:
                raise ValueError(f"priorities[{bad}]={float(p[bad])!r} is invalid: must be finite and >= 0")
            if self.mode == "softmax":
                self._prepare_scores(top)
            vals = self._transform(p)
            applied = 0
            if len(self._lengths) == 1 and self._nat is not None:
                nid = self._next_id
                tree = self._trees[0]
                bad_i, applied = self._nat.update_priorities(tree.tree, tree.offs, self._raw, ids, p, vals,
                                                             max(0, nid - self.capacity), nid, nid,
                                                             self.capacity, self.capacity)
                if bad_i >= 0:
                    raise ValueError(f"indices[{bad_i}]={int(ids[bad_i])} is invalid: must be an id this "
                                     f"buffer issued, in [0, {nid})")
            elif len(self._lengths) == 1:
                nid = self._next_id
                applied = self._update_region(self._trees[0], ids, p, vals, max(0, nid - self.capacity), nid,
                                              self.capacity)
            else:
                for (lo, hi), L, tree in zip(self._windows(self._next_id), self._lengths, self._trees):
                    applied += self._update_region(tree, ids, p, vals, lo, hi, L)
            self.stats["stale_updates"] += ids.shape[0] - applied
            self._note_priorities(top)
            if self.mode == "softmax":
                self._after_decrease()
            return applied

    def _update_region(self, tree: SumTree, ids, p, vals, lo, hi, L) -> int:
        if self._nat is not None:
            bad_i, applied = self._nat.update_priorities(tree.tree, tree.offs, self._raw, ids, p, vals, lo, hi,
                                                         self._next_id, self.capacity, L)
        else:
            bad = (ids < 0) | (ids >= self._next_id)
            bad_i = int(np.argmax(bad)) if bad.any() else -1
            applied = 0
            if bad_i < 0:
                m = (ids >= lo) & (ids < hi)
                sel = ids[m]
                if self._raw is not None:
                    self._raw[sel % self.capacity] = p[m]
                sumtree_ref.tree_set(tree.tree, tree.offs, sel % L, vals[m])
                applied = int(m.sum())
        if bad_i >= 0:
            raise ValueError(f"indices[{bad_i}]={int(ids[bad_i])} is invalid: must be an id this buffer "
                             f"issued, in [0, {self._next_id})")
        return int(applied)

    def set_temperature(self, temperature: float) -> None:
        """Change the softmax temperature (recomputes every leaf: O(N))."""
        with self._lock:
            t = _check_float("temperature", temperature, gt=0.0)
            if t != self.temperature:
                self.temperature = t
                if self.mode == "softmax" and self._next_id:
                    self._rebuild_trees()

    # -------------------------------------------------------- product API
    def add_experience(self, state, latent_plan, action, reward, next_state, done) -> int:
        """Store one transition scored by plan surprise; return its id.

        The score is ``surprise_weight * ||tau - tau_bar||^2 + reward_weight * |r|`` against the
        EMA plan before this one (which is then folded in). It is the sample's softmax score, or
        its priority in proportional mode.
        """
        with self._lock:
            score = self.surprise.score(latent_plan, reward)
            sample = {"state": state, "latent_plan": latent_plan, "action": action, "reward": reward,
                      "next_state": next_state, "done": done}
            return self.add_one(sample, priority=score)

    def sample_batch(self, batch_size: int, temperature: float | None = None):
        """Product API: ``(experiences, weights)``; ``experiences`` is the sampled pytree (a dict
        for ``add_experience`` data) with the ids under ``experiences["indices"]`` when it is a
        dict. A new ``temperature`` is kept for later calls."""
        with self._lock:
            if temperature is not None:
                self.set_temperature(temperature)
            batch = self.sample(batch_size)
            data = batch.data
            if isinstance(data, dict):
                data = dict(data)
                data["indices"] = batch.indices
            return data, batch.weights

    # ---------------------------------------------------------- persistence
    def _meta(self) -> dict:
        return {
            "format": _FORMAT, "class": type(self).__name__, "lengths": self._lengths, "ratios": self._ratios,
            "mode": self.mode, "alpha": self.alpha, "beta": self.beta, "temperature": self.temperature,
            "priority_epsilon": self.priority_epsilon, "min_experiences": self.min_experiences,
            "next_id": self._next_id, "max_priority": self._max_priority, "max_score": self._max_score,
            "shift": self._shift, "rng": self._rng.bit_generator.state, "stats": self.stats,
            "schema": None if self.schema is None else self.schema.to_json(),
            "surprise": self.surprise.state_json(),
        }

    def save(self, path: str | os.PathLike) -> None:
        """Write contents, priorities, trees, RNG and surprise state to one ``.npz`` (atomically)."""
        with self._lock:
            path = Path(path)
            path.parent.mkdir(parents=True, exist_ok=True)
            raw = self._raw if self._raw is not None else np.zeros(0)
            arrays = {"raw": raw, "meta": np.array(json.dumps(self._meta()))}
            for r, tree in enumerate(self._trees):
                arrays[f"tree_{r}"] = tree.tree
            for j, leaf in enumerate(self._storage):
                arrays[f"leaf_{j}"] = leaf
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".replay-", suffix=".npz")
            try:
                with os.fdopen(fd, "wb") as fh:
                    np.savez(fh, **arrays)
                os.replace(tmp, path)
            except BaseException:
                if os.path.exists(tmp):
                    os.unlink(tmp)
                raise

    def load(self, path: str | os.PathLike) -> None:
        """Restore a buffer written by :meth:`save`: identical contents and sampling state.

        The file must come from a buffer with the same layout (capacity / region sizes).
        """
        with self._lock:
            path = Path(path)
            if not path.is_file():
                raise FileNotFoundError(f"replay file {path} does not exist")
            with np.load(path, allow_pickle=False) as z:
                meta = json.loads(str(z["meta"]))
                if meta.get("format") != _FORMAT:
                    raise ValueError(f"replay file {path} has format {meta.get('format')}, expected {_FORMAT}")
                if meta["lengths"] != self._lengths:
                    raise ValueError(f"replay file {path} has region sizes {meta['lengths']}, this buffer "
                                     f"has {self._lengths}")
                schema = None if meta["schema"] is None else Schema.from_json(meta["schema"])
                trees = [z[f"tree_{r}"] for r in range(len(self._trees))]
                raw = z["raw"]
                leaves = [z[f"leaf_{j}"] for j in range(len(schema.leaves))] if schema else []
            self.mode, self.alpha, self.beta = meta["mode"], meta["alpha"], meta["beta"]
            self.temperature, self.priority_epsilon = meta["temperature"], meta["priority_epsilon"]
            self.min_experiences, self._ratios = meta["min_experiences"], meta["ratios"]
            self._next_id, self._max_priority = meta["next_id"], meta["max_priority"]
            self._max_score, self._shift, self.stats = meta["max_score"], meta["shift"], meta["stats"]
            self._rng.bit_generator.state = meta["rng"]
            self.surprise.load_state_json(meta["surprise"])
            if self._raw is not None:
                self._raw[:] = raw
            for tree, arr in zip(self._trees, trees):
                tree.tree[:] = arr
            if schema is None:
                self.schema, self._storage, self._storage_t = None, [], ()
            else:
                self._set_schema(schema)
                for dst, src in zip(self._storage, leaves):
                    dst[...] = src


__all__ = ["Batch", "MODES", "PrioritizedReplayBuffer", "ReplayNotReadyError", "SchemaError"]
