"""The one backbone resolver: a backbone name -> what it denotes (:class:`BackboneRef`), nothing loaded.

Prompting (``load_backbone``), training (``echo_rl.lm.policy.load_policy``), the benchmark's
name check and its "can this method train that backbone" rule all read :func:`resolve_backbone`, so a
name means the same thing everywhere. Names, in the order they are tried:

* ``registered`` - a name given to :func:`register_backbone` (its factory builds it);
* ``tiny`` - ``tiny``, ``tiny:<preset>`` or a bare preset name (built offline on first use and cached);
* ``fetched`` - a registered pretrained model (``smollm2-135m``: the checkpoint ``echo-rl models fetch``
  built; a registered model that is not fetched is a one-line error naming the fetch command);
* ``api`` - an API alias (``gpt-4o``...) or ``<provider>/<model>``;
* ``url`` - an OpenAI-compatible endpoint, ``http(s)://host:port/v1[#model]``;
* ``checkpoint`` - a local checkpoint directory.

Only ``tiny``, ``fetched`` and ``checkpoint`` have weights a trainer can update.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from echo_rl.config import ConfigError
from echo_rl.models.api import ALIASES, PROVIDERS, resolve_api_name
from echo_rl.models.backbone import Backbone
from echo_rl.models.config import BackboneConfig
from echo_rl.models.fetch import MODELS, resolve_model

KINDS = ("registered", "tiny", "fetched", "api", "url", "checkpoint")
TRAINABLE = ("tiny", "fetched", "checkpoint")


@dataclass(frozen=True)
class BackboneRef:
    """What a backbone name denotes: its kind and the preset / path / provider and model that build it."""

    name: str
    kind: str  # one of KINDS
    preset: str | None = None  # tiny
    path: Path | None = None  # fetched, checkpoint
    provider: str | None = None  # api, url ("openai-compatible")
    model: str | None = None  # api, url (the part after '#', may be "")
    url: str | None = None  # url: the endpoint

    @property
    def has_weights(self) -> bool:
        """Whether a trainer can update this backbone's weights (API models and registered factories: no)."""
        return self.kind in TRAINABLE

    def checkpoint(self, seed: int = 0) -> Path:
        """The checkpoint directory holding the weights (a tiny preset is built for ``seed`` on first use)."""
        if self.kind == "tiny":
            from echo_rl.models.tiny import tiny_checkpoint  # keeps import echo_rl light: loaded on first use

            return tiny_checkpoint(self.preset, seed=seed)
        if self.path is None:
            raise ConfigError(f"backbone {self.name!r} ({self.kind}) has no checkpoint directory")
        return self.path


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
    from echo_rl.models.tiny import PRESETS  # keeps import echo_rl light: loaded on first use

    return ["tiny", *[f"tiny:{p}" for p in PRESETS], *MODELS, *ALIASES, *sorted(_REGISTERED)]


def _allowed() -> str:
    return (f"{', '.join(backbone_names())}, <provider>/<model> (providers: {', '.join(PROVIDERS)}), "
            f"http(s)://host:port/v1[#model], or a local checkpoint directory ({REGISTER_HINT})")


def resolve_backbone(name: str, *, strict: bool = True) -> BackboneRef | None:
    """What ``name`` denotes (see the module doc); an unknown name raises a one-line ConfigError listing the
    allowed names, or with ``strict=False`` returns None (the caller says what it accepts)."""
    from echo_rl.models.tiny import PRESETS  # keeps import echo_rl light: loaded on first use

    name = str(name).strip()
    if not name:
        if strict:
            raise ConfigError(f"backbone name is empty; allowed: {_allowed()}")
        return None
    if name in _REGISTERED:
        return BackboneRef(name, "registered")
    preset = name.split(":", 1)[1] if name.startswith("tiny:") else name if name in PRESETS else None
    if preset is not None:
        if preset not in PRESETS:
            raise ConfigError(f"unknown tiny preset {preset!r} in backbone {name!r}; allowed: "
                              f"{', '.join('tiny:' + p for p in PRESETS)}")
        return BackboneRef(name, "tiny", preset=preset)
    fetched = resolve_model(name)  # a registered model not fetched: one line naming the fetch command
    if fetched is not None:
        return BackboneRef(name, "fetched", path=fetched)
    api = resolve_api_name(name)
    if api is not None:
        return BackboneRef(name, "api", provider=api[0], model=api[1])
    if name.startswith(("http://", "https://")):
        url, _, model = name.partition("#")
        return BackboneRef(name, "url", provider="openai-compatible", model=model, url=url)
    path = Path(name).expanduser()
    if path.is_dir():
        return BackboneRef(name, "checkpoint", path=path)
    if strict:
        raise ConfigError(f"unknown backbone {name!r}; allowed: {_allowed()}")
    return None
