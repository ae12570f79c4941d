"""`echo-rl serve`: an OpenAI-compatible server for a local checkpoint or a tiny model."""

from __future__ import annotations

import argparse
from pathlib import Path

NAME = "serve"
HELP = "serve a local backbone (checkpoint path or tiny preset) behind an OpenAI-compatible HTTP API"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backbone", required=True, help="a checkpoint directory, tiny / tiny:<preset>, or "
                                                     "smollm2-135m (after echo-rl models fetch)")
    p.add_argument("--host", default="127.0.0.1", help="interface to listen on (default: loopback only)")
    p.add_argument("--port", type=int, default=8000, help="TCP port (default 8000)")
    p.add_argument("--model-name", default=None, help="model id clients send (default: the backbone name)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N or mps")
    p.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16"))
    p.add_argument("--max-context", type=int, default=None, help="context length cap (default: the model's)")
    p.add_argument("--default-max-tokens", type=int, default=256,
                   help="completion length when a chat request gives no max_tokens")
    p.add_argument("--torch-threads", type=int, default=0,
                   help="torch intra-op threads (default 0: torch's own); 1 is faster for small models on a busy "
                        "CPU, where the engine thread's tiny ops otherwise wait on each other")
    p.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))


def run(args: argparse.Namespace) -> int:
    from echo_rl.config import ConfigError
    from echo_rl.models import load_backbone
    from echo_rl.models.local import LocalBackbone
    from echo_rl.serve import ModelServer, create_app

    if not 0 <= args.port <= 65535:
        raise ConfigError(f"--port={args.port} is invalid: must be in [0, 65535]")
    if args.default_max_tokens < 1:
        raise ConfigError(f"--default-max-tokens={args.default_max_tokens} is invalid: must be >= 1")
    if args.torch_threads < 0:
        raise ConfigError(f"--torch-threads={args.torch_threads} is invalid: must be >= 0 (0: torch's default)")
    if args.torch_threads:
        import torch

        torch.set_num_threads(args.torch_threads)
    from echo_rl.models.loader import backbone_names
    from echo_rl.models.local import check_checkpoint_dir

    if args.backbone not in backbone_names() and not args.backbone.startswith("tiny:"):
        # not a name: a checkpoint directory, checked here so a typo is "does not exist", not "unknown backbone"
        try:
            check_checkpoint_dir(Path(args.backbone).expanduser())
        except ConfigError as exc:
            raise ConfigError(f"--backbone={args.backbone!r} is invalid: {exc}") from None
    backbone = load_backbone(args.backbone, device=args.device, dtype=args.dtype, max_context=args.max_context)
    if not isinstance(backbone, LocalBackbone):
        raise ConfigError(f"--backbone={args.backbone!r} is invalid: serve needs a local checkpoint directory or "
                          "tiny / tiny:<preset> (API models are already served by their provider)")
    app = create_app(backbone, model_name=args.model_name, default_max_tokens=args.default_max_tokens)
    print(f"echo-rl serve: {args.model_name or backbone.name} on http://{args.host}:{args.port}/v1 "
          f"(device {backbone.device})", flush=True)
    ModelServer(app, args.host, args.port, log_level=args.log_level).serve_forever()
    return 0
