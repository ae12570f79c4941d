"""The policy a text-task run trains: which checkpoint a backbone name means, and defaults that suit it.

A tiny random model (tests, the study's ``tiny`` preset) and a pretrained instruct model (``smollm2-135m`` or
a local checkpoint) need different learning rates and warm starts; ``resolve_lm_defaults`` fills every
``lm_config`` field left at None from which of the two was loaded.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

from echo_rl.config import ConfigError, TrainingConfig
from echo_rl.lm.chat_delta import ChatRenderer, check_prefix_preserving
from echo_rl.models.resolve import resolve_backbone
from echo_rl.models.tiny import PRESETS


def load_policy(backbone: str, seed: int) -> tuple[Any, Any]:
    """(model, tokenizer) of a local backbone: a tiny preset or a checkpoint directory with a tokenizer."""
    import transformers

    from echo_rl.models.local import check_no_custom_code, load_errors  # torch and transformers: on first use

    supported = f"tiny, {', '.join('tiny:' + p for p in PRESETS)} or a local checkpoint directory"
    ref = resolve_backbone(backbone, strict=False)  # the resolver prompting uses: a name means one thing
    if ref is not None and ref.kind in ("api", "url"):
        raise ConfigError(f"backbone={backbone!r} is invalid: API models cannot be trained (no weights); training "
                          f"supports {supported}")
    if ref is not None and ref.kind == "registered":
        raise ConfigError(f"backbone={backbone!r} is invalid: a registered backbone is built by its factory and has "
                          f"no checkpoint to train; training supports {supported}")
    path = ref.checkpoint(seed=seed) if ref is not None else Path(backbone).expanduser()
    if ref is None or ref.kind == "checkpoint":
        if not (path / "config.json").is_file():
            raise ConfigError(f"backbone={backbone!r} is invalid: not a tiny preset (tiny, "
                              f"{', '.join('tiny:' + p for p in PRESETS)}) nor a local checkpoint directory "
                              "with config.json")
        if not any((path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json")):
            raise ConfigError(f"backbone={str(path)!r} is invalid: the checkpoint directory has no tokenizer "
                              "(tokenizer.json / tokenizer_config.json)")
    check_no_custom_code(path)
    with load_errors(path, "tokenizer"):
        tok = transformers.AutoTokenizer.from_pretrained(str(path), local_files_only=True, trust_remote_code=False)
    if not getattr(tok, "chat_template", None):
        raise ConfigError(f"backbone={backbone!r} is invalid: its tokenizer has no chat template "
                          "(tokenizer_config.json: chat_template)")
    check_prefix_preserving(ChatRenderer(tok))  # a template that rewrites earlier turns: one clear error, first
    transformers.utils.logging.disable_progress_bar()  # no "Loading weights" bars in training logs
    with load_errors(path, "weights"):
        model = transformers.AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True,
                                                                  dtype=torch.float32, trust_remote_code=False)
    return model.eval(), tok


TINY_PARAMS = 10_000_000  # below: a tiny preset or test checkpoint (random weights); above: a real, pretrained LM


def is_tiny(model: Any) -> bool:
    return sum(p.numel() for p in model.parameters()) < TINY_PARAMS


def resolve_lm_defaults(config: TrainingConfig, tiny: bool) -> TrainingConfig:
    """``lm_config`` fields left at None take the value that suits the backbone: a tiny random model learns
    fast at large rates; a pretrained one is wrecked by them (a 3e-3 SFT step erases its language). On
    SmolLM2-135M, 4 full-batch SFT steps on 8 demos taught the reply format but solved 2/8 held-out MiniGrid
    episodes; 18 minibatch steps of 8 of 48 demos at 5e-5 solved 52/64 and 64/64 (seeds 0, 1: docs/results.md,
    the real-model study)."""
    lm = config.lm_config
    pick = lambda value, t, p: value if value is not None else t if tiny else p  # noqa: E731
    return dataclasses.replace(config, lm_config=dataclasses.replace(
        lm, learning_rate=pick(lm.learning_rate, 1e-4, 1e-5),
        sft_learning_rate=pick(lm.sft_learning_rate, 3e-3, 5e-5),
        sft_episodes=pick(lm.sft_episodes, 16, 48), sft_steps=pick(lm.sft_steps, 20, 18),
        sft_batch_episodes=pick(lm.sft_batch_episodes, 0, 8)))
