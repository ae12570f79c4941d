"""`echo-rl benchmark`: run (task x method x backbone x seed) cells, then write the report; rerun to resume."""

from __future__ import annotations

import argparse
import asyncio
import sys

from echo_rl.config import parse_override
from echo_rl.config.base import load_yaml_text

NAME = "benchmark"
HELP = "run a resumable multi-seed benchmark and write its report (JSON, CSV, Markdown, plots)"

# flag -> BenchmarkConfig field
_LISTS = {"tasks": "tasks", "backbones": "backbones", "baselines": "baselines"}
_SCALARS = {"num_seeds": "num_seeds", "num_episodes": "num_episodes", "max_steps": "max_steps_per_episode",
            "timeout": "evaluation_timeout", "output_dir": "output_dir", "reps": "bootstrap_reps",
            "device": "device", "seed_offset": "seed_offset", "concurrency": "concurrency"}


_FREE_MAPPINGS = ("echo_rl_configs", "task_configs", "backbone_config")


def _names(text: str) -> list[str]:
    return [t for t in (s.strip() for s in text.replace(",", " ").split()) if t]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tasks", nargs="+", help="alfworld, webshop, cruxeval, arc, minigrid, minigrid:<EnvId> "
                                              "(space- or comma-separated)")
    p.add_argument("--baselines", "--methods", dest="baselines", nargs="+",
                   help="methods: random, expert, react, act, tot, ppo, impala, echo-rl, ppo-rlhf, rlaif")
    p.add_argument("--backbones", nargs="+", help="backbones for react/tot/LM methods: tiny, gpt-4o, a local "
                                                  "checkpoint, an OpenAI-compatible URL, expert, ...")
    p.add_argument("--num-seeds", type=int, help="seeds per cell (default 3)")
    p.add_argument("--seed-offset", type=int, help="first seed (default 0)")
    p.add_argument("--num-episodes", type=int, help="evaluation episodes per cell (default 20)")
    p.add_argument("--max-steps", type=int, help="step cap per episode, given to every env (default 100)")
    p.add_argument("--timeout", type=float, help="seconds one cell may run (default 3600)")
    p.add_argument("--train-timesteps", type=int,
                   help="environment steps for trained methods (sets echo_rl_configs.total_timesteps)")
    p.add_argument("--device", help="torch device for trained methods (default cpu)")
    p.add_argument("--dtype", choices=("auto", "float32", "bfloat16", "float16"),
                   help="local backbones' weight dtype (sets backbone_config.dtype; default auto)")
    p.add_argument("--concurrency", type=int, help="episodes a prompting method runs at once per cell (default 8)")
    p.add_argument("--output-dir", help="run directory; rerunning with the same one resumes (default runs/benchmark)")
    p.add_argument("--reps", type=int, help="bootstrap resamples (default 50000)")
    p.add_argument("--config", metavar="FILE", help="YAML BenchmarkConfig; flags given here override it")
    p.add_argument("--set", metavar="FIELD=VALUE", action="append", default=[],
                   help="override any field, e.g. --set echo_rl_configs.ppo.num_actors=4 (repeatable)")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--no-report", action="store_true", help="skip report.md and results.json/csv")
    p.add_argument("--list-methods", action="store_true",
                   help="list the methods, what each needs and whether it can run here, then exit")
    p.add_argument("--quiet", action="store_true", help="no progress lines")


def build_config(args: argparse.Namespace):
    from echo_rl.evaluation.benchmark import BenchmarkConfig  # scipy: loaded on first use

    base = BenchmarkConfig.load_yaml(args.config) if args.config else BenchmarkConfig()
    data = base.to_dict()
    for flag, field in _LISTS.items():
        values = getattr(args, flag)
        if values is not None:
            data[field] = [n for v in values for n in _names(v)]
    for flag, field in _SCALARS.items():
        if getattr(args, flag) is not None:
            data[field] = getattr(args, flag)
    if args.dtype is not None:
        data["backbone_config"] = {**data["backbone_config"], "dtype": args.dtype}
    if args.train_timesteps is not None:
        data["echo_rl_configs"] = {**data["echo_rl_configs"], "total_timesteps": args.train_timesteps}
    if args.no_plots:
        data["generate_plots"] = False
    if args.no_report:
        data["generate_report"] = False
    overrides = {}
    for text in args.set:
        key, value = parse_override(text)
        head, _, rest = key.partition(".")
        if head in _FREE_MAPPINGS and rest:  # free-form mappings: create the nested keys
            node = data[head] = dict(data[head])
            *parents, leaf = rest.split(".")
            for part in parents:
                node[part] = dict(node.get(part) or {})
                node = node[part]
            node[leaf] = load_yaml_text(value, f"--set {key}")
        else:
            overrides[key] = value
    config = BenchmarkConfig.from_dict(data)
    return config.with_overrides(overrides) if overrides else config


def list_methods(out=sys.stdout) -> None:
    from echo_rl.evaluation.methods import get_method, method_names  # scipy: loaded on first use

    for name in method_names():
        m = get_method(name)
        probe = "minigrid" if "vector" in m.task_kinds else "arc"
        reason = m.skip_reason(probe, "tiny" if m.uses_backbone(probe) else "-")
        needs = [f"tasks: {'/'.join(m.task_kinds)}"] + (["a backbone"] if m.needs_backbone else
                                                         ["a backbone on text tasks"] if m.lm_on_text else [])
        state = "available" if reason is None else f"unavailable: {reason}"
        print(f"{name:9s} {m.kind:9s} {m.description} [{'; '.join(needs)}] -> {state}", file=out)


def run(args: argparse.Namespace) -> int:
    if args.list_methods:
        list_methods()
        return 0
    config = build_config(args)
    from echo_rl.evaluation.benchmark import EchoRLBenchmark  # scipy: loaded on first use

    bench = EchoRLBenchmark(config, progress=None if args.quiet else lambda m: print(m, file=sys.stderr, flush=True))
    summary = asyncio.run(bench.run_benchmark())
    print(f"{summary['cells']} cells: {summary['ok']} run, {summary['reused']} kept from before, "
          f"{summary['skipped']} skipped, {summary['failed']} failed, {summary['timeout']} timed out "
          f"in {summary['wall_time_s']:.1f}s -> {summary['output_dir']}")
    report = summary.get("report", {})
    if report.get("report"):
        print(f"report: {report['report']}")
    return 1 if summary["failed"] or summary["timeout"] else 0
