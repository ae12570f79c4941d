"""Trained hub policies: ONNX files in ``data/models`` with a record of how they were made and what they score.

``data/models/models.json`` holds, per name: the file and its SHA-256, the
training config and command, the commit, and the *published* evaluation —
greedy actions on the run's own evaluation seeds (``seed + EVAL_SEED_OFFSET``,
env i reset with ``seed + 10000 i``), which :func:`evaluate`,
``examples/standalone_policy.py`` and ``echo-rl eval``'s episode layout share;
beside it the run's own (sampled) final evaluation. ``python -m
echo_rl.hub.build_models`` writes both.
"""

from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from echo_rl.config import ConfigError

INDEX = "models.json"


def models_dir() -> Path:
    return Path(str(resources.files("echo_rl.hub").joinpath("data", "models")))


def recipe_path(name: str) -> Path:
    """A training recipe (TrainingConfig YAML) shipped in the package, so apps run from an install;
    ``configs/`` in a checkout links to it, so the recipe is written once."""
    recipes = Path(str(resources.files("echo_rl.hub").joinpath("data", "recipes")))
    allowed = sorted(file.stem for file in recipes.glob("*.yaml"))
    if name not in allowed:
        raise ConfigError(f"unknown recipe {name!r}; allowed: {', '.join(allowed) or 'none'}")
    return recipes / f"{name}.yaml"


@lru_cache(maxsize=1)
def _index() -> dict:
    path = models_dir() / INDEX
    return json.loads(path.read_text()) if path.is_file() else {}


def names() -> list[str]:
    return sorted(_index())


def info(name: str) -> dict[str, Any]:
    name = name[4:] if name.startswith("hub:") else name
    if name not in _index():
        raise ConfigError(f"unknown hub model {name!r}; allowed: {', '.join(names()) or 'none'}")
    return dict(_index()[name])


def path(name: str) -> Path:
    """The model's ONNX file, checked against its recorded SHA-256 (a damaged install is one clear error)."""
    entry = info(name)
    file = models_dir() / entry["file"]
    if not file.is_file():
        raise ConfigError(f"hub model {name!r}: {file} is missing; rebuild with python -m echo_rl.hub.build_models")
    if hashlib.sha256(file.read_bytes()).hexdigest() != entry["sha256"]:
        raise ConfigError(f"hub model {name!r}: {file} does not match its recorded SHA-256 (damaged or replaced); "
                          f"rebuild with python -m echo_rl.hub.build_models {name}")
    return file


def load_policy(path_or_name: str | Path, allow_code: bool = False):
    """``echo_rl.load_policy``: a hub model by name (``NAME`` or ``hub:NAME``; a local file or folder of that name
    never shadows a ``hub:`` name), else a run directory or an exported file
    (:func:`echo_rl.export.loading.load_policy`, whose ``allow_code`` admits TorchScript)."""
    # torch and onnxruntime load with the first policy, so reading the hub's index and scores stays light
    from echo_rl.export.loading import OnnxBackend, Policy, load_policy as load_exported

    text = str(path_or_name)
    name = text[4:] if text.startswith("hub:") else text
    if text.startswith("hub:") or (name in names() and not Path(text).expanduser().exists()):
        return Policy(OnnxBackend(path(name)), f"hub:{name}")
    try:
        return load_exported(path_or_name, allow_code=allow_code)
    except ConfigError as exc:
        if "neither a run directory" not in str(exc):
            raise
        raise ConfigError(f"{text!r} is neither a run directory, an exported .onnx/.safetensors file nor a hub model; "
                          f"hub models: {', '.join(names()) or 'none'}") from None


def load(name: str):
    """The hub model ``name`` (``NAME`` or ``hub:NAME``) as a :class:`~echo_rl.export.loading.Policy`."""
    info(name)
    return load_policy(f"hub:{name[4:] if name.startswith('hub:') else name}")


def evaluate_greedy(policy, env_name: str, episodes: int, seed: int, num_envs: int = 16,
                    env_config: dict | None = None) -> dict[str, float]:
    """Greedy-action success and return over ``episodes`` seeded episodes (``rollout.evaluate_policy``'s layout)."""
    from echo_rl.environments.minigrid_vector import make_vector_env  # gymnasium, minigrid: loaded on first use
    from echo_rl.vector.rollout import evaluate_policy  # torch: loaded on first use

    policy.reset()
    try:
        return evaluate_policy(lambda n: make_vector_env(env_name, n, **(env_config or {})),
                               lambda obs, starts: policy.act(obs, starts), episodes, seed, num_envs=num_envs,
                               episode_starts=True)
    finally:
        policy.reset()


def evaluate(name: str) -> dict[str, float]:
    """Re-run the published evaluation of a hub model."""
    entry = info(name)
    ev = entry["published"]
    return evaluate_greedy(load(name), entry["env_name"], ev["episodes"], ev["seed"], ev["num_envs"],
                           entry.get("env_config"))
