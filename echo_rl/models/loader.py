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
from typing import Any

from echo_rl.config import ConfigError
from echo_rl.models.backbone import Backbone
from echo_rl.models.config import BackboneConfig


def backbone_names() -> list[str]:
    """Named backbones (besides provider/model, URLs and checkpoint paths)."""
    from echo_rl.models.api import ALIASES
    from echo_rl.models.fetch import MODELS
    from echo_rl.models.tiny import PRESETS

    return ["tiny", *[f"tiny:{p}" for p in PRESETS], *MODELS, *ALIASES]


def _allowed() -> str:
    from echo_rl.models.api import PROVIDERS

    return (f"{', '.join(backbone_names())}, <provider>/<model> (providers: {', '.join(PROVIDERS)}), "
            "http(s)://host:port/v1[#model], or a local checkpoint directory")


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
