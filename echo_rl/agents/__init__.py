"""The promised import path of the prompting baselines; they live in :mod:`echo_rl.prompting`.

"Agent" names the RL agents elsewhere (:mod:`echo_rl.vector`, :mod:`echo_rl.lm`),
so the prompting baselines have their own room; this path keeps user code working.
"""

from echo_rl.prompting import (AGENT_NAMES, EpisodeResult, ReActAgent, TextAgent, TreeOfThoughtsAgent, build_agent,
                               evaluate_text_agent)

__all__ = ["AGENT_NAMES", "EpisodeResult", "ReActAgent", "TextAgent", "TreeOfThoughtsAgent", "build_agent",
           "evaluate_text_agent"]
