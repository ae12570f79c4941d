"""Prompting baselines over any backbone and any text environment: ReAct (and Act-only) and Tree of Thoughts."""

from echo_rl.prompting.base import EpisodeResult, TextAgent
from echo_rl.prompting.react import ReActAgent
from echo_rl.prompting.runner import AGENT_NAMES, build_agent, evaluate_text_agent
from echo_rl.prompting.tot import TreeOfThoughtsAgent

__all__ = ["AGENT_NAMES", "EpisodeResult", "ReActAgent", "TextAgent", "TreeOfThoughtsAgent", "build_agent",
           "evaluate_text_agent"]
