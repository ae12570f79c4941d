"""Backbone configuration (owned by ``echo_rl.models``)."""

from __future__ import annotations

from dataclasses import dataclass

from echo_rl.config import ConfigBase, spec
from echo_rl.models.pricing import PriceTable


@dataclass
class BackboneConfig(ConfigBase):
    """How :func:`echo_rl.models.load_backbone` builds a backbone; every field is optional."""

    device: str = spec("auto", help="local models: auto, cpu, cuda, cuda:N or mps")
    dtype: str = spec("auto", help="local models: weight dtype", choices=("auto", "float32", "bfloat16", "float16"))
    max_context: int | None = spec(None, help="local models: context length cap (None: the model's own)")
    base_url: str | None = spec(None, help="API models: override the provider's endpoint")
    model: str | None = spec(None, help="openai-compatible URLs: model id (None: the server's first model)")
    api_key_env: str | None = spec(None, help="API models: environment variable holding the key")
    timeout: float = spec(60.0, help="API models: seconds per request before it fails", gt=0)
    max_retries: int = spec(5, help="API models: retries with exponential backoff on 408/409/429/5xx", min=0)
    requests_per_minute: float | None = spec(None, help="API models: client-side rate limit (None: off)")
    prices: dict = spec(default_factory=dict, help="model -> [USD per 1M input tokens, per 1M output tokens]")
    tiny_seed: int = spec(0, help="tiny models: initialisation seed", min=0)

    def validate(self) -> None:
        if self.requests_per_minute is not None and self.requests_per_minute <= 0:
            self._fail("requests_per_minute", self.requests_per_minute, "must be > 0 or None")
        if self.max_context is not None and self.max_context < 1:
            self._fail("max_context", self.max_context, "must be >= 1 or None")

        PriceTable(self.prices)  # raises on a malformed entry
