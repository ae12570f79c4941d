"""Run an EchoRL benchmark (`echo-rl benchmark`) and print the paper-style results table.

    python examples/benchmark_echo_rl.py --tasks minigrid minigrid:MiniGrid-Empty-5x5-v0 \
        --baselines random expert ppo --num-seeds 3 --num-episodes 20 --train-timesteps 8192

The full reproduction (every task and baseline; an API backbone without its
key is refused per cell with the reason, the others still run):

    python examples/benchmark_echo_rl.py --tasks alfworld webshop cruxeval arc minigrid \
        --baselines react tot ppo-rlhf rlaif impala --backbones tiny gpt-4o --num-seeds 5 --num-episodes 50

Takes the same flags as `echo-rl benchmark` (see `--help`, `--list-methods`);
rerun with the same --output-dir to resume an interrupted run.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from echo_rl.cli import main as cli_main
from echo_rl.commands.benchmark import add_arguments, build_config
from echo_rl.config import ConfigError


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    rc = cli_main(["benchmark", *argv])  # the library does the work; exit 2 on bad input, as the CLI
    parser = argparse.ArgumentParser(add_help=False)
    add_arguments(parser)
    args = parser.parse_args(argv)
    if args.list_methods or rc == 2:
        return rc
    try:
        report = Path(build_config(args).output_dir) / "report.md"
    except ConfigError:
        return rc
    if report.is_file():
        text = report.read_text()
        start = text.find("## Results")
        if start >= 0:
            end = text.find("## Details", start)
            print(text[start:end if end >= 0 else None].rstrip())
            print(f"full report: {report}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
