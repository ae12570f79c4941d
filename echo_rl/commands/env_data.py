"""`echo-rl env-data`: where the text tasks' data is looked for; download it when asked."""

from __future__ import annotations

import argparse

from echo_rl.config import ConfigError
from echo_rl.environments import datasets

NAME = "env-data"
HELP = "show where each text task's data is looked for and whether it is there; --download NAME fetches it"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--download", metavar="NAME", help="fetch a task's upstream files: alfworld, cruxeval, arc "
                   "(webshop: prints the manual steps)")
    p.add_argument("--dest", help="folder to download into (default: where the environment looks)")


def run(args: argparse.Namespace) -> int:
    if args.download:
        if args.download not in (*datasets.SOURCES, "webshop"):
            raise ConfigError(f"--download={args.download!r} is invalid: allowed: "
                              f"{', '.join(sorted(datasets.SOURCES))}, webshop")
        if args.download == "webshop":
            print(datasets.WEBSHOP_HOWTO)
            return 1
        path = datasets.download(args.download, args.dest)
        print(f"{args.download}: downloaded into {path}")
        return 0
    for name, row in datasets.status().items():
        mark = "ok     " if row["found"] else "MISSING"
        hint = f" (set ${row['env_var']} or pass data_dir)" if row["env_var"] and not row["found"] else ""
        print(f"{mark} {name:9s} {row['path']}{hint}")
    return 0
