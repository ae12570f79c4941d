"""Train a user's own agent program: EchoRL serves the policy on loopback, runs the program, records each
episode token-exactly and takes one reward per episode (docs/external.md)."""

from echo_rl.external.client import report

__all__ = ["report"]
