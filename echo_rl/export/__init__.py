"""From a trained run to something else can use: exported files and ``load_policy``.

- vector policies (PPO, IMPALA, the EchoRL agent with its plan path) -> ONNX
  (optionally int8) or safetensors: data, never code (:mod:`echo_rl.export.vector`,
  graph in :mod:`echo_rl.export.graph`);
- language-model runs -> a plain transformers checkpoint directory
  (:mod:`echo_rl.export.lm`);
- :func:`load_policy`: ``act(obs)`` over a run directory or an exported file
  (:mod:`echo_rl.export.loading`; ``echo_rl.load_policy`` adds hub models).
"""

from __future__ import annotations

from echo_rl.export.loading import Policy, load_policy

__all__ = ["Policy", "load_policy"]
