"""Numpy reference of the sum-tree kernels (the compiled ones in ``native/sumtree.cpp`` must agree).

Layout: an 8-ary tree in one float64 array, level by level from the root. Each node's 8 children
are contiguous and 64-byte aligned — one cache line — so a descent or an update touches one line
per level and the tree over 2^20 leaves is 7 levels deep instead of 20. ``offs[l]`` is where
level l starts (root: ``offs[0] = 0``, one value, the total). Level 1 always has 8 slots; the
root's real fan-out is ``r = ceil(capacity / 8^(d-1))`` and level l >= 2 holds ``r * 8^(l-1)``
nodes, so leaves (level d) number fewer than 2x the capacity (unused ones stay 0). Node j of
level l has children ``8j .. 8j+7`` of level l+1.

Every parent is recomputed as the pairwise sum ``((c0+c1)+(c2+c3)) + ((c4+c5)+(c6+c7))`` of its
8 children (never updated by deltas, so sums do not drift) — the same order in both backends, so
both give bit-identical trees. Descent uses sequential prefix sums, which may differ from the
parent's value in the last bit; the zero-child rule below keeps such rounding harmless.

Descent rule (both backends), at a node with children c_0..c_7 and running prefix sums
S_1 = c_0, S_2 = S_1 + c_1, ...: a mass m goes to child j = #{i < 7 : m >= S_(i+1)}; if c_j is 0
(only possible when rounding pushed m to the node's total) j steps back to the last positive
child before it; then m -= S_j (S_0 = 0). Zero-priority leaves are therefore never drawn.
"""

from __future__ import annotations

import numpy as np

B = 8
ALIGN = 8  # elements: 64 bytes


def make_layout(capacity: int) -> tuple[np.ndarray, int]:
    """Level offsets and total length for ``capacity`` leaves."""
    d = 1
    while B**d < capacity:
        d += 1
    r = -(-capacity // B ** (d - 1))
    counts = [1, B] + [r * B ** (lvl - 1) for lvl in range(2, d + 1)]
    offs = [0, ALIGN]
    for lvl in range(1, d):
        offs.append(offs[-1] + counts[lvl])
    return np.array(offs, dtype=np.int64), offs[-1] + counts[d]


def aligned_zeros(n: int) -> np.ndarray:
    """Zeroed float64[n] whose data start on a 64-byte boundary (so child groups are lines)."""
    buf = np.zeros(n + ALIGN, dtype=np.float64)
    shift = (-buf.ctypes.data % 64) // 8
    return buf[shift: shift + n]


def _counts(tree: np.ndarray, offs: np.ndarray) -> list[int]:
    d = len(offs) - 1
    return [int(offs[lvl + 1] - offs[lvl]) for lvl in range(d)] + [int(tree.shape[0] - offs[d])]


def _group_sum(tree: np.ndarray, child_off: int, nodes: np.ndarray) -> np.ndarray:
    """((c0+c1)+(c2+c3)) + ((c4+c5)+(c6+c7)): the compiled kernels add in this same order."""
    c = tree[child_off + nodes[:, None] * B + np.arange(B)]
    return ((c[:, 0] + c[:, 1]) + (c[:, 2] + c[:, 3])) + ((c[:, 4] + c[:, 5]) + (c[:, 6] + c[:, 7]))


def tree_build(tree: np.ndarray, offs: np.ndarray) -> None:
    """Recompute every parent from the leaves, level by level."""
    counts = _counts(tree, offs)
    d = len(offs) - 1
    for lvl in range(d - 1, -1, -1):
        groups = counts[lvl + 1] // B
        tree[offs[lvl]: offs[lvl] + groups] = _group_sum(tree, int(offs[lvl + 1]), np.arange(groups))


def tree_set(tree: np.ndarray, offs: np.ndarray, leaves: np.ndarray, values: np.ndarray) -> None:
    """Set leaf values (later duplicates win) and refresh their ancestors, one level at a time."""
    d = len(offs) - 1
    leaves = np.asarray(leaves, dtype=np.int64)
    tree[offs[d] + leaves] = values
    nodes = leaves
    for lvl in range(d - 1, -1, -1):
        nodes = np.unique(nodes // B)
        tree[offs[lvl] + nodes] = _group_sum(tree, int(offs[lvl + 1]), nodes)


def tree_set_one(tree: np.ndarray, offs: np.ndarray, leaf: int, value: float) -> None:
    """One leaf, walked up with Python floats (same IEEE additions as ``_group_sum``, no array ops)."""
    d = len(offs) - 1
    tree[offs[d] + leaf] = value
    node = int(leaf)
    for lvl in range(d - 1, -1, -1):
        node //= B
        base = int(offs[lvl + 1]) + node * B
        c = tree[base: base + B].tolist()
        tree[offs[lvl] + node] = ((c[0] + c[1]) + (c[2] + c[3])) + ((c[4] + c[5]) + (c[6] + c[7]))


def tree_set_range(tree: np.ndarray, offs: np.ndarray, start: int, values: np.ndarray) -> None:
    """Set the contiguous leaves ``start .. start+len(values)-1`` (no wrap) and their ancestors."""
    n = len(values)
    if n == 0:
        return
    d = len(offs) - 1
    tree[offs[d] + start: offs[d] + start + n] = values
    lo, hi = start, start + n - 1
    for lvl in range(d - 1, -1, -1):
        lo, hi = lo // B, hi // B
        nodes = np.arange(lo, hi + 1)
        tree[offs[lvl] + nodes] = _group_sum(tree, int(offs[lvl + 1]), nodes)


def tree_find(tree: np.ndarray, offs: np.ndarray, masses: np.ndarray) -> np.ndarray:
    """Leaf index holding each prefix-sum mass, all walks advanced together level by level."""
    d = len(offs) - 1
    m = np.array(masses, dtype=np.float64, copy=True)
    node = np.zeros(m.shape[0], dtype=np.int64)
    cols = np.arange(B)
    rows = np.arange(m.shape[0])
    for lvl in range(d):
        ch = tree[offs[lvl + 1] + node[:, None] * B + cols]
        S = np.cumsum(ch, axis=1)  # sequential, as the compiled loop adds
        j = (m[:, None] >= S[:, : B - 1]).sum(axis=1)
        last_pos = np.maximum.accumulate(np.where(ch > 0, cols, -1), axis=1)
        j = np.where(ch[rows, j] > 0, j, last_pos[rows, j])
        m = m - np.where(j > 0, S[rows, j - 1], 0.0)
        node = node * B + j
    return node


def tree_sample(tree: np.ndarray, offs: np.ndarray, uniforms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Stratified draws: stratum k gets mass ``(k + u_k) * total / n``; returns (leaves, values)."""
    u = np.asarray(uniforms, dtype=np.float64)
    n = u.shape[0]
    total = tree[0]
    masses = (np.arange(n, dtype=np.float64) + u) * (total / n)
    leaves = tree_find(tree, offs, masses)
    return leaves, tree[offs[-1] + leaves]


def first_invalid(values: np.ndarray) -> int:
    """Index of the first NaN, inf or negative value, or -1."""
    bad = ~np.isfinite(values) | (values < 0)
    return int(np.argmax(bad)) if bad.any() else -1


def gather_rows(srcs, rows: np.ndarray, outs) -> None:
    """``outs[j][:] = srcs[j][rows]`` for each leaf array j."""
    for s, o in zip(srcs, outs):
        np.take(s, rows, axis=0, out=o, mode="clip")
