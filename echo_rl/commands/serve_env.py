"""`echo-rl serve-env TASK`: one of EchoRL's text tasks as an OpenEnv environment server."""

from __future__ import annotations

import argparse
import sys

from echo_rl.commands.eval import _env_options
from echo_rl.config import ConfigError
from echo_rl.environments.openenv_server import build_app, is_loopback
from echo_rl.serve.server import ModelServer

NAME = "serve-env"
HELP = ("serve a text task (minigrid, terminal, ...) as an OpenEnv environment server (/ws sessions, /reset, /step, "
        "/state) for OpenEnv clients and the trainers built on them")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("task", help="a registered text task: minigrid, minigrid:<EnvId>, terminal, alfworld, ...")
    p.add_argument("--set", metavar="FIELD=VALUE", action="append", default=[],
                   help="the task's environment option, e.g. --set level=1 for terminal (repeatable); clients "
                        "cannot change them")
    p.add_argument("--host", default="127.0.0.1", help="interface to listen on (default: loopback only)")
    p.add_argument("--port", type=int, default=8001, help="TCP port (default 8001)")
    p.add_argument("--max-sessions", type=int, default=8, help="concurrent /ws sessions (one environment each)")
    p.add_argument("--session-timeout", type=float, default=600.0, help="seconds before an idle session is reaped")
    p.add_argument("--max-request-bytes", type=int, default=1 << 16,
                   help="largest HTTP body or WebSocket message accepted (default 64 KiB)")
    p.add_argument("--max-action-chars", type=int, default=8192, help="longest action text accepted")
    p.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))


def run(args: argparse.Namespace) -> int:
    if not 0 <= args.port <= 65535:
        raise ConfigError(f"--port={args.port} is invalid: must be in [0, 65535]")
    app = build_app(args.task, _env_options(args.set), max_sessions=args.max_sessions,
                    session_timeout=args.session_timeout, max_request_bytes=args.max_request_bytes,
                    max_action_chars=args.max_action_chars)
    if not is_loopback(args.host):
        print(f"echo-rl serve-env: warning: listening on {args.host}, not loopback: anyone who reaches this port can "
              "run episodes", file=sys.stderr)
    print(f"echo-rl serve-env: {args.task} as an OpenEnv server on http://{args.host}:{args.port} (sessions: "
          f"ws://{args.host}:{args.port}/ws, at most {args.max_sessions})", flush=True)
    server = ModelServer(app, args.host, args.port, log_level=args.log_level,
                         uvicorn_options={"lifespan": "on", "ws_max_size": args.max_request_bytes})
    server.serve_forever()
    return 0
