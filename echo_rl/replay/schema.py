"""Pytree schemas for replay storage: nested dicts/tuples/lists of arrays -> named flat leaves.

A schema fixes, for every leaf, its path name (``"obs"``, ``"state/pos"``, ``"plan/0"``), dtype and
per-sample shape. Samples are checked against it before anything is written, so a bad sample
never leaves a half-written row. Dict keys are taken in sorted order, so two dicts with the same
keys flatten the same way whatever their insertion order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


class SchemaError(ValueError):
    """A sample does not match the buffer's schema; the message names the leaf."""


def _flatten(node: Any, prefix: str, names: list, leaves: list):
    if isinstance(node, dict):
        keys = sorted(node, key=str)
        return ("dict", [str(k) for k in keys],
                [_flatten(node[k], f"{prefix}{k}/", names, leaves) for k in keys])
    if isinstance(node, (tuple, list)) and not _is_leaf_sequence(node):
        kind = "tuple" if isinstance(node, tuple) else "list"
        return (kind, len(node), [_flatten(v, f"{prefix}{i}/", names, leaves) for i, v in enumerate(node)])
    names.append(prefix[:-1] if prefix else "value")
    leaves.append(node)
    return None


def _is_leaf_sequence(node) -> bool:
    """A list/tuple of plain numbers is one array leaf (e.g. ``[0.1, 0.2]``), not a subtree."""
    return len(node) > 0 and all(isinstance(v, (int, float, bool, np.number, np.bool_)) for v in node)


def _unflatten(treedef, it):
    if treedef is None:
        return next(it)
    kind, meta, children = treedef
    vals = [_unflatten(c, it) for c in children]
    if kind == "dict":
        return dict(zip(meta, vals))
    return tuple(vals) if kind == "tuple" else list(vals)


def _treedef_to_json(t):
    return None if t is None else [t[0], t[1], [_treedef_to_json(c) for c in t[2]]]


def _treedef_from_json(t):
    return None if t is None else (t[0], t[1], [_treedef_from_json(c) for c in t[2]])


@dataclass(frozen=True)
class Leaf:
    name: str
    dtype: np.dtype
    shape: tuple


class Schema:
    """Leaf names, dtypes and shapes of one sample, plus its tree structure."""

    def __init__(self, treedef, leaves: list[Leaf]):
        self.treedef = treedef
        self.leaves = leaves
        self.names = [lf.name for lf in leaves]
        # flat dict of leaves: the compiled single-add path reads it by key directly
        flat = treedef is not None and treedef[0] == "dict" and all(c is None for c in treedef[2])
        self.flat_keys = tuple(treedef[1]) if flat else None
        self.row_bytes = sum(int(np.prod(lf.shape, dtype=np.int64)) * lf.dtype.itemsize for lf in leaves)

    # -- construction -------------------------------------------------------
    @classmethod
    def from_example(cls, example: Any, batched: bool = False) -> "Schema":
        """Schema of one sample (or of one row of a batch when ``batched``)."""
        names: list[str] = []
        raw: list = []
        treedef = _flatten(example, "", names, raw)
        leaves = []
        for name, x in zip(names, raw):
            arr = np.asarray(x)
            if arr.dtype == object or arr.dtype.kind in "USV":
                raise SchemaError(f"leaf '{name}' has unsupported type {type(x).__name__} "
                                  f"(dtype {arr.dtype}); store numeric arrays")
            if batched:
                if arr.ndim == 0:
                    raise SchemaError(f"leaf '{name}' of a batch must have a leading batch axis")
                shape = arr.shape[1:]
            else:
                shape = arr.shape
            leaves.append(Leaf(name, arr.dtype, tuple(int(s) for s in shape)))
        return cls(treedef, leaves)

    def to_json(self) -> dict:
        return {"treedef": _treedef_to_json(self.treedef),
                "leaves": [[lf.name, lf.dtype.str, list(lf.shape)] for lf in self.leaves]}

    @classmethod
    def from_json(cls, data: dict) -> "Schema":
        leaves = [Leaf(n, np.dtype(d), tuple(s)) for n, d, s in data["leaves"]]
        return cls(_treedef_from_json(data["treedef"]), leaves)

    def __eq__(self, other) -> bool:
        return isinstance(other, Schema) and self.to_json() == other.to_json()

    def describe(self) -> str:
        return ", ".join(f"{lf.name}: {lf.dtype}{list(lf.shape)}" for lf in self.leaves)

    # -- storage ------------------------------------------------------------
    def allocate(self, capacity: int) -> list[np.ndarray]:
        """Zeroed struct-of-arrays storage (pages are touched only when written)."""
        return [np.zeros((capacity, *lf.shape), dtype=lf.dtype) for lf in self.leaves]

    def unflatten(self, leaves: list) -> Any:
        return _unflatten(self.treedef, iter(leaves))

    # -- checks -------------------------------------------------------------
    def flatten(self, sample: Any) -> list:
        names: list[str] = []
        raw: list = []
        treedef = _flatten(sample, "", names, raw)
        if names != self.names or _treedef_to_json(treedef) != _treedef_to_json(self.treedef):
            missing = [n for n in self.names if n not in names]
            extra = [n for n in names if n not in self.names]
            if missing:
                raise SchemaError(f"sample is missing leaf '{missing[0]}'; schema: {self.describe()}")
            if extra:
                raise SchemaError(f"sample has unknown leaf '{extra[0]}'; schema: {self.describe()}")
            raise SchemaError(f"sample structure differs from the schema; schema: {self.describe()}")
        return raw

    def _convert(self, lf: Leaf, x: Any, batch: int | None) -> np.ndarray:
        """Arrays must carry the schema dtype exactly; Python numbers/lists are cast same-kind."""
        want = lf.shape if batch is None else (batch, *lf.shape)
        if isinstance(x, (np.ndarray, np.generic)):
            arr = np.asarray(x)
            if arr.dtype != lf.dtype:
                raise SchemaError(f"leaf '{lf.name}' has dtype {arr.dtype}, schema expects {lf.dtype}")
        else:
            try:
                arr = np.asarray(x)
            except (TypeError, ValueError) as exc:
                raise SchemaError(f"leaf '{lf.name}' cannot be read as an array: {exc}") from None
            if arr.dtype == object or not np.can_cast(arr.dtype, lf.dtype, "same_kind"):
                raise SchemaError(f"leaf '{lf.name}' has dtype {arr.dtype}, schema expects {lf.dtype}")
            arr = arr.astype(lf.dtype, copy=False)
        if arr.shape != want:
            what = "shape" if batch is None else "batch shape"
            raise SchemaError(f"leaf '{lf.name}' has {what} {arr.shape}, schema expects {want}")
        return arr

    def check_one(self, sample: Any) -> list[np.ndarray]:
        """Flatten and convert one sample; raises SchemaError naming the first bad leaf."""
        raw = self.flatten(sample)
        return [self._convert(lf, x, None) for lf, x in zip(self.leaves, raw)]

    def _fast_batch(self, raw: list) -> tuple[int, list[np.ndarray]] | None:
        """(n, raw) when every leaf is already an ndarray of the right dtype and row shape."""
        n = -1
        for lf, x in zip(self.leaves, raw):
            if type(x) is not np.ndarray:
                return None
            dt = x.dtype
            if dt is not lf.dtype and dt != lf.dtype:  # identity first: dtypes are usually shared
                return None
            shape = x.shape
            if not shape or shape[1:] != lf.shape:
                return None
            if n < 0:
                n = shape[0]
            elif shape[0] != n:
                return None
        return n, raw

    def check_batch(self, batch: Any) -> tuple[int, list[np.ndarray]]:
        """Flatten and convert a batch (leading axis n on every leaf); returns (n, leaves)."""
        keys = self.flat_keys
        if keys is not None and type(batch) is dict and len(batch) == len(keys):
            try:  # flat dict with the schema's keys: skip the tree walk
                raw = [batch[k] for k in keys]
            except KeyError:
                raw = self.flatten(batch)  # raises naming the missing/unknown leaf
            fast = self._fast_batch(raw)
            if fast is not None:
                return fast
        else:
            raw = self.flatten(batch)
        n = None
        for lf, x in zip(self.leaves, raw):
            shape = np.shape(x)
            if len(shape) == 0:
                raise SchemaError(f"leaf '{lf.name}' of a batch must have a leading batch axis")
            if n is None:
                n = shape[0]
            elif shape[0] != n:
                raise SchemaError(f"leaf '{lf.name}' has {shape[0]} rows, leaf '{self.names[0]}' has {n}")
        return n or 0, [self._convert(lf, x, n) for lf, x in zip(self.leaves, raw)]
