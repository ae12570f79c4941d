"""Terminal agents: does RL (GRPO, GRPO + ECHO) add to an SFT warm start that saw only the easy tasks?

    python -m echo_rl.experiments.terminal_study --out runs/terminal_study --seeds 0 1 2 --jobs 2

SmolLM2-135M-Instruct on the generated terminal tasks. The warm start imitates the oracle on level 1 only
(``lm_config.sft_env_config``), then RL trains on levels 1-3. Arms: ``grpo`` (λ 0), ``grpo+echo`` (λ 0.05, the
env-output CE divided per episode by its |O| observation tokens, as ECHO does) and ``echo-nosft`` (grpo+echo
from the base model: no warm start, only the one-shot example of the task's prompt). Every run evaluates the
same held-out panel (test split: held-out instances and templates, the same task instances for every arm and
seed) before RL and after it, per level, with the held-out env-token CE, and InterCode-Bash (file systems 1, 2,
4) on a fixed subset before and after RL. The runs are :mod:`lm_study`'s (one ``echo-rl train`` process per arm
and seed, resumable); :mod:`terminal_report` builds ``summary.md`` / ``summary.json`` / ``study.png``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from echo_rl.config import TrainingConfig
from echo_rl.experiments.lm_study import run_all

ECHO = {"agent": "echo-rl", "echo_config.latent_plan": False, "lm_config.env_loss_coef": 0.05,
        "lm_config.ce_normalization": "sequence"}  # ECHO's |O|: each episode's env CE over its own env tokens
ARMS: dict[str, dict] = {
    "grpo": {"agent": "ppo"},
    "grpo+echo": ECHO,
    "echo-nosft": {**ECHO, "lm_config.sft_episodes": 0},
}


def base_config(args: argparse.Namespace, out: Path) -> dict:
    """The settings every arm and seed shares, as TrainingConfig overrides."""
    return {"env_name": "terminal", "env_config": {"level": 0, "max_steps": args.max_steps},
            "backbone": args.backbone, "num_actors": args.group_size * args.groups,
            "batch_size": args.group_size * args.groups, "total_timesteps": 10**9,
            "evaluation_episodes": args.eval_episodes, "torch_threads": 1, "seed": 0,
            "lm_config.compute_dtype": args.compute_dtype, "lm_config.group_size": args.group_size, "lm_config.learning_rate": args.lr,
            "lm_config.temperature": args.temperature, "lm_config.eval_temperature": 0.0,
            "lm_config.max_new_tokens": args.max_new_tokens, "lm_config.max_turns": args.max_steps,
            "lm_config.sft_episodes": args.sft_episodes, "lm_config.sft_steps": args.sft_steps,
            "lm_config.sft_batch_episodes": 8, "lm_config.sft_learning_rate": args.sft_lr,
            "lm_config.sft_env_config": {"level": 1}, "lm_config.sft_cache_dir": str(out / "sft_cache"),
            "lm_config.heldout_pool": args.heldout_pool, "lm_config.max_updates": args.updates,
            "lm_config.eval_every_updates": args.updates,  # evaluations: before RL and after it
            "lm_config.extra_eval_env": "intercode_bash" if args.intercode_episodes else "",
            "lm_config.extra_eval_env_config": {"max_steps": args.intercode_steps} if args.intercode_episodes else {},
            "lm_config.extra_eval_episodes": args.intercode_episodes}


def run_config(args: argparse.Namespace, out: Path, arm: str, seed: int) -> TrainingConfig:
    return TrainingConfig().with_overrides({**base_config(args, out), **ARMS[arm], "seed": seed})


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="runs/terminal_study")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    p.add_argument("--jobs", type=int, default=2, help="runs at once (one process, one torch thread each)")
    p.add_argument("--nice", type=int, default=10)
    p.add_argument("--backbone", default="smollm2-135m")
    p.add_argument("--updates", type=int, default=4, help="RL updates per run")
    p.add_argument("--max-steps", type=int, default=4, help="turns per episode")
    p.add_argument("--max-new-tokens", type=int, default=48, help="tokens per reply")
    p.add_argument("--groups", type=int, default=2, help="task seeds per update")
    p.add_argument("--group-size", type=int, default=4, help="episodes per task seed (the GRPO group)")
    p.add_argument("--lr", type=float, default=3e-5)
    p.add_argument("--compute-dtype", default="bfloat16", choices=("float32", "bfloat16"),
                   help="learner and engine precision (bfloat16: ~3x faster on CPUs with AVX512-BF16 or AMX)")
    p.add_argument("--temperature", type=float, default=1.0, help="training rollouts")
    p.add_argument("--eval-episodes", type=int, default=30, help="held-out panel (greedy), all levels")
    p.add_argument("--heldout-pool", type=int, default=6, help="held-out expert episodes for the env CE")
    p.add_argument("--intercode-episodes", type=int, default=6, help="InterCode-Bash subset (0: none)")
    p.add_argument("--intercode-steps", type=int, default=3, help="turns per InterCode-Bash episode")
    p.add_argument("--sft-episodes", type=int, default=32, help="level-1 expert episodes")
    p.add_argument("--sft-steps", type=int, default=12)
    p.add_argument("--sft-lr", type=float, default=5e-5)
    p.add_argument("--summarize-only", action="store_true", help="only rebuild the summary")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    args.extend_from = None  # lm_study.run_one's option; a terminal study always starts its own runs
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if not args.summarize_only:
        run_all(args, out, make_config=run_config)
    from echo_rl.experiments.terminal_report import report  # the summary's code, in its own module

    print(report(out, args.arms, args.seeds, {**base_config(args, out), "arms": {a: ARMS[a] for a in args.arms},
                                               "seeds": args.seeds}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
