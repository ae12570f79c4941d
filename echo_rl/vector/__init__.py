"""Small-policy agents on vector environments and their updates: PPO, IMPALA, DQN, the EchoRL agent.

Each agent implements the trainer's protocol (:mod:`echo_rl.training.protocol`)
and is named in the agent registry (:mod:`echo_rl.training.agents`) as
``"module:Class"``, so the run infrastructure never imports this room; the
Ray variants (``ray_backend``, ``ray_offpolicy``, ``ray_acting``) live here
beside the agents they distribute.
"""
