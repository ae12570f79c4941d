"""`echo-rl serve`: an OpenAI-compatible server for a local checkpoint or a tiny model."""

from __future__ import annotations

import argparse
from pathlib import Path

from echo_rl.config import ConfigError
from echo_rl.models import load_backbone
from echo_rl.models.local import LocalBackbone, check_checkpoint_dir
from echo_rl.models.resolve import resolve_backbone
from echo_rl.serve import ModelServer, create_app

NAME = "serve"
HELP = "serve a local backbone (checkpoint path or tiny preset) behind an OpenAI-compatible HTTP API"


def add_arguments(p: argparse.ArgumentParser) -> None:
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--backbone", help="a checkpoint directory, tiny / tiny:<preset>, or smollm2-135m (after "
                                         "echo-rl models fetch)")
    what.add_argument("--run-dir", help="a language-model run `echo-rl train` wrote: its newest checkpoint is "
                                        "exported (RUN/export/transformers, reused while current) and served")
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
    if not 0 <= args.port <= 65535:
        raise ConfigError(f"--port={args.port} is invalid: must be in [0, 65535]")
    if args.default_max_tokens < 1:
        raise ConfigError(f"--default-max-tokens={args.default_max_tokens} is invalid: must be >= 1")
    if args.torch_threads < 0:
        raise ConfigError(f"--torch-threads={args.torch_threads} is invalid: must be >= 0 (0: torch's default)")
    if args.torch_threads:
        import torch

        torch.set_num_threads(args.torch_threads)

    if args.run_dir is not None:
        args.backbone = str(current_export(Path(args.run_dir)))
        args.model_name = args.model_name or Path(args.run_dir).name

    ref = resolve_backbone(args.backbone, strict=False)
    if ref is None or ref.kind == "checkpoint":
        # a checkpoint directory (or a typo of one), checked here so it reads "does not exist", not "unknown backbone"
        try:
            check_checkpoint_dir(Path(args.backbone).expanduser())
        except ConfigError as exc:
            raise ConfigError(f"--backbone={args.backbone!r} is invalid: {exc}") from None
    remote = ref is not None and ref.kind in ("api", "url")
    backbone = None if remote else load_backbone(args.backbone, device=args.device, dtype=args.dtype,
                                                 max_context=args.max_context)
    if not isinstance(backbone, LocalBackbone):
        raise ConfigError(f"--backbone={args.backbone!r} is invalid: serve needs a local checkpoint directory or "
                          "tiny / tiny:<preset> (API models are already served by their provider)")
    app = create_app(backbone, model_name=args.model_name, default_max_tokens=args.default_max_tokens)
    print(f"echo-rl serve: {args.model_name or backbone.name} on http://{args.host}:{args.port}/v1 "
          f"(device {backbone.device})", flush=True)
    ModelServer(app, args.host, args.port, log_level=args.log_level).serve_forever()
    return 0


def current_export(run_dir: Path) -> Path:
    """The run's transformers export of its newest checkpoint, written now unless an earlier one is current."""
    import json

    from echo_rl.export.lm import export_lm_run  # torch: loaded on first use
    from echo_rl.export.runs import run_config  # torch: loaded on first use
    from echo_rl.models.save import INFO_FILE  # with the export path it belongs to
    from echo_rl.training.run_dir import RunDirectory  # torch: loaded on first use

    if not run_dir.is_dir():
        raise ConfigError(f"--run-dir {run_dir} does not exist")
    config = run_config(run_dir)
    newest = RunDirectory(run_dir, config).latest_checkpoint()
    if newest is None:
        raise ConfigError(f"--run-dir {run_dir} has no checkpoint yet: train it first (echo-rl train --run-dir ...)")
    path = run_dir / "export" / "transformers"
    try:
        if json.loads((path / INFO_FILE).read_text()).get("checkpoint") == newest.name:
            return path
    except (OSError, ValueError, AttributeError):
        pass  # no earlier export, or an unreadable one: write it again
    return export_lm_run(run_dir, path)[0]
