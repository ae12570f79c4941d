"""`echo-rl train`: train an agent; flags override the config file, --set overrides any field."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

from echo_rl.config import LATENT_PLAN_DEFAULT, ConfigError, TrainingConfig, parse_override

NAME = "train"
HELP = "train an agent and leave a run directory (config, metrics, checkpoints, curve, summary)"

# flag -> TrainingConfig field
_FLAGS = {"task": "env_name", "agent": "agent", "backbone": "backbone", "timesteps": "total_timesteps",
          "num_actors": "num_actors", "batch_size": "batch_size", "seed": "seed", "device": "device",
          "backend": "backend", "ray_address": "ray_address"}

# ablation flag -> (field, value) of the EchoRL agent's parts; shorthand for --set
_ABLATIONS = {"no_plan": ("echo_config.latent_plan", False), "no_kl": ("planning_config.kl_weight", 0.0),
              "no_replay": ("echo_config.replay_updates", 0), "no_world_model": ("echo_config.world_model_coef", 0.0),
              "no_self_imitation": ("echo_config.self_imitation_updates", 0)}
# part flag -> (field, value): a part that is an option, switched on (its default: echo_config's)
_OPTIONS = {"plan": ("echo_config.latent_plan", True)}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--task", help="minigrid, minigrid:<EnvId> (e.g. minigrid:MiniGrid-DoorKey-8x8-v0), CartPole-v1, "
                                  "gym:<EnvId>, minigrid-pixels:<EnvId>, atari:<Game>, continuous-action tasks for "
                                  "ppo (Pendulum-v1, dmc:<domain>-<task>, dmc-pixels:<domain>-<task>) or a text "
                                  "task (alfworld, webshop, cruxeval, arc); external: your own agent program "
                                  "(--command)")
    p.add_argument("--agent", help="learning agent (default: ppo; on text tasks ppo is GRPO and echo-rl is "
                                   "ECHO; --plan adds the latent plan)")
    p.add_argument("--backbone", help="language-model backbone for text tasks: tiny, tiny:<preset>, smollm2-135m "
                                      "(the default once fetched) or a local checkpoint directory (with a MiniGrid "
                                      "task: MiniGrid as text)")
    p.add_argument("--timesteps", type=int, help="environment steps to train for (TrainingConfig.total_timesteps; "
                                                 "text tasks: turns). With --resume, the new budget: a linearly "
                                                 "annealed LR (ppo_config.anneal_lr) is stretched over it; DQN's "
                                                 "epsilon and beta keep the first run's horizon")
    p.add_argument("--num-actors", type=int, help="parallel environments / actors")
    p.add_argument("--batch-size", type=int, help="transitions per learner update (a multiple of --num-actors)")
    p.add_argument("--seed", type=int, help="seed of the whole run")
    p.add_argument("--device", help="torch device: cpu (default), cuda, cuda:N, mps")
    p.add_argument("--backend", help="local (default: actors and learner in this process) or ray")
    p.add_argument("--ray-address", help="Ray cluster to join with --backend ray (default: start a local Ray)")
    ablate = p.add_argument_group("EchoRL agent parts and ablations (--agent echo-rl)")
    ablate.add_argument("--plan", action="store_true",
                        help=f"condition the policy on the latent plan (echo_config.latent_plan=true; default: "
                             f"{'on' if LATENT_PLAN_DEFAULT else 'off'}); the study found it changes nothing "
                             "measurable at about half the vector agent's time (docs/results.md, the EchoRL vector "
                             "agent)")
    ablate.add_argument("--no-plan", action="store_true", help="no latent plan (and so no plan KL)")
    ablate.add_argument("--no-kl", action="store_true", help="latent plan without the KL between consecutive plans")
    ablate.add_argument("--no-replay", action="store_true", help="no value/plan updates on replayed sequences")
    ablate.add_argument("--no-self-imitation", action="store_true",
                        help="no self-imitation updates on the steps of terminated episodes")
    ablate.add_argument("--no-world-model", action="store_true", help="no next-observation prediction loss")
    ext = p.add_argument_group("your own agent program (--task external; docs/external.md)")
    ext.add_argument("--command", dest="program",  # not args.command: that is the CLI's subcommand name
                     help="the program to run per episode, e.g. 'python agent.py' (it gets OPENAI_BASE_URL, "
                          "OPENAI_API_KEY and reports with echo_rl.external.report)")
    ext.add_argument("--episodes", type=int, default=8, help="episodes per learner update (default 8)")
    ext.add_argument("--concurrency", type=int, default=4, help="episodes running at once (default 4)")
    ext.add_argument("--episode-timeout", type=float, default=300.0, help="seconds before an episode is killed "
                                                                           "and counted as timed out (default 300)")
    ext.add_argument("--updates", type=int, default=10, help="learner updates (default 10)")
    ext.add_argument("--max-policy-lag", type=int, default=0, choices=(0, 1),
                     help="1: the next batch runs on the served weights while the learner updates (episodes at "
                          "most one version old); 0: on-policy batches (default)")
    p.add_argument("--config", metavar="FILE", help="YAML TrainingConfig; flags given here override it")
    p.add_argument("--set", metavar="FIELD=VALUE", action="append", default=[],
                   help="override any config field, e.g. --set ppo_config.learning_rate=1e-3 (repeatable)")
    p.add_argument("--run-dir", help="run directory (default: <results_dir>/<task>-<agent>-seed<seed>-<time>)")
    p.add_argument("--resume", action="store_true",
                   help="continue the run in --run-dir from its last checkpoint (only --timesteps and "
                        "--set lm_config.max_updates may change)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar or progress lines")


# fields a resumed run may change: how long it trains and how many checkpoints it keeps, never what it is
RESUMABLE_SETS = frozenset({"lm_config.max_updates", "keep_checkpoints"})


def build_config(args: argparse.Namespace) -> TrainingConfig:
    given = {field: getattr(args, flag) for flag, field in _FLAGS.items() if getattr(args, flag) is not None}
    ablations = {flag: fv for flag, fv in {**_ABLATIONS, **_OPTIONS}.items() if getattr(args, flag, False)}
    if "plan" in ablations and "no_plan" in ablations:
        raise ConfigError("--plan and --no-plan contradict each other: give one (echo_config.latent_plan)")
    given.update(ablations.values())
    if args.resume:
        if not args.run_dir:
            raise ConfigError("--resume needs --run-dir: the run to continue")
        budget = {key for key, _ in map(parse_override, args.set)}
        extra = sorted(set(given) - {"total_timesteps"}) + (["--config"] if args.config else []) + \
            sorted(f"--set {key}" for key in budget - RESUMABLE_SETS)
        if extra:
            raise ConfigError(f"--resume continues the saved config; only the budget (--timesteps, --set "
                              f"lm_config.max_updates) and --set keep_checkpoints may change, got {', '.join(extra)}")
        from echo_rl.training.run_dir import RunDirectory  # torch: loaded on first use

        config = RunDirectory.config_of(args.run_dir)
    else:
        config = TrainingConfig.load_yaml(args.config) if args.config else TrainingConfig()
    overrides = dict(given)
    overrides.update(parse_override(s) for s in args.set)
    config = config.with_overrides(overrides) if overrides else config
    if ablations and config.agent != "echo-rl":
        flags = ", ".join("--" + f.replace("_", "-") for f in ablations)
        raise ConfigError(f"{flags} switch parts of the EchoRL agent on or off; they need --agent echo-rl "
                          f"(got --agent {config.agent})")
    return config


def run_external(args: argparse.Namespace) -> int:
    """``--task external``: the policy is served to the user's program (echo_rl/external/)."""
    import shlex

    if not args.program:
        raise ConfigError("--task external needs --command: the agent program to run per episode, e.g. "
                          "--command 'python examples/own_agent/agent.py'")
    if args.concurrency < 1 or args.episode_timeout <= 0 or args.resume:
        raise ConfigError(f"--concurrency={args.concurrency} must be >= 1 and --episode-timeout="
                          f"{args.episode_timeout} > 0; --resume is not supported with --task external")
    command = shlex.split(args.program)
    args.task = None
    config = build_config(args)
    from echo_rl.external.train import train_external  # torch: loaded on first use

    run_dir = args.run_dir or f"{config.results_dir}/external-{config.agent}-seed{config.seed}-{int(time.time())}"
    rows = train_external(config, command, episodes=args.episodes, concurrency=args.concurrency,
                          episode_timeout=args.episode_timeout, updates=args.updates, run_dir=run_dir,
                          max_policy_lag=args.max_policy_lag)
    print(f"done: {len(rows)} updates | run dir {run_dir}")
    return 0


def run(args: argparse.Namespace) -> int:
    if args.task == "external":
        return run_external(args)
    config = build_config(args)
    from echo_rl.training.trainer import EchoRLTrainer  # torch, gymnasium, minigrid: loaded on first use

    trainer = EchoRLTrainer(config, run_dir=args.run_dir, resume=args.resume, show_progress=not args.no_progress)
    metrics = asyncio.run(trainer.train())
    ev = metrics.evaluation_results
    if metrics.interrupted:
        if trainer.config.num_learners > 1:  # each learner's envs mid-episode are not checkpointed
            print(f"interrupted at {metrics.total_timesteps:,} env steps; checkpoint saved (weights). A run with "
                  f"num_learners > 1 cannot be resumed; evaluate it with: echo-rl eval --run-dir {metrics.run_dir}",
                  file=sys.stderr)
        else:
            print(f"interrupted at {metrics.total_timesteps:,} env steps; checkpoint saved. Resume with: "
                  f"echo-rl train --resume --run-dir {metrics.run_dir}", file=sys.stderr)
        return 130
    ce = f", held-out env CE {ev['heldout_env_ce']:.3f}" if "heldout_env_ce" in ev else ""
    print(f"done: {metrics.total_timesteps:,} env steps, {metrics.num_updates} updates, "
          f"{metrics.wall_time:.0f} s | eval success {ev['success_rate']:.3f}, avg reward {ev['avg_reward']:.3f}"
          f"{ce} | run dir {metrics.run_dir}")
    return 0
