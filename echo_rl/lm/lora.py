"""LoRA adapters for language-model training (``lm_config.lora_rank > 0``), through ``peft``.

Adapters are injected into the policy itself (``get_peft_model(...).get_base_model()``): the learner keeps
a plain transformers causal LM whose target projections carry LoRA A/B matrices, so its forward, its
chunked LM head and activation checkpointing are unchanged; only the adapters require gradients, so
AdamW keeps moments for them alone. The engine never sees adapters: it runs a plain copy whose weights
are W + (alpha / r)·B·A (:func:`merged_state_dict`), reloaded after every update like full weights.
Checkpoints hold the injected model's state (frozen base + adapters), which a run built with the same
``lora_*`` settings loads back exactly.
"""

from __future__ import annotations

import copy
import sys
from typing import Any

import torch

ADAPTER = "default"


def _peft() -> Any:
    try:
        import peft
    except ImportError as exc:  # one line naming the fix
        raise ImportError("lm_config.lora_rank > 0 needs peft: pip install 'echo-rl[lora]'") from exc
    return peft


def add_lora(model: Any, rank: int, alpha: float, targets: str) -> Any:
    """``model`` with LoRA adapters of ``rank`` on the modules named in ``targets`` (comma-separated); every
    other weight frozen. Raises a one-line ``ValueError`` when no module of the model has such a name."""
    peft = _peft()
    names = [t.strip() for t in targets.split(",") if t.strip()]
    present = {n.rsplit(".", 1)[-1] for n, _ in model.named_modules()}
    missing = [n for n in names if n not in present]
    if missing:
        linear = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)})
        raise ValueError(f"lm_config.lora_targets={targets!r} is invalid: the model has no module {missing[0]!r}; "
                         f"its linear layers: {', '.join(linear)}")
    config = peft.LoraConfig(r=rank, lora_alpha=alpha, target_modules=names, lora_dropout=0.0, bias="none")
    return peft.get_peft_model(model, config).get_base_model()


def is_lora(model: Any) -> bool:
    return any(_is_lora_layer(m) for m in model.modules())


def _is_lora_layer(module: Any) -> bool:
    lora = sys.modules.get("peft.tuners.lora")  # no peft imported: no adapter can exist
    return lora is not None and isinstance(module, lora.LoraLayer)


def merged_state_dict(model: Any) -> dict[str, torch.Tensor]:
    """The plain model's state dict (no adapter keys) with each adapted weight merged: W + scale·B·A."""
    state = {}
    for key, value in model.state_dict().items():
        if ".lora_" in key:
            continue
        state[key.replace(".base_layer.", ".")] = value.detach().clone()
    with torch.no_grad():
        for name, module in model.named_modules():
            if _is_lora_layer(module) and ADAPTER in getattr(module, "lora_A", {}):
                state[f"{name}.weight"] += module.get_delta_weight(ADAPTER).to(state[f"{name}.weight"].dtype)
    return state


def plain_copy(model: Any) -> Any:
    """A copy of ``model`` without adapter modules, its weights merged (what the engine runs)."""
    out = copy.deepcopy(model)
    with torch.no_grad():
        for name, module in list(out.named_modules()):
            if not _is_lora_layer(module):
                continue
            base = module.base_layer
            if ADAPTER in module.lora_A:
                base.weight += module.get_delta_weight(ADAPTER).to(base.weight.dtype)
            parent, _, child = name.rpartition(".")
            setattr(out.get_submodule(parent) if parent else out, child, base)
    for p in out.parameters():
        p.requires_grad_(True)
    return out
