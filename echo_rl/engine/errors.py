"""The engine's request errors that backbones share, in a module without torch so light callers can catch them."""

from echo_rl.config import ConfigError


class ContextLengthError(ConfigError):
    """A prompt (plus the tokens asked for) does not fit the model's context: the one error for it, raised by
    local backbones and by the engine alike, so callers (serve's 400, a runner failing one episode) catch one type."""


class AdmissionTimeout(TimeoutError):
    """A request waited ``ExecutionConfig.timeout`` seconds without being admitted, so it never ran: nothing was
    sampled and a retry with the same seed is exact. Servers pass it on as overload; an RL worker, whose own
    concurrency is bounded, retries it (:func:`echo_rl.lm.session.generate_admitted`) instead of losing an episode."""
