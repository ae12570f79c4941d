"""`echo-rl eval`: evaluate a trained run (vector tasks) or a prompting agent (text tasks)."""

from __future__ import annotations

import argparse
import json

from echo_rl.config import ConfigError, parse_override
from echo_rl.config.base import load_yaml_text

NAME = "eval"
HELP = "evaluate a trained run's last checkpoint, or a prompting agent with a backbone on a text task"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--run-dir", help="a training run directory: evaluate its last checkpoint")
    p.add_argument("--task", help="text task for a prompting agent (alfworld, webshop, cruxeval, arc, minigrid, terminal, "
                   "intercode_bash, or a registered task)")
    p.add_argument("--agent", help="prompting agent for text tasks (react, act, tot)")
    p.add_argument("--backbone", help="backbone for text tasks: an API model name, a local path or a preset")
    p.add_argument("--episodes", type=int, default=None, help="episodes to run (default: the run's evaluation_episodes, or 10)")
    p.add_argument("--seed", type=int, default=None, help="evaluation seed (default: the run's seed, or 0)")
    p.add_argument("--max-steps", type=int, default=None, help="text tasks: step limit per episode")
    p.add_argument("--dtype", choices=("auto", "float32", "bfloat16", "float16"), default=None,
                   help="text tasks: a local backbone's weight dtype (default auto)")
    p.add_argument("--concurrency", type=int, default=None,
                   help="text tasks: episodes in flight at once (default 8; a local model decodes them together)")
    p.add_argument("--set", metavar="FIELD=VALUE", action="append", default=[],
                   help="text tasks: environment option, e.g. --set task=input for CRUXEval input prediction "
                        "(repeatable)")
    p.add_argument("--deterministic", action="store_true",
                   help="trained runs: act with the policy's mode, not sampled actions (evaluation_deterministic)")
    p.add_argument("--output", help="write the results as JSON to this file")


def run(args: argparse.Namespace) -> int:
    if args.episodes is not None and args.episodes < 1:
        raise ConfigError(f"--episodes={args.episodes} is invalid: must be >= 1")
    if args.concurrency is not None and args.concurrency < 1:
        raise ConfigError(f"--concurrency={args.concurrency} is invalid: must be >= 1")
    if args.run_dir:
        if args.agent or args.backbone or args.set or args.concurrency or args.dtype:
            raise ConfigError("--run-dir evaluates a trained run; --agent/--backbone/--set/--concurrency/--dtype are "
                              "for text-task prompting agents")
        results = _eval_run(args)
        if args.output:
            with open(args.output, "w") as fh:
                json.dump(results, fh, indent=2, sort_keys=True)
    elif args.task:
        if args.deterministic:
            raise ConfigError("--deterministic is for trained runs (--run-dir); prompting agents decode with "
                              "their backbone's own settings")
        if not (args.agent and args.backbone):
            raise ConfigError("text-task evaluation needs --agent (react, act, tot) and --backbone")
        from echo_rl.prompting.runner import DEFAULT_CONCURRENCY, evaluate_text_agent  # scipy: loaded on first use

        try:
            results = evaluate_text_agent(task=args.task, agent=args.agent, backbone=args.backbone,
                                          episodes=args.episodes or 10, seed=args.seed or 0,
                                          max_steps=args.max_steps, env_config=_env_options(args.set),
                                          output=args.output,
                                          backbone_config={"dtype": args.dtype} if args.dtype else None,
                                          concurrency=args.concurrency or DEFAULT_CONCURRENCY)
        except FileNotFoundError as exc:  # a benchmark's data is missing: its message names the path and the fix
            raise ConfigError(str(exc)) from None
        # the runner writes --output (+ trajectories)
    else:
        raise ConfigError("give --run-dir (a trained run) or --task with --agent and --backbone")
    print(json.dumps(results, indent=2, sort_keys=True))
    return 0


def _env_options(items: list[str]) -> dict:
    """``--set key=value`` pairs as environment options (values read as YAML: numbers, booleans, strings)."""
    out = {}
    for text in items:
        key, value = parse_override(text)
        out[key] = load_yaml_text(value, f"--set {key}") if isinstance(value, str) else value
    return out


def _eval_run(args: argparse.Namespace) -> dict:
    from echo_rl.training.run_dir import RunDirectory  # torch: loaded on first use
    # torch, gymnasium, minigrid: loaded on first use
    from echo_rl.training.trainer import EchoRLTrainer, resolve_device

    config = RunDirectory.config_of(args.run_dir, flag="--run-dir")
    if args.seed is not None:
        config = config.with_overrides({"seed": args.seed})
    if args.deterministic:
        config = config.with_overrides({"evaluation_deterministic": True})
    trainer = EchoRLTrainer(config, run_dir=args.run_dir, resume=True, show_progress=False)
    if trainer.run.latest_checkpoint() is None:
        raise ConfigError(f"--run-dir {args.run_dir} has no checkpoint to evaluate")
    trainer.build_agent(resolve_device(config.device))
    try:  # weights only: evaluation never opens the rollout state (envs mid-episode)
        ckpt = trainer.run.load_newest(lambda payload, _: trainer.agent.load_state_dict(payload["state"]),
                                       rollout=False)
        results = trainer.evaluate(args.episodes)
    finally:
        trainer.agent.close()
    return {"run_dir": str(args.run_dir), "checkpoint": ckpt.name, "env_name": config.env_name, **results}
