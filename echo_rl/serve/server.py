"""Run the app with uvicorn in a background thread: for tests, notebooks and `echo-rl serve`."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

from echo_rl.config import ConfigError
from echo_rl.utils.optional import require


class ModelServer:
    """Serve ``app`` on ``host:port`` (port 0: a free port); ``start()``/``stop()`` or a ``with`` block.

    The socket is bound before the thread starts, so ``url`` is valid and
    connectable as soon as ``start()`` returns.
    """

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0, *, log_level: str = "warning",
                 uvicorn_options: dict | None = None) -> None:
        if not 0 <= int(port) <= 65535:
            raise ConfigError(f"port={port!r} is invalid: must be in [0, 65535]")
        self.app, self.host, self.port, self.log_level = app, host, int(port), log_level
        self.uvicorn_options = dict(uvicorn_options or {})  # e.g. lifespan="on", ws_max_size (echo-rl serve-env)
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._sock: socket.socket | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def start(self, timeout: float = 30.0) -> "ModelServer":
        uvicorn = require("uvicorn", "serve")
        if self._thread is not None:
            raise RuntimeError("server already started")
        sock = socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # no Nagle stall on small replies
        try:
            sock.bind((self.host, self.port))
        except OSError as exc:
            sock.close()
            raise ConfigError(f"cannot listen on {self.host}:{self.port}: {exc.strerror}") from None
        self.port = sock.getsockname()[1]
        self._sock = sock
        config = uvicorn.Config(self.app, **{"log_level": self.log_level, "lifespan": "off",
                                             "timeout_graceful_shutdown": 5, **self.uvicorn_options})
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]}, daemon=True,
                                        name=f"echo-rl-serve:{self.port}")
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"server on {self.host}:{self.port} did not start")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
        host = getattr(getattr(self.app, "state", None), "engine_host", None)
        if host is not None:  # lifespan is off here, so the app's engine is stopped by hand
            host.close(timeout)
        if self._sock is not None:
            self._sock.close()
        self._server = self._thread = self._sock = None

    def serve_forever(self) -> None:
        """Block in the calling thread (used by the CLI, so Ctrl-C stops it cleanly)."""
        uvicorn = require("uvicorn", "serve")
        uvicorn.run(self.app, host=self.host, port=self.port, log_level=self.log_level, **self.uvicorn_options)

    def __enter__(self) -> "ModelServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
