"""Which stored samples a draw returns: prioritized, uniform or FIFO, behind one interface.

Why: Reverb and echo users pick the selection rule per table — prioritized for PER, uniform for
DQN-style replay, FIFO for on-policy queues (each sample delivered once, in order, like echo's
batcher). The buffer owns storage, ids and sum trees; a :class:`Sampler` only turns "n samples,
please" into ids, ring slots and draw probabilities, under the buffer's lock.

* ``prioritized`` — the sum-tree draw (stratified; see ``buffer``'s module docstring);
* ``uniform`` — every live sample equally likely, with replacement; P(i) = 1/size;
* ``fifo`` — the n oldest samples not yet drawn, in id order, each drawn once (a read cursor that
  skips samples evicted before they were read, counted in ``dropped``); fewer than n unread raises
  :class:`ReplayNotReadyError`. Its batches are a contiguous id range, so the buffer can hand them
  out as views into the ring (``sample(n, copy=False)``). P(i) = 1.
"""

from __future__ import annotations

import math

import numpy as np

from echo_rl.kernels import sumtree_ref


class ReplayNotReadyError(RuntimeError):
    """Sampling was asked for before enough samples were stored (or, FIFO, unread)."""


class Sampler:
    """Selection rule of a buffer. ``draw`` runs under the buffer's lock and returns
    ``(ids, slots, probabilities)``; ``contiguous`` says whether its ids form one consecutive range."""

    name = ""
    contiguous = False

    def draw(self, buf, n: int):
        raise NotImplementedError

    def state(self) -> dict:
        return {}

    def load_state(self, state: dict) -> None:
        pass


class PrioritizedSampler(Sampler):
    name = "prioritized"

    def draw(self, buf, n: int):
        totals = [t.total for t in buf._trees]
        counts, ratios = region_counts(buf, n, totals)
        ids_parts, slot_parts, prob_parts = [], [], []
        for k, ratio, total, tree, L, (lo, _hi) in zip(counts, ratios, totals, buf._trees, buf._lengths,
                                                      buf._windows(buf._next_id)):
            if k == 0:
                continue
            u = buf._rng.random(k)
            if buf._nat is not None:
                ids = np.empty(k, dtype=np.int64)
                slots = np.empty(k, dtype=np.int64)
                probs = np.empty(k, dtype=np.float64)
                buf._nat.sample_region(tree.tree, tree.offs, u, lo, L, buf.capacity, ratio / total, ids, slots, probs)
            else:
                leaves, vals = sumtree_ref.tree_sample(tree.tree, tree.offs, u)
                ids = lo + (leaves - lo) % L
                slots = ids % buf.capacity
                probs = vals * (ratio / total)
            ids_parts.append(ids)
            slot_parts.append(slots)
            prob_parts.append(probs)
        if len(ids_parts) == 1:
            return ids_parts[0], slot_parts[0], prob_parts[0]
        return tuple(np.concatenate(x) for x in (ids_parts, slot_parts, prob_parts))


def region_counts(buf, n: int, totals: list[float]):
    """Samples per age region: ``n * ratio`` with randomized rounding (E[n_r] = n * ratio_r exactly)."""
    ratios = [r if t > 0 else 0.0 for r, t in zip(buf._ratios, totals)]
    s = sum(ratios)
    if s <= 0:  # the configured split puts all mass on empty regions: use what is there
        ratios = [1.0 if t > 0 else 0.0 for t in totals]
        s = sum(ratios)
    if s <= 0:
        raise ValueError("cannot sample: all priorities are zero")
    ratios = [r / s for r in ratios]
    if len(ratios) == 1:
        return [n], ratios
    counts = [int(math.floor(n * r)) for r in ratios]
    rest = n - sum(counts)
    if rest:
        frac = np.array([n * r - c for r, c in zip(ratios, counts)])
        frac = frac / frac.sum()
        for j in buf._rng.choice(len(ratios), size=rest, replace=False, p=frac):
            counts[j] += 1
    return counts, ratios


class UniformSampler(Sampler):
    name = "uniform"

    def draw(self, buf, n: int):
        hi = buf._next_id
        lo = max(0, hi - buf.capacity)
        ids = buf._rng.integers(lo, hi, size=n, dtype=np.int64)
        return ids, ids % buf.capacity, np.full(n, 1.0 / (hi - lo))


class FifoSampler(Sampler):
    name = "fifo"
    contiguous = True

    def __init__(self):
        self.next = 0  # id of the oldest sample not yet drawn
        self.dropped = 0  # samples evicted before they were drawn

    def unread(self, buf) -> int:
        return buf._next_id - max(self.next, buf._next_id - buf.capacity)

    def draw(self, buf, n: int):
        hi = buf._next_id
        lo = max(self.next, hi - buf.capacity, 0)
        if hi - lo < n:
            raise ReplayNotReadyError(f"FIFO sampler: {hi - lo} unread samples, sample({n}) needs {n}")
        self.dropped += lo - self.next
        self.next = lo + n
        ids = np.arange(lo, lo + n, dtype=np.int64)
        return ids, ids % buf.capacity, np.ones(n)

    def state(self) -> dict:
        return {"next": self.next, "dropped": self.dropped}

    def load_state(self, state: dict) -> None:
        self.next, self.dropped = int(state["next"]), int(state["dropped"])


SAMPLERS = {"prioritized": PrioritizedSampler, "uniform": UniformSampler, "fifo": FifoSampler}


def make_sampler(name) -> Sampler:
    """A sampler by name (or a :class:`Sampler` instance, returned as is)."""
    if isinstance(name, Sampler):
        return name
    if name not in SAMPLERS:
        raise ValueError(f"sampler={name!r} is invalid: allowed: {', '.join(SAMPLERS)}")
    return SAMPLERS[name]()


__all__ = ["FifoSampler", "PrioritizedSampler", "ReplayNotReadyError", "SAMPLERS", "Sampler", "UniformSampler",
           "make_sampler"]
