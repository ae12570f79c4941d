"""One ``act(obs)`` over a run directory or an exported file (``echo_rl.load_policy`` adds hub models).

Every source becomes a backend that maps inputs to (logits, values); the
:class:`Policy` around it owns what acting needs beyond the network: raw
MiniGrid observations encoded as in training, per-env plan windows for the
EchoRL agent (``episode_start`` clears them, as ``EchoAgent.evaluate`` does),
and greedy or seeded sampled actions.
"""

from __future__ import annotations

import json
import re
import warnings
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from echo_rl.config import ConfigError
from echo_rl.export.vector import META_KEY, TS_EXTRA, require_onnx, require_safetensors


def _one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:160]}"


# what acting reads from a policy file's metadata; a file may be hostile, so each is checked before use
_META_TYPES = {"agent": str, "env_name": str, "obs_dim": int, "window": int, "inputs": list}
_INPUTS = ("obs", "window", "mask")


def parse_meta(raw: str, path: Any) -> dict:
    """A policy file's ``echo_rl`` metadata, checked: a ConfigError (one line) naming what is wrong."""
    def bad(what: str) -> ConfigError:
        return ConfigError(f"{path} has malformed {META_KEY!r} metadata: {what}; re-export it with `echo-rl export`")

    try:
        meta = json.loads(raw)
    except ValueError as exc:
        raise bad(f"not JSON ({_one_line(exc)})") from None
    if type(meta) is not dict:
        raise bad(f"a JSON {type(meta).__name__}, not an object")
    for key, tp in _META_TYPES.items():
        if type(meta.get(key)) is not tp:
            raise bad(f"{key!r} is {'missing' if key not in meta else repr(meta[key])[:40]}, expected {tp.__name__}")
    if not 0 < meta["obs_dim"] <= 2**24 or not 0 <= meta["window"] <= 2**12:
        raise bad(f"obs_dim={meta['obs_dim']} or window={meta['window']} is out of range")
    if not meta["inputs"] or any(x not in _INPUTS for x in meta["inputs"]):
        raise bad(f"inputs {meta['inputs']!r:.60}; allowed: {', '.join(_INPUTS)}")
    shape = meta.get("obs_shape", [meta["obs_dim"]])
    if (type(shape) is not list or any(type(d) is not int or d < 1 for d in shape)
            or int(np.prod(shape, dtype=object)) != meta["obs_dim"]):
        raise bad(f"obs_shape {shape!r:.60} does not match obs_dim {meta['obs_dim']}")
    try:
        numeric = np.dtype(meta.get("obs_dtype", "uint8")).kind in "biuf"
    except TypeError:
        numeric = False
    if not numeric:
        raise bad(f"obs_dtype {meta.get('obs_dtype')!r:.40} is not a numeric dtype")
    enc = meta.get("obs_encoding")
    if enc is not None and (type(enc) is not dict or type(enc.get("mission_vocab")) is not list
                            or any(type(w) is not str for w in enc["mission_vocab"])
                            or type(enc.get("mission_other_slot")) is not int
                            or not 0 <= enc["mission_other_slot"] <= 2**16):
        raise bad("obs_encoding is not {mission_vocab: [words], mission_other_slot: int}")
    return meta


class OnnxBackend:
    def __init__(self, path: Path):
        require_onnx()
        import onnxruntime as ort

        try:
            opts = ort.SessionOptions()
            opts.intra_op_num_threads = 1  # batch-of-a-few inference: threads cost more than they give
            self.session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        except Exception as exc:  # noqa: BLE001 - onnxruntime raises several kinds for a damaged file
            raise ConfigError(f"{path} is not a loadable ONNX model ({_one_line(exc)})") from None
        raw = self.session.get_modelmeta().custom_metadata_map.get(META_KEY)
        if raw is None:
            raise ConfigError(f"{path} has no {META_KEY!r} metadata: it was not written by `echo-rl export`")
        self.meta = parse_meta(raw, path)

    def __call__(self, inputs: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        logits, values = self.session.run(None, inputs)
        return logits, values


class TorchBackend:
    """A TorchScript export (code: only after ``load_policy(..., allow_code=True)``), or a run's own network
    (``module`` given)."""

    def __init__(self, path: Path | None = None, module: Any = None, meta: dict | None = None):
        import torch

        if module is None:
            extra = {TS_EXTRA: ""}
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # torch.jit's deprecation notice
                    module = torch.jit.load(str(path), map_location="cpu", _extra_files=extra)
            except Exception as exc:  # noqa: BLE001 - not a TorchScript archive, or damaged
                raise ConfigError(f"{path} is not a loadable TorchScript policy ({_one_line(exc)})") from None
            if not extra[TS_EXTRA]:
                raise ConfigError(f"{path} has no {TS_EXTRA}: it was not written by `echo-rl export`")
            meta = parse_meta(extra[TS_EXTRA], path)
        self.module, self.meta, self._torch = module.eval(), meta, torch

    def __call__(self, inputs: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        with self._torch.no_grad():
            logits, values = self.module(*(self._torch.as_tensor(inputs[k]) for k in self.meta["inputs"]))
        return logits.numpy(), values.numpy()


def _is_safetensors(path: Path) -> bool:
    """A safetensors file starts with its JSON header's length (8 bytes, little-endian) and then ``{``."""
    with open(path, "rb") as fh:
        head = fh.read(9)
    return len(head) == 9 and head[8:] == b"{" and 2 <= int.from_bytes(head[:8], "little") <= path.stat().st_size


def safetensors_backend(path: Path) -> TorchBackend:
    """A safetensors export: the run's network rebuilt from the config in the header, then the tensors loaded
    into it (data only: nothing in the file runs)."""
    require_safetensors()
    from safetensors import safe_open
    from safetensors.torch import load_file

    from echo_rl.config import TrainingConfig  # noqa: I001 - with the two below, on this path only
    from echo_rl.export.graph import policy_graph  # torch: needed on this path only
    from echo_rl.export.runs import VECTOR_AGENTS, acting_agent  # torch: needed on this path only

    try:
        with safe_open(str(path), "pt") as fh:
            raw = (fh.metadata() or {}).get(META_KEY)
        tensors = load_file(str(path))
    except Exception as exc:  # noqa: BLE001 - a damaged header or truncated data: safetensors raises several kinds
        raise ConfigError(f"{path} is not a loadable safetensors policy ({_one_line(exc)})") from None
    try:
        meta = json.loads(raw) if raw is not None else None
        config = TrainingConfig.from_saved(meta.pop("config")) if type(meta) is dict and "config" in meta else None
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{path}: its {META_KEY!r} metadata is malformed ({_one_line(exc)})") from None
    if config is None:
        raise ConfigError(f"{path} has no {META_KEY!r} metadata with a config: it was not written by `echo-rl export`")
    if config.text_task or config.agent not in VECTOR_AGENTS:
        raise ConfigError(f"{path}: its config names agent {config.agent!r} on {config.env_name!r}; safetensors "
                          f"policies are {', '.join(VECTOR_AGENTS)} on vector tasks")
    agent = acting_agent(config)
    graph, _ = policy_graph(agent, config)
    try:
        graph.load_state_dict(tensors, strict=True)
    except RuntimeError as exc:
        agent.close()
        raise ConfigError(f"{path}: its tensors do not fit a {config.agent} policy ({_one_line(exc)})") from None
    return TorchBackend(module=graph.eval(), meta=meta)


def encode_minigrid(obs: dict, encoding: dict) -> np.ndarray:
    """A raw MiniGrid observation dict -> the flat uint8 vector the policy was trained on."""
    vocab = {w: i for i, w in enumerate(encoding["mission_vocab"])}
    bag = np.zeros(encoding["mission_other_slot"] + 1, np.uint8)
    for word in re.findall(r"[a-z]+", obs["mission"].lower()):
        bag[vocab.get(word, encoding["mission_other_slot"])] = 1
    return np.concatenate([np.asarray(obs["image"], np.uint8).reshape(-1), [obs["direction"]], bag]).astype(np.uint8)


class Policy:
    """``act(obs)`` -> actions for a batch (or one) of observations; see the module docstring."""

    def __init__(self, backend: Any, source: str):
        self.backend, self.source, self.meta = backend, source, backend.meta
        self.window = int(self.meta.get("window", 0))
        self._states: np.ndarray | None = None
        self._mask: np.ndarray | None = None
        self._rng = np.random.default_rng(0)

    def __repr__(self) -> str:
        m = self.meta
        return f"Policy({m['agent']} on {m['env_name']}, {self.source})"

    def seed(self, seed: int) -> None:
        """Seed the sampling of ``act(..., deterministic=False)``."""
        self._rng = np.random.default_rng(seed)

    def reset(self) -> None:
        """Forget the plan windows (a new set of episodes)."""
        self._states = self._mask = None

    @property
    def _shape(self) -> tuple[int, ...]:
        return tuple(self.meta.get("obs_shape", [self.meta["obs_dim"]]))

    def _single(self, obs: Any) -> bool:
        return isinstance(obs, dict) or np.shape(obs) == self._shape

    def _batch(self, obs: Any) -> np.ndarray:
        obs = [obs] if isinstance(obs, dict) else obs
        if isinstance(obs, (list, tuple)) and obs and isinstance(obs[0], dict):
            if not self.meta.get("obs_encoding"):
                raise ValueError(f"{self.meta['env_name']} observations are arrays; dict observations are MiniGrid's")
            arr = np.stack([encode_minigrid(o, self.meta["obs_encoding"]) for o in obs])
        else:
            arr = np.asarray(obs)
            arr = arr[None] if arr.shape == self._shape else arr
        if arr.shape[1:] != self._shape:
            raise ValueError(f"observations must be [batch, {', '.join(map(str, self._shape))}] (or one, or MiniGrid "
                             f"dicts), got shape {arr.shape}")
        return arr.astype(self.meta.get("obs_dtype", "uint8"))

    def logits_and_values(self, obs: Any, episode_start: Any = None) -> tuple[np.ndarray, np.ndarray]:
        """Action logits ``[B, A]`` and values ``[B]``. With a plan window, ``episode_start[i]`` True where
        ``obs[i]`` begins an episode; without it each plan reads ``obs`` alone (as ``EchoAgent.act``)."""
        arr = self._batch(obs)
        inputs = {"obs": arr}
        if self.window:
            n, k = len(arr), self.window
            if episode_start is None:
                states = np.zeros((n, k, arr.shape[1]), arr.dtype)
                mask = np.zeros((n, k), bool)
            else:
                start = np.asarray(episode_start, bool).reshape(n)
                if self._states is None or len(self._states) != n:
                    self._states, self._mask = np.zeros((n, k, arr.shape[1]), arr.dtype), np.zeros((n, k), bool)
                    start = np.ones(n, bool)
                states, mask = np.roll(self._states, -1, axis=1), np.roll(self._mask, -1, axis=1)
                states[start], mask[start] = 0, False
                self._states, self._mask = states, mask
            states[:, -1], mask[:, -1] = arr, True
            inputs.update(window=states.copy(), mask=mask.copy())
        return self.backend(inputs)

    def act(self, obs: Any, episode_start: Any = None, deterministic: bool = True) -> np.ndarray | int:
        """Greedy actions (``deterministic``), or actions sampled from the policy with :meth:`seed`'s RNG."""
        logits, _ = self.logits_and_values(obs, episode_start)
        if deterministic:
            actions = logits.argmax(-1)
        else:
            p = np.exp(logits - logits.max(-1, keepdims=True))
            p /= p.sum(-1, keepdims=True)
            actions = (p.cumsum(-1) > self._rng.random((len(p), 1))).argmax(-1)
        return int(actions[0]) if self._single(obs) else actions


TORCHSCRIPT_REFUSED = ("{path} is TorchScript: a program that runs when it is loaded and on every act(), not "
                       "weights; it is refused unless you trust whoever wrote it: load_policy(path, allow_code=True). "
                       "ONNX and safetensors exports (echo-rl export --format onnx|safetensors) hold no code")


def load_policy(path_or_name: str | Path, allow_code: bool = False) -> Policy:
    """A :class:`Policy` from a run directory (its newest checkpoint) or an exported ``.onnx`` / ``.safetensors``
    file. Hub model names are the hub's (``echo_rl.load_policy`` is :func:`echo_rl.hub.models.load_policy`).

    A TorchScript file is code (its methods run on load and in ``act``), so it is refused unless
    ``allow_code=True`` says its author is trusted; ONNX files and run directories hold data only."""
    text = str(path_or_name)
    path = Path(text).expanduser()
    if path.is_dir():
        from echo_rl.export.graph import policy_graph  # needed on this path only
        from echo_rl.export.runs import load_vector_agent  # needed on this path only

        agent, config, ckpt = load_vector_agent(path, flag="run directory")
        graph, meta = policy_graph(agent, config)
        meta["checkpoint"] = ckpt
        return Policy(TorchBackend(module=graph, meta=meta), f"{path} ({ckpt})")
    if path.is_file():  # by content: TorchScript is a zip archive, safetensors a JSON header, ONNX a protobuf
        if _is_safetensors(path):
            return Policy(safetensors_backend(path), str(path))
        if zipfile.is_zipfile(path) or path.suffix == ".pt":
            if not allow_code:
                raise ConfigError(TORCHSCRIPT_REFUSED.format(path=path))
            return Policy(TorchBackend(path), str(path))
        return Policy(OnnxBackend(path), str(path))
    raise ConfigError(f"{text!r} is neither a run directory nor an exported .onnx/.safetensors file")
