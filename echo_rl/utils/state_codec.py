"""A checkpoint's rollout state on disk without pickle: ``rollout.json`` + ``rollout.npz``.

Opening a run directory (``train --resume``) must never run code from it. Plain
data (None, bool, int, float, str, list, tuple, dict, numpy arrays and scalars)
and a short list of echo_rl classes (rebuilt through their own ``__setstate__``
from plain data) are written as JSON plus an ``allow_pickle=False`` NPZ and read
back without executing anything from the files. MiniGrid envs arrive as plain
data too (``echo_rl.environments.minigrid_state``).

What has no plain form (``bytes`` a backend unpickles itself, objects of other
classes, MiniGrid levels with extra state) is still written, but then the
checkpoint is signed: HMAC-SHA256 over both files under a per-user key kept
outside every run directory (``$ECHO_RL_HOME/run_key``, else
``~/.config/echo_rl/run_key``, created 0600 on first use). Reading such a part
needs that signature to match; otherwise it is refused (:class:`UntrustedState`).

Every unpickle of checkpoint data in echo_rl goes through :func:`loads`, which takes only :class:`Signed`
bytes: what this process pickled itself (env snapshots, Ray workers' states) or what :func:`read` returned
after the signature matched. A blob spelled any other way in ``rollout.json`` (an array, a numpy bytes
scalar) is plain data and is refused there, never unpickled.
"""

from __future__ import annotations

import hashlib
import hmac
import importlib
import io
import json
import os
import pickle
import secrets
from pathlib import Path
from typing import Any

import numpy as np

from echo_rl.config import ConfigError
from echo_rl.utils.jail import Jail, check_npz

FORMAT, VERSION = "echo-rl-rollout", 1
JSON_NAME, NPZ_NAME, SIG_NAME = "rollout.json", "rollout.npz", "rollout.sig"
# class name -> module: the only classes a rollout file may instantiate (by name, never by a path from the file)
_CLASSES = {"VectorRolloutCollector": "echo_rl.vector.rollout", "RolloutBuffer": "echo_rl.vector.rollout",
            "EpisodeStats": "echo_rl.vector.rollout", "_ActorState": "echo_rl.vector.echo.agent"}


class UntrustedState(ConfigError):
    """Opaque (pickled) data whose signature is missing or does not match this user's run key."""


class Signed(bytes):
    """Pickled bytes this user's code made: by this process, or read back from a checkpoint signed with the
    user's run key. The only kind :func:`loads` unpickles (pickling keeps the type across processes)."""


def dumps(value: Any) -> Signed:
    """``value`` pickled, as :class:`Signed` bytes (a checkpoint that stores them is signed)."""
    return Signed(pickle.dumps(value, pickle.HIGHEST_PROTOCOL))


def loads(blob: Any, what: str) -> Any:
    """Unpickle ``blob`` only if it is :class:`Signed`; anything else (bytes, arrays, numpy scalars from a file)
    is refused with :class:`UntrustedState` naming ``what``, before a byte of it is read."""
    if type(blob) is not Signed:
        raise UntrustedState(f"{what} is pickled data that is not signed with this user's run key "
                             f"({type(blob).__name__}); it is never unpickled (it could run code)")
    return pickle.loads(blob)


def key_path() -> Path:
    home = os.environ.get("ECHO_RL_HOME")
    return Path(home) / "run_key" if home else Path.home() / ".config" / "echo_rl" / "run_key"


def _key(create: bool) -> bytes | None:
    path = key_path()
    if create and not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass  # another process made it first
        else:
            with os.fdopen(fd, "w") as fh:
                fh.write(secrets.token_hex(32) + "\n")
    try:
        if path.stat().st_mode & 0o022:
            raise UntrustedState(f"run key {path} is writable by others; chmod 600 it")
        return bytes.fromhex(path.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


def _signature(key: bytes, json_bytes: bytes, npz_bytes: bytes) -> str:
    mac = hmac.new(key, digestmod=hashlib.sha256)
    for part in (json_bytes, npz_bytes):
        mac.update(len(part).to_bytes(8, "little"))
        mac.update(part)
    return mac.hexdigest()


class _Encoder:
    def __init__(self):
        self.arrays: dict[str, np.ndarray] = {}
        self.opaque = False

    def _put(self, array: np.ndarray) -> str:
        key = f"a{len(self.arrays)}"
        self.arrays[key] = array
        return key

    def _pickled(self, value: Any) -> dict:
        self.opaque = True
        return {"$pickle": self._put(np.frombuffer(dumps(value), np.uint8))}

    def encode(self, x: Any) -> Any:
        if x is None or type(x) in (bool, int, float, str):
            return x
        if type(x) is list:
            return [self.encode(v) for v in x]
        if type(x) is tuple:
            return {"$tuple": [self.encode(v) for v in x]}
        if type(x) is dict:
            return {"$dict": [[self.encode(k), self.encode(v)] for k, v in x.items()]}
        if type(x) is np.ndarray and not x.dtype.hasobject:
            return {"$array": self._put(x)}
        if isinstance(x, np.generic) and not isinstance(x, np.object_):
            return {"$scalar": self._put(np.asarray(x))}
        if type(x) in (bytes, bytearray, Signed):
            self.opaque = True  # a consumer may unpickle them (the Ray backend's worker states do)
            return {"$bytes": self._put(np.frombuffer(bytes(x), np.uint8))}
        name = type(x).__name__
        if _CLASSES.get(name) == type(x).__module__:
            state = x.__getstate__() if hasattr(x, "__getstate__") else vars(x)
            return {"$object": name, "state": self.encode(state)}
        return self._pickled(x)


class _Decoder:
    def __init__(self, arrays: dict, trust):
        self.arrays, self.trust = arrays, trust

    def _array(self, key: Any) -> np.ndarray:
        if type(key) is not str or key not in self.arrays:
            raise ValueError(f"array {key!r} is not in {NPZ_NAME}")
        return self.arrays[key]

    def decode(self, n: Any) -> Any:
        if n is None or type(n) in (bool, int, float, str):
            return n
        if type(n) is list:
            return [self.decode(v) for v in n]
        if type(n) is not dict or not n:
            raise ValueError(f"unexpected node {str(n)[:60]!r}")
        tag = next(iter(n))
        if tag == "$tuple" and type(n[tag]) is list:
            return tuple(self.decode(v) for v in n[tag])
        if tag == "$dict" and type(n[tag]) is list:
            return {self.decode(k): self.decode(v) for k, v in n[tag]}
        if tag == "$array":
            return np.array(self._array(n[tag]))
        if tag == "$scalar":
            return self._array(n[tag])[()]
        if tag in ("$bytes", "$pickle"):
            self.trust()  # raises UntrustedState unless the run's signature matches
            blob = Signed(self._array(n[tag]).tobytes())  # the signature matched: this user's own bytes
            return blob if tag == "$bytes" else loads(blob, f"{JSON_NAME} node {tag}")
        if tag == "$object" and n[tag] in _CLASSES:
            cls = getattr(importlib.import_module(_CLASSES[n[tag]]), n[tag])
            state = self.decode(n.get("state"))
            obj = cls.__new__(cls)
            if hasattr(cls, "__setstate__"):
                obj.__setstate__(state)
            elif type(state) is dict:
                obj.__dict__.update(state)
            else:
                raise ValueError(f"{n[tag]} state must be a dict")
            return obj
        raise ValueError(f"unknown node {tag!r}")


def write(directory: Path, value: Any) -> None:
    """``value`` -> ``directory/rollout.json`` + ``rollout.npz`` (+ ``rollout.sig`` when it holds opaque data)."""
    enc = _Encoder()
    tree = enc.encode(value)
    json_bytes = json.dumps({"format": FORMAT, "version": VERSION, "tree": tree}).encode()
    buf = io.BytesIO()
    np.savez(buf, **enc.arrays)
    npz_bytes = buf.getvalue()
    (directory / JSON_NAME).write_bytes(json_bytes)
    (directory / NPZ_NAME).write_bytes(npz_bytes)
    if enc.opaque:
        key = _key(create=True)
        if key is None:
            raise OSError(f"cannot create the run key {key_path()}")
        (directory / SIG_NAME).write_text(_signature(key, json_bytes, npz_bytes) + "\n")


def read(directory: Path) -> Any:
    """The value :func:`write` stored. Raises ValueError/OSError for damaged files, UntrustedState for opaque
    parts without a matching signature."""
    jail = Jail(directory)  # regular files only, no symlinks, each within its size cap
    json_bytes = jail.read_bytes(JSON_NAME, "json")
    npz_bytes = jail.read_bytes(NPZ_NAME, "npz")
    header = json.loads(json_bytes)
    if type(header) is not dict or header.get("format") != FORMAT or header.get("version") != VERSION:
        raise ValueError(f"{JSON_NAME} is not a {FORMAT} v{VERSION} file")
    check_npz(npz_bytes, where=NPZ_NAME)  # before anything inflates
    with np.load(io.BytesIO(npz_bytes), allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    verified = []

    def trust() -> None:
        if verified:
            return
        sig_path, path = directory / SIG_NAME, key_path()
        if not os.path.lexists(sig_path):
            raise UntrustedState(f"it holds pickled data but no {SIG_NAME}")
        key = _key(create=False)
        if key is None:
            raise UntrustedState(f"it holds pickled data signed with a run key, and {path} does not exist here")
        if not hmac.compare_digest(_signature(key, json_bytes, npz_bytes), jail.read_text(SIG_NAME, "pointer").strip()):
            raise UntrustedState(f"its pickled data is not signed with this user's run key {path} (copy the key "
                                 f"from the machine that wrote the run, or start a new run)")
        verified.append(True)

    return _Decoder(arrays, trust).decode(header.get("tree"))
