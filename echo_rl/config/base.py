"""The config machinery: :func:`spec` fields, :class:`ConfigBase` (validation, dict/YAML round-trip, overrides).

Every field carries its rule in ``metadata`` (``help``, and optionally ``min``,
``max``, ``choices``, ``gt``) so that validation, ``--help`` and the docs all
read the same source. Invalid values raise :class:`ConfigError` with one line
naming the field, the value and what is allowed.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml


class ConfigError(ValueError):
    """A config value or file is invalid; the message is one line."""


ALIAS_BUDGET = 100_000  # YAML nodes that the aliases of one document may expand to
CONFIG_CAP = 4 * 2**20  # bytes of a config file read at most


class _BoundedSafeLoader(yaml.SafeLoader):
    """SafeLoader that counts what aliases expand to and refuses recursive ones. A few KB of nested aliases (a
    "billion laughs") load as shared references, then grow to gigabytes once the value is copied or dumped."""

    def __init__(self, stream: Any):
        super().__init__(stream)
        self._expanded = 0
        self._open: set[str] = set()

    def _count(self, node: yaml.Node) -> None:
        self._expanded += 1
        if self._expanded > ALIAS_BUDGET:
            raise yaml.YAMLError(f"its aliases expand to more than {ALIAS_BUDGET:,} nodes")
        if isinstance(node, yaml.SequenceNode):
            for child in node.value:
                self._count(child)
        elif isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                self._count(key)
                self._count(value)

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            if event.anchor in self._open:
                raise yaml.YAMLError(f"alias *{event.anchor} refers to its own anchor (a recursive value)")
            if event.anchor in self.anchors:
                self._count(self.anchors[event.anchor])
            return super().compose_node(parent, index)
        anchor = getattr(event, "anchor", None)
        if anchor is None:
            return super().compose_node(parent, index)
        self._open.add(anchor)
        try:
            return super().compose_node(parent, index)
        finally:
            self._open.discard(anchor)


def load_yaml_text(text: str, source: str) -> Any:
    """The project's one YAML parser: safe types only, alias expansion bounded (:data:`ALIAS_BUDGET`); a
    ConfigError naming ``source`` (a file, or a CLI value) and the problem when the text is refused."""
    try:
        return yaml.load(text, Loader=_BoundedSafeLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or " ".join(str(exc).split())[:160] or "malformed YAML"
        raise ConfigError(f"{source} is not valid YAML{where}: {problem}") from None


def spec(default: Any = dataclasses.MISSING, *, help: str, default_factory: Any = dataclasses.MISSING,
         min: float | None = None, max: float | None = None, gt: float | None = None,
         choices: tuple | None = None) -> Any:
    """Declare a config field with its documentation and its validation rule."""
    meta = {"help": help, "min": min, "max": max, "gt": gt, "choices": choices}
    if default_factory is not dataclasses.MISSING:
        return field(default_factory=default_factory, metadata=meta)
    return field(default=default, metadata=meta)


def _type_ok(value: Any, tp: Any) -> bool:
    origin = typing.get_origin(tp)
    if tp is Any:
        return True
    if origin is typing.Union or (origin is not None and str(origin) == "<class 'types.UnionType'>"):
        return any(_type_ok(value, a) for a in typing.get_args(tp))
    if tp is type(None):
        return value is None
    if origin in (dict, Mapping):
        return isinstance(value, dict)
    if origin in (list, tuple):
        return isinstance(value, (list, tuple))
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(tp, type):
        return isinstance(value, tp)
    return True


def _coerce(value: Any, tp: Any) -> Any:
    """Turn YAML/CLI scalars into the declared type where that is lossless."""
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    numeric = [a for a in (typing.get_args(tp) or (tp,)) if a in (int, float)]
    if numeric and isinstance(value, str):
        try:  # YAML 1.1 reads "1e-3" as a string
            return numeric[-1](value)
        except ValueError:
            return value
    if typing.get_origin(tp) is tuple and isinstance(value, list):
        return tuple(value)
    return value


@dataclass
class ConfigBase:
    """Base of every EchoRL config: validation, dict/YAML round-trip, overrides."""

    def __post_init__(self) -> None:
        hints = typing.get_type_hints(type(self))
        for f in dataclasses.fields(self):
            tp = hints[f.name]
            value = _coerce(getattr(self, f.name), tp)
            if isinstance(value, dict) and isinstance(tp, type) and issubclass(tp, ConfigBase):
                value = tp.from_dict(value, prefix=f"{self._name()}.{f.name}")
            object.__setattr__(self, f.name, value)
            self._check(f, value, tp)
        self.validate()

    # -- validation -------------------------------------------------------
    @classmethod
    def _name(cls) -> str:
        return cls.__name__

    def _fail(self, name: str, value: Any, allowed: str) -> None:
        raise ConfigError(f"{self._name()}.{name}={value!r} is invalid: {allowed}")

    def _check(self, f: dataclasses.Field, value: Any, tp: Any) -> None:
        if not _type_ok(value, tp):
            self._fail(f.name, value, f"expected {getattr(tp, '__name__', tp)}")
        meta = f.metadata
        if value is None or isinstance(value, (ConfigBase, dict, list, tuple, str, bool)):
            if meta.get("choices") is not None and value not in meta["choices"]:
                self._fail(f.name, value, f"allowed: {', '.join(map(str, meta['choices']))}")
            return
        if meta.get("min") is not None and value < meta["min"]:
            self._fail(f.name, value, f"must be >= {meta['min']}")
        if meta.get("gt") is not None and value <= meta["gt"]:
            self._fail(f.name, value, f"must be > {meta['gt']}")
        if meta.get("max") is not None and value > meta["max"]:
            self._fail(f.name, value, f"must be <= {meta['max']}")
        if isinstance(value, float) and value != value:
            self._fail(f.name, value, "must not be NaN")

    def validate(self) -> None:
        """Cross-field checks; override in subclasses."""

    # -- conversion -------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, ConfigBase):
                v = v.to_dict()
            elif isinstance(v, tuple):
                v = list(v)
            out[f.name] = v
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], prefix: str | None = None) -> "ConfigBase":
        prefix = prefix or cls._name()
        if not isinstance(data, Mapping):
            raise ConfigError(f"{prefix} must be a mapping, got {type(data).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ConfigError(f"unknown field {prefix}.{unknown[0]}; allowed: {', '.join(sorted(names))}")
        hints = typing.get_type_hints(cls)
        kwargs = {}
        for k, v in data.items():
            tp = hints[k]
            if isinstance(tp, type) and issubclass(tp, ConfigBase) and isinstance(v, Mapping):
                v = tp.from_dict(v, prefix=f"{prefix}.{k}")
            kwargs[k] = v
        return cls(**kwargs)

    def replace(self, **changes: Any) -> "ConfigBase":
        return dataclasses.replace(self, **changes)

    # -- YAML -------------------------------------------------------------
    def save_yaml(self, path: str | os.PathLike) -> None:
        """Write atomically so a crash never leaves half a config."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".config-", suffix=".yaml")
        with os.fdopen(fd, "w") as fh:
            yaml.safe_dump(self.to_dict(), fh, sort_keys=False)
        os.replace(tmp, path)

    @classmethod
    def load_yaml(cls, path: str | os.PathLike) -> "ConfigBase":
        path = Path(path)
        if not path.is_file():  # also refuses a FIFO or a device, which would hang or never end
            raise ConfigError(f"config file {path} does not exist")
        try:
            with open(path, "rb") as fh:
                data = fh.read(CONFIG_CAP + 1)
            if len(data) > CONFIG_CAP:
                raise ConfigError(f"config file {path} is over the {CONFIG_CAP >> 20} MiB cap for a config")
            text = data.decode("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read config file {path}: {getattr(exc, 'strerror', None) or exc}") from None
        return cls.from_yaml_text(text, f"config file {path}")

    @classmethod
    def from_yaml_text(cls, text: str, source: str) -> "ConfigBase":
        """A config from YAML text (``source`` names it in errors)."""
        return cls.from_dict(load_yaml_text(text, source) or {}, prefix=cls._name())

    # -- overrides --------------------------------------------------------
    def with_overrides(self, overrides: Mapping[str, Any]) -> "ConfigBase":
        """Apply ``{"ppo_config.learning_rate": 1e-3, ...}``; values may be YAML strings."""
        data = self.to_dict()
        for key, raw in overrides.items():
            value = load_yaml_text(raw, f"override {key}") if isinstance(raw, str) else raw
            node, parts = data, key.split(".")
            for i, part in enumerate(parts):
                if not isinstance(node, dict) or part not in node:
                    scope = ".".join([self._name(), *parts[:i]])
                    allowed = ", ".join(sorted(node)) if isinstance(node, dict) else "none"
                    raise ConfigError(f"unknown field {scope}.{part}; allowed: {allowed}")
                if i == len(parts) - 1:
                    node[part] = value
                else:
                    node = node[part]
        return type(self).from_dict(data)


def parse_override(text: str) -> tuple[str, str]:
    """Split a ``key=value`` CLI override."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} must look like field.path=value")
    key, value = text.split("=", 1)
    return key.strip(), value
