"""`echo-rl report RUN_DIR`: regenerate a benchmark's report from its stored cells, or compare runs with the hub."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from echo_rl.config import ConfigError

NAME = "report"
HELP = ("regenerate a benchmark run's report (JSON, CSV, Markdown, plots) from RUN_DIR, or compare training runs "
        "with a published study (--against hub:STUDY/METHOD)")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", nargs="+",
                   help="a directory written by `echo-rl benchmark`; with --against, one or more training run "
                        "directories (one seed each)")
    p.add_argument("--reps", type=int, help="bootstrap resamples (default: the run's bootstrap_reps; --against: 20000)")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--against", metavar="hub:STUDY[/METHOD]",
                   help="compare the runs' scores with a published study of echo_rl.hub.scores (IQM with CIs, "
                        "probability of improvement)")
    p.add_argument("--metric", help="with --against: the study's metric to compare (default: its first)")
    p.add_argument("--output", help="with --against: also write the comparison as JSON to this file")


def run(args: argparse.Namespace) -> int:
    if args.reps is not None and args.reps < 100:
        raise ConfigError(f"--reps={args.reps} is invalid: must be >= 100")
    for d in args.run_dir:
        if not Path(d).is_dir():
            raise ConfigError(f"RUN_DIR {d} does not exist")
    if args.against:
        from echo_rl.hub.compare import compare, format_comparison  # numpy: loaded on first use

        result = compare(args.run_dir, args.against, args.metric, reps=args.reps or 20_000)
        print(format_comparison(result))
        if args.output:
            Path(args.output).write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
        return 0
    if args.metric or args.output:
        raise ConfigError("--metric and --output go with --against hub:STUDY/METHOD")
    if len(args.run_dir) != 1:
        raise ConfigError("give one benchmark RUN_DIR (several are compared only with --against)")
    from echo_rl.evaluation.benchmark import load_run  # scipy: loaded on first use
    from echo_rl.evaluation.report import write_report  # scipy: loaded on first use

    written = write_report(args.run_dir[0], *load_run(args.run_dir[0]), plots=not args.no_plots, reps=args.reps)
    print(f"report: {written['report']}")
    for p in written.get("plots", []):
        print(f"plot: {p}")
    return 0
