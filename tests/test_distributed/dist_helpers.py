"""Shared fixtures: a small schema whose samples carry (writer, seq) so tests can count them exactly."""

import numpy as np
from echo_rl.replay import PrioritizedReplayBuffer


def example() -> dict:
    return {"obs": np.zeros(6, np.float32), "action": np.zeros(1, np.int64), "done": np.zeros(1, bool)}


def make(writer: int, seq: int) -> dict:
    s = example()
    s["obs"][0], s["obs"][1] = writer, seq
    s["action"][0] = writer * 1_000_000 + seq
    return s


def make_batch(writer: int, first: int, n: int) -> dict:
    seqs = np.arange(first, first + n)
    obs = np.zeros((n, 6), np.float32)
    obs[:, 0], obs[:, 1] = writer, seqs
    return {"obs": obs, "action": (writer * 1_000_000 + seqs)[:, None].astype(np.int64), "done": np.zeros((n, 1), bool)}


class RecordingBuffer(PrioritizedReplayBuffer):
    """The real buffer, also remembering the key of every sample ever added (to check exactly-once)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.keys: list[np.ndarray] = []

    def add_granted(self, batch, priorities=None):  # every store goes through it (add calls it too)
        ids = super().add_granted(batch, priorities)
        self.keys.append(np.array(batch["action"][:, 0], copy=True))
        return ids

    def all_keys(self) -> np.ndarray:
        return np.concatenate(self.keys) if self.keys else np.zeros(0, np.int64)
