"""Token-sequence kernels: shared-prefix length (for KV reuse) and stable state hashes.

``prefix_match_batch`` compares int64/int32 candidates in C when the kernels are loaded (early
exit at the first mismatch, no per-candidate Python call); other candidates go through numpy.
"""

from __future__ import annotations

import hashlib
import struct

import numpy as np

from echo_rl.kernels._backend import resolve


def _tokens(x, name: str) -> np.ndarray:
    arr = np.asarray(x)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a 1-D token sequence, got shape {arr.shape}")
    if arr.size and arr.dtype.kind not in "iub":
        raise ValueError(f"{name} must hold integer token ids, got dtype {arr.dtype}")
    return arr


def prefix_match(a, b) -> int:
    """Length of the longest common prefix of two token-id sequences."""
    x, y = _tokens(a, "a"), _tokens(b, "b")
    n = min(x.size, y.size)
    if n == 0:
        return 0
    diff = np.flatnonzero(x[:n] != y[:n])
    return int(diff[0]) if diff.size else n


def prefix_match_batch(query, candidates, *, use_native: bool | None = None) -> np.ndarray:
    """``prefix_match(query, c)`` for each candidate sequence (int64 array)."""
    q = _tokens(query, "query")
    nat = resolve(use_native)
    if nat is not None and (q.dtype.kind in "ib" or (q.dtype.kind == "u" and q.dtype.itemsize < 8)):
        cands = candidates if isinstance(candidates, (list, tuple)) else list(candidates)
        out = np.empty(len(cands), np.int64)
        nat.prefix_match(np.ascontiguousarray(q, dtype=np.int64), cands, out)
        for i in np.flatnonzero(out < 0):  # lists, other dtypes, bad shapes: the numpy path
            out[i] = prefix_match(q, _tokens(cands[i], f"candidates[{i}]"))
        return out
    return np.array([prefix_match(q, _tokens(c, f"candidates[{i}]")) for i, c in enumerate(candidates)],
                    dtype=np.int64)


def _encode(state) -> bytes:
    if isinstance(state, str):
        return b"s" + state.encode("utf-8")
    if isinstance(state, (bytes, bytearray, memoryview)):
        return b"b" + bytes(state)
    if isinstance(state, (bool, np.bool_)):
        return b"?" + (b"\x01" if state else b"\x00")
    if isinstance(state, (int, np.integer)):
        return b"i" + int(state).to_bytes(16, "little", signed=True)
    if isinstance(state, (float, np.floating)):
        return b"f" + struct.pack("<d", float(state))
    if isinstance(state, dict):
        parts = [b"d"]
        for k in sorted(state, key=str):
            ek, ev = _encode(str(k)), _encode(state[k])
            parts += [len(ek).to_bytes(8, "little"), ek, len(ev).to_bytes(8, "little"), ev]
        return b"".join(parts)
    if isinstance(state, (list, tuple)) and not all(isinstance(v, (int, np.integer)) and
                                                   not isinstance(v, bool) for v in state):
        parts = [b"l"]
        for v in state:
            ev = _encode(v)
            parts += [len(ev).to_bytes(8, "little"), ev]
        return b"".join(parts)
    arr = np.asarray(state)
    if arr.dtype == object:
        raise TypeError(f"state_hash cannot hash objects of type {type(state).__name__}")
    if arr.dtype.kind in "iu":  # token lists and int arrays hash alike whatever the int width
        arr = arr.astype(np.int64)
    arr = np.ascontiguousarray(arr)
    head = f"a{arr.dtype.newbyteorder('<').str}{arr.shape}".encode()
    return head + arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()


def state_hash(state) -> int:
    """A stable 64-bit hash (BLAKE2b) of a state: array, token list, str, bytes, number or dict.

    Stable across processes and runs (unlike ``hash()``), so it can key caches and dedup tables.
    Integer arrays hash by value whatever their width; other arrays by dtype, shape and bytes.
    """
    return int.from_bytes(hashlib.blake2b(_encode(state), digest_size=8).digest(), "little")


def state_hash_batch(states) -> np.ndarray:
    """``state_hash`` of each row of an array (or each item of a sequence), as uint64."""
    return np.fromiter((state_hash(s) for s in states), dtype=np.uint64)
