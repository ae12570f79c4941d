"""``load_backbone(name_or_path)``: the one entry point from a backbone name to a :class:`Backbone`.

Names, in the order they are tried:
``tiny`` / ``tiny:<preset>`` / a preset name (built offline on first use and
cached), a registered pretrained model (``smollm2-135m``: the checkpoint
``echo-rl models fetch`` built, see ``echo_rl.models.fetch``), an API alias
(``gpt-4o``, ``claude-3.5-sonnet``, ``gemini-1.5-pro``, ``llama-4``, ``qwen``,
``deepseek-r1``), ``<provider>/<model>``, an
OpenAI-compatible URL (``http://127.0.0.1:8000/v1`` or ``...#model``), or a
local checkpoint directory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from echo_rl.config import ConfigError
from echo_rl.models.backbone import Backbone
from echo_rl.models.config import BackboneConfig


_REGISTERED: dict[str, Callable[[BackboneConfig], Backbone]] = {}
REGISTER_HINT = "register your own with echo_rl.models.register_backbone(name, factory)"


def register_backbone(name: str, factory: Callable[[BackboneConfig], Backbone]) -> None:
    """Make ``name`` a backbone everywhere a backbone name is read (``load_backbone``, the benchmark, eval).

    ``factory(config: BackboneConfig) -> Backbone`` builds it on each load; registered names are tried
    before the built-in ones. (Training needs weights: it takes tiny presets and local checkpoints.)
    """
    if not isinstance(name, str) or not name.strip() or name != name.strip():
        raise ConfigError(f"backbone name {name!r} is invalid: must be a non-empty string without surrounding spaces")
    if not callable(factory):
        raise ConfigError(f"factory for backbone {name!r} is invalid: must be callable, got {type(factory).__name__}")
    _REGISTERED[name] = factory


def backbone_names() -> list[str]:
    """Named backbones (besides provider/model, URLs and checkpoint paths), registered ones last."""
    from echo_rl.models.api import ALIASES
    from echo_rl.models.fetch import MODELS
    from echo_rl.models.tiny import PRESETS

    return ["tiny", *[f"tiny:{p}" for p in PRESETS], *MODELS, *ALIASES, *sorted(_REGISTERED)]


def _allowed() -> str:
    from echo_rl.models.api import PROVIDERS

    return (f"{', '.join(backbone_names())}, <provider>/<model> (providers: {', '.join(PROVIDERS)}), "
            f"http(s)://host:port/v1[#model], or a local checkpoint directory ({REGISTER_HINT})")


def load_backbone(name_or_path: str | Path | Backbone, config: BackboneConfig | dict | None = None,
                  **overrides: Any) -> Backbone:
    """Build the backbone a name denotes; ``config``/``overrides`` are :class:`BackboneConfig` fields."""
    if isinstance(name_or_path, Backbone):
        return name_or_path
    if isinstance(config, dict):
        config = BackboneConfig.from_dict(config)
    cfg = (config or BackboneConfig()).replace(**overrides) if overrides else (config or BackboneConfig())
    name = str(name_or_path).strip()
    if not name:
        raise ConfigError(f"backbone name is empty; allowed: {_allowed()}")
    if name in _REGISTERED:
        model = _REGISTERED[name](cfg)
        if not isinstance(model, Backbone):
            raise ConfigError(f"registered backbone {name!r}: its factory returned {type(model).__name__}, "
                              f"not an echo_rl.models.Backbone")
        return model

    from echo_rl.models.tiny import PRESETS

    preset = name.split(":", 1)[1] if name.startswith("tiny:") else name if name in PRESETS else None
    if preset is not None:
        from echo_rl.models.local import LocalBackbone
        from echo_rl.models.tiny import tiny_checkpoint

        path = tiny_checkpoint(preset, seed=cfg.tiny_seed)
        return LocalBackbone(path, device=cfg.device, dtype=cfg.dtype, name=name, max_context=cfg.max_context)

    from echo_rl.models.fetch import resolve_model

    fetched = resolve_model(name)  # a registered name not fetched: one line naming the fetch command
    if fetched is not None:
        from echo_rl.models.local import LocalBackbone

        return LocalBackbone(fetched, device=cfg.device, dtype=cfg.dtype, name=name, max_context=cfg.max_context)

    from echo_rl.models.api import APIBackbone, resolve_api_name

    api = resolve_api_name(name)
    if api is not None:
        provider, model = api
        return APIBackbone(model, provider=provider, base_url=cfg.base_url, api_key_env=cfg.api_key_env,
                           timeout=cfg.timeout, max_retries=cfg.max_retries,
                           requests_per_minute=cfg.requests_per_minute, prices=cfg.prices,
                           name=name)
    if name.startswith(("http://", "https://")):
        url, _, model = name.partition("#")
        return APIBackbone(model or cfg.model or "", provider="openai-compatible", base_url=url,
                           api_key_env=cfg.api_key_env, timeout=cfg.timeout, max_retries=cfg.max_retries,
                           requests_per_minute=cfg.requests_per_minute, prices=cfg.prices)
    path = Path(name).expanduser()
    if path.is_dir():
        from echo_rl.models.local import LocalBackbone

        return LocalBackbone(path, device=cfg.device, dtype=cfg.dtype, max_context=cfg.max_context)
    raise ConfigError(f"unknown backbone {name!r}; allowed: {_allowed()}")
