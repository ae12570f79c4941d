"""Saving and restoring a replay buffer: one ``.npz`` per buffer, written atomically and fsynced.

Why a module of its own: the replay server checkpoints through it (its stream table rides in
``extra``), so a checkpoint must survive the process being killed at any instant — the file is
written beside the target, fsynced, then renamed over it; a reader sees the old or the new file,
never a torn one.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import numpy as np

from echo_rl.replay.schema import Schema

FORMAT = 1


def buffer_meta(buf) -> dict:
    """A buffer's sampling state as JSON-able metadata: everything but the arrays (data, raw priorities, trees)."""
    return {
        "format": FORMAT, "class": type(buf).__name__, "lengths": buf._lengths, "ratios": buf._ratios,
        "mode": buf.mode, "alpha": buf.alpha, "beta": buf.beta, "temperature": buf.temperature,
        "priority_epsilon": buf.priority_epsilon, "min_experiences": buf.min_experiences,
        "next_id": buf._next_id, "max_priority": buf._max_priority, "max_score": buf._max_score,
        "shift": buf._shift, "rng": buf._rng.bit_generator.state, "stats": buf.stats,
        "schema": None if buf.schema is None else buf.schema.to_json(),
        "surprise": buf.surprise.state_json(),
        "sampler": buf.sampler.name, "sampler_state": buf.sampler.state(),
        "rate_limiter": None if buf.rate_limiter is None else buf.rate_limiter.state(),
    }


def save_buffer(buf, path, extra: dict | None = None) -> None:
    with buf._lock:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        meta = buffer_meta(buf)
        meta["extra"] = extra or {}
        raw = buf._raw if buf._raw is not None else np.zeros(0)
        arrays = {"raw": raw, "meta": np.array(json.dumps(meta))}
        for r, tree in enumerate(buf._trees):
            arrays[f"tree_{r}"] = tree.tree
        for j, leaf in enumerate(buf._storage):
            arrays[f"leaf_{j}"] = leaf
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".replay-", suffix=".npz")
        try:
            with os.fdopen(fd, "wb") as fh:
                np.savez(fh, **arrays)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise


def load_buffer(buf, path) -> dict:
    with buf._lock:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"replay file {path} does not exist")
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(str(z["meta"]))
            if meta.get("format") != FORMAT:
                raise ValueError(f"replay file {path} has format {meta.get('format')}, expected {FORMAT}")
            if meta["lengths"] != buf._lengths:
                raise ValueError(f"replay file {path} has region sizes {meta['lengths']}, this buffer "
                                 f"has {buf._lengths}")
            schema = None if meta["schema"] is None else Schema.from_json(meta["schema"])
            trees = [z[f"tree_{r}"] for r in range(len(buf._trees))]
            raw = z["raw"]
            leaves = [z[f"leaf_{j}"] for j in range(len(schema.leaves))] if schema else []
        buf.mode, buf.alpha, buf.beta = meta["mode"], meta["alpha"], meta["beta"]
        buf.temperature, buf.priority_epsilon = meta["temperature"], meta["priority_epsilon"]
        buf.min_experiences, buf._ratios = meta["min_experiences"], meta["ratios"]
        buf._next_id, buf._max_priority = meta["next_id"], meta["max_priority"]
        buf._max_score, buf._shift, buf.stats = meta["max_score"], meta["shift"], meta["stats"]
        buf._rng.bit_generator.state = meta["rng"]
        buf.surprise.load_state_json(meta["surprise"])
        if meta.get("sampler", "prioritized") == buf.sampler.name:
            buf.sampler.load_state(meta.get("sampler_state") or {})
        if buf.rate_limiter is not None:
            lim = meta.get("rate_limiter") or {"inserts": buf._next_id, "samples": 0}
            buf.rate_limiter.bind(buf.capacity, lim["inserts"], lim["samples"])
        if buf._raw is not None:
            buf._raw[:] = raw
        for tree, arr in zip(buf._trees, trees):
            tree.tree[:] = arr
        if schema is None:
            buf.schema, buf._storage, buf._storage_t = None, [], ()
        else:
            buf._set_schema(schema)
            for dst, src in zip(buf._storage, leaves):
                dst[...] = src
        return meta.get("extra") or {}
