"""Backbone names the benchmark accepts, checked before any cell runs (nothing is loaded here).

The rules are ``echo_rl.models.load_backbone``'s: a named backbone
(``tiny``, ``tiny:<preset>``, the API aliases), ``<provider>/<model>``, an
OpenAI-compatible URL, or a local checkpoint directory — plus ``expert``,
the environment's hand-coded expert answering through the backbone protocol
(it checks an agent's loop; it is not a model).
"""

from __future__ import annotations

from echo_rl.config import ConfigError
from echo_rl.models import backbone_names
from echo_rl.models.api import PROVIDERS
from echo_rl.models.resolve import REGISTER_HINT, resolve_backbone

EXPERT_BACKBONE = "expert"


def known_backbones() -> list[str]:
    return [*backbone_names(), EXPERT_BACKBONE]


def check_backbone_name(name: str) -> None:
    """One-line ConfigError unless ``name`` is ``expert`` or a name :func:`~echo_rl.models.resolve.resolve_backbone`
    knows (a registered model not fetched here fails now, naming the fetch command)."""
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"backbone name {name!r} is invalid: must be a non-empty string")
    if name == EXPERT_BACKBONE or resolve_backbone(name, strict=False) is not None:
        return
    raise ConfigError(f"unknown backbone {name!r}; allowed: {', '.join(known_backbones())}, <provider>/<model> "
                      f"(providers: {', '.join(PROVIDERS)}), http(s)://host:port/v1[#model], or a local "
                      f"checkpoint directory ({REGISTER_HINT})")
