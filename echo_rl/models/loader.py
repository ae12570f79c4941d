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
from typing import Any

from echo_rl.config import ConfigError
from echo_rl.models.backbone import Backbone
from echo_rl.models.config import BackboneConfig
from echo_rl.models.resolve import _REGISTERED, resolve_backbone


def load_backbone(name_or_path: str | Path | Backbone, config: BackboneConfig | dict | None = None,
                  **overrides: Any) -> Backbone:
    """Build the backbone a name denotes; ``config``/``overrides`` are :class:`BackboneConfig` fields."""
    if isinstance(name_or_path, Backbone):
        return name_or_path
    if isinstance(config, dict):
        config = BackboneConfig.from_dict(config)
    cfg = (config or BackboneConfig()).replace(**overrides) if overrides else (config or BackboneConfig())

    ref = resolve_backbone(str(name_or_path))
    name = ref.name
    if ref.kind == "registered":
        model = _REGISTERED[name](cfg)
        if not isinstance(model, Backbone):
            raise ConfigError(f"registered backbone {name!r}: its factory returned {type(model).__name__}, "
                              f"not an echo_rl.models.Backbone")
        return model
    if ref.kind in ("api", "url"):
        from echo_rl.models.api import APIBackbone  # needed on this path only

        if ref.kind == "api":
            return APIBackbone(ref.model, provider=ref.provider, base_url=cfg.base_url, api_key_env=cfg.api_key_env,
                               timeout=cfg.timeout, max_retries=cfg.max_retries,
                               requests_per_minute=cfg.requests_per_minute, prices=cfg.prices, name=name)
        return APIBackbone(ref.model or cfg.model or "", provider=ref.provider, base_url=ref.url,
                           api_key_env=cfg.api_key_env, timeout=cfg.timeout, max_retries=cfg.max_retries,
                           requests_per_minute=cfg.requests_per_minute, prices=cfg.prices)
    from echo_rl.models.local import LocalBackbone  # keeps import echo_rl light: loaded on first use

    return LocalBackbone(ref.checkpoint(seed=cfg.tiny_seed), device=cfg.device, dtype=cfg.dtype,
                         name=None if ref.kind == "checkpoint" else name, max_context=cfg.max_context)
