"""Backbones behind one protocol: API models, local checkpoints, tiny models built from config.

``load_backbone(name_or_path)`` is the entry point; heavy libraries
(transformers, openai) load only when a backbone that needs them is built.
"""

from echo_rl.models.backbone import (Backbone, CapabilityError, Completion, SamplingParams, TokenLogprob,
                                     Usage)
from echo_rl.models.config import BackboneConfig
from echo_rl.models.loader import load_backbone
from echo_rl.models.resolve import backbone_names, register_backbone
from echo_rl.models.pricing import PriceTable
from echo_rl.models.scripted import ScriptedBackbone

__all__ = ["Backbone", "BackboneConfig", "CapabilityError", "Completion", "PriceTable", "SamplingParams",
           "ScriptedBackbone", "TokenLogprob", "Usage", "backbone_names", "load_backbone", "register_backbone"]
