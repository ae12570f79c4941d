"""EchoRL's GRPO vs TRL's ``GRPOTrainer``: the same model, task, reward and budget, side by side.

Task: CRUXEval output prediction (``--task output``) or input prediction (``--task input``) (single turn:
one answer per episode, reward 1/0 from ``CRUXEvalEnvironment``), trained on its ``train`` split, evaluated
on every sample of its ``test`` split (functions neither side trained on). Both sides see the same prompt
tokens (rendered once by EchoRL's ``TrajectoryBuilder`` with the chat template; TRL receives them as text
and re-tokenizes them, which is checked to round-trip), parse the reply the same way (its first line) and
get the reward from the same environment code.

Budget: ``--updates`` optimiser steps, each on ``--prompts`` tasks x ``--generations`` sampled replies of
at most ``--max-new-tokens`` tokens at temperature 1, learning rate ``--lr``, no KL (TRL's default
beta=0), full fine-tuning on CPU. EchoRL: ``--agent ppo`` on a text task (GRPO, group size =
generations, no SFT warm start). TRL: ``GRPOConfig(use_cpu=True)``, its defaults otherwise
(gradient checkpointing on, its loss type and reward scaling).

Precision, ``--dtype``: float32 everywhere, or bfloat16 on both sides. EchoRL: ``lm_config.compute_dtype``
(the engine's weights in bf16; the learner's body under bf16 autocast, fp32 master weights, optimiser and
LM head). TRL: ``bf16=True`` (accelerate's CPU bf16 autocast around every forward, generation included;
fp32 master weights); if TRL refuses it, TRL runs in fp32 and the output says so. Each side's precision is
measured, not assumed: the output dtype of the first decoder layer's MLP projection in the forwards of
rollouts and of learning, and the comparison is labelled like-for-like only when both sides match.
The shared evaluator always runs the (fp32) trained weights in fp32.

Measured per contender, each in a fresh process (``--reps`` repetitions, order alternating: AB, BA...):
  rollout tokens/s   completion tokens sampled / seconds spent producing them. EchoRL: the engine's
                     rollout phase (``time/rollout_s``, which also steps the environments); TRL: the
                     time inside ``_generate_single_turn`` (``transformers.generate``, rewards excluded).
  updates/hour       optimiser steps / wall seconds of the training phase (rollouts + learning).
  success            greedy success on the test split after the budget, by one shared evaluator
                     (batched transformers ``generate`` on the trained weights), and before (step 0).
  peak RSS           ``ru_maxrss`` of the contender's process.

Needs the ``bench`` extra (trl) and the fetched model (``echo-rl models fetch smollm2-135m``).
Run:  OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE python benchmarks/trl_anchor.py --out runs/trl_anchor
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

CONTENDERS = ("echo_rl", "trl")
DTYPES = ("float32", "bfloat16")


class DtypeProbe:
    """Records the output dtype of one layer's MLP projection per phase: the precision actually computed in."""

    def __init__(self) -> None:
        self.seen: dict[str, set[str]] = {}

    def attach(self, model: torch.nn.Module, phase) -> None:
        """Hook ``model``'s first decoder layer's ``mlp.down_proj``; ``phase``: a label or a callable giving one."""
        layer = next((m for name, m in model.named_modules() if name.endswith("layers.0.mlp.down_proj")), None)
        if layer is None:
            raise RuntimeError(f"no layers.0.mlp.down_proj in {type(model).__name__}: cannot measure its precision")

        def hook(_mod, _inp, out):
            self.seen.setdefault(phase() if callable(phase) else phase, set()).add(str(out.dtype).removeprefix("torch."))

        layer.register_forward_hook(hook)

    def precision(self) -> dict[str, str]:
        """{"rollout": dtype, "learning": dtype} ("+"-joined where a phase ran in several; "none" if unseen)."""
        return {k: "+".join(sorted(self.seen.get(k, ()))) or "none" for k in ("rollout", "learning")}


def task_env(args, split: str):
    from echo_rl.environments.cruxeval import CRUXEvalEnvironment

    return CRUXEvalEnvironment(task=args.task, attempts=1, max_steps=1, split=split, data_dir=args.data_dir)


def render_prompts(tokenizer, env, system: str) -> list[list[int]]:
    """The first-turn token ids of every task of ``env``, exactly as EchoRL's rollout worker builds them."""
    from echo_rl.lm.chat_delta import ChatRenderer
    from echo_rl.lm.trajectory import TrajectoryBuilder

    renderer, out = ChatRenderer(tokenizer), []
    for i in range(env.num_tasks):
        _, info = env.reset(seed=0, options={"task_index": i})
        out.append(list(TrajectoryBuilder(renderer, info["segments"], system=system).token_ids))
    return out


def system_prompt(env) -> str:
    """The system prompt EchoRL's rollout worker gives ``env``'s task (its turn protocol)."""
    from echo_rl.environments.registry import task_format
    from echo_rl.lm.rollout import LM_INTRO

    return task_format("cruxeval", env).system_prompt(LM_INTRO)


def score(env, task_index: int, reply: str) -> float:
    from echo_rl.environments.registry import task_format

    env.reset(seed=0, options={"task_index": task_index})
    _, reward, *_ = env.step(task_format("cruxeval", env).action(reply))
    return float(reward)


@torch.inference_mode()
def evaluate(model, tokenizer, env, prompts: list[list[int]], max_new_tokens: int, batch: int = 16) -> float:
    """Greedy success over every task of ``env`` (left-padded batches, stop at end of turn)."""
    from echo_rl.lm.chat_delta import ChatRenderer

    stop = [ChatRenderer(tokenizer).turn_end([{"role": "user", "content": "x"}])[0], tokenizer.eos_token_id]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    model.eval()
    wins = []
    for lo in range(0, len(prompts), batch):
        chunk = prompts[lo:lo + batch]
        width = max(map(len, chunk))
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in chunk])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk])
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                             eos_token_id=stop, pad_token_id=pad)
        for k, row in enumerate(out[:, width:].tolist()):
            if any(t in stop for t in row):
                row = row[:min(row.index(t) for t in stop if t in row)]
            wins.append(score(env, lo + k, tokenizer.decode(row, skip_special_tokens=True)))
    return float(np.mean(wins))


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


# -- contenders ------------------------------------------------------------------------------------
def run_echo_rl(args, out: Path) -> dict:
    from echo_rl.config import TrainingConfig
    from echo_rl.training.agents import build_agent
    n = args.prompts * args.generations
    config = TrainingConfig().with_overrides({
        "env_name": "cruxeval", "backbone": "smollm2-135m", "agent": "ppo", "seed": args.seed, "device": "cpu",
        "num_actors": n, "batch_size": n, "total_timesteps": n * args.updates, "evaluation_episodes": 1,
        "checkpoint_dir": str(out / "run"), "torch_threads": 1,
        "env_config": {"task": args.task, "attempts": 1, "max_steps": 1},
        "lm_config.group_size": args.generations, "lm_config.max_new_tokens": args.max_new_tokens,
        "lm_config.max_turns": 1, "lm_config.temperature": 1.0, "lm_config.learning_rate": args.lr,
        "lm_config.sft_episodes": 0, "lm_config.heldout_pool": 0, "lm_config.max_updates": args.updates,
        "lm_config.compute_dtype": args.dtype})
    agent = build_agent(config, torch.device("cpu"))
    if agent.config.lm_config.system_prompt is not None:  # None: the task's, which system_prompt() renders
        raise RuntimeError("the LM agent's system prompt changed: make this benchmark render the same one for TRL")

    probe = DtypeProbe()
    probe.attach(agent.model, "learning")

    async def train() -> list[dict]:
        await agent.start()
        probe.attach(agent.engine.runner.model, "rollout")  # the engine's own copy of the weights
        rows = []
        for _ in range(args.updates):
            row = dict(await agent.train_iteration())
            row.update(agent.timings)
            rows.append(row)
        await agent.close()
        return rows

    t0 = time.perf_counter()
    rows = asyncio.run(train())
    train_s = time.perf_counter() - t0
    rss = peak_rss_gb()
    tokens = sum(r["lm/tokens_action"] for r in rows)
    rollout_s = sum(r["time/rollout_s"] for r in rows)
    return {"model": agent.model, "tokenizer": agent.tokenizer, "train_s": train_s, "updates": len(rows),
            "rollout_tokens": tokens, "rollout_s": rollout_s, "peak_rss_gb_train": rss,
            "train_success": [r.get("episode/success_rate") for r in rows], "precision": probe.precision(),
            "precision_setting": f"lm_config.compute_dtype={args.dtype}"}


def run_trl(args, out: Path) -> dict:
    try:
        from datasets import Dataset
        from trl import GRPOConfig, GRPOTrainer
    except ImportError as exc:
        raise SystemExit(f"the TRL anchor needs trl ({exc}): pip install -e '.[bench]'") from None
    import transformers

    from echo_rl.models.fetch import resolve_model

    path = str(resolve_model("smollm2-135m"))
    tok = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = transformers.AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=torch.float32)
    env = task_env(args, "train")
    prompts = render_prompts(tok, env, system_prompt(env))
    texts = [tok.decode(p) for p in prompts]
    bad = [i for i, (t, p) in enumerate(zip(texts, prompts)) if tok(t, add_special_tokens=False).input_ids != p]
    if bad:
        raise RuntimeError(f"{len(bad)} prompts do not round-trip through decode/encode (first: task {bad[0]})")
    data = Dataset.from_list([{"prompt": t, "task_index": i} for i, t in enumerate(texts)])

    def reward(prompts, completions, task_index, **_):
        return [score(env, int(i), c) for i, c in zip(task_index, completions)]

    phase = ["learning"]
    probe = DtypeProbe()
    probe.attach(model, lambda: phase[0])

    class TimedGRPOTrainer(GRPOTrainer):
        gen_s, gen_tokens = 0.0, 0

        def _generate_single_turn(self, prompt_ids, *a, **kw):
            t0, phase[0] = time.perf_counter(), "rollout"
            try:
                result = super()._generate_single_turn(prompt_ids, *a, **kw)
            finally:
                phase[0] = "learning"
            TimedGRPOTrainer.gen_s += time.perf_counter() - t0
            TimedGRPOTrainer.gen_tokens += sum(len(c) for c in result[0])  # (completion_ids, logprobs)
            return result

    def make_trainer(bf16: bool):
        cfg = GRPOConfig(output_dir=str(out / "trl"), use_cpu=True, bf16=bf16, seed=args.seed, report_to=[],
                         per_device_train_batch_size=args.prompts * args.generations,
                         num_generations=args.generations, max_completion_length=args.max_new_tokens,
                         temperature=1.0, learning_rate=args.lr, beta=0.0, max_steps=args.updates,
                         logging_steps=1, save_strategy="no", dataloader_num_workers=0)
        return TimedGRPOTrainer(model=model, reward_funcs=reward, args=cfg, train_dataset=data,
                                processing_class=tok)

    refused = None
    try:
        trainer = make_trainer(bf16=args.dtype == "bfloat16")
    except (ValueError, RuntimeError) as exc:  # e.g. a TRL/transformers version without CPU bf16
        refused = f"{type(exc).__name__}: {exc}".splitlines()[0]
        print(f"TRL refused bf16=True on CPU ({refused}): TRL runs in float32", file=sys.stderr, flush=True)
        trainer = make_trainer(bf16=False)
    t0 = time.perf_counter()
    trainer.train()
    train_s = time.perf_counter() - t0
    logs = [h for h in trainer.state.log_history if "reward" in h]
    return {"model": trainer.model, "tokenizer": tok, "train_s": train_s, "updates": trainer.state.global_step,
            "rollout_tokens": TimedGRPOTrainer.gen_tokens, "rollout_s": TimedGRPOTrainer.gen_s,
            "peak_rss_gb_train": peak_rss_gb(), "train_success": [h["reward"] for h in logs],
            "precision": probe.precision(), "precision_setting": f"GRPOConfig(use_cpu=True, bf16={trainer.args.bf16})",
            "bf16_refused": refused}


def worker(args) -> None:
    torch.manual_seed(args.seed)
    out = Path(args.out) / f"rep{args.rep}_{args.contender}"
    out.mkdir(parents=True, exist_ok=True)
    res = (run_echo_rl if args.contender == "echo_rl" else run_trl)(args, out)

    test = task_env(args, "test")
    prompts = render_prompts(res["tokenizer"], test, system_prompt(test))[:args.eval_tasks or None]
    t0 = time.perf_counter()
    success = evaluate(res.pop("model"), res.pop("tokenizer"), test, prompts, args.max_new_tokens)
    res.update(contender=args.contender, rep=args.rep, test_success=success, test_tasks=len(prompts),
               eval_s=time.perf_counter() - t0, peak_rss_gb=peak_rss_gb(),
               rollout_tokens_per_s=res["rollout_tokens"] / max(res["rollout_s"], 1e-9),
               updates_per_hour=3600 * res["updates"] / res["train_s"], loadavg=os.getloadavg())
    (out / "result.json").write_text(json.dumps(res, indent=1))
    print(json.dumps(res))


def baseline(args) -> None:
    """Greedy test success of the untrained model (the same evaluator)."""
    import transformers

    from echo_rl.models.fetch import resolve_model

    path = str(resolve_model("smollm2-135m"))
    tok = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = transformers.AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=torch.float32)
    test = task_env(args, "test")
    prompts = render_prompts(tok, test, system_prompt(test))[:args.eval_tasks or None]
    res = {"contender": "untrained", "test_success": evaluate(model, tok, test, prompts, args.max_new_tokens),
           "test_tasks": len(prompts)}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "untrained.json").write_text(json.dumps(res))
    print(json.dumps(res))


def precision_verdict(echo: list[dict], trl: list[dict]) -> str:
    """One line saying each side's measured precision and whether the ratios compare like with like."""
    lines = []
    for name, rows in (("echo_rl", echo), ("trl", trl)):
        p = {json.dumps(r["precision"], sort_keys=True) for r in rows}
        refused = {r["bf16_refused"] for r in rows if r.get("bf16_refused")}
        lines.append(f"{name} precision {' | '.join(sorted(p))} ({rows[0]['precision_setting']})"
                     + (f" - TRL refused bf16: {refused.pop()}" if refused else ""))
    same = all(e["precision"] == t["precision"] for e, t in zip(echo, trl))
    lines.append("ratios below: LIKE-FOR-LIKE precision" if same else
                 "ratios below: UNLIKE precision (the sides computed in different dtypes): not a like-for-like ratio")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="runs/trl_anchor")
    p.add_argument("--task", choices=("output", "input"), default="output", help="CRUXEval-O or CRUXEval-I")
    p.add_argument("--updates", type=int, default=8)
    p.add_argument("--prompts", type=int, default=2, help="tasks per update")
    p.add_argument("--generations", type=int, default=4, help="sampled replies per task (the GRPO group)")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--dtype", choices=DTYPES, default="float32",
                   help="compute precision of both sides (bfloat16: EchoRL compute_dtype, TRL bf16=True)")
    p.add_argument("--lr", type=float, default=1e-6, help="TRL's default; EchoRL's pretrained default is 1e-5")
    p.add_argument("--reps", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval-tasks", type=int, default=0, help="test tasks evaluated (0: all 178)")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--contender", choices=CONTENDERS + ("untrained",), help=argparse.SUPPRESS)
    p.add_argument("--rep", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.contender == "untrained":
        return baseline(args)
    if args.contender:
        return worker(args)
    print(f"cpu: {platform.processor() or platform.machine()}, loadavg {os.getloadavg()}", flush=True)
    forward = [a for a in sys.argv[1:]]
    results = []
    runs = [(0, "untrained")] + [(rep, c) for rep in range(args.reps)
                                 for c in (CONTENDERS if rep % 2 == 0 else CONTENDERS[::-1])]
    for rep, contender in runs:
        cmd = [sys.executable, __file__, *forward, "--contender", contender, "--rep", str(rep)]
        line = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout.strip().splitlines()[-1]
        results.append(json.loads(line))
        print(line, flush=True)
    summary = Path(args.out) / "summary.json"
    summary.write_text(json.dumps(results, indent=1))
    by = {c: [r for r in results if r["contender"] == c] for c in CONTENDERS}
    print(precision_verdict(by["echo_rl"], by["trl"]))
    for key in ("rollout_tokens_per_s", "updates_per_hour", "peak_rss_gb", "peak_rss_gb_train", "test_success"):
        ratios = [e[key] / t[key] if t[key] else float("nan") for e, t in zip(by["echo_rl"], by["trl"])]
        print(f"{key}: echo_rl {[round(r[key], 3) for r in by['echo_rl']]} trl {[round(r[key], 3) for r in by['trl']]}"
              f" ratio per rep {[round(x, 2) for x in ratios]}")


if __name__ == "__main__":
    main()
