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


def spy_actor_creation(monkeypatch, ray) -> list:
    """Record every Ray actor's constructor arguments (what its creation spec, kept by the GCS, carries):
    ``ray.remote(**options)(cls).remote(*args, **kwargs)`` appends ``(cls.__name__, args, kwargs)``."""
    created: list = []
    real = ray.remote

    def remote(*args, **options):
        if args:  # bare @ray.remote: not how EchoRL creates actors
            return real(*args, **options)
        decorate = real(**options)

        def wrap(cls):
            actor_cls = decorate(cls)

            class Spy:
                def remote(self, *a, **kw):
                    created.append((cls.__name__, a, kw))
                    return actor_cls.remote(*a, **kw)

            return Spy()

        return wrap

    monkeypatch.setattr(ray, "remote", remote)
    return created


def holds(args, secret) -> bool:
    """Whether ``secret`` (str or bytes) appears anywhere in ``args`` once pickled, as Ray serializes them."""
    import pickle

    data = pickle.dumps(args)
    raw = secret.encode() if isinstance(secret, str) else secret
    return raw in data or (isinstance(secret, bytes) and secret.hex().encode() in data)
