"""How priorities become sum-tree leaves, and how they change: the buffer's priority rules.

Why a module of its own: the transform (proportional ``(p + eps)^alpha`` or softmax
``exp((s - c) / T)`` with a moving shift c, see ``buffer``'s module docstring) and the batched
priority updates are one concern, separate from storage and sampling; :class:`PriorityRules` is
mixed into :class:`~echo_rl.replay.buffer.PrioritizedReplayBuffer` and reads its trees, raw
priorities and ids.
"""

from __future__ import annotations

import math

import numpy as np

from echo_rl.kernels import sumtree_ref
from echo_rl.kernels.sumtree import SumTree

_REBASE = 30.0  # softmax leaves stay within exp(+-30) of the shift (see buffer's module docstring)


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


class PriorityRules:
    """Priority transform, softmax shift bookkeeping and ``update_priorities`` (a mixin of the buffer)."""

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

    def update_priorities(self, indices, priorities) -> int:
        """Set new priorities (proportional) or scores (softmax) for sampled ids: O(k log N).

        Raises ValueError naming the offending position for NaN/inf/negative priorities or ids
        never issued; nothing is changed then. Ids already evicted are skipped. Returns how many
        priorities were applied.
        """
        with self._lock:
            if self._per_native:
                # the whole update in one compiled call (checks first, writes nothing on bad input);
                # this runs once per learner step, so the Python around it is kept to the minimum
                nid, cap, tree = self._next_id, self.capacity, self._trees[0]
                res = self._nat.per_update(tree.tree, tree.offs, self._raw, indices, priorities,
                                           nid - cap if nid > cap else 0, nid, nid, cap, cap, self.alpha,
                                           self.priority_epsilon)
                if res is not None:
                    bad_p, bad_i, applied, top = res
                    if bad_p >= 0 or bad_i >= 0:
                        self._raise_bad_update(indices, priorities, bad_p, bad_i)
                    if applied != len(indices):
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

    def _raise_bad_update(self, indices, priorities, bad_p: int, bad_i: int) -> None:
        if bad_p >= 0:
            raise ValueError(f"priorities[{bad_p}]={float(priorities[bad_p])!r} is invalid: must be finite and >= 0")
        raise ValueError(f"indices[{bad_i}]={int(indices[bad_i])} is invalid: must be an id this buffer issued, in "
                         f"[0, {self._next_id})")

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
