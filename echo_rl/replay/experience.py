"""The product's transition-level API over a replay buffer: ``add_experience`` and ``sample_batch``.

Why a module of its own: the buffer itself stores and samples any pytree by priority; this is the
one place that knows the product's transition layout (state, latent plan, action, reward, next
state, done) and scores it by plan surprise. :class:`ExperienceAPI` is mixed into
:class:`~echo_rl.replay.buffer.PrioritizedReplayBuffer` and uses its lock, ``surprise``
calculator, ``add_one``, ``sample`` and ``set_temperature``.
"""

from __future__ import annotations

__all__ = ["ExperienceAPI"]


class ExperienceAPI:
    """``add_experience`` / ``sample_batch``: transitions in, ``(experiences, weights)`` out."""

    def add_experience(self, state, latent_plan, action, reward, next_state, done) -> int:
        """Store one transition scored by plan surprise; return its id.

        The score is ``surprise_weight * ||tau - tau_bar||^2 + reward_weight * |r|`` against the
        EMA plan before this one (which is then folded in). It is the sample's softmax score, or
        its priority in proportional mode.
        """
        with self._lock:
            score = self.surprise.score(latent_plan, reward)
            sample = {"state": state, "latent_plan": latent_plan, "action": action, "reward": reward,
                      "next_state": next_state, "done": done}
            return self.add_one(sample, priority=score)

    def sample_batch(self, batch_size: int, temperature: float | None = None):
        """Product API: ``(experiences, weights)``; ``experiences`` is the sampled pytree (a dict
        for ``add_experience`` data) with the ids under ``experiences["indices"]`` when it is a
        dict. A new ``temperature`` is kept for later calls."""
        with self._lock:
            if temperature is not None:
                self.set_temperature(temperature)
            batch = self.sample(batch_size)
            data = batch.data
            if isinstance(data, dict):
                data = dict(data)
                data["indices"] = batch.indices
            return data, batch.weights
