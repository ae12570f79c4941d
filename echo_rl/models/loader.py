"""``load_backbone(name_or_path)``: the one entry point from a backbone name to a :class:`Backbone`.

What a name denotes is :func:`echo_rl.models.resolve.resolve_backbone`'s answer (the resolver training
and the benchmark read too): a name registered with :func:`register_backbone`, ``tiny`` /
``tiny:<preset>`` / a preset name (built offline on first use and cached), a registered pretrained model
(``smollm2-135m``: the checkpoint ``echo-rl models fetch`` built, see ``echo_rl.models.fetch``), an API
alias (``gpt-4o``, ``claude-3.5-sonnet``, ``gemini-1.5-pro``, ``llama-4``, ``qwen``, ``deepseek-r1``),
``<provider>/<model>``, an OpenAI-compatible URL (``http://127.0.0.1:8000/v1`` or ``...#model``), or a
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
    from echo_rl.models.resolve import resolve_backbone

    ref = resolve_backbone(str(name_or_path))
    name = ref.name
    if ref.kind == "registered":
        model = _REGISTERED[name](cfg)
        if not isinstance(model, Backbone):
            raise ConfigError(f"registered backbone {name!r}: its factory returned {type(model).__name__}, "
                              f"not an echo_rl.models.Backbone")
        return model
    if ref.kind in ("api", "url"):
        from echo_rl.models.api import APIBackbone

        if ref.kind == "api":
            return APIBackbone(ref.model, provider=ref.provider, base_url=cfg.base_url, api_key_env=cfg.api_key_env,
                               timeout=cfg.timeout, max_retries=cfg.max_retries,
                               requests_per_minute=cfg.requests_per_minute, prices=cfg.prices, name=name)
        return APIBackbone(ref.model or cfg.model or "", provider=ref.provider, base_url=ref.url,
                           api_key_env=cfg.api_key_env, timeout=cfg.timeout, max_retries=cfg.max_retries,
                           requests_per_minute=cfg.requests_per_minute, prices=cfg.prices)
    from echo_rl.models.local import LocalBackbone

    return LocalBackbone(ref.checkpoint(seed=cfg.tiny_seed), device=cfg.device, dtype=cfg.dtype,
                         name=None if ref.kind == "checkpoint" else name, max_context=cfg.max_context)
