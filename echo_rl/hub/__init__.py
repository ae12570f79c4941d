"""The project's published results and trained policies, shipped inside the package.

- :mod:`echo_rl.hub.scores`: every per-seed number of ``docs/results.md`` (final
  scores and, where the study reports them, learning curves) with the command and
  commit that made them, as arrays for :mod:`echo_rl.utils.statistics`;
- :mod:`echo_rl.hub.models`: trained MiniGrid policies as ONNX files
  (``python -m echo_rl.hub.build_models`` makes them), loadable by name with
  ``echo_rl.load_policy``;
- ``data/recipes``: training recipes (``models.recipe_path``), written once here and linked from ``configs/``;
- ``python -m echo_rl.hub.apps.ppo_minigrid --env-id ...``: one-line training apps.
"""

from echo_rl.hub import models, scores  # noqa: E402,F401  (both light: json and importlib.resources)

__all__ = ["models", "scores"]
