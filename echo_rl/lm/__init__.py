"""Language-model agents on text tasks: generator, learner, objectives, trajectories, chat rendering, SFT, LoRA.

The agent (:class:`echo_rl.lm.loop.LMAgent`) implements the trainer's protocol
and is named in the agent registry as ``"module:Class"``; the run
infrastructure (:mod:`echo_rl.training`) sits below this room and never
imports it.
"""
