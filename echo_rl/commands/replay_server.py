"""`echo-rl replay-server`: a standalone replay ingestion server (writers push, learners sample)."""

from __future__ import annotations

import argparse

from echo_rl.config import ConfigError
from echo_rl.utils.monitoring import JsonlLogger

NAME = "replay-server"
HELP = "serve a prioritized replay buffer to many writers (shared memory / TCP) and remote learners"

_DTYPES = ("float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
           "uint64", "bool")


class _Invalid:
    """A flag value that does not parse; :func:`run` reports it as one ConfigError line (argparse's own error
    would print the whole usage)."""

    def __init__(self, text: str, allowed: str):
        self.text, self.allowed = text, allowed


def _typed(kind, what: str):
    def parse(text: str):
        try:
            return kind(text)
        except ValueError:
            return _Invalid(text, f"expected {what}")
    return parse


def _one_of(*allowed: str):
    def parse(text: str):
        return text if text in allowed else _Invalid(text, f"allowed: {', '.join(allowed)}")
    return parse


_int, _float = _typed(int, "an integer"), _typed(float, "a number")
_SAMPLING_MODES = ("proportional", "softmax")
_SAMPLERS = ("prioritized", "uniform", "fifo")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--leaf", action="append", default=[], metavar="NAME:DTYPE:SHAPE",
                   help="one leaf of the flat sample dict, e.g. obs:float32:84 or frame:uint8:3x64x64 or "
                        "reward:float32: (scalar); repeat per leaf")
    p.add_argument("--schema-json", default=None,
                   help="a file with Schema.to_json() of a nested sample (instead of --leaf)")
    p.add_argument("--capacity", type=_int, default=1_000_000, help="buffer capacity in samples")
    p.add_argument("--sampling-mode", default="proportional", type=_one_of(*_SAMPLING_MODES),
                   metavar="{" + ",".join(_SAMPLING_MODES) + "}", help=f"how priorities become probabilities: {', '.join(_SAMPLING_MODES)}")
    p.add_argument("--min-experiences", type=_int, default=1000, help="samples stored before learners may sample")
    p.add_argument("--sampler", default="prioritized", type=_one_of(*_SAMPLERS),
                   metavar="{" + ",".join(_SAMPLERS) + "}", help=f"which samples a batch draws: {', '.join(_SAMPLERS)}")
    p.add_argument("--samples-per-insert", type=_float, default=None,
                   help="rate limiter (Reverb's SampleToInsertRatio, min size = --min-experiences); needs --error-buffer")
    p.add_argument("--error-buffer", type=_float, default=None, help="the rate limiter's band half-width")
    p.add_argument("--checkpoint", default=None, help="restore from this file if it exists, and checkpoint to it")
    p.add_argument("--checkpoint-every", type=_float, default=60.0, help="seconds between checkpoints (with --checkpoint)")
    p.add_argument("--seed", type=_int, default=0)
    p.add_argument("--host", default="127.0.0.1", help="interface to listen on (default: loopback only)")
    p.add_argument("--port", type=_int, default=7470, help="TCP port (0: any free port, printed at start)")
    p.add_argument("--shm-capacity", type=_int, default=1 << 16, help="samples per shared-memory ring")
    p.add_argument("--metrics-jsonl", default=None, help="append server metrics here every --metrics-every s")
    p.add_argument("--metrics-every", type=_float, default=10.0, help="seconds between metric lines")
    p.add_argument("--duration", type=_float, default=0.0, help="stop after this many seconds (0: run until ^C)")
    p.add_argument("--secret-file", default=None,
                   help="file holding a shared secret every client must prove it knows (HMAC handshake); default: "
                        "$ECHORL_REPLAY_SECRET if set, else no authentication")
    p.add_argument("--max-connections", type=_int, default=256, help="open connections at most (more are refused)")
    p.add_argument("--handshake-timeout", type=_float, default=10.0, help="seconds a client has for the whole handshake")
    p.add_argument("--idle-timeout", type=_float, default=600.0,
                   help="seconds a TCP writer or learner may go without completing a frame (0: never dropped)")
    p.add_argument("--max-rings", type=_int, default=64, help="shared-memory rings at most")
    p.add_argument("--max-rings-per-client", type=_int, default=4, help="shared-memory rings one client_id may hold")


def _parse_leaf(text: str):
    import numpy as np

    parts = text.split(":")
    if len(parts) != 3 or not parts[0]:
        raise ConfigError(f"--leaf={text!r} is invalid: expected NAME:DTYPE:SHAPE (e.g. obs:float32:84)")
    name, dtype, shape = parts
    if dtype not in _DTYPES:
        raise ConfigError(f"--leaf={text!r} is invalid: dtype {dtype!r} not in {', '.join(_DTYPES)}")
    try:
        dims = tuple(int(d) for d in shape.split("x")) if shape else ()
    except ValueError:
        dims = (-1,)
    if any(d < 1 for d in dims):
        raise ConfigError(f"--leaf={text!r} is invalid: shape must be positive ints joined by 'x' (or empty)")
    return name, np.zeros(dims, dtype=dtype)


def build_schema(args):
    import json

    from echo_rl.replay.schema import Schema  # numpy: loaded on first use

    if bool(args.leaf) == bool(args.schema_json):
        raise ConfigError("give the sample schema either as --leaf NAME:DTYPE:SHAPE (repeated) or --schema-json FILE")
    if args.schema_json:
        try:
            with open(args.schema_json) as fh:
                return Schema.from_json(json.load(fh))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"--schema-json={args.schema_json!r} is invalid: {exc}") from None
    example = dict(_parse_leaf(t) for t in args.leaf)
    if len(example) != len(args.leaf):
        raise ConfigError("--leaf: a leaf name is given twice")
    return Schema.from_example(example)


def _read_secret(path):
    """The shared secret from --secret-file (one trailing newline stripped) or $ECHORL_REPLAY_SECRET; never printed."""
    from echo_rl.distributed.protocol import secret_from_env  # numpy: loaded on first use

    if path is None:
        return secret_from_env()
    try:
        with open(path, "rb") as fh:
            secret = fh.read()
    except OSError as exc:
        raise ConfigError(f"--secret-file={path!r} cannot be read: {exc.strerror or exc}") from None
    secret = secret[:-1] if secret.endswith(b"\n") else secret
    if not secret:
        raise ConfigError(f"--secret-file={path!r} is empty: it must hold the shared secret")
    return secret


def run(args: argparse.Namespace) -> int:
    import time

    from echo_rl.distributed import ReplayServer  # numpy: loaded on first use
    from echo_rl.replay import PrioritizedReplayBuffer  # numpy: loaded on first use

    for dest, value in vars(args).items():
        if isinstance(value, _Invalid):
            raise ConfigError(f"--{dest.replace('_', '-')}={value.text!r} is invalid: {value.allowed}")
    for flag, value, lo in (("--capacity", args.capacity, 1), ("--min-experiences", args.min_experiences, 1),
                            ("--shm-capacity", args.shm_capacity, 2)):
        if value < lo:
            raise ConfigError(f"{flag}={value} is invalid: must be >= {lo}")
    if not 0 <= args.port <= 65535:
        raise ConfigError(f"--port={args.port} is invalid: must be in [0, 65535]")
    if args.metrics_every <= 0:
        raise ConfigError(f"--metrics-every={args.metrics_every} is invalid: must be > 0")
    for flag, value, lo in (("--max-connections", args.max_connections, 1), ("--max-rings", args.max_rings, 0),
                            ("--max-rings-per-client", args.max_rings_per_client, 0)):
        if value < lo:
            raise ConfigError(f"{flag}={value} is invalid: must be >= {lo}")
    for flag, value in (("--handshake-timeout", args.handshake_timeout), ("--idle-timeout", args.idle_timeout)):
        if not value >= 0 or (flag == "--handshake-timeout" and value == 0):
            raise ConfigError(f"{flag}={value} is invalid: must be > 0" + (" (or 0: none)" if "idle" in flag else ""))
    secret = _read_secret(args.secret_file)
    schema = build_schema(args)
    example = schema.unflatten([__import__("numpy").zeros(lf.shape, lf.dtype) for lf in schema.leaves])
    if (args.samples_per_insert is None) != (args.error_buffer is None):
        raise ConfigError("--samples-per-insert and --error-buffer go together (a rate limiter needs both)")
    if args.checkpoint_every <= 0:
        raise ConfigError(f"--checkpoint-every={args.checkpoint_every} is invalid: must be > 0")
    limiter = None
    if args.samples_per_insert is not None:
        from echo_rl.replay import RateLimiter  # numpy: loaded on first use

        try:
            limiter = RateLimiter.sample_to_insert_ratio(args.samples_per_insert, args.min_experiences,
                                                         args.error_buffer)
        except ValueError as exc:
            raise ConfigError(f"--samples-per-insert/--error-buffer: {exc}") from None
    buffer = PrioritizedReplayBuffer(args.capacity, mode=args.sampling_mode, min_experiences=args.min_experiences,
                                     example=example, seed=args.seed, sampler=args.sampler, rate_limiter=limiter)
    logger = JsonlLogger(args.metrics_jsonl).open() if args.metrics_jsonl else None
    server = ReplayServer(buffer, args.host, args.port, shm_capacity=args.shm_capacity, secret=secret,
                          max_connections=args.max_connections, handshake_timeout=args.handshake_timeout,
                          idle_timeout=args.idle_timeout or None, max_rings=args.max_rings,
                          max_rings_per_client=args.max_rings_per_client, checkpoint_path=args.checkpoint,
                          checkpoint_every=args.checkpoint_every if args.checkpoint else None)
    try:
        server.start()
    except ValueError as exc:  # a --checkpoint file that does not fit this schema or capacity
        raise ConfigError(f"--checkpoint={args.checkpoint!r} cannot be restored: {exc}") from None
    except OSError as exc:
        raise ConfigError(f"--host/--port {args.host}:{args.port} cannot be bound: {exc.strerror or exc}") from None
    print(f"echo-rl replay-server: listening on {args.host}:{server.port} (schema: {schema.describe()}; "
          f"{'shared-secret authentication' if secret else 'no authentication'})", flush=True)
    start = time.monotonic()
    step = 0
    try:
        while not args.duration or time.monotonic() - start < args.duration:
            time.sleep(min(args.metrics_every, max(0.05, args.duration - (time.monotonic() - start)))
                       if args.duration else args.metrics_every)
            step += 1
            m = server.metrics()
            if logger is not None:
                logger.log(m, step)
            print(f"stored {int(m['replay/samples_added'])} samples, {m['replay/ingest_samples_per_s']:.0f}/s, "
                  f"{int(m['replay/connections'])} connections", flush=True)
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
        if logger is not None:
            logger.close()
    return 0
